"""The one harness of the benchmarks: arguments, runs in fresh processes
taken in turns, the C reference clients, medians, and the stored results.

Every script (bench_consume, bench_publish, bench_latency, bench_decode,
bench_spark) builds its parser with ``parser()``, runs each measurement
with ``run_child`` (or ``run_wire`` for the C reference clients), takes the clients in
turn within each repetition (``interleave``) so the machine's noise hits all
of them alike, and writes ``bench/results/<name>.json`` with
``write_results``: per run the figures, the measuring process's and the
broker's CPU time over the measured window (``Window``, from /proc) and the
load average before and after; once, the machine (CPU model, cores),
the git commit, the installed versions of every package involved
(importlib.metadata), the broker's version and the date.
``bench/report.py`` renders the tables of README.md and docs/ from those files.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from importlib.machinery import ModuleSpec
from pathlib import Path

from bench import cpu_class
from tools import results
from tools.results import (  # the record of every stored result, shared with tests/
    admin,
    broker_version,
    git_commit,
    loadavg,
    versions,
    write_results,
)

__all__ = ["admin", "broker_version", "git_commit", "loadavg", "machine", "versions",
           "write_results"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
WIRE = HERE / "wire" / "wire"
DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
BROKER_PID_ENV = "PYSTREAM_BENCH_BROKER_PID"


# --- arguments ------------------------------------------------------------------


def parser(doc: str, *, clients: Iterable[str], default: Iterable[str] | None = None,
           repeat: int = 5, result: str | None = None) -> argparse.ArgumentParser:
    """The arguments every benchmark takes; the script adds its own."""
    clients = tuple(clients)
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[1] if "\n\n" in doc else None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default=os.environ.get("PYSTREAM_TEST_URI", DEFAULT_URI))
    ap.add_argument("--repeat", type=int, default=repeat,
                    help=f"runs of each client (default {repeat}); medians")
    ap.add_argument("--only", default=",".join(default or clients),
                    help=f"comma-separated clients among {', '.join(clients)}")
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds allowed to one run")
    ap.add_argument("--stall", type=float, default=30,
                    help="end a run that made no progress for this many seconds")
    ap.add_argument("--json", default=str(RESULTS / f"{result}.json") if result else None,
                    help="where the results go" + (f" (default bench/results/{result}.json;"
                                                   " '' for nowhere)" if result else ""))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.set_defaults(clients_known=clients)
    return ap


def chosen(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The ``--only`` list, each one a known client."""
    names = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(names) - set(args.clients_known)
    if unknown:
        ap.error(f"unknown clients: {', '.join(sorted(unknown))}")
    return names


def chosen_rows(ap: argparse.ArgumentParser, text: str, known: Iterable[str]) -> list[str]:
    """A comma-separated ``--rows`` list, each one a known row."""
    known = tuple(known)
    rows = [k.strip() for k in text.split(",") if k.strip()]
    if set(rows) - set(known):
        ap.error(f"--rows takes {', '.join(known)}")
    return rows


def by_row(cases: list[tuple[str, str]], runs: dict[int, list[dict]]
           ) -> dict[str, dict[str, list[dict]]]:
    """``interleave``'s runs of (row, client) cases as {row: {client: runs}}."""
    out: dict[str, dict[str, list[dict]]] = {}
    for i, (row, client) in enumerate(cases):
        out.setdefault(row, {})[client] = runs[i]
    return out


def print_clients(title: str, clients: dict[str, dict], *, mb: bool = False) -> None:
    """One line per client of a row's results (its summary and runs)."""
    print(f"\n== {title} ==")
    width = max((len(c) for c in clients), default=0) + 2
    for c, v in clients.items():
        s = v["summary"]
        if s is None:
            print(f"   {c:<{width}} FAILED: {v['runs'][-1].get('error')}")
            continue
        print(f"   {c:<{width}} {fmt_rate(s['msg_per_s_median']):>9} msg/s "
              + (f"{s['mb_per_s_median']:7.0f} MB/s  " if mb else " ")
              + f"cpu {s['cpu_s_per_m_median']:.3f} s/M  "
              f"broker {s.get('broker_cpu_share_median', 0):.0%}")


# --- what the messages hold -----------------------------------------------------


def make_body(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


# --- inside a child process -----------------------------------------------------

# Messages read or sent so far by this (child) process; a watchdog ends a
# run that stops making progress (a client retrying forever).
PROGRESS = [0]


def start_watchdog(stall_seconds: float) -> None:
    def watch() -> None:
        last, since = -1, time.monotonic()
        while True:
            time.sleep(1.0)
            now = PROGRESS[0]
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > stall_seconds:
                print(f"STALLED no progress for {stall_seconds:g} s after "
                      f"{now:,} messages", flush=True)
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def proc_cpu(pid: int) -> float | None:
    """utime + stime of a process, seconds (None when unknown)."""
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PERF_CONTROL_ENV = "PYSTREAM_BENCH_PERF_CONTROL"


def perf_control(command: str) -> None:
    """Tell ``perf record --control`` (bench/profile_runs) to ``enable`` or
    ``disable`` its events, and wait for its ack: the profile then covers
    the measured window only. A no-op outside a profile."""
    fifos = os.environ.get(PERF_CONTROL_ENV)
    if not fifos:
        return
    ctl, ack = fifos.split(",")
    with open(ctl, "w") as f:
        f.write(command + "\n")
    with open(ack) as f:
        f.readline()


class Window:
    """The measured window of a run: wall time, this process's CPU time
    (all threads) and the broker's (its pid comes from the parent)."""

    def __init__(self) -> None:
        self.broker = int(os.environ.get(BROKER_PID_ENV, "0"))

    def start(self) -> None:
        gc.collect()
        perf_control("enable")
        self.b0 = proc_cpu(self.broker)
        self.first_data: float | None = None
        self.cpu0, self.t0 = time.process_time(), time.perf_counter()

    def data(self) -> None:
        """Data arrived: the first call marks when the flow began (what
        came before it is handshakes and round trips, not throughput)."""
        if self.first_data is None:
            self.first_data = time.perf_counter() - self.t0

    def stop(self, messages: int, **extra: object) -> dict:
        t1, cpu1 = time.perf_counter(), time.process_time()
        b1 = proc_cpu(self.broker)
        perf_control("disable")
        out = {"messages": messages, "seconds": t1 - self.t0,
               "cpu": cpu1 - self.cpu0, **extra}
        if self.first_data is not None:
            out["first_data"] = self.first_data
        if self.b0 is not None and b1 is not None:
            out["broker_cpu"] = b1 - self.b0
        return out


def child_done(result: dict) -> None:
    """Hand the result to the parent and leave at once (peers' teardown is
    slow and not measured)."""
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)


# --- in the parent ----------------------------------------------------------------


def broker_pid(uri: str) -> int:
    """The pid of the process listening on the URI's port when the broker
    runs on this machine (``ss -ltnp``); 0 when unknown."""
    from pystream.uri import parse_uri
    a = parse_uri(uri)
    if a.host not in ("localhost", "127.0.0.1", "::1"):
        return 0
    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{a.port}"],
                             capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else 0


def pin(uri: str, spec: str) -> dict:
    """Keep the broker on this machine (every thread of the process on the
    URI's port) on some cores and this process, with the clients it
    starts, on the others, until it exits: ``spec`` is ``BROKER/CLIENTS``,
    core lists such as ``0/1``. On a machine whose cores the broker shares
    with the clients, the client that leaves it more CPU reads faster;
    apart, each reads as it would from a broker on another machine. What
    the results record."""
    import atexit
    try:
        broker_cpus, client_cpus = ({int(c) for c in part.split(",")}
                                    for part in spec.split("/"))
    except ValueError:
        raise SystemExit(f"--pin takes BROKER/CLIENTS core lists (0/1), not {spec!r}") from None
    pid = broker_pid(uri)
    if not pid:
        raise SystemExit("--pin needs the broker on this machine")
    tasks = Path(f"/proc/{pid}/task")
    before = os.sched_getaffinity(pid)

    def set_broker(cpus: set[int]) -> None:
        for tid in tasks.iterdir():
            try:
                os.sched_setaffinity(int(tid.name), cpus)
            except ProcessLookupError:
                pass  # a thread that ended meanwhile

    set_broker(broker_cpus)
    atexit.register(set_broker, before)
    os.sched_setaffinity(0, client_cpus)
    return {"broker_cpus": sorted(broker_cpus), "client_cpus": sorted(client_cpus)}


def machine(uri: str | None) -> dict:
    """The machine block of a result (tools.results), with the CPU class
    emulated for the clients if one is (bench/cpu_class)."""
    return cpu_class.machine(results.machine(uri))


def child_env(uri: str) -> dict:
    pid = broker_pid(uri)
    return cpu_class.child_env({**os.environ, "OPENBLAS_NUM_THREADS": "1",
                                BROKER_PID_ENV: str(pid), "WIRE_BROKER_PID": str(pid)})


def parse_result(returncode: int, stdout: str, stderr: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
        if line.startswith("STALLED "):
            return {"error": line.lower()}
    tail = (stderr or stdout).strip().splitlines()[-3:]
    return {"error": f"exit {returncode}: " + " | ".join(tail)}


def self_cmd(spec: ModuleSpec | None) -> list[str]:
    """The command that runs a benchmark module again (``python -m
    bench.<name>``, from the checkout's root: see ``run_child``)."""
    if spec is None:
        raise SystemExit("run the benchmarks as modules: python -m bench.<name>")
    return [sys.executable, "-m", spec.name]


def run_child(cmd: list[str], timeout: float, uri: str) -> dict:
    """One measurement in a fresh process: its ``RESULT {json}`` line (or
    ``{"error": ...}``) with the load average before and after. It runs
    from the checkout's root, where ``python -m bench.<name>`` finds the
    package."""
    before = loadavg()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              timeout=timeout, env=child_env(uri))
        out = parse_result(proc.returncode, proc.stdout, proc.stderr)
    except subprocess.TimeoutExpired:
        out = {"error": f"timed out after {timeout} s"}
    out["load"] = [before, loadavg()]
    return out


def stream_end(uri: str, stream: str) -> int:
    """The offset after the stream's last record (pystream.ranges)."""
    from pystream.bounds import stream_bounds
    return admin(uri, lambda client: stream_bounds(client, stream).end)


def wire_binary() -> Path:
    """The C wire client, built when missing or older than its source."""
    src = WIRE.with_suffix(".c")
    if not WIRE.exists() or WIRE.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["make", "-s", "-C", str(WIRE.parent)], check=True)
    return WIRE


def wire_args(uri: str) -> list[str]:
    from pystream.uri import parse_uri
    a = parse_uri(uri)
    if a.tls:
        raise SystemExit("the C wire client does not do TLS")
    return [a.host, str(a.port), a.username, a.password, a.virtual_host]


def wire_cmd(mode: str, uri: str, stream: str, *rest: object) -> list[str]:
    return [str(wire_binary()), mode, *wire_args(uri), stream, *map(str, rest)]


def run_wire(mode: str, uri: str, stream: str, *rest: object,
             timeout: float = 900) -> dict:
    """One run of the C wire client (``bench/wire/wire.c``)."""
    return run_child(wire_cmd(mode, uri, stream, *rest), timeout, uri)


def describe(res: dict) -> str:
    """One line about one run, for the log."""
    if "error" in res:
        return f"FAILED {res['error']}"
    msg = (f"{res['messages']:,} in {res['seconds']:.3f} s, "
           f"{fmt_rate(res['messages'] / res['seconds'])} msg/s")
    if "cpu" in res:
        msg += f", cpu {res['cpu'] / res['seconds']:.0%}"
    if "broker_cpu" in res:
        msg += f", broker {res['broker_cpu'] / res['seconds']:.0%}"
    if res.get("load"):
        msg += f", load {res['load'][0][0]:.1f}->{res['load'][1][0]:.1f}"
    return msg


def interleave(repeat: int, cases: list, run: Callable[[object], dict],
               label: Callable[[object], str] = str, *,
               rotate: bool = False) -> dict[int, list[dict]]:
    """Each case once per repetition, in turn: {case index: [runs]}. A
    failed run is tried once more (other users of the shared broker may
    close its connections); the failure stays in the record. With
    ``rotate``, repetition r starts at case r (mod the count): each case
    takes each place in turn, so that none always runs first (after the
    previous repetition's last) or always last."""
    runs: dict[int, list[dict]] = {i: [] for i in range(len(cases))}
    for rep in range(repeat):
        shift = rep % len(cases) if rotate and cases else 0
        for i in [*range(shift, len(cases)), *range(shift)]:
            case = cases[i]
            res = run(case)
            if "error" in res:
                print(f"run {rep + 1}/{repeat} {label(case):<40} {describe(res)}; "
                      "once more", flush=True)
                res = {**run(case), "retried_after": res["error"]}
            runs[i].append(res)
            print(f"run {rep + 1}/{repeat} {label(case):<40} {describe(res)}",
                  flush=True)
    return runs


def summarize(runs: list[dict], body_size: int) -> dict | None:
    """Medians over the runs that did not fail (None if all did): msg/s,
    MB/s of bodies, the client's CPU per million messages and its share of
    a core, the broker's share."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return None
    rates = [r["messages"] / r["seconds"] for r in good]
    out = {
        "runs": len(good), "failed": len(runs) - len(good),
        "messages": good[0]["messages"],
        "seconds_median": statistics.median(r["seconds"] for r in good),
        "msg_per_s_median": statistics.median(rates),
        "msg_per_s_all": rates,
        "mb_per_s_median": statistics.median(rates) * body_size / 1e6,
    }
    if all("cpu" in r for r in good):
        out["cpu_s_per_m_median"] = statistics.median(
            r["cpu"] / r["messages"] * 1e6 for r in good)
        out["cpu_share_median"] = statistics.median(r["cpu"] / r["seconds"]
                                                    for r in good)
    if all("broker_cpu" in r for r in good):
        out["broker_cpu_share_median"] = statistics.median(
            r["broker_cpu"] / r["seconds"] for r in good)
        out["broker_cpu_s_per_m_median"] = statistics.median(
            r["broker_cpu"] / r["messages"] * 1e6 for r in good)
    return out


def quartiles(xs: list[float]) -> list[float] | None:
    """[lowest, first quartile, median, third quartile, highest]."""
    if not xs:
        return None
    if len(xs) == 1:
        return xs * 5
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return [min(xs), q1, q2, q3, max(xs)]


def paired_changes(pairs: list[tuple[dict, dict]]) -> dict:
    """Each run of ``pairs`` (run, baseline) against its baseline, as
    fractions: the median change in msg/s and in CPU per message, with
    their quartiles and the bootstrap 95 % interval of the median."""
    rate = [x["messages"] / x["seconds"] / (y["messages"] / y["seconds"]) - 1
            for x, y in pairs]
    cpu = [x["cpu"] / x["messages"] / (y["cpu"] / y["messages"]) - 1
           for x, y in pairs if x.get("cpu") and y.get("cpu")]
    return {"msg_per_s_paired": statistics.median(rate) if rate else None,
            "msg_per_s_paired_quartiles": quartiles(rate),
            "msg_per_s_paired_ci95": median_ci(rate),
            "cpu_s_per_m_paired": statistics.median(cpu) if cpu else None,
            "cpu_s_per_m_paired_quartiles": quartiles(cpu),
            "cpu_s_per_m_paired_ci95": median_ci(cpu)}


def median_ci(xs: list[float], level: float = 0.95, resamples: int = 10_000
              ) -> list[float] | None:
    """A bootstrap confidence interval of the median of ``xs`` (percentile
    method, a fixed seed so that the same runs give the same interval):
    [low, high], or None with fewer than 3 values. For paired changes
    (each run against its partner in the same repetition), it says what
    the runs can resolve where the spread of one client's runs cannot."""
    if len(xs) < 3:
        return None
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(xs, k=len(xs)))
                     for _ in range(resamples))
    tail = (1 - level) / 2
    return [medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]]


# --- what the results record (tools/results.py) --------------------------------------


def label(client: str) -> str:
    """``rbfly 0.10.2``: the installed version beside a peer's name."""
    version = versions().get(client)
    return f"{client} {version}" if version else client


def banner(info: dict, what: str) -> None:
    v = info["versions"]
    print(f"{what}: RabbitMQ {info['broker']} at {info['broker_address']}; "
          f"{info['cores']} cores ({info['cpu_model']}, {info['cpu_class']}; CRC: "
          f"{info['code_paths']['crc']}); python {info['python']}; "
          + ", ".join(f"{k} {x}" for k, x in v.items() if x)
          + f"; commit {info['commit'][:12]}; load {info['loadavg_start']}"
          + (f"; broker on cores {info['pinned']['broker_cpus']}, clients on "
             f"{info['pinned']['client_cpus']}" if info.get("pinned") else ""),
          flush=True)


# --- Spark ----------------------------------------------------------------------


def spark_session(conf: dict[str, str] | None = None):
    """The benchmarks' local Spark session (2 cores, no UI) with the data
    source registered; its Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pystream.spark import RabbitMQStreamDataSource

    builder = (SparkSession.builder.master("local[2]")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RabbitMQStreamDataSource)
    return spark
