"""The consumer: a stream's records as Arrow batches, at the speed of the
socket, with bounded memory and recovery that neither loses nor repeats a
record.

Threads: each connection's reader thread receives and decodes chunks (the C
core, without the GIL) and queues them here; the application takes them from
the queue; a maintenance thread per consumer resubscribes after failures and
watches super streams for new partitions. Credit (``credit.py``) keeps the
queue bounded; offsets (``offsets.py``) say where to start and what to store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import protocol as P
from ._core import Chunk, schema
from .arrow import consumer_stream
from .credit import Credit, CreditController, subscribe_credit
from .errors import (FIRST_RETRY_DELAY, RECOVERABLE, ConnectionClosed,
                     ConnectionLost, NoOffset, StreamDoesNotExist, StreamError,
                     next_retry_delay)
from .offsets import Offset, OffsetTracker, offset_spec

if TYPE_CHECKING:
    from .client import Client
    from .connection import Connection

log = logging.getLogger("pystream")

PostFilter = Union[pc.Expression, Callable[[pa.RecordBatch], Any]]



@dataclass(frozen=True)
class Filter:
    """Broker-side filtering (RabbitMQ 3.13+): only chunks whose filter
    values include one of ``values`` (and, with ``match_unfiltered``, chunks
    written without filter values) are sent. The broker filters whole
    chunks, so records of other values still arrive: ``post_filter`` drops
    them, vectorised over each batch. It is an Arrow compute expression
    (``pc.field("application_properties")...``) or a callable taking the
    batch and returning a boolean mask or a filtered batch."""

    values: Sequence[str]
    match_unfiltered: bool = False
    post_filter: PostFilter | None = None

    def properties(self) -> dict[str, str]:
        props = {f"filter.{i}": v for i, v in enumerate(self.values)}
        props["match-unfiltered"] = "true" if self.match_unfiltered else "false"
        return props

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        f = self.post_filter
        if f is None or batch.num_rows == 0:
            return batch
        if isinstance(f, pc.Expression):
            return take_rows(batch, _rows_matching(batch, f))
        result = f(batch)
        if isinstance(result, pa.RecordBatch):
            return result
        return filter_batch(batch, result)


def _rows_matching(batch: pa.RecordBatch, expression: pc.Expression) -> np.ndarray:
    """Rows where ``expression`` holds, evaluated without the binary_view
    columns (Arrow 26 has no kernels for them)."""
    plain = [i for i, t in enumerate(batch.schema.types) if t != pa.binary_view()]
    table = pa.Table.from_batches([batch.select(plain)]).append_column(
        "__row", pa.array(np.arange(batch.num_rows)))
    return table.filter(expression).column("__row").to_numpy()


def filter_batch(batch: pa.RecordBatch, mask: Any) -> pa.RecordBatch:
    """``batch.filter(mask)`` that also works on ``binary_view`` bodies."""
    mask = pa.array(mask, pa.bool_()) if not isinstance(mask, pa.Array) else mask
    return take_rows(batch, pc.indices_nonzero(mask.fill_null(False)).to_numpy())


def take_rows(batch: pa.RecordBatch, rows: np.ndarray) -> pa.RecordBatch:
    """``batch.take(rows)`` that also works on ``binary_view`` bodies (Arrow
    26 has no take kernel for them): the 16-byte views of the kept rows are
    gathered, the body bytes stay where they are."""
    keep = pa.array(rows, pa.int64())
    columns = []
    for column in batch.columns:
        if column.type == pa.binary_view():
            columns.append(_take_views(column, rows))
        else:
            columns.append(column.take(keep))
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _take_views(array: pa.Array, rows: np.ndarray) -> pa.Array:
    buffers = array.buffers()
    views = np.frombuffer(buffers[1], dtype=np.uint64).reshape(-1, 2)
    gathered = views[array.offset:array.offset + len(array)][rows]
    validity = None
    if array.null_count:
        validity = pc.take(array.is_valid(), rows).buffers()[1]
    return pa.Array.from_buffers(pa.binary_view(), len(rows),
                                 [validity, pa.py_buffer(gathered)] + buffers[2:])


class _Queued:
    """A chunk waiting for the application, or (``sub`` None) the end of the
    consumer with the error to raise there, if any."""

    __slots__ = ("sub", "chunk", "batch", "handed", "filtered", "error")

    def __init__(self, sub: _Subscription | None, chunk: Chunk | None,
                 error: BaseException | None = None) -> None:
        self.sub = sub
        self.chunk = chunk
        self.batch = chunk.batch if chunk is not None else None
        self.handed = 0          # rows of ``batch`` handed so far
        self.filtered = False    # post filter applied
        self.error = error


class _Subscription:
    """One stream of a consumer on one connection; the connection's
    ``SubscriptionSink``. Its state changes under the consumer's lock."""

    def __init__(self, consumer: Consumer, stream: str, start: P.OffsetSpec,
                 position: int | None) -> None:
        self.consumer = consumer
        self.stream = stream
        self.start = start                  # offset of a fresh subscription
        self.position = position            # next offset for the application
        self.received: int | None = None    # next offset after the last chunk received
        self.committed_chunk_id: int | None = None
        self.credit = CreditController(consumer.credit_policy,
                                       consumer.chunk_size_hint)
        self.connection: Connection | None = None
        self.subscription_id = -1
        self.live = False                   # chunks from the broker are wanted
        self.active = not consumer.single_active
        self.tracker: OffsetTracker | None = None
        if consumer.name is not None and consumer.auto_store:
            self.tracker = OffsetTracker(
                self.store_offset, every_records=consumer.store_every_records,
                every_seconds=consumer.store_every_seconds)

    def resume_spec(self) -> P.OffsetSpec:
        """Where to subscribe again: after the last record received (queued
        chunks stay queued), or where we started if nothing came."""
        if self.received is not None:
            return P.OffsetSpec(P.OFFSET_OFFSET, self.received)
        if self.position is not None:
            return P.OffsetSpec(P.OFFSET_OFFSET, self.position)
        return self.start

    def store_offset(self, offset: int) -> None:
        conn = self.connection
        if conn is None or not conn.is_open:
            conn = self.consumer.client.connection
        conn.send(P.StoreOffset(self.consumer.name or "", self.stream, offset))

    # --- SubscriptionSink (reader thread) -----------------------------------

    def on_chunk(self, chunk: Chunk) -> None:
        self.consumer._chunk_arrived(self, chunk)

    def on_chunk_error(self, error: StreamError) -> None:
        self.consumer._end(error, after_queue=True)

    def on_consumer_update(self, correlation_id: int, active: bool) -> None:
        threading.Thread(target=self.consumer._consumer_update,
                         args=(self, correlation_id, active),
                         name="pystream-consumer-update", daemon=True).start()

    def on_metadata_update(self, code: int) -> None:
        log.info("stream %r moved or went away (code %#x): resubscribing",
                 self.stream, code)
        self.consumer._broken(self)

    def on_connection_closed(self, error: StreamError | None) -> None:
        if error is None:  # closed on purpose (client.close())
            self.consumer._end(None, after_queue=True)
        elif isinstance(error, (ConnectionLost, ConnectionClosed)):
            self.consumer._broken(self)
        else:  # bad bytes from the broker: retrying would read them again
            self.consumer._end(error, after_queue=True)


class Message:
    """One record of a batch, read lazily (a view, not a copy)."""

    __slots__ = ("_batch", "_row")

    def __init__(self, batch: pa.RecordBatch, row: int) -> None:
        self._batch = batch
        self._row = row

    def _get(self, column: str) -> Any:
        i = self._batch.schema.get_field_index(column)
        return None if i < 0 else self._batch.column(i)[self._row].as_py()

    @property
    def offset(self) -> int:
        return self._batch.column(0)[self._row].as_py()

    @property
    def timestamp(self) -> Any:
        """The chunk's timestamp (a UTC datetime)."""
        return self._batch.column(1)[self._row].as_py()

    @property
    def body(self) -> bytes:
        return self._batch.column(2)[self._row].as_py()

    @property
    def properties(self) -> dict[str, Any] | None:
        return self._get("properties")

    @property
    def application_properties(self) -> dict[str, str] | None:
        value = self._get("application_properties")
        return None if value is None else dict(value)

    @property
    def message_annotations(self) -> dict[str, str] | None:
        value = self._get("message_annotations")
        return None if value is None else dict(value)

    @property
    def header(self) -> dict[str, Any] | None:
        return self._get("header")

    def __repr__(self) -> str:
        return f"<Message offset={self.offset} body={self.body[:32]!r}>"


class Consumer:
    """Reads one stream, or every partition of a super stream.

    Iterate it for ``pyarrow.RecordBatch`` es (one per chunk, or coalesced to
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
    """

    def __init__(self, client: Client, stream: str | None,
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
                 partition_refresh_seconds: float = 30.0) -> None:
        if (stream is None) == (super_stream is None):
            raise ValueError("give a stream or super_stream=, not both")
        if single_active and name is None:
            raise ValueError("single_active needs a name")
        features = client.connection.features
        if single_active:
            features.require("single_active_consumer")
        if filter is not None:
            features.require("filtering")
        self.client = client
        self.name = name
        self.filter = filter
        self.single_active = single_active
        self.super_stream = super_stream
        self.credit_policy = credit or Credit.adaptive()
        self.chunk_size_hint = client.connection.frame_max or (1 << 20)
        self.max_batch_rows = max_batch_rows
        self.max_batch_bytes = max_batch_bytes
        self.auto_store = auto_store
        self.store_every_records = store_every_records
        self.store_every_seconds = store_every_seconds
        self.recovery_timeout = recovery_timeout
        self.partition_refresh_seconds = partition_refresh_seconds
        self._decode_options = dict(
            crc=crc, amqp=amqp, columns=columns, body=body,
            error_policy=error_policy, max_subbatch_size=max_subbatch_size,
            max_chunk_size=max_chunk_size)
        self.schema = schema(columns=columns, body=body,  # type: ignore[arg-type]
                             error_policy=error_policy)  # type: ignore[arg-type]
        self._start = offset_spec(offset)

        self._cond = threading.Condition()
        self._queue: deque[_Queued] = deque()
        self._subs: dict[str, _Subscription] = {}
        self._broken_subs: set[_Subscription] = set()
        self._broken_since: float | None = None
        self._closed = False
        self._ended = False     # no more chunks will come (see _end)
        self._wakers: list[Callable[[], None]] = []
        self._maintenance = threading.Event()

        try:
            streams = ([stream] if stream is not None
                       else client.partitions(super_stream))  # type: ignore[arg-type]
            for s in streams:
                self._subscribe(self._new_subscription(s))
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._maintain, daemon=True,
                         name="pystream-consumer").start()

    def __repr__(self) -> str:
        what = self.super_stream or next(iter(self._subs), "")
        return f"<pystream.Consumer {what!r} position={self.positions}>"

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the application's side ---------------------------------------------

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.batches()

    def batches(self, timeout: float | None = None) -> Iterator[pa.RecordBatch]:
        """Batches as they come; ends after ``timeout`` seconds without one
        (never, with None) or when the consumer is closed."""
        while True:
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
        while rows < max_rows:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            batch = self._next_batch(left, max_rows - rows)
            if batch is None:
                break
            parts.append(batch)
            rows += batch.num_rows
        return pa.Table.from_batches(parts, schema=self.schema)

    def messages(self, timeout: float | None = None) -> Iterator[Message]:
        """Record by record (``Message`` views); convenient, not fast. The
        position moves with each record; a chunk's credit and stored offset
        once all its records were taken."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                item = self._head(deadline)
                if item is None:
                    return
                self._filter(item)
            sub, batch = item.sub, item.batch
            assert sub is not None and batch is not None
            offsets = batch.column(0).to_numpy()
            for row in range(item.handed, batch.num_rows):
                sub.position = int(offsets[row]) + 1
                yield Message(batch, row)
            sends: list[tuple[_Subscription, int]] = []
            with self._cond:
                if self._queue and self._queue[0] is item:
                    self._hand(item, sends, None)
            for s, n in sends:
                self._send_credit(s, n)
            if timeout is not None:
                deadline = time.monotonic() + timeout

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
        return {s: sub.position for s, sub in self._subs.items()}

    @property
    def committed_chunk_id(self) -> int | None:
        """The broker's last committed chunk as of the last delivery
        (Deliver v2, RabbitMQ 3.11+), else None."""
        ids = [s.committed_chunk_id for s in self._subs.values()
               if s.committed_chunk_id is not None]
        return max(ids) if ids else None

    def lag(self) -> int | None:
        """Records committed on the broker and not yet handed, summed over
        partitions, from the broker's stream statistics (3.11+; None before).
        Counted to the start of the last committed chunk, so it may be short
        by up to one chunk."""
        if not self.client.supports("stream_stats"):
            return None
        total = 0
        for stream, sub in list(self._subs.items()):
            committed = self.client.stream_stats(stream).get("committed_chunk_id", -1)
            total += max(0, committed - (sub.position or 0))
        return total

    def store_offset(self, offset: int | None = None) -> None:
        """Store ``offset`` (default: the last record handed) for ``name``."""
        if self.name is None:
            raise ValueError("only a named consumer has a stored offset")
        for sub in self._subs.values():
            last = offset if offset is not None else (
                None if sub.position is None else sub.position - 1)
            if last is not None and last >= 0:
                sub.store_offset(last)
                if sub.tracker is not None:
                    sub.tracker.stored = last

    def grant_credit(self, chunks: int) -> None:
        """Let the broker send ``chunks`` more chunks (``Credit.manual``)."""
        sends = []
        with self._cond:
            for sub in self._subs.values():
                sends.append((sub, sub.credit.manual(chunks)))
        for sub, n in sends:
            self._send_credit(sub, n)

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call ``waker()`` (from another thread) whenever data or an error
        is queued; the asyncio face uses it."""
        with self._cond:
            self._wakers.append(waker)

    def close(self) -> None:
        """Store the offset (named consumers), unsubscribe, free the
        connections. Iteration in other threads ends."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            subs = list(self._subs.values())
            for sub in subs:
                sub.live = False
            self._queue.clear()
            self._notify()
        self._maintenance.set()
        for sub in subs:
            if sub.tracker is not None:
                try:
                    sub.tracker.flush(sub.position)
                except StreamError as exc:
                    log.warning("could not store the offset of %r: %s",
                                self.name, exc)
            self._unsubscribe(sub)

    @property
    def closed(self) -> bool:
        return self._closed

    # --- taking from the queue ------------------------------------------------

    def _next_batch(self, timeout: float | None,
                    max_rows: int | None = None) -> pa.RecordBatch | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sends: list[tuple[_Subscription, int]] = []
            with self._cond:
                item = self._head(deadline)
                if item is None:
                    return None
                batch = self._take(item, sends, max_rows)
            for sub, n in sends:
                self._send_credit(sub, n)
            if batch is not None:
                return batch

    def _head(self, deadline: float | None) -> _Queued | None:
        """The queue's first chunk, waiting for one until ``deadline``; None
        at the deadline or once closed. Raises the error that ended the
        consumer. Called under the lock."""
        while not self._queue:
            if self._closed:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._cond.wait(left)
        item = self._queue[0]
        if item.sub is None:  # the end marker
            self._closed = True
            self._queue.clear()
            if item.error is not None:
                raise item.error
            return None
        return item

    def _filter(self, item: _Queued) -> None:
        if not item.filtered:
            item.filtered = True
            if self.filter is not None:
                item.batch = self.filter.apply(item.batch)

    def _take(self, item: _Queued, sends: list,
              max_rows: int | None) -> pa.RecordBatch | None:
        """Hand rows from the head of the queue (coalescing queued chunks of
        the same stream up to the batch limits); None if it held none."""
        first = self._hand(item, sends, max_rows)
        parts = [first] if first is not None and first.num_rows else []
        rows = sum(p.num_rows for p in parts)
        size = sum(p.nbytes for p in parts)
        limit_rows = min(x for x in (max_rows, self.max_batch_rows, 1 << 62)
                         if x is not None)
        coalescing = self.max_batch_rows or self.max_batch_bytes
        while coalescing and self._queue and rows < limit_rows:
            nxt = self._queue[0]
            if nxt.sub is not item.sub:  # another stream, or the end
                break
            if (self.max_batch_bytes is not None and parts
                    and size + nxt.chunk.size > self.max_batch_bytes):  # type: ignore[union-attr]
                break
            more = self._hand(nxt, sends, limit_rows - rows)
            if more is not None and more.num_rows:
                parts.append(more)
                rows += more.num_rows
                size += more.nbytes
        if not parts:
            return None
        batch = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        if self.super_stream is not None:
            batch = batch.replace_schema_metadata(
                {b"stream": item.sub.stream.encode()})  # type: ignore[union-attr]
        return batch

    def _hand(self, item: _Queued, sends: list,
              max_rows: int | None) -> pa.RecordBatch | None:
        """Give the application up to ``max_rows`` rows of the queue head,
        moving the position, the credit and the offset tracking."""
        sub = item.sub
        chunk = item.chunk
        assert sub is not None and chunk is not None
        self._filter(item)
        batch = item.batch
        total = batch.num_rows
        start = item.handed
        end = total if max_rows is None else min(total, start + max_rows)
        out = batch.slice(start, end - start) if (start or end < total) else batch
        item.handed = end
        before = start / total if total else 0.0
        if end >= total:
            self._queue.popleft()
            sub.position = max(sub.position or 0, chunk.next_offset)
            after = 1.0
        else:
            sub.position = batch.column(0)[end - 1].as_py() + 1
            after = end / total
        n = sub.credit.handed(chunk.size, before, after)
        if n:
            sends.append((sub, n))
        if sub.tracker is not None and end > start:
            try:
                sub.tracker.handed(end - start, sub.position)
            except StreamError as exc:
                log.warning("could not store the offset of %r: %s", self.name, exc)
        return out

    # --- the reader threads' side -------------------------------------------

    def _chunk_arrived(self, sub: _Subscription, chunk: Chunk) -> None:
        with self._cond:
            if not sub.live or not sub.active:
                return
            sub.received = max(sub.received or 0, chunk.next_offset)
            if chunk.committed_chunk_id is not None:
                sub.committed_chunk_id = chunk.committed_chunk_id
            n = sub.credit.arrived(chunk.size)
            self._queue.append(_Queued(sub, chunk))
            self._notify()
        if n:
            self._send_credit(sub, n)

    def _notify(self) -> None:
        self._cond.notify_all()
        for waker in self._wakers:
            waker()

    def _send_credit(self, sub: _Subscription, n: int) -> None:
        conn = sub.connection
        if conn is None or not sub.live:
            return
        try:
            conn.send(P.Credit(sub.subscription_id, n))
        except StreamError:
            pass  # the connection is gone; recovery grants afresh

    def _end(self, error: BaseException | None, *, after_queue: bool) -> None:
        """End the consumer: ``error`` is raised to the application once the
        records queued before it were taken (or at once); with None,
        iteration just ends there."""
        with self._cond:
            if self._closed or self._ended:
                return
            self._ended = True
            for sub in self._subs.values():
                sub.live = False
            if not after_queue:
                self._queue.clear()
            self._queue.append(_Queued(None, None, error))
            self._notify()
        self._maintenance.set()

    def _broken(self, sub: _Subscription) -> None:
        with self._cond:
            if not sub.live or self._closed:
                return
            sub.live = False
            self._broken_subs.add(sub)
            if self._broken_since is None:
                self._broken_since = time.monotonic()
        self._maintenance.set()

    # --- subscribing ------------------------------------------------------------

    def _new_subscription(self, stream: str) -> _Subscription:
        start, position = self._start, None
        if self.name is not None and not self.single_active:
            try:
                stored = self.client.query_offset(stream, self.name)
                start = P.OffsetSpec(P.OFFSET_OFFSET, stored + 1)
            except NoOffset:
                pass
        if start.type == P.OFFSET_OFFSET:
            position = start.value
        sub = _Subscription(self, stream, start, position)
        self._subs[stream] = sub
        return sub

    def _subscribe(self, sub: _Subscription) -> None:
        """Subscribe ``sub`` on a connection to a node holding its stream."""
        spec = sub.resume_spec()
        endpoint = self.client.locate(sub.stream)
        conn = self.client.pool.acquire(endpoint)
        try:
            start_offset = spec.value if spec.type == P.OFFSET_OFFSET else 0
            sub_id = conn.add_subscription(sub, start_offset=start_offset,
                                           **self._decode_options)
        except BaseException:
            self.client.pool.release(conn)
            raise
        with self._cond:
            sub.connection, sub.subscription_id = conn, sub_id
            sub.live = True
            now, after = subscribe_credit(sub.credit.start())
        try:
            conn.request(lambda c: P.Subscribe(c, sub_id, sub.stream, spec,
                                               now, self._properties()),
                         f"subscribe to {sub.stream!r}")
        except BaseException:
            with self._cond:
                sub.live = False
            conn.remove_subscription(sub_id)
            self.client.pool.release(conn)
            sub.connection = None
            raise
        if after:
            try:
                conn.send(P.Credit(sub_id, after))
            except StreamError:
                # Deliveries on the initial credit may already have broken
                # the connection: ``sub`` heard of it, and recovers or ends
                # after handing over what it read.
                pass

    def _properties(self) -> dict[str, str]:
        props: dict[str, str] = {}
        if self.name is not None:
            props["name"] = self.name
        if self.single_active:
            props["single-active-consumer"] = "true"
            if self.super_stream is not None:
                props["super-stream"] = self.super_stream
        if self.filter is not None:
            props.update(self.filter.properties())
        return props

    def _unsubscribe(self, sub: _Subscription) -> None:
        with self._cond:
            conn, sub.connection = sub.connection, None
        if conn is None:
            return
        if conn.is_open:
            try:
                conn.request(lambda c: P.Unsubscribe(c, sub.subscription_id),
                             f"unsubscribe from {sub.stream!r}", timeout=5.0)
            except StreamError:
                pass  # going anyway
        conn.remove_subscription(sub.subscription_id)
        self.client.pool.release(conn)

    def _consumer_update(self, sub: _Subscription, corr: int,
                         active: bool) -> None:
        """Single active consumer: the broker made this subscription active
        (answer where to start) or inactive (give back what is queued)."""
        conn = sub.connection
        if conn is None:
            return
        spec = P.OffsetSpec(P.OFFSET_NEXT)
        try:
            with self._cond:
                dropped = [q for q in self._queue if q.sub is sub]
                for q in dropped:
                    self._queue.remove(q)
                    sub.credit.dropped(q.chunk.size)  # type: ignore[union-attr]
                sub.active = active
                sub.received = None
            if active:
                spec = sub.start
                try:
                    stored = self.client.query_offset(sub.stream, self.name or "")
                    resume = max(stored + 1, sub.position or 0)
                    spec = P.OffsetSpec(P.OFFSET_OFFSET, resume)
                except NoOffset:
                    if sub.position is not None:
                        spec = P.OffsetSpec(P.OFFSET_OFFSET, sub.position)
                if spec.type == P.OFFSET_OFFSET:
                    sub.position = spec.value
                    conn.update_subscription(
                        sub.subscription_id, start_offset=spec.value,
                        **self._decode_options)
            elif sub.tracker is not None:
                sub.tracker.flush(sub.position)
            conn.send(P.ConsumerUpdateResponse(corr, P.RESPONSE_OK, spec))
        except StreamError as exc:
            log.warning("consumer update of %r failed: %s", sub.stream, exc)

    # --- maintenance thread -----------------------------------------------------

    def _maintain(self) -> None:
        """Resubscribe broken subscriptions with backoff; pick up new
        partitions of a super stream."""
        delay = FIRST_RETRY_DELAY
        next_refresh = time.monotonic() + self.partition_refresh_seconds
        while True:
            with self._cond:
                broken = list(self._broken_subs)
            wait = (delay if broken else
                    max(0.0, next_refresh - time.monotonic())
                    if self.super_stream is not None else None)
            if wait is None or wait > 0:
                self._maintenance.wait(wait)
                self._maintenance.clear()
            if self._closed or self._ended:
                for sub in list(self._subs.values()):
                    self._unsubscribe(sub)
                return
            with self._cond:
                broken = list(self._broken_subs)
            if broken:
                delay = self._recover(broken, delay)
            elif (self.super_stream is not None
                    and time.monotonic() >= next_refresh):
                next_refresh = time.monotonic() + self.partition_refresh_seconds
                self._refresh_partitions()

    def _release(self, sub: _Subscription) -> None:
        """Drop a broken subscription's connection (no Unsubscribe: the
        broker already forgot it)."""
        with self._cond:
            conn, sub.connection = sub.connection, None
        if conn is not None:
            conn.remove_subscription(sub.subscription_id)
            self.client.pool.release(conn)

    def _recover(self, broken: list[_Subscription], delay: float) -> float:
        """One attempt at every broken subscription; the next delay."""
        for sub in broken:
            self._release(sub)
            try:
                self._subscribe(sub)
            except StreamDoesNotExist as exc:
                self._end(exc, after_queue=True)
                return delay
            except RECOVERABLE as exc:
                log.info("resubscribing to %r failed: %s", sub.stream, exc)
                since = self._broken_since or time.monotonic()
                if time.monotonic() - since > self.recovery_timeout:
                    self._end(ConnectionLost(
                        f"stream {sub.stream!r} unreachable for "
                        f"{self.recovery_timeout:g} s: {exc}"), after_queue=True)
                return next_retry_delay(delay)
            except StreamError as exc:
                self._end(exc, after_queue=True)
                return delay
            with self._cond:
                self._broken_subs.discard(sub)
                if not self._broken_subs:
                    self._broken_since = None
            log.info("resubscribed to %r at %s", sub.stream, sub.resume_spec())
        return FIRST_RETRY_DELAY

    def _refresh_partitions(self) -> None:
        try:
            streams = self.client.partitions(self.super_stream)  # type: ignore[arg-type]
        except StreamError as exc:
            log.info("partitions of %r: %s", self.super_stream, exc)
            return
        for stream in streams:
            if stream not in self._subs:
                # A new partition: everything in it is new to this consumer.
                sub = _Subscription(self, stream, P.OffsetSpec(P.OFFSET_FIRST), None)
                with self._cond:
                    self._subs[stream] = sub
                    self._broken_subs.add(sub)
                self._maintenance.set()
