"""The README's benchmark figures are what bench/report.py renders from the
stored results (bench/results/*.json): none is typed by hand."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_report():
    spec = importlib.util.spec_from_file_location("bench_report",
                                                  ROOT / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_figures_are_rendered_from_the_stored_results():
    report = load_report()
    text = (ROOT / "README.md").read_text()
    blocks = [m.group("name") for m in report.MARKER.finditer(text)]
    assert {"how-fast", "targets", "consume", "publish", "latency",
            "decode", "spark", "spark-io"} <= set(blocks)
    rendered = report.render(text)
    for old, new in zip(report.MARKER.finditer(text), report.MARKER.finditer(rendered)):
        assert old.group(0) == new.group(0), (
            f"README block bench:{old.group('name')} differs from what "
            "bench/report.py renders from bench/results: run bench/report.py")
    assert rendered == text


def test_every_rendered_block_has_figures_and_the_machine():
    report = load_report()
    for name in ("consume", "publish", "latency", "decode", "spark", "spark-io"):
        block = report.BLOCKS[name]()
        assert "no stored results" not in block, name
        assert re.search(r"commit `[0-9a-f]{10}`", block), name
        assert "load average" in block, name


def test_spark_io_block_states_each_target_with_its_ratio_and_count():
    report = load_report()
    block = report.BLOCKS["spark-io"]()
    for _, _, target, name, what in report.SPARK_IO_RATIOS:
        line = next(x for x in block.splitlines()
                    if x.startswith(f"- {name} at {report.pct(target)} {what} or more: "))
        assert re.search(r": (met|\*\*not met\*\*) \(\d+ %, over [\d.]+ [kM] records\)$",
                         line), line
    assert re.search(r"^[\d.]+ [kM] records of 100 B", block)
