"""``pystream bench``: the source checkout's benchmarks."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

import pystream

from .common import CliError

#: ``pystream bench`` runs the scripts of the source checkout (a wheel has none).
BENCH_DIR = pathlib.Path(pystream.__file__).resolve().parent.parent / "bench"
BENCH_SCRIPTS = {"latency": "bench_latency.py", "throughput": "bench_consume.py"}

def cmd_bench(args: argparse.Namespace) -> int:
    script = BENCH_DIR / BENCH_SCRIPTS[args.kind]
    if not script.is_file():
        raise CliError(f"{script} not found: the benchmarks come with the "
                       "source checkout of pystream, not with an installed "
                       "package", status=2)
    return subprocess.run([sys.executable, str(script), *args.args]).returncode
