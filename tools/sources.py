"""Builds of the extension from a copy of the checkout: the tests build
variants (tests/test_packaging.py, tests/test_build_options.py), and
bench/bench_crc.py times one made without ISA-L."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


SKIP = shutil.ignore_patterns("*.so", "__pycache__", "_core.c", "output", "results",
                              "relay", "wire")


def source_tree(dest: Path, *, with_tests: bool = False) -> Path:
    """A copy at ``dest`` of what building the extension in place needs
    (and, ``with_tests``, of what copy_tests copies), nothing built."""
    dest.mkdir(parents=True)
    for name in ("setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dest / name)
    for name in ("csrc", "pystream"):
        shutil.copytree(ROOT / name, dest / name, ignore=SKIP)
    return copy_tests(dest) if with_tests else _settings(dest)


def copy_tests(dest: Path) -> Path:
    """A copy at ``dest`` of the tests without the package: tests/, what they
    share with bench (tools/, bench/'s Python), the broker table and
    pytest's settings. ``python -P -m pytest --import-mode=append`` run from
    ``dest`` tests the pystream installed where that Python finds it."""
    _settings(dest)
    (dest / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "brokers.tsv", dest / "scripts")
    for name in ("tests", "tools", "bench"):
        shutil.copytree(ROOT / name, dest / name, ignore=SKIP)
    return dest


def _settings(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "pyproject.toml", dest)
    return dest


def build_in_place(tree: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``setup.py build_ext --inplace`` in ``tree`` with ``env`` added to
    this environment (PYTHONPATH left out)."""
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tree, env={**full, **env}, capture_output=True, text=True,
                          timeout=900)
