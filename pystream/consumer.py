"""The consumer's reading API: a stream's records as Arrow batches, at the
speed of the socket, with bounded memory and recovery that neither loses nor
repeats a record.

``Consumer`` hands the application what the subscriptions
(``subscription.py``: the reader threads' side, subscribing, recovery)
queued: batches, tables or record views, moving the position, the credit and
the stored offset as it goes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from ._core import schema
from .arrow import binary_bodies, consumer_stream
from .credit import Credit
from .errors import StreamError
from .offsets import Offset, offset_spec
from .records import Filter, Message
from .stream_subscription import Queued, Subscription
from .subscription import Subscriptions

if TYPE_CHECKING:
    from .admin import Admin

log = logging.getLogger("pystream.consumer")

_T = TypeVar("_T")
_R = TypeVar("_R")

# Without batch limits, queued chunks join into one batch while it stays
# under this many rows (see Consumer._take).
JOIN_ROWS = 1024


class MessageCursor:
    """Where a ``messages()`` loop is: the chunk it hands record by record
    (its offsets; with ``body="binary"`` its bodies, copied off the receive
    buffer once) and the subscription of the record it handed last."""

    __slots__ = ("consumer", "item", "offsets", "sub", "copied", "copied_from",
                 "base")

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.item: Queued | None = None
        self.offsets: list[int] = []
        self.sub: Subscription | None = None
        self.copied: pa.RecordBatch | None = None
        self.copied_from: Queued | None = None
        self.base = 0  # the chunk's row at the copy's row 0

    def next(self, timeout: float | None) -> Message | None:
        """The next record, handed alone; None after ``timeout`` seconds
        without one or once closed. The application is back for more: the
        record before is processed."""
        consumer = self.consumer
        subs = consumer._subs
        sends: list[tuple[Subscription, int]] = []
        sub = row = None
        try:  # Consumer._handed_next, shortened to the lock's hold
            with subs.hold():
                last = self.sub
                if last is not None:
                    last.completed = last.position
                    self.sub = None
                item = self.item
                # More of its chunk, still at the head of the queue (it
                # leaves once deactivated, rewound or closed).
                if (item is not None and subs.first() is item
                        and not subs.unreturned()
                        and item.handed < len(self.offsets)):
                    began = item.sub.position
                    sub = item.sub
                    row = self.take(item, sends)
            if item is not None and row is not None:
                for s, n in sends:
                    subs.send_credit(s, n)
                return self.message(item, row)
        except BaseException:
            if sub is not None:
                subs.give_back({sub: began})
            raise
        return consumer._handed_next(timeout, self.take, self.message)

    def take(self, item: Queued, sends: list[tuple[Subscription, int]]
             ) -> int | None:
        """Under the consumer's lock: hand the next record of the queue's
        head, its row (None if the chunk had no more)."""
        if self.item is not item:
            self.consumer._filter(item)
            self.item = item
            self.offsets = item.batch.column(0).to_numpy().tolist()  # type: ignore[union-attr]
        sub = item.sub
        row = item.handed
        total = len(self.offsets)
        if row < total:
            item.handed = row + 1
            sub.position = self.offsets[row] + 1
            self.sub = sub
        if item.handed >= total:  # the chunk is done: count it
            self.consumer._account(item, sends)
        return row if row < total else None

    def message(self, item: Queued, row: int) -> Message:
        """Outside the lock: the record at ``row`` of ``item``."""
        if not self.consumer._copy_bodies:
            return Message(item.batch, row)  # type: ignore[arg-type]
        if self.copied_from is not item or self.base > row:
            # The chunk's rows left, off the receive buffer, copied once.
            self.copied_from, self.base = item, row
            self.copied = binary_bodies(item.batch.slice(row))  # type: ignore[union-attr]
        return Message(self.copied, row - self.base)  # type: ignore[arg-type]


class Consumer:
    """Reads one stream, or every partition of a super stream.

    Iterate it for ``pyarrow.RecordBatch`` es (one per chunk, small chunks
    already queued joined up to ``JOIN_ROWS`` rows, or coalesced to
    ``max_batch_rows`` / ``max_batch_bytes``); ``batches(timeout)`` stops
    after ``timeout`` seconds without data; ``read(max_rows, timeout)``
    returns a ``pyarrow.Table``; ``messages()`` yields per-record views.
    Use it as a context manager, or call ``close()``.

    Options:

    ``offset``
        ``"first"``, ``"last"``, ``"next"`` (default), an offset, or a
        ``datetime``. A named consumer with a stored offset resumes after it
        instead.
    ``name``
        The consumer's name: its offset is stored on the broker (every
        ``store_every_records`` records or ``store_every_seconds`` seconds
        and on close, unless ``auto_store=False``; ``store_offset()`` stores
        at once). Needed for ``single_active``.
    ``crc``, ``amqp``, ``columns``, ``body``, ``error_policy``,
    ``max_subbatch_size``, ``max_chunk_size``
        Decoding, as for ``pystream.decode``.
    ``credit``
        A ``Credit`` policy (default ``Credit.adaptive()``: at most 64 MiB
        queued).
    ``filter``
        A ``Filter`` (RabbitMQ 3.13+).
    ``single_active``
        Single active consumer (3.11+): of the consumers sharing ``name``
        on a stream, one receives; the next takes over where the stored
        offset says.
    ``super_stream``
        Read every partition of this super stream (3.11+; pass no
        ``stream``); new partitions are picked up every
        ``partition_refresh_seconds``. Batches carry their partition in the
        schema metadata key ``b"stream"``.
    ``recovery_timeout``
        Seconds a lost stream may stay away before ``ConnectionLost`` ends
        the consumer (default 300).
    ``read_while_waiting``
        A thread waiting for the next batch reads the socket itself (default
        True; one stream on a connection of its own, plain TCP), and keeps
        the turn to read for a millisecond after each batch: no thread
        wake-up per batch, for latency. False leaves reading and decoding to
        the connection's reader thread, where it overlaps with the
        application's work on the previous batch: faster for bulk reads
        that do work per batch (``read_range`` sets it).
    """

    def __init__(self, client: Admin, stream: str | None,
                 offset: Offset = "next", *, name: str | None = None,
                 crc: bool = True, amqp: bool = True,
                 columns: Sequence[str] | None = None, body: str = "view",
                 error_policy: str = "raise",
                 max_subbatch_size: int = 64 << 20,
                 max_chunk_size: int = 1 << 30,
                 credit: Credit | None = None, filter: Filter | None = None,
                 single_active: bool = False, super_stream: str | None = None,
                 max_batch_rows: int | None = None,
                 max_batch_bytes: int | None = None,
                 auto_store: bool = True, store_every_records: int = 10_000,
                 store_every_seconds: float = 5.0,
                 recovery_timeout: float = 300.0,
                 partition_refresh_seconds: float = 30.0,
                 read_while_waiting: bool = True) -> None:
        if (stream is None) == (super_stream is None):
            raise ValueError("give a stream or super_stream=, not both")
        if single_active and name is None:
            raise ValueError("single_active needs a name")
        features = client.connection.features
        if single_active:
            features.require("single_active_consumer")
        if filter is not None:
            features.require("filtering")
        # body="binary": chunks decode as views and the bodies are copied
        # once, after queued chunks join (``_next_batch``); decoded straight
        # to binary, the join would copy them a second time. A post filter
        # sees the type asked for, so its chunks decode to binary.
        self._copy_bodies = body == "binary" and (
            filter is None or filter.post_filter is None)
        self.client = client
        self.name = name
        self.filter = filter
        self.super_stream = super_stream
        self._subs = Subscriptions(
            client, name=name, single_active=single_active,
            super_stream=super_stream, filter=filter,
            credit=credit or Credit.adaptive(),
            decode_options=dict(
                crc=crc, amqp=amqp, columns=columns,
                body="view" if self._copy_bodies else body,
                error_policy=error_policy, max_subbatch_size=max_subbatch_size,
                max_chunk_size=max_chunk_size),
            start=offset_spec(offset), auto_store=auto_store,
            store_every_records=store_every_records,
            store_every_seconds=store_every_seconds,
            recovery_timeout=recovery_timeout,
            partition_refresh_seconds=partition_refresh_seconds)
        self.max_batch_rows = max_batch_rows
        self.max_batch_bytes = max_batch_bytes
        self.read_while_waiting = read_while_waiting
        self.schema = schema(columns=columns, body=body,  # type: ignore[arg-type]
                             error_policy=error_policy)  # type: ignore[arg-type]
        try:
            self._subs.start(
                [stream] if stream is not None
                else client.partitions(super_stream))  # type: ignore[arg-type]
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        what = self.super_stream or next(iter(self.positions), "")
        return f"<pystream.Consumer {what!r} position={self.positions}>"

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (or the consumer ended)."""
        return self._subs.closed

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # Leaving with an exception, the records in the application's hands
        # may not have been processed: only those it came back after count.
        self._close(handed=exc_type is None)

    # --- the application's side ---------------------------------------------

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.batches()

    def batches(self, timeout: float | None = None) -> Iterator[pa.RecordBatch]:
        """Batches as they come; ends after ``timeout`` seconds without one
        (never, with None) or when the consumer is closed."""
        while True:
            self._completed()
            batch = self._next_batch(timeout)
            if batch is None:
                return
            yield batch

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The batches until a second passes without one, as an Arrow C
        stream: ``duckdb.sql("SELECT ... FROM consumer")``."""
        return consumer_stream(self).__arrow_c_stream__(requested_schema)

    def read(self, max_rows: int, timeout: float | None = None) -> pa.Table:
        """Up to ``max_rows`` records, waiting at most ``timeout`` seconds for
        them; the rest of a chunk stays for the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        parts: list[pa.RecordBatch] = []
        rows = 0
        taken: dict[Subscription, int | None] = {}
        self._completed()
        try:
            while rows < max_rows:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                batch = self._next_batch(left, max_rows - rows, taken)
                if batch is None:
                    break
                parts.append(batch)
                rows += batch.num_rows
            return pa.Table.from_batches(parts, schema=self.schema)
        except BaseException:
            self._give_back(taken)  # what it took goes back with the error
            raise

    def messages(self, timeout: float | None = None) -> Iterator[Message]:
        """Record by record (``Message`` views), ending after ``timeout``
        seconds without one; convenient, not fast. Each record is handed
        (position, credit, offset tracking) as it is yielded: leaving the
        loop early leaves the rest queued."""
        self._completed()
        cursor = MessageCursor(self)
        while True:
            message = cursor.next(timeout)
            if message is None:
                return
            yield message

    @property
    def position(self) -> int | None:
        """The offset of the next record for the application (None before
        the first chunk of a ``"first"``/``"last"``/``"next"`` start). For a
        super stream, see ``positions``."""
        if self.super_stream is not None:
            raise TypeError("a super stream consumer has one position per "
                            "partition: use positions")
        return next(iter(self._subs.values())).position

    @property
    def positions(self) -> dict[str, int | None]:
        """The next offset of each stream read (each partition of a super
        stream), ``None`` before its first chunk."""
        return {sub.stream: sub.position for sub in self._subs.values()}

    @property
    def committed_chunk_id(self) -> int | None:
        """The broker's last committed chunk as of the last delivery
        (Deliver v2, RabbitMQ 3.11+), else None."""
        ids = [s.committed_chunk_id for s in self._subs.values()
               if s.committed_chunk_id is not None]
        return max(ids) if ids else None

    def lag(self) -> int | None:
        """Offsets committed on the broker and not yet handed, summed over
        partitions, from the broker's stream statistics (3.11+; None
        before). Counted to the start of the last committed chunk, so it may
        be short by up to one chunk; 0 once caught up (see
        ``Subscription.lag``)."""
        if not self.client.supports("stream_stats"):
            return None
        return sum(sub.lag() or 0 for sub in list(self._subs.values()))

    def store_offset(self, offset: int | None = None) -> None:
        """Store ``offset`` (default: the last record handed) for ``name``."""
        if self.name is None:
            raise ValueError("only a named consumer has a stored offset")
        for sub in self._subs.values():
            if not sub.active:  # single active: another consumer's to store
                continue
            last = offset if offset is not None else (
                None if sub.position is None else sub.position - 1)
            if last is not None and last >= 0:
                sub.store_offset(last)
                if sub.tracker is not None:
                    sub.tracker.stored = last

    def grant_credit(self, chunks: int) -> None:
        """Let the broker send ``chunks`` more chunks (``Credit.manual``)."""
        self._subs.grant(chunks)

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call ``waker()`` (from another thread) whenever data or an error
        is queued; the asyncio face uses it."""
        self._subs.add_waker(waker)

    def _send_credit_in_background(self) -> None:
        """From now on send credit from a thread of this consumer's (the
        asyncio face; see ``Subscriptions.send_credit_in_background``)."""
        self._subs.send_credit_in_background()

    def close(self) -> None:
        """Store the offset of the last record handed (named consumers),
        unsubscribe, free the connections. Iteration in other threads ends."""
        self._close(handed=True)

    def _close(self, *, handed: bool) -> None:
        """``close``; storing, with ``handed`` False, only what was
        processed (``Subscription.completed``)."""
        self._subs.close(handed=handed)

    # --- taking from the queue ------------------------------------------------

    def _completed(self) -> None:
        self._subs.completed()

    def _give_back(self, taken: dict[Subscription, int | None]) -> None:
        self._subs.give_back(taken)

    def _next_batch(self, timeout: float | None, max_rows: int | None = None,
                    taken: dict[Subscription, int | None] | None = None,
                    ) -> pa.RecordBatch | None:
        """The next batch; ``taken`` learns where the first take of each
        subscription began (where ``read`` rewinds to)."""
        def take(item: Queued, sends: list[tuple[Subscription, int]]
                 ) -> list[pa.RecordBatch] | None:
            return self._take(item, sends, max_rows) or None

        def finish(item: Queued, parts: list[pa.RecordBatch]) -> pa.RecordBatch:
            # Joined outside the lock: the reader threads queue meanwhile.
            batch = (parts[0] if len(parts) == 1 else
                     pa.concat_batches(parts))  # type: ignore[attr-defined]  # pyarrow 19+; pyarrow-stubs 20 lacks it
            if self._copy_bodies:
                batch = binary_bodies(batch)
            if self.super_stream is not None:
                batch = batch.replace_schema_metadata(
                    {b"stream": item.sub.stream.encode()})
            return batch

        return self._handed_next(timeout, take, finish, taken)

    def _handed_next(self, timeout: float | None,
                     take: Callable[[Queued, list[tuple[Subscription, int]]], _T | None],
                     finish: Callable[[Queued, _T], _R],
                     taken: dict[Subscription, int | None] | None = None,
                     ) -> _R | None:
        """What ``take`` hands from the queue's head (under the lock; None
        if that chunk had nothing for it), made into the result by
        ``finish`` (outside it); None after ``timeout`` seconds or once
        closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        subs = self._subs
        handed: dict[Subscription, int | None] = {}  # where the result began
        try:
            subs.take_back()
            while True:
                sends: list[tuple[Subscription, int]] = []
                began: dict[Subscription, int | None] = {}
                # An exception past the take (a KeyboardInterrupt the
                # application catches) would lose the rows: they go back,
                # recorded first with no call in between (an interrupt
                # lands at calls), rewound at once or on the next call.
                try:
                    with subs.hold():
                        item = subs.head(deadline, self.read_while_waiting)
                        if item is None:
                            return None
                        began[item.sub] = self._next_offset(item)
                        got = take(item, sends)
                    for sub, n in sends:
                        subs.send_credit(sub, n)
                    if got is not None:
                        result = finish(item, got)
                        handed = began
                        if taken is not None:
                            for sub, offset in began.items():
                                taken.setdefault(sub, offset)
                        return result
                except BaseException:
                    subs.give_back(began)
                    raise
        finally:
            try:
                subs.end_read()
            except BaseException:
                # Interrupted here, the result never reaches the caller.
                subs.give_back(handed)
                raise

    @staticmethod
    def _next_offset(item: Queued) -> int | None:
        """The offset of the queue head's next record for the application:
        its subscription's position, or (nothing handed yet) the chunk's
        first."""
        sub, chunk = item.sub, item.chunk
        return sub.position if sub.position is not None else chunk.first_offset

    def _filter(self, item: Queued) -> None:
        if not item.filtered:
            if self.filter is not None and self.filter.post_filter is not None:
                assert item.batch is not None  # decoded by Subscriptions.head
                rows = item.batch.num_rows
                item.batch = self.filter.apply(item.batch)
                item.sub.stats.filtered += rows - item.batch.num_rows
            item.filtered = True  # after: an interrupted filter runs again

    def _take(self, item: Queued, sends: list[tuple[Subscription, int]],
              max_rows: int | None) -> list[pa.RecordBatch]:
        """Hand rows from the head of the queue, and the chunks of the same
        stream queued behind it up to the batch limits: the parts of the
        next batch (none if they held no rows).

        Without ``max_batch_rows`` / ``max_batch_bytes``, whole chunks
        queued behind the head join it while the batch stays under
        ``JOIN_ROWS``: a backlog of small chunks (a low publishing rate, a
        consumer that fell behind) then costs one batch, not one per chunk,
        and large chunks still come one per batch, uncopied. Only what is
        queued is joined: nothing waits for more."""
        first = self._hand(item, sends, max_rows)
        parts = [first] if first is not None and first.num_rows else []
        rows = parts[0].num_rows if parts else 0
        size = item.chunk.size
        limit_rows = 1 << 62
        if max_rows is not None:
            limit_rows = max_rows
        if self.max_batch_rows is not None and self.max_batch_rows < limit_rows:
            limit_rows = self.max_batch_rows
        limited = self.max_batch_rows is not None or self.max_batch_bytes is not None
        while rows < limit_rows:
            nxt = self._subs.first()
            if nxt is None or nxt.sub is not item.sub or nxt.batch is None:
                break  # another stream, the end, or not decoded yet
            take: int | None = limit_rows - rows
            if limited:
                if (self.max_batch_bytes is not None and parts
                        and size + nxt.chunk.size > self.max_batch_bytes):
                    break
            else:
                take = None  # whole chunks only
                if rows + nxt.batch.num_rows - nxt.handed > min(limit_rows, JOIN_ROWS):
                    break
            more = self._hand(nxt, sends, take)
            size += nxt.chunk.size
            if more is not None and more.num_rows:
                parts.append(more)
                rows += more.num_rows
        return parts

    def _hand(self, item: Queued, sends: list[tuple[Subscription, int]],
              max_rows: int | None) -> pa.RecordBatch | None:
        """Give the application up to ``max_rows`` rows of the queue head,
        moving the position, the credit and the offset tracking."""
        sub = item.sub
        if not item.filtered:
            self._filter(item)
        batch = item.batch
        assert batch is not None
        total = batch.num_rows
        start = item.handed
        end = total if max_rows is None else min(total, start + max_rows)
        out = batch.slice(start, end - start) if (start or end < total) else batch
        item.handed = end
        if end < total:
            sub.position = batch.column(0)[end - 1].as_py() + 1
        self._account(item, sends)
        return out

    def _account(self, item: Queued, sends: list[tuple[Subscription, int]]) -> None:
        """Count the rows of the queue head handed since it was last
        counted: credit, metrics, offset tracking; a chunk handed whole
        leaves the queue."""
        sub, chunk, batch = item.sub, item.chunk, item.batch
        assert batch is not None  # decoded by Subscriptions.head
        total = batch.num_rows
        start, end = item.accounted, item.handed
        item.accounted = end
        before = start / total if total else 0.0
        if end >= total:
            self._subs.done()
            following = chunk.next_offset
            if sub.position is None or following > sub.position:
                sub.position = following
            after = 1.0
        else:
            after = end / total
        sub.count_handed(chunk, batch, start, end)
        n = sub.credit.handed(item.cost, before, after)
        if n:
            sends.append((sub, n))
        if sub.tracker is not None and end > start:
            try:
                # Up to what was processed, not what is being handed.
                sub.tracker.handed(end - start, sub.completed)
            except StreamError as exc:
                log.warning("could not store the offset of %r: %s", self.name, exc)
