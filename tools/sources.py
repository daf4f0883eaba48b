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


def source_tree(dest: Path, *folders: str) -> Path:
    """A copy at ``dest`` of what building the extension in place needs,
    and of ``folders``, without anything built."""
    dest.mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("*.so", "__pycache__", "_core.c", "output")
    for name in ("csrc", "pystream", *folders):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    return dest


def build_in_place(tree: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``setup.py build_ext --inplace`` in ``tree`` with ``env`` added to
    this environment (PYTHONPATH left out)."""
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tree, env={**full, **env}, capture_output=True, text=True,
                          timeout=900)
