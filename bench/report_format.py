"""What every README block of bench/report.py shares: the stored results,
number formats, verdicts and the line naming the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.cpu_class import EMULATIONS

RESULTS = Path(__file__).resolve().parent / "results"


# What the C wire client's rows are called: references to measure against,
# not bounds (clients beat them: guard_reference refuses a bound's name then).
REFERENCE_LABELS = {"consume": "C reference reader", "publish": "C reference publisher",
                    "latency": "C reference latency", "how-fast": "C reference"}


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def stored(name: str) -> list[dict]:
    """The results of ``name``: the latest run (``<name>.json``), then those
    kept from runs on other CPU classes (``tools.results.class_path``),
    then the same for each class emulated (``<name>-<class>.json``, see
    bench/cpu_class)."""
    found = []
    for base in [name, *(f"{name}-{e}" for e in EMULATIONS)]:
        found += [load(base), *kept(base)]
    return [res for res in found if res]


def kept(name: str) -> list[dict | None]:
    """The results of ``name`` kept from runs on other CPU classes."""
    return [load(p.stem) for p in sorted(RESULTS.glob(f"{name}.*.json"))]


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


#: How sure a "lower than" must be: the one-sided p-value of the runs.
LOWER_SHOWN_P = 0.05


def lower_p(a: list[float], b: list[float]) -> float:
    """The one-sided p-value that a's values lie lower than b's (the
    Mann-Whitney U test, normal approximation with continuity and tie
    corrections): runs of two clients, each an independent draw."""
    import math
    n, m = len(a), len(b)
    if not n or not m:
        return 1.0
    pooled = sorted((v, i) for i, v in enumerate([*a, *b]))
    ranks = [0.0] * (n + m)
    ties = 0.0
    k = 0
    while k < len(pooled):
        j = k
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[k][0]:
            j += 1
        for t in range(k, j + 1):
            ranks[pooled[t][1]] = (k + j) / 2 + 1
        ties += (j - k + 1) ** 3 - (j - k + 1)
        k = j + 1
    u = sum(ranks[:n]) - n * (n + 1) / 2   # pairs where a's value is the higher
    var = n * m / 12 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    if var <= 0:
        return 1.0
    z = (u - n * m / 2 + 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(-z / math.sqrt(2))


def paired_lower_p(a: list[float], b: list[float]) -> float:
    """The one-sided p-value that a[i] lies lower than b[i], pairs taken in
    the same run (the sign test, exact; equal pairs left out)."""
    import math
    wins = sum(x < y for x, y in zip(a, b, strict=True))
    n = wins + sum(x > y for x, y in zip(a, b, strict=True))
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n if n else 1.0


def lower_verdict(a: list[float], b: list[float],
                  paired: bool = False) -> bool | None | str:
    """Whether a's runs lie lower than b's (``paired``: a[i] and b[i] from
    the same run): True when the runs show it, False when they show the
    opposite or a's median is not the lower, "not shown" when a's median
    is lower by less than the runs' spread."""
    import statistics
    if not a or not b:
        return None
    test = paired_lower_p if paired else lower_p
    if test(a, b) < LOWER_SHOWN_P:
        return True
    if test(b, a) < LOWER_SHOWN_P or statistics.median(a) >= statistics.median(b):
        return False
    return "not shown"


def verdict_of(ok: bool | None | str) -> str:
    """verdict(), and "**not shown**" for a difference within the spread."""
    return "**not shown** (within the runs' spread)" if ok == "not shown" else verdict(ok)


def cpu_class(m: dict) -> str:
    """The CPU class a result was measured on (tools/results.py names it
    from the CPU's flags); results stored before the flags were recorded
    say which model they came from, and no more."""
    if m.get("cpu_class"):
        return m["cpu_class"]
    return f"CPU class unknown (recorded as: {m.get('cpu_model', '?')})"


def cpu_text(m: dict) -> str:
    """The model and the CPU class, for the line under a table."""
    if m.get("cpu_class"):
        return f"{m.get('cpu_model', '?')}, CPU class {m['cpu_class']}"
    return cpu_class(m)


class ReferenceBeaten(ValueError):
    """A row called a limit, a ceiling or a floor that a client beats: the
    name would promise what the figures deny."""


BOUND = re.compile(r"\b(limit|ceiling|floor)s?\b", re.I)


def guard_reference(label: str, ref_runs: list[float], clients: dict[str, float], *,
                    lower_is_better: bool = False) -> None:
    """Refuse (``ReferenceBeaten``) a reference row whose ``label`` calls it
    a limit, a ceiling or a floor when a client's median beats the
    reference's median by more than the spread of the reference's runs
    (their interquartile range: the middle half, which one stray run does
    not widen): such a row is a reference, not a bound."""
    if not BOUND.search(label) or not ref_runs:
        return
    import statistics
    ref = statistics.median(ref_runs)
    spread = 0.0
    if len(ref_runs) > 1:
        q1, _, q3 = statistics.quantiles(ref_runs, n=4, method="inclusive")
        spread = q3 - q1
    for name, x in clients.items():
        margin = ref - x if lower_is_better else x - ref
        if margin > spread:
            raise ReferenceBeaten(
                f"{label!r} is beaten by {name} ({x:.6g} against its median "
                f"{ref:.6g}, spread of its runs {spread:.6g}): a row a client beats "
                "is no limit, ceiling or floor; call it a reference")


def machine_line(m: dict, what: str) -> str:
    v = m["versions"]
    peers = ", ".join(f"{k} {v[k]}" for k in ("rbfly", "rstream") if v.get(k))
    broker = f"RabbitMQ {m['broker']}, " if m.get("broker") else ""
    return (f"{what}: {m['date'][:16].replace('T', ' ')} UTC, commit "
            f"`{m['commit'][:10]}`, {broker}{m['cores']} cores "
            f"({cpu_text(m)}), pystream {v.get('pystream')}"
            + (f", {peers}" if peers else "")
            + f"; load average {m['loadavg_start'][0]:.1f} at the start, "
              f"{m['loadavg_end'][0]:.1f} at the end")
