"""What every stored result records besides its figures (the ``machine``
block): the date, the git commit, the installed versions of every package
involved, the broker's version, the CPU and the load average; and the
writer of the result files. The benchmarks (bench/harness.py) and the
fault and partition runs of tests/ store their results through it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rbfly", "rstream", "pyarrow", "numpy", "pyspark", "duckdb",
            "opentelemetry-api", "opentelemetry-sdk")


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def admin(uri: str, action: Callable, attempts: int = 3):
    """``action(client)`` on a fresh connection, tried again when the
    connection is lost (other users of a shared broker close connections)."""
    import pystream
    from pystream.errors import ConnectionLost
    for attempt in range(attempts):
        try:
            with pystream.connect(uri) as client:
                return action(client)
        except ConnectionLost:
            if attempt == attempts - 1:
                raise
            time.sleep(1)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    # The checkout measured is imported in place: no installed metadata
    # names it (the distribution is pystream-rabbitmq).
    import pystream
    out["pystream"] = pystream.__version__
    return out


def git_commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,
                              text=True).stdout.strip()
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "pystream",
                "csrc", "bench/wire", "setup.py")
    return commit + ("-dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# The CPU flags that choose a code path (the CRC-32's: csrc/crc.c and
# ISA-L's dispatcher), as /proc/cpuinfo names them: "flags" on x86-64,
# "Features" on aarch64.
PATH_FLAGS = ("pclmulqdq", "vpclmulqdq", "avx2", "avx512f", "avx512bw", "avx512vl",
              "avx512dq", "avx512cd", "pmull", "crc32")


def cpu_flags() -> list[str]:
    """Those of ``PATH_FLAGS`` the first CPU of /proc/cpuinfo has."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have = set(value.split())
            return [f for f in PATH_FLAGS if f in have]
    return []


def cpu_class(machine: str, flags: list[str]) -> str:
    """A short name for the CPUs that run the same code paths, such as
    "x86-64 AVX-512+VPCLMUL": figures are comparable within a class."""
    have = set(flags)
    if machine in ("x86_64", "AMD64"):
        if {"avx512f", "avx512bw", "avx512vl", "vpclmulqdq"} <= have:
            return "x86-64 AVX-512+VPCLMUL"
        if {"avx2", "vpclmulqdq"} <= have:
            return "x86-64 AVX2+VPCLMUL"
        if {"avx2", "pclmulqdq"} <= have:
            return "x86-64 AVX2+PCLMUL"
        return "x86-64 PCLMUL" if "pclmulqdq" in have else "x86-64 no CLMUL"
    if machine in ("aarch64", "arm64"):
        return "aarch64 PMULL" if "pmull" in have else "aarch64 no PMULL"
    return machine or "?"


def code_paths() -> dict[str, object]:
    """The extension's own account of the paths it runs on this CPU
    (pystream._core._code_paths: the CRC-32 code, the two-thread split)."""
    from pystream._core import _code_paths
    return dict(_code_paths())


def broker_version(uri: str, wait: float = 180) -> str:
    """The broker's version; waits up to ``wait`` seconds for a broker that
    is restarting (the test brokers are shared)."""
    from pystream.errors import StreamError
    deadline = time.monotonic() + wait
    while True:
        try:
            return admin(uri, lambda c: c.server_properties.get("version", "?"))
        except StreamError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def machine(uri: str | None) -> dict:
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "versions": versions(),
        "python": platform.python_version(),
        "broker": broker_version(uri) if uri else None,
        "broker_address": uri.split("@")[-1] if uri else None,
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_class": cpu_class(platform.machine(), cpu_flags()),
        "code_paths": code_paths(),
        "cores": os.cpu_count(),
        "loadavg_start": loadavg(),
    }


def class_path(path: Path, cls: str) -> Path:
    """Where the results of ``path`` measured on CPU class ``cls`` are kept
    once a run on another class took ``path``: ``latency.json`` of
    "x86-64 AVX2+VPCLMUL" goes to ``latency.x86-64-avx2-vpclmul.json``."""
    slug = re.sub(r"[^a-z0-9]+", "-", cls.lower()).strip("-")
    return path.with_name(f"{path.stem}.{slug}{path.suffix}")


def write_results(path: str | None, info: dict, body: dict) -> None:
    """Store a run's results at ``path``. Those it replaces stay, at
    ``class_path``, when they came from another CPU class (the project's
    machines are not all of one): each class keeps its latest."""
    if not path:
        return
    info = {**info, "loadavg_end": loadavg()}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    cls = info.get("cpu_class")
    if out.exists() and cls:
        before = json.loads(out.read_text()).get("machine", {}).get("cpu_class")
        if before and before != cls:
            out.replace(class_path(out, before))
        class_path(out, cls).unlink(missing_ok=True)  # superseded by this run
    out.write_text(json.dumps({"machine": info, **body}, indent=1) + "\n")
    print(f"results written to {path}", flush=True)
