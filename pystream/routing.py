"""Who a connection's frames are for: its subscriptions (by id), its
publishers (by id) and the handlers registered by frame key, and the
hand-over of decoded chunks to their subscriptions (``FrameRoutes.drain``).
``Connection`` holds one ``FrameRoutes``; it keeps the socket, the requests,
and ``_dispatch``, which sends every other frame to its owner here or
handles it itself (answers, Tune, Heartbeat, Close)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from . import protocol as P
from ._core import Chunk, StreamDecoder
from .errors import ConnectionClosed, StreamError
from .publish_frames import CONFIRM_PUBLISHER_ID_AT

FrameHandler = Callable[[memoryview], None]


class SubscriptionSink(Protocol):
    """What the connection tells a subscription; called in the reader
    thread, so it must not block (and must not make requests)."""

    stream: str

    def admit(self, chunk: Chunk) -> bool: ...

    def on_chunks(self, chunks: list[Chunk]) -> None: ...

    def on_chunk_error(self, error: StreamError) -> None: ...

    def on_consumer_update(self, correlation_id: int, active: bool) -> None: ...

    def on_metadata_update(self, code: int) -> None: ...

    def on_connection_closed(self, error: StreamError | None) -> None: ...


class PublisherSink(Protocol):
    """What the connection tells a publisher (in the reader thread)."""

    stream: str

    def on_confirm(self, frame: memoryview) -> None: ...

    def on_publish_error(self, errors: tuple[P.PublishingError, ...]) -> None: ...

    def on_metadata_update(self, code: int) -> None: ...

    def on_connection_closed(self, error: StreamError | None) -> None: ...

# A read that brought many chunks hands them over in parts of this many
# wire bytes, so the consumer starts on the first while the rest decode.
DELIVER_BYTES = 1 << 20


class FrameRoutes:
    """The subscriptions, publishers and frame handlers of one connection,
    and the subscriptions' part of its frame reader (their decode options,
    the ``admit`` check). ``end`` closes the tables to newcomers and tells
    those in them; the connection calls it when it ends."""

    def __init__(self, reader: StreamDecoder) -> None:
        self._reader = reader
        self._lock = threading.Lock()
        # Why the connection ended (raised to a newcomer), once it did.
        self._ended: StreamError | None = None
        self._untold: list[SubscriptionSink | PublisherSink] = []  # of the end
        self._sinks: dict[int, SubscriptionSink] = {}
        self._publishers: dict[int, PublisherSink] = {}
        self._handlers: dict[int, FrameHandler] = {}
        self._admit_chunks(reader)

    def _admit_chunks(self, reader: StreamDecoder) -> None:
        """Have ``reader`` ask the chunk's subscription before it decodes
        a chunk (``StreamDecoder.admit``). Through the table, not a method:
        the reader must not hold these routes, nor through them anything
        that holds the reader, which would then live on in a reference
        cycle after its last use, with its receive blocks."""
        sinks = self._sinks

        def admit(chunk: Chunk) -> bool:
            sink = sinks.get(chunk.subscription_id)
            return sink is not None and sink.admit(chunk)

        reader.admit = admit

    def _check_open(self) -> None:
        if self._ended is not None:
            raise self._ended

    def on_frame(self, key: int, handler: FrameHandler) -> None:
        """Route every frame with this key to ``handler`` (in the reader
        thread; it must not block)."""
        self._handlers[key] = handler

    def add_subscription(self, sink: SubscriptionSink,
                         **decode_options: Any) -> int:
        """Give ``sink`` a free subscription id and decode its chunks with
        ``decode_options`` (those of ``_core.decode``); the caller then sends
        Subscribe with that id."""
        with self._lock:
            self._check_open()
            for free in range(256):  # a loop: see add_publisher
                if free not in self._sinks:
                    self._reader.subscribe(free, **decode_options)
                    self._sinks[free] = sink
                    return free
            raise ValueError("this connection already has 256 subscriptions")

    def update_subscription(self, subscription_id: int,
                            **decode_options: Any) -> None:
        """Decode this subscription's next chunks with new options (a new
        ``start_offset`` after a single-active-consumer switch)."""
        self._reader.subscribe(subscription_id, **decode_options)

    def remove_subscription(self, subscription_id: int, sink: SubscriptionSink) -> None:
        """Free ``subscription_id`` if ``sink`` still has it (a removal
        repeated after an interrupt must not free it for another)."""
        with self._lock:
            if self._sinks.get(subscription_id) is sink:
                del self._sinks[subscription_id]
                self._reader.unsubscribe(subscription_id)

    @property
    def subscription_count(self) -> int:
        return len(self._sinks)

    def add_publisher(self, sink: PublisherSink) -> int:
        """Give ``sink`` a free publisher id; the caller then declares it."""
        with self._lock:
            self._check_open()
            # A loop, not next() over a generator: an interrupt landing in a
            # generator's finalizer would be printed and dropped.
            for free in range(256):
                if free not in self._publishers:
                    self._publishers[free] = sink
                    return free
            raise ValueError("this connection already has 256 publishers")

    def remove_publisher(self, publisher_id: int, sink: PublisherSink) -> None:
        """Free ``publisher_id`` if ``sink`` still has it (a removal
        repeated after an interrupt must not free it for another)."""
        with self._lock:
            if self._publishers.get(publisher_id) is sink:
                del self._publishers[publisher_id]

    def subscription(self, subscription_id: int) -> SubscriptionSink | None:
        return self._sinks.get(subscription_id)

    def publisher(self, publisher_id: int) -> PublisherSink | None:
        return self._publishers.get(publisher_id)

    def route(self, key: int, frame: memoryview) -> bool:
        """Hand ``frame`` to the handler registered for ``key``, or a
        PublishConfirm to its publisher; False if neither takes it."""
        handler = self._handlers.get(key)
        if handler is not None:
            handler(frame)
            return True
        if key == P.PublishConfirm.KEY and len(frame) > CONFIRM_PUBLISHER_ID_AT:
            # Confirms are parsed by the producer (vectorised), not here.
            publisher = self._publishers.get(frame[CONFIRM_PUBLISHER_ID_AT])
            if publisher is not None:
                publisher.on_confirm(frame)
                return True
        return False

    def metadata_update(self, stream: str, code: int) -> None:
        """Tell the subscriptions and publishers of ``stream``."""
        listeners: list[SubscriptionSink | PublisherSink] = [
            *self._sinks.values(), *self._publishers.values()]
        for listener in listeners:
            if listener.stream == stream:
                listener.on_metadata_update(code)

    def end(self, error: StreamError | None) -> None:
        """The connection ended (``error`` None: closed on purpose): refuse
        newcomers from now on and tell every subscription and publisher."""
        with self._lock:
            if self._ended is None:
                self._ended = error or ConnectionClosed("the connection is closed")
                self._untold = [*self._sinks.values(), *self._publishers.values()]
        # Each told once; the rest, after an interrupt in the application's
        # thread stopped this, by the next call.
        while True:
            with self._lock:
                if not self._untold:
                    return
                party = self._untold.pop()
            party.on_connection_closed(error)

    def drain(self, reader: StreamDecoder,
              dispatch: Callable[[memoryview], None]) -> None:
        """Hand every complete frame in the buffer to its subscription, or
        (any frame but a Deliver) to ``dispatch``.

        Chunks go to their subscriptions together once the buffer is
        drained (or ``DELIVER_BYTES`` of them are decoded), right before the
        next ``recv``: the consumer wakes once per read, and finds the GIL
        free instead of waking a second time when this thread lets go of
        it. Anything else for a subscription comes after its chunks."""
        chunks: list[Chunk] = []
        pending = 0
        try:
            while True:
                try:
                    event = reader.next_event()
                except StreamError as exc:
                    if exc.subscription_id is None:
                        raise  # the byte stream itself is broken
                    self._deliver(chunks)
                    sink = self._sinks.get(exc.subscription_id)
                    if sink is not None:
                        sink.on_chunk_error(exc)
                    continue
                if event is None:
                    return
                if isinstance(event, bytes):
                    self._deliver(chunks)
                    dispatch(memoryview(event))
                else:
                    chunks.append(event)
                    pending += event.size
                    if pending >= DELIVER_BYTES:
                        self._deliver(chunks)
                        pending = 0
        finally:
            self._deliver(chunks)

    def _deliver(self, chunks: list[Chunk]) -> None:
        """Each subscription's chunks of ``chunks``, in order; empties it."""
        if not chunks:
            return
        if len(chunks) == 1:  # most reads bring one chunk
            sink = self._sinks.get(chunks[0].subscription_id)
            mine = chunks[:]
            chunks.clear()
            if sink is not None:
                sink.on_chunks(mine)
            return
        by_sink: dict[int, list[Chunk]] = {}
        for chunk in chunks:
            by_sink.setdefault(chunk.subscription_id, []).append(chunk)
        chunks.clear()
        for subscription_id, mine in by_sink.items():
            sink = self._sinks.get(subscription_id)
            if sink is not None:
                sink.on_chunks(mine)
