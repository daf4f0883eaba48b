"""What a stream holds, as the broker tells it: its first offset, the end
of its last committed chunk, the chunk stored at a time. From the broker's
statistics and ResolveOffsetSpec where it has them, else by probing: a
subscription's first chunk, or the broker's word that it has none
(``probe``), never a silence taken for an answer."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from . import protocol as P
from ._core import Chunk
from .client import Client
from .connection import Connection
from .errors import StreamError, StreamNotAvailable
from .offsets import offset_spec

CHUNK_USER = 0  # the chunk type of records (1 and 2: offset tracking)


@dataclass(frozen=True)
class StreamBounds:
    """What a stream holds now: ``first`` is its first offset, ``end`` the
    offset after its last committed chunk (both 0 when empty), and
    ``last_timestamp`` that chunk's time when it was read: None when the
    stream is empty, and when the broker gave the end itself (RabbitMQ 4.3+
    reports ``committed_offset``, so no chunk is read)."""

    first: int
    end: int
    last_timestamp: dt.datetime | None


def stream_bounds(client: Client, stream: str, *, exact: bool = True,
                  timeout: float | None = None) -> StreamBounds:
    """The stream's first offset and the end of its last committed chunk of
    records, as the broker tells them, never from its silence. Where the
    broker's statistics carry ``committed_offset`` (4.3+) they give both;
    otherwise the first offset comes from the statistics (3.11+) or the
    chunk a subscription at ``"first"`` is sent, and the end from the chunk
    one at ``"last"`` is sent (``exact=False`` forces that probe, to
    compare the two; see ``probe`` for how the broker tells that it has no
    such chunk). ``RequestTimeout`` if the broker does not answer within
    ``timeout`` seconds (None: the connection's ``request_timeout``)."""
    stats = (client.stream_stats(stream, timeout=timeout)
             if client.supports("stream_stats") else None)
    if exact and stats is not None and "committed_offset" in stats:
        if stats.get("committed_chunk_id", -1) < 0 or stats["committed_offset"] < 0:
            return StreamBounds(0, 0, None)
        end = stats["committed_offset"] + 1
        return StreamBounds(min(stats["first_chunk_id"], end), end, None)
    if stats is not None:
        if stats.get("committed_chunk_id", -1) < 0:
            return StreamBounds(0, 0, None)
        first: int = stats["first_chunk_id"]
        (last,) = probe(client, stream, [P.OffsetSpec(P.OFFSET_LAST)], timeout)
    else:
        head, last = probe(client, stream, [P.OffsetSpec(P.OFFSET_FIRST),
                                             P.OffsetSpec(P.OFFSET_LAST)], timeout)
        if head is None:
            return StreamBounds(0, 0, None)
        first = head.first
    if last is None:  # offset-tracking chunks only: no record to read
        return StreamBounds(first, first, None)
    return StreamBounds(min(first, last.end), last.end, last.timestamp)


def stream_first(client: Client, stream: str, *,
                 timeout: float | None = None) -> int | None:
    """The stream's first offset (None if it holds no record)."""
    if client.supports("stream_stats"):
        stats = client.stream_stats(stream, timeout=timeout)
        return None if stats.get("committed_chunk_id", -1) < 0 else stats["first_chunk_id"]
    (head,) = probe(client, stream, [P.OffsetSpec(P.OFFSET_FIRST)], timeout)
    return None if head is None else head.first


def last_chunk_start(client: Client, stream: str, *,
                     timeout: float | None = None) -> int | None:
    """The first offset of the stream's last chunk of records (where a
    consumer at ``"last"`` starts), or None if it holds no record; as the
    broker tells it (``probe``), never from its silence."""
    (last,) = probe(client, stream, [P.OffsetSpec(P.OFFSET_LAST)], timeout)
    return None if last is None else last.first


@dataclass(frozen=True)
class Head:
    """The first chunk of records the broker sent a probe's subscription."""

    first: int  # its first offset
    end: int  # the offset after it
    timestamp: dt.datetime


class _ProbeSink:
    """A probe's subscription (``SubscriptionSink``): what the reader thread
    hands it, kept until the probe looks."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.head: Head | None = None
        self.others = 0  # offset-tracking chunks, should the broker send any
        self.error: StreamError | None = None

    def admit(self, chunk: Chunk) -> bool:
        return True  # one chunk at most: credit 1

    def on_chunks(self, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            if chunk.chunk_type != CHUNK_USER:
                self.others += 1
            elif self.head is None:
                self.head = Head(chunk.first_offset, chunk.next_offset,
                                  dt.datetime.fromtimestamp(chunk.timestamp / 1000, dt.UTC))

    def on_chunk_error(self, error: StreamError) -> None:
        self.error = error

    def on_consumer_update(self, correlation_id: int, active: bool) -> None:
        pass  # never single active

    def on_metadata_update(self, code: int) -> None:
        self.error = StreamNotAvailable(
            f"{self.stream!r} moved or went away while probed (code {code:#x})")

    def on_connection_closed(self, error: StreamError | None) -> None:
        if error is not None:  # None: the probe closed it
            self.error = error


def probe(client: Client, stream: str, specs: list[P.OffsetSpec],
           timeout: float | None) -> list[Head | None]:
    """For each of ``specs``, the first chunk of records the broker sends a
    subscription there, or None when it has none to send, which the broker
    establishes, not silence: it sends a new subscription the chunks it
    holds (up to its credit, skipping offset-tracking chunks) while it
    handles Subscribe, before it reads the next request on that
    connection; so when the answer to a request sent after the Subscribes
    comes with no chunk before it, the stream has no chunk of records
    there. ``RequestTimeout`` if the broker does not answer within
    ``timeout`` seconds (None: the connection's ``request_timeout``)."""
    deadline = time.monotonic() + (
        client.connection.request_timeout if timeout is None else timeout)

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    address = client.pool.address_of(client.locate(stream, timeout=left()))
    # A connection of its own: closing it ends the probe's subscriptions
    # however far they got, with nothing late for another subscription.
    conn = Connection(address, **client.pool.options)
    conn.connect_timeout = max(min(conn.connect_timeout, left()), 0.01)
    conn.open()
    sinks: dict[int, _ProbeSink] = {}
    try:
        for spec in specs:
            sink = _ProbeSink(stream)
            sinks[_subscribe_probe(conn, sink, spec, left())] = sink
        while True:
            conn.query(P.MetadataResponse, lambda c: P.Metadata(c, (stream,)),
                       f"metadata of {stream!r} after probing it", timeout=left())
            waiting = [i for i, s in sinks.items() if s.head is None and s.others]
            if not waiting:
                break
            for i in waiting:  # the credit went on a tracking chunk: one more
                sinks[i].others = 0
                conn.send(P.Credit(i, 1))
    finally:
        conn.request_timeout = left()  # the polite close within the budget too
        conn.close()
    for sink in sinks.values():
        if sink.error is not None:
            raise sink.error
    return [sink.head for sink in sinks.values()]


def _subscribe_probe(conn: Connection, sink: _ProbeSink, spec: P.OffsetSpec,
                     timeout: float) -> int:
    """Subscribe ``sink`` at ``spec`` with a credit of one chunk; its id."""
    sub_id = conn.add_subscription(sink, amqp=False)
    conn.request(lambda c: P.Subscribe(c, sub_id, sink.stream, spec, 1),
                 f"subscribe to {sink.stream!r} to probe it", timeout=timeout)
    return sub_id


def offset_at(client: Client, stream: str, when: dt.datetime,
              bounds: StreamBounds, *, timeout: float | None = None) -> int:
    """The first offset of the first chunk stored at or after ``when`` (the
    stream's end if none is): the broker's answer on 4.3+, else the chunk a
    subscription at ``when`` is sent (``probe``). ``RequestTimeout`` if
    the broker does not answer within ``timeout`` seconds."""
    if bounds.end <= bounds.first:
        return bounds.end
    if client.supports("resolve_offset_spec"):
        return min(client.resolve_offset(stream, when), bounds.end)
    (head,) = probe(client, stream, [offset_spec(when)], timeout)
    return bounds.end if head is None else min(head.first, bounds.end)
