"""The asyncio face against the real modern broker."""

from __future__ import annotations

import asyncio
import time

import pytest

import pystream.aio

from .conftest import MODERN_URI
from .publishers import amqp_message, publish

pytestmark = pytest.mark.broker


def test_async_for_reads_everything_and_the_loop_stays_free(modern, stream_name):
    modern.create_stream(stream_name)
    publish(modern, stream_name, [amqp_message(b"a%d" % i) for i in range(3000)])

    async def main() -> tuple[list[int], int, float]:
        ticks = 0
        longest = 0.0

        async def ticker() -> None:
            nonlocal ticks, longest
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                longest = max(longest, now - last)
                last = now
                ticks += 1

        async with await pystream.aio.connect(MODERN_URI) as client:
            assert (await client.stream_stats(stream_name))["first_chunk_id"] == 0
            tick = asyncio.create_task(ticker())
            async with await client.consumer(stream_name, offset="first") as c:
                offsets: list[int] = []
                async for batch in c.batches(timeout=1.0):
                    offsets += batch.column("offset").to_pylist()
                assert c.position == 3000
                # waiting for data that does not come leaves the loop free
                waited = time.monotonic()
                assert (await c.read(10, timeout=0.5)).num_rows == 0
                assert time.monotonic() - waited >= 0.45
            tick.cancel()
        return offsets, ticks, longest

    try:
        offsets, ticks, longest = asyncio.run(main())
    finally:
        modern.delete_stream(stream_name)
    assert offsets == list(range(3000))
    assert ticks > 50 and longest < 0.25


def test_async_messages(modern, stream_name):
    modern.create_stream(stream_name)
    publish(modern, stream_name, [amqp_message(b"m%d" % i) for i in range(5)])

    async def main() -> list[bytes]:
        async with await pystream.aio.connect(MODERN_URI) as client:
            consumer = await client.consumer(stream_name, offset="first")
            try:
                return [m.body async for m in consumer.messages(timeout=1.0)]
            finally:
                await consumer.close()

    try:
        assert asyncio.run(main()) == [b"m%d" % i for i in range(5)]
    finally:
        modern.delete_stream(stream_name)
