"""One stream of a consumer: its subscription on a broker's connection
(the connection's ``SubscriptionSink``), its position, credit and offset
tracking, and the chunks it queued for the application (``Queued``). The
consumer's subscriptions together, their queue and their recovery are
``subscription.Subscriptions``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import locks, metrics
from . import protocol as P
from ._core import Chunk
from .credit import Credit, CreditController
from .errors import ConnectionClosed, ConnectionLost, NoOffset, ReadInterrupted, StreamError
from .offsets import OffsetTracker

if TYPE_CHECKING:
    import pyarrow as pa

    from .admin import Admin
    from .connection import Connection

log = logging.getLogger("pystream.consumer")


class Owner(Protocol):
    """What a ``Subscription`` asks of the consumer's subscriptions
    (``subscription.Subscriptions``), under whose lock its state changes."""

    client: Admin
    name: str | None
    single_active: bool
    credit_policy: Credit
    chunk_size_hint: int
    auto_store: bool
    store_every_records: int
    store_every_seconds: float
    _decode_options: dict[str, Any]

    @property
    def closed(self) -> bool: ...

    def _admit(self, sub: Subscription, chunk: Chunk) -> bool: ...

    def _chunks_arrived(self, sub: Subscription, chunks: list[Chunk]) -> None: ...

    def _end(self, error: BaseException | None, *, after_queue: bool) -> None: ...

    def _broken(self, sub: Subscription, cause: str) -> None: ...

    def _rewind(self, positions: dict[Subscription, int | None], cause: str) -> None: ...

    def hold(self) -> threading.RLock: ...

    def _drop_queued(self, sub: Subscription) -> None: ...


IDLE_SECONDS = 1.0  # lag: no chunk for this long with credit is caught up


class Queued:
    """A chunk waiting for the application."""

    __slots__ = ("sub", "chunk", "batch", "handed", "accounted", "filtered")

    def __init__(self, sub: Subscription, chunk: Chunk) -> None:
        self.sub = sub
        self.chunk = chunk
        self.batch = chunk.batch  # None until decoded (Subscriptions._inflate)
        self.handed = 0          # rows of ``batch`` handed so far
        # Of those, rows counted for credit, metrics and offset tracking
        # (``messages()`` counts a chunk's records at its end, or when the
        # next take from it does).
        self.accounted = 0
        self.filtered = False    # post filter applied

    @property
    def cost(self) -> int:
        return cost(self.chunk)


@dataclass(frozen=True, slots=True)
class End:
    """The end of the consumer's queue, after the chunks queued before it:
    the error to raise to the application there, if any."""

    error: BaseException | None


def cost(chunk: Chunk) -> int:
    """What the credit counts an admitted chunk at: its decoded size once
    decoded, its frame's until then (see ``CreditController.admit``)."""
    return chunk.size if chunk.batch is None else chunk.decoded_size


class Subscription:
    """One stream of a consumer on one connection; the connection's
    ``SubscriptionSink``. Its state changes under the consumer's lock."""

    def __init__(self, consumer: Owner, stream: str, start: P.OffsetSpec,
                 position: int | None) -> None:
        self.consumer = consumer
        self.stream = stream
        self.start = start                  # offset of a fresh subscription
        self.position = position            # next offset for the application
        # Records before this offset were processed: the application came
        # back for more after them (``Subscriptions.completed``). What a named
        # consumer stores unless it closes cleanly.
        self.completed = position
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
        self.stored: int | None = None      # last offset stored
        self.last_arrival = 0.0             # monotonic time of the last chunk
        self.broken_at: float | None = None  # when it failed, and why
        self.cause = ""
        self.rewinds = 0                    # taken back by Subscriptions._rewind
        # The offset after the last record the metrics counted as handed:
        # a rewind hands records again, which are not counted twice.
        self.counted_to: int | None = None
        self.stats = metrics.consumer_stats(consumer.client.address, stream,
                                            consumer.name)
        metrics.watch_subscription(self)

    def resume_spec(self) -> P.OffsetSpec:
        """Where to subscribe again: after the last record received (queued
        chunks stay queued), or where we started if nothing came."""
        if self.received is not None:
            return P.OffsetSpec(P.OFFSET_OFFSET, self.received)
        if self.position is not None:
            return P.OffsetSpec(P.OFFSET_OFFSET, self.position)
        return self.start

    def rewound(self, position: int | None) -> None:
        """Records from ``position`` on go to the application again (under
        the consumer's lock)."""
        self.position = position
        if position is not None and self.completed is not None:
            self.completed = min(self.completed, position)

    def recovered(self, spec: P.OffsetSpec, seconds: float) -> None:
        """Resubscribed from ``spec``, ``seconds`` after it broke."""
        where = {P.OFFSET_OFFSET: f"offset {spec.value}",
                 P.OFFSET_TIMESTAMP: f"timestamp {spec.value} ms",
                 P.OFFSET_FIRST: "the first offset",
                 P.OFFSET_LAST: "the last chunk",
                 P.OFFSET_NEXT: "the next offset"}.get(spec.type, str(spec))
        name = self.consumer.name
        who = f"consumer {name!r}" if name is not None else "consumer"
        log.warning("%s of stream %r recovered from %s: resubscribed from %s "
                    "after %.2f s", who, self.stream,
                    self.cause.replace("_", " "), where, seconds)
        metrics.recovered("consumer", self.cause, self.stream, seconds,
                          self.consumer.client.address)

    def store_offset(self, offset: int) -> None:
        conn = self.connection
        if conn is None or not conn.is_open:
            conn = self.consumer.client.connection
        conn.send(P.StoreOffset(self.consumer.name or "", self.stream, offset))
        self.stored = offset
        self.stats.offsets_stored += 1

    # --- what the metrics read (their reader's thread) -------------------------

    def reporting(self) -> bool:
        return not self.consumer.closed

    def lag(self) -> int | None:
        """Offsets committed and not yet handed: from the broker's stream
        statistics (3.11+), else from the last Deliver's committed chunk id.
        Counted to the start of the last committed chunk, so short by up to
        a chunk. The broker never delivers the offset-tracking chunks that
        stores write: a subscription with credit, nothing queued and no
        chunk for ``IDLE_SECONDS`` is caught up, whatever they add."""
        committed = self.committed_chunk_id
        client = self.consumer.client
        try:
            # Not while recovering: a collection must not wait out timeouts.
            if self.live and client.supports("stream_stats"):
                committed = client.stream_stats(self.stream).get(
                    "committed_chunk_id", committed)
        except StreamError:
            pass  # the Deliver's figure, if any
        if committed is None:
            return None
        credit = self.credit
        if (self.live and credit.outstanding and not credit.queued_bytes
                and time.monotonic() - self.last_arrival >= IDLE_SECONDS):
            return 0
        return max(0, committed - (self.position or 0))

    def stored_offset(self) -> int | None:
        return self.stored

    def count_handed(self, chunk: Chunk, batch: pa.RecordBatch, start: int,
                     end: int) -> None:
        """Count rows ``start:end`` of ``batch`` (of ``chunk``) in the
        metrics, and the chunk once its last row went: only what the
        application was not handed before a rewind. Call it after the
        position moved past them."""
        counted = self.counted_to
        rows = end - start
        # Every row's offset is at least the chunk's first: most batches
        # need no look at their offset column.
        if (counted is not None and rows and chunk.first_offset < counted
                and batch.column(0)[start].as_py() < counted):
            offsets = batch.column(0).slice(start, rows).to_numpy()
            rows -= int(np.searchsorted(offsets, counted))
        self.stats.consumed += rows
        if end >= batch.num_rows and (counted is None or chunk.next_offset > counted):
            metrics.chunk_received(self.stats, chunk.num_records, chunk.size,
                                   chunk.decode_ns)
        position = self.position
        if position is not None and (counted is None or position > counted):
            self.counted_to = position

    # --- SubscriptionSink (reader thread) -----------------------------------

    def admit(self, chunk: Chunk) -> bool:
        return self.consumer._admit(self, chunk)

    def on_chunks(self, chunks: list[Chunk]) -> None:
        self.consumer._chunks_arrived(self, chunks)

    def on_chunk_error(self, error: StreamError) -> None:
        self.consumer._end(error, after_queue=True)

    def on_consumer_update(self, correlation_id: int, active: bool) -> None:
        locks.new_thread(self._consumer_update, "pystream-consumer-update",
                         (correlation_id, active)).start()

    def _consumer_update(self, corr: int, active: bool) -> None:
        """Single active consumer: the broker made this subscription active
        (answer where to start) or inactive (give back what is queued)."""
        owner, conn = self.consumer, self.connection
        if conn is None:
            return
        spec = P.OffsetSpec(P.OFFSET_NEXT)
        try:
            with owner.hold():
                # Deactivated: nothing more is handed (what is queued goes,
                # ``messages()`` takes record by record) and, past the store
                # below, nothing is stored (close and store_offset skip it).
                owner._drop_queued(self)
                self.active = active
                completed = self.completed
            if active:
                spec = self.start
                try:
                    stored = owner.client.query_offset(self.stream, owner.name or "")
                    resume = max(stored + 1, self.position or 0)
                    spec = P.OffsetSpec(P.OFFSET_OFFSET, resume)
                except NoOffset:
                    if self.position is not None:
                        spec = P.OffsetSpec(P.OFFSET_OFFSET, self.position)
                if spec.type == P.OFFSET_OFFSET:
                    with owner.hold():
                        self.position = self.completed = spec.value
                    conn.update_subscription(
                        self.subscription_id, start_offset=spec.value,
                        **owner._decode_options)
            elif self.tracker is not None:
                # What was processed: the consumer taking over resumes there,
                # so a record handed and still in the application's hands
                # is read again rather than lost.
                self.tracker.flush(completed)
            conn.send(P.ConsumerUpdateResponse(corr, P.RESPONSE_OK, spec))
        except StreamError as exc:
            log.warning("consumer update of %r failed: %s", self.stream, exc)

    def on_metadata_update(self, code: int) -> None:
        log.info("stream %r moved or went away (code %#x): resubscribing",
                 self.stream, code)
        self.consumer._broken(self, "metadata_update")

    def on_connection_closed(self, error: StreamError | None) -> None:
        if error is None:  # closed on purpose (client.close())
            self.consumer._end(None, after_queue=True)
        elif isinstance(error, ReadInterrupted):  # a chunk read may be lost
            self.consumer._rewind({self: self.position}, "interrupted")
        elif isinstance(error, (ConnectionLost, ConnectionClosed)):
            self.consumer._broken(self, "connection_closed"
                                  if isinstance(error, ConnectionClosed)
                                  else "connection_lost")
        else:  # bad bytes from the broker: retrying would read them again
            self.consumer._end(error, after_queue=True)
