"""Where a batch's time goes at a low rate: the stages of pystream's
consumer between the wake-up and the batch in the application's hands.

    .venv/bin/python -m bench.latency_stages                     # 1 k msg/s, 3 runs of 10 s
    .venv/bin/python -m bench.latency_stages --rate 10000 --repeat 5

A publisher in its own process sends at ``--rate`` as ``bench_latency``'s
does (paced in 1 ms ticks, 100-byte bodies); this process consumes with
``client.consumer(stream, offset="next")`` and its defaults, iterating
batches, and times each batch whose chunk its own thread read:

* ``wake``: the turn's ``poll`` returned, to the read beginning;
* ``receive``: the ``recv`` that brought the frame's start, and the wait
  for its rest (the broker writes a Deliver's header, then sends the
  chunk's records with ``sendfile``);
* ``drain``: the frame parsed, the chunk's CRC checked, decoded into Arrow
  columns and queued, with its admission and credit (``Connection._drain``);
* ``hand``: from the queue to the batch in the application's hands (the
  position, the credit, the metrics, the turn lent);
* ``back``: from the batch handed to the next ``poll`` (after the handing:
  the application's time, and the consumer's bookkeeping).

Each stage in wall time and in the thread's CPU time (``thread_time_ns``,
a system call: each stamp adds about a microsecond), medians and tails
over the runs' batches, the first ``--warmup`` seconds left out.

Beside the stages, each batch's latency (its first record's send time to
the batch handed) and the time this thread waited on a run queue, ready
but not running (the kernel's ``schedstat``, read once per batch): for the
slowest batches, how much of their latency was this thread's and how much
came before the chunk reached its socket. The summary goes to
``bench/results/profiles/latency-stages-<rate>.txt``.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import bench_latency, cpu_class, harness

STREAM = "bench-latency-stages"
STAGES = ("wake", "receive", "drain", "hand", "back")
# The stamps, in the order one batch passes them: poll returned, read
# began, drain began, drain ended, batch handed, next poll called.
STAMPS = ("poll", "read", "drain0", "drain1", "hand", "next")


class Stamps:
    """The two clocks at each point a batch passes, in one thread only."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.at: dict[str, tuple[int, int]] = {}
        self.rows: list[tuple[tuple[int, int], ...]] = []
        self.queued = 0  # batches of chunks another read had brought
        # This thread's own (opened by it): the second field is the time
        # it was ready to run and waited for a core.
        self.schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def run_delay(self) -> int:
        return int(os.pread(self.schedstat, 64, 0).split()[1])

    def stamp(self, name: str) -> None:
        # The first poll called after a batch was handed, the last of the
        # rest (a read may be woken for nothing, or bring no chunk).
        if threading.get_ident() == self.thread and not (
                name == "next_poll" and name in self.at):
            self.at[name] = (time.perf_counter_ns(), time.thread_time_ns())

    def wrap(self, cls: type, method: str, before: str | None, after: str | None) -> None:
        original: Callable[..., Any] = getattr(cls, method)
        stamp = self.stamp

        def timed(obj: object, *args: Any, **kw: Any) -> Any:
            if before:
                stamp(before)
            try:
                return original(obj, *args, **kw)
            finally:
                if after:
                    stamp(after)
        setattr(cls, method, timed)

    def handed(self, previous: dict[str, tuple[int, int]] | None) -> None:
        """The batch is in the application's hands; ``previous`` holds the
        stamps of the batch before (its ``next`` is known now)."""
        self.stamp("hand")
        at, self.at = self.at, {}
        at["when"] = (time.monotonic_ns(), self.run_delay())
        if previous is not None and "next_poll" in at:
            previous["next"] = at.pop("next_poll")
        order = [at[n][0] for n in STAMPS[:5] if n in at]
        if len(order) == 5 and order == sorted(order):
            at["complete"] = (1, 1)
        else:
            self.queued += 1
        self.last = at


# A measured batch's row in ``Records``: each of STAMPS' two clocks, then
# the hand-over's monotonic time and run-queue total, then whether its
# stamps came in order (-1: a stamp it did not pass).
ROW = 2 * len(STAMPS) + 3
NEXT, WHEN, RUN_DELAY, IN_ORDER = 2 * STAMPS.index("next"), ROW - 3, ROW - 2, ROW - 1


class Records:
    """The measured batches' stamps, in an ``array``: kept as the dicts
    ``Stamps`` makes, each batch would leave some eight more objects for
    the garbage collector to track, and its collections stop the thread
    being measured (the summary counts those that happened)."""

    def __init__(self) -> None:
        self.rows = array("q")

    def add(self, at: dict[str, tuple[int, int]]) -> None:
        """The batch's stamps, once its ``next`` is known."""
        for name in STAMPS:
            self.rows.extend(at.get(name, (-1, -1)))
        self.rows.extend((*at["when"], 1 if "complete" in at else 0))

    def table(self) -> np.ndarray:
        return np.frombuffer(self.rows, np.int64).reshape(-1, ROW)


def run_once(uri: str, rate: int, seconds: float, warmup: float) -> dict:
    import pystream
    from pystream import connection, readturn, receiver

    harness.admin(uri, lambda a: (a.delete_stream(STREAM, missing_ok=True),
                                  a.create_stream(STREAM)))
    stamps = Stamps()
    saved = {(cls, m): getattr(cls, m) for cls, m in (
        (readturn.ReadTurn, "poll"), (receiver.Receiver, "_read_once"),
        (connection.Connection, "_drain"))}
    stamps.wrap(readturn.ReadTurn, "poll", "next_poll", "poll")
    stamps.wrap(receiver.Receiver, "_read_once", "read", None)
    stamps.wrap(connection.Connection, "_drain", "drain0", "drain1")
    done: list[dict] = []
    expect = int(rate * seconds) + 1
    try:
        with pystream.connect(uri) as client, client.consumer(STREAM, offset="next") as consumer:
            publisher = threading.Thread(target=lambda: done.append(harness.run_child(
                [*harness.self_cmd(bench_latency.__spec__), "--uri", uri, "--child",
                 "publisher", "--stream", STREAM, "--warmup", "0", "--stall", "60",
                 "--size", "100", "--rate", str(rate), "--seconds", str(seconds),
                 "--tick-ms", "1"], seconds + 120, uri)))
            bench_latency.settle_heap()
            publisher.start()
            rows = batches = 0
            records = Records()
            heads: list[Any] = []  # the batches measured, read once the run is over
            # The measured batch waits for the next one's stamps.
            waiting: dict[str, tuple[int, int]] | None = None
            pauses = bench_latency.GcPauses()
            cpu0 = time.process_time()
            t0 = time.monotonic()
            first: float | None = None
            previous: dict[str, tuple[int, int]] | None = None
            for batch in consumer:
                stamps.handed(previous)
                if waiting is not None:
                    records.add(waiting)
                    waiting = None
                rows += batch.num_rows
                batches += 1
                now = time.monotonic()
                first = now if first is None else first
                previous = stamps.last
                if now - first >= warmup:
                    waiting = previous
                    heads.append(batch)
                if rows >= expect:
                    break
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - t0
            collected = pauses.stop()
            if waiting is not None:
                records.add(waiting)
            publisher.join()
    finally:
        os.close(stamps.schedstat)
        for (cls, m), f in saved.items():
            setattr(cls, m, f)
        harness.admin(uri, lambda a: a.delete_stream(STREAM, missing_ok=True))
    if done and "error" in done[0]:
        raise SystemExit(f"publisher: {done[0]['error']}")
    table = records.table()
    whole = table[(table[:, IN_ORDER] == 1) & (table[:, NEXT] >= 0)]
    out: dict[str, Any] = {"batches": batches, "rows": rows, "measured": len(table),
                           "timed": len(whole), "cpu_per_batch_us": cpu / batches * 1e6,
                           "cpu_share": cpu / wall, **collected}
    out.update(waits(table, heads))
    for clock in (0, 1):
        for i, stage in enumerate(STAGES):
            a, b = 2 * i + clock, 2 * (i + 1) + clock
            out.setdefault(stage, {})["wall" if clock == 0 else "cpu"] = (
                (whole[:, b] - whole[:, a]) / 1e3).tolist()
    return out


def waits(table: np.ndarray, batches: list[Any]) -> dict:
    """Each measured batch's latency (ms) and this thread's run-queue wait
    within it (ms), the end marker left out."""
    import pyarrow as pa
    sent = []
    for batch in batches:
        body = batch.column("body").cast(pa.binary())
        _, offsets, data = body.buffers()
        start = int(np.frombuffer(offsets, np.int32, 1, body.offset * 4)[0])
        sent.append(int(np.frombuffer(data, "<i8", 1, start)[0]))
    keep = np.array(sent) != bench_latency.MARKER
    when = table[:, WHEN][keep]
    delay = table[:, RUN_DELAY][keep]
    latency = when - np.array(sent, np.int64)[keep]
    # The wait since the last batch handed before this batch's first
    # record was sent (the whole window, when it reaches back past it).
    before = np.maximum(np.searchsorted(when, when - latency) - 1, 0)
    return {"latency_ms": (latency / 1e6).tolist(),
            "waited_ms": ((delay - delay[before]) / 1e6).tolist(),
            "wait_per_batch_us": (np.diff(delay) / 1e3).tolist()}


def summary(runs: list[dict], rate: int, info: dict, args: argparse.Namespace) -> str:
    lines = [f"# pystream's consumer at {rate:,} msg/s: where a batch's time goes", "",
             f"commit {info['commit'][:12]}, {info['date']}, {info['cpu_class']}, "
             f"{info['cores']} cores, python {info['python']}, broker {info['broker']}",
             f"{len(runs)} runs of {args.seconds:g} s, the first {args.warmup:g} s left out; "
             "batches whose chunk this thread read, medians and tails over all runs "
             "(microseconds)", ""]
    timed = sum(r["timed"] for r in runs)
    measured = sum(r["measured"] for r in runs)
    lines.append(f"batches timed: {timed} of {measured} ({measured - timed} were of chunks "
                 "queued by an earlier read, or lost a stamp)")
    lines.append("rows per batch: " + ", ".join(f"{r['rows'] / r['batches']:.2f}" for r in runs))
    lines.append("garbage collections while measuring: "
                 + ", ".join(f"{r['gc_collections']} (longest {r['gc_pause_max_ms']:.2f} ms)"
                             for r in runs))
    lines.append("consumer CPU per batch (the process): "
                 + ", ".join(f"{r['cpu_per_batch_us']:.0f} us" for r in runs)
                 + "; CPU share: " + ", ".join(f"{r['cpu_share']:.1%}" for r in runs))
    lines += ["", "| stage | wall p50 | wall p90 | wall p99 | CPU p50 | CPU p90 | CPU mean |",
              "|---|---|---|---|---|---|---|"]
    for stage in STAGES:
        wall = np.concatenate([r[stage]["wall"] for r in runs])
        cpu = np.concatenate([r[stage]["cpu"] for r in runs])
        w50, w90, w99 = np.percentile(wall, [50, 90, 99])
        c50, c90 = np.percentile(cpu, [50, 90])
        lines.append(f"| {stage} | {w50:.0f} | {w90:.0f} | {w99:.0f} | {c50:.0f} | "
                     f"{c90:.0f} | {cpu.mean():.0f} |")
    latency = np.concatenate([r["latency_ms"] for r in runs])
    waited = np.concatenate([r["waited_ms"] for r in runs])
    per_batch = np.concatenate([r["wait_per_batch_us"] for r in runs])
    slow = latency >= np.percentile(latency, 99)
    l50, l99 = np.percentile(latency, [50, 99])
    q50, q90, q99 = np.percentile(per_batch, [50, 90, 99])
    lines += ["", f"batch latency (its first record's send to the batch handed): "
              f"p50 {l50:.2f} ms, p99 {l99:.2f} ms",
              f"this thread's wait on a run queue (ready, not running), per batch: "
              f"p50 {q50:.0f} us, p90 {q90:.0f} us, p99 {q99:.0f} us",
              f"the slowest 1 % of batches ({slow.sum()}): latency median "
              f"{np.median(latency[slow]):.2f} ms, of which this thread waited on a run "
              f"queue {np.median(waited[slow]):.2f} ms (median; mean "
              f"{waited[slow].mean():.2f} of {latency[slow].mean():.2f} ms); the rest "
              "passed before the chunk reached the socket, or with this thread running"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", default=harness.DEFAULT_URI)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", help="the summary's path (default: bench/results/profiles/"
                                  "latency-stages-<rate>.txt)")
    args = ap.parse_args()
    info = harness.machine(args.uri)
    runs = []
    for i in range(args.repeat):
        runs.append(run_once(args.uri, args.rate, args.seconds, args.warmup))
        r = runs[-1]
        print(f"run {i + 1}: {r['batches']} batches, {r['rows']} rows, "
              f"{r['cpu_per_batch_us']:.0f} us CPU per batch", flush=True)
    text = summary(runs, args.rate, info, args)
    print(text)
    emulation = cpu_class.chosen()
    path = args.out or str(harness.RESULTS / "profiles" / (
        f"latency-stages-{args.rate // 1000}k"
        f"{'-' + emulation.name if emulation else ''}.txt"))
    with open(path, "w") as f:
        f.write(text)
    print(f"summary written to {path}")


if __name__ == "__main__":
    main()
