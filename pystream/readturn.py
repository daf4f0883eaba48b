"""Whose turn it is to read a connection's socket.

A consumer's application thread that waits for the next batch reads the
socket itself while it waits (``Receiver.read_until``): the batch is then
in its hands as the ``recv`` that brought it returns, instead of one thread
wake-up later (the reader thread's queue and notify, and the scheduler
putting the application back on a core: on a loaded machine, most of what
pystream added to the end-to-end latency). The connection's reader thread
reads whenever no application thread does (while the application works on a
batch), so heartbeats, answers and chunks keep flowing.

One thread at a time holds the turn. The reader thread polls the socket and
a wake-up socket pair, so that an application thread wanting the turn can take it
from a reader idle in ``poll``; the holder gives it back once done. An
application thread that has its batch lends the turn instead (``lend``):
back within ``LEND_SECONDS``, as one iterating a stream mostly is, it
reads on with no thread woken on either side; later, the reader thread
takes the turn and reads meanwhile. A loan wakes the reader thread only
while the application is slow (its last loan ran out): woken at every
loan, the reader would preempt the application thread and wait for the
GIL once per batch. A quick application that stays away once is noticed
at the reader's next look, within ``MISSED_WAKEUP_SECONDS``; from then on
its loans wake the reader again, until it is quick again.

An application thread whose read an interrupt stopped halfway (a
``KeyboardInterrupt`` it catches) marks the turn ``torn``: the reader
thread, which signals never interrupt, takes it whoever holds it and ends
the connection. The reader thread only leaves its loop while holding the
turn, so no application thread reads a descriptor it closed (the
connection's close rules).
"""

from __future__ import annotations

import _socket
import select
import threading
import time

from . import locks

_POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR
#: How long an application thread that lent the turn keeps it from the
#: reader thread: handing the turn over and back costs three thread
#: wake-ups, each one a scheduling delay on a busy machine.
LEND_SECONDS = 0.001
#: How often a waiting reader thread looks again without a notify.
MISSED_WAKEUP_SECONDS = 0.05


class ReadTurn:
    """The turn to read one socket (``fd``), between the connection's
    reader thread and application threads waiting for data."""

    def __init__(self, fd: int) -> None:
        self._lock = threading.RLock()  # held as itself: see locks
        self._cond = threading.Condition(self._lock)
        # Socket objects, not a pipe's bare descriptors: an interrupt that
        # lands as they are made leaves objects that close as they go
        # (``socket.socketpair`` holds bare descriptors on its way).
        self._wake_r, self._wake_w = _socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poll = select.poll()
        self._poll.register(fd, _POLL_IN)
        self._poll.register(self._wake_r.fileno(), select.POLLIN)
        self._fd = fd
        self.wanted = 0          # application threads waiting for the turn
        self._holder: int | None = None  # thread ident holding it
        self._lent_until: float | None = None  # the holder stepped away (lend)
        # The application took its last loan back in time: its loans leave
        # the reader thread asleep (it looks again within MISSED_WAKEUP_SECONDS).
        self._quick = False
        self._ended = False      # the reader thread left: nobody reads again
        # An application thread's read was interrupted halfway: the reader
        # thread takes the turn whoever holds it, and ends the connection.
        self.torn = False

    # --- the reader thread -------------------------------------------------------

    def reader_take(self) -> None:
        """Wait until no application thread wants the turn, and take it
        (from one that lent it once the loan is over)."""
        with self._lock:
            while (self.wanted or self._holder is not None) and not self.torn:
                if self.wanted or self._lent_until is None:
                    # Timed: an interrupt in an application thread (a
                    # KeyboardInterrupt it catches) may skip a notify, or
                    # tear a read and leave it holding the turn.
                    locks.wait(self._cond, MISSED_WAKEUP_SECONDS)
                    continue
                left = self._lent_until - time.monotonic()
                if left <= 0:
                    self._quick = False  # the application stayed away
                    break
                # A quick application is back before the loan ends, and
                # lends again: waiting for each loan's end would wake this
                # thread once per batch.
                locks.wait(self._cond, MISSED_WAKEUP_SECONDS if self._quick else left)
            self._take()

    def _take(self) -> None:
        self._holder = threading.get_ident()
        self._lent_until = None

    def _free(self) -> bool:
        """Nobody reads: no holder, or one that lent the turn."""
        return self._holder is None or self._lent_until is not None

    def give(self) -> None:
        """Give the turn back if this thread holds it (the reader thread
        after its reads, an application thread once it has what it read;
        a no-op for a thread that holds it no longer)."""
        with self._lock:
            if self._holder == threading.get_ident():
                self._holder = None
                self._lent_until = None
                self._cond.notify_all()

    def lend(self) -> None:
        """Keep the turn for ``LEND_SECONDS`` without reading (an
        application thread that has its batch), then let the reader thread
        take it; a no-op for a thread that holds it no longer."""
        with self._lock:
            if self._holder == threading.get_ident():
                self._lent_until = time.monotonic() + LEND_SECONDS
                if self.wanted or not self._quick:
                    self._cond.notify_all()

    def end(self) -> None:
        """The reader thread leaves (the socket shut down): nobody reads
        again, and the wake-up pair goes."""
        with self._lock:
            self._ended = True
            self._holder = None
            self._cond.notify_all()
            # An application thread may have taken the turn on the way out:
            # the socket is shut down, so it gives it back at once (or it
            # lent it, and reads no more until it takes it again).
            locks.wait_for(self._cond, self._free, None)
            self._holder = self._lent_until = None
            self._wake_r.close()
            self._wake_w.close()

    # --- application threads ----------------------------------------------------------

    def app_take(self, timeout: float | None) -> bool:
        """Take the turn from the reader thread (waking it from ``poll``);
        False if it did not come within ``timeout`` or nobody reads any
        more."""
        with self._lock:
            if self._ended:
                return False
            if self._holder == threading.get_ident() or self._lent_until is not None:
                if self._lent_until is not None:
                    self._quick = time.monotonic() < self._lent_until
                self._take()  # kept since its last read, or lent by a thread away
                return True
            self.wanted += 1
            try:
                if self._holder is not None:
                    self._wake()
                locks.wait_for(self._cond, lambda: self._free() or self._ended, timeout)
                free = self._free() and not self._gone()
                if free:
                    self._take()
                return free
            finally:
                self.wanted -= 1

    def _gone(self) -> bool:
        # A call, not the attribute: mypy keeps ``_ended`` narrowed to False
        # across the wait above.
        return self._ended

    # --- either -----------------------------------------------------------------------

    def interrupt(self) -> None:
        """Wake the holder from ``poll`` (from another thread): the
        application it reads for stopped waiting."""
        with self._lock:
            holder = self._holder
            if holder is not None and holder != threading.get_ident():
                self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def poll(self, timeout: float | None) -> bool:
        """Wait (the holder) until the socket is readable (True), or the
        wake-up pair or ``timeout`` woke it (False)."""
        ms = None if timeout is None else max(0, int(timeout * 1000) + 1)
        readable = False
        for fd, _ in self._poll.poll(ms):
            if fd == self._fd:
                readable = True
            else:
                try:
                    self._wake_r.recv(4096)
                except BlockingIOError:
                    pass
        return readable
