"""What the end-to-end benchmarks share: the body their child processes
send or expect, the progress watchdog, running a child, the medians of
its runs, and the rate format."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time


def make_body(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


# Messages read or sent so far by this (child) process; a watchdog
# ends a run that stops making progress (a client retrying forever).
PROGRESS = [0]


def start_watchdog(stall_seconds: float) -> None:
    import threading

    def watch() -> None:
        last, since = -1, time.monotonic()
        while True:
            time.sleep(1.0)
            now = PROGRESS[0]
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > stall_seconds:
                print(f"STALLED no progress for {stall_seconds:g} s after "
                      f"{now:,} messages", flush=True)
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def parse_choices(ap, text: str, choices, what: str) -> list[str]:
    """A comma-separated ``--only`` list, each one of ``choices``."""
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = set(chosen) - set(choices)
    if unknown:
        ap.error(f"unknown {what}: {', '.join(sorted(unknown))}")
    return chosen


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def run_child_process(cmd: list[str], timeout: float) -> dict:
    """Run one measurement in a fresh process: its ``RESULT {json}`` line,
    or ``{"error": ...}``."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
        if line.startswith("STALLED "):
            return {"error": line.lower()}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def summarize(runs: list[dict], body_size: int) -> dict | None:
    """Medians over the runs that did not fail (None if all did); the CPU
    shares of the client (``cpu``) and broker (``broker_cpu``) when every
    run measured them."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return None
    rates = [r["messages"] / r["seconds"] for r in good]
    out = {
        "runs": len(good),
        "messages": good[0]["messages"],
        "seconds_median": statistics.median(r["seconds"] for r in good),
        "msg_per_s_median": statistics.median(rates),
        "msg_per_s_all": rates,
        "mb_per_s_median": statistics.median(rates) * body_size / 1e6,
    }
    for key in ("cpu", "broker_cpu"):
        if all(key in r for r in good):
            out[f"{key}_share_median"] = statistics.median(
                r[key] / r["seconds"] for r in good)
    return out
