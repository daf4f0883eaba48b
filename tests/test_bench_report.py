"""The benchmark figures of README.md and of the documentation pages
(docs/*.md) are what bench/report.py renders from the stored results
(bench/results/*.json): none is typed by hand."""

from __future__ import annotations

import re
from pathlib import Path

from bench import report, report_otel

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
