"""The benchmark figures of README.md and of the documentation pages,
rendered from the stored results.

    .venv/bin/python -m bench.report            # rewrite the blocks of README.md and docs/
    .venv/bin/python -m bench.report --check    # exit 1 if a block differs from the results
    .venv/bin/python -m bench.report FILE ...   # only these files

Every figure of README.md's "How fast", of the Benchmarks page
(docs/benchmarks.md), and of any other page under docs/ (the decode table
of "Decoding Deliver frames", the Spark read, write and DuckDB figures of
"Spark", the metrics' cost in "Monitoring", the partition table and the
fault matrix of "Reliability") sits between a pair of marker
comments, ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, and is
written here from bench/results/*.json; nothing between them is typed by
hand. A block may stand in any of those files, and in more than one.
tests/test_bench_report.py re-renders them and fails on any
difference. Ratios are of medians; a target is "met" only when the
measured ratio reaches it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bench.cpu_class import EMULATIONS
from bench.report_crc import crc_block
from bench.report_distance import distance_block
from bench.report_format import (
    REFERENCE_LABELS,
    count,
    cpu_class,
    failures,
    guard_reference,
    kept,
    load,
    load_range,
    machine_line,
    med,
    ms,
    paired,
    pct,
    rate,
    stored,
    verdict,
)
from bench.report_latency import guard_latency_rate, latency_block, latency_targets
from bench.report_otel import otel_block
from bench.report_partitions import partitions_block

HERE = Path(__file__).resolve().parent

README = HERE.parent / "README.md"
DOCS = HERE.parent / "docs"
MARKER = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(.*?)(<!-- /bench:(?P=name) -->)",
                    re.S)
PEERS = ("rbfly", "rstream")
CONSUME_TARGET, PUBLISH_TARGET = 0.95, 0.90
# On CPUs without VPCLMULQDQ (the emulated classes): a share of the C
# reference reader, and at most this many times its CPU per record.
CLASS_CONSUME_TARGET, CLASS_CPU_FACTOR = 0.85, 2.5


def rate_runs(c: dict | None) -> list[float]:
    """A client's rates, one per run that did not fail."""
    s = (c or {}).get("summary")
    return list(s["msg_per_s_all"]) if s else []


def guard_rate_row(label: str, row: dict) -> None:
    """``guard_reference`` for a consume or publish row (the C client is
    ``wire``, higher is better)."""
    guard_reference(label, rate_runs(row["clients"].get("wire")),
                    {n: med(c["summary"]) for n, c in row["clients"].items()
                     if n != "wire" and c.get("summary")})


# --- the blocks ---------------------------------------------------------------


def client_cell(row: dict, name: str, ref_rate: float | None) -> str:
    c = row["clients"].get(name)
    if c is None:
        return "–"
    s = c["summary"]
    if s is None:
        return "failed"
    x = med(s)
    if name == "wire":
        return rate(x)
    cell = rate(x) + (f" ({pct(x / ref_rate)})" if ref_rate else "")
    return f"**{cell}**" if name.startswith("pystream") else cell


def how_fast() -> str:
    """The headline table, one per CPU class of the stored results (each
    results file was measured on one machine)."""
    results = {name: load(name) for name in ("consume", "publish", "latency")}
    classes: dict[str, dict[str, dict | None]] = {}
    for name in results:
        for res in stored(name):
            classes.setdefault(cpu_class(res["machine"]), {})[name] = res
    if not classes:
        return "(no stored results: run `make bench`)\n"
    tables = [how_fast_table(found.get("consume"), found.get("publish"),
                             found.get("latency"), cls) for cls, found in classes.items()]
    return "\n".join(tables) + how_fast_load(*results.values())


def how_fast_table(consume: dict | None, publish: dict | None,
                   latency: dict | None, cls: str) -> str:
    """The headline rows of results measured on one CPU class, the class
    in the table's first cell: a figure is what that class of CPU gave."""
    ref = REFERENCE_LABELS["how-fast"]
    labels = {"rbfly": "rbfly", "rstream": "rstream"}
    for res in (consume, publish):
        for row in (res or {}).get("rows", {}).values():
            for name, c in row["clients"].items():
                if name in labels:
                    labels[name] = c["label"]
    lines = [f"| msg/s, or p99 latency; {cls} | {ref} | pystream (share of the {ref}) "
             f"| {labels['rbfly']} | {labels['rstream']} |", "|---|---|---|---|---|"]
    if consume:
        for key, what in (("100b", "consume {n} × 100 B"),
                          ("100b-peers", "consume {n} × 100 B, every client"),
                          ("1k", "consume {n} × 1 KiB")):
            row = consume["rows"].get(key)
            if not row:
                continue
            guard_rate_row(ref, row)
            ref_rate = med(row["clients"].get("wire", {}).get("summary"))
            cells = [client_cell(row, c, ref_rate) for c in ("wire", "pystream", *PEERS)]
            lines.append(f"| {what.format(n=count(row['messages']))} | "
                         + " | ".join(cells) + " |")
    if publish:
        for key, what in (("100b", "publish {n} × 100 B, every confirm"),
                          ("100b-peers", "publish {n} × 100 B, every client")):
            row = publish["rows"].get(key)
            if not row:
                continue
            guard_rate_row(ref, row)
            ref_rate = med(row["clients"].get("wire", {}).get("summary"))
            cells = [client_cell(row, c, ref_rate) for c in ("wire", "pystream", *PEERS)]
            lines.append(f"| {what.format(n=count(row['messages']))} | "
                         + " | ".join(cells) + " |")
    if latency:
        runs = "run" if latency["repeat"] == 1 else "runs"
        for r, by in latency["rates"].items():
            guard_latency_rate(ref, by)

            def p99(name: str, by: dict = by) -> str:
                c = by.get(name)
                if c is None:
                    return "–"
                if "p99_median_ms" not in c:
                    return "failed"
                x = f"{ms(c['p99_median_ms'])} ms"
                return f"**{x}**" if name == "pystream" else x
            together = latency.get("together") or []
            read = (", every client reading together" if together is True
                    or int(r) in together else "")
            lines.append(f"| latency p99 at {count(int(r))} msg/s "
                         f"(median of {latency['repeat']} {runs}{read}) | "
                         + " | ".join(p99(c) for c in ("wire", "pystream", *PEERS)) + " |")
    return "\n".join(lines) + "\n"


def how_fast_load(consume: dict | None, publish: dict | None, latency: dict | None) -> str:
    """The load average over every run of the headline's results."""
    lines = []
    loads = [x[0] for res in (consume, publish) if res
             for run in all_runs(res) for x in run.get("load", []) if x]
    cores = consume["machine"]["cores"] if consume else "?"
    if loads:
        # A broker and a client keep the load near one per core; above two,
        # other work shared the machine.
        busy = not isinstance(cores, int) or max(loads) > cores * 2
        lines += ["", f"The load average (1 minute, {cores} "
                      f"cores) ranged from {min(loads):.1f} to {max(loads):.1f} during "
                      "the throughput runs" + (": the machine was shared with other "
                                               "builds and tests."
                                               if busy else ", one benchmark at a time; the "
                                               "brokers share the two cores with the clients.")]
    together = [x[0] for run in (all_runs(latency) if latency else [])
                if run.get("together") for x in run.get("load", []) if x]
    if together:
        lines += ["", f"During the latency runs whose clients read together (every "
                      f"consumer, the publisher and the broker at once on {cores} cores) "
                      f"it ranged from {min(together):.1f} to {max(together):.1f}."]
    return "\n".join(lines) + "\n" if lines else ""


def all_runs(res: dict) -> list[dict]:
    """Every run stored in a results file."""
    out = []
    for row in res.get("rows", {}).values():
        for c in row["clients"].values():
            out += c["runs"]
    for by in res.get("rates", {}).values():
        for c in by.values():
            out += c["runs"]
    return out


def consume_block() -> str:
    # Then each class again with the broker and the readers on cores
    # apart (bench_consume --pin), where such results are stored.
    pinned = ["consume-pinned"] + [f"consume-{e}-pinned" for e in EMULATIONS]
    found = stored("consume") + [res for res in map(load, pinned) if res]
    if not found:
        return "(no stored results: run `make bench`)\n"
    return "\n".join(consume_section(res) for res in found)


def consume_section(res: dict) -> str:
    cls = cpu_class(res["machine"])
    pinned = res["machine"].get("pinned")
    apart = (f", the broker on core {', '.join(map(str, pinned['broker_cpus']))} "
             f"and the readers on core {', '.join(map(str, pinned['client_cpus']))}"
             if pinned else "")
    out = [f"{cls if cls.startswith('CPU class') else 'CPU class ' + cls}{apart}:", ""]
    for _key, row in res["rows"].items():
        guard_rate_row(REFERENCE_LABELS["consume"], row)
        ref_rate = med(row["clients"].get("wire", {}).get("summary"))
        out += [f"{count(row['messages'])} messages of {row['body_size']} B "
                f"(`{row['stream']}`), medians of {res['repeat']} runs, every client reading "
                f"the same messages:", "",
                f"| reader | msg/s | MB/s (bodies) | share of the {REFERENCE_LABELS['consume']} "
                "| reader CPU s per M msgs | broker CPU (cores) | each run (msg/s) | load |",
                "|---|---|---|---|---|---|---|---|"]
        for name, c in row["clients"].items():
            s = c["summary"]
            label = REFERENCE_LABELS["consume"] if name == "wire" else c["label"]
            if s is None:
                out.append(failed_row(label, c, 7))
                continue
            share, broker, runs = client_figures(name, c, ref_rate)
            out.append(f"| {label} | {rate(med(s))} | {s['mb_per_s_median']:.0f} | "
                       f"{share} | {s['cpu_s_per_m_median']:.3f} | {broker} | {runs} "
                       f"| {load_range(c['runs'])} |")
        out.append("")
    out.append(machine_line(res["machine"], "Measured"))
    return "\n".join(out) + "\n"


def client_figures(name: str, c: dict, ref_rate: float | None) -> tuple[str, str, str]:
    """A client's share of the C reference's rate, the broker's CPU (cores) and its
    runs, as the consume and publish tables show them."""
    s = c["summary"]
    share = pct(med(s) / ref_rate) if ref_rate and name != "wire" else "–"
    broker = (f"{s['broker_cpu_share_median']:.2f}"
              if "broker_cpu_share_median" in s else "-")
    runs = ", ".join(rate(x) for x in s["msg_per_s_all"]) + failures(c["runs"])
    return share, broker, runs


def failed_row(label: str, c: dict, cells: int) -> str:
    """The row of a client whose every run failed: its last error."""
    return f"| {label} | failed: {c['runs'][-1].get('error', '?')} " + "|" * cells + " "


def publish_block() -> str:
    res = load("publish")
    if not res:
        return "(no stored results: run `make bench`)\n"
    out = []
    for _key, row in res["rows"].items():
        guard_rate_row(REFERENCE_LABELS["publish"], row)
        ref_rate = med(row["clients"].get("wire", {}).get("summary"))
        out += [f"{count(row['messages'])} messages of {row['body_size']} B, every "
                f"confirm awaited, a fresh stream per run, medians of "
                f"{res['repeat']} runs:", "",
                f"| publisher | msg/s | share of the {REFERENCE_LABELS['publish']} "
                "| publisher CPU s per M "
                "msgs | broker CPU (cores) | each run (msg/s) | load |",
                "|---|---|---|---|---|---|---|"]
        for name, c in row["clients"].items():
            s = c["summary"]
            label = {"wire": REFERENCE_LABELS["publish"], "pystream": "pystream (list of bytes)",
                     "pystream-arrow": "pystream (arrow array)"}.get(name, c["label"])
            if s is None:
                out.append(failed_row(label, c, 6))
                continue
            share, broker, runs = client_figures(name, c, ref_rate)
            out.append(f"| {label} | {rate(med(s))} | {share} | "
                       f"{s['cpu_s_per_m_median']:.3f} | {broker} | {runs} "
                       f"| {load_range(c['runs'])} |")
        out.append("")
    out.append(machine_line(res["machine"], "Measured"))
    return "\n".join(out) + "\n"


def consume_targets(res: dict, target: float, cpu_factor: float | None = None,
                    named: bool = False) -> list[str]:
    """pystream's share of the C reference reader in each consume row of
    ``res`` against ``target``, and (``cpu_factor``) its CPU per record
    against at most that many times the C reader's; ``named`` says the
    CPU class (results of an emulated class)."""
    out = []
    for key in ("100b", "1k"):
        row = res["rows"].get(key)
        ws = row and row["clients"].get("wire", {}).get("summary")
        p = row and row["clients"].get("pystream", {}).get("summary")
        if not (ws and p):
            continue
        x = med(p) / med(ws)
        mine, theirs = p["cpu_s_per_m_median"], ws["cpu_s_per_m_median"]
        where = f", {cpu_class(res['machine'])}" if named else ""
        line = (f"- consume {count(row['messages'])} × {row['body_size']} B{where}: "
                f"pystream at {pct(x)} of the {REFERENCE_LABELS['consume']} (median of the "
                f"repetitions' ratios: {pct(paired(row, 'pystream', 'wire'))}; "
                f"target {pct(target)}): {verdict(x >= target)}; CPU per million "
                f"messages: pystream {mine:.3f} s, the C reader {theirs:.3f} s")
        if cpu_factor is not None:
            line += (f", {mine / theirs:.2f}x the C reader's (target at most "
                     f"{cpu_factor:g}x): {verdict(mine <= theirs * cpu_factor)}")
        out.append(line)
    return out


def targets_block() -> str:
    """Each throughput target with its measured ratio."""
    publish = load("publish")
    measured = [res for res in (load("consume"), *kept("consume")) if res]
    out = []
    for res in measured:
        out += consume_targets(res, CONSUME_TARGET, named=len(measured) > 1)
    for emulation in EMULATIONS:
        for other in filter(None, (load(f"consume-{emulation}"), *kept(f"consume-{emulation}"))):
            out += consume_targets(other, CLASS_CONSUME_TARGET, CLASS_CPU_FACTOR, named=True)
    if publish:
        kinds = (("pystream", "a list of bytes"), ("pystream-arrow", "an arrow array"))
        row = publish["rows"].get("100b")
        if row:
            w = med(row["clients"].get("wire", {}).get("summary"))
            for name, what in kinds:
                p = row["clients"].get(name, {}).get("summary")
                if w and p:
                    x = med(p) / w
                    out.append(f"- publish {count(row['messages'])} × 100 B from {what}: "
                               f"pystream at {pct(x)} of the "
                               f"{REFERENCE_LABELS['publish']} (median of "
                               f"the repetitions' ratios: {pct(paired(row, name, 'wire'))}; "
                               f"target {pct(PUBLISH_TARGET)}): "
                               f"{verdict(x >= PUBLISH_TARGET)}")
        row = publish["rows"].get("100b-peers")
        if row:
            for name, what in kinds:
                p = med(row["clients"].get(name, {}).get("summary"))
                for peer in PEERS:
                    q = med(row["clients"].get(peer, {}).get("summary"))
                    if p and q:
                        out.append(f"- publish {count(row['messages'])} × 100 B from "
                                   f"{what}: pystream {p / q:.1f}x "
                                   f"{row['clients'][peer]['label']} (target: ahead): "
                                   f"{verdict(p > q)}")
    latency = stored("latency")
    for res in latency:
        out += latency_targets(res, named=len(latency) > 1)
    return "\n".join(out) + "\n" if out else "(no stored results)\n"


def decode_block() -> str:
    res = load("decode")
    if not res:
        return "(no stored results: run `make bench`)\n"
    sizes = res["sizes"]
    out = [f"Decode speed (`bench/bench_decode.py`: CRC on, {res['frames']} frames of "
           f"1 MiB, the decoders taking turns, medians of {res['repeat']} rounds):", "",
           "| | 100-byte messages | 1 KiB messages |", "|---|---|---|"]
    names = list(next(iter(sizes.values())))
    for name in names:
        cells = []
        for size in sizes.values():
            c = size.get(name)
            s = c and c["summary"]
            if not s:
                cells.append("–")
                continue
            base = med((size.get("rbfly") or {}).get("summary"))
            gb = s["gb_per_s_median"]
            x = f"{rate(med(s))} msg/s, {gb:.1f} GB/s" if gb >= 1 else \
                f"{rate(med(s))} msg/s, {gb * 1e3:.0f} MB/s"
            if base and name != "rbfly":
                x += f" ({med(s) / base:.0f}x rbfly)"
            cells.append(x)
        label = {"pystream-view": 'pystream, `body="view"`',
                 "pystream-binary": 'pystream, `body="binary"`'}.get(
                     name, next(iter(sizes.values()))[name]["label"])
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += ["", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"


def spark_block() -> str:
    res = load("spark")
    if not res:
        return "(no stored results: run `make bench`)\n"
    readers = res["readers"]
    base = med((readers.get("parquet") or {}).get("summary"))
    out = [f"Spark `local[2]`, `count(*), sum(length(body))` over {count(res['messages'])} "
           f"records of 100 B, medians of {res['repeat']} runs:", "",
           "| reader | seconds | rows/s | vs Parquet | broker CPU (cores) | load |",
           "|---|---|---|---|---|---|"]
    for name, c in readers.items():
        s = c["summary"]
        if not s:
            out.append(f"| {name} | failed ||||| ")
            continue
        broker = (f"{s['broker_cpu_share_median']:.2f}"
                  if "broker_cpu_share_median" in s else "-")
        ratio = f"{med(s) / base:.2f}" if base else "–"
        label = {"parquet": "Spark's Parquet reader, the same rows in a local file",
                 "pystream": "`rabbitmq_stream`, every column",
                 "pystream-body": '`rabbitmq_stream`, `.schema("body binary")`',
                 "python-ceiling": "a Python data source with no I/O (prebuilt batches)",
                 }.get(name, name)
        out.append(f"| {label} | {s['seconds_median']:.2f} | {rate(med(s))} | {ratio} "
                   f"| {broker} | {load_range(c['runs'])} |")
    out += ["", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"


SPARK_IO_RATIOS = (("spark-write", "producer", 0.50, "Spark write", "of the producer"),
                   ("spark-read", "python-ceiling", 0.80, "Spark read", "of the ceiling"),
                   ("duckdb", "consume", 0.80, "DuckDB", "of pystream's consume rate"))
SPARK_IO_LABELS = {
    "producer": "pystream producer, batches of 10 000",
    "spark-write": "Spark `df.write` (2 tasks)",
    "spark-read": 'Spark read, `.schema("body binary")`, 4 ranges',
    "python-ceiling": "Python data source with no I/O (the ceiling)",
    "read-range": "the same 4 ranges read in one process, no Spark",
    "consume": "pystream `read_range`, counting rows",
    "duckdb": "DuckDB `count(*), sum(octet_length(body))` over it",
}


SPARK_READ_CPU_BUDGET = 1.15


def spark_io_block() -> str:
    res = load("spark_io")
    if not res:
        return "(no stored results: run `make bench`)\n"
    cases = res["cases"]
    s = {name: c["summary"] for name, c in cases.items()}
    ratio_of = {a: (b, what.replace(" consume rate", "").replace("'s", ""))
                for a, b, _, _, what in SPARK_IO_RATIOS}
    loads = [x[0] for c in cases.values() for r in c["runs"] for x in r.get("load", []) if x]
    written = res.get("write_messages", res["messages"])
    counts = (written, res["messages"], res["duckdb_messages"])
    scope = (f"{count(written)} records of {res['body_size']} B in every case"
             if len(set(counts)) == 1 else
             f"{count(written)} records of {res['body_size']} B for the producer and the "
             f"Spark write, {count(res['messages'])} for the Spark reads and the ranges, "
             f"{count(res['duckdb_messages'])} for `read_range` and DuckDB")
    out = [f"{scope}; medians of {res['repeat']} runs, the cases taking turns"
           + (f", load average {min(loads):.1f} to {max(loads):.1f}" if loads else "")
           + ":", "",
           "| case | seconds | rows/s | ratio | broker CPU (cores) | load |",
           "|---|---|---|---|---|---|"]
    if s.get("python-ceiling") and s.get("spark-read"):
        # the one Spark data source measured beside the no-I/O one
        guard_reference(SPARK_IO_LABELS["python-ceiling"], rate_runs(cases["python-ceiling"]),
                        {"spark-read": med(s["spark-read"])})
    for name, c in cases.items():
        label = SPARK_IO_LABELS.get(name, name)
        if not s[name]:
            out.append(f"| {label} | failed{failures(c['runs'])} ||||| ")
            continue
        ratio = ""
        if name in ratio_of and s.get(ratio_of[name][0]):
            ratio = f"{med(s[name]) / med(s[ratio_of[name][0]]):.2f} {ratio_of[name][1]}"
        broker = (f"{s[name]['broker_cpu_share_median']:.2f}"
                  if "broker_cpu_share_median" in s[name] else "-")
        out.append(f"| {label} | {s[name]['seconds_median']:.2f} | {rate(med(s[name]))} "
                   f"| {ratio} | {broker} | {load_range(c['runs'])} |")
    out += ["", "Targets, as measured (ratios of the medians):", ""]
    for a, b, target, name, what in SPARK_IO_RATIOS:
        if not (s.get(a) and s.get(b)):
            out.append(f"- {name} at {pct(target)} {what} or more: {verdict(None)}")
            continue
        x = med(s[a]) / med(s[b])
        out.append(f"- {name} at {pct(target)} {what} or more: {verdict(x >= target)} "
                   f"({pct(x)}, over {count(s[a]['messages'])} records)")
    if s.get("spark-read") and s.get("python-ceiling") and s.get("read-range"):
        read, ceil, alone = (s[k] for k in ("spark-read", "python-ceiling", "read-range"))
        extra = read["seconds_median"] - ceil["seconds_median"]
        beside = (f"the read takes {extra:.2f} s more than the ceiling, "
                  f"{extra / alone['seconds_median']:.1f}x that work's own "
                  f"{alone['seconds_median']:.2f} s" if extra > 0 else
                  "the read takes no longer than the ceiling")
        out += ["", f"Where the read's time goes: the data source's own work (subscribe, "
                    f"decode, trim, add the `stream` column) reads the same ranges at "
                    f"{rate(med(alone))} rows/s in one process, "
                    f"{med(alone) / med(read):.1f}x what Spark's path moves; {beside}."]
        keys = ("jvm_cpu_s_per_m_median", "python_cpu_s_per_m_median",
                "broker_cpu_s_per_m_median")
        if all(k in x for k in keys for x in (read, ceil)):
            cost = [sum(x[k] for k in keys) for x in (read, ceil)]
            out += ["", f"CPU seconds per million records, the read beside the ceiling: "
                        f"JVM {read[keys[0]]:.2f} and {ceil[keys[0]]:.2f}, Python "
                        f"workers {read[keys[1]]:.2f} and {ceil[keys[1]]:.2f}, broker "
                        f"{read[keys[2]]:.2f} and {ceil[keys[2]]:.2f}: {cost[0]:.2f} "
                        f"and {cost[1]:.2f} in all, a ratio of {cost[1] / cost[0]:.2f} "
                        f"(the rate ratio where both keep the 2 cores busy)."]
            if "cpu_s_per_m_median" in alone and "broker_cpu_s_per_m_median" in alone:
                # What the read cannot do without: the ceiling's Spark work, the
                # broker sending the rows, pystream reading them.
                floor = (ceil[keys[0]] + ceil[keys[1]] + alone["broker_cpu_s_per_m_median"]
                         + alone["cpu_s_per_m_median"])
                x = cost[0] / floor
                out += ["", f"- the read's CPU per million records (JVM, workers, broker) "
                            f"at most {SPARK_READ_CPU_BUDGET:.2f}x the ceiling's Spark CPU, "
                            f"the broker's send and pystream's own read (`read_range`): "
                            f"{verdict(x <= SPARK_READ_CPU_BUDGET)} ({cost[0]:.3f} against "
                            f"{floor:.3f} s, {x:.2f}x)"]
    out += ["", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"


def faults_block() -> str:
    """The fault x feature matrix (tests/faults.py, ``make faults``): a
    verdict per path and fault, the failures' reasons below."""
    res = load("faults")
    if not res:
        return "(no stored results: run `make faults`)\n"
    cells = {(c["path"], c["fault"]): c for c in res["cells"]}
    faults = res["faults"]
    out = ["| path | " + " | ".join(faults) + " |", "|---" * (len(faults) + 1) + "|"]
    notes: list[str] = []
    for path, label in res["paths"].items():
        row = []
        for fault in faults:
            c = cells.get((path, fault))
            if c is None or c["verdict"] == "n/a":
                row.append("n/a")
            elif c["verdict"] == "pass":
                row.append("pass" if c["promise"] == "exactly-once" else "pass (at least once)")
            else:
                reason = " ".join(c["reason"].split()).replace("|", "/")
                notes.append(f"{len(notes) + 1}. {label}, {fault}: "
                             + (reason if len(reason) <= 300 else reason[:297] + "..."))
                row.append(f"**fail** ({len(notes)})")
        out.append(f"| {label} | " + " | ".join(row) + " |")
    verdicts = [c["verdict"] for c in res["cells"]]
    rounds = ", ".join(f"{k} {v:.0f} s" for k, v in res["rounds"].items())
    records = f"{res['records_per_cell']:,}".replace(",", " ")
    out += ["", f"{len(verdicts)} cells: {verdicts.count('pass')} pass, "
                f"{verdicts.count('fail')} fail, {verdicts.count('n/a')} n/a; "
                f"{records} records a cell; the whole matrix took "
                f"{res['seconds']:.0f} s ({rounds})."]
    if notes:
        out += [""] + notes
    out += ["", machine_line(res["machine"], "Measured")]
    return "\n".join(out) + "\n"


BLOCKS = {"how-fast": how_fast, "targets": targets_block, "consume": consume_block,
          "publish": publish_block, "latency": latency_block,
          "decode": decode_block, "spark": spark_block, "spark-io": spark_io_block,
          "otel": otel_block, "distance": distance_block,
          "partitions": partitions_block, "faults": faults_block, "crc": crc_block}


def pages() -> list[Path]:
    """The files whose blocks are rendered: README.md and every Markdown
    page under docs/."""
    return [README, *sorted(DOCS.glob("**/*.md"))]


def render(text: str, where: str = "README.md") -> str:
    """``text`` with every generated block rewritten from the results."""
    def block(m: re.Match) -> str:
        name = m.group("name")
        if name not in BLOCKS:
            raise SystemExit(f"{where}: unknown block bench:{name}")
        return m.group(1) + BLOCKS[name]() + m.group(4)
    return MARKER.sub(block, text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path,
                    help="the Markdown files to render (default: README.md and docs/**/*.md)")
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if a file differs")
    args = ap.parse_args()
    differ = False
    for path in args.files or pages():
        text = path.read_text()
        new = render(text, str(path))
        if new == text:
            continue
        if args.check:
            print(f"{path}: figures differ from bench/results (run python -m bench.report)",
                  file=sys.stderr)
            differ = True
        else:
            path.write_text(new)
            print(f"{path}: rewritten from bench/results")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
