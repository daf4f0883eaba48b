"""The fault matrix's shared run state (tests/faults.py): the records,
timings and credentials of every cell, the paths and faults, the cells
that do not apply or promise at least once, a cell's verdict (``Cell``),
a round and a cell while they run (``Round``, ``Run``), and what the
cells and the children share: the filtered cells' colors, the errors'
descriptions, pystream's recovery warnings, the child processes."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import pystream

from . import brokers
from .conftest import MODERN_URI, ROOT, run_broker
from .soak import Checker, as_binary, bodies_of, rows_of
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
HOLD = 3.0            # seconds a range read waits past a broker fault's start
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
        # The broker fault is in effect: paused, its connections closed,
        # or restarted (set at once for the application's faults).
        self.struck = threading.Event()
        self.runs: list[Run] = []
        self.fault_error: str | None = None
        self.ended_at = float("inf")
        if fault not in BROKER_FAULTS:
            self.began.set()
            self.struck.set()
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
                self.struck.set()  # paused; the others strike as they return
                try:
                    time.sleep(PAUSE)
                finally:
                    run_broker("resume", "modern")
            else:
                run_broker("restart", "modern")
        except subprocess.CalledProcessError as exc:
            self.fault_error = f"scripts/broker failed: {exc.stderr[-500:]}"
        finally:
            self.struck.set()
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


# --- the colors of the filtered cells' records --------------------------------------


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


# --- errors, and pystream's recovery warnings ---------------------------------------


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


# --- child processes (their side: tests/fault_children.py) --------------------------


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
