"""What the end-to-end benchmarks' child processes share: the body they
send or expect, the progress watchdog, and the rate format."""

from __future__ import annotations

import os
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


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"
