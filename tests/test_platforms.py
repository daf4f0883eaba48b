"""The aarch64 wheel ``make wheel`` cross-compiles (scripts/build-wheel),
run under emulation: qemu-user (``qemu-aarch64-static -L ROOT``, no binfmt
registration) runs bookworm's arm64 Python 3.11 from the root build-wheel
unpacked, with the wheel and PyPI's aarch64 numpy and pyarrow installed
into a folder of its own. The C core's broker-free tests pass there, a
consumer there reads a stream of the modern broker (qemu-user shares this
machine's loopback) checking every record and chunk CRC, and the build
reports ISA-L's aarch64 CRC code. Real ARM hardware is not tested: qemu
emulates the instructions, not a CPU's timing or memory ordering.

``make platforms`` runs this file and stores the decode rate natively and
emulated (PYSTREAM_PLATFORM_RESULTS=bench/results/platforms.json).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest

from tools import results
from tools.sources import copy_tests

from .test_packaging import BUILD_CACHE, _clean_env, _project, _run, check_ldd, dist  # noqa: F401

pytestmark = pytest.mark.slow

# bookworm's arm64 Python 3.11, unpacked by scripts/build-wheel
ARM_ROOT = BUILD_CACHE / "bookworm-arm64-root"
# the arm64 sysroot the wheel is compiled against (glibc 2.31)
ARM_SYSROOT = BUILD_CACHE / "bullseye-arm64-root"
ARM_PYTHON = ARM_ROOT / "usr" / "bin" / "python3.11"
QEMU = "qemu-aarch64-static"
# the C core's tests that need no broker and no other client as an oracle
CORE_TESTS = ("test_core_decode.py", "test_core_encode.py", "test_core_errors.py",
              "test_core_frame.py")
RESULTS = os.environ.get("PYSTREAM_PLATFORM_RESULTS")


@pytest.fixture(scope="module")
def arm_site(dist, tmp_path_factory) -> Path:  # noqa: F811 (the fixture)
    """A folder with the aarch64 wheel, the package's dependencies and
    pytest installed for aarch64 CPython 3.11 (PyPI's wheels)."""
    site = tmp_path_factory.mktemp("arm-site")
    _run(sys.executable, "-m", "pip", "install", "-q", "--target", site,
         "--only-binary", ":all:", "--python-version", "3.11", "--implementation", "cp",
         "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64",
         "--platform", dist["aarch64"].name.removesuffix(".whl").split("-")[-1],
         dist["aarch64"], *_project()["dependencies"], "pytest", "pytest-timeout", "hypothesis",
         cwd=site, timeout=900)
    return site


def emulated(site: Path, *args: object, cwd: Path, also: Path | None = None,
             timeout: float = 900) -> str:
    """Run the aarch64 python3.11 with ``args`` under qemu-user, ``site``
    (and ``also`` after it) on its path and not the working folder (-P)."""
    env = _clean_env()
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (site, also) if p)
    env["OPENBLAS_NUM_THREADS"] = "1"
    return _run(QEMU, "-L", ARM_ROOT, ARM_PYTHON, "-P", *args, cwd=cwd, env=env,
                timeout=timeout)


INFO = """
import json, platform, pystream, pystream._core as core
print(json.dumps({"machine": platform.machine(), "file": pystream.__file__,
                  "core": core.__file__, "build_info": str(pystream.build_info()),
                  "crc": pystream.build_info().crc, "codecs": list(pystream.build_info().codecs),
                  "code_paths": dict(core._code_paths())}))
"""


def test_emulated_python_runs_the_aarch64_wheel(arm_site, tmp_path):
    """The emulated interpreter is aarch64, imports the wheel's extension
    (not this checkout's), has every codec and checks CRCs with ISA-L's
    aarch64 PMULL code, which the bundled libisal dispatches to when the
    (emulated) CPU reports PMULL."""
    info = json.loads(emulated(arm_site, "-c", INFO, cwd=tmp_path))
    print(info)
    assert info["machine"] == "aarch64"
    assert Path(info["core"]).is_relative_to(arm_site), info
    assert info["core"].endswith("_core.abi3.so"), info
    assert info["crc"] == "ISA-L crc32_gzip_refl PMULL folding", info
    assert info["code_paths"]["crc"] == info["crc"], info
    assert set(info["codecs"]) >= {"gzip", "snappy", "lz4", "zstd"}, info


def test_aarch64_wheel_links_on_glibc_2_31(dist, tmp_path):  # noqa: F811
    """bullseye arm64's dynamic loader (glibc 2.31), emulated, resolves the
    extension and its bundled libraries as ``ldd -r`` would: no symbol
    version missing, zlib linked in, only Python's symbols undefined."""
    wheel = tmp_path / "wheel"
    zipfile.ZipFile(dist["aarch64"]).extractall(wheel)
    env = {**_clean_env(), "QEMU_SET_ENV": "LD_TRACE_LOADED_OBJECTS=1,LD_WARN=yes,LD_BIND_NOW=yes"}
    done = subprocess.run([QEMU, "-L", str(ARM_SYSROOT),
                           str(ARM_SYSROOT / "lib" / "ld-linux-aarch64.so.1"),
                           str(wheel / "pystream" / "_core.abi3.so")],
                          env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "ld-2.31.so" in os.readlink(ARM_SYSROOT / "lib" / "ld-linux-aarch64.so.1")
    check_ldd(out, f"{wheel}/")


def test_core_tests_pass_emulated(arm_site, tmp_path):
    """The C core's broker-free tests, under qemu, against the installed
    aarch64 wheel (python -P and pytest's append import mode: the copy of
    the tests comes last on the path)."""
    work = copy_tests(tmp_path / "checkout")
    out = emulated(arm_site, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "--import-mode=append", "-m", "not broker and not slow",
                   *(f"tests/{name}" for name in CORE_TESTS), cwd=work, timeout=1800)
    print(out[-3000:])
    assert re.search(r"\d+ passed", out) and "failed" not in out, out


CONSUME = """
import sys, zlib, pystream
uri, stream = sys.argv[1:]
bodies = [b"aarch64 %d " % i * (i % 11 + 1) for i in range(6000)]
codecs = [None, "gzip", "snappy", "lz4", "zstd"]
with pystream.connect(uri) as client:
    for n, codec in enumerate(codecs):
        with client.producer(stream, **({"compression": codec} if codec else {})) as producer:
            producer.send_batch(bodies[n * 1200:(n + 1) * 1200]).result(timeout=60)
    with client.consumer(stream, offset="first") as consumer:
        table = consumer.read(len(bodies), timeout=120)
got = table.column("body").cast("binary").to_pylist()
assert len(got) == len(bodies), (len(got), len(bodies))
bad = [i for i, (a, b) in enumerate(zip(got, bodies)) if a != b]
assert not bad, bad[:10]
assert table.column("offset").to_pylist() == list(range(len(bodies)))
print("consumed", len(got), "crc", hex(zlib.crc32(b"".join(got))))
"""


@pytest.mark.broker
def test_emulated_consumer_reads_the_modern_broker(arm_site, tmp_path, modern_stream):
    """Under qemu, a producer writes 6000 records (plain and in sub-batches
    of each codec) to the modern broker and a consumer reads them back:
    every body and offset as sent, every chunk's CRC checked (the default)
    by the aarch64 code."""
    (tmp_path / "consume.py").write_text(CONSUME)
    uri = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
    out = emulated(arm_site, tmp_path / "consume.py", uri, modern_stream, cwd=tmp_path)
    bodies = [b"aarch64 %d " % i * (i % 11 + 1) for i in range(6000)]
    assert f"consumed 6000 crc {hex(zlib.crc32(b''.join(bodies)))}" in out, out


RATE = """
import json, statistics, time
from bench.bench_decode import make_frames
from pystream._core import decode
frames, records = make_frames(100)
rates = []
for _ in range(3):
    start = time.perf_counter()
    batch = decode(frames)
    rates.append(records / (time.perf_counter() - start))
assert batch.num_rows == records
print(json.dumps({"records": records, "frame_bytes": len(frames),
                  "msg_per_s": rates, "median_msg_per_s": statistics.median(rates)}))
"""


def test_decode_rate_native_and_emulated(dist, arm_site, tmp_path):  # noqa: F811
    """The same in-memory frames (bench/bench_decode.py's: 64 MiB of
    100-byte AMQP messages, CRC checked, body="view") decoded by the x86-64
    and the aarch64 stable-ABI wheels, the latter under qemu: median of 3,
    msg/s. No target: emulation is slow; stored with
    PYSTREAM_PLATFORM_RESULTS."""
    info = results.machine(None)  # the load before the runs
    work = copy_tests(tmp_path / "checkout")
    (work / "rate.py").write_text(RATE)
    native_site = tmp_path / "native-site"
    _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
         native_site, dist["abi3"], cwd=tmp_path)
    env = _clean_env()
    env["PYTHONPATH"] = f"{native_site}{os.pathsep}{work}"
    native = json.loads(_run(sys.executable, "-P", "rate.py", cwd=work, env=env))
    native_info = json.loads(_run(sys.executable, "-P", "-c", INFO, cwd=work, env=env))
    assert Path(native_info["core"]).is_relative_to(native_site), native_info
    arm = json.loads(emulated(arm_site, "rate.py", cwd=work, also=work))
    arm_info = json.loads(emulated(arm_site, "-c", INFO, cwd=work))
    print(f"native {native['median_msg_per_s']:,.0f} msg/s, "
          f"qemu-aarch64 {arm['median_msg_per_s']:,.0f} msg/s")
    assert native["records"] == arm["records"]
    qemu = subprocess.run([QEMU, "--version"], capture_output=True, text=True,
                          check=True).stdout.splitlines()[0]
    results.write_results(RESULTS, info, {
        "what": "decode of the same in-memory Deliver frames (bench_decode's "
                "64 x 1 MiB chunks of 100-byte AMQP messages, CRC checked, "
                "body='view') by make wheel's cp311-abi3 wheels, natively and "
                "under qemu-user; median of 3 rounds",
        "native": {**native, "wheel": dist["abi3"].name, "build_info": native_info["build_info"],
                   "code_paths": native_info["code_paths"]},
        "qemu_aarch64": {**arm, "wheel": dist["aarch64"].name, "emulator": qemu,
                         "build_info": arm_info["build_info"],
                         "code_paths": arm_info["code_paths"]},
        "emulated_over_native": arm["median_msg_per_s"] / native["median_msg_per_s"],
    })
