"""What a build without ISA-L costs: chunk CRCs checked by zlib's crc32.

    .venv/bin/python -m bench.bench_crc               # 7 rounds, medians
    .venv/bin/python -m bench.bench_crc --repeat 3 --json ''

What it measures
----------------
A source build that does not find ISA-L checks chunk CRCs with zlib's crc32
(setup.py). The extension is built a second time here, with
PYSTREAM_WITHOUT=isal, into ~/.cache/pystream/build/bench-noisal-COMMIT
(kept for the next run of the same commit). Each round decodes the frames
of bench_decode (64 chunks of about 1 MiB, records of 100 B and 1 KiB) five
times with ``body="view"`` in a child process of each build, with the CRC
checked and not: CPU seconds per million records, medians over the rounds.
The cost of zlib's CRC is the difference between the two builds with the
CRC checked. Also the CRC alone over buffers of several sizes, GB/s: this
build's and zlib.crc32, which is what the other build calls. No broker.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

from bench import harness
from pystream._core import crc32, crc32_implementation
from tools.results import ROOT, git_commit
from tools.sources import build_in_place, source_tree

BUILDS = ("isa-l", "zlib")
SIZES = (100, 1024)
CRC_SIZES = (4096, 262144, 1 << 20)
DECODES = 5     # per child run
CHILD = """
import json, sys, time
from bench.bench_decode import make_frames
from pystream._core import crc32_implementation, decode
size, crc, decodes = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
buf, records = make_frames(size)
decode(buf, crc=crc, body="view")
cpu0, t0 = time.process_time(), time.perf_counter()
for _ in range(decodes):
    assert decode(buf, crc=crc, body="view").num_rows == records
t1, cpu1 = time.perf_counter(), time.process_time()
print(json.dumps({"messages": records * decodes, "seconds": t1 - t0, "cpu": cpu1 - cpu0,
                  "crc_code": crc32_implementation()}))
"""


def noisal_build() -> Path:
    """The extension built without ISA-L, made once per commit."""
    cache = Path(os.environ.get("PYSTREAM_BUILD_CACHE")
                 or Path.home() / ".cache" / "pystream" / "build")
    tree = cache / f"bench-noisal-{git_commit()[:12]}"
    if not list((tree / "pystream").glob("_core*.so")):
        if tree.exists():
            subprocess.run(["rm", "-rf", str(tree)], check=True)
        print(f"building the extension without ISA-L into {tree}", flush=True)
        built = build_in_place(source_tree(tree), PYSTREAM_WITHOUT="isal")
        if built.returncode != 0:
            raise SystemExit(built.stdout + built.stderr)
    return tree


def crc_rates(repeat: int) -> dict:
    """GB/s of this build's crc32 and zlib's over buffers of CRC_SIZES."""
    out: dict = {}
    for size in CRC_SIZES:
        data = os.urandom(size)
        rounds = max(1, (64 << 20) // size)
        for name, fn in (("this build", crc32), ("zlib", zlib.crc32)):
            rates = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(rounds):
                    fn(data)
                rates.append(rounds * size / (time.perf_counter() - t0) / 1e9)
            out.setdefault(str(size), {})[name] = {
                "gb_per_s_median": statistics.median(rates), "gb_per_s_all": rates}
    return out


def main() -> None:
    ap = harness.parser(__doc__, clients=BUILDS, repeat=7, result="crc")
    args = ap.parse_args()
    info = harness.machine(None)
    harness.banner({**info, "broker": "none", "broker_address": "-"}, "crc")
    paths = {"isa-l": str(ROOT), "zlib": f"{noisal_build()}{os.pathsep}{ROOT}"}
    cases = [(size, build, crc) for size in SIZES for build in BUILDS for crc in (True, False)]

    def one(case) -> dict:
        size, build, crc = case
        env = {**os.environ, "PYTHONPATH": paths[build]}
        load = harness.loadavg()
        done = subprocess.run([sys.executable, "-P", "-c", CHILD, str(size), str(int(crc)),
                               str(DECODES)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1:]}
        return {**json.loads(done.stdout), "load": [load, harness.loadavg()]}

    runs = harness.interleave(args.repeat, cases, one, rotate=True,
                              label=lambda c: f"{c[0]} B {c[1]} crc={c[2]}")
    decode: dict = {}
    for i, (size, build, crc) in enumerate(cases):
        decode.setdefault(str(size), {}).setdefault(build, {})[
            "crc" if crc else "no crc"] = {
                "crc_code": runs[i][0].get("crc_code"),
                "summary": harness.summarize(runs[i], size), "runs": runs[i]}
    print(f"\n{'body':>6} {'build':>6} {'CPU-s/M crc':>12} {'no crc':>8} {'CRC cost':>9}")
    for size, by in decode.items():
        for build, v in by.items():
            on, off = (v[k]["summary"]["cpu_s_per_m_median"] for k in ("crc", "no crc"))
            v["crc_cpu_s_per_m"] = on - off
            print(f"{size:>6} {build:>6} {on:>12.4f} {off:>8.4f} {on - off:>9.4f}")
        by["zlib_extra_cpu_s_per_m"] = (by["zlib"]["crc"]["summary"]["cpu_s_per_m_median"]
                                        - by["isa-l"]["crc"]["summary"]["cpu_s_per_m_median"])
        print(f"{size:>6} zlib's CRC costs {by['zlib_extra_cpu_s_per_m']:.4f} CPU-s "
              "per million records more than ISA-L's")
    rates = crc_rates(args.repeat)
    for size, by in rates.items():
        print(f"CRC of {int(size):>8} B: " + ", ".join(
            f"{name} {v['gb_per_s_median']:.2f} GB/s" for name, v in by.items()))
    harness.write_results(args.json, info, {
        "benchmark": "crc", "repeat": args.repeat, "decodes_per_run": DECODES,
        "this_build_crc": crc32_implementation(), "decode": decode, "crc_only": rates})


if __name__ == "__main__":
    main()
