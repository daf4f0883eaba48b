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
        "cores": os.cpu_count(),
        "loadavg_start": loadavg(),
    }


def write_results(path: str | None, info: dict, body: dict) -> None:
    if not path:
        return
    info = {**info, "loadavg_end": loadavg()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"machine": info, **body}, indent=1) + "\n")
    print(f"results written to {path}", flush=True)
