"""The turn to read a connection's socket (``pystream.readturn``): an
application thread that lends it reads on with no thread woken; the reader
thread takes a loan over once it has lasted ``LEND_SECONDS``, and a torn
turn whoever holds it."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator

from pystream import readturn
from pystream.readturn import ReadTurn

from .waiting import wait_until


def reader_loop(turn: ReadTurn, stop: threading.Event, turns: list[float],
                ids: list[int] | None = None) -> None:
    """What ``Receiver.run`` does with the turn, the reads left out."""
    if ids is not None:
        ids.append(threading.get_native_id())
    while not stop.is_set():
        turn.reader_take()
        turns.append(time.monotonic())
        try:
            while not turn.wanted and not stop.is_set():
                turn.poll(0.05)
        finally:
            turn.give()


@contextlib.contextmanager
def held_with_reader(ids: list[int] | None = None
                     ) -> Iterator[tuple[ReadTurn, socket.socket, list[float]]]:
    """A turn this thread holds, a reader thread waiting for it (recording
    when it takes it, and its thread id in ``ids``) and the socket's other
    end; all gone afterwards."""
    a, b = socket.socketpair()
    turn = ReadTurn(a.fileno())
    stop, turns = threading.Event(), []
    assert turn.app_take(1)  # before the reader thread starts: free
    reader = threading.Thread(target=reader_loop, args=(turn, stop, turns, ids))
    reader.start()
    try:
        yield turn, b, turns
    finally:
        stop.set()
        reader.join(5)
        turn.end()
        a.close()
        b.close()
    assert not reader.is_alive()


def test_a_lent_turn_comes_back_without_waking_the_reader():
    with held_with_reader() as (turn, b, turns):
        for _ in range(50):  # a batch handed, the next asked for at once
            turn.lend()
            assert turn.app_take(1)
        assert not turns  # the reader thread never had it
        # and nobody wrote to its wake-up pipe
        assert not select.select([turn._wake_r], [], [], 0)[0]

        lent = time.monotonic()
        turn.lend()  # the application stays away: the reader takes over
        wait_until(lambda: turns, 5, 0.001)
        assert turns[0] - lent >= readturn.LEND_SECONDS

        assert turn.app_take(5)  # back from the reader thread, woken from poll
        b.send(b"x")
        assert turn.poll(1) is True
        turn.give()


def switches(tid: int) -> int:
    """How often thread ``tid`` of this process went to sleep."""
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def test_quick_loans_leave_the_reader_thread_asleep(monkeypatch):
    """An application back before each loan ends (a batch handed every
    millisecond or so) wakes the reader thread only at its periodic look,
    not once per loan; one that then stays away still gets the reader
    thread, within ``MISSED_WAKEUP_SECONDS``, and its next loans wake it
    at once again."""
    # Loans of 30 ms, not 1: a loaded machine that keeps this thread off
    # its core past a loan (it did, in CI) makes the application slow, and
    # the reader thread then rightly takes the turn.
    monkeypatch.setattr(readturn, "LEND_SECONDS", 0.03)
    ids: list[int] = []
    with held_with_reader(ids) as (turn, b, turns):
        turn.lend()
        assert turn.app_take(1)  # back in time: quick from now on
        time.sleep(0.1)          # the reader thread waits
        before, began = switches(ids[0]), time.monotonic()
        for _ in range(300):
            turn.lend()
            time.sleep(0.0002)   # handing the batch over
            assert turn.app_take(1)
        looks = (time.monotonic() - began) / readturn.MISSED_WAKEUP_SECONDS
        assert switches(ids[0]) - before <= 2 * looks + 5
        assert not turns

        lent = time.monotonic()
        turn.lend()  # the application stays away
        wait_until(lambda: turns, 5, 0.001)
        assert readturn.LEND_SECONDS <= turns[0] - lent
        assert turns[0] - lent < readturn.MISSED_WAKEUP_SECONDS + 0.5

        assert turn.app_take(5)  # slow now: a loan wakes the reader at once
        turn.lend()
        wait_until(lambda: len(turns) == 2, 5, 0.001)


def test_another_thread_takes_a_turn_lent_by_one_gone():
    a, b = socket.socketpair()
    turn = ReadTurn(a.fileno())
    assert turn.app_take(1)
    turn.lend()
    took: list[bool] = []

    def other() -> None:
        took.append(turn.app_take(1))
        turn.give()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(5)
    assert took == [True]
    turn.give()  # no longer this thread's: a no-op
    turn.end()
    a.close()
    b.close()


def test_end_does_not_wait_for_a_thread_that_lent_the_turn():
    a, b = socket.socketpair()
    turn = ReadTurn(a.fileno())
    assert turn.app_take(1)
    turn.lend()
    ended = threading.Thread(target=turn.end)
    ended.start()
    ended.join(5)
    assert not ended.is_alive()
    assert turn.app_take(0.1) is False  # nobody reads after the end
    a.close()
    b.close()


def test_a_torn_turn_goes_to_the_reader_whoever_holds_it():
    """An application thread interrupted amid a read marks the turn torn
    and may leave without giving it back (a second interrupt): the reader
    thread takes it anyway, within ``MISSED_WAKEUP_SECONDS``, to end the
    connection."""
    with held_with_reader() as (turn, _, turns):
        time.sleep(0.1)
        assert not turns  # held, neither given nor lent
        torn = time.monotonic()
        turn.torn = True  # no notify: what an interrupted thread may leave
        wait_until(lambda: turns, 5, 0.001)
        assert turns[0] - torn < readturn.MISSED_WAKEUP_SECONDS + 0.5
