"""Options of the JVM connector (rabbitmq_streams) the data source takes:
its spellings, trigger limits by bytes and by a minimum with a delay, and
filtering by filter values with a client post-filter."""

from __future__ import annotations

import pyarrow as pa
import pytest

import pystream
from pystream.spark.options import normalize
from pystream.spark.triggers import TriggerLimits, duration

from .conftest import MODERN_URI, local_spark

URI = pystream.parse_uri(MODERN_URI).uri()


@pytest.fixture(scope="module")
def spark():
    session = local_spark()
    yield session


def test_jvm_spellings():
    assert normalize({"maxRecordsPerTrigger": "5", "subEntrySize": "9"}) == {
        "maxoffsetspertrigger": "5", "subbatchsize": "9"}
    with pytest.raises(ValueError, match="another spelling"):
        normalize({"maxRecordsPerTrigger": "5", "maxOffsetsPerTrigger": "6"})
    assert duration("15m", 0) == 900 and duration("500ms", 0) == 0.5
    with pytest.raises(ValueError, match="maxTriggerDelay"):
        duration("soon", 0)


def test_min_offsets_wait_for_the_delay():
    limits = TriggerLimits.parse({"minoffsetspertrigger": "100", "maxtriggerdelay": "10s"})
    starts, ends = {"a": 0, "b": 5}, {"a": 50, "b": 30}
    assert limits.admit(None, starts, ends, since_last=1.0, available_now=False) == starts
    assert limits.admit(None, starts, ends, since_last=11.0, available_now=False) == ends
    assert limits.admit(None, starts, ends, since_last=1.0, available_now=True) == ends
    more = {"a": 100, "b": 30}
    assert limits.admit(None, starts, more, since_last=1.0, available_now=False) == more


def colored(n: int) -> pa.RecordBatch:
    colors = pa.array(["red" if i % 2 else "blue" for i in range(n)])
    offsets = pa.array(range(n + 1), pa.int32())
    return pa.RecordBatch.from_arrays(
        [pa.array([b"%d" % i for i in range(n)]),
         pa.MapArray.from_arrays(offsets, pa.array(["color"] * n), colors)],
        names=["body", "application_properties"])


@pytest.mark.broker
def test_filter_values_with_a_post_filter(spark, modern, modern_stream):
    with modern.producer(modern_stream, filter_value="color") as producer:
        for _ in range(5):
            producer.send_batch(colored(1000))
            producer.flush()
    with modern.producer(modern_stream, filter_value="color") as producer:
        producer.send_batch(pa.RecordBatch.from_arrays(  # a last chunk of blue only
            [pa.array([b"b"] * 10), colored(10).column(1).take(pa.array([0] * 10))],
            names=["body", "application_properties"])).result(30)

    def read(**options):
        reader = (spark.read.format("rabbitmq_stream").option("uri", URI)
                  .option("stream", modern_stream))
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    red = read(filterValues="red", filterProperty="color")
    assert red.columns == ["stream", "offset", "chunk_timestamp", "body"]
    assert red.count() == 2500
    assert red.where("cast(body as string) % 2 = 0").count() == 0
    # The broker sends whole chunks: without the post-filter, blue rows too.
    # It skips the last chunk, blue only, without a word: the task reads the
    # rest of its range unfiltered to reach its end, so that chunk comes too.
    assert read(filterValues="red").count() == 5010


@pytest.mark.broker
def test_max_bytes_per_trigger(spark, modern, modern_stream):
    with modern.producer(modern_stream) as producer:
        for _ in range(3):
            producer.send_batch([b"x" * 1000] * 1000)
            producer.flush()
    query = (spark.readStream.format("rabbitmq_stream").option("uri", URI)
             .option("stream", modern_stream).option("startingOffsets", "earliest")
             .option("maxBytesPerTrigger", 600_000).load()
             .writeStream.format("memory").queryName("bytes_per_trigger")
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 3000 and max(sizes) <= 600 and len(sizes) >= 5
