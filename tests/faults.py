"""The fault x feature matrix: each way of reading and writing a stream, run
against the modern broker while one fault strikes mid-way, judged by the
soak's checker (tests/soak.py: every body byte for byte, order, duplicates,
losses).

Reading paths: ``Consumer`` (blocking ``read``, named), ``AsyncConsumer``,
``read_range`` (what a Spark batch partition calls; plain and with a pushed
filter), single active consumers, a super stream consumer and a filtered
consumer. Writing paths: a named ``Producer``, a named
``SuperStreamProducer``, and the Spark sink's task function
(``pystream.spark.sink._write``, no JVM needed) with each codec.

Faults:
  close      the broker closes the cells' connections (their own user's,
             ``rabbitmqctl close_all_user_connections``)
  pause      the node is stopped (SIGSTOP) for PAUSE seconds: past the
             clients' 1 s heartbeat (lost after 2 s) and every idle
             threshold in pystream (``ranges.FILTERED_QUIET`` 2 s,
             ``ranges.CHECK_EVERY`` and ``subscription.IDLE_SECONDS`` 1 s)
  restart    the node is stopped and started again
  exception  the application raises mid-way (its processing of a batch,
             a post filter, the rows handed to the sink) and carries on as
             its documentation says: a consumer is closed and opened
             again under its name, a range read or a sink task is retried
  cancel     asyncio: the reading task is cancelled again and again; the
             blocking reads: SIGINT to a child process that catches the
             KeyboardInterrupt and reads on (docs/consuming.md)
  kill       SIGKILL to a child process consuming or producing under a
             name, mid-way; it is started again and carries on

A broker fault strikes once per round, every cell of the round running
at once (each on its own streams), when all of them are half-way; the
records (sequence numbers in 64-byte bodies) are written half before it
and half during and after it. A cell passes when every confirmed record
was read (written) exactly once, in order where promised, or at least
once where that is the promise (single active consumers; a consumer
closed after a failure or killed resumes from its stored offset), and
no read came back short without an error. A range read that raises is
retried, as Spark retries the task.

    .venv/bin/python -m tests.faults                  # the whole matrix
    .venv/bin/python -m tests.faults --faults close,exception --paths consumer
    .venv/bin/python -m tests.faults --json bench/results/faults.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import pystream
from pystream import aio
from tools import results

from . import brokers
from .conftest import MODERN_URI, ROOT, registered_session, run_broker
from .soak import Checker, as_binary, bodies, bodies_of, rows_of
from .waiting import wait_until

N = 20_000            # records per cell
BATCH = 250           # records per published batch
HEARTBEAT = 1         # seconds, in the pause's cells: a silent broker is lost after 2
PAUSE = 5.0           # seconds the node stays stopped
# The other cells' heartbeat: on two busy cores a 1 s one is sometimes
# missed without a fault, and those cells' faults need none.
HEARTBEAT_OTHERWISE = 10


def client_options(fault: str) -> dict[str, Any]:
    """``connect`` options of the cells of ``fault``."""
    heartbeat = HEARTBEAT if fault == "pause" else HEARTBEAT_OTHERWISE
    return dict(heartbeat=heartbeat, connect_timeout=5, request_timeout=10)


SENTINEL = 1 << 40    # the sequence number of the record that ends a stream
PARTITIONS = 3
OVERLAP = 1000        # records a resumed producer sends again (deduplicated)
SECOND_HALF = 3.0     # seconds over which the second half is published
CANCELS = 40          # reads an asyncio cell cancels
HOLD = 3.0            # seconds a range read waits for a broker fault to take effect
MIDWAY_WAIT = 60.0    # seconds a broker fault waits for every cell
AFTER_FAULT = 90.0    # seconds every cell has to finish after the fault
USER = "pystream-faults"
PASSWORD = "pystream-faults-not-a-secret"

_modern = urlsplit(MODERN_URI)
HOST = f"{_modern.hostname}:{_modern.port or brokers.MODERN.stream}"
URI = f"rabbitmq-stream://{USER}:{PASSWORD}@{HOST}/"
URI_NO_PASSWORD = f"rabbitmq-stream://{USER}@{HOST}/"

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PATHS = {
    "consumer": "Consumer, blocking read, named",
    "aio": "AsyncConsumer (pystream.aio), named",
    "range": "read_range (a Spark batch partition)",
    "range-filtered": "read_range with a pushed filter",
    "sac": "single active consumer (two, one name)",
    "super": f"super stream consumer ({PARTITIONS} partitions), named",
    "filtered": "filtered consumer (filter + post filter)",
    "producer": "Producer, named (deduplicating)",
    "producer-interrupted": "Producer, named, sent SIGINT again and again",
    "super-producer": "SuperStreamProducer, named",
    "super-producer-interrupted": "SuperStreamProducer, named, sent SIGINT again and again",
    **{f"sink-{c}": f"Spark sink task, {c}" for c in CODECS},
}
FAULTS = ("close", "pause", "restart", "exception", "cancel", "kill")
BROKER_FAULTS = ("close", "pause", "restart")
SINKS = tuple(p for p in PATHS if p.startswith("sink-"))
WRITERS = ("producer", "super-producer", *SINKS)

# Cells that do not apply, and why.
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    **{(p, f): "the interrupts are the cancel cell of the row above; here they "
               "meet the broker's faults"
       for p in ("producer-interrupted", "super-producer-interrupted")
       for f in ("exception", "cancel", "kill")},
    **{(p, "cancel"): "a Spark task is cancelled by ending its Python worker (the kill "
                      "cell), not by an interrupt it catches" for p in SINKS},
    ("range", "cancel"): "a cancelled range read is dropped and its task re-run "
                         "(the exception cell)",
    ("range-filtered", "cancel"): "as range",
    ("sac", "cancel"): "the consumer's interrupt path (the consumer cell)",
    ("aio", "kill"): "the blocking consumer's stored offset (the consumer cell)",
    ("range", "kill"): "no state: a killed task is re-run from its plan",
    ("range-filtered", "kill"): "as range",
    ("filtered", "kill"): "the consumer's stored offset (the consumer cell)",
}
# Where the promise is at least once: the stored offset lags the records
# handed (a consumer closed after a failure or killed, the other single
# active consumer taking over); a super stream producer has no publishing
# ids of the application's to send again after a crash.
AT_LEAST_ONCE = {
    *((p, f) for p in ("consumer", "aio", "super") for f in ("exception", "kill")),
    *(("sac", f) for f in FAULTS),
    ("super-producer", "kill"),
}

log = logging.getLogger("tests.faults")


class AppError(Exception):
    """The application's own failure, injected mid-way."""


def promise(path: str, fault: str) -> str:
    return "at-least-once" if (path, fault) in AT_LEAST_ONCE else "exactly-once"


@dataclass
class Cell:
    """One cell's verdict and what it is based on."""

    path: str
    fault: str
    verdict: str = "n/a"          # pass, fail or n/a
    reason: str = ""
    promise: str = ""
    expected: int = 0             # confirmed records the reader(s) should get
    read: int = 0                 # records read (duplicates included)
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    body_mismatches: int = 0
    unexpected: int = 0           # records never published, or filtered out
    events: list[str] = field(default_factory=list)  # errors, retries, interrupts
    recoveries: int = 0           # pystream's recovery warnings for its streams
    faulted_midway: bool = False  # the fault struck after the cell was half-way
    seconds: float = 0.0


# --- a cell being run -------------------------------------------------------------


class Round:
    """The cells of one fault, run at once; a broker fault strikes once,
    when every cell is half-way."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.began = threading.Event()   # the fault started (or, for the
        self.ended = threading.Event()   # application's faults, at once)
        self.runs: list[Run] = []
        self.fault_error: str | None = None
        self.ended_at = float("inf")
        if fault not in BROKER_FAULTS:
            self.began.set()
            self.end()

    def end(self) -> None:
        if not self.ended.is_set():
            self.ended_at = time.monotonic()
            self.ended.set()

    def inject(self) -> None:
        deadline = time.monotonic() + MIDWAY_WAIT
        for run in self.runs:
            run.halfway.wait(max(0.0, deadline - time.monotonic()))
        for run in self.runs:
            run.cell.faulted_midway = run.halfway.is_set()
        self.began.set()
        try:
            if self.fault == "close":
                run_broker("ctl", "modern", "close_all_user_connections", USER,
                           "fault matrix", timeout=120)
            elif self.fault == "pause":
                run_broker("pause", "modern")
                try:
                    time.sleep(PAUSE)
                finally:
                    run_broker("resume", "modern")
            else:
                run_broker("restart", "modern")
        except subprocess.CalledProcessError as exc:
            self.fault_error = f"scripts/broker failed: {exc.stderr[-500:]}"
        finally:
            self.end()


class Run:
    """A cell while it runs: its names, its checker, its deadline."""

    def __init__(self, round_: Round, path: str, fault: str, workdir: Path) -> None:
        self.round = round_
        self.cell = Cell(path, fault, promise=promise(path, fault))
        self.path, self.fault = path, fault
        self.options = client_options(fault)
        self.tag = f"pystream-faults-{path}-{fault}-{uuid.uuid4().hex[:6]}"
        self.workdir = workdir
        self.halfway = threading.Event()
        self.check: Checker | None = None
        self.sentinels: set[str] = set()
        self.sentinels_wanted = 1
        self.expected = np.zeros(N, bool)    # what the reader must get
        self.excluded = np.zeros(N, bool)    # what it must not (filtered out)
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.streams: list[str] = []
        self.super_streams: list[str] = []
        self.verdict_hint: str | None = None  # a failure found on the way
        self.half = N // 2                    # records read half-way
        self.failed = threading.Event()       # the application's fault struck

    # -- time --
    def late(self) -> bool:
        return time.monotonic() > self.round.ended_at + AFTER_FAULT

    def finished(self) -> bool:
        return len(self.sentinels) >= self.sentinels_wanted or self.late()

    def midway(self) -> None:
        """Half-way: a broker fault may strike; wait until it does (the
        range reads and the writers, which set their own pace; a reader
        fed live is half-way once it read the first half, ``take``)."""
        self.halfway.set()
        self.round.began.wait(MIDWAY_WAIT + 5)

    # -- streams --
    def connect(self) -> pystream.Client:
        return pystream.connect(URI, **self.options)

    def stream(self, client: pystream.Client, suffix: str = "") -> str:
        name = self.tag + suffix
        client.create_stream(name)
        self.streams.append(name)
        return name

    def super_stream(self, client: pystream.Client) -> list[str]:
        client.create_super_stream(self.tag, partitions=PARTITIONS)
        self.super_streams.append(self.tag)
        return client.partitions(self.tag)

    # -- reading --
    def checker(self, contiguous: bool) -> Checker:
        self.check = Checker(N, contiguous=contiguous)
        return self.check

    def take(self, body: pa.Array | pa.ChunkedArray, offsets: Any = None,
             key: str = "") -> np.ndarray:
        """Count what the application got (the sentinel ends its key)."""
        assert self.check is not None
        rows = rows_of(body)
        seqs = rows[:, :8].copy().view(np.uint64).ravel().astype(np.int64)
        end = seqs == SENTINEL
        with self.lock:
            if end.any():
                self.sentinels.add(key)
                keep = ~end
                rows, seqs = rows[keep], seqs[keep]
                offsets = None if offsets is None else np.asarray(offsets)[keep]
            self.check.add(rows, offsets, key)
            if self.check.consumed >= self.half:
                self.halfway.set()
        return seqs

    def process(self, body: pa.Array | pa.ChunkedArray, offsets: Any = None,
                key: str = "") -> None:
        """The application's work on a batch: ``take``; under the exception
        fault the first batch past half-way fails instead (is not taken)."""
        if self.strikes(len(body) > 0 and self.past_half()):
            raise AppError("processing a batch failed")
        self.take(body, offsets, key)

    def strikes(self, due: bool) -> bool:
        """Whether the application's fault (exception) strikes now: the
        first time it is ``due``."""
        if self.fault != "exception" or not due or self.failed.is_set():
            return False
        self.failed.set()
        return True

    def past_half(self) -> bool:
        assert self.check is not None
        return self.check.consumed >= self.half


# --- publishing what the readers read -----------------------------------------------


def filter_batch(seqs: np.ndarray) -> pa.RecordBatch:
    """Bodies with a ``color`` application property: red for even numbers."""
    colors = np.where(seqs % 2 == 0, "red", "blue")
    props = pa.array([[("color", c)] for c in colors], pa.map_(pa.string(), pa.string()))
    return pa.RecordBatch.from_arrays([as_binary(bodies_of(seqs)), props],
                                      names=["body", "application_properties"])


def red(batch: pa.RecordBatch) -> Any:
    color = pc.map_lookup(batch.column("application_properties"), pa.scalar("color"),
                          "first")
    return pc.fill_null(pc.equal(color, "red"), False)


class Feeder:
    """Publishes 0..N-1 to a cell's stream(s) with named producers (partition
    ``seq % PARTITIONS`` for several), half at once and half from the
    fault on, then a sentinel to each; ``confirmed`` tracks the confirms."""

    def __init__(self, run: Run, streams: list[str], *, filtered: bool = False,
                 paced: bool = True) -> None:
        self.run, self.streams, self.filtered, self.paced = run, streams, filtered, paced
        self.confirmed = np.zeros(N, bool)
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._feed, daemon=True,
                                       name=f"feeder-{run.tag}")

    def start(self) -> Feeder:
        self.thread.start()
        return self

    def _feed(self) -> None:
        try:
            with self.run.connect() as client:
                producers = self._producers(client)
                try:
                    self._publish(producers, 0, N // 2, pace=0.0)
                    self.run.round.began.wait(MIDWAY_WAIT + 5)
                    self._publish(producers, N // 2, N,
                                  pace=SECOND_HALF / (N / 2 / BATCH) if self.paced else 0.0)
                    for p in producers:
                        p.flush(timeout=AFTER_FAULT)
                    end = np.array([SENTINEL])
                    for p in producers:
                        p.send_batch(filter_batch(end) if self.filtered
                                     else as_binary(bodies_of(end)))
                        p.flush(timeout=AFTER_FAULT)
                finally:
                    for p in producers:
                        with contextlib.suppress(pystream.StreamError):
                            p.close(timeout=5)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _producers(self, client: pystream.Client) -> list[Any]:
        """The feeder's producers; made again if the connection went while
        they were declared (another fault test on the shared broker): the
        feeder is no cell, it must not fail one."""
        options: dict[str, Any] = {"filter_value": "color"} if self.filtered else {}
        for attempt in range(5):
            producers = []
            try:
                for s in self.streams:
                    producers.append(client.producer(s, name=f"{s}-feeder", **options))
                return producers
            except (pystream.ConnectionLost, pystream.ConnectionClosed):
                for p in producers:
                    with contextlib.suppress(pystream.StreamError):
                        p.close(timeout=5)
                if attempt == 4:
                    raise
                time.sleep(1)
        raise AssertionError("unreachable")

    def _publish(self, producers: list[Any], lo: int, hi: int, pace: float) -> None:
        for first in range(lo, hi, BATCH):
            seqs = np.arange(first, min(first + BATCH, hi))
            parts = seqs % len(producers)
            for i, p in enumerate(producers):
                mine = seqs[parts == i]
                if len(mine):
                    batch = filter_batch(mine) if self.filtered else as_binary(bodies_of(mine))
                    p.send_batch(batch).add_done_callback(
                        lambda f, mine=mine: self._confirm(f, mine))
            if pace:
                time.sleep(pace)

    def _confirm(self, future: Any, seqs: np.ndarray) -> None:
        if future.exception() is None:
            self.confirmed[seqs] = True


def prefill(client: pystream.Client, stream: str, *, filtered: bool,
            sentinel: bool) -> np.ndarray:
    """N records in chunks of about 100 (each batch confirmed before the
    next), so that a range read needs many chunks; the confirmed mask."""
    confirmed = np.zeros(N, bool)
    options: dict[str, Any] = {"filter_value": "color"} if filtered else {}
    with client.producer(stream, **options) as p:
        for first in range(0, N, 100):
            seqs = np.arange(first, min(first + 100, N))
            p.send_batch(filter_batch(seqs) if filtered
                         else as_binary(bodies_of(seqs))).result(30)
            confirmed[seqs] = True
        if sentinel:
            end = np.array([SENTINEL])
            p.send_batch(filter_batch(end) if filtered else as_binary(bodies_of(end))).result(30)
    return confirmed


def read_back(run: Run, client: pystream.Client, super_stream: str | None = None) -> None:
    """After a writer cell: a sentinel after its records, and everything up
    to it read into the run's checker (per partition for a super stream)."""
    streams = client.partitions(super_stream) if super_stream else run.streams
    for s in streams:
        with client.producer(s) as p:
            p.send_batch(as_binary(bodies_of(np.array([SENTINEL])))).result(AFTER_FAULT)
    run.sentinels_wanted = len(streams)
    deadline = time.monotonic() + 60
    with client.consumer(None if super_stream else streams[0], offset="first",
                         super_stream=super_stream) as consumer:
        while len(run.sentinels) < len(streams) and time.monotonic() < deadline:
            for batch in consumer.batches(timeout=0.5):
                key = (batch.schema.metadata or {}).get(b"stream", b"").decode()
                run.take(batch.column("body"), None if super_stream else
                         batch.column("offset").to_numpy(), key)
                if len(run.sentinels) >= len(streams):
                    break


# --- the reading cells (in this process) --------------------------------------------


def cell_consumer(run: Run) -> None:
    stream, feeder = fed_stream(run, contiguous=True)
    with run.connect() as client:
        while not run.finished():
            try:
                with client.consumer(stream, offset="first", name=run.tag) as consumer:
                    while not run.finished():
                        table = consumer.read(1000, timeout=0.5)
                        run.process(table.column("body"), table.column("offset").to_numpy())
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")
        feeder_result(run, feeder)


def fed_stream(run: Run, contiguous: bool) -> tuple[str, Feeder]:
    """A stream of the cell's own, its feeder started, the checker ready."""
    with run.connect() as client:
        stream = run.stream(client)
    feeder = Feeder(run, [stream]).start()
    run.checker(contiguous=contiguous)
    run.expected = feeder.confirmed  # filled as confirms come
    return stream, feeder


def feeder_result(run: Run, feeder: Feeder) -> None:
    """Once the feeder is done: what the reader must have read."""
    feeder.done.wait(AFTER_FAULT)
    run.expected = feeder.confirmed & ~run.excluded
    if feeder.error is not None:
        run.verdict_hint = f"the feeding producer failed: {describe(feeder.error)}"


def cell_aio(run: Run) -> None:
    stream, feeder = fed_stream(run, contiguous=True)
    asyncio.run(_aio(run, stream))
    feeder_result(run, feeder)


async def _aio(run: Run, stream: str) -> None:
    client = await aio.connect(URI, **run.options)
    try:
        while not run.finished():
            consumer = await client.consumer(stream, offset="first", name=run.tag)
            try:
                # async with, as the docs say: leaving it with an exception
                # stores only what was processed (a close() in a finally
                # cannot see the exception).
                async with consumer:
                    if run.fault == "cancel":
                        await _cancelled_reads(run, consumer)
                        return
                    while not run.finished():
                        table = await consumer.read(1000, timeout=0.5)
                        run.process(table.column("body"), table.column("offset").to_numpy())
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")
    finally:
        await client.close()


async def _cancelled_reads(run: Run, consumer: aio.AsyncConsumer) -> None:
    """Each read in a task of its own, cancelled if it has not returned
    within 20-300 ms; a cancelled read must raise CancelledError and lose
    nothing (the next read gets its records)."""
    async def one_read() -> None:
        table = await consumer.read(1000, timeout=0.5)
        run.take(table.column("body"), table.column("offset").to_numpy())

    cancels = swallowed = 0
    while not run.finished() and cancels + swallowed < CANCELS:
        task = asyncio.ensure_future(one_read())
        done, _ = await asyncio.wait([task], timeout=random.uniform(0.02, 0.3))
        if task in done:
            task.result()
            continue
        task.cancel()
        try:
            await task
            swallowed += 1  # the read returned as if never cancelled
        except asyncio.CancelledError:
            cancels += 1
    idle_since = time.monotonic()
    while not run.finished() and time.monotonic() - idle_since < 5:
        table = await consumer.read(1000, timeout=0.5)
        run.take(table.column("body"), table.column("offset").to_numpy())
        if table.num_rows:
            idle_since = time.monotonic()
    run.cell.events.append(f"{cancels} reads cancelled")
    if swallowed:
        run.verdict_hint = (f"{swallowed} of {cancels + swallowed} cancellations "
                            f"were swallowed: the read returned instead of raising "
                            f"CancelledError")


def cell_range(run: Run) -> None:
    from pystream.ranges import plan_ranges, read_range
    from pystream.spark.datasource import BATCH_ROWS

    filtered = run.path == "range-filtered"
    with run.connect() as client:
        stream = run.stream(client)
        confirmed = prefill(client, stream, filtered=filtered, sentinel=False)
    if filtered:
        run.excluded, run.half = np.arange(N) % 2 == 1, N // 4
    run.expected = confirmed & ~run.excluded
    (r,) = plan_ranges(URI, [stream], connection_options=run.options)
    # Spark's options, but a credit budget of 256 KiB (not 64 MiB): the read
    # holds a few thousand records ahead, as a range many times the budget
    # would, so the rest must come from the broker after the fault.
    options: dict[str, Any] = dict(
        body="binary", amqp=True, max_batch_rows=BATCH_ROWS,
        credit=pystream.Credit.adaptive(max_buffered_bytes=256 << 10, until=r.end))
    if filtered:
        options.update(columns=["application_properties"],
                       filter=pystream.Filter(["red"], post_filter=red))
    held = False
    for _attempt in range(4):  # Spark's task attempts
        check = run.checker(contiguous=not filtered)
        batches = iter(read_range(URI, stream, r.start, r.end,
                                  connection_options=run.options, **options))
        try:
            for batch in batches:
                run.process(batch.column("body"), batch.column("offset").to_numpy())
                if run.past_half() and not held:
                    # Half the range is still to come, more than the
                    # credit lets the broker send ahead: held until the
                    # fault is in effect, the read then needs the broker
                    # while it is away (or just back).
                    held = True
                    run.midway()
                    run.round.ended.wait(HOLD)
            got = check.consumed
            if got < run.expected.sum():
                run.verdict_hint = (f"short read without an error: {got} rows of "
                                    f"{int(run.expected.sum())} (range {r.start}-{r.end})")
            return
        except (AppError, pystream.StreamError) as exc:
            run.cell.events.append(f"{describe(exc)} (the range read again)")
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    run.verdict_hint = (f"the read raised on each of Spark's 4 task attempts, the "
                        f"first: {run.cell.events[0]}")


def cell_sac(run: Run) -> None:
    stream, feeder = fed_stream(run, contiguous=False)
    threads = [threading.Thread(target=_sac_member, args=(run, stream, who),
                                daemon=True) for who in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(MIDWAY_WAIT + PAUSE + 3 * AFTER_FAULT)
    feeder_result(run, feeder)


def _sac_member(run: Run, stream: str, who: str) -> None:
    with run.connect() as client:
        while not run.finished():
            try:
                with client.consumer(stream, offset="first", name=run.tag,
                                     single_active=True) as consumer:
                    while not run.finished():
                        table = consumer.read(1000, timeout=0.5)
                        run.process(table.column("body"), key=who)
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")


def cell_super(run: Run) -> None:
    with run.connect() as client:
        partitions = run.super_stream(client)
        feeder = Feeder(run, partitions).start()
        run.checker(contiguous=False)
        run.expected = feeder.confirmed
        run.sentinels_wanted = len(partitions)
        while not run.finished():
            try:
                with client.consumer(super_stream=run.tag, offset="first",
                                     name=run.tag) as consumer:
                    while not run.finished():
                        for batch in consumer.batches(timeout=0.5):
                            run.process(batch.column("body"),
                                        key=batch.schema.metadata[b"stream"].decode())
                            if run.finished():
                                break
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")
        feeder_result(run, feeder)


def cell_filtered(run: Run) -> None:
    def post_filter(batch: pa.RecordBatch) -> Any:
        if run.strikes(run.past_half()):
            raise AppError("the post filter failed")
        return red(batch)

    with run.connect() as client:
        stream = run.stream(client)
        run.excluded = np.arange(N) % 2 == 1
        run.half = N // 4
        feeder = Feeder(run, [stream], filtered=True).start()
        run.checker(contiguous=False)
        run.expected = feeder.confirmed & ~run.excluded
        with client.consumer(stream, offset="first", columns=["application_properties"],
                             filter=pystream.Filter(["red"], post_filter=post_filter),
                             ) as consumer:
            while not run.finished():
                try:
                    table = consumer.read(1000, timeout=0.5)
                except AppError as exc:
                    # The rows of a read that raised go back (docs/consuming.md).
                    run.cell.events.append(f"AppError: {exc} (read on)")
                    continue
                run.take(table.column("body"), table.column("offset").to_numpy())
        feeder_result(run, feeder)


# --- the writing cells (in this process) --------------------------------------------


def cell_producer(run: Run) -> None:
    with run.connect() as client:
        stream = run.stream(client)
        confirmed = np.zeros(N, bool)
        seq = 0
        while seq < N and not run.late():
            try:
                with client.producer(stream, name=run.tag) as producer:
                    # Resuming: some records again, which the broker drops.
                    last = producer.last_publishing_id
                    seq = max(0, last - OVERLAP) if last else 0
                    seq = publish_from(producer, seq, marker(confirmed), ids=True, run=run)
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (producer closed, opened again)")
        finish_writer(run, client, confirmed)


def publish_from(producer: Any, seq: int, confirmed: Callable[[int, int], Any], *,
                 ids: bool, run: Run | None = None) -> int:
    """Send ``seq``..N-1 (with publishing ids ``seq + 1``.. if ``ids``),
    ``confirmed(first, count)`` as confirms come, then wait for them all;
    returns N. A cell's (``run``) paces itself and fails half-way under the
    exception fault; a child's sends a batch every 10 ms. A cell's events
    name the first batches that failed, and how."""
    failed = itertools.count(1)

    def done(future: Any, first: int, n: int) -> None:
        exc = future.exception()
        if exc is None:
            confirmed(first, n)
        elif run is not None and next(failed) <= 3:
            run.cell.events.append(f"batch from {first} failed: {type(exc).__name__}: {exc}")

    if run is not None and seq:
        run.cell.events.append(f"publishing again from {seq}")
    while seq < N:
        if run is not None and run.strikes(seq >= N // 2):
            raise AppError("the application failed")
        n = min(BATCH, N - seq)
        batch = as_binary(bodies(seq, n))
        future = (producer.send_batch(batch, publishing_id=seq + 1) if ids
                  else producer.send_batch(batch))
        future.add_done_callback(functools.partial(done, first=seq, n=n))
        seq += n
        if run is not None:
            pace(run, seq)
        else:
            time.sleep(0.01)
    producer.flush(timeout=AFTER_FAULT)
    return seq


def marker(confirmed: np.ndarray) -> Callable[[int, int], None]:
    def mark(first: int, n: int) -> None:
        confirmed[first:first + n] = True
    return mark


def pace(run: Run, seq: int) -> None:
    """Writers: half at once, the fault, the rest over SECOND_HALF seconds."""
    if seq >= N // 2:
        run.midway()
        time.sleep(SECOND_HALF / (N / 2 / BATCH))


def finish_writer(run: Run, client: pystream.Client, confirmed: np.ndarray,
                  super_stream: str | None = None) -> None:
    run.expected = confirmed
    if not confirmed.all():
        run.verdict_hint = run.verdict_hint or f"{int((~confirmed).sum())} records never confirmed"
    run.checker(contiguous=super_stream is None)
    read_back(run, client, super_stream)


def cell_super_producer(run: Run) -> None:
    with run.connect() as client:
        run.super_stream(client)
        confirmed = np.zeros(N, bool)
        while not confirmed.all() and not run.late():
            try:
                with client.producer(super_stream=run.tag, route=route,
                                     name=run.tag) as producer:
                    # From the first record not confirmed: after a close
                    # (which flushed) nothing is sent twice.
                    publish_from(producer, int(np.argmin(confirmed)), marker(confirmed),
                                 ids=False, run=run)
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (producer closed, opened again)")
        finish_writer(run, client, confirmed, super_stream=run.tag)


def route(batch: pa.RecordBatch) -> np.ndarray:
    """Partition ``seq % PARTITIONS`` of each body."""
    seqs = rows_of(batch.column("body"))[:, :8].copy().view(np.uint64).ravel()
    return (seqs % PARTITIONS).astype(np.int64)


def sink_config(stream: str, codec: str, producer_name: str,
                client_options: dict[str, Any]) -> Any:
    """The sink's options as a Spark job would give them, parsed as it does.
    The task's client (``ranges.client_for``: one per broker in a Spark
    Python worker) is made first, with the cells' heartbeat, so that the
    pause outlasts it as it does the other cells'. A cell's own (its own
    ``passwordEnv``, unused beside the file): one Python worker per task."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from pystream import ranges
    from pystream.spark.options import broker_ref, normalize
    from pystream.spark.sink import SinkConfig

    options = {"uri": URI_NO_PASSWORD, "passwordFile": str(password_file()),
               "passwordEnv": f"PYSTREAM_FAULTS_{producer_name.replace('-', '_')}",
               "stream": stream, "producerName": producer_name}
    if codec != "none":
        options["compression"] = codec
    broker = broker_ref(normalize(options))
    with ranges._clients_lock:
        ranges._clients[(broker, ())] = pystream.Client(broker.address(), **client_options)
    return SinkConfig.parse(options, StructType([StructField("body", BinaryType())]),
                            False)


def password_file() -> Path:
    path = Path(tempfile.gettempdir()) / f"{USER}.password"
    if not path.exists():
        path.write_text(PASSWORD)
    return path


def sink_batches(run: Run | None, first: int, fail_at: int | None,
                 progress: Callable[[int, int], None] | None = None,
                 ) -> Iterator[pa.RecordBatch]:
    """A task's rows, 500 at a time; the second half paced (after the fault)."""
    for seq in range(first, N, 500):
        if fail_at is not None and seq >= fail_at:
            raise AppError("the rows' upstream failed")
        n = min(500, N - seq)
        if progress is not None:
            progress(seq, n)
        yield pa.RecordBatch.from_arrays([as_binary(bodies(seq, n))], names=["body"])
        if seq + n >= N // 2:
            if run is not None:
                run.midway()
            time.sleep(SECOND_HALF / (N / 2 / 500))


def cell_sink(run: Run) -> None:
    from pystream.spark.sink import ID_BITS, _Task, _write

    codec = run.path.removeprefix("sink-")
    with run.connect() as client:
        stream = run.stream(client)
        config = sink_config(stream, codec, run.tag, run.options)
        fail_at = N // 2 if run.fault == "exception" else None
        done = False
        error = ""
        for _attempt in range(4):  # Spark's task attempts
            try:
                task = _Task(config, f"{run.tag}-0", 1 << ID_BITS, config.streams)
                commit = _write(task, sink_batches(run, 0, fail_at))
                run.cell.events.append(f"the task committed {commit.counts}, "
                                       f"{commit.skipped} rows skipped")
                done = True
                break
            except (AppError, pystream.StreamError) as exc:
                error = describe(exc)
                run.cell.events.append(f"{error} (the task retried)")
                fail_at = None
        if not done:
            run.verdict_hint = f"every attempt of the task failed, the last with {error}"
        # A task that returned had every confirm.
        finish_writer(run, client, np.full(N, done))


# --- child processes: kill and SIGINT -----------------------------------------------


def spawn(run: Run, role: str, out: Path, **spec: Any) -> subprocess.Popen[str]:
    spec = {"role": role, "tag": run.tag, "out": str(out), "fault": run.fault,
            "streams": run.streams, **spec}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults", "--child", json.dumps(spec)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def pairs(path: Path) -> np.ndarray:
    """The (key, value) pairs a child appended to ``path``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return np.zeros((0, 2), np.int64)
    return np.frombuffer(data[:len(data) // 16 * 16], np.int64).reshape(-1, 2)


def wait_for(what: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    """Up to ``timeout`` seconds for ``what``; the cell goes on either way,
    and its checks of what was read and written tell whether it failed."""
    try:
        wait_until(what, timeout, step)
    except AssertionError:
        return False
    return True


def reap(run: Run, child: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """Wait for a child; what it printed last (JSON), or its failure."""
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        run.verdict_hint = run.verdict_hint or "a child process did not finish in time"
        return {}
    if child.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM):
        run.verdict_hint = run.verdict_hint or (
            f"a child process failed (exit {child.returncode}): {err.strip()[-2000:]}"
            f" | its last output: {out.strip()[-300:]!r}")
    lines = out.strip().splitlines()
    try:
        return dict(json.loads(lines[-1])) if lines else {}
    except ValueError:
        return {}


def take_pairs(run: Run, files: list[Path], keyed: bool) -> None:
    """A killed or interrupted reader's records, in the order it wrote them."""
    for path in files:
        got = pairs(path)
        for key in np.unique(got[:, 0]) if keyed else [None]:
            seqs = got[:, 1] if key is None else got[got[:, 0] == key][:, 1]
            seqs = seqs[seqs != -1]  # the mark of a reader that started
            name = path.name if key is None else f"{path.name}-{key}"
            run.take(as_binary(bodies_of(seqs.astype(np.uint64))), key=name)


def cell_kill_reader(run: Run) -> None:
    """A named consumer (or two single active ones, or a super stream's) in
    a child process, killed half-way and started again."""
    role = {"consumer": "consume", "super": "super", "sac": "consume"}[run.path]
    with run.connect() as client:
        if run.path == "super":
            _fill_partitions(client, run.super_stream(client))
            run.expected = np.ones(N, bool)
        else:
            stream = run.stream(client)
            run.expected = prefill(client, stream, filtered=False, sentinel=True)
    run.checker(contiguous=False)
    out = [run.workdir / f"{run.tag}-{i}.bin" for i in range(3)]
    spec: dict[str, Any] = {"single_active": run.path == "sac", "super": run.path == "super"}
    children = [spawn(run, role, out[0], paced=True, **spec)]
    if run.path == "sac":
        children.append(spawn(run, role, out[1], paced=True, **spec))
    read = lambda: sum(len(pairs(p)) for p in out)  # noqa: E731
    wait_for(lambda: read() >= N // 2 or all(c.poll() is not None for c in children), 60)
    run.halfway.set()
    # The one reading (of two single active consumers: the last to write).
    victim = max(range(len(children)), key=lambda i: (len(pairs(out[i])), -i))
    if run.path == "sac":
        sizes = [len(pairs(p)) for p in out[:2]]
        time.sleep(0.05)
        grew = [len(pairs(p)) - s for p, s in zip(out[:2], sizes, strict=True)]
        victim = int(np.argmax(grew)) if max(grew) > 0 else victim
    if children[victim].poll() is not None:
        run.verdict_hint = "the reader had finished before the kill: not tested"
    children[victim].kill()
    reap(run, children[victim], 30)
    children[victim] = spawn(run, role, out[2], paced=False, **spec)
    if run.path == "sac":
        # The inactive one never sees the end: stop both once one did.
        wait_for(lambda: any((pairs(p)[:, 1] == SENTINEL).any() for p in out), 120, 0.1)
        for c in children:
            c.terminate()
    for c in children:
        reap(run, c, 120)
    take_pairs(run, out, keyed=run.path == "super")
    run.sentinels_wanted = len(run.sentinels)  # counted in take; judged by losses


def _fill_partitions(client: pystream.Client, partitions: list[str]) -> None:
    """Partition i gets the numbers ``seq % PARTITIONS == i``, then a sentinel."""
    for i, s in enumerate(partitions):
        with client.producer(s) as p:
            seqs = np.arange(i, N, PARTITIONS)
            for first in range(0, len(seqs), 100):
                p.send_batch(as_binary(bodies_of(seqs[first:first + 100]))).result(30)
            p.send_batch(as_binary(bodies_of(np.array([SENTINEL])))).result(30)


def cell_kill_writer(run: Run) -> None:
    """A named producer (a super stream's, a sink task) in a child process,
    killed half-way and started again."""
    with run.connect() as client:
        super_stream = None
        if run.path == "super-producer":
            run.super_stream(client)
            super_stream = run.tag
        else:
            run.stream(client)
        role = "sink" if run.path.startswith("sink-") else run.path
        out = [run.workdir / f"{run.tag}-{i}.bin" for i in range(2)]
        codec = run.path.removeprefix("sink-")
        child = spawn(run, role, out[0], codec=codec, super_stream=super_stream)
        sent = lambda: int(pairs(out[0])[:, 1].sum())  # noqa: E731
        wait_for(lambda: sent() >= N // 2 or child.poll() is not None, 60)
        run.halfway.set()
        if child.poll() is not None:
            run.verdict_hint = "the writer had finished before the kill: not tested"
        child.kill()
        reap(run, child, 30)
        child = spawn(run, role, out[1], codec=codec, super_stream=super_stream,
                      confirmed_file=str(out[0]))
        result = reap(run, child, 120)
        confirmed = np.zeros(N, bool)
        for path in out:
            for first, n in pairs(path):
                confirmed[first:first + n] = True
        if not result.get("done"):
            run.verdict_hint = run.verdict_hint or "the restarted writer did not finish"
        if run.path.startswith("sink-"):
            confirmed[:] = bool(result.get("done"))  # the retried task confirmed all
        finish_writer(run, client, confirmed, super_stream)


def cell_interrupted(run: Run) -> None:
    """A blocking reader in a child process, sent SIGINT again and again
    while the records come; it catches KeyboardInterrupt and reads on."""
    with run.connect() as client:
        if run.path == "super":
            streams = run.super_stream(client)
            run.sentinels_wanted = len(streams)
        else:
            streams = [run.stream(client)]
    filtered = run.path == "filtered"
    if filtered:
        run.excluded = np.arange(N) % 2 == 1
    out = run.workdir / f"{run.tag}.bin"
    child = spawn(run, "interrupted", out, super=run.path == "super", filtered=filtered,
                  partitions=len(streams))
    wait_for(lambda: len(pairs(out)) > 0 or child.poll() is not None, 60)
    feeder = Feeder(run, streams, filtered=filtered).start()
    sent = 0
    def reading() -> bool:
        return (not feeder.done.is_set() and child.poll() is None
                and (pairs(out)[:, 1] == SENTINEL).sum() < len(streams))

    # Looked at again right before each signal: one sent once the child has
    # read to the end would find it exiting, past the handler it reads
    # with (the interpreter's end restores SIGINT's default: death).
    while reading():
        time.sleep(random.uniform(0.05, 0.25))
        if not reading():
            break
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGINT)
            sent += 1
    result = reap(run, child, AFTER_FAULT)
    run.cell.events.append(f"{sent} SIGINT sent, {result.get('interrupts', '?')} "
                           f"KeyboardInterrupt caught")
    run.halfway.set()
    run.checker(contiguous=not filtered and run.path != "super")
    take_pairs(run, [out], keyed=run.path == "super")
    run.sentinels_wanted = len(run.sentinels)
    feeder_result(run, feeder)
    if result.get("sentinels", 0) < len(streams):
        run.verdict_hint = run.verdict_hint or "the reader never reached the end"


def cell_interrupted_producer(run: Run) -> None:
    """A named producer in a child process, sent SIGINT again and again
    while it sends; it catches each KeyboardInterrupt and goes on as
    docs/producing.md says. A broker fault strikes once it is half-way."""
    super_stream = run.tag if run.path.startswith("super-producer") else None
    with run.connect() as client:
        if super_stream is None:
            run.stream(client)
        else:
            run.super_stream(client)
        out = run.workdir / f"{run.tag}.bin"
        child = spawn(run, "interrupted-producer", out, super_stream=super_stream)
        wait_for(lambda: len(pairs(out)) > 0 or child.poll() is not None, 60)
        confirmed = lambda: int(pairs(out)[:, 1].sum())  # noqa: E731
        sent = 0
        deadline = time.monotonic() + MIDWAY_WAIT + PAUSE + AFTER_FAULT
        while child.poll() is None and time.monotonic() < deadline:
            if not run.halfway.is_set() and confirmed() >= N // 2:
                run.halfway.set()
            time.sleep(random.uniform(0.001, 0.01))
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGINT)
                sent += 1
        run.halfway.set()
        result = reap(run, child, AFTER_FAULT)
        run.cell.events.append(f"{sent} SIGINT sent, {result.get('interrupts', '?')} "
                               f"KeyboardInterrupt caught in the producer's calls, "
                               f"{result.get('recoveries', '?')} recoveries")
        if not result.get("interrupts"):
            run.verdict_hint = run.verdict_hint or "no interrupt landed: not tested"
        confirmed = np.zeros(N, bool)
        for first, n in pairs(out):
            if first >= 0:
                confirmed[first:first + n] = True
        if not result.get("done"):
            run.verdict_hint = run.verdict_hint or "the producer did not finish"
        finish_writer(run, client, confirmed, super_stream)


# --- the children's side ------------------------------------------------------------


def child_main(spec: dict[str, Any]) -> int:
    out = os.open(spec["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(keys: Any, values: Any) -> None:
        data = np.stack([np.asarray(keys, np.int64), np.asarray(values, np.int64)], axis=1)
        os.write(out, data.tobytes())

    role = spec["role"]
    with pystream.connect(URI, **client_options(spec["fault"])) as client:
        if role in ("consume", "super"):
            return _child_consume(client, spec, write)
        if role == "interrupted":
            return _child_interrupted(client, spec, write)
        if role == "producer":
            return _child_produce(client, spec, write)
        if role == "interrupted-producer" and spec.get("super_stream"):
            return _child_interrupted_super_produce(client, spec, write)
        if role == "interrupted-producer":
            return _child_interrupted_produce(client, spec, write)
        if role == "super-producer":
            return _child_super_produce(client, spec, write)
        if role == "sink":
            return _child_sink(spec, write)
    raise ValueError(role)


def seqs_of(batch: Any) -> np.ndarray:
    return rows_of(batch.column("body"))[:, :8].copy().view(np.uint64).ravel().astype(np.int64)


def _child_consume(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    options: dict[str, Any] = {"name": spec["tag"]}
    if spec["super"]:
        options["super_stream"] = spec["tag"]
        stream = None
        ends_wanted = PARTITIONS
    else:
        stream = spec["streams"][0]
        options["single_active"] = spec["single_active"]
        ends_wanted = 1
    ends = 0
    with client.consumer(stream, offset="first", **options) as consumer:
        while ends < ends_wanted:
            for batch in consumer.batches(timeout=1.0):
                part = (batch.schema.metadata or {}).get(b"stream", b"-0").decode()
                seqs = seqs_of(batch)
                write(np.full(len(seqs), int(part.rsplit("-", 1)[1])), seqs)
                ends += int((seqs == SENTINEL).sum())
                if spec.get("paced"):
                    time.sleep(len(seqs) / N)  # a second for all
                if ends >= ends_wanted:
                    break
    print(json.dumps({"done": True}))
    return 0


def _child_interrupted(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    """Reads as docs/consuming.md says an application that is interrupted
    should: keep the result of a read before anything else, catch the
    KeyboardInterrupt, read on. A SIGINT interrupts the reads only (while
    the records are written, processed, it is counted and dropped)."""
    reading = [False]
    dropped = [0]

    def on_sigint(signum: int, frame: Any) -> None:
        if reading[0]:
            raise KeyboardInterrupt
        dropped[0] += 1

    signal.signal(signal.SIGINT, on_sigint)
    options: dict[str, Any] = {}
    if spec["filtered"]:
        options.update(columns=["application_properties"],
                       filter=pystream.Filter(["red"], post_filter=red))
    if spec["super"]:
        consumer = client.consumer(super_stream=spec["tag"], offset="first", **options)
    else:
        consumer = client.consumer(spec["streams"][0], offset="first", **options)
    interrupts = ends = 0
    write(np.zeros(1), np.array([-1]))  # started: the signals may come
    with consumer:
        while ends < spec["partitions"]:
            parts: list[Any] = []
            try:
                reading[0] = True
                if spec["super"]:
                    # A for loop binds the batch with no call in between;
                    # next(), a C call, could lose it to an interrupt.
                    for batch in consumer.batches(0.5):
                        parts.append(batch)
                        break
                else:
                    parts.append(consumer.read(500, timeout=0.5))
                reading[0] = False
            except KeyboardInterrupt:
                reading[0] = False
                interrupts += 1
            for part in parts:
                if part is None or not part.num_rows:
                    continue
                key = 0
                if spec["super"]:
                    key = int(part.schema.metadata[b"stream"].decode().rsplit("-", 1)[1])
                seqs = seqs_of(part)
                write(np.full(len(seqs), key), seqs)
                ends += int((seqs == SENTINEL).sum())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # through the exit too
    print(json.dumps({"done": True, "interrupts": interrupts, "sentinels": ends,
                      "outside_reads": dropped[0]}))
    return 0


def _child_produce(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    with client.producer(spec["streams"][0], name=spec["tag"]) as producer:
        last = producer.last_publishing_id
        seq = max(0, last - OVERLAP) if last else 0  # some again: the broker drops them
        publish_from(producer, seq, lambda s, n: write([s], [n]), ids=True)
    print(json.dumps({"done": True}))
    return 0


INTERRUPTED_BATCH = 50  # records per batch of the interrupted producer: more calls


def _child_interrupted_produce(client: pystream.Client, spec: dict[str, Any],
                               write: Any) -> int:
    """Sends as docs/producing.md says an interrupted application should:
    catch the KeyboardInterrupt, flush, and send again from what
    ``last_publishing_id`` has not reached. A SIGINT interrupts the
    producer's calls only (``send_batch``, ``flush``), one at a time as the
    promise says: one that comes before the last was handled (while it
    goes up through the producer) is counted and dropped. Each batch is
    flushed before the next, so that most signals land in a call."""
    armed = [False]
    dropped = [0]

    def on_sigint(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        dropped[0] += 1

    def confirmed(future: Any, first: int, n: int) -> None:
        if future.exception() is None:
            write([first], [n])

    signal.signal(signal.SIGINT, on_sigint)
    recoveries = _Recoveries()
    logging.getLogger("pystream").addHandler(recoveries)
    interrupts = 0
    write([-1], [0])  # started: the signals may come
    with client.producer(spec["streams"][0], name=spec["tag"]) as producer:
        seq, resync = 0, False
        while True:
            try:
                armed[0] = True
                if resync:
                    producer.flush(AFTER_FAULT)
                    seq, resync = producer.last_publishing_id, False
                if seq >= N:
                    producer.flush(AFTER_FAULT)
                    armed[0] = False
                    break
                n = min(INTERRUPTED_BATCH, N - seq)
                future = producer.send_batch(as_binary(bodies(seq, n)),
                                             publishing_id=seq + 1)
                seq += n
                future.add_done_callback(functools.partial(confirmed, first=seq - n, n=n))
                producer.flush(AFTER_FAULT)
                armed[0] = False
                if seq >= N // 2:  # the second half over SECOND_HALF: a fault strikes
                    time.sleep(SECOND_HALF / (N / 2 / INTERRUPTED_BATCH))
            except KeyboardInterrupt:
                armed[0] = False
                interrupts += 1
                resync = True
        # Every message the producer took is confirmed (flush returned),
        # those of futures an interrupt kept from the callbacks too.
        write([0], [producer.last_publishing_id])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # through the exit too
    print(json.dumps({"done": producer.last_publishing_id == N,
                      "interrupts": interrupts, "outside_calls": dropped[0],
                      "recoveries": len(recoveries.messages)}))
    return 0


def _child_interrupted_super_produce(client: pystream.Client, spec: dict[str, Any],
                                     write: Any) -> int:
    """A super stream producer's side of ``_child_interrupted_produce``, as
    docs/producing.md says (#dedup-producer-interrupt): the ids each
    partition gives a batch's share are taken before the first attempt;
    after an interrupt, flush, then send the same batch with the same ids,
    the partitions that stored their share dropping it. A batch counts as
    confirmed only through the done-callback of an attempt that returned,
    which flush waited for: nothing is assumed."""
    armed = [False]
    dropped = [0]

    def on_sigint(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        dropped[0] += 1

    def confirmed(future: Any, first: int, n: int) -> None:
        if future.exception() is None:
            write([first], [n])

    signal.signal(signal.SIGINT, on_sigint)
    recoveries = _Recoveries()
    logging.getLogger("pystream").addHandler(recoveries)
    interrupts = 0
    write([-1], [0])  # started: the signals may come
    with client.producer(super_stream=spec["super_stream"], route=route,
                         name=spec["tag"]) as producer:
        seq = 0
        while seq < N:
            n = min(INTERRUPTED_BATCH, N - seq)
            batch = as_binary(bodies(seq, n))
            ids: dict[str, int] | None = None
            again = False
            while True:
                try:
                    armed[0] = True
                    if again:
                        producer.flush(AFTER_FAULT)
                    if ids is None:  # nothing of this batch sent yet
                        ids = {p: producer.last_publishing_id(p) + 1
                               for p in producer.partitions}
                    future = producer.send_batch(batch, publishing_ids=ids)
                    future.add_done_callback(functools.partial(confirmed, first=seq, n=n))
                    producer.flush(AFTER_FAULT)
                    armed[0] = False
                    break
                except KeyboardInterrupt:
                    armed[0] = False
                    interrupts += 1
                    again = True
            seq += n
            if seq >= N // 2:  # the second half over SECOND_HALF
                time.sleep(SECOND_HALF / (N / 2 / INTERRUPTED_BATCH))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # through the exit too
    print(json.dumps({"done": True, "interrupts": interrupts,
                      "outside_calls": dropped[0],
                      "recoveries": len(recoveries.messages)}))
    return 0


def _child_super_produce(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    confirmed = np.zeros(N, bool)
    if spec.get("confirmed_file"):
        for first, n in pairs(Path(spec["confirmed_file"])):
            confirmed[first:first + n] = True
    with client.producer(super_stream=spec["super_stream"], route=route,
                         name=spec["tag"]) as producer:
        seq = int(np.argmin(confirmed)) if not confirmed.all() else N
        publish_from(producer, seq, lambda s, n: write([s], [n]), ids=False)
    print(json.dumps({"done": True}))
    return 0


def _child_sink(spec: dict[str, Any], write: Any) -> int:
    from pystream.spark.sink import ID_BITS, _Task, _write

    config = sink_config(spec["streams"][0], spec["codec"], spec["tag"],
                         client_options(spec["fault"]))
    task = _Task(config, f"{spec['tag']}-0", 1 << ID_BITS, config.streams)
    commit = _write(task, _paced(sink_batches(None, 0, None, lambda s, n: write([s], [n]))))
    print(json.dumps({"done": True, "counts": commit.counts, "skipped": commit.skipped}))
    return 0


def _paced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in batches:
        yield b
        time.sleep(0.02)


# --- the matrix ---------------------------------------------------------------------


READERS_IN_PROCESS: dict[str, Callable[[Run], None]] = {
    "consumer": cell_consumer, "aio": cell_aio, "range": cell_range,
    "range-filtered": cell_range, "sac": cell_sac, "super": cell_super,
    "filtered": cell_filtered, "producer": cell_producer,
    "super-producer": cell_super_producer, **dict.fromkeys(SINKS, cell_sink),
}


def runner(path: str, fault: str) -> Callable[[Run], None]:
    if fault == "kill":
        return cell_kill_writer if path in WRITERS else cell_kill_reader
    if path.endswith("-interrupted") or (fault == "cancel"
                                         and path in ("producer", "super-producer")):
        return cell_interrupted_producer
    if fault == "cancel" and path != "aio":
        return cell_interrupted
    return READERS_IN_PROCESS[path]


def describe(exc: BaseException) -> str:
    """The error, and the outermost call into pystream it came out of
    (where the library let it through)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/pystream/" in f.filename]
    where = f" (from {Path(frames[0].filename).name}:{frames[0].lineno} "\
            f"{frames[0].name}, raised in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:200]}{where}"


class _Recoveries(logging.Handler):
    """pystream's recovery warnings, by the stream they name."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " recovered from " in message:
            self.messages.append(message)


def ensure_user() -> None:
    try:
        run_broker("ctl", "modern", "add_user", USER, PASSWORD, timeout=120)
    except subprocess.CalledProcessError as exc:
        if "already exists" not in exc.stderr:
            raise
    run_broker("ctl", "modern", "set_permissions", "-p", "/", USER, ".*", ".*", ".*",
               timeout=120)


def run_round(fault: str, paths: list[str], workdir: Path) -> list[Cell]:
    if any(p in SINKS for p in paths):
        import pystream.spark.sink  # noqa: F401  # once, before the cells' threads
    round_ = Round(fault)
    cells: list[Cell] = []
    threads = []
    for path in paths:
        if (path, fault) in NOT_APPLICABLE:
            cells.append(Cell(path, fault, reason=NOT_APPLICABLE[(path, fault)]))
            continue
        run = Run(round_, path, fault, workdir)
        round_.runs.append(run)
        cells.append(run.cell)
        threads.append(threading.Thread(target=_guard, args=(run, runner(path, fault)),
                                        daemon=True, name=run.tag))
    recoveries = _Recoveries()
    logging.getLogger("pystream").addHandler(recoveries)
    started = time.monotonic()
    try:
        for t in threads:
            t.start()
        if fault in BROKER_FAULTS and round_.runs:
            round_.inject()
        round_.end()
        limit = started + MIDWAY_WAIT + PAUSE + 3 * AFTER_FAULT
        for t in threads:
            t.join(max(0.0, limit - time.monotonic()))
    finally:
        logging.getLogger("pystream").removeHandler(recoveries)
    for run, t in zip(round_.runs, threads, strict=True):
        run.cell.recoveries = sum(run.tag in m for m in recoveries.messages)
        if t.is_alive():
            run.verdict_hint = run.verdict_hint or "hung: still running at the round's end"
        judge(run, round_)
    _clean(round_)
    return cells


def _guard(run: Run, target: Callable[[Run], None]) -> None:
    try:
        target(run)
    except BaseException as exc:
        run.verdict_hint = run.verdict_hint or f"raised {describe(exc)}"
        log.debug("cell %s/%s:\n%s", run.path, run.fault, traceback.format_exc())
    finally:
        run.halfway.set()
        run.cell.seconds = round(time.monotonic() - run.started, 1)


def judge(run: Run, round_: Round) -> None:
    c = run.cell
    check = run.check
    c.expected = int(run.expected.sum())
    if round_.fault not in BROKER_FAULTS:
        # The application's faults strike past half-way by construction.
        c.faulted_midway = check is not None
    if check is not None:
        c.read = check.consumed
        c.lost = check.lost(run.expected)
        c.duplicates = check.duplicates()
        c.out_of_order = check.out_of_order
        c.body_mismatches = check.body_mismatches
        c.unexpected = check.foreign + int((check.seen[:N][run.excluded] > 0).sum())
    reasons = []
    if round_.fault_error:
        reasons.append(round_.fault_error)
    if run.verdict_hint:
        reasons.append(run.verdict_hint)
    if check is None:
        reasons.append("nothing was read")
    else:
        if c.lost:
            first = int(np.nonzero(run.expected & (check.seen[:N] == 0))[0][0])
            reasons.append(f"{c.lost} of {c.expected} confirmed records never read "
                           f"(the first: {first})")
        if c.duplicates and c.promise == "exactly-once":
            reasons.append(f"{c.duplicates} records read twice")
        if c.out_of_order and c.promise == "exactly-once":
            reasons.append(f"{c.out_of_order} records out of order")
        if c.body_mismatches:
            reasons.append(f"{c.body_mismatches} bodies altered")
        if c.unexpected:
            reasons.append(f"{c.unexpected} records that were not to be read")
        if c.expected == 0:
            reasons.append("no record was confirmed")
    if round_.fault in BROKER_FAULTS and not reasons:
        if not c.faulted_midway:
            reasons.append("the fault struck before the cell was half-way")
        if not c.recoveries and not c.events:
            reasons.append("no recovery was logged: the fault missed the cell")
    c.verdict = "fail" if reasons else "pass"
    c.reason = "; ".join(reasons)


def _clean(round_: Round) -> None:
    try:
        with pystream.connect(URI, **client_options(round_.fault)) as admin:
            for run in round_.runs:
                for s in run.super_streams:
                    with contextlib.suppress(pystream.StreamError):
                        admin.delete_super_stream(s, missing_ok=True)
                for s in run.streams:
                    with contextlib.suppress(pystream.StreamError):
                        admin.delete_stream(s, missing_ok=True)
    except pystream.StreamError as exc:
        log.warning("could not delete the round's streams: %s", exc)


@dataclass
class Matrix:
    cells: list[Cell]
    seconds: float
    rounds: dict[str, float]

    def cell(self, path: str, fault: str) -> Cell | None:
        """The cell, if it was run."""
        return next((c for c in self.cells if (c.path, c.fault) == (path, fault)), None)

    def failing(self) -> list[Cell]:
        return [c for c in self.cells if c.verdict == "fail"]

    def summary(self) -> str:
        lines = [f"fault matrix: {len(PATHS)} paths x {len(FAULTS)} faults in "
                 f"{self.seconds:.0f} s"]
        for c in self.cells:
            if (c.path, c.fault) in NOT_APPLICABLE:
                continue
            lines.append(f"  {c.path:15} {c.fault:9} {c.verdict:4} {c.promise:13} "
                         f"read {c.read}/{c.expected} lost {c.lost} dup {c.duplicates} "
                         f"recoveries {c.recoveries} {c.seconds:5.1f} s"
                         + (f"  {c.reason}" if c.reason else ""))
        return "\n".join(lines)


def run_matrix(paths: list[str] | None = None, faults: list[str] | None = None) -> Matrix:
    """Every cell, a round per fault; the modern broker is up at the end."""
    paths = paths or list(PATHS)
    ensure_user()
    cells: list[Cell] = []
    rounds: dict[str, float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pystream-faults-") as tmp:
        for fault in faults or FAULTS:
            began = time.monotonic()
            cells += run_round(fault, paths, Path(tmp))
            rounds[fault] = round(time.monotonic() - began, 1)
            log.info("round %s: %.0f s", fault, rounds[fault])
    return Matrix(cells, round(time.monotonic() - started, 1), rounds)


def store(matrix: Matrix, path: str) -> None:
    """The cells, with commit, versions and machine (tools/results.py)."""
    info = results.machine(MODERN_URI)
    results.write_results(path, info, {
        "records_per_cell": N, "heartbeat": HEARTBEAT, "pause": PAUSE,
        "paths": PATHS, "faults": list(FAULTS), "seconds": matrix.seconds,
        "rounds": matrix.rounds, "cells": [asdict(c) for c in matrix.cells]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", help="comma-separated (default: all)")
    parser.add_argument("--faults", help="comma-separated (default: all)")
    parser.add_argument("--json", help="write the results there")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pystream").setLevel(logging.WARNING)
    with registered_session():
        matrix = run_matrix(args.paths.split(",") if args.paths else None,
                            args.faults.split(",") if args.faults else None)
    print(matrix.summary())
    if args.json:
        store(matrix, args.json)
    return 1 if matrix.failing() else 0


if __name__ == "__main__":
    sys.exit(main())
