"""A source build finds its optional libraries (ISA-L, lz4, zstd, snappy):
without ISA-L chunk CRCs are checked by zlib, without a codec's library a
sub-batch in that codec is a typed error when it comes (setup.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pystream

from .conftest import BUILT_WITHOUT

ROOT = Path(__file__).resolve().parent.parent
EVERY_CODEC = ("none", "gzip", "snappy", "lz4", "zstd")
# The variant keeps snappy, so that its CRC-32C (a table without ISA-L) runs.
WITHOUT = "isal,lz4,zstd"
# The broker-free tests of the C core, and what a variant changes.
CORE_TESTS = ("tests/test_core_amqp.py", "tests/test_core_decode.py",
              "tests/test_core_encode.py", "tests/test_core_errors.py",
              "tests/test_core_frame.py", "tests/build_variant_checks.py")


@pytest.mark.skipif(bool(BUILT_WITHOUT), reason="a run against a variant")
def test_this_build_has_everything():
    """The builds of make build and make wheel require every library
    (PYSTREAM_DEV, PYSTREAM_REQUIRE_ALL): this one lacks none."""
    info = pystream.build_info()
    assert info.codecs == EVERY_CODEC
    assert info.crc.split("+")[0] == "isa-l"
    assert str(info).startswith(f"pystream {pystream.__version__} (CRC-32: isa-l")


def _build(tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp / name)
    for name in ("csrc", "pystream", "tests"):
        shutil.copytree(ROOT / name, tmp / name, ignore=shutil.ignore_patterns(
            "*.so", "_core.c", "__pycache__", "output"))
    return subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_build_without_isal_lz4_and_zstd_passes_the_core_tests(tmp_path):
    """The C core's tests pass against a build made without ISA-L, lz4 and
    zstd (-Werror, as make build), those that need lz4 or zstd skipped by
    name, and build_variant_checks.py shows what differs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSTREAM_DEV="1", PYSTREAM_WITHOUT=WITHOUT)
    built = _build(tmp_path, env)
    assert built.returncode == 0, built.stdout + built.stderr
    core = next((tmp_path / "pystream").glob("_core*.so"))
    linked = subprocess.run(["ldd", str(core)], capture_output=True, text=True).stdout
    assert "libsnappy" in linked and "libz." in linked, linked
    assert not any(lib in linked for lib in ("libisal", "liblz4", "libzstd")), linked

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSTREAM_TEST_WITHOUT"] = WITHOUT
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-m", "not broker and not slow", "-rs", *CORE_TESTS],
                         cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    found = subprocess.run([sys.executable, "-c", "import pystream; print(pystream.__file__, "
                            "pystream.build_info())"], cwd=tmp_path, env=env,
                           capture_output=True, text=True).stdout
    assert found.startswith(str(tmp_path)), found
    assert "CRC-32: zlib" in found and "codecs: none gzip snappy)" in found, found
    summary = run.stdout.strip().splitlines()[-1]
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 150, summary
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("which this build lacks" in line or "variant" in line
                         for line in skips), skips
