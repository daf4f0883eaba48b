"""asyncio face: ``client = await pystream.aio.connect(uri)`` and
``async for batch in client.consumer(...)``.

Sockets are read and chunks decoded by the connections' reader threads, as
in the blocking API; the event loop only takes ready batches off the queue
and is woken (``call_soon_threadsafe``) when one arrives, so it never waits on
the network, nor on decoding unless the consumer is past its memory budget
(then the chunk at the head decodes as it is taken). Credit and requests to
the broker (subscribe, admin calls) are sent from other threads.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pyarrow as pa

from .client import Client
from .consumer import Consumer, MessageCursor
from .records import Message
from .stream_subscription import Subscription

_T = TypeVar("_T")


async def connect(uri: str = "rabbitmq-stream://localhost",
                  **options: Any) -> AsyncClient:
    """``pystream.connect`` for asyncio; same options."""
    return AsyncClient(await asyncio.to_thread(Client, uri, **options))


class AsyncClient:
    """A ``Client`` whose methods are coroutines (they run in a worker
    thread): ``await client.create_stream(...)``, ``await
    client.stream_stats(...)``, and so on."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:  # a coroutine function, or an attribute
        method = getattr(self.client, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)
        return call

    async def close(self) -> None:
        """Close the client, its consumers' connections included."""
        await asyncio.to_thread(self.client.close)

    async def consumer(self, stream: str | None = None, offset: Any = "next",
                       **options: Any) -> AsyncConsumer:
        """``Client.consumer`` for asyncio; same options."""
        consumer = await asyncio.to_thread(self.client.consumer, stream,
                                           offset, **options)
        return AsyncConsumer(consumer)


class AsyncConsumer:
    """``Consumer`` for asyncio: ``async for batch in consumer``,
    ``await consumer.read(...)``, ``async for m in consumer.messages()``."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        consumer.add_waker(self._wake)
        consumer._send_credit_in_background()  # never a blocking send on the loop

    def _wake(self) -> None:
        # From a reader thread; the loop may be gone at shutdown.
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:
            pass

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        # As Consumer.__exit__: leaving with an exception (a cancellation
        # too) stores only what the application came back for more after.
        await asyncio.to_thread(self.consumer._close, handed=exc_type is None)

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self.batches()

    async def _when_ready(self, take: Callable[[], _T | None],
                          timeout: float | None) -> _T | None:
        """What ``take`` (which never waits) takes from the queue, waiting
        up to ``timeout`` seconds for the reader threads to queue some;
        None then or once the consumer ended. A cancellation can land only
        while it waits, when nothing is taken."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._ready.clear()
            got = take()
            if got is not None or self.consumer.closed:
                return got
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow
                # a cancellation that lands as the event is set.
                async with asyncio.timeout(left):
                    await self._ready.wait()
            except TimeoutError:
                return None

    async def batches(self, timeout: float | None = None
                      ) -> AsyncIterator[pa.RecordBatch]:
        """As ``Consumer.batches``."""
        consumer = self.consumer
        while True:
            consumer._completed()
            batch = await self._when_ready(lambda: consumer._next_batch(0), timeout)
            if batch is None:
                return
            yield batch

    async def read(self, max_rows: int, timeout: float | None = None) -> pa.Table:
        """As ``Consumer.read``. Cancelled, it gives back the rows it took:
        the next read starts with them."""
        consumer = self.consumer
        deadline = None if timeout is None else time.monotonic() + timeout
        parts: list[pa.RecordBatch] = []
        rows = 0
        taken: dict[Subscription, int | None] = {}
        consumer._completed()
        try:
            while rows < max_rows:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                batch = await self._when_ready(functools.partial(
                    consumer._next_batch, 0, max_rows - rows, taken), left)
                if batch is None:
                    break
                parts.append(batch)
                rows += batch.num_rows
            return pa.Table.from_batches(parts, schema=consumer.schema)
        except BaseException:
            consumer._give_back(taken)
            raise

    async def messages(self, timeout: float | None = None) -> AsyncIterator[Message]:
        """As ``Consumer.messages``: each record is handed as it is yielded,
        so leaving the loop early leaves the rest queued."""
        consumer = self.consumer
        consumer._completed()
        cursor = MessageCursor(consumer)
        while True:
            message = await self._when_ready(
                functools.partial(cursor.next, 0), timeout)
            if message is None:
                return
            yield message

    @property
    def position(self) -> int | None:
        """``Consumer.position``: the offset of the next record."""
        return self.consumer.position

    @property
    def positions(self) -> dict[str, int | None]:
        """``Consumer.positions``: the next offset of each stream read."""
        return self.consumer.positions

    async def store_offset(self, offset: int | None = None) -> None:
        """``Consumer.store_offset``: store ``offset`` (default: the last record
        handed over) under the consumer's name."""
        await asyncio.to_thread(self.consumer.store_offset, offset)

    async def lag(self) -> int | None:
        """``Consumer.lag``: records committed on the broker and not yet handed
        over (RabbitMQ 3.11+, to within a chunk)."""
        return await asyncio.to_thread(self.consumer.lag)

    async def close(self) -> None:
        """Store the offset (named consumers), unsubscribe, free the
        connections."""
        await asyncio.to_thread(self.consumer.close)
