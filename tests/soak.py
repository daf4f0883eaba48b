"""Soak: a producer and a consumer at a fixed rate on the modern broker while
the broker is hurt on a schedule; afterwards every confirmed record must
have been consumed exactly once and in order.

Faults, in turn, one every ``--fault-every`` seconds:
  close    the broker closes every client connection (rabbitmqctl)
  pause    the node is stopped (SIGSTOP) past the heartbeat, then resumed
  restart  the node is stopped and started again

Run directly (``make soak`` runs 10 minutes) or through tests/test_soak.py::

    .venv/bin/python -m tests.soak --seconds 600 --rate 5000
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import sys
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa

import pystream

from .conftest import MODERN_URI, run_broker

BODY = 64          # bytes: an 8-byte sequence number, then a pattern of it
HEARTBEAT = 2      # seconds; the client declares a silent peer lost after 2
PAUSE = 3 * HEARTBEAT
FAULTS = ("close", "pause", "restart")
TICK = 0.01        # the producer sends what is due every 10 ms


def bodies(first: int, count: int) -> np.ndarray:
    """Rows of BODY bytes for sequence numbers first .. first+count-1."""
    return bodies_of(np.arange(first, first + count, dtype=np.uint64))


def bodies_of(seqs: np.ndarray) -> np.ndarray:
    """Rows of BODY bytes for the sequence numbers ``seqs``: each its number
    (8 bytes, little-endian), then a pattern of it."""
    seqs = np.asarray(seqs, dtype=np.uint64)
    rows = np.empty((len(seqs), BODY), np.uint8)
    rows[:, :8] = seqs.view(np.uint8).reshape(len(seqs), 8)
    rows[:, 8:] = (seqs % 251).astype(np.uint8)[:, None]
    return rows


def as_binary(rows: np.ndarray) -> pa.Array:
    count = len(rows)
    offsets = np.arange(0, (count + 1) * BODY, BODY, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), count, [
        None, pa.py_buffer(offsets), pa.py_buffer(rows.tobytes())])


def rows_of(column: pa.Array) -> np.ndarray:
    """The bodies of a binary column as rows, checking each is BODY long."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    column = column.cast(pa.binary())  # from views into the receive buffer
    count = len(column)
    _, offset_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offset_buffer, np.int32)[column.offset:column.offset + count + 1]
    lengths = np.diff(offsets)
    if count and (lengths != BODY).any():
        raise AssertionError(f"a body of {lengths[lengths != BODY][0]} bytes")
    data = np.frombuffer(data_buffer, np.uint8)
    return data[offsets[:-1, None] + np.arange(BODY)]


class Checker:
    """What a reader got, against the sequence numbers published: bodies
    compared byte for byte, order, duplicates and (given the confirmed ones)
    losses. Sequence numbers are checked for order per ``key`` (a partition,
    a consumer); ``contiguous``: each must follow the previous by one (one
    reader of everything), else only increase (a partition, a filter)."""

    def __init__(self, capacity: int, contiguous: bool = True) -> None:
        self.seen = np.zeros(capacity, np.uint8)
        self.contiguous = contiguous
        self.expected_next: dict[str, int] = {}
        self.out_of_order = 0
        self.body_mismatches = 0
        self.consumed = 0
        self.foreign = 0          # sequence numbers never published
        self.crc = 0
        self.first_offset: int | None = None
        self.last_offset = -1

    def add(self, rows: np.ndarray, offsets: np.ndarray | None = None,
            key: str = "") -> np.ndarray:
        """Count a batch's bodies (rows of BODY bytes, see ``rows_of``) and,
        for one stream, their offsets; returns their sequence numbers."""
        if not len(rows):
            return np.zeros(0, np.int64)
        seqs = rows[:, :8].copy().view(np.uint64).ravel().astype(np.int64)
        if offsets is not None and len(offsets):
            if self.first_offset is None:
                self.first_offset = int(offsets[0])
            self.out_of_order += int((np.diff(offsets) <= 0).sum())
            self.out_of_order += int(offsets[0] <= self.last_offset)
            self.last_offset = int(offsets[-1])
        step = np.diff(seqs)
        nxt = self.expected_next.get(key, 0)
        if self.contiguous:
            self.out_of_order += int((step != 1).sum()) + int(seqs[0] != nxt)
        else:
            self.out_of_order += int((step <= 0).sum()) + int(seqs[0] < nxt)
        self.expected_next[key] = int(seqs[-1]) + 1
        expected = bodies_of(seqs)  # each body as its number makes it
        if not np.array_equal(rows, expected):
            self.body_mismatches += int((rows != expected).any(axis=1).sum())
        self.crc = zlib.crc32(rows.tobytes(), self.crc)
        inside = (seqs >= 0) & (seqs < len(self.seen))
        self.foreign += int((~inside).sum())
        np.add.at(self.seen, seqs[inside], 1)
        self.consumed += len(seqs)
        return seqs

    def next_seq(self, key: str = "") -> int:
        """The sequence number after the last one read (for ``key``)."""
        return self.expected_next.get(key, 0)

    def duplicates(self) -> int:
        """Sequence numbers read more than once."""
        return int((self.seen > 1).sum())

    def lost(self, confirmed: np.ndarray) -> int:
        """Confirmed sequence numbers (a mask from 0) never read."""
        return int((confirmed & (self.seen[:len(confirmed)] == 0)).sum())


@dataclass
class Fault:
    kind: str
    at: float                        # seconds since the start
    took: float                      # seconds the fault itself lasted
    # The longest time without a confirm / a record received after it began.
    producer_recovery: float | None = None
    consumer_recovery: float | None = None
    # Reconnections pystream logged in that time: proof the fault hit both.
    producer_reconnections: int = 0
    consumer_resubscriptions: int = 0


@dataclass
class SoakReport:
    seconds: float
    rate: int
    published: int = 0
    confirmed: int = 0
    consumed: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    lost: int = 0
    body_mismatches: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    crc32_expected: int = 0
    crc32_consumed: int = 0
    faults: list[Fault] = field(default_factory=list)

    def stalls(self, kind: str, side: str) -> str:
        times = [getattr(f, f"{side}_recovery") for f in self.faults
                 if f.kind == kind and getattr(f, f"{side}_recovery") is not None]
        if not times:
            return "-"
        return f"median {statistics.median(times):.2f} s, max {max(times):.2f} s"

    def summary(self) -> str:
        lines = [
            f"soak: {self.seconds:.0f} s at {self.rate} msg/s, "
            f"{len(self.faults)} faults",
            f"published {self.published}, confirmed {self.confirmed}, "
            f"consumed {self.consumed} (offsets {self.first_offset}.."
            f"{self.last_offset})",
            f"lost {self.lost}, duplicates {self.duplicates}, out of order "
            f"{self.out_of_order}, bodies differing {self.body_mismatches}, "
            f"crc32 {self.crc32_consumed:08x} (expected {self.crc32_expected:08x})",
        ]
        for kind in FAULTS:
            faults = [f for f in self.faults if f.kind == kind]
            if faults:
                lines.append(
                    f"  {kind:8} x{len(faults)}: longest stall: producer "
                    f"{self.stalls(kind, 'producer')}; consumer "
                    f"{self.stalls(kind, 'consumer')}; recoveries logged: "
                    f"producer {sum(f.producer_reconnections for f in faults)}, "
                    f"consumer {sum(f.consumer_resubscriptions for f in faults)}")
        return "\n".join(lines)


class Soak:
    def __init__(self, seconds: float, rate: int, fault_every: float,
                 uri: str = MODERN_URI) -> None:
        self.seconds, self.rate, self.fault_every = seconds, rate, fault_every
        self.uri = uri
        self.stream = f"pystream-soak-{uuid.uuid4().hex[:8]}"
        self.start = 0.0
        self.producing = threading.Event()
        self.produced = threading.Event()   # every send confirmed (or failed)
        self.errors: list[BaseException] = []
        self.failed = threading.Event()
        # Times of confirms, of batches received and of recoveries logged.
        self.recovered_at: list[tuple[float, str]] = []
        self.confirmed_at: list[float] = []
        self.received_at: list[float] = []
        self.confirmed = np.zeros(int(seconds * rate * 1.2) + 1024, bool)
        self.published = 0

    def now(self) -> float:
        return time.monotonic() - self.start

    # --- the three actors ---------------------------------------------------

    def produce(self, client: pystream.Client) -> None:
        with client.producer(self.stream, name=f"{self.stream}-producer",
                             recovery_timeout=120) as producer:
            seq = 0
            next_tick = time.monotonic()
            while self.producing.is_set():
                due = int((time.monotonic() - self.start) * self.rate) - seq
                if due > 0:
                    first = seq
                    future = producer.send_batch(as_binary(bodies(first, due)))
                    future.add_done_callback(
                        lambda f, first=first, n=due: self.on_confirm(f, first, n))
                    seq += due
                    self.published = seq
                next_tick += TICK
                time.sleep(max(0.0, next_tick - time.monotonic()))
            producer.flush(timeout=180)
        self.produced.set()

    def on_confirm(self, future, first: int, count: int) -> None:
        if future.exception() is None:
            self.confirmed[first:first + count] = True
            self.confirmed_at.append(self.now())

    def consume(self, client: pystream.Client, report: SoakReport) -> None:
        check = Checker(len(self.confirmed))
        with client.consumer(self.stream, offset="first",
                             recovery_timeout=120) as consumer:
            idle_since = None
            while True:
                table = consumer.read(100_000, timeout=0.5)
                if table.num_rows == 0:
                    if self.produced.is_set() and check.next_seq() >= self.published:
                        break
                    if not self.producing.is_set():  # done, or the producer failed
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > 60:
                            break
                    continue
                idle_since = None
                check.add(rows_of(table.column("body")), table.column("offset").to_numpy())
                self.received_at.append(self.now())
        report.first_offset, report.last_offset = check.first_offset, check.last_offset
        report.out_of_order, report.body_mismatches = check.out_of_order, check.body_mismatches
        report.consumed, report.crc32_consumed = check.consumed, check.crc
        confirmed = self.confirmed[:self.published]
        report.duplicates = check.duplicates()
        report.lost = check.lost(confirmed)
        report.confirmed = int(confirmed.sum())
        report.crc32_expected = zlib.crc32(bodies(0, self.published).tobytes())

    def inject(self, report: SoakReport) -> None:
        n = 0
        while True:
            at = (n + 1) * self.fault_every
            if at > self.seconds - self.fault_every / 2:
                return
            time.sleep(max(0.0, at - self.now()))
            kind = FAULTS[n % len(FAULTS)]
            began = self.now()
            if kind == "close":
                run_broker("ctl", "modern", "close_all_connections", "soak")
            elif kind == "pause":
                run_broker("pause", "modern")
                time.sleep(PAUSE)
                run_broker("resume", "modern")
            else:
                run_broker("restart", "modern")
            report.faults.append(Fault(kind, began, self.now() - began))
            n += 1

    # --- the run ------------------------------------------------------------

    def run(self) -> SoakReport:
        report = SoakReport(self.seconds, self.rate)
        recoveries = _Recoveries(self)
        logging.getLogger("pystream").addHandler(recoveries)
        logging.getLogger("pystream").setLevel(logging.INFO)
        try:
            return self._run(report)
        finally:
            logging.getLogger("pystream").removeHandler(recoveries)

    def _run(self, report: SoakReport) -> SoakReport:
        options = dict(heartbeat=HEARTBEAT, connect_timeout=5, request_timeout=10)
        with pystream.connect(self.uri, **options) as admin:
            # exist_ok: a subclass may have made it to its liking (tests/partitions.py).
            admin.create_stream(self.stream, exist_ok=True)
        actors = []
        with pystream.connect(self.uri, **options) as producing, \
                pystream.connect(self.uri, **options) as consuming:
            self.start = time.monotonic()
            self.producing.set()
            for target, args in ((self.produce, (producing,)),
                                 (self.consume, (consuming, report)),
                                 (self.inject, (report,))):
                actors.append(threading.Thread(
                    target=self._guard, args=(target, *args), daemon=True))
                actors[-1].start()
            self.failed.wait(self.seconds)
            self.producing.clear()
            for actor in actors:
                actor.join(timeout=400)
        report.published = self.published
        self._recovery_times(report)
        self._delete_stream(options)
        if self.errors:
            raise self.errors[0]
        return report

    def _delete_stream(self, options: dict) -> None:
        with pystream.connect(self.uri, **options) as admin:
            admin.delete_stream(self.stream, missing_ok=True)

    def _guard(self, target, *args) -> None:
        try:
            target(*args)
        except BaseException as exc:
            self.errors.append(exc)
            self.failed.set()

    def _recovery_times(self, report: SoakReport) -> None:
        """For each fault, the longest pause in confirms (producer) and in
        records received (consumer) between its start and the next fault:
        how long the application saw nothing move."""
        for fault in report.faults:
            end = fault.at + self.fault_every
            fault.producer_recovery = _longest_gap(
                self.confirmed_at, fault.at, end)
            fault.consumer_recovery = _longest_gap(
                self.received_at, fault.at, end)
            logged = [who for t, who in self.recovered_at if fault.at <= t < end]
            fault.producer_reconnections = logged.count("producer")
            fault.consumer_resubscriptions = logged.count("consumer")


class _Recoveries(logging.Handler):
    """Notes when pystream reports a producer or consumer recovered."""

    def __init__(self, soak: Soak) -> None:
        super().__init__(logging.INFO)
        self.soak = soak

    def emit(self, record: logging.LogRecord) -> None:
        # One WARNING per recovery, on pystream.consumer or pystream.producer.
        who = record.name.rpartition(".")[2]
        if (who in ("consumer", "producer") and record.levelno == logging.WARNING
                and " recovered from " in record.getMessage()):
            self.soak.recovered_at.append((self.soak.now(), who))


def _longest_gap(times: list[float], start: float, end: float) -> float | None:
    """The longest time without an event in [start, end] (None: none came)."""
    inside = [start] + sorted(t for t in times if start < t <= end)
    if len(inside) < 2:
        return None
    return max(b - a for a, b in itertools.pairwise(inside))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=int, default=5000, help="messages per second")
    parser.add_argument("--fault-every", type=float, default=30)
    parser.add_argument("--json", help="write the report there")
    args = parser.parse_args(argv)
    report = Soak(args.seconds, args.rate, args.fault_every).run()
    print(report.summary())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(report), f, indent=1)
    ok = report.lost == report.duplicates == report.out_of_order == 0 \
        and report.body_mismatches == 0 and report.crc32_consumed == report.crc32_expected
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
