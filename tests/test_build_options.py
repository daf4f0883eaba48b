"""A source build finds its optional libraries (ISA-L, lz4, zstd, snappy):
without ISA-L chunk CRCs are checked by zlib, without a codec's library a
sub-batch in that codec is a typed error when it comes (setup.py)."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pystream
from tools.sources import build_in_place, copy_tests, source_tree

from .conftest import BUILT_WITHOUT
from .test_packaging import (
    BUILD_CACHE,
    DEV_PACKAGES,
    ENGINE_TESTS,
    _in_root,
    _run,
    debian_root,
)

ROOT = Path(__file__).resolve().parent.parent
EVERY_CODEC = ("none", "gzip", "snappy", "lz4", "zstd")
# The variant keeps snappy, so that its CRC-32C (a table without ISA-L) runs.
WITHOUT = "isal,lz4,zstd"
# The broker-free tests of the C core, and what a variant changes.
CORE_TESTS = ("tests/test_core_amqp.py", *ENGINE_TESTS, "tests/build_variant_checks.py")


@pytest.mark.skipif(bool(BUILT_WITHOUT), reason="a run against a variant")
def test_this_build_has_everything():
    """The builds of make build and make wheel require every library
    (PYSTREAM_DEV, PYSTREAM_REQUIRE_ALL): this one lacks none."""
    info = pystream.build_info()
    assert info.codecs == EVERY_CODEC
    assert "ISA-L" in info.crc and "zlib" not in info.crc
    assert str(info).startswith(f"pystream {pystream.__version__} (CRC-32: ")


@pytest.mark.slow
def test_a_build_without_isal_lz4_and_zstd_passes_the_core_tests(tmp_path):
    """The C core's tests pass against a build made without ISA-L, lz4 and
    zstd (-Werror, as make build), those that need lz4 or zstd skipped by
    name, and build_variant_checks.py shows what differs."""
    tree = source_tree(tmp_path / "src", with_tests=True)
    built = build_in_place(tree, PYSTREAM_DEV="1", PYSTREAM_WITHOUT=WITHOUT)
    assert built.returncode == 0, built.stdout + built.stderr
    core = next((tree / "pystream").glob("_core*.so"))
    linked = subprocess.run(["ldd", str(core)], capture_output=True, text=True).stdout
    assert "libsnappy" in linked and "libz." in linked, linked
    assert not any(lib in linked for lib in ("libisal", "liblz4", "libzstd")), linked

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSTREAM_TEST_WITHOUT=WITHOUT, PYSTREAM_TEST_KEEP_LEFTOVERS="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-m", "not broker and not slow", "-rs", *CORE_TESTS],
                         cwd=tree, env=env, capture_output=True, text=True,
                         timeout=900)
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    found = subprocess.run([sys.executable, "-c", "import pystream; print(pystream.__file__, "
                            "pystream.build_info())"], cwd=tree, env=env,
                           capture_output=True, text=True).stdout
    assert found.startswith(str(tree)), found
    assert "zlib crc32" in found and "ISA-L" not in found, found
    assert "codecs: none gzip snappy)" in found, found
    summary = run.stdout.strip().splitlines()[-1]
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 150, summary
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("which this build lacks" in line or "variant" in line
                         for line in skips), skips


# --- the sdist where only a compiler, Python's headers and zlib are ----------

def _project_file() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


MINIMAL_ROOT = BUILD_CACHE / "trixie-sdist-root"
MINIMAL_PACKAGES = ("build-essential", "python3-dev", "zlib1g-dev")
MINIMAL_TESTS = (*ENGINE_TESTS, "tests/build_variant_checks.py")


@pytest.mark.slow
def test_the_sdist_builds_and_passes_in_a_root_with_only_a_compiler(tmp_path):
    """A Debian trixie root (its own Python) with build-essential,
    python3-dev and zlib1g-dev only: pip builds the sdist there, the build
    reports zlib's CRC and the codecs none and gzip, and the C core's
    broker-free tests pass against it (those needing another codec are
    skipped by name)."""
    debian_root("trixie", MINIMAL_ROOT, *MINIMAL_PACKAGES)
    installed = _in_root(MINIMAL_ROOT, tmp_path, "dpkg-query", "-W", "-f",
                         "${Package} ${Status}\\n")
    have = {line.split()[0] for line in installed.splitlines() if "ok installed" in line}
    assert not have & set(DEV_PACKAGES) - {"zlib1g-dev"}, sorted(have & set(DEV_PACKAGES))
    assert {"gcc", "python3-dev", "zlib1g-dev"} <= have
    version = _in_root(MINIMAL_ROOT, tmp_path, "python3", "-c",
                       "import sys; print('%d.%d' % sys.version_info[:2])").strip()

    _run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
         tmp_path / "sdist", ".", cwd=ROOT, timeout=300)
    (sdist,) = (tmp_path / "sdist").glob("*.tar.gz")
    # what the root's Python needs, fetched here for it (no ensurepip there)
    wheels = tmp_path / "wheels"
    build_requires = _project_file()["build-system"]["requires"]
    _run(sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
         "--python-version", version, "--platform", "manylinux_2_28_x86_64",
         "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
         "-d", wheels, "pip", *build_requires, *_project_file()["project"]["dependencies"],
         "pytest", "hypothesis", cwd=tmp_path, timeout=600)
    (pip,) = wheels.glob("pip-*.whl")
    pip_run = ("/work/venv/bin/python", f"/work/wheels/{pip.name}/pip", "install", "-q",
               "--no-index", "--find-links", "/work/wheels")
    _in_root(MINIMAL_ROOT, tmp_path, "python3", "-m", "venv", "--without-pip", "/work/venv")
    _in_root(MINIMAL_ROOT, tmp_path, *pip_run, *build_requires, "pytest", "hypothesis")
    _in_root(MINIMAL_ROOT, tmp_path, *pip_run, "--no-build-isolation",
             f"/work/sdist/{sdist.name}", timeout=1200)
    info = _in_root(MINIMAL_ROOT, tmp_path, "/work/venv/bin/python", "-c",
                    "import pystream; print(pystream.__file__); print(pystream.build_info())")
    assert info.startswith("/work/venv/"), info
    assert "zlib crc32" in info and "ISA-L" not in info, info
    assert "codecs: none gzip)" in info, info

    copy_tests(tmp_path / "checkout")
    out = _in_root(MINIMAL_ROOT, tmp_path, "sh", "-c",
                   "cd /work/checkout && PYSTREAM_TEST_WITHOUT=isal,lz4,zstd,snappy "
                   "PYSTREAM_TEST_KEEP_LEFTOVERS=1 "
                   "/work/venv/bin/python -P -m pytest -q -p no:cacheprovider "
                   "--import-mode=append -m 'not broker and not slow' -rs "
                   + " ".join(MINIMAL_TESTS), timeout=1200)
    print(out[-4000:])
    summary = out.strip().splitlines()[-1]
    assert " failed" not in summary and int(summary.split(" passed")[0].split()[-1]) >= 100, \
        summary
