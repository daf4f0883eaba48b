"""An interrupt (a ``KeyboardInterrupt``, or whatever a signal handler
raises) that the application catches and reads on from loses and repeats
nothing, wherever in a read it lands (docs/consuming.md).

CPython runs signal handlers at the entry of a Python function (and the
resumption of a generator) and at the return of a C function called from
Python. These tests land an interrupt at each such point of a read in turn:
a profile hook raises ``KeyboardInterrupt`` at the n-th point of the call,
n sweeping up through the read until the call completes, then again on the
next one. Random SIGINTs (test_consumer_recovery.py, the fault matrix's
cancel cells) find a narrow window only now and then; this finds it every
time. The application's side of each call is the safe idiom the docs give:
the result is bound before anything else runs in its frame."""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import pystream

from .conftest import MODERN_URI, broker_ctl
from .faults import red  # the post filter of the fault matrix's filtered cells

pytestmark = pytest.mark.broker

N = 2400          # records per stream (per partition, for a super stream)
PUBLISH = 40      # records per publish: many small chunks
PARTITIONS = 3
# Many calls per stream, whatever was queued by the first: every sweep has
# calls left to interrupt.
BATCH_ROWS = 200


# The modules whose functions run as weakref callbacks (threading's WeakSet
# of threads, pyarrow's and the metrics' weak dictionaries).
WEAKREF_CALLBACKS = ("/_weakrefset.py", "/weakref.py")


class Collecting:
    """Whether the cyclic collector runs in this thread: from the first of
    ``gc.callbacks`` at its start to the last at its stop. What runs then
    (other libraries' gc callbacks, finalizers) is called by the collector,
    which ignores an exception there: no interrupt point of the code under
    test, and one the profile hook raises there only reaches the
    interpreter's machinery (the unraisable hook) in the middle of a
    collection."""

    def __init__(self) -> None:
        self.thread: int | None = None

    def arm(self) -> None:
        """Be the first and the last of ``gc.callbacks`` (others come and go)."""
        for cb in (self._first, self._last):
            if cb in gc.callbacks:
                gc.callbacks.remove(cb)
        gc.callbacks.insert(0, self._first)
        gc.callbacks.append(self._last)

    def _first(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.thread = threading.get_ident()

    def _last(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            self.thread = None

    def now(self) -> bool:
        return self.thread == threading.get_ident()


COLLECTING = Collecting()


class Interrupter:
    """Raises KeyboardInterrupt at the ``at``-th interrupt point of what
    runs while armed, outside this file's own frames."""

    def __init__(self) -> None:
        self.left = 0
        self.landed = 0
        self.points = 0  # of the last call that ran to its end
        self.where = ""  # the point the last interrupt landed at

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" and event != "c_return":
            return
        if frame.f_code.co_filename == __file__:
            return
        if frame.f_code.co_filename.endswith(WEAKREF_CALLBACKS):
            # A weakref's callback, run by whatever freed its referent: an
            # exception there is ignored, and one a profile hook raises
            # there leaves the interpreter raising TypeErrors of its own.
            return
        if COLLECTING.now():
            return  # run by the collector (see Collecting)
        self.left -= 1
        self.points += 1
        if self.left == 0:
            sys.setprofile(None)
            self.landed += 1
            code = frame.f_code
            self.where = f"{code.co_filename}:{frame.f_lineno} ({code.co_name}, {event})"
            raise KeyboardInterrupt

    def call(self, at: int, fn: Callable[[], Any]) -> Any:
        """``fn()``, interrupted at its ``at``-th point if it has as many
        (never with 0)."""
        self.left, self.points = at, 0
        COLLECTING.arm()
        sys.setprofile(self._hook)
        try:
            return fn()
        finally:
            sys.setprofile(None)


def sweep(call: Callable[[], bool], budget: int = 400) -> int:
    """Call ``call`` (True once it has read everything) until it is done:
    once whole (imports on first use are no read's points), then
    interrupted at its point 1, 2, 3, ... until one call completes, and
    so on for the next calls until ``budget`` interrupts have landed; how
    many did."""
    interrupter = Interrupter()
    done = interrupter.call(0, call)
    at = 1
    while not done:
        if interrupter.landed >= budget:
            at = 0  # never: read the rest whole
        try:
            done = interrupter.call(at, call)
        except KeyboardInterrupt:
            at += 1
            continue
        at = 1
    return interrupter.landed


# One rabbitmqctl call closes every connection of the vhost CLOSES times,
# CLOSE_MS apart, in the broker: rabbitmqctl itself takes a second to start.
CLOSES, CLOSE_MS = 5, 200
CLOSE_ALL = ("F = fun() -> rabbit_connection_tracking_handler:close_connections("
             "rabbit_connection_tracking:list(<<\"/\">>), \"interrupt sweep\", 0) end, "
             f"[begin F(), timer:sleep({CLOSE_MS}) end || _ <- lists:seq(1, {CLOSES})], ok.")


@contextlib.contextmanager
def faults(fault: str | None) -> Iterator[None]:
    """With ``fault="close"``: the broker closes every connection every
    CLOSE_MS while the sweep runs (from a thread of its own, which no
    interrupt reaches)."""
    if fault is None:
        yield
        return
    assert fault == "close"
    stop = threading.Event()

    def strike() -> None:
        while not stop.is_set():
            broker_ctl("modern", "eval", CLOSE_ALL)

    thread = threading.Thread(target=strike, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(180)


@pytest.fixture(scope="module")
def client() -> Iterator[pystream.Client]:
    # Python's own handler: PySpark's, left by an earlier test in this
    # process, would turn a SIGINT into a cancelled Spark job.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pystream.connect(MODERN_URI) as c:
            yield c
    finally:
        signal.signal(signal.SIGINT, previous)


def bodies(first: int, n: int) -> list[bytes]:
    return [f"{i:08d}".encode() for i in range(first, first + n)]


def publish(client: pystream.Client, stream: str, *, colored: bool = False) -> None:
    options: dict[str, Any] = {"batch_size": PUBLISH}
    if colored:
        options["filter_value"] = "color"
    with client.producer(stream, **options) as producer:
        for first in range(0, N, PUBLISH):
            batch: dict[str, Any] = {"body": bodies(first, PUBLISH)}
            if colored:
                batch["application_properties"] = pa.array(
                    [[("color", "red" if i % 2 == 0 else "blue")]
                     for i in range(first, first + PUBLISH)],
                    pa.map_(pa.string(), pa.string()))
            producer.send_batch(pa.RecordBatch.from_pydict(batch))
            producer.flush(30)


@pytest.fixture(scope="module")
def plain(client: pystream.Client) -> Iterator[str]:
    name = f"test-interrupt-points-{np.random.randint(1 << 30)}"
    client.create_stream(name)
    publish(client, name)
    yield name
    client.delete_stream(name, missing_ok=True)


@pytest.fixture(scope="module")
def colored(client: pystream.Client) -> Iterator[str]:
    name = f"test-interrupt-points-colored-{np.random.randint(1 << 30)}"
    client.create_stream(name)
    publish(client, name, colored=True)
    yield name
    client.delete_stream(name, missing_ok=True)


@pytest.fixture(scope="module")
def super_stream(client: pystream.Client) -> Iterator[str]:
    name = f"test-interrupt-points-super-{np.random.randint(1 << 30)}"
    client.create_super_stream(name, partitions=PARTITIONS)
    for partition in client.partitions(name):
        publish(client, partition)
    yield name
    client.delete_super_stream(name, missing_ok=True)


def in_order(offsets: list[int], n: int = N) -> None:
    got = np.asarray(offsets)
    assert len(got) == n, f"{len(got)} records of {n}: {gaps(offsets, n)}"
    assert (got == np.arange(n)).all(), f"out of order or repeated: {gaps(offsets, n)}"


def gaps(offsets: list[int], n: int) -> str:
    """Which offsets below ``n`` are missing, which came twice, and where
    the order first breaks: what a failure needs to be traced."""
    got = np.asarray(offsets, dtype=np.int64)
    counts = np.bincount(got[(got >= 0) & (got < n)], minlength=n)
    missing = np.flatnonzero(counts == 0)[:10].tolist()
    twice = np.flatnonzero(counts > 1)[:10].tolist()
    broken = np.flatnonzero(np.diff(got) != 1)[:3].tolist()
    return (f"missing {missing}, repeated {twice}, order breaks after "
            f"{[(int(got[i]), int(got[i + 1])) for i in broken]}")


def reader(how: str, consumer: pystream.Consumer,
           keep: Callable[[pa.RecordBatch | pa.Table], None], wanted: int,
           got: Callable[[], int]) -> Callable[[], bool]:
    """One call of ``how`` per call, its result kept the safe way."""
    state: dict[str, Iterator[Any] | None] = {"it": None}

    def once() -> bool:
        if how == "read":
            part = consumer.read(300, timeout=30)
            sys.setprofile(None)  # see below
            assert part.num_rows, f"nothing for 30 s after {got()} of {wanted} records"
            keep(part)
        else:
            it = state["it"]
            if it is None:  # a fresh one: an interrupt ended the last
                it = state["it"] = (consumer.batches(30) if how == "batches"
                                    else consumer.messages(30))
            try:
                item = next(it)
            except StopIteration:
                raise AssertionError(f"nothing for 30 s after {got()} of {wanted} "
                                     f"records") from None
            except BaseException:
                state["it"] = None
                raise
            # The result is the application's now: an interrupt in what it
            # does with it (a Message's offset is pystream's code, so a point)
            # would lose it in this test, not in the read.
            sys.setprofile(None)
            keep(item)
        return got() >= wanted
    return once


@pytest.mark.parametrize("how,fault", [
    ("read", None), ("batches", None), ("messages", None),
    ("read", "close"), ("batches", "close")])
def test_an_interrupt_at_any_point_of_a_read_loses_nothing(client, plain, how, fault):
    """Also while the broker closes the consumer's connections again and
    again (``fault="close"``): interrupts land in its recoveries too."""
    offsets: list[int] = []
    connections: set[int] = set()

    def keep(part: Any) -> None:
        if how == "messages":
            offsets.append(part.offset)
        else:
            offsets.extend(part.column("offset").to_pylist())
        connections.add(id(consumer._subs[plain].connection))

    with client.consumer(plain, offset="first", max_batch_rows=BATCH_ROWS) as consumer, \
            faults(fault):
        try:
            landed = sweep(reader(how, consumer, keep, N, lambda: len(offsets)))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {gaps(offsets, N)}") from None
    in_order(offsets)
    assert landed == 400
    if fault is not None:  # it struck mid-way: the consumer read on new connections
        assert len(connections) >= 2, connections


def test_an_interrupt_at_any_point_of_a_super_stream_read_loses_nothing(
        client, super_stream):
    offsets: dict[bytes, list[int]] = defaultdict(list)

    def keep(batch: pa.RecordBatch) -> None:
        offsets[batch.schema.metadata[b"stream"]].extend(
            batch.column("offset").to_pylist())

    with client.consumer(super_stream=super_stream, offset="first",
                         max_batch_rows=BATCH_ROWS) as consumer:
        landed = sweep(reader("batches", consumer, keep, N * PARTITIONS,
                              lambda: sum(map(len, offsets.values()))))
    assert len(offsets) == PARTITIONS
    for partition in offsets.values():
        in_order(partition)
    assert landed == 400


@pytest.mark.parametrize("how", ["read", "batches"])
def test_an_interrupt_at_any_point_of_a_post_filtered_read_loses_nothing(
        client, colored, how):
    offsets: list[int] = []

    def keep(part: Any) -> None:
        offsets.extend(part.column("offset").to_pylist())

    with client.consumer(colored, offset="first", columns=["application_properties"],
                         max_batch_rows=BATCH_ROWS,
                         filter=pystream.Filter(["red"], post_filter=red)) as consumer:
        landed = sweep(reader(how, consumer, keep, N // 2, lambda: len(offsets)))
    got = np.asarray(offsets)
    assert len(got) == N // 2
    assert (got == np.arange(0, N, 2)).all()
    assert landed == 400


BIG = 64 * 1024   # bytes a record: a chunk of 16 takes several reads
BIG_RECORDS = 160


@pytest.fixture(scope="module", params=[None, "zstd"])
def big(client: pystream.Client, request: pytest.FixtureRequest) -> Iterator[str]:
    """Chunks of 16 records of ``BIG`` bytes: plain, or one zstd sub-entry
    each (random bytes, which do not shrink: a chunk still takes several
    reads)."""
    name = f"test-interrupt-points-big-{np.random.randint(1 << 30)}"
    client.create_stream(name)
    rng = np.random.default_rng(7)
    with client.producer(name, compression=request.param, sub_batch_size=16) as producer:
        for first in range(0, BIG_RECORDS, 16):
            producer.send_batch([rng.bytes(BIG) if request.param else bytes([i % 256]) * BIG
                                 for i in range(first, first + 16)])
            producer.flush(30)
    yield name
    client.delete_stream(name, missing_ok=True)


def read_big(monkeypatch: pytest.MonkeyPatch, big: str, decoder: type,
             arm: Callable[[], None], disarm: Callable[[], None]) -> bool:
    """Every record of ``big`` in order through ``batches()``, one chunk
    granted at a time once the application waits (so that its own thread
    reads), every connection reading through ``decoder``; ``arm()`` before
    each call, ``disarm()`` after it, and a caught interrupt read on from.
    Whether the consumer kept its first connection."""
    from pystream import connection

    monkeypatch.setattr(connection, "StreamDecoder", decoder)
    offsets: list[int] = []
    with pystream.connect(MODERN_URI) as client, \
            client.consumer(big, offset="first", credit=pystream.Credit.manual(1)) as consumer:
        conn = consumer._subs[big].connection
        while len(offsets) < BIG_RECORDS:
            threading.Timer(0.05, consumer.grant_credit, (1,)).start()
            arm()
            try:
                # A batch, not read(n): rows taken while waiting for more
                # are given back on an interrupt, by resubscribing.
                part = next(consumer.batches(10), None)
            except KeyboardInterrupt:
                continue
            finally:
                disarm()
            assert part is not None, f"nothing for 10 s after {len(offsets)} records"
            offsets.extend(part.column("offset").to_pylist())
        kept = consumer._subs[big].connection is conn
    in_order(offsets, BIG_RECORDS)
    return kept


def test_an_interrupt_after_a_chunk_s_reads_keeps_the_connection(big, monkeypatch):
    """The reads of a chunk's rest (``recv_rest``) are committed as they
    land, before a signal handler runs: an interrupt there loses no byte,
    so the connection is kept (no ``ReadInterrupted``, no resubscription)
    and the frames left in the buffer reach the application at its next
    read. (Cython's methods raise no profile events: the interrupt comes
    from a subclass, in the application's thread only, as signals do.)"""
    from pystream import connection

    main = threading.current_thread()
    state = {"armed": False, "landed": 0}

    class Interrupted(connection.StreamDecoder):
        def recv_rest(self, fd: int, slice_size: int = 1 << 20) -> bool:
            complete = super().recv_rest(fd, slice_size)
            if state["armed"] and threading.current_thread() is main:
                state["armed"] = False
                state["landed"] += 1
                raise KeyboardInterrupt
            return complete

    assert read_big(monkeypatch, big, Interrupted,
                    arm=lambda: state.update(armed=True),
                    disarm=lambda: state.update(armed=False))
    assert state["landed"] >= 3


def test_an_interrupt_in_the_drain_of_a_chunk_left_in_the_buffer_loses_nothing(
        big, monkeypatch):
    """The two interrupts in turn: one after a chunk's reads, which leaves
    its frames in the buffer, then one in the application thread's drain
    of them, after a chunk was taken off the buffer and before it was
    handed over. That chunk is read again (the connection ends with
    ``ReadInterrupted`` and the consumer rewinds), never skipped. The
    reader thread leaves the buffer to the application thread meanwhile,
    as it does when the application takes the turn first."""
    from pystream import connection

    main = threading.current_thread()
    # 1: the next recv_rest of the application thread is interrupted;
    # 2: then its drain, right after it took a chunk off the buffer.
    state = {"stage": 0, "landed": 0}

    class Interrupted(connection.StreamDecoder):
        def recv_rest(self, fd: int, slice_size: int = 1 << 20) -> bool:
            complete = super().recv_rest(fd, slice_size)
            if state["stage"] == 1 and threading.current_thread() is main:
                state["stage"] = 2
                raise KeyboardInterrupt
            return complete

        def buffered(self) -> int:
            if state["stage"] == 2 and threading.current_thread() is not main:
                return 0
            return super().buffered()

        def next_event(self) -> Any:
            event = super().next_event()
            if (state["stage"] == 2 and threading.current_thread() is main
                    and event is not None and not isinstance(event, bytes)):
                state["stage"] = 0
                state["landed"] += 1
                raise KeyboardInterrupt
            return event

    def arm() -> None:
        if state["stage"] == 0:
            state["stage"] = 1

    def disarm() -> None:
        if state["stage"] == 1:
            state["stage"] = 0

    read_big(monkeypatch, big, Interrupted, arm, disarm)
    assert state["landed"] >= 3


def test_an_interrupt_at_any_point_of_close_then_close_again_stores_and_frees(
        client: pystream.Client, plain: str) -> None:
    """A named consumer's ``close`` stores the offset of the last record
    handed, unsubscribes and gives its connection back. An interrupt
    anywhere in it (a ``with`` block's exit), then ``close`` again, must
    leave the offset stored and nothing held."""
    name = f"interrupted-close-{np.random.randint(1 << 30)}"
    interrupter = Interrupter()
    landed, at, handed = 0, 1, 0
    with pystream.connect(MODERN_URI) as own:
        while True:
            consumer = own.consumer(plain, offset="first", name=name)
            table = consumer.read(7, timeout=30)
            assert table.column("offset")[0].as_py() == handed
            handed += table.num_rows
            try:
                interrupter.call(at, consumer.close)
            except KeyboardInterrupt:
                landed += 1
            consumer.close()
            assert own.query_offset(plain, name) == handed - 1, \
                f"close interrupted at its point {at} stored another offset"
            assert not own.pool.holders(), f"close interrupted at its point {at} kept a connection"
            if interrupter.points < at:
                break
            at += 1
    assert landed >= 20
