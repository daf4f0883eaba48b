"""Every wait of the producer ends: close(timeout) resolves every future by
its deadline, a send waiting for room in the in-flight window honours its
timeout, a done-callback that publishes or blocks holds up no confirm, and
flush returns once the callbacks of what it waited for have run.

A broker that never confirms is the hostile server (a real one cannot be
made to withhold confirms alone); the callbacks run against a real one."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

import pystream
from pystream import ConfirmTimeout, ProducerClosed, RequestTimeout, SendTimeout
from pystream import protocol as P

from .hostile_server import OK, HostileServer
from .waiting import wait_until


class SilentBroker(HostileServer):
    """Declares publishers, takes what they publish and never confirms it."""

    def __init__(self) -> None:
        super().__init__(lambda *_: None)

    def _answer(self, cmd: P.Command) -> list[P.Command]:
        corr = getattr(cmd, "correlation_id", 0)
        if isinstance(cmd, P.DeclarePublisher):
            return [P.DeclarePublisherResponse(corr, OK)]
        if isinstance(cmd, P.DeletePublisher):
            return [P.DeletePublisherResponse(corr, OK)]
        if isinstance(cmd, P.QueryPublisherSequence):
            return [P.QueryPublisherSequenceResponse(corr, OK, 0)]
        return super()._answer(cmd)


@pytest.fixture
def silent():
    with SilentBroker() as server, pystream.connect(server.uri) as client:
        yield client


def test_close_timeout_resolves_every_future_by_its_deadline(silent):
    p = silent.producer("never-confirmed", batch_size=10, linger_ms=1)
    batches = [p.send_batch([b"batch"] * 5) for _ in range(3)]
    messages = [p.send(b"m%d" % i) for i in range(25)]
    started = time.monotonic()
    with pytest.raises(ConfirmTimeout):
        p.close(timeout=1)
    assert time.monotonic() - started < 2.5
    for f in batches + messages:
        assert f.done()
        with pytest.raises((ConfirmTimeout, ProducerClosed)):
            f.result(0)
    with pytest.raises(ProducerClosed):
        p.send(b"after")


def test_a_send_waiting_for_room_honours_its_timeout(silent):
    p = silent.producer("never-confirmed", max_in_flight=10, linger_ms=1)
    try:
        first = p.send_batch([b"x"] * 10)  # fills the window, never confirmed
        for send in (lambda: p.send_batch([b"y"], timeout=0.5),
                     lambda: p.send(b"z", timeout=0.5)):
            started = time.monotonic()
            with pytest.raises(SendTimeout):
                send()
            assert 0.4 < time.monotonic() - started < 1.5
        assert isinstance(SendTimeout("x"), RequestTimeout)
        assert not first.done()
    finally:
        with pytest.raises(ConfirmTimeout):
            p.close(timeout=0.5)


def test_close_releases_sends_waiting_for_room(silent):
    """Sends waiting without a timeout (in threads of their own) end with
    ProducerClosed when the producer closes."""
    p = silent.producer("never-confirmed", max_in_flight=10, linger_ms=1)
    p.send_batch([b"x"] * 10)
    raised: list[BaseException] = []

    def send(how) -> None:
        try:
            how()
        except BaseException as exc:
            raised.append(exc)

    threads = [threading.Thread(target=send, args=(how,), daemon=True)
               for how in (lambda: p.send_batch([b"y"]), lambda: p.send(b"z"))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    with pytest.raises(ConfirmTimeout):
        p.close(timeout=0.5)
    for t in threads:
        t.join(2)
    assert len(raised) == 2 and all(isinstance(e, ProducerClosed) for e in raised)


@pytest.mark.broker
def test_a_callback_that_publishes_does_not_stall_confirms(modern, modern_stream):
    """A done-callback that publishes and waits for its own confirm: on the
    connection's reader thread, it would wait for a confirm that only that
    thread can read."""
    got: list[int] = []
    # The linger keeps the first message queued until its callback is in.
    with modern.producer(modern_stream, linger_ms=300, max_in_flight=50) as p:
        first = p.send(b"first")
        first.add_done_callback(
            lambda f: got.append(p.send_batch([b"more"] * 50).result(10)))
        wait_until(lambda: got, 15)
        assert got == [51]


@pytest.mark.broker
def test_a_blocking_callback_holds_up_no_other_future(modern, modern_stream):
    release = threading.Event()
    ran_on: list[threading.Thread] = []
    with modern.producer(modern_stream, linger_ms=300) as p:
        first = p.send(b"first")
        first.add_done_callback(lambda f: (ran_on.append(threading.current_thread()),
                                           release.wait(20)))
        try:
            assert first.result(10) == 1
            later: Future[int] = p.send_batch([b"a", b"b"])
            assert later.result(10) == 3
            # Every message is confirmed; flush says the callbacks are not
            # all done rather than returning as if they were.
            with pytest.raises(TimeoutError, match="done-callbacks still ran"):
                p.flush(0.3)
        finally:
            release.set()
    assert ran_on and ran_on[0] is not threading.current_thread()
    assert not ran_on[0].name.startswith("pystream-reader")


@pytest.mark.broker
def test_flush_returns_once_every_callback_ran(modern, modern_stream):
    """What the callbacks record is whole when flush returns: the confirms
    are read on another thread than the one that runs the callbacks."""
    seen: list[int] = []

    def slow(f: Future[int]) -> None:
        time.sleep(0.02)
        seen.append(f.result())

    with modern.producer(modern_stream) as p:
        for i in range(20):
            p.send_batch([b"x%d" % i]).add_done_callback(slow)
        p.flush(30)
        assert seen == list(range(1, 21))
        # A callback that flushes waits for no callback (its own included).
        flushed = threading.Event()
        p.send(b"last").add_done_callback(lambda f: (p.flush(10), flushed.set()))
        p.flush(30)
        assert flushed.is_set()


@pytest.mark.broker
def test_a_callback_raising_system_exit_stops_no_later_callback(modern, modern_stream):
    seen: list[int] = []

    def leave(f: Future[int]) -> None:
        raise SystemExit(3)

    with modern.producer(modern_stream) as p:
        p.send_batch([b"a"]).add_done_callback(leave)
        p.send_batch([b"b"]).add_done_callback(lambda f: seen.append(f.result()))
        p.flush(30)
        assert seen == [2]
