"""The consumer through failures on the real modern broker: connections
closed by the broker, a broker restart, a broker gone past the recovery
timeout; memory under a slow application; and a model of its position and
stored offset under the application's reads, failures and cancellations.

The large streams are kept between runs (they take seconds to fill); their
names are in tests/leftovers.py, and `scripts/broker clean` deletes them."""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import functools
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import pystream
import pystream.aio
from pystream import ConnectionLost, Credit
from pystream.bounds import stream_bounds

from .conftest import MODERN_URI, broker_ctl, run_broker
from .leftovers import MEMORY_STREAM, RECOVERY_STREAM, RSS_STREAM
from .publishers import fill
from .waiting import wait_until

pytestmark = pytest.mark.broker


def kept_stream(client: pystream.Client, name: str, count: int,
                body: bytes) -> str:
    """A stream of exactly ``count`` records, filled once."""
    if client.stream_exists(name):
        with client.consumer(name, offset="last") as consumer:
            last = consumer.read(1 << 30, timeout=2.0).column("offset")
        if len(last) and last[-1].as_py() == count - 1:
            return name
        client.delete_stream(name)
    client.create_stream(name)
    fill(MODERN_URI, name, count, body)
    return name


# How the application paces itself while the faults happen: slow on every
# batch (the reader thread takes each loan of the read turn over), or back
# at once for a few batches, then away for longer than the reader thread's
# periodic look (loans that leave it asleep, then one it must notice).
PACES = {
    "slow": lambda k: 0.01,
    "quick-then-away": lambda k: 0.25 if k % 5 == 4 else 0.0,
}


@pytest.mark.slow
@pytest.mark.parametrize("pace", PACES)
def test_no_record_lost_or_repeated_across_failures(pace):
    n = 1_000_000
    with pystream.connect(MODERN_URI) as client:
        stream = kept_stream(client, RECOVERY_STREAM, n, b"r" * 100)
        faults: list[str] = []

        def inject() -> None:
            for _ in range(3):
                time.sleep(0.7)
                broker_ctl("modern", "close_all_connections", "test")
                faults.append("close")
            time.sleep(0.7)
            run_broker("restart", "modern")
            faults.append("restart")

        chunks = []
        with client.consumer(stream, offset="first",
                             recovery_timeout=120) as consumer:
            injector = threading.Thread(target=inject)
            injector.start()
            for k, batch in enumerate(consumer.batches(timeout=60)):
                chunks.append(batch.column("offset").to_numpy())
                if injector.is_alive():  # paced until every fault happened
                    time.sleep(PACES[pace](k))
                if consumer.position >= n:
                    break
            injector.join()
    offsets = np.concatenate(chunks)
    assert faults == ["close"] * 3 + ["restart"]
    assert len(offsets) == n
    assert (offsets == np.arange(n)).all()


def absorb_interrupts(interrupter: threading.Thread) -> int:
    """Wait for ``interrupter`` to end, taking the interrupts it sends
    meanwhile (and one still pending after it): how many came."""
    came = 0
    while True:
        try:
            interrupter.join()
            time.sleep(0.05)  # an interrupt sent last is handled here
            return came
        except KeyboardInterrupt:
            came += 1


# How the interrupts come: raised at the main thread's next check
# (``interrupt_main``), or a real SIGINT, which also wakes a blocked read
# (EINTR amid the reads of a chunk's rest, ``FrameReader.recv_rest``).
SENDERS = {
    "interrupt_main": _thread.interrupt_main,
    "sigint": lambda: os.kill(os.getpid(), signal.SIGINT),
}


@pytest.mark.parametrize("how, send", [("read", "interrupt_main"),
                                       ("batches", "interrupt_main"),
                                       ("batches", "sigint")])
def test_caught_interrupts_lose_and_repeat_nothing(how, send, caplog):
    """A KeyboardInterrupt the application catches and reads on from may
    land anywhere: between a recv and its commit, amid a chunk's dispatch,
    between a take and its return. What the application got is still
    every record once, in order."""
    # Python's own handler: PySpark's, left by an earlier test in this
    # process, would cancel Spark jobs through py4j on each interrupt.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        caught_interrupts(how, SENDERS[send], caplog)
    finally:
        signal.signal(signal.SIGINT, previous)


def caught_interrupts(how: str, send: Callable[[], None],
                      caplog: pytest.LogCaptureFixture) -> None:
    n = 1_000_000
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    with pystream.connect(MODERN_URI) as client:
        stream = kept_stream(client, RECOVERY_STREAM, n, b"r" * 100)
        parts: list[pa.Table | pa.RecordBatch] = []
        interrupts = 0
        delays = rng.uniform(0, 0.02, 40)
        interrupter = threading.Thread(
            target=lambda: [(time.sleep(d), send()) for d in delays])
        with client.consumer(stream, offset="first",
                             max_batch_rows=20_000) as consumer:
            got = 0
            progress = (got, time.monotonic())
            try:
                interrupter.start()
                while got < n:
                    if got != progress[0]:
                        progress = (got, time.monotonic())
                    # Waiting on for records that never come would hang the
                    # run: say how many were handed instead.
                    assert time.monotonic() - progress[1] < 60, (
                        f"nothing handed for 60 s at {got} of {n} records, seed {seed}")
                    try:
                        # Kept before anything else is called: an interrupt
                        # after a C call returns would lose its result.
                        if how == "read":
                            table = consumer.read(20_000, timeout=10)
                            parts.append(table)
                            got += table.num_rows
                        else:
                            for batch in consumer.batches(timeout=10):
                                parts.append(batch)
                                got += batch.num_rows
                                if got >= n:
                                    break
                    except KeyboardInterrupt:
                        interrupts += 1
            finally:
                interrupts += absorb_interrupts(interrupter)
    offsets = np.concatenate([p.column("offset").to_numpy() for p in parts])
    assert 1 <= interrupts <= len(delays)  # two may come as one
    assert len(offsets) == n, f"seed {seed}"
    assert (offsets == np.arange(n)).all(), f"seed {seed}"
    assert not [r for r in caplog.records
                if r.levelno >= logging.ERROR and r.name.startswith("pystream")]


@pytest.mark.slow
def test_broker_away_past_recovery_timeout_raises_connection_lost(stream_name):
    with pystream.connect(MODERN_URI, heartbeat=1, connect_timeout=1) as client:
        client.create_stream(stream_name)
        consumer = client.consumer(stream_name, offset="first",
                                   recovery_timeout=2)
        run_broker("pause", "modern")
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionLost):
                consumer.read(1, timeout=30)
            assert time.monotonic() - started < 15
        finally:
            run_broker("resume", "modern")
            consumer.close()
        client.delete_stream(stream_name)


def rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_slow_application_keeps_memory_bounded():
    budget = 32 << 20
    with pystream.connect(MODERN_URI) as client:
        stream = kept_stream(client, MEMORY_STREAM, 1_000_000,
                             b"m" * 1024)
        base = rss()
        peak = base
        rows = 0
        with client.consumer(stream, offset="first",
                             credit=Credit.adaptive(budget)) as consumer:
            started = time.monotonic()
            for batch in consumer:
                rows += batch.num_rows
                del batch
                time.sleep(0.02)
                peak = max(peak, rss())
                if time.monotonic() - started > 6:
                    break
        grown = peak - base
        print(f"RSS grew by {grown / 2**20:.1f} MiB with a {budget >> 20} MiB "
              f"budget after {rows} records")
        # Budget, plus one chunk (1 MiB frame_max), plus allocator slack
        # (pooled receive blocks are ones the budget held at one time).
        assert grown < budget + (1 << 20) + (24 << 20)


def read_peaks(uri: str, name: str, total: int, reads: int) -> list[int]:
    """Peak RSS over the last tenth of each of ``reads`` reads of ``name``.
    Peaks over a window, not samples: how much is queued at one moment
    varies with the broker's pace, up to the credit budget (small here)."""
    peaks = []
    with pystream.connect(uri) as client:
        for _ in range(reads):
            rows, peak = 0, 0
            with client.consumer(name, offset="first",
                                 credit=Credit.adaptive(8 << 20)) as consumer:
                for batch in consumer.batches(timeout=10.0):
                    rows += batch.num_rows
                    del batch
                    if rows >= total - total // 10:
                        peak = max(peak, rss())
                    if rows >= total:
                        break
            assert rows >= total
            peaks.append(peak)
    return peaks


@pytest.mark.slow
def test_rss_stays_flat_over_30m_records():
    """A long read keeps no state per record: over three reads of the same
    10 M records, peak RSS in the same window does not rise from read to
    read. State kept per record (0.8 bytes of it is 8 MiB per read) raises
    it every time; a high-water mark rises once: on a busy machine the
    consumer falls behind once, up to the credit budget, and the receive
    blocks that took then stay pooled (as many as were alive at once, 64
    MiB at most). So the smaller
    of the two rises is what a leak would show."""
    total = 10_000_000
    name = RSS_STREAM
    with pystream.connect(MODERN_URI) as client:
        if not (client.stream_exists(name)
                and stream_bounds(client, name).end >= total):
            client.delete_stream(name, missing_ok=True)
            client.create_stream(name)
            # Sub-batches of 100 fill 10 M records in seconds (kept after).
            with client.producer(name, compression="none") as producer:
                for _ in range(100):
                    producer.send_batch([b"r" * 100] * (total // 100))
    # In a process of its own: what the suite's earlier tests left in this
    # one (threads, caches, a fragmented heap) moves its RSS meanwhile.
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        peaks = pool.submit(read_peaks, MODERN_URI, name, total, 3).result(timeout=900)
    rises = [(b - a) / 2**20 for a, b in itertools.pairwise(peaks)]
    print("peak RSS over records 9-10 M of each read: "
          + ", ".join(f"{p / 2**20:.1f}" for p in peaks) + " MiB")
    assert min(rises) < 8


# --- a model of the position and the stored offset ----------------------------

MODEL_CHUNKS = [1, 17, 40, 3, 60, 9, 25, 85]  # 240 records, one chunk each
MODEL_RECORDS = sum(MODEL_CHUNKS)
F = TypeVar("F", bound=Callable[..., Any])


class Boom(Exception):
    """The application's processing failed."""


def noted(failures: list[BaseException]) -> Callable[[F], F]:
    """Note the model's failures: Hypothesis replays a failing run to
    report it, and one whose cancellations land otherwise replays
    differently (``Flaky``), hiding the failure."""
    def wrap(check: F) -> F:
        @functools.wraps(check)
        def noting(*args: Any, **kwargs: Any) -> Any:
            try:
                return check(*args, **kwargs)
            except AssertionError as exc:
                failures.append(exc)
                raise
        return noting  # type: ignore[return-value]
    return wrap


def consumer_model(client: pystream.Client, stream: str,
                   loop: asyncio.AbstractEventLoop,
                   failures: list[BaseException]) -> type[RuleBasedStateMachine]:
    """A state machine over a named consumer of ``stream`` (its records
    0 to MODEL_RECORDS - 1) driven by an application that reads (read,
    batches, messages, blocking and asyncio), cancels reads, stores, and
    fails: raises out of its with-block (then reopens the consumer), or is
    cancelled. The model is the documented contract (docs/consuming.md):
    records come in order, none skipped; one comes again only from a
    stored offset after an exception or cancellation; what is stored
    never passes what the application processed (records it came back for
    more after), and after a clean close is the last record handed."""

    class ConsumerModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.name = f"model-{uuid.uuid4().hex[:8]}"
            self.consumer: pystream.Consumer | None = None
            self.pos = 0          # the next record the consumer must hand
            self.processed = 0    # the application processed every record before
            self.stored: int | None = None  # what the broker holds after a close

        def run(self, coro: Any) -> Any:
            return loop.run_until_complete(coro)

        @noted(failures)
        def open(self) -> None:
            """A consumer of that name, once the broker holds what the
            model says was stored (StoreOffset has no answer)."""
            wait_until(lambda: self.stored is None or self.query() == self.stored, 5, 0.02,
                       what=f"the stored offset the model says ({self.stored})")
            self.consumer = client.consumer(stream, offset="first", **self.options)
            assert self.consumer.position == (
                None if self.stored is None else self.stored + 1)
            self.pos = 0 if self.stored is None else self.stored + 1

            async def wrap() -> pystream.aio.AsyncConsumer:
                return pystream.aio.AsyncConsumer(self.consumer)  # type: ignore[arg-type]
            self.aconsumer = self.run(wrap())

        def query(self) -> int | None:
            try:
                return client.query_offset(stream, self.name)
            except pystream.NoOffset:
                return None

        @noted(failures)
        def handed(self, offsets: list[int], count: int | None = None) -> None:
            """In order, none skipped: what the model expects next (and
            ``count`` records, if given)."""
            assert offsets == list(range(self.pos, self.pos + len(offsets))), (
                f"handed {offsets[:5]}... where the model expects {self.pos}")
            assert count is None or len(offsets) == count
            self.pos += len(offsets)

        @noted(failures)
        def stored_at_most(self, processed: int) -> None:
            stored = self.query()
            assert stored is None or stored <= processed - 1, (
                f"stored {stored} past the processed records (< {processed})")

        def exit_stores(self, completed: int) -> None:
            """A failed exit stores the record before ``completed`` (none
            before the first), then the application reopens."""
            if completed > 0:
                self.stored = completed - 1
            self.open()

        @initialize(store_every=st.sampled_from([1, 5, 10_000]),
                    one_chunk=st.booleans())
        def start(self, store_every: int, one_chunk: bool) -> None:
            # One chunk in flight makes reads of several wait part-way.
            self.options = dict(
                name=self.name, store_every_records=store_every,
                credit=Credit.adaptive(max_buffered_bytes=1) if one_chunk else None)
            self.open()

        def teardown(self) -> None:
            if self.consumer is not None:
                self.consumer.close()

        @invariant()
        def stores_no_further_than_processed(self) -> None:
            if self.consumer is not None:
                self.stored_at_most(self.processed)

        def left(self) -> int:
            # No precondition uses it: how many records a cancelled read
            # returned depends on timing, and Hypothesis needs the rules it
            # may draw to depend on its draws alone.
            return MODEL_RECORDS - self.pos

        # --- the application's steps -----------------------------------------

        @rule(n=st.integers(1, 60), asyncio_=st.booleans())
        def read(self, n: int, asyncio_: bool) -> None:
            if self.left() == 0:
                return
            n = min(n, self.left())
            c = self.consumer
            table = (self.run(self.aconsumer.read(n, timeout=10)) if asyncio_
                     else c.read(n, timeout=10))  # type: ignore[union-attr]
            self.stored_at_most(self.pos)  # the table is still being processed
            self.handed(table.column("offset").to_pylist(), n)
            self.processed = max(self.processed, self.pos)

        @rule(asyncio_=st.booleans())
        def batch(self, asyncio_: bool) -> None:
            if self.left() == 0:
                return
            async def first() -> pa.RecordBatch:
                async for b in self.aconsumer.batches(timeout=10):
                    return b
                raise AssertionError("no batch")
            if asyncio_:
                batch = self.run(first())
            else:
                batch = next(self.consumer.batches(timeout=10))  # type: ignore[union-attr]
            self.stored_at_most(self.pos)
            self.handed(batch.column("offset").to_pylist())
            self.processed = max(self.processed, self.pos)

        @rule(n=st.integers(1, 30), asyncio_=st.booleans())
        def messages(self, n: int, asyncio_: bool) -> None:
            if self.left() == 0:
                return
            n = min(n, self.left())

            async def take() -> list[int]:
                got: list[int] = []
                async for m in self.aconsumer.messages(timeout=10):
                    self.stored_at_most(m.offset)
                    got.append(m.offset)
                    if len(got) == n:
                        break
                return got
            if asyncio_:
                got = self.run(take())
            else:
                got = []
                for m in self.consumer.messages(timeout=10):  # type: ignore[union-attr]
                    self.stored_at_most(m.offset)
                    got.append(m.offset)
                    if len(got) == n:
                        break
            self.handed(got)
            self.processed = max(self.processed, self.pos)

        @rule(n=st.integers(1, 120),
              delay=st.sampled_from([0.0, 0.0002, 0.001, 0.003, 0.01]))
        def cancelled_read(self, n: int, delay: float) -> None:
            """An asyncio read cancelled by a timeout: the rows it took go
            back; finished in time, it is a read."""
            try:
                table = self.run(asyncio.wait_for(
                    self.aconsumer.read(n, timeout=10), delay))
            except TimeoutError:
                return
            self.handed(table.column("offset").to_pylist())
            self.processed = max(self.processed, self.pos)

        @rule()
        def store_offset(self) -> None:
            """The application says it processed all it was handed."""
            self.consumer.store_offset()  # type: ignore[union-attr]
            self.processed = max(self.processed, self.pos)
            if self.pos > 0:
                self.stored = self.pos - 1

        # --- leaving, then a new consumer of the name -----------------------

        @rule(how=st.sampled_from(["close", "raise in messages", "raise in read",
                                   "raise in batches", "cancelled in async with"]),
              n=st.integers(1, 40))
        def leave(self, how: str, n: int) -> None:
            if how == "close" or self.left() == 0:
                self.consumer.close()  # type: ignore[union-attr]
                self.processed = max(self.processed, self.pos)
                if self.pos > 0:
                    self.stored = self.pos - 1  # the last record handed
                self.open()
            elif how == "raise in messages":
                self.raise_in_messages(min(n, self.left()))
            elif how == "cancelled in async with":
                self.cancelled_in_async_with(min(n, self.left()))
            else:
                self.raise_in_with(how, min(n, self.left()))

        def raise_in_messages(self, n: int) -> None:
            """Processing the n-th record raises out of the with-block."""
            got: list[int] = []
            with pytest.raises(Boom), self.consumer as c:  # type: ignore[union-attr]
                for m in c.messages(timeout=10):
                    got.append(m.offset)
                    if len(got) == n:
                        raise Boom
            self.handed(got)
            self.processed = max(self.processed, got[-1])
            self.exit_stores(got[-1])

        def raise_in_with(self, how: str, n: int) -> None:
            """Processing a read's table or a batch raises out of the
            with-block: none of its records were processed."""
            began = self.pos
            with pytest.raises(Boom), self.consumer as c:  # type: ignore[union-attr]
                part = (c.read(n, timeout=10) if how == "raise in read"
                        else next(c.batches(timeout=10)))
                self.handed(part.column("offset").to_pylist())
                raise Boom
            self.exit_stores(began)

        def cancelled_in_async_with(self, n: int) -> None:
            """A task is cancelled while it processes the n-th record of
            ``async for m in messages()`` in ``async with consumer``."""
            got: list[int] = []

            async def work(holding: asyncio.Event) -> None:
                async with self.aconsumer as c:
                    async for m in c.messages(timeout=10):
                        got.append(m.offset)
                        if len(got) == n:
                            holding.set()
                            await asyncio.sleep(60)

            async def cancel() -> None:
                holding = asyncio.Event()
                task = asyncio.create_task(work(holding))
                await holding.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            self.run(cancel())
            self.handed(got)
            self.processed = max(self.processed, got[-1])
            self.exit_stores(got[-1])

    return ConsumerModel


def test_position_and_stored_offset_follow_the_model(modern, modern_stream):
    """tests: consumer_model's state machine on the modern broker."""
    with modern.producer(modern_stream) as producer:
        first = 0
        for size in MODEL_CHUNKS:  # confirmed one by one: a chunk each
            producer.send_batch([b"%d" % i for i in range(first, first + size)]
                                ).result(timeout=30)
            first += size
    loop = asyncio.new_event_loop()
    failures: list[BaseException] = []
    try:
        run_state_machine_as_test(
            consumer_model(modern, modern_stream, loop, failures),
            # Not shrunk: cancellations land by timing, so a failing run
            # replays differently; the steps that failed are reported.
            settings=settings(max_examples=25, stateful_step_count=30,
                              deadline=None, database=None,
                              phases=[Phase.generate],
                              suppress_health_check=list(HealthCheck)))
    except Flaky as exc:
        if failures:
            raise failures[0] from exc
        raise
    finally:
        loop.close()
