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
import time
from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa

from .client import Client
from .consumer import Consumer
from .records import Message


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

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self.batches()

    async def _next(self, timeout: float | None,
                    max_rows: int | None = None) -> pa.RecordBatch | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._ready.clear()
            batch = self.consumer._next_batch(0, max_rows)
            if batch is not None or self.consumer.closed:
                return batch
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                await asyncio.wait_for(self._ready.wait(), left)
            except TimeoutError:
                return None

    async def batches(self, timeout: float | None = None
                      ) -> AsyncIterator[pa.RecordBatch]:
        """As ``Consumer.batches``."""
        while (batch := await self._next(timeout)) is not None:
            yield batch

    async def read(self, max_rows: int, timeout: float | None = None) -> pa.Table:
        """As ``Consumer.read``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        parts: list[pa.RecordBatch] = []
        rows = 0
        while rows < max_rows:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            batch = await self._next(left, max_rows - rows)
            if batch is None:
                break
            parts.append(batch)
            rows += batch.num_rows
        return pa.Table.from_batches(parts, schema=self.consumer.schema)

    async def messages(self, timeout: float | None = None) -> AsyncIterator[Message]:
        """As ``Consumer.messages``, a batch at a time (the position moves
        to the end of each batch as it is taken)."""
        while (batch := await self._next(timeout)) is not None:
            for row in range(batch.num_rows):
                yield Message(batch, row)

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
