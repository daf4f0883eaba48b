"""The asyncio face against the real modern broker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import pystream.aio
from pystream import protocol as P

from .conftest import MODERN_URI
from .publishers import amqp_message, publish

pytestmark = pytest.mark.broker


class LoopWatch:
    """Run as a task: how often the event loop came round, and its
    longest stall."""

    def __init__(self) -> None:
        self.ticks = 0
        self.longest = 0.0

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now
            self.ticks += 1


def test_async_for_reads_everything_and_the_loop_stays_free(modern, stream_name):
    modern.create_stream(stream_name)
    publish(modern, stream_name, [amqp_message(b"a%d" % i) for i in range(3000)])

    async def main() -> tuple[list[int], int, float]:
        watch = LoopWatch()
        async with await pystream.aio.connect(MODERN_URI) as client:
            assert (await client.stream_stats(stream_name))["first_chunk_id"] == 0
            tick = asyncio.create_task(watch.run())
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
        return offsets, watch.ticks, watch.longest

    try:
        offsets, ticks, longest = asyncio.run(main())
    finally:
        modern.delete_stream(stream_name)
    assert offsets == list(range(3000))
    assert ticks > 50 and longest < 0.25


def test_credit_is_never_sent_on_the_event_loop(modern, stream_name):
    """A full socket buffer blocks a send. Credit granted as the loop takes
    a batch goes out from another thread: with that send stuck for a
    second, the loop runs on, and the credit arrives once it is through."""
    modern.create_stream(stream_name)
    for _ in range(3):  # three chunks
        publish(modern, stream_name, [amqp_message(b"c%d" % i) for i in range(100)])

    async def main() -> tuple[int, float, bool]:
        watch = LoopWatch()
        async with await pystream.aio.connect(MODERN_URI) as client:
            async with await client.consumer(
                    stream_name, offset="first",
                    credit=pystream.Credit.on_consumed(initial=1)) as c:
                conn = next(iter(c.consumer._subs.values())).connection
                assert conn is not None
                stuck, release = threading.Event(), threading.Event()
                send = conn.send

                def stuck_send(cmd: P.Command) -> None:
                    if isinstance(cmd, P.Credit):
                        stuck.set()
                        release.wait(10)
                    send(cmd)

                conn.send = stuck_send  # type: ignore[method-assign]
                threading.Timer(1.0, release.set).start()
                tick = asyncio.create_task(watch.run())
                # One chunk on the Subscribe's credit; taking it grants one.
                first = (await c.read(100, timeout=5)).num_rows
                await asyncio.sleep(1.2)  # the send stays stuck for 1 s
                rest = (await c.read(200, timeout=10)).num_rows
                tick.cancel()
        return first + rest, watch.longest, stuck.is_set()

    try:
        rows, longest, stuck = asyncio.run(main())
    finally:
        modern.delete_stream(stream_name)
    assert stuck and rows == 300
    assert longest < 0.25, f"the event loop stalled for {longest:.2f} s"


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
