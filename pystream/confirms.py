"""A producer's bookkeeping of what it sent: the batches awaiting their
confirms (``Confirms``), how a confirm or a refusal settles them, and the
futures they resolve (``ConfirmFuture``), whose done-callbacks run on a
thread of their own (``CallbackThread``) rather than on the connection's
reader thread, so that a callback that publishes or blocks cannot hold up
the confirms of other messages.

The send path (``producer``) decides what to send and when; this module
only learns what was sent and what the broker answered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import _base as futures_base
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from . import locks
from . import protocol as P
from .errors import PublisherDoesNotExist, PublishError
from .publish_frames import join_publish_frames, publish_frames

if TYPE_CHECKING:
    from .metrics import PublisherStats

log = logging.getLogger("pystream.producer")

T = TypeVar("T")
Callback = Callable[[Any], object]


class CallbackThread:
    """Runs futures' done-callbacks one after another, in the order their
    futures resolved, off the thread that resolved them. Its thread runs
    from its making to ``stop``: started here, not by the first callback,
    as that may come in the application's thread, where an interrupt in
    ``Thread.start`` could leave a thread never started and every later
    callback unrun."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], list[Callback]] | None] = \
            queue.SimpleQueue()
        # Held as itself, waited on through ``locks.wait``: ``flush`` waits
        # here in the application's thread, which an interrupt may stop.
        self._lock = threading.RLock()
        self._ran_some = threading.Condition(self._lock)
        self._handed = 0   # futures whose callbacks were handed over
        self._ran = 0      # of them, those whose callbacks have run
        self._stopped = False
        self._thread = locks.new_thread(self._loop, name)
        self._thread.start()

    def run(self, future: Future[Any], callbacks: list[Callback]) -> None:
        with self._lock:
            if not self._stopped:
                self._handed += 1
                self._queue.put((future, callbacks))
                return
        # Stopped (its producer closed, every callback before run): here.
        _call(future, callbacks, Exception)

    def stop(self) -> None:
        """End the thread once what was handed over has run; callbacks
        handed over later run in the thread that hands them over."""
        with self._lock:
            if not self._stopped:
                self._queue.put(None)  # twice, after an interrupt: harmless
                self._stopped = True

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            # Even SystemExit: ending this thread would leave every later
            # callback unrun, and flush() waiting for them.
            _call(*item, BaseException)
            with self._lock:
                self._ran += 1
                self._ran_some.notify_all()

    def drain(self, deadline: float | None) -> bool:
        """Wait until the callbacks handed over so far have run (at most
        until the ``time.monotonic`` ``deadline``); whether they have. On
        the callback thread itself (a callback that flushes), at once."""
        with self._lock:
            if threading.current_thread() is self._thread:
                return True
            handed = self._handed
            while self._ran < handed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                locks.wait(self._ran_some, left)
            return True


def _call(future: Future[Any], callbacks: list[Callback],
          logged: type[BaseException]) -> None:
    """Run ``callbacks``; what one raises (of class ``logged``) is logged."""
    for callback in callbacks:
        try:
            callback(future)
        except logged:
            log.exception("exception calling callback for %r", future)


_DONE = (futures_base.CANCELLED, futures_base.CANCELLED_AND_NOTIFIED,
         futures_base.FINISHED)


class ConfirmFuture(locks.Future[T]):
    """A future a producer resolves when the broker confirmed (or refused)
    what it stands for. Its result is set, and ``done()`` is true, as soon
    as the confirm is read; its done-callbacks then run on the producer's
    callback thread, in order. It cannot be cancelled: what was handed to
    the producer may already be on the wire.

    ``publishing_ids`` is ``(first, last)``: the publishing ids of a batch
    once it was encoded (``None`` for a single message's future, and for a
    batch that was never sent)."""

    _done_callbacks: list[Callback]
    publishing_ids: tuple[int, int] | None = None

    def __init__(self, callbacks: CallbackThread) -> None:
        super().__init__()
        self._callback_thread = callbacks

    def cancel(self) -> bool:
        return False

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        # Done already, it runs on the callback thread too, after the
        # callbacks handed over before it: not at once in the caller's.
        with self._condition.lock:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        self._callback_thread.run(self, [fn])

    def _invoke_callbacks(self) -> None:
        # Called by set_result / set_exception once the future is finished:
        # no callback can be added to the list any more (add_done_callback
        # runs it at once), so it is handed over whole.
        if self._done_callbacks:
            callbacks, self._done_callbacks = self._done_callbacks, []
            self._callback_thread.run(self, callbacks)


class _Batch:
    """Frames sent and waiting for their confirms."""

    __slots__ = ("first_id", "counts", "settled", "messages",
                 "frames", "future", "message_futures", "failures")

    def __init__(self, first_id: int, counts: np.ndarray, frames: pa.Buffer | bytes,
                 message_futures: list[Future[int]] | None,
                 future: Future[int] | None = None) -> None:
        self.first_id = first_id
        self.counts = counts                # messages per publishing id
        self.settled = np.zeros(len(counts), np.bool_)  # ids confirmed or refused
        self.messages = int(counts.sum())
        self.frames = frames
        self.future: Future[int] = future if future is not None else locks.Future()
        self.message_futures = message_futures
        self.failures: list[tuple[int, int]] = []

    @property
    def last_id(self) -> int:
        return self.first_id + len(self.counts) - 1

    def resolve(self) -> None:
        if not self.failures:
            self.future.set_result(self.last_id)
        else:
            pid, code = self.failures[0]
            self.future.set_exception(PublishError(
                f"the broker refused {len(self.failures)} message(s) of the "
                f"batch, first publishing id {pid} (code {code:#04x})",
                publishing_id=pid, code=code))
        if self.message_futures is not None:
            refused = dict(self.failures)
            first_message = np.concatenate([[0], np.cumsum(self.counts)])
            for i in range(len(self.counts)):
                pid = self.first_id + i
                for f in self.message_futures[first_message[i]:first_message[i + 1]]:
                    if pid in refused:
                        f.set_exception(PublishError(
                            f"publishing id {pid} refused (code {refused[pid]:#04x})",
                            publishing_id=pid, code=refused[pid]))
                    else:
                        f.set_result(pid)

    def fail(self, error: BaseException) -> None:
        self.future.set_exception(error)
        for f in self.message_futures or ():
            f.set_exception(error)

    def unsettled_frames(self, publisher_id: int) -> bytearray:
        """The frames that hold a publishing id neither confirmed nor
        refused, with another publisher id (after a reconnection): a frame
        the broker confirmed is not sent again, which would store its
        messages twice for an unnamed producer."""
        keep = []
        entry = 0
        for frame, count in publish_frames(memoryview(self.frames)):
            if not self.settled[entry:entry + count].all():
                keep.append(frame)
            entry += count
        return join_publish_frames(keep, publisher_id)


class Confirms:
    """The batches a producer sent that the broker has not settled yet, in
    publishing id order, and how many messages they hold (``in_flight``).
    Guarded by the producer's condition ``cond``, which is notified when
    batches settle."""

    def __init__(self, cond: threading.Condition, stats: PublisherStats) -> None:
        self.cond = cond
        self._stats = stats
        self.pending: deque[_Batch] = deque()
        self.in_flight = 0
        # Since when the broker has refused publishes for want of the
        # publisher, with no confirm between.
        self._gone_since: float | None = None

    @property
    def last_pending_id(self) -> int | None:
        """The highest publishing id awaiting its confirm (under ``cond``)."""
        return self.pending[-1].last_id if self.pending else None

    def add(self, record: _Batch) -> None:
        """A batch was sent (under ``cond``)."""
        self.pending.append(record)
        self.in_flight += record.messages
        self._stats.published += record.messages
        self._stats.written_bytes += len(record.frames)

    def confirmed(self, ids: np.ndarray) -> None:
        """The broker confirmed ``ids`` (from the reader thread)."""
        self._gone_since = None
        self.settle(ids, [])

    def refused(self, errors: tuple[P.PublishingError, ...],
                recovery_timeout: float) -> bool:
        """The broker refused publishing ids (from the reader thread): they
        fail with its code, but for a refusal for want of the publisher
        while it lasts less than ``recovery_timeout`` (never with 0): the
        broker dropped the publisher (its stream's leader moved) before
        the client heard of it, so nothing was written, and those ids stay
        pending for the recovery to send again. Whether to recover."""
        gone = any(e.code == PublisherDoesNotExist.code for e in errors)
        if gone:
            now = time.monotonic()
            if self._gone_since is None:
                self._gone_since = now
            gone = now - self._gone_since < recovery_timeout
            if gone:
                errors = tuple(e for e in errors
                               if e.code != PublisherDoesNotExist.code)
        if errors:
            ids = np.array([e.publishing_id for e in errors], dtype=np.int64)
            self.settle(ids, [(e.publishing_id, e.code) for e in errors])
        return gone

    def settle(self, ids: np.ndarray, failures: list[tuple[int, int]]) -> None:
        """The broker confirmed ``ids`` or refused them (``failures``: id and
        code): the batches whose every id is settled resolve, in order."""
        done = []
        with self.cond:
            pending = self.pending
            if not pending:
                return
            starts = np.fromiter((b.first_id for b in pending), np.int64,
                                 len(pending))
            ends = np.fromiter((b.last_id for b in pending), np.int64,
                               len(pending))
            which = np.searchsorted(starts, ids, side="right") - 1
            known = (which >= 0) & (ids <= ends[which])
            hits = np.bincount(which[known], minlength=len(pending))
            refused = dict(failures)
            for i in np.nonzero(hits)[0]:
                b = pending[i]
                b.settled[ids[known & (which == i)] - b.first_id] = True
                b.failures += [(pid, c) for pid, c in refused.items()
                               if b.first_id <= pid <= b.last_id]
            while pending and pending[0].settled.all():
                b = pending.popleft()
                self.in_flight -= b.messages
                self._count_settled(b)
                done.append(b)
            if done:
                self.cond.notify_all()
        for b in done:
            b.resolve()

    def fail_all(self, error: BaseException) -> int:
        """Fail every batch still pending with ``error``; how many messages
        they held."""
        with self.cond:
            pending, self.pending = list(self.pending), deque()
            failed, self.in_flight = self.in_flight, 0
            for b in pending:
                self._count_settled(b, error)
            self.cond.notify_all()
        for b in pending:
            b.fail(error)
        return failed

    def unsettled(self, publisher_id: int) -> tuple[list[bytearray], int | None]:
        """What a recovery sends again (under ``cond``): the frames of the
        pending batches not yet settled, and the first publishing id."""
        frames = [b.unsettled_frames(publisher_id) for b in self.pending]
        return frames, self.pending[0].first_id if self.pending else None

    def _count_settled(self, b: _Batch, error: BaseException | None = None) -> None:
        """Count a batch's messages as confirmed or errored (by the broker's
        code, or the error that failed it), under the lock."""
        stats = self._stats
        refused = 0
        for pid, code in b.failures:
            n = int(b.counts[pid - b.first_id])
            kind = f"code {code:#04x}"
            stats.errored[kind] = stats.errored.get(kind, 0) + n
            refused += n
        if error is not None:
            kind = type(error).__name__
            stats.errored[kind] = stats.errored.get(kind, 0) + b.messages - refused
        else:
            stats.confirmed += b.messages - refused
