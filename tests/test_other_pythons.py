"""The stable-ABI wheel in CPythons other than this machine's 3.11: each
in a fresh venv, installed from make wheel's wheels, runs the C core's
broker-free tests and a round trip through the modern broker. 3.13 to
3.15 come from Debian roots without the libraries' development packages;
no Debian suite here has 3.12, so it is pyenv's on this machine (its
libraries present: only the interpreter differs)."""

from __future__ import annotations

import functools
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tools.sources import copy_tests

from . import brokers
from .test_packaging import (  # noqa: F401 (dist: the fixture)
    BUILD_CACHE,
    CORE,
    DEV_PACKAGES,
    DIST_NAME,
    ENGINE_TESTS,
    OTHER_ROOT,
    SMOKE_TEST,
    _in_root,
    _project,
    _run,
    debian_root,
    dist,
)

ROUND_TRIP = """
import sys, pystream
uri, stream = sys.argv[1:]
bodies = [b"wheel %d" % i * (i % 7 + 1) for i in range(5000)]
with pystream.connect(uri) as client:
    with client.producer(stream, compression="zstd") as producer:
        producer.send_batch(bodies[:2500]).result(timeout=30)
    with client.producer(stream) as producer:
        producer.send_batch(bodies[2500:]).result(timeout=30)
    with client.consumer(stream, offset="first") as consumer:
        table = consumer.read(len(bodies), timeout=30)
got = table.column("body").cast("binary").to_pylist()
assert got == bodies, (len(got), len(bodies))
assert table.column("offset").to_pylist() == list(range(len(bodies)))
print("round trip", len(got), sys.version_info[:2])
"""


# (Debian root or None for this machine, the interpreter)
FORKY_PYTHONS_ROOT = BUILD_CACHE / "forky-pythons-root"
OTHER_PYTHONS: dict[str, tuple[Path | None, str]] = {
    "3.12": (None, str(Path.home() / ".pyenv" / "versions" / "3.12.1" / "bin" / "python3.12")),
    "3.13": (OTHER_ROOT, "python3"),
    "3.14": (FORKY_PYTHONS_ROOT, "python3.14"),
    "3.15": (FORKY_PYTHONS_ROOT, "python3.15")}


def _runner(root: Path | None, work: Path) -> Callable[..., str]:
    """Runs a command chrooted in ``root`` with ``work`` bound at /work, or
    (``root`` None) on this machine with /work/ in its arguments standing
    for ``work``."""
    if root is not None:
        return functools.partial(_in_root, root, work)

    def run(*cmd: str, timeout: float = 600) -> str:
        return _run(*(str(c).replace("/work/", f"{work}/") for c in cmd),
                    cwd=work, timeout=timeout)
    return run


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("version", sorted(OTHER_PYTHONS))
def test_abi3_wheel_in_another_python(dist, tmp_path, modern_stream,  # noqa: F811
                                      version):
    """Another CPython, in a Debian root without the libraries' development
    packages (3.12: pyenv's on this machine, beside them): pip installs the
    package into a fresh venv there from make wheel's wheels and wheels of
    numpy, pyarrow, pytest and hypothesis fetched here for that Python. It
    picks the stable-ABI wheel, which decodes the golden frames, passes the
    C core's broker-free tests and round-trips 5000 records (zstd
    sub-batches included) through the modern broker."""
    root, python = OTHER_PYTHONS[version]
    if root == FORKY_PYTHONS_ROOT:
        debian_root("forky", root, "python3.14", "python3.14-venv", "python3.15",
                    "python3.15-venv")
    if root is None and not Path(python).exists():
        pytest.skip(f"no CPython {version} on this machine (pyenv's)")
    run = _runner(root, tmp_path)
    found = run(python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").strip()
    assert found == version, found
    if root is not None:
        installed = run("sh", "-c", "dpkg-query -W -f='${Package} ${Status}\\n' || true")
        assert not any(line.split()[0] in DEV_PACKAGES and "ok installed" in line
                       for line in installed.splitlines()), installed
    # pip and the rest for that Python, fetched here (a root's python3 may
    # have no ensurepip: pip runs from its own wheel)
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
         "--python-version", version, "--platform", "manylinux_2_28_x86_64",
         "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
         "-d", wheels, "pip", *_project()["dependencies"], "pytest", "hypothesis",
         cwd=tmp_path, timeout=600)
    (pip,) = wheels.glob("pip-*.whl")
    shutil.copy(dist["wheel"], wheels)
    shutil.copy(dist["abi3"], wheels)
    shutil.copy(SMOKE_TEST, tmp_path / "test_decode.py")
    (tmp_path / "round_trip.py").write_text(ROUND_TRIP)
    run(python, "-m", "venv", "--without-pip", "/work/venv")
    run("/work/venv/bin/python", f"/work/wheels/{pip.name}/pip",
        "install", "-q", "--no-index", "--find-links", "/work/wheels", DIST_NAME,
        "pytest", "hypothesis")
    core = run("/work/venv/bin/python", "-c",
               "import pystream._core as c; print(c.__file__)").strip()
    venv = "/work/venv/" if root is not None else f"{tmp_path}/venv/"
    assert core.startswith(venv) and core.endswith(CORE["abi3"]), core
    out = run("/work/venv/bin/python", "/work/test_decode.py")
    assert "decodes golden frames" in out
    copy_tests(tmp_path / "checkout")
    out = run("sh", "-c",
              # a root's HOME is not ours: it would take itself for the only
              # suite running and remove every test stream at its end
              "cd /work/checkout && PYSTREAM_TEST_KEEP_LEFTOVERS=1 "
              "/work/venv/bin/python -P -m pytest -q "
              "-p no:cacheprovider --import-mode=append "
              "-m 'not broker and not slow' " + " ".join(ENGINE_TESTS), timeout=1200)
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed(, \d+ warnings?)? in .*", summary), out[-3000:]
    uri = (brokers.MODERN.uri() if root is None
           else brokers.MODERN.uri(host=brokers.MODERN.host))
    out = run("/work/venv/bin/python", "/work/round_trip.py", uri, modern_stream)
    assert f"round trip 5000 ({version.replace('.', ', ')})" in out, out
