"""The consumer through failures on the real modern broker: connections
closed by the broker, a broker restart, a broker gone past the recovery
timeout; and memory under a slow application.

The large streams are kept between runs (they take seconds to fill); their
names are in tests/leftovers.py, and `scripts/broker clean` deletes them."""

from __future__ import annotations

import _thread
import concurrent.futures
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import pystream
from pystream import ConnectionLost, Credit
from pystream.ranges import stream_bounds

from .conftest import MODERN_URI, broker_ctl, run_broker
from .leftovers import MEMORY_STREAM, RECOVERY_STREAM, RSS_STREAM
from .publishers import fill

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


def test_no_record_lost_or_repeated_across_failures():
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
            for batch in consumer.batches(timeout=60):
                chunks.append(batch.column("offset").to_numpy())
                if injector.is_alive():
                    time.sleep(0.01)  # be slow until every fault happened
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


@pytest.mark.parametrize("how", ["read", "batches"])
def test_caught_interrupts_lose_and_repeat_nothing(how, caplog):
    """A KeyboardInterrupt the application catches and reads on from may
    land anywhere: between a recv and its commit, amid a chunk's dispatch,
    between a take and its return. What the application got is still
    every record once, in order."""
    # Python's own handler: PySpark's, left by an earlier test in this
    # process, would cancel Spark jobs through py4j on each interrupt.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        caught_interrupts(how, caplog)
    finally:
        signal.signal(signal.SIGINT, previous)


def caught_interrupts(how: str, caplog: pytest.LogCaptureFixture) -> None:
    n = 1_000_000
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    with pystream.connect(MODERN_URI) as client:
        stream = kept_stream(client, RECOVERY_STREAM, n, b"r" * 100)
        parts: list[pa.Table | pa.RecordBatch] = []
        interrupts = 0
        delays = rng.uniform(0, 0.02, 40)
        interrupter = threading.Thread(
            target=lambda: [(time.sleep(d), _thread.interrupt_main())
                            for d in delays])
        with client.consumer(stream, offset="first",
                             max_batch_rows=20_000) as consumer:
            got = 0
            try:
                interrupter.start()
                while got < n:
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
