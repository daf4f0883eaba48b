"""A caught interrupt anywhere in a producer's call publishes nothing twice
and loses nothing, nor leaves a frame cut on the wire.

The sweep of ``test_interrupt_points`` (a ``KeyboardInterrupt`` at every
Python call of the main thread in turn) over ``send_batch`` and ``flush``
of a named producer, as docs/producing.md tells an application to go on
after an interrupt: flush, then send again what ``last_publishing_id``
says did not go. And a send cut halfway through a frame, which must end
the connection rather than let the next frame follow the cut one.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pystream
from pystream import locks
from pystream._core import send_all
from pystream.confirms import CallbackThread, ConfirmFuture

from .conftest import MODERN_URI, TLS_URI

# client: the module's fixture, shared
from .test_interrupt_points import Interrupter, bodies, client, faults, sweep  # noqa: F401

pytestmark = pytest.mark.broker

BATCHES = 60
PER_BATCH = 20


@pytest.fixture
def stream(client: pystream.Client) -> Iterator[str]:  # noqa: F811
    name = f"test-interrupt-sends-{np.random.randint(1 << 30)}"
    client.create_stream(name)
    yield name
    client.delete_stream(name, missing_ok=True)


def stored(client: pystream.Client, stream: str,  # noqa: F811
           most: int = BATCHES * PER_BATCH * 2) -> list[bytes]:
    with client.consumer(stream, offset="first") as consumer:
        table = consumer.read(most, timeout=3)
    return [bytes(b) for b in table.column("body").to_pylist()]


@pytest.mark.parametrize("compression,fault,tls", [
    (None, None, False), ("zstd", None, False), (None, "close", False),
    ("zstd", "close", False), (None, None, True), (None, "close", True)])
def test_an_interrupt_at_any_point_of_a_send_publishes_each_batch_once(
        client: pystream.Client, stream: str, compression: str | None,  # noqa: F811
        fault: str | None, tls: bool, request: pytest.FixtureRequest) -> None:
    """Also while the broker closes the producer's connections again and
    again (``fault="close"``): interrupts land in its recoveries too; and
    over TLS, where a send goes through the TLS layer's turns with the
    reader thread (``TlsChannel``)."""
    # Compressed, a batch is one sub-entry: one publishing id.
    ids = PER_BATCH if compression is None else 1
    connections: set[int] = set()
    with contextlib.ExitStack() as stack:
        if tls:
            context = ssl.create_default_context(
                cafile=request.getfixturevalue("tls_dir") / "ca.pem")
            sender = stack.enter_context(pystream.connect(TLS_URI, ssl_context=context))
        else:
            sender = client
        producer = stack.enter_context(
            sender.producer(stream, name=stream, compression=compression))
        stack.enter_context(faults(fault))
        state = {"next": 0}

        def call() -> bool:
            i = state["next"]
            first = i * ids + 1
            # An interrupted send_batch either left its batch to the
            # producer (its ids are taken: it goes, again after a
            # reconnection if need be) or sent nothing.
            if producer.last_publishing_id < first:
                producer.send_batch(bodies(i * PER_BATCH, PER_BATCH), publishing_id=first)
            producer.flush(30)
            connections.add(id(producer._link.connection))
            state["next"] = i + 1
            return state["next"] == BATCHES

        landed = sweep(call, budget=300)
    assert landed == 300
    assert stored(client, stream) == bodies(0, BATCHES * PER_BATCH)
    if fault is not None:  # it struck mid-way: the producer sent on new connections
        assert len(connections) >= 2, connections


@pytest.mark.parametrize("compression,fault", [
    (None, None), ("zstd", None), (None, "close")])
def test_an_interrupt_at_any_point_of_a_super_stream_send_stores_each_message_once(
        client: pystream.Client, compression: str | None,  # noqa: F811
        fault: str | None) -> None:
    """A super stream's ``send_batch`` hands each partition's producer its
    share in turn: an interrupt may land after some took theirs. As
    docs/producing.md says, the application flushes, then sends the batch
    again with the ids each partition would have given it before the
    call: the partitions that took their share drop it (their name), the
    others store it. Message i of each batch goes to partition i % 3.
    Also while the broker closes every connection again and again."""
    super_stream = f"test-interrupt-super-{np.random.randint(1 << 30)}"
    client.create_super_stream(super_stream, partitions=3)
    try:
        with client.producer(super_stream=super_stream, name=super_stream,
                             route=lambda batch: np.arange(batch.num_rows) % 3,
                             compression=compression) as producer, faults(fault):
            assert isinstance(producer, pystream.SuperStreamProducer)
            connections: set[int] = set()
            state: dict[str, Any] = {"next": 0, "ids": None}

            def call() -> bool:
                i = state["next"]
                if state["ids"] is None:
                    state["ids"] = {p: producer.last_publishing_id(p) + 1
                                    for p in producer.partitions}
                else:  # again after an interrupt: what it left goes first
                    producer.flush(30)
                producer.send_batch(bodies(i * PER_BATCH, PER_BATCH),
                                    publishing_ids=state["ids"])
                producer.flush(30)
                connections.add(id(producer._producers[0]._link.connection))
                state["next"], state["ids"] = i + 1, None
                return state["next"] == BATCHES

            landed = sweep(call, budget=300)
            partitions = producer.partitions
        assert landed == 300
        if fault is not None:  # it struck mid-way
            assert len(connections) >= 2, connections
        every = bodies(0, BATCHES * PER_BATCH)
        for k, partition in enumerate(partitions):
            mine = [b for n, b in enumerate(every) if n % PER_BATCH % 3 == k]
            assert stored(client, partition) == mine, partition
    finally:
        client.delete_super_stream(super_stream, missing_ok=True)


def interrupted_at(interrupter: Interrupter, at: int, call: Any) -> bool:
    """``call()`` interrupted at its point ``at``: whether the interrupt
    landed (False: the call has fewer points and ran whole)."""
    try:
        interrupter.call(at, call)
    except KeyboardInterrupt:
        return True
    return False


def test_an_interrupt_at_any_point_of_a_flush_loses_and_repeats_nothing(
        client: pystream.Client, stream: str) -> None:  # noqa: F811
    """``send`` gathers, ``flush`` sends from the caller's thread: an
    interrupt there, at each of its points in turn, leaves the messages
    it took from the buffer either in a batch the producer sends or back
    in the buffer, and the next flush sends them."""
    interrupter = Interrupter()
    rounds, landed = 100, 0
    with client.producer(stream, name=stream, batch_size=10_000,
                         linger_ms=60_000) as producer:
        for i in range(rounds):
            for body in bodies(i * PER_BATCH, PER_BATCH):
                producer.send(body)
            landed += interrupted_at(interrupter, 1 + 2 * i, lambda: producer.flush(30))
            producer.flush(30)
    assert landed >= 80  # a flush whose confirms come at once has fewer points
    assert stored(client, stream, rounds * PER_BATCH) == bodies(0, rounds * PER_BATCH)


def test_an_interrupted_send_repeats_at_most_its_own_message(
        client: pystream.Client, stream: str) -> None:  # noqa: F811
    """An interrupt in ``send`` may come after the message was queued: sent
    again, it may be stored twice, right after itself; no other message
    is lost or repeated, and the producer goes on."""
    interrupter = Interrupter()
    every = bodies(0, 200)
    with client.producer(stream, batch_size=7, linger_ms=1) as producer:
        landed = 0
        for i, body in enumerate(every):
            if interrupted_at(interrupter, 1 + i % 30, lambda body=body: producer.send(body)):
                landed += 1
                producer.send(body)
        producer.flush(30)
    assert landed >= 150
    got = stored(client, stream, 2 * len(every))
    deduplicated = [b for j, b in enumerate(got) if j == 0 or b != got[j - 1]]
    assert deduplicated == every


class CutSend:
    """``send_all`` whose next send of more than ``at`` bytes sends the
    first ``at`` and raises ``KeyboardInterrupt``, as a signal handler does
    when a send blocked halfway through a frame."""

    def __init__(self, at: int) -> None:
        self.at, self.cut = at, False

    def __call__(self, fd: int, data: Any, progress: list[int]) -> None:
        if not self.cut and len(memoryview(data)) > self.at:
            self.cut = True
            send_all(fd, memoryview(data)[:self.at], progress)
            raise KeyboardInterrupt
        send_all(fd, data, progress)


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_send_interrupted_halfway_through_a_frame_ends_its_connection(
        client: pystream.Client, stream: str, named: bool,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pystream.connect(MODERN_URI) as own, \
            own.producer(stream, name=stream if named else None) as producer:
        producer.send_batch(bodies(0, PER_BATCH))
        producer.flush(30)
        conn = producer._link.connection
        cut = CutSend(100)
        monkeypatch.setattr(pystream.connection, "send_all", cut)
        with pytest.raises(KeyboardInterrupt):
            producer.send_batch(bodies(PER_BATCH, PER_BATCH))
        assert cut.cut
        assert not conn.is_open, "frames went on after a cut one"
        assert isinstance(conn.error, pystream.SendInterrupted)
        producer.send_batch(bodies(2 * PER_BATCH, PER_BATCH))
        producer.flush(30)
    # The cut batch went again from the new connection, whole, once.
    assert stored(client, stream) == bodies(0, 3 * PER_BATCH)


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_interrupt_before_a_send_or_after_it_keeps_the_connection(
        client: pystream.Client, stream: str, when: str,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No frame is cut when the interrupt comes before the first byte went
    or after the last: the connection stays, and so does what was sent on
    it before (a consumer's stored offset, credit)."""
    with pystream.connect(MODERN_URI) as own:
        conn = own.connection
        state = {"armed": True}

        def interrupted(fd: int, data: Any, progress: list[int]) -> None:
            if state["armed"]:
                state["armed"] = False
                if when == "after":
                    send_all(fd, data, progress)
                raise KeyboardInterrupt
            send_all(fd, data, progress)

        monkeypatch.setattr(pystream.connection, "send_all", interrupted)
        with pytest.raises(KeyboardInterrupt):
            own.store_offset(stream, "kept", 0)
        assert conn.is_open
        own.store_offset(stream, "kept", 1)
        assert own.query_offset(stream, "kept") == 1


FUTURE_CALLS: dict[str, Any] = {
    "add_done_callback": lambda f: f.add_done_callback(lambda _: None),
    "result": lambda f: f.result(timeout=0.001),
    "exception": lambda f: f.exception(timeout=0.001),
    "done": lambda f: f.done(),
}


@pytest.mark.parametrize("kind", ["confirm", "request"])
@pytest.mark.parametrize("call", FUTURE_CALLS)
def test_an_interrupt_in_a_future_s_call_leaves_it_to_be_resolved(
        call: str, kind: str) -> None:
    """A future's calls take its lock (``with self._condition``), and an
    interrupt may land after the lock was taken and before the block that
    lets it go, or inside a ``wait`` with the lock let go. The reader
    thread resolves the future under that lock (a producer's confirm, the
    answer to a request): held for good, it would wait for good, and every
    frame of the connection after it."""
    callbacks = CallbackThread("test-interrupted-futures")
    interrupter = Interrupter()
    landed, at = 0, 1
    while True:
        future: locks.Future[int] = (ConfirmFuture(callbacks) if kind == "confirm"
                                     else locks.Future())
        try:
            interrupter.call(at, lambda f=future: FUTURE_CALLS[call](f))
        except KeyboardInterrupt:
            landed += 1
        except TimeoutError:
            pass
        resolver = threading.Thread(target=future.set_result, args=(at,), daemon=True)
        resolver.start()
        resolver.join(5)
        assert not resolver.is_alive(), f"{call} interrupted at its point {at} kept the lock"
        assert future.result(timeout=1) == at
        if interrupter.points < at:  # ran whole: every point was tried
            break
        at += 1
    callbacks.stop()
    assert landed >= 3


def test_an_interrupt_in_flush_s_wait_for_callbacks_leaves_them_running() -> None:
    """``flush`` waits for the done-callbacks to have run (``drain``); an
    interrupt in that wait must leave its lock free for the resolving
    thread, and the next wait working."""
    callbacks = CallbackThread("test-interrupted-drain")
    interrupter = Interrupter()
    landed, at = 0, 1
    while True:
        future: ConfirmFuture[int] = ConfirmFuture(callbacks)
        future.add_done_callback(lambda _: time.sleep(0.01))
        future.set_result(0)
        try:
            interrupter.call(at, lambda: callbacks.drain(None))
        except KeyboardInterrupt:
            landed += 1
        other: ConfirmFuture[int] = ConfirmFuture(callbacks)
        other.add_done_callback(lambda _: None)
        resolver = threading.Thread(target=other.set_result, args=(1,), daemon=True)
        resolver.start()
        resolver.join(5)
        assert not resolver.is_alive(), f"drain interrupted at its point {at} kept the lock"
        assert callbacks.drain(time.monotonic() + 5)
        if interrupter.points < at:
            break
        at += 1
    callbacks.stop()
    assert landed >= 3


def test_an_interrupt_while_a_callback_is_handed_over_runs_later_ones() -> None:
    """A done-callback added to a resolved future (or to one ``close``
    fails) is handed over in the application's thread. Were the callback
    thread started there, on demand, an interrupt in ``Thread.start``
    could leave it never started, or waiting for good on its start
    event's lock, and every later callback unrun (``flush`` waiting for
    them): it runs from the making of its ``CallbackThread`` instead."""
    interrupter = Interrupter()
    landed, at = 0, 1
    while True:
        callbacks = CallbackThread("test-interrupted-start")
        resolved: ConfirmFuture[int] = ConfirmFuture(callbacks)
        resolved.set_result(0)
        try:
            interrupter.call(at, lambda f=resolved: f.add_done_callback(lambda _: None))
        except KeyboardInterrupt:
            landed += 1
        later: ConfirmFuture[int] = ConfirmFuture(callbacks)
        later.add_done_callback(lambda _: None)
        later.set_result(1)
        assert callbacks.drain(time.monotonic() + 5), \
            f"a callback handed over interrupted at its point {at} kept later ones"
        callbacks.stop()
        if interrupter.points < at:
            break
        at += 1
    assert landed >= 3


def test_an_interrupt_at_any_point_of_close_then_close_again_frees_everything(
        client: pystream.Client, stream: str) -> None:  # noqa: F811
    """``close`` flushes, fails what it could not send, deletes the
    publisher and gives its connection back. An interrupt anywhere in it
    (a ``with`` block's exit), then ``close`` again, must leave nothing
    behind: every future resolved, no connection kept for the producer,
    each batch stored once."""
    interrupter = Interrupter()
    landed, at, i = 0, 1, 0
    with pystream.connect(MODERN_URI) as own:
        while True:
            producer = own.producer(stream, name=stream)
            future = producer.send_batch(bodies(i * PER_BATCH, PER_BATCH),
                                         publishing_id=i * PER_BATCH + 1)
            i += 1
            try:
                interrupter.call(at, producer.close)
            except KeyboardInterrupt:
                landed += 1
            producer.close()
            assert future.done(), f"close interrupted at its point {at} left a future"
            assert not own.pool.holders(), f"close interrupted at its point {at} kept a connection"
            if interrupter.points < at:
                break
            at += 1
    assert landed >= 50
    assert stored(client, stream, most=i * PER_BATCH * 2) == bodies(0, i * PER_BATCH)


@pytest.mark.parametrize("ending", ["close", "end_interrupted_send"])
def test_an_interrupt_at_any_point_of_a_connection_s_end_then_close_ends_it(
        ending: str) -> None:
    """A connection ends (``close``: a client's, the pool's for one nobody
    holds; ``end_interrupted_send``: after a cut frame) by marking itself
    closed, then dropping its socket and failing what waits on it. An
    interrupt anywhere in that, the event it sets included, must leave no
    lock held that the reader thread takes as it ends (it would wait for
    good, and the next ``close`` with it), and the next ``close`` must
    finish the job. (After ``close``'s Close request the reader often ends
    the connection first; ``end_interrupted_send`` ends it in the caller's
    thread every time.)"""
    interrupter = Interrupter()
    landed, at = 0, 1
    while True:
        c = pystream.connect(MODERN_URI)
        conn = c.connection
        try:
            interrupter.call(at, getattr(conn, ending))
        except KeyboardInterrupt:
            landed += 1
        # In a thread of its own: a test that fails, not one that hangs.
        closer = threading.Thread(target=c.close, daemon=True)
        closer.start()
        closer.join(15)
        assert not closer.is_alive(), f"{ending} interrupted at its point {at} hung close"
        assert not conn.is_open
        reader = conn._reader_thread
        assert reader is not None
        reader.join(5)
        assert not reader.is_alive(), f"{ending} interrupted at its point {at} kept the reader"
        if interrupter.points < at:
            break
        at += 1
    assert landed >= 10
