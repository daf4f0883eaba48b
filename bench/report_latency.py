"""The latency figures of the Benchmarks page (bench/bench_latency.py's
results), one section per CPU class stored: the tables, each client's
stalls against the C reference, and the targets as measured."""

from __future__ import annotations

from bench.bench_latency import LATENCY_FACTOR, STALL_GAP, STALL_MS, check_targets
from bench.report_format import (
    REFERENCE_LABELS,
    count,
    cpu_class,
    guard_reference,
    load_range,
    machine_line,
    ms,
    stored,
    verdict,
    verdict_of,
)


def guard_latency_rate(label: str, by: dict) -> None:
    """``guard_reference`` for one rate of the latency results (the C
    client is ``wire``; lower is better)."""
    ref_runs = [r["p99_ms"] for r in by.get("wire", {}).get("runs", []) if "p99_ms" in r]
    guard_reference(label, ref_runs,
                    {n: c["p99_median_ms"] for n, c in by.items()
                     if n != "wire" and "p99_median_ms" in c}, lower_is_better=True)


def latency_block() -> str:
    found = stored("latency")
    if not found:
        return "(no stored results: run `make bench`)\n"
    return "\n".join(latency_section(res, named=len(found) > 1) for res in found)


def latency_section(res: dict, named: bool) -> str:
    """The tables of one results file; ``named``: headed by its CPU class
    (results of more than one class are stored)."""
    together = res.get("together") or []
    if together is True:    # stored by --together before it took rates
        together = [int(r) for r in res["rates"]]
    turns = [r for r in res["rates"] if int(r) not in together]
    how = "of each client taking turns"
    if together:
        how = (f"at {' and '.join(count(r) for r in together)} msg/s with every client "
               "reading the same messages at once (`--together`, the order of "
               "subscribing turned each run)"
               + (f", at {' and '.join(count(int(r)) for r in turns)} msg/s taking turns"
                  if turns else ""))
    cls = cpu_class(res["machine"])
    out = [f"{cls if cls.startswith('CPU class') else 'CPU class ' + cls}:", ""] if named else []
    out += [f"{res['seconds']:g} s per run at each rate, the first {res['warmup']:g} s "
           f"left out, {res['size']} B bodies, {res['repeat']} runs {how}; "
           "each figure is the median over the runs, p99 beside the "
           "lowest and highest run's, and each run's p90 (milliseconds):", "",
           "| rate | consumer | p50 | p99 | p99 of the runs | p90 of each run | p99.9 "
           f"| max | p99 / {REFERENCE_LABELS['latency']} | consumer CPU | lost | load |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, by in res["rates"].items():
        guard_latency_rate(REFERENCE_LABELS["latency"], by)
        ref_p99 = by.get("wire", {}).get("p99_median_ms")
        first = True
        for name, c in by.items():
            head = f"{count(int(r))} msg/s" if first else ""
            first = False
            if "p99_median_ms" not in c:
                out.append(f"| {head} | {c['label']} | failed: {c.get('error', '?')} "
                           "|||||||||| ")
                continue
            ratio = f"{c['p99_median_ms'] / ref_p99:.1f}x" if ref_p99 else "–"
            label = (f"**{c['label']}**" if name == "pystream" else
                     REFERENCE_LABELS["latency"] if name == "wire" else c["label"])
            cpu = f"{c['cpu_share_median']:.0%}" if "cpu_share_median" in c else "-"
            n = c["publisher_flagged"]
            flagged = f" ({n} run{'s' if n > 1 else ''}: publisher behind)" if n else ""
            p90s = ", ".join(ms(run["p90_ms"]) for run in c["runs"] if "p90_ms" in run)
            out.append(f"| {head} | {label} | {ms(c['p50_median_ms'])} | "
                       f"{ms(c['p99_median_ms'])} | {ms(c['p99_min_ms'])}-"
                       f"{ms(c['p99_max_ms'])} | {p90s} | {ms(c['p99.9_median_ms'])} | "
                       f"{ms(c['max_median_ms'])} | {ratio} | {cpu} | "
                       f"{c['lost']}{flagged} | {load_range(c['runs'])} |")
    pairs = [(r, by["pystream"]["paired"]) for r, by in res["rates"].items()
             if by.get("pystream", {}).get("paired")]
    if pairs:
        out += ["", "Message by message, where the clients read together: pystream's "
                "latency minus the other client's for the same message (the median, "
                "10th and 90th percentiles over a run's messages, each the median "
                "over the runs; below 0 pystream handed the message first), and the "
                "share of messages pystream handed first:", "",
                "| rate | against | median | 10th | 90th | pystream first |",
                "|---|---|---|---|---|---|"]
        for r, paired in pairs:
            first = True
            for other, p in paired.items():
                label = (REFERENCE_LABELS["latency"] if other == "wire"
                         else res["rates"][r].get(other, {}).get("label", other))
                out.append(f"| {count(int(r)) + ' msg/s' if first else ''} | {label} | "
                           f"{p['diff_median_ms'] * 1000:+.0f} us | "
                           f"{p['diff_p10_ms'] * 1000:+.0f} us | "
                           f"{p['diff_p90_ms'] * 1000:+.0f} us | "
                           f"{p['pystream_first']:.0%} |")
                first = False
    stalled = [(r, name, c["label"], c["stalls"]) for r, by in res["rates"].items()
               for name, c in by.items() if c.get("stalls")]
    if stalled:
        out += ["", f"Where each tail comes from, where the clients read together: a "
                f"message a client handed {STALL_MS:g} ms or more after the "
                f"{REFERENCE_LABELS['latency']} did is stalled (its process not "
                f"running, or not reading); stalled messages fewer than {STALL_GAP} "
                "apart are one episode. Medians over the runs:", "",
                "| rate | consumer | episodes | messages stalled | of its top 1 % "
                "| longest |", "|---|---|---|---|---|---|"]
        last = None
        for r, name, label, st in stalled:
            shown = f"**{label}**" if name == "pystream" else label
            out.append(f"| {count(int(r)) + ' msg/s' if r != last else ''} | {shown} | "
                       f"{st['episodes']:g} | {st['stalled_share']:.2%} | "
                       f"{st['top1_stalled_share']:.0%} | {st['longest_ms']:.1f} ms |")
            last = r
    collected = [(r, name, c["label"], [run for run in c.get("runs", [])
                                        if "gc_collections" in run])
                 for r, by in res["rates"].items() for name, c in by.items()]
    collected = [row for row in collected if row[3]]
    if collected:
        out += ["", "Cyclic garbage collections in each Python consumer's process "
                "while it measured (each collected and froze its start-up heap "
                "before the publisher began): a collection stops the thread "
                "that reads:", "",
                "| rate | consumer | collections per run | longest pause |",
                "|---|---|---|---|"]
        last = None
        for r, name, label, runs in collected:
            shown = f"**{label}**" if name == "pystream" else label
            per_run = ", ".join(str(run["gc_collections"]) for run in runs)
            longest = max(run["gc_pause_max_ms"] for run in runs)
            out.append(f"| {count(int(r)) + ' msg/s' if r != last else ''} | {shown} | "
                       f"{per_run} | {longest:.2f} ms |")
            last = r
    out += ["", "Targets, as measured (medians of the runs' p99; \"below\" a peer is met only "
            "where the runs show it at 5 %: run by run, by a sign test, where the clients "
            "read together, else by a one-sided Mann-Whitney U test over the runs' p99s; "
            "\"not shown\" where a lower median lies within the runs' spread):",
            ""]
    for t in check_targets(res["rates"]):
        if t["against"] == "wire":
            rule = f"at most {LATENCY_FACTOR:g}x the {REFERENCE_LABELS['latency']}'s p99"
        else:
            rule = f"below {t['against']}'s"
        p, q = t["pystream_p99_ms"], t["other_p99_ms"]
        figures = ""
        if p is not None and q is not None:
            runs = t.get("lower_runs")
            together = (f"; pystream's lower in {runs[0]} of {runs[1]} runs read together"
                        if runs else "")
            figures = f" ({ms(p)} vs {ms(q)} ms{together})"
        out.append(f"- {count(int(t['rate']))} msg/s, pystream's p99 {rule}: "
                   f"{verdict_of(t['met'])}{figures}")
    out += ["", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"


def latency_targets(res: dict, named: bool = False) -> list[str]:
    """The latency targets of the Benchmarks page's list, as measured in
    ``res``; ``named`` says the CPU class."""
    out = []
    where = f", {cpu_class(res['machine'])}" if named else ""
    for t in check_targets(res["rates"]):
        p, q = t["pystream_p99_ms"], t["other_p99_ms"]
        at = f"- latency at {count(int(t['rate']))} msg/s{where}"
        if p is None or q is None:
            out.append(f"{at} against {t['against']}: not measured (every run failed)")
            continue
        if t["against"] == "wire":
            out.append(f"{at}: pystream's p99 {p / q:.2f}x the "
                       f"{REFERENCE_LABELS['latency']}'s (target at most "
                       f"{LATENCY_FACTOR:g}x): {verdict(t['met'])}")
        else:
            label = res["rates"][str(t["rate"])][t["against"]]["label"]
            out.append(f"{at}: pystream's p99 {ms(p)} ms, {label}'s {ms(q)} ms "
                       f"(target: lower): {verdict_of(t['met'])}")
    return out
