"""What every README block of bench/report.py shares: the stored results,
number formats, verdicts and the line naming the machine."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# --- formats ------------------------------------------------------------------


def rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    return f"{x / 1e3:.0f} k" if x >= 1e3 else f"{x:.0f}"


def count(n: int) -> str:
    return f"{n / 1e6:g} M" if n >= 1e6 else f"{n / 1e3:g} k"


def ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def med(summary: dict | None) -> float | None:
    return summary["msg_per_s_median"] if summary else None


def paired(row: dict, name: str, ref: str) -> float | None:
    """The median over the repetitions of name's rate over ref's in the same
    repetition (the two ran back to back, under the same load)."""
    import statistics
    a = row["clients"].get(name, {}).get("runs", [])
    b = row["clients"].get(ref, {}).get("runs", [])
    xs = [x["messages"] / x["seconds"] / (y["messages"] / y["seconds"])
          for x, y in zip(a, b, strict=False)  # a client absent from the row has no runs
          if "error" not in x and "error" not in y]
    return statistics.median(xs) if xs else None


def failures(runs: list[dict]) -> str:
    """" (1 failed: why)" when runs failed (after being tried again)."""
    bad = [r["error"] for r in runs if "error" in r]
    if not bad:
        return ""
    why = bad[-1].replace("|", "/")[:90]
    return f" ({len(bad)} failed: {why})"


def load_range(runs: list[dict]) -> str:
    """The 1-minute load average over the runs: lowest to highest."""
    xs = [x[0] for r in runs for x in r.get("load", []) if x]
    return f"{min(xs):.1f}-{max(xs):.1f}" if xs else "-"


def verdict(ok: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[ok]


def machine_line(m: dict, what: str) -> str:
    v = m["versions"]
    peers = ", ".join(f"{k} {v[k]}" for k in ("rbfly", "rstream") if v.get(k))
    broker = f"RabbitMQ {m['broker']}, " if m.get("broker") else ""
    return (f"{what}: {m['date'][:16].replace('T', ' ')} UTC, commit "
            f"`{m['commit'][:10]}`, {broker}{m['cores']} cores "
            f"({m['cpu_model']}), pystream {v.get('pystream')}"
            + (f", {peers}" if peers else "")
            + f"; load average {m['loadavg_start'][0]:.1f} at the start, "
              f"{m['loadavg_end'][0]:.1f} at the end")
