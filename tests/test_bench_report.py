"""The benchmark figures of README.md and of the documentation pages
(docs/*.md) are what bench/report.py renders from the stored results
(bench/results/*.json): none is typed by hand."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import pytest

from bench import report, report_format, report_otel
from tools import results

ROOT = Path(__file__).resolve().parent.parent


def load_report():
    return report


def test_figures_are_rendered_from_the_stored_results():
    report = load_report()
    pages = report.pages()
    assert ROOT / "README.md" in pages and ROOT / "docs" / "benchmarks.md" in pages
    blocks = set()
    for page in pages:
        text = page.read_text()
        blocks |= {m.group("name") for m in report.MARKER.finditer(text)}
        rendered = report.render(text, str(page))
        for old, new in zip(report.MARKER.finditer(text), report.MARKER.finditer(rendered),
                            strict=True):
            assert old.group(0) == new.group(0), (
                f"{page.relative_to(ROOT)}: block bench:{old.group('name')} differs from "
                "what bench/report.py renders from bench/results: run python -m bench.report")
        assert rendered == text
    assert {"how-fast", "targets", "consume", "publish", "latency",
            "decode", "otel", "spark", "spark-io", "distance"} <= blocks
    assert "<!-- bench:how-fast -->" in (ROOT / "README.md").read_text()  # the headline


def test_every_rendered_block_has_figures_and_the_machine():
    report = load_report()
    for name in ("consume", "publish", "latency", "decode", "otel", "spark", "spark-io",
                 "distance", "partitions"):
        block = report.BLOCKS[name]()
        assert "no stored results" not in block, name
        assert re.search(r"commit `[0-9a-f]{10}`", block), name
        assert "load average" in block, name


def test_the_metrics_cost_is_rendered_from_the_harness_results():
    """The Monitoring section's overhead figures come from
    bench/results/otel.json as bench/harness.py writes it, and the 2 %
    target is claimed only when the runs can resolve it."""
    report = load_report()
    res = report.load("otel")
    assert res is not None
    for key in ("date", "commit", "versions", "broker", "cores", "cpu_model",
                "loadavg_start", "loadavg_end"):
        assert key in res["machine"], key
    assert res["machine"]["versions"].get("opentelemetry-sdk")
    assert set(res["hook_costs"]) == {"absent", "api", "sdk"}
    for row in res["rows"].values():
        # absent and sdk by default; api with --only absent,api,sdk
        assert {"absent", "sdk"} <= set(row["clients"]) <= {"absent", "api", "sdk"}
        for c in row["clients"].values():
            assert all("load" in r for r in c["runs"])
    block = report.otel_block()
    assert "| median of" in block and "load average" in block
    spreads = [report_otel.spread(c["summary"]) for row in res["rows"].values()
               for c in row["clients"].values()]
    verdict = next(x for x in block.splitlines() if x.startswith("Target, "))
    cis = [row["vs_absent"]["sdk"].get("msg_per_s_paired_ci95")
           for row in res["rows"].values()]
    windows = [row["modes"]["sdk"]["msg_per_s_paired_ci95"]
               for row in (res.get("windows") or {}).values() if "modes" in row]
    if windows and all(windows):
        # the paired windows in one process decide, for the default SDK set-up
        met = all(ci[0] >= -report_otel.OTEL_TARGET for ci in windows)
        assert (", met" in verdict) == met, verdict
    elif all(cis):
        # the paired changes' 95 % intervals decide: met only when every
        # row's lies above -2 %
        met = all(ci[0] >= -report_otel.OTEL_TARGET for ci in cis)
        assert (": met " in verdict) == met, verdict
    elif any(x is None or x > report_otel.OTEL_TARGET for x in spreads):
        assert "**not shown** on this shared, noisy machine" in verdict
    monitoring = (ROOT / "docs" / "monitoring.md").read_text()
    outside = report.MARKER.sub("", monitoring)
    assert "<!-- bench:otel -->" in monitoring
    assert not re.search(r"\d %|msg/s|µs", outside), (
        "a metrics-cost figure typed by hand outside the bench:otel block")


def test_bench_otel_uses_the_harness():
    """bench_otel.py parses, runs children and summarizes through
    bench/harness.py, like every other benchmark."""
    source = (ROOT / "bench" / "bench_otel.py").read_text()
    for call in ("harness.parser(", "harness.chosen(", "harness.run_child(",
                 "harness.interleave(", "harness.summarize(", "harness.write_results(",
                 "harness.child_done("):
        assert call in source, call
    assert "argparse.ArgumentParser(" not in source
    assert "subprocess" not in source


def test_spark_io_block_states_each_target_with_its_ratio_and_count():
    report = load_report()
    block = report.BLOCKS["spark-io"]()
    for _, _, target, name, what in report.SPARK_IO_RATIOS:
        line = next(x for x in block.splitlines()
                    if x.startswith(f"- {name} at {report.pct(target)} {what} or more: "))
        assert re.search(r": (met|\*\*not met\*\*) \(\d+ %, over [\d.]+ [kM] records\)$",
                         line), line
    assert re.search(r"^[\d.]+ [kM] records of 100 B", block)


def test_a_bound_a_client_beats_is_refused():
    """A row called a limit, a ceiling or a floor is refused when a client
    beats it by more than the spread (interquartile range) of its runs; a
    reference may be beaten, and a bound within its spread is kept."""
    runs = [100.0, 101.0, 102.0, 103.0, 104.0]  # median 102, spread 2
    with pytest.raises(report_format.ReferenceBeaten, match="'C wire limit'.*pystream"):
        report_format.guard_reference("C wire limit", runs, {"pystream": 104.5})
    report_format.guard_reference("C wire limit", runs, {"pystream": 103.9})
    report_format.guard_reference("C reference reader", runs, {"pystream": 200.0})
    for name in ("the ceiling", "C floor", "Limits"):
        with pytest.raises(report_format.ReferenceBeaten):
            report_format.guard_reference(name, runs, {"x": 99.0}, lower_is_better=True)
    report_format.guard_reference("C floor", runs, {"x": 100.5}, lower_is_better=True)
    report_format.guard_reference("C floor", [2.0], {"x": 2.0}, lower_is_better=True)


def test_a_reference_beaten_under_the_name_of_a_bound_is_refused(monkeypatch):
    """Results where pystream beats the C client's rows (made so from the
    stored ones: twice the reference's best rate, half its best p99): under
    their old names (limit, floor) the report refuses them, under the names
    they have it renders them."""
    stored = {name: report_format.load(name) for name in ("consume", "publish", "latency")}

    def beaten(name):
        res = stored.get(name)
        if res is None:
            return None
        if name == "latency":
            rates = {rate: {**by, "pystream": {**by["pystream"], "p99_median_ms":
                                               by["wire"]["p99_min_ms"] / 2}}
                     for rate, by in res["rates"].items()}
            return {**res, "rates": rates}
        rows = {}
        for key, row in res["rows"].items():
            best = max(row["clients"]["wire"]["summary"]["msg_per_s_all"])
            c = row["clients"]["pystream"]
            rows[key] = {**row, "clients": {**row["clients"], "pystream": {
                **c, "summary": {**c["summary"], "msg_per_s_median": 2 * best}}}}
        return {**res, "rows": rows}

    monkeypatch.setattr(report, "load", beaten)
    monkeypatch.setattr(report_format, "load", beaten)
    for block in ("consume", "publish", "latency"):
        assert "no stored results" not in report.BLOCKS[block]()
    old = {"consume": "C wire limit", "publish": "C publish limit", "latency": "C floor"}
    for block, name in old.items():
        monkeypatch.setitem(report.REFERENCE_LABELS, block, name)
        with pytest.raises(report_format.ReferenceBeaten, match=repr(name)):
            report.BLOCKS[block]()
    monkeypatch.setitem(report.REFERENCE_LABELS, "how-fast", "C limit")
    with pytest.raises(report_format.ReferenceBeaten):
        report.how_fast()


def test_every_figure_names_its_cpu_class(monkeypatch):
    """Each block's machine line names the CPU class, results stored
    without the CPU's flags as unknown with their model; the headline
    renders one table per CPU class, each naming its class."""
    for name in ("consume", "publish", "latency", "decode", "otel", "spark", "spark-io",
                 "distance"):
        block = report.BLOCKS[name]()
        assert re.search(r"CPU class (unknown \(recorded as: [^)]+\)|\S)", block), name
    assert report_format.cpu_class({"cpu_model": "AMD EPYC"}) == \
        "CPU class unknown (recorded as: AMD EPYC)"
    stored = {name: report_format.load(name) for name in ("consume", "publish", "latency")}
    one = report.how_fast()
    # One table per CPU class the stored headline results came from (the
    # latest runs, those kept from other classes, the emulated classes).
    measured_on = {report_format.cpu_class(res["machine"])
                   for name in stored for res in report_format.stored(name)}
    assert one.count("| msg/s, or p99 latency; ") == len(measured_on)
    classes = {"consume": "x86-64 AVX-512+VPCLMUL", "publish": "x86-64 AVX2+PCLMUL",
               "latency": None}  # None: stored before the flags were recorded

    def load(name):
        res = stored.get(name)
        if res is None:
            return res
        machine = {k: v for k, v in res["machine"].items() if k != "cpu_class"}
        if classes.get(name):
            machine["cpu_class"] = classes[name]
        return {**res, "machine": machine}

    monkeypatch.setattr(report, "load", load)
    monkeypatch.setattr(report_format, "load", load)
    two = report.how_fast()
    heads = [x for x in two.splitlines() if x.startswith("| msg/s, or p99 latency; ")]
    assert [h.split(" | ")[0] for h in heads] == [
        "| msg/s, or p99 latency; x86-64 AVX-512+VPCLMUL",
        "| msg/s, or p99 latency; x86-64 AVX2+PCLMUL",
        "| msg/s, or p99 latency; CPU class unknown (recorded as: "
        f"{stored['latency']['machine']['cpu_model']})"]
    consume_table = two.split("\n\n")[0]
    assert "consume" in consume_table and "publish" not in consume_table


def test_the_machine_block_records_the_cpu_and_the_crc_path():
    """What tools/results.py records of the CPU: the flags that choose a
    code path, the class named from them, and the extension's account of
    its CRC-32 code."""
    m = results.machine(None)
    assert set(m["cpu_flags"]) <= set(results.PATH_FLAGS)
    assert m["cpu_class"] == results.cpu_class(platform.machine(), m["cpu_flags"])
    assert m["code_paths"]["crc"].startswith(("ISA-L ", "pystream fold256"))
    assert m["code_paths"]["crc_split_bytes"] > 0
    assert results.cpu_class("x86_64", ["pclmulqdq", "vpclmulqdq", "avx2", "avx512f",
                                        "avx512bw", "avx512vl"]) == "x86-64 AVX-512+VPCLMUL"
    assert results.cpu_class("x86_64", ["pclmulqdq", "vpclmulqdq", "avx2"]) == \
        "x86-64 AVX2+VPCLMUL"
    assert results.cpu_class("x86_64", ["pclmulqdq", "avx2"]) == "x86-64 AVX2+PCLMUL"
    assert results.cpu_class("aarch64", ["pmull", "crc32"]) == "aarch64 PMULL"


def test_every_import_of_a_benchmark_module_names_the_bench_package():
    """The children of a benchmark run ``python -m bench.<name>``: a bare
    ``from bench_consume import ...`` (in a function, so only a child
    runs it) fails there, and the run is recorded as failed."""
    import ast
    own = {p.stem for p in (ROOT / "bench").glob("*.py")}
    bare = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            bare += [f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                     for n in names if n.split(".")[0] in own]
    assert not bare


def test_lower_is_met_only_when_the_runs_show_it():
    """A peer's p99 "below" is judged from the runs (Mann-Whitney U), not
    from medians that the runs' spread can swap: a tie or a small gap
    inside the spread is "not shown", never "met"."""
    apart_low, apart_high = [2.0, 2.1, 2.2, 2.3, 2.4], [3.0, 3.1, 3.2, 3.3, 3.4]
    # the exact one-sided p of five against five wholly apart is 1/252
    assert 1 / 252 < report_format.lower_p(apart_low, apart_high) < 0.01
    assert report_format.lower_verdict(apart_low, apart_high) is True
    assert report_format.lower_verdict(apart_high, apart_low) is False
    spread = [1.98, 2.85, 2.12, 2.54, 2.41, 2.60, 2.30, 2.70, 2.20, 2.75]
    assert report_format.lower_verdict(spread, spread) is False  # a tie: not lower
    slightly = [x - 0.01 for x in spread]
    assert report_format.lower_verdict(slightly, spread) == "not shown"
    assert report_format.verdict_of("not shown").startswith("**not shown**")


def test_a_stored_verdict_of_met_is_judged_again(monkeypatch):
    """Results stored with a verdict by a laxer rule render by today's."""
    spread = [1.98, 2.85, 2.12, 2.54, 2.41, 2.60, 2.30, 2.70, 2.20, 2.75]

    def client(label, p99s):
        return {"label": label, "p99_median_ms": sorted(p99s)[len(p99s) // 2],
                "runs": [{"p99_ms": x} for x in p99s]}
    fake = {"rates": {"1000": {"wire": client("C", spread), "pystream": client("pystream", spread),
                               "rbfly": client("rbfly 0.10.0", spread)}},
            "targets": [{"rate": 1000, "against": "rbfly", "pystream_p99_ms": 2.54,
                         "other_p99_ms": 2.54, "met": True}]}
    monkeypatch.setattr(report, "load", lambda name: fake if name == "latency" else None)
    monkeypatch.setattr(report_format, "load", lambda name: fake if name == "latency" else None)
    text = report.targets_block()
    assert "rbfly 0.10.0's 2.54 ms (target: lower): **not met**" in text


def test_runs_read_together_are_judged_run_by_run():
    """With ``--together`` both clients read the same messages in each
    run: a gap smaller than the spread across runs is shown when every run
    has pystream lower, and a loss in most runs is a loss."""
    from bench.bench_latency import check_targets
    assert report_format.paired_lower_p([1.0] * 10, [1.1] * 10) == 1 / 1024
    base = [1.98, 2.85, 2.12, 2.54, 2.41, 2.60, 2.30, 2.70, 2.20, 2.75]

    def runs(p99s, names=("pystream", "rbfly")):
        return {"label": "x", "p99_median_ms": sorted(p99s)[len(p99s) // 2],
                "runs": [{"p99_ms": x, "together": list(names)} for x in p99s]}
    lower = [x - 0.01 for x in base]
    rates = {"1000": {"pystream": runs(lower), "rbfly": runs(base)}}
    assert [t["met"] for t in check_targets(rates)] == [True]
    rates = {"1000": {"pystream": runs(base), "rbfly": runs(lower)}}
    assert [t["met"] for t in check_targets(rates)] == [False]
    # the same figures, runs taken in turn: within the spread
    apart = {n: {**c, "runs": [{"p99_ms": r["p99_ms"]} for r in c["runs"]]}
             for n, c in {"pystream": runs(lower), "rbfly": runs(base)}.items()}
    assert [t["met"] for t in check_targets({"1000": apart})] == ["not shown"]


def test_each_emulated_class_is_judged_by_its_share_and_its_cpu(monkeypatch):
    """The targets of CPUs without VPCLMULQDQ: 85 % of the C reference
    reader, at most 2.5x its CPU per record, each row judged."""
    def row(wire: float, mine: float, cpu_wire: float, cpu_mine: float) -> dict:
        def client(x: float, cpu: float) -> dict:
            return {"summary": {"msg_per_s_median": x, "cpu_s_per_m_median": cpu},
                    "runs": [{"messages": x, "seconds": 1.0}]}
        return {"messages": 1_000_000, "body_size": 1024,
                "clients": {"wire": client(wire, cpu_wire), "pystream": client(mine, cpu_mine)}}

    stored = {"machine": {"cpu_class": "x86-64 AVX2+PCLMUL"},
              "rows": {"100b": row(10.0, 9.0, 0.02, 0.06), "1k": row(2.0, 1.6, 0.2, 0.3)}}
    real = report.load
    monkeypatch.setattr(report, "load", lambda name: stored if name == "consume-pclmul"
                        else real(name))
    # The stored results of other emulated classes have lines of their own.
    lines = [x for x in report.targets_block().splitlines() if "AVX2+PCLMUL:" in x]
    assert len(lines) == 2
    assert "at 90 %" in lines[0] and "target 85 %): met" in lines[0]
    assert "3.00x the C reader's (target at most 2.5x): **not met**" in lines[0]
    assert "at 80 %" in lines[1] and "target 85 %): **not met**" in lines[1]
    assert "1.50x the C reader's (target at most 2.5x): met" in lines[1]


def test_a_run_on_another_cpu_class_keeps_the_results_it_replaces(tmp_path):
    """Results stored from one CPU class are not lost to a run on another
    (sessions get machines of different classes): they move to their
    class's file, which the next run of that class replaces again."""
    import json
    path = tmp_path / "latency.json"
    avx2, avx512 = "x86-64 AVX2+VPCLMUL", "x86-64 AVX-512+VPCLMUL"
    results.write_results(str(path), {"cpu_class": avx2}, {"run": 1})
    results.write_results(str(path), {"cpu_class": avx512}, {"run": 2})
    kept = tmp_path / "latency.x86-64-avx2-vpclmul.json"
    assert results.class_path(path, avx2) == kept
    assert json.loads(kept.read_text())["run"] == 1
    assert json.loads(path.read_text())["run"] == 2
    results.write_results(str(path), {"cpu_class": avx512}, {"run": 3})
    assert json.loads(kept.read_text())["run"] == 1  # same class: replaced in place
    results.write_results(str(path), {"cpu_class": avx2}, {"run": 4})
    assert json.loads(path.read_text())["run"] == 4
    assert not kept.exists()  # superseded by the newer run of its class
    other = tmp_path / "latency.x86-64-avx-512-vpclmul.json"
    assert json.loads(other.read_text())["run"] == 3


def test_latency_of_each_cpu_class_has_its_own_section(monkeypatch, tmp_path):
    """With latency results of two classes stored, the latency block has a
    section per class, each headed by it, and the targets name the class."""
    import json
    real = report_format.load("latency")
    assert real is not None
    other = {**real, "machine": {**real["machine"], "cpu_class": "x86-64 AVX2+PCLMUL"}}
    (tmp_path / "latency.json").write_text(json.dumps(real))
    results.write_results(str(tmp_path / "latency.x86-64-avx2-pclmul.json"),
                          other["machine"], {k: v for k, v in other.items() if k != "machine"})
    monkeypatch.setattr(report_format, "RESULTS", tmp_path)
    block = report.BLOCKS["latency"]()
    heads = [x for x in block.splitlines() if x.startswith("CPU class ")]
    assert heads == [f"CPU class {real['machine']['cpu_class']}:",
                     "CPU class x86-64 AVX2+PCLMUL:"]
    targets = [x for x in report.targets_block().splitlines() if x.startswith("- latency")]
    assert targets and all("x86-64" in x for x in targets)
    assert sum("AVX2+PCLMUL" in x for x in targets) == len(targets) // 2


def test_garbage_collections_of_each_consumer_are_rendered():
    """A latency run that counted each Python consumer's collections shows
    them per run beside the longest pause; one stored before says nothing
    of them rather than zero."""
    import copy

    from bench.report_latency import latency_section
    path = report_format.RESULTS / "latency.x86-64-avx-512-vpclmul.json"
    counted = json.loads(path.read_text())
    text = latency_section(counted, named=False)
    table = text.split("Cyclic garbage collections", 1)[1].split("Targets", 1)[0]
    for run_counts in (r["gc_collections"] for r in counted["rates"]["1000"]["pystream"]["runs"]):
        assert str(run_counts) in table
    assert "| 1 k msg/s | **pystream** |" in table
    assert "C reference" not in table  # a C process has no collector
    before = copy.deepcopy(counted)
    for by in before["rates"].values():
        for c in by.values():
            for run in c.get("runs", []):
                for key in ("gc_collections", "gc_pause_ms", "gc_pause_max_ms"):
                    run.pop(key, None)
    assert "Cyclic garbage collections" not in latency_section(before, named=False)
