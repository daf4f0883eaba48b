"""The asyncio face against the real modern broker."""

from __future__ import annotations

import asyncio
import random
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


def published_in_chunks(client, stream: str, n: int, size: int,
                        pause: float = 0.0) -> None:
    """``n`` records ``b"<offset>"`` in chunks of ``size`` (each batch
    confirmed before the next is sent, ``pause`` seconds later)."""
    with client.producer(stream) as producer:
        for start in range(0, n, size):
            producer.send_batch([b"%d" % i for i in range(start, min(n, start + size))]
                                ).result(timeout=30)
            time.sleep(pause)


def stored(client, stream: str, name: str) -> int | None:
    """The offset stored for ``name``, None if none."""
    try:
        return client.query_offset(stream, name)
    except pystream.NoOffset:
        return None


def test_cancelled_reads_give_back_what_they_took(modern, modern_stream):
    """``read()`` cancelled at any point (wait_for timeouts, task.cancel
    after sleeps) while records trickle in: the rows it took come back, so
    the successful reads get every record exactly once, and the named
    consumer's stored offset never passes what a read returned. (Bodies
    count the records: each store takes an offset of the stream.)"""
    n = 3000
    rng = random.Random(1234)
    # Small chunks trickling in: a read of several waits for them part-way.
    trickle = threading.Thread(target=published_in_chunks,
                               args=(modern, modern_stream, n, 10, 0.002))
    trickle.start()

    async def main() -> tuple[list[bytes], int, int, list[tuple[int | None, int]]]:
        async with await pystream.aio.connect(MODERN_URI) as client:
            c = await client.consumer(modern_stream, offset="first", name="cancel",
                                      store_every_records=1)
            got: list[bytes] = []
            last = -1  # the last offset a read returned
            cancels = 0
            stores: list[tuple[int | None, int]] = []
            try:
                while len(got) < n:
                    want = min(n - len(got), rng.randint(1, 60))
                    try:
                        if rng.random() < 0.5:
                            table = await asyncio.wait_for(
                                c.read(want, timeout=5), rng.uniform(0, 0.01))
                        else:
                            task = asyncio.create_task(c.read(want, timeout=5))
                            await asyncio.sleep(rng.uniform(0, 0.01))
                            task.cancel()
                            table = await task
                    except (TimeoutError, asyncio.CancelledError):
                        cancels += 1
                    else:
                        got += table.column("body").to_pylist()
                        if table.num_rows:
                            last = table.column("offset")[-1].as_py()
                        if table.num_rows < want:
                            break  # the stream has no more: records went missing
                    stores.append((await asyncio.to_thread(
                        stored, client.client, modern_stream, "cancel"), last))
            finally:
                await c.close()
            # Cancelled with rows taken: those went back (a rewind each).
            return got, cancels, c.consumer._subs[modern_stream].rewinds, stores

    try:
        # Bounded: before the fix a run could wait on records that were gone.
        got, cancels, part_way, stores = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        trickle.join()
    assert cancels >= 20 and part_way >= 5, (cancels, part_way)
    assert got == [b"%d" % i for i in range(n)]
    assert all(s is None or s <= last for s, last in stores)


def test_leaving_async_messages_early_keeps_the_rest_queued(modern, modern_stream):
    """Leaving ``async for m in consumer.messages()`` in the middle of a
    chunk hands what was taken: the next read starts right after it, even
    before the generator is finalised."""
    n = 600
    published_in_chunks(modern, modern_stream, n, 200)

    async def main() -> list[int]:
        async with await pystream.aio.connect(MODERN_URI) as client:
            async with await client.consumer(modern_stream, offset="first") as c:
                seen: list[int] = []
                for stop in (3, 150, 199, 250, 420):
                    async for m in c.messages(timeout=5):
                        seen.append(m.offset)
                        if m.offset == stop:
                            break
                    assert c.position == stop + 1
                    table = await c.read(5, timeout=5)  # the generator still lives
                    seen += table.column("offset").to_pylist()
                seen += [m.offset async for m in c.messages(timeout=1.0)]
                return seen

    assert asyncio.run(main()) == list(range(n))


def test_cancelled_async_with_stores_only_what_was_processed(modern, modern_stream):
    """A task cancelled while it processes a record of ``messages()`` inside
    ``async with consumer``: the stored offset is the record before, and a
    new consumer of that name starts with the record it held."""
    n = 300
    published_in_chunks(modern, modern_stream, n, 100)

    async def main() -> None:
        async with await pystream.aio.connect(MODERN_URI) as client:
            holding = asyncio.Event()

            async def work() -> None:
                async with await client.consumer(modern_stream, offset="first",
                                                 name="w") as c:
                    async for m in c.messages(timeout=5):
                        if m.offset == 142:
                            holding.set()
                            await asyncio.sleep(60)  # processing, cancelled

            task = asyncio.create_task(work())
            await holding.wait()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            deadline = time.monotonic() + 5
            while (await asyncio.to_thread(stored, client.client, modern_stream, "w") != 141
                   and time.monotonic() < deadline):  # StoreOffset has no answer
                await asyncio.sleep(0.05)
            assert await client.query_offset(modern_stream, "w") == 141
            async with await client.consumer(modern_stream, offset="first", name="w") as c:
                assert (await c.read(1, timeout=5)).column("offset").to_pylist() == [142]

    asyncio.run(main())
