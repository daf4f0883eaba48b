"""Subscriptions: a consumer's streams on the broker's connections, what
the reader threads hand them, and recovery.

Each connection's reader thread receives and decodes chunks (the C core,
without the GIL) and queues them here; a maintenance thread per consumer
resubscribes after failures (with backoff, after the last record received)
and watches super streams for new partitions. Credit (``credit.py``) keeps
the queue bounded; offsets (``offsets.py``) say where to start and what to
store. One stream's state is a ``stream_subscription.Subscription``. The
reading API on top of the queue is ``consumer.Consumer``, which holds a
``Subscriptions`` and takes from its queue through its methods.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import locks
from . import protocol as P
from ._core import Chunk
from .credit import Credit
from .errors import NoOffset, StreamError
from .records import Filter
from .retry import Backoff, retryable
from .stream_subscription import End, Queued, Subscription, cost
from .subscribing import Subscribing

if TYPE_CHECKING:
    from .admin import Admin
    from .offsets import OffsetTracker

log = logging.getLogger("pystream.consumer")


class Subscriptions:
    """The subscription side of a ``Consumer``: its streams' subscriptions,
    the queue the reader threads fill and the application takes from (under
    ``hold()``), what an interrupt kept from the application, and the
    maintenance thread that recovers them. The reading API is
    ``consumer.Consumer``."""

    def __init__(self, client: Admin, *, name: str | None,
                 single_active: bool, super_stream: str | None,
                 filter: Filter | None, credit: Credit,
                 decode_options: dict[str, Any], start: P.OffsetSpec,
                 auto_store: bool, store_every_records: int,
                 store_every_seconds: float, recovery_timeout: float,
                 partition_refresh_seconds: float) -> None:
        self.client = client
        self.name = name
        self.filter = filter
        self.single_active = single_active
        self.super_stream = super_stream
        self.credit_policy = credit
        self.chunk_size_hint = client.connection.frame_max or (1 << 20)
        self.auto_store = auto_store
        self.store_every_records = store_every_records
        self.store_every_seconds = store_every_seconds
        self.recovery_timeout = recovery_timeout
        self.partition_refresh_seconds = partition_refresh_seconds
        self._decode_options = decode_options
        self._start = start

        self._lock = threading.RLock()  # the lock of _cond, for short holds
        self._cond = threading.Condition(self._lock)
        self._broker = Subscribing(client, self._lock, name=name,
                                   single_active=single_active,
                                   super_stream=super_stream, filter=filter,
                                   decode_options=decode_options)
        self._queue: deque[Queued | End] = deque()
        self._subs: dict[str, Subscription] = {}
        self._broken_subs: set[Subscription] = set()
        # Where subscriptions go back to for rows an interrupt kept from the
        # application (see give_back); cleared once rewound.
        self._unreturned: dict[Subscription, int | None] = {}
        # The outage of the broken subscriptions: since when, the next wait.
        self._backoff = Backoff(recovery_timeout)
        self._closed = False
        self._closed_whole = False  # close() ran to its end
        # The offsets close() stores, each dropped once stored.
        self._stores_at_close: list[tuple[OffsetTracker, int | None]] = []
        self._ended = False     # no more chunks will come (see _end)
        self._wakers: list[Callable[[], None]] = []
        self._maintenance = locks.Event()
        # Credits to send from a thread of their own (the asyncio face)
        self._credit_writes: queue.SimpleQueue[tuple[Subscription, int] | None] | None = None
        # The connection each application thread last read itself.
        self._read_on = threading.local()

    def start(self, streams: list[str]) -> None:
        """Subscribe to ``streams`` and start the maintenance thread."""
        for s in streams:
            self._broker.subscribe(self._new_subscription(s))
        locks.new_thread(self._maintain, "pystream-consumer").start()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __getitem__(self, stream: str) -> Subscription:
        return self._subs[stream]

    def __len__(self) -> int:
        return len(self._subs)

    def values(self) -> list[Subscription]:
        """The subscriptions, one per stream read."""
        return list(self._subs.values())

    def queued(self) -> int:
        """How many chunks wait for the application."""
        return len(self._queue)

    # --- the reader threads' side -------------------------------------------

    def _admit(self, sub: Subscription, chunk: Chunk) -> bool:
        """Before ``chunk`` is decoded (the reader's thread): whether to
        decode it now, counted against the credit's budget (see
        ``CreditController.admit``). One that will be dropped is not
        decoded."""
        with self._lock:
            if not sub.live or not sub.active or self._ended:
                return False
            fits = sub.credit.admit(chunk.size, chunk.decoded_size)
            chunk.ticket = sub.credit.generation
            return fits

    def _chunks_arrived(self, sub: Subscription, chunks: list[Chunk]) -> None:
        """Queue what one read brought: one lock and one wake-up for all."""
        n = 0
        with self._lock:
            live = sub.live and sub.active
            for chunk in chunks:
                if chunk.ticket is None:
                    continue  # not admitted: dropped
                if not live or chunk.ticket != sub.credit.generation:
                    # Admitted, then the subscription broke or was rewound.
                    sub.credit.dropped(cost(chunk), chunk.ticket)
                    continue
                following = chunk.next_offset
                if sub.received is None or following > sub.received:
                    sub.received = following
                if chunk.committed_chunk_id is not None:
                    sub.committed_chunk_id = chunk.committed_chunk_id
                n += sub.credit.queued(following, chunk.num_records)
                self._queue.append(Queued(sub, chunk))
            if live:
                sub.last_arrival = time.monotonic()
                self._notify()
        if n:
            self.send_credit(sub, n)

    def _inflate(self, item: Queued | End) -> None:
        """Under the lock: decode the queue's head if its admission left it
        undecoded (it did not fit the budget beside the chunks before it).
        One that fails ends the consumer there, as on arrival."""
        if isinstance(item, End) or item.chunk.batch is not None:
            return
        chunk, sub = item.chunk, item.sub
        try:
            chunk.decode()
        except StreamError as exc:
            self._stop(exc, after_queue=False)
            self._maintenance.set()
            return
        sub.credit.inflated(chunk.size, chunk.decoded_size)
        item.batch = chunk.batch

    def _notify(self) -> None:
        # Most often nobody waits on the condition: the application's thread
        # reads for itself (``_read_while_waiting``) or is away.
        if self._cond._waiters:  # type: ignore[attr-defined]
            self._cond.notify_all()
        for waker in self._wakers:
            waker()

    def _interrupt_reads(self) -> None:
        """Stop an application thread reading for this consumer
        (``_read_while_waiting``): the consumer ended, or a
        subscription left its connection."""
        for sub in self._subs.values():
            conn = sub.connection
            if conn is not None:
                conn.interrupt_read()

    def send_credit(self, sub: Subscription, n: int) -> None:
        """Send ``n`` credits the controller granted (outside the lock), or
        hand them to the credit thread (``send_credit_in_background``)."""
        writes = self._credit_writes
        if writes is not None:
            writes.put((sub, n))
        else:
            self._write_credit(sub, n)

    def _write_credit(self, sub: Subscription, n: int) -> None:
        with self._lock:
            n = sub.credit.claim(n)
            conn = sub.connection if sub.live else None
            subscription_id = sub.subscription_id
        if not n or conn is None:
            return
        try:
            conn.send(P.Credit(subscription_id, n))
        except StreamError:
            return  # the connection is gone; recovery grants afresh
        sub.stats.credit_granted += n

    def send_credit_in_background(self) -> None:
        """From now on send credit from a thread of this consumer's, never
        the caller's: the asyncio face takes batches on its event loop,
        which a full socket buffer must not block. The thread ends with the
        consumer (``_maintain``)."""
        writes: queue.SimpleQueue[tuple[Subscription, int] | None] = queue.SimpleQueue()

        def write() -> None:
            while (item := writes.get()) is not None:
                self._write_credit(*item)

        self._credit_writes = writes
        locks.new_thread(write, "pystream-credit").start()

    def _end(self, error: BaseException | None, *, after_queue: bool) -> None:
        """End the consumer: ``error`` is raised to the application once the
        records queued before it were taken (or at once); with None,
        iteration just ends there."""
        with self._lock:
            if self._closed or self._ended:
                return
            self._stop(error, after_queue=after_queue)
        self._maintenance.set()

    def _stop(self, error: BaseException | None, *, after_queue: bool) -> None:
        """Under the lock: what ``_end`` does, also once it was done."""
        self._ended = True
        for sub in self._subs.values():
            sub.live = False
        if not after_queue:
            self._queue.clear()
        self._queue.append(End(error))
        self._notify()
        self._interrupt_reads()

    def _broken(self, sub: Subscription, cause: str) -> None:
        with self._lock:
            if not sub.live or self._closed:
                return
            self._break(sub, cause)
        self._maintenance.set()

    def _break(self, sub: Subscription, cause: str) -> None:
        """Under the lock: no more chunks for ``sub`` until the maintenance
        thread resubscribes it."""
        sub.live = False
        if sub.broken_at is None:
            sub.broken_at, sub.cause = time.monotonic(), cause
        self._broken_subs.add(sub)
        self._backoff.start()
        self._interrupt_reads()

    def take_back(self) -> None:
        """Rewind to ``_unreturned``, and only then forget it: an interrupt
        in between leaves it for the next call (rewinding is idempotent)."""
        if self._unreturned:
            self._rewind(self._unreturned, "interrupted")
            self._unreturned = {}

    def _rewind(self, positions: dict[Subscription, int | None], cause: str) -> None:
        """Take back what the application never got: an exception escaped
        between a take and its return, or stopped a read halfway (a
        ``KeyboardInterrupt`` the application catches and reads on). Each
        subscription goes back to its position in ``positions``, drops what
        it queued, and resubscribes from there; nothing is lost or doubled."""
        with self._lock:
            if self._closed or self._ended:
                return
            for sub, position in positions.items():
                if position is None:  # nothing handed yet: from what came
                    # A loop, not next() over a generator, whose finalizer
                    # drops an interrupt landing in it.
                    for q in self._queue:
                        if isinstance(q, Queued) and q.sub is sub:
                            position = q.chunk.first_offset
                            break
                sub.rewound(position)
                sub.rewinds += 1
                self._drop_queued(sub)
                if sub.live:  # else broken already: recovery starts there
                    self._break(sub, cause)
        self._maintenance.set()

    def _drop_queued(self, sub: Subscription) -> None:
        """Under the lock: forget what ``sub`` queued, to be read again
        from its position."""
        kept = [q for q in self._queue if isinstance(q, End) or q.sub is not sub]
        self._queue.clear()
        self._queue.extend(kept)
        sub.received = None
        sub.credit.emptied()

    # --- the application's side (``Consumer``) --------------------------------

    def hold(self) -> threading.RLock:
        """The lock the application's side holds while it takes from the
        queue (``head``, ``first``, ``done``) and moves positions (the
        condition's lock itself: see ``locks``)."""
        return self._lock

    def head(self, deadline: float | None, read_while_waiting: bool) -> Queued | None:
        """Under ``hold()``: the queue's first chunk, waiting for one until
        ``deadline``; None at the deadline or once closed. Raises the error
        that ended the consumer."""
        while not self._queue:
            if self._closed:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if not (read_while_waiting and self._read_while_waiting(left)):
                locks.wait(self._cond, left)
        self._inflate(self._queue[0])  # may end the consumer there instead
        item = self._queue[0]
        if isinstance(item, End):
            self._closed = True
            self._queue.clear()
            if item.error is not None:
                raise item.error
            return None
        return item

    def first(self) -> Queued | None:
        """Under ``hold()``: the queue's first chunk, if any (None at the
        end); no waiting."""
        item = self._queue[0] if self._queue else None
        return item if isinstance(item, Queued) else None

    def done(self) -> None:
        """Under ``hold()``: the queue's first chunk was handed whole."""
        self._queue.popleft()

    def _read_while_waiting(self, timeout: float | None) -> bool:
        """Wait for the queue by reading the socket in this thread, when the
        consumer reads one stream on a connection of its own: the next batch
        is then in hand when its ``recv`` returns, with no wake-up of this
        thread in between (see ``readturn``). False to wait on the lock as
        usual: on a shared connection, another consumer's thread would wait
        for the turn while its chunks come in. Called under the lock, which
        whoever reads needs: let go of it meanwhile."""
        if len(self._subs) != 1:
            return False
        sub = next(iter(self._subs.values()))
        conn = sub.connection
        if conn is None or not sub.live or conn.subscription_count != 1:
            return False
        last = getattr(self._read_on, "conn", None)
        if last is not None and last is not conn:
            self.end_read()  # the subscription moved since
        try:
            self._lock.release()  # first in the try: interrupted after, taken again
            self._read_on.conn = conn  # its turn may stay with this thread
            return conn.read_until(
                lambda: bool(self._queue) or self._closed
                or not sub.live or sub.connection is not conn, timeout)
        finally:
            self._lock.acquire()

    def end_read(self) -> None:
        """Let the reader threads read again once the data this thread read
        for itself (``_read_while_waiting``) was handed over, unless this
        thread comes back for more within moments (``Connection.end_read``)."""
        conn = getattr(self._read_on, "conn", None)
        if conn is not None:
            conn.end_read()  # first: interrupted between, it lends again
            self._read_on.conn = None

    def unreturned(self) -> bool:
        """Whether rows an exception kept from the application wait to be
        taken back (``give_back``)."""
        return bool(self._unreturned)

    def give_back(self, taken: dict[Subscription, int | None]) -> None:
        """Rewind to where ``taken`` says the rows an exception kept from
        the application began (at once, or on the next call if interrupted
        here)."""
        self._unreturned = taken | self._unreturned
        self.take_back()

    def completed(self) -> None:
        """The application is back for more: the records handed so far were
        processed (what a named consumer leaving with an exception stores)."""
        with self._lock:
            for sub in self._subs.values():
                sub.completed = sub.position

    def grant(self, chunks: int) -> None:
        """Let the broker send ``chunks`` more chunks (``Credit.manual``)."""
        with self._lock:
            sends = [(sub, sub.credit.manual(chunks)) for sub in self._subs.values()]
        for sub, n in sends:
            self.send_credit(sub, n)

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call ``waker()`` whenever data or an error is queued."""
        with self._lock:
            self._wakers.append(waker)

    def close(self, *, handed: bool) -> None:
        """Store (named consumers) the offset of the last record handed, or
        with ``handed`` False only what was processed
        (``Subscription.completed``); unsubscribe, free the connections.
        A close an interrupt stopped finishes on the next call."""
        with self._lock:
            if self._closed_whole:
                return
            subs = list(self._subs.values())
            if not self._closed:
                for sub, position in self._unreturned.items():  # for the store
                    sub.rewound(position)
                # A subscription single active elsewhere stores nothing: the
                # active consumer's progress is not this one's to overwrite.
                stores = [(sub.tracker, sub.position if handed else sub.completed)
                          for sub in subs if sub.tracker is not None and sub.active]
                for sub in subs:
                    sub.live = False
                self._queue.clear()
                # One statement: closed with its stores, or not at all.
                self._stores_at_close, self._closed = stores, True
            self._notify()
            self._interrupt_reads()
        self._maintenance.set()
        while self._stores_at_close:
            tracker, position = self._stores_at_close[-1]
            try:
                tracker.flush(position)
            except StreamError as exc:
                log.warning("could not store the offset of %r: %s",
                            self.name, exc)
            self._stores_at_close.pop()
        for sub in subs:
            self._broker.unsubscribe(sub)
        self._closed_whole = True

    # --- subscribing ------------------------------------------------------------

    def _new_subscription(self, stream: str) -> Subscription:
        start, position = self._start, None
        if self.name is not None and not self.single_active:
            try:
                stored = self.client.query_offset(stream, self.name)
                start = P.OffsetSpec(P.OFFSET_OFFSET, stored + 1)
            except NoOffset:
                pass
        if start.type == P.OFFSET_OFFSET:
            position = start.value
        # Pinned after position: that stays None until the first chunk, as
        # for any "next" or "last" start.
        sub = Subscription(self, stream, self._broker.pinned(stream, start), position)
        self._subs[stream] = sub
        return sub

    # --- maintenance thread -----------------------------------------------------

    def _maintain(self) -> None:
        """Resubscribe broken subscriptions with backoff; pick up new
        partitions of a super stream."""
        retry_in = 0.0
        next_refresh = time.monotonic() + self.partition_refresh_seconds
        while True:
            with self._lock:
                broken = list(self._broken_subs)
            wait = (retry_in if broken else
                    max(0.0, next_refresh - time.monotonic())
                    if self.super_stream is not None else None)
            if wait is None or wait > 0:
                self._maintenance.wait(wait)
                self._maintenance.clear()
            if self._closed or self._ended:
                for sub in list(self._subs.values()):
                    self._broker.unsubscribe(sub)
                if self._credit_writes is not None:
                    self._credit_writes.put(None)
                return
            with self._lock:
                broken = list(self._broken_subs)
            if broken:
                retry_in = self._recover(broken)
            elif (self.super_stream is not None
                    and time.monotonic() >= next_refresh):
                next_refresh = time.monotonic() + self.partition_refresh_seconds
                self._refresh_partitions(self.super_stream)

    def _recover(self, broken: list[Subscription]) -> float:
        """One attempt at every broken subscription; the wait before the
        next, if some are still (or again) broken."""
        for sub in broken:
            # The broker forgot the subscription if its connection or
            # stream went, not if it was rewound: Unsubscribe if still open.
            self._broker.unsubscribe(sub)
            try:
                # Where it subscribed, not where it stood before: a rewind
                # meanwhile moves the start.
                spec = self._broker.subscribe(sub)
            except Exception as exc:
                if not retryable(exc):  # e.g. the stream deleted
                    self._end(exc, after_queue=True)
                    return 0.0
                log.info("resubscribing to %r failed: %s", sub.stream, exc)
                if self._backoff.expired():
                    self._end(self._backoff.final(sub.stream, exc), after_queue=True)
                return self._backoff.failed()
            with self._lock:
                if not sub.live:  # broken again already (or rewound): next round
                    continue
                self._broken_subs.discard(sub)
                if not self._broken_subs:
                    self._backoff.reset()
                broken_at, sub.broken_at = sub.broken_at, None
            if broken_at is not None:  # not a new partition
                sub.recovered(spec, time.monotonic() - broken_at)
        with self._lock:
            again = bool(self._broken_subs)
        # Broken again already: as after a failed attempt (the producer's
        # recovery does the same), so a flapping stream is not hammered.
        return self._backoff.failed() if again else 0.0

    def _refresh_partitions(self, super_stream: str) -> None:
        try:
            streams = self.client.partitions(super_stream)
        except StreamError as exc:
            log.info("partitions of %r: %s", super_stream, exc)
            return
        for stream in streams:
            if stream not in self._subs:
                # A new partition: everything in it is new to this consumer.
                sub = Subscription(self, stream, P.OffsetSpec(P.OFFSET_FIRST), None)
                with self._lock:
                    self._subs[stream] = sub
                    self._broken_subs.add(sub)
                self._maintenance.set()
