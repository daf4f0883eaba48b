"""Filters Spark pushes into a batch read narrow the planned ranges: a query
on the last 1 % of a stream receives about 1 % of its chunks."""

from __future__ import annotations

import datetime as dt
import os
import time

import pytest
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

import pystream
from pystream.bounds import StreamBounds
from pystream.ranges import OffsetRange
from pystream.spark import RabbitMQStreamDataSource
from pystream.spark.datasource import _Config, _PushingBatchReader
from pystream.spark.pushdown import Pushed
from pystream.subscription import Subscriptions

from .conftest import MODERN_URI, local_spark

pytestmark = pytest.mark.broker

URI = pystream.parse_uri(MODERN_URI).uri()
N = 1_000_000
LATER = 20_000  # records published after a pause, to filter on by time


@pytest.fixture(scope="module")
def spark():
    session = local_spark()
    session.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    yield session
    session.conf.unset("spark.sql.python.filterPushdown.enabled")


@pytest.fixture(scope="module")
def large():
    """N records of 100 B, the last LATER of them published after a pause;
    the first chunk time of those."""
    name = f"test-pushdown-{os.getpid()}"
    body = b"x" * 100
    with pystream.connect(MODERN_URI) as client:
        client.create_stream(name)
        with client.producer(name) as producer:
            # A flush per 1000 records: about a chunk each, so 1 % of the
            # chunks is about 1 % of the records.
            for _ in range((N - LATER) // 1000):
                producer.send_batch([body] * 1000)
                producer.flush()
            time.sleep(2.5)
            for _ in range(LATER // 1000):
                producer.send_batch([body] * 1000)
                producer.flush()
        with client.consumer(name, offset=N - LATER) as consumer:
            later = next(iter(consumer)).column("chunk_timestamp")[0].as_py()
        yield name, later
        client.delete_stream(name)


def chunks_read(monkeypatch, options: dict, filters: list) -> tuple[int, int, list]:
    """Chunks received and rows read by a batch read with ``filters``
    pushed, in this process; the filters left to Spark."""
    counted = [0]
    arrived = Subscriptions._chunks_arrived

    def counting(self, sub, chunks):
        counted[0] += len(chunks)
        return arrived(self, sub, chunks)

    monkeypatch.setattr(Subscriptions, "_chunks_arrived", counting)
    source = RabbitMQStreamDataSource({"uri": URI, **options})
    reader = _PushingBatchReader(_Config.parse(source.options, streaming=False),
                                 source.schema())
    rest = list(reader.pushFilters(filters))
    rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
    return counted[0], rows, rest


def test_the_last_percent_reads_a_percent_of_the_chunks(monkeypatch, large):
    stream, _ = large
    everything, rows, _ = chunks_read(monkeypatch, {"stream": stream}, [])
    assert rows == N and everything > 500
    last = GreaterThanOrEqual(("offset",), N - N // 100)
    some, rows, rest = chunks_read(monkeypatch, {"stream": stream}, [last])
    assert rows == N // 100 and rest == []
    print(f"chunks read: {some} of {everything}")
    assert some / everything < 0.015, (some, everything)


def test_points_streams_and_times(monkeypatch, large):
    stream, later = large
    points = In(("offset",), (5, 6, 7, 500_000))
    some, rows, rest = chunks_read(monkeypatch, {"stream": stream}, [points])
    assert rows >= 4 and rest == [points] and some <= 4 * 3
    _, rows, rest = chunks_read(monkeypatch, {"stream": stream},
                                [EqualTo(("stream",), "another")])
    assert rows == 0 and rest == []
    when = GreaterThanOrEqual(("chunk_timestamp",), later)
    some, rows, rest = chunks_read(monkeypatch, {"stream": stream}, [when])
    assert rest == [when] and LATER <= rows < 2 * LATER
    # An upper time bound narrows nothing (chunk times can go backwards):
    # Spark filters the rows.
    before = LessThan(("chunk_timestamp",), later - dt.timedelta(seconds=2))
    _, rows, rest = chunks_read(monkeypatch, {"stream": stream}, [before])
    assert rows == N and rest == [before]


def test_spark_pushes_and_answers_the_same(spark, large):
    stream, later = large

    def df():  # a DataFrame per query: see docs/spark.md on Spark's reuse
        return (spark.read.format("rabbitmq_stream").option("uri", URI)
                .option("stream", stream).load())

    tail = df().where(F.col("offset") >= N - 100)
    assert tail.rdd.getNumPartitions() == 1
    assert df().where(F.col("offset") >= N - 100).count() == 100
    assert sorted(r.offset for r in df().where(F.col("offset").isin(5, 7, 999_999))
                  .select("offset").collect()) == [5, 7, 999_999]
    assert df().where(F.col("chunk_timestamp") >= later).count() == LATER
    assert df().where((F.col("offset") > 10) & (F.col("offset") <= 20)).count() == 10
    assert df().where(F.col("stream") == "another").count() == 0
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:  # Spark filters everything itself
        assert df().where(F.col("offset") >= N - 100).count() == 100
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


class Chunks:
    """A stand-in client for the planner: chunks of 10 offsets at
    ``stamps`` (seconds after T0), resolved as the broker does, to the first chunk
    in offset order stored at or after a time."""

    def __init__(self, stamps: list[int]) -> None:
        self.stamps = stamps
        self.end = 10 * len(stamps)

    def supports(self, feature: str) -> bool:
        return feature == "resolve_offset_spec"

    def resolve_offset(self, stream: str, when: dt.datetime) -> int:
        t = (when - T0).total_seconds()
        return next((10 * i for i, s in enumerate(self.stamps) if s >= t), self.end)


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize("stamps", [
    [0, 10, 20, 30, 40, 50, 60, 70],   # a clock that only goes forward
    [0, 10, 20, 60, 70, 30, 40, 80],   # a leader with a clock ahead, then one behind
    [50, 60, 10, 20, 30, 70, 5, 90],
], ids=["forward", "ahead-then-behind", "scrambled"])
@pytest.mark.parametrize("make", [
    lambda t: LessThan(("chunk_timestamp",), t),
    lambda t: LessThanOrEqual(("chunk_timestamp",), t),
    lambda t: EqualTo(("chunk_timestamp",), t),
    lambda t: GreaterThanOrEqual(("chunk_timestamp",), t),
], ids=["lt", "le", "eq", "ge"])
def test_time_bounds_leave_no_matching_chunk_out(stamps, make):
    """Chunk timestamps are the clock of the node that led the stream, and
    go backwards when leadership moves to a node whose clock is behind: a
    plan keeps every chunk whose time matches (Spark filters the rows)."""
    client = Chunks(stamps)
    bounds = StreamBounds(0, client.end, None)
    for bound in sorted({*stamps, 25, 45}):
        f = make(T0 + dt.timedelta(seconds=bound))
        pushed = Pushed()
        assert pushed.push([f]) == [f]  # Spark still checks every row
        ranges = pushed.narrow(OffsetRange("s", 0, client.end), client, bounds)
        planned = {o for r in ranges for o in range(r.start, r.end)}
        for i, s in enumerate(stamps):
            if matches(f, s, bound):
                assert set(range(10 * i, 10 * i + 10)) <= planned, (f, stamps)


def matches(f, stamp: int, bound: int) -> bool:
    return {LessThan: stamp < bound, LessThanOrEqual: stamp <= bound,
            EqualTo: stamp == bound, GreaterThanOrEqual: stamp >= bound}[type(f)]
