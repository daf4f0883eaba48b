"""Where the time goes: profiles of one run of a reader or publisher.

    .venv/bin/python -m bench.profile_runs                 # every profile below
    .venv/bin/python -m bench.profile_runs --only consume-1k

For each case it runs one measurement as the benchmarks do (the same child
process command line) under

* ``perf record -a -g`` (the whole machine: the broker, the client, and
  whatever else runs) over the measured window only for the Python
  clients (``harness.Window`` enables and disables perf's events through
  ``--control``), the C clients' whole life: the share of samples by
  process, and the client's hottest symbols (C, kernel and Python's own);
* ``py-spy record`` for the Python clients: the hottest Python functions
  of each thread, idle threads left out;

and writes a text summary to ``bench/results/profiles/<case>.txt``. The
summaries say where a gap to the C reference clients comes from: the kernel copying
the socket, CRC, decoding, Python, or waiting while other processes run.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import cpu_class, harness

OUT = harness.RESULTS / "profiles"
PY = sys.executable
PYSPY = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")


# Samples a second and CPU: a window of half a second must give the client
# a few thousand samples, or a symbol's share moves by whole percents.
PERF_HZ = 2999


def cases(uri: str) -> dict[str, list[str]]:
    consume = [PY, "-m", "bench.bench_consume", "--uri", uri, "--stall", "60"]
    publish = [PY, "-m", "bench.bench_publish", "--uri", uri, "--stall", "60"]
    return {
        "consume-1k-wire": harness.wire_cmd("consume", uri, "bench-1k", 1_000_000, 64),
        "consume-1k-wire-crc": harness.wire_cmd("consume", uri, "bench-1k", 1_000_000, 64,
                                                "crc"),
        "consume-1k-pystream": consume + ["--child", "pystream", "--stream", "bench-1k",
                                          "--target", "1000000", "--body-size", "1024"],
        "consume-100b-wire": harness.wire_cmd("consume", uri, "bench-100b", 10_000_000, 64),
        "consume-100b-pystream": consume + ["--child", "pystream", "--stream",
                                            "bench-100b", "--target", "10000000",
                                            "--body-size", "100"],
        "publish-100b-wire": harness.wire_cmd("publish", uri, "bench-profile-publish",
                                              2_000_000, 100),
        "publish-100b-pystream": publish + ["--child", "pystream", "--stream",
                                            "bench-profile-publish", "--target",
                                            "2000000", "--body-size", "100", "--batch",
                                            "100000", "--in-flight", "200000"],
    }


def perf_summary(data: Path, pid: int, window: bool) -> str:
    def report(*args: str) -> list[str]:
        out = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "-q",
                              "--no-children", "-g", "none", *args],
                             capture_output=True, text=True).stdout
        return [re.sub(r"\s{3,}", "   ", line.rstrip())
                for line in out.splitlines() if "%" in line]
    by_pid = report("--sort", "pid")[:15]
    syms = report("--sort", "dso,symbol", "--pid", str(pid),
                  "--percentage", "relative")[:30]
    return ("samples by process, the whole machine (the broker is beam.smp):\n"
            + "\n".join(by_pid)
            + f"\n\nthe client's (pid {pid}) hottest symbols, share of its own samples "
            + ("(the measured window only):\n" if window else
               "(its whole life, start-up included; the result line above is the "
               "measured window):\n")
            + "\n".join(syms) + "\n\n" + time_split(data, pid))


# Where a client's samples go, each sample in the first class its stack
# matches: network processing that ran in the client's context (on loopback
# that includes the sender's transmit of what the client's ACKs let go),
# the kernel copying received bytes out, the CRC, pystream's C core, Python.
# Each test gets the symbols of the whole stack, the leaf's symbol and DSO.
SPLIT = (
    ("network processing in the client's context (softirq)",
     lambda stack, sym, dso: "handle_softirqs" in stack),
    ("the kernel copying received bytes to the client",
     lambda stack, sym, dso: "_copy_to_iter" in stack),
    ("CRC-32", lambda stack, sym, dso: "crc32" in sym),
    ("pystream's C core (decode, frame walk)", lambda stack, sym, dso: "_core." in dso),
    ("Python, pyarrow and libc", lambda stack, sym, dso: any(
        d in dso for d in ("libpython", "lib.cpython", "libarrow", "libc."))),
    ("the rest of the kernel (syscalls, scheduling, faults)",
     lambda stack, sym, dso: "kernel" in dso),
)


def time_split(data: Path, pid: int) -> str:
    out = subprocess.run(["perf", "script", "-i", str(data), "--pid", str(pid),
                          "-F", "ip,sym,dso"], capture_output=True, text=True).stdout
    counts: collections.Counter = collections.Counter()
    total = 0
    for sample in out.split("\n\n"):
        frames = [parts[1] for parts in (line.split(None, 1)
                                         for line in sample.strip().splitlines())
                  if len(parts) == 2]
        if not frames:
            continue
        total += 1
        stack = " ".join(f.rsplit(" (", 1)[0] for f in frames)
        sym, _, dso = frames[0].rpartition(" (")
        label = next((lab for lab, match in SPLIT if match(stack, sym, dso)), "other")
        counts[label] += 1
    if not total:
        return ""
    lines = [f"  {100 * counts[label] / total:5.1f}%  {label}"
             for label in [lab for lab, _ in SPLIT] + ["other"]]
    return ("where the client's samples went (each in the first class its stack "
            "matches):\n" + "\n".join(lines) + "\n")


def pyspy_summary(raw: Path) -> str:
    """Self time of the Python functions (and native frames), by thread."""
    own: collections.Counter = collections.Counter()
    threads: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2:
            continue
        count = int(n)
        total += count
        thread = frames[1] if frames[1].startswith("thread") else frames[0]
        threads[thread[:60]] += count
        own[frames[-1][:110]] += count
    lines = [f"{total} samples (active threads only)", "", "by thread:"]
    lines += [f"  {100 * c / total:5.1f}%  {t}" for t, c in threads.most_common(8)]
    lines += ["", "self time:"]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(25)]
    return "\n".join(lines) + "\n"


def run(name: str, cmd: list[str], uri: str) -> None:
    import pystream
    publish = name.startswith("publish")
    if publish:
        with pystream.connect(uri) as admin:
            admin.delete_stream("bench-profile-publish", missing_ok=True)
            admin.create_stream("bench-profile-publish")
    env = harness.child_env(uri)
    info = harness.machine(None)
    text = [f"# {name}", "",
            f"CPU class {info['cpu_class']}, CRC {info['code_paths']['crc']}; perf at {PERF_HZ} Hz",
            "", "command: " + " ".join(cmd[:2] + ["..."] + cmd[-8:]), ""]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "perf.data"
            load = harness.loadavg()
            pidfile = Path(tmp) / "pid"
            # the client execs in the shell whose pid is written first
            shell = ["sh", "-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), *cmd]
            window = "-wire" not in name  # the C clients have no start-up to leave out
            control: list[str] = []
            if window:
                ctl, ack = Path(tmp) / "ctl", Path(tmp) / "ack"
                os.mkfifo(ctl)
                os.mkfifo(ack)
                control = ["-D", "-1", "--control", f"fifo:{ctl},{ack}"]
                env = {**env, harness.PERF_CONTROL_ENV: f"{ctl},{ack}"}
            proc = subprocess.run(["perf", "record", "-q", "-a", "-g", "-F", str(PERF_HZ),
                                   *control, "-o", str(data), "--", *shell],
                                  capture_output=True, text=True, env=env)
            env.pop(harness.PERF_CONTROL_ENV, None)
            res = harness.parse_result(proc.returncode, proc.stdout, proc.stderr)
            pid = int(pidfile.read_text())
            text += [f"result: {harness.describe({**res, 'load': [load, harness.loadavg()]})}",
                     "", perf_summary(data, pid, window)]
            if "-wire" not in name and Path(PYSPY).exists():
                raw = Path(tmp) / "pyspy.txt"
                proc = subprocess.run([PYSPY, "record", "-r", "250", "-f", "raw",
                                       "--threads", "-o", str(raw), "--", *cmd],
                                      capture_output=True, text=True, env=env)
                res = harness.parse_result(proc.returncode, proc.stdout, proc.stderr)
                text += ["py-spy (a second run, sampled at 250 Hz): "
                         + harness.describe(res), "", pyspy_summary(raw)]
    finally:
        if publish:
            with pystream.connect(uri) as admin:
                admin.delete_stream("bench-profile-publish", missing_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    emulation = cpu_class.chosen()
    path = OUT / f"{name}{'-' + emulation.name if emulation else ''}.txt"
    path.write_text("\n".join(text))
    print(f"{name}: {path}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", default=harness.DEFAULT_URI)
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()
    all_cases = cases(args.uri)
    names = [n for n in args.only.split(",") if n] or list(all_cases)
    for name in names:
        run(name, all_cases[name], args.uri)


if __name__ == "__main__":
    main()
