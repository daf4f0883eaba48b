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
            "decode"} <= set(blocks)
    rendered = report.render(text)
    for old, new in zip(report.MARKER.finditer(text), report.MARKER.finditer(rendered)):
        assert old.group(0) == new.group(0), (
            f"README block bench:{old.group('name')} differs from what "
            "bench/report.py renders from bench/results: run bench/report.py")
    assert rendered == text


def test_every_rendered_block_has_figures_and_the_machine():
    report = load_report()
    for name in ("consume", "publish", "latency", "decode"):
        block = report.BLOCKS[name]()
        assert "no stored results" not in block, name
        assert re.search(r"commit `[0-9a-f]{10}`", block), name
        assert "load average" in block, name
