"""The rabbitmq_stream sink on local Spark (local[2]) against the real
broker: a round trip through Spark is lossless, bad writes fail before any
task runs, super streams route as the producer does, and a streaming query
SIGKILLed in the middle of a micro-batch and restarted from its checkpoint
leaves every input row in the stream exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

import pystream

from .conftest import MODERN_URI, local_spark

pytestmark = pytest.mark.broker

URI = pystream.parse_uri(MODERN_URI).uri()
COLUMNS = "properties,application_properties,message_annotations"


@pytest.fixture(scope="module")
def spark():
    session = local_spark()
    yield session


@pytest.fixture
def streams(modern):
    """Fresh streams by name, deleted afterwards."""
    made: list[str] = []

    def make(suffix: str) -> str:
        name = f"test-sink-{suffix}-{os.getpid()}-{len(made)}"
        modern.create_stream(name)
        made.append(name)
        return name

    yield make
    for name in made:
        modern.delete_stream(name, missing_ok=True)


def rich_batch(lo: int, hi: int) -> pa.RecordBatch:
    """Bodies with properties (timestamps included), application properties
    and message annotations, some of them null."""
    ids = np.arange(lo, hi)
    text = pa.array(ids.astype(str))
    stamp = pa.array(ids * 1000, pa.timestamp("ms", tz="UTC"))
    properties = pa.StructArray.from_arrays(
        [pc.binary_join_element_wise("m", text, ""), text, pa.array(ids, pa.int64()), stamp],
        names=["message_id", "subject", "group_sequence", "creation_time"],
        mask=pa.array(ids % 7 == 0))
    offsets = np.arange(len(ids) + 1, dtype=np.int32)
    application = pa.MapArray.from_arrays(offsets, pa.array(["i"] * len(ids)), text)
    annotations = pa.MapArray.from_arrays(offsets, pa.array(["x-k"] * len(ids)),
                                          pa.array((ids % 3).astype(str)))
    return pa.RecordBatch.from_arrays(
        [pc.binary_join_element_wise("body-", text, "").cast(pa.binary()),
         properties, application, annotations],
        names=["body", "properties", "application_properties", "message_annotations"])


def read_all(stream: str, **options) -> pa.Table:
    with pystream.connect(MODERN_URI) as client:
        with client.consumer(stream, offset="first", body="binary", **options) as c:
            return c.read(10**9, timeout=2.0)


def source(spark, **options):
    reader = spark.read.format("rabbitmq_stream").option("uri", URI)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def sink(df, **options):
    writer = df.write.format("rabbitmq_stream").mode("append").option("uri", URI)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_what_the_source_reads_writes_back_unchanged(spark, modern, streams):
    first, second = streams("a"), streams("b")
    with modern.producer(first) as producer:
        for lo in range(0, 60_000, 20_000):
            producer.send_batch(rich_batch(lo, lo + 20_000))
        producer.flush()
    df = source(spark, stream=first, columns=COLUMNS, minPartitions="3")
    sink(df, stream=second)
    a = source(spark, stream=first, columns=COLUMNS).toArrow().sort_by("offset")
    b = source(spark, stream=second, columns=COLUMNS).toArrow().sort_by("offset")
    assert a.num_rows == b.num_rows == 60_000
    # Three tasks published concurrently: compare in body order.
    order_a = pc.sort_indices(a.column("body"))
    order_b = pc.sort_indices(b.column("body"))
    for name in ("body", "properties", "application_properties", "message_annotations"):
        assert a.column(name).take(order_a).equals(b.column(name).take(order_b)), name
    assert b.column("stream").unique().to_pylist() == [second]


def test_one_task_keeps_offsets_too(spark, modern, streams):
    first, second = streams("c"), streams("d")
    with modern.producer(first) as producer:
        producer.send_batch(rich_batch(0, 5000)).result(30)
    sink(source(spark, stream=first, columns=COLUMNS), stream=second)
    a, b = read_all(first, columns=COLUMNS.split(",")), read_all(second, columns=COLUMNS.split(","))
    for name in ("offset", "body", "properties", "application_properties",
                 "message_annotations"):
        assert a.column(name).equals(b.column(name)), name


def test_strings_filter_values_and_raw_bodies(spark, modern, streams):
    target = streams("e")
    rows = [(f"m{i}", "red" if i % 2 else "blue") for i in range(1000)]
    df = spark.createDataFrame(rows, "body string, filter_value string").coalesce(1)
    sink(df, stream=target)
    red = pystream.Filter(["red"], post_filter=pc.field("body") == b"m1")
    with modern.consumer(target, offset="first", body="binary", filter=red) as consumer:
        assert consumer.read(10_000, timeout=2.0).column("body").to_pylist() == [b"m1"]
    bodies = read_all(target).column("body").to_pylist()
    assert bodies == [f"m{i}".encode() for i in range(1000)]
    raw = streams("f")
    sink(spark.createDataFrame([(b"\x00raw",)], "body binary"), stream=raw, amqp="false")
    assert read_all(raw, amqp=False).column("body").to_pylist() == [b"\x00raw"]


def test_compressed_sub_batches(spark, streams):
    target = streams("g")
    df = spark.range(0, 20_000, numPartitions=2).select(
        F.col("id").cast("string").alias("body"))
    sink(df, stream=target, compression="zstd", subEntrySize="50")
    got = sorted(int(b) for b in read_all(target).column("body").to_pylist())
    assert got == list(range(20_000))


def test_super_stream_routes_like_the_producer(spark, modern):
    name = f"test-sink-super-{os.getpid()}"
    modern.create_super_stream(name, partitions=3)
    try:
        keys = [f"k{i}" for i in range(3000)]
        df = spark.createDataFrame([(k, k) for k in keys], "body string, routing_key string")
        sink(df, superstream=name)
        with modern.producer(super_stream=name, routing_key="key") as producer:
            want = producer.partition_of(pa.RecordBatch.from_pydict({"key": keys}))
        partitions = modern.partitions(name)
        for i, partition in enumerate(partitions):
            got = {b.decode() for b in read_all(partition).column("body").to_pylist()}
            assert got == {k for k, p in zip(keys, want, strict=True) if p == i}
        # Key routing: the broker's bindings (keys 0, 1, 2) name the partition.
        before = [len(read_all(p)) for p in partitions]
        df = spark.createDataFrame([("x", "2"), ("y", "0")], "body string, routing_key string")
        sink(df, superstream=name, routingStrategy="key")
        after = [len(read_all(p)) for p in partitions]
        assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0, 1]
    finally:
        modern.delete_super_stream(name)


def test_bad_writes_fail_before_any_task_runs(spark, modern, streams):
    target = streams("h")
    df = spark.createDataFrame([(b"x", 1)], "body binary, n int")
    cases = [
        (df, {"stream": target}, "cannot write columns \\['n'\\]"),
        (df.select(F.col("n").alias("value")), {"stream": target}, "cannot write columns"),
        (df.select("n"), {"stream": target}, "cannot write columns"),
        (df.select(F.col("n").alias("body")), {"stream": target}, "must be binary or string"),
        (df.select("body"), {}, "exactly one of the options stream and superstream"),
        (df.select("body"), {"stream": "no-such-stream-here"}, "create it first"),
        (df.select("body"), {"superstream": "no-such-super"}, "routing_key column"),
        (df.select("body"), {"stream": target, "compression": "rar"}, "compression is one of"),
    ]
    for frame, options, message in cases:
        with pytest.raises(Exception, match=message):
            sink(frame, **options)
    with pytest.raises(Exception, match="Append"):
        (df.select("body").write.format("rabbitmq_stream").option("uri", URI)
         .option("stream", target).save())
    with pytest.raises(Exception, match="append-only"):
        (df.select("body").write.format("rabbitmq_stream").option("uri", URI)
         .option("stream", target).mode("overwrite").save())
    assert read_all(target).num_rows == 0


def test_batch_producer_name_gives_each_job_its_ids(spark, modern, streams):
    target = streams("i")
    df = spark.range(0, 1000, numPartitions=2).select(F.col("id").cast("string").alias("body"))
    sink(df, stream=target, producerName="job")
    first = [modern.query_publisher_sequence(target, f"job-{p}") for p in (0, 1)]
    assert abs((first[0] >> 32) - time.time()) < 600
    assert [s & 0xFFFFFFFF for s in first] == [500, 500]  # 500 rows per task
    sink(df, stream=target, producerName="job")  # at once: the next job number
    second = modern.query_publisher_sequence(target, "job-0")
    assert second >> 32 > first[0] >> 32
    assert read_all(target).num_rows == 2000


# --- streaming: exactly-once across a SIGKILL --------------------------------

QUERY = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from pystream.spark import RabbitMQStreamDataSource
    uri, source, target, checkpoint, mode, master = sys.argv[1:]
    builder = (SparkSession.builder.master(master)
               .config("spark.ui.enabled", "false"))
    if master.startswith("spark://"):
        builder = (builder.config("spark.executor.cores", "1")
                   .config("spark.executor.memory", "512m")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RabbitMQStreamDataSource)
    df = (spark.readStream.format("parquet").schema("body binary")
          .option("maxFilesPerTrigger", 2).load(source))
    writer = (df.writeStream.format("rabbitmq_stream").option("uri", uri)
              .option("stream", target).option("checkpointLocation", checkpoint))
    if mode == "now":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.start().awaitTermination()
""")

FILES, ROWS_PER_FILE = 8, 250_000
PER_BATCH = 2 * ROWS_PER_FILE


def stored(client, stream) -> int:
    """Offsets the stream holds up to its last committed chunk's start (0
    while a busy broker does not answer for its new stream yet)."""
    try:
        return client.stream_stats(stream).get("committed_chunk_id", -1) + 1
    except pystream.StreamDoesNotExist:
        return 0


def test_killed_streaming_write_publishes_every_row_once(modern, streams, tmp_path):
    killed_write_publishes_every_row_once(modern, streams("kill"), tmp_path, "local[2]")


def killed_write_publishes_every_row_once(client, target: str, tmp_path, master: str,
                                          env: dict | None = None) -> None:
    """Run the streaming write of QUERY on ``master``, SIGKILL its driver's
    process group in the middle of a micro-batch, restart it from its
    checkpoint, and check that ``target`` holds every input row once."""
    source_dir = tmp_path / "input"
    source_dir.mkdir()
    for f in range(FILES):
        ids = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        bodies = pc.binary_join_element_wise(
            pa.array(ids.astype(str)), pa.array(["." * 90] * len(ids)), "")
        pq.write_table(pa.table({"body": bodies.cast(pa.binary())}),
                       source_dir / f"part-{f:02d}.parquet")
    checkpoint = tmp_path / "checkpoint"
    script = tmp_path / "query.py"
    script.write_text(QUERY)
    args = [sys.executable, str(script), URI, str(source_dir), target, str(checkpoint)]
    log = (tmp_path / "query.log").open("w")
    child = subprocess.Popen([*args, "run", master], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert child.poll() is None, (tmp_path / "query.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "never caught a micro-batch half written"
            n = stored(client, target)
            # The second batch or later, well inside it.
            if n > PER_BATCH and PER_BATCH * 0.1 < n % PER_BATCH < PER_BATCH * 0.7:
                break
            time.sleep(0.02)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the JVM and the Python workers too
        child.wait()
    time.sleep(1.0)
    commits = len([p for p in (checkpoint / "commits").iterdir()
                   if not p.name.startswith(".")])
    at_kill = read_all(target).num_rows
    # Rows of a batch Spark had not committed were in the stream.
    assert at_kill > commits * PER_BATCH, (at_kill, commits)
    subprocess.run([*args, "now", master], check=True, timeout=600, stdout=log,
                   stderr=subprocess.STDOUT, env=env)
    bodies = read_all(target).column("body")
    ids = pc.cast(pc.replace_substring(bodies.cast(pa.string()), ".", ""),
                  pa.int64()).to_numpy()
    assert len(ids) == FILES * ROWS_PER_FILE, (at_kill, commits, len(ids))
    assert (np.sort(ids) == np.arange(FILES * ROWS_PER_FILE)).all()
