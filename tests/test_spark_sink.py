"""The rabbitmq_stream sink on local Spark (local[2]) against the real
broker: a round trip through Spark is lossless, bad writes fail before any
task runs, super streams route as the producer does, and a streaming query
SIGKILLed in the middle of a micro-batch and restarted from its checkpoint
leaves every input row in the stream exactly once.

The replay tests call the writers' ``write`` in this process as Spark's
tasks do (a stand-in for the task context gives the partition, query and
micro-batch), the first attempt dying after the broker stored a chosen
number of rows, in whole sub-batches."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

import pystream
from pystream import ExactlyOnceError, Producer
from pystream.bounds import stream_bounds
from pystream.ranges import read_range
from pystream.spark import sink as sink_module
from pystream.spark.sink import BATCH_ID, QUERY_ID, BatchWriter, SinkConfig, StreamWriter
from pystream.super_stream import hash_route

from .conftest import MANAGEMENT, MODERN_URI, ROOT, local_spark
from .publishers import amqp091_url, declare_stream_amqp091

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
    """Every message the stream holds, up to the end of its last committed
    chunk (as the broker reports it: no waiting for silence)."""
    with pystream.connect(MODERN_URI) as client:
        bounds = stream_bounds(client, stream)
    rows = read_range(MODERN_URI, stream, bounds.first, bounds.end, body="binary", **options)
    return pa.Table.from_batches(list(rows), schema=rows.schema)


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
    assert first == [1 << 32 | 500] * 2  # job 1, 500 rows per task
    sink(df, stream=target, producerName="job")  # at once: the next job number
    assert modern.query_publisher_sequence(target, "job-0") >> 32 == 2
    # Partition 0 empty in two jobs in a row (within the same second).
    odd = df.where(F.col("body").cast("int") >= 500)
    sink(odd, stream=target, producerName="job")
    sink(odd, stream=target, producerName="job")
    assert modern.query_publisher_sequence(target, "job-0") >> 32 == 2
    assert modern.query_publisher_sequence(target, "job-1") >> 32 == 4
    assert read_all(target).num_rows == 3000


# --- streaming: exactly-once across a SIGKILL --------------------------------

QUERY = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from pystream.spark import RabbitMQStreamDataSource
    import json
    uri, source, target, checkpoint, mode, master, extra = sys.argv[1:]
    extra = json.loads(extra)
    builder = (SparkSession.builder.master(master)
               .config("spark.ui.enabled", "false"))
    for key, value in extra["conf"][mode].items():
        builder = builder.config(key, value)
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
              .option("stream", target).option("checkpointLocation", checkpoint)
              .options(**extra["options"]))
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


ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_killed_streaming_write_publishes_every_row_once(modern, streams, tmp_path, compressed):
    # Compressed: the restart also hands the sink Arrow batches of another size.
    options = {"compression": "zstd", "subEntrySize": "70"} if compressed else {}
    conf = {"run": {ARROW_BATCH: "10000"}, "now": {ARROW_BATCH: "3333"}} if compressed else None
    killed_write_publishes_every_row_once(modern, streams("kill"), tmp_path, "local[2]",
                                          options=options, conf=conf)


def killed_write_publishes_every_row_once(client, target: str, tmp_path, master: str,
                                          env: dict | None = None,
                                          options: dict[str, str] | None = None,
                                          conf: dict[str, dict[str, str]] | None = None) -> None:
    """Run the streaming write of QUERY on ``master`` (with the sink's
    ``options``, and Spark's ``conf`` per run: "run", then "now"), SIGKILL
    its driver's process group in the middle of a micro-batch, restart it
    from its checkpoint, and check that ``target`` holds every input row
    once."""
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
    extra = {"options": options or {}, "conf": conf or {"run": {}, "now": {}}}
    if env is None:  # the script's directory comes first: import this tree's pystream
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log = (tmp_path / "query.log").open("w")
    child = subprocess.Popen([*args, "run", master, json.dumps(extra)], stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True, env=env)
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
    subprocess.run([*args, "now", master, json.dumps(extra)], check=True, timeout=600, stdout=log,
                   stderr=subprocess.STDOUT, env=env)
    bodies = read_all(target).column("body")
    ids = pc.cast(pc.replace_substring(bodies.cast(pa.string()), ".", ""),
                  pa.int64()).to_numpy()
    assert len(ids) == FILES * ROWS_PER_FILE, (at_kill, commits, len(ids))
    assert (np.sort(ids) == np.arange(FILES * ROWS_PER_FILE)).all()


# --- replays, called as Spark's tasks call the writers -----------------------

BODY = StructType([StructField("body", BinaryType())])
KEYED = StructType([StructField("body", BinaryType()), StructField("routing_key", StringType())])


class Killed(Exception):
    """A stand-in for the SIGKILL of a task."""


class FakeTask:
    """What the writers read of Spark's TaskContext."""

    def __init__(self, partition: int, query: str | None, batch: int | None) -> None:
        self.partition = partition
        self.properties = {QUERY_ID: query, BATCH_ID: None if batch is None else str(batch)}

    def partitionId(self) -> int:
        return self.partition

    def getLocalProperty(self, key: str) -> str | None:
        return self.properties[key]


@contextlib.contextmanager
def as_task(partition: int = 0, query: str | None = None, batch: int | None = None):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sink_module, "_task_context", lambda: FakeTask(partition, query, batch))
        yield


@contextlib.contextmanager
def killed_after(rows: int | None, unit: int):
    """The task dies once its producers were handed ``rows`` rows; the
    broker keeps what was sent before, in whole sub-batches of ``unit``
    messages from the start of each call (what a SIGKILL may leave)."""
    if rows is None:
        yield
        return
    real = Producer.send_batch
    left = [rows]

    def send_batch(self, messages, **kwargs):
        if left[0] >= len(messages):
            left[0] -= len(messages)
            return real(self, messages, **kwargs)
        keep = left[0] // unit * unit
        if keep:
            real(self, messages.slice(0, keep), **kwargs)
        left[0] = 0
        raise Killed

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Producer, "send_batch", send_batch)
        yield


def numbered(lo: int, hi: int, size: int, keyed: bool = False):
    """Rows ``r{lo}``.. as Arrow batches of ``size`` rows (and a routing key)."""
    for at in range(lo, hi, size):
        ids = range(at, min(at + size, hi))
        columns = {"body": pa.array([f"r{i}".encode() for i in ids], pa.binary())}
        if keyed:
            columns["routing_key"] = pa.array([f"key-{i}" for i in ids])
        yield pa.record_batch(columns)


def stored_bodies(client, stream: str) -> list[bytes]:
    return read_all(stream).column("body").to_pylist()


def write_stream(config: SinkConfig, batches, *, batch: int, query: str = "query",
                 partition: int = 0, kill: int | None = None, unit: int = 1) -> bool:
    """One attempt of a streaming task; False when it was killed."""
    with as_task(partition, query, batch), killed_after(kill, unit):
        try:
            StreamWriter(config).write(batches)
        except Killed:
            return False
    return True


@pytest.mark.parametrize("compression", ["none", "gzip", "lz4", "zstd", "snappy"])
def test_replayed_micro_batch_is_stored_once_whatever_the_codec(modern, streams, compression):
    n = 25_000  # three calls of 10 000 rows
    want = sorted(f"r{i}".encode() for i in range(n))
    for sub in (None, 7, 100):
        options = {"uri": URI, "compression": compression}
        if sub is not None:
            options["subEntrySize"] = str(sub)
        unit = 1 if compression == "none" and sub is None else sub or 100
        for first, replay in ((1000, 333), (4096, 10_000)):
            # The first attempt: whole, killed in the first call or in the
            # last, or handed only its first rows (its input cut off: the
            # JVM died) and ending as if that were all.
            for kill, cut in ((None, n), (9_001, n), (21_500, n), (None, 15_123)):
                target = streams("codec")
                config = SinkConfig.parse({**options, "stream": target}, BODY, False)
                done = write_stream(config, numbered(0, cut, first), batch=5, kill=kill,
                                    unit=unit)
                assert done == (kill is None)
                if kill is not None or cut < n:
                    assert 0 < len(stored_bodies(modern, target)) < n
                assert write_stream(config, numbered(0, n, replay), batch=5)
                got = stored_bodies(modern, target)
                case = (sub, first, replay, kill, cut)
                assert len(got) == n, case
                assert sorted(got) == want, case
                modern.delete_stream(target)


@contextlib.contextmanager
def super_stream(client, partitions: int):
    name = f"test-sink-replay-{os.getpid()}-{time.monotonic_ns()}"
    client.create_super_stream(name, partitions=partitions)
    extra: list[str] = []
    try:
        yield name, extra
    finally:
        for stream in [*client.partitions(name), *extra]:
            client.delete_stream(stream, missing_ok=True)
        client.delete_super_stream(name, missing_ok=True)


def bind(super_name: str, stream: str, key: str, order: int) -> None:
    """Grow a super stream as RabbitMQ's tools do: a stream queue bound to
    its exchange with the next partition order."""
    import pika
    url = amqp091_url(MODERN_URI)
    declare_stream_amqp091(url, stream)
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        connection.channel().queue_bind(stream, super_name, routing_key=key,
                                        arguments={"x-stream-partition-order": order})


def unbind(super_name: str, stream: str) -> None:
    """Take a partition out of a super stream (its bindings, through the
    management API: they carry the broker's own argument types)."""
    path = f"{MANAGEMENT['modern']}/api/bindings/%2F/e/{super_name}/q/{stream}"
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    with urllib.request.urlopen(urllib.request.Request(
            path, headers={"Authorization": auth})) as answer:
        bindings = json.load(answer)
    assert bindings
    for binding in bindings:
        urllib.request.urlopen(urllib.request.Request(
            f"{path}/{urllib.parse.quote(binding['properties_key'], safe='')}",
            method="DELETE", headers={"Authorization": auth})).close()


def test_replay_after_a_partition_was_added_routes_as_its_first_attempt(modern):
    n = 12_000
    with super_stream(modern, 2) as (name, extra):
        options = {"uri": URI, "superstream": name}
        config = SinkConfig.parse(options, KEYED, False)
        first = modern.partitions(name)
        assert not write_stream(config, numbered(0, n, 1000, keyed=True), batch=3, kill=5000)
        new = f"{name}-2"
        extra.append(new)
        bind(name, new, "2", 2)
        assert modern.partitions(name) == [*first, new]
        restarted = SinkConfig.parse(options, KEYED, False)  # the driver after a restart
        assert write_stream(restarted, numbered(0, n, 777, keyed=True), batch=3)
        keys = pa.array([f"key-{i}" for i in range(n)])
        part = hash_route(keys, 2)
        for i, stream in enumerate(first):
            got = stored_bodies(modern, stream)
            assert len(got) == len(set(got)), stream
            assert sorted(got) == sorted(f"r{r}".encode() for r in np.nonzero(part == i)[0])
        assert stored_bodies(modern, new) == []
        # The next micro-batch routes by the three partitions.
        assert write_stream(restarted, numbered(n, n + 3000, 1000, keyed=True), batch=4)
        assert len(stored_bodies(modern, new)) > 0
        assert sum(len(stored_bodies(modern, s)) for s in [*first, new]) == n + 3000


def test_replay_after_partitions_were_rebound_is_refused(modern):
    with super_stream(modern, 2) as (name, extra):
        options = {"uri": URI, "superstream": name}
        config = SinkConfig.parse(options, KEYED, False)
        first = modern.partitions(name)
        assert not write_stream(config, numbered(0, 8000, 1000, keyed=True), batch=9, kill=3000)
        before = [stored_bodies(modern, s) for s in first]
        # Partition 1 replaced by another stream at the same place.
        new = f"{name}-x"
        extra.append(first[1])
        unbind(name, first[1])
        bind(name, new, "x", 1)
        assert modern.partitions(name) == [first[0], new]
        restarted = SinkConfig.parse(options, KEYED, False)
        with pytest.raises(ExactlyOnceError, match="micro-batch 9 was first written"):
            write_stream(restarted, numbered(0, 8000, 1000, keyed=True), batch=9)
        assert [stored_bodies(modern, s) for s in first] == before
        assert stored_bodies(modern, new) == []


def write_job(writer: BatchWriter, partitions: dict[int, range], kill: int | None = None):
    """A df.write job's tasks, one after another, as Spark runs them."""
    for partition, rows in partitions.items():
        with as_task(partition), killed_after(kill, 1):
            try:
                writer.write(numbered(rows.start, rows.stop, 64))
            except Killed:
                return False
    return True


def test_batch_job_numbers_come_from_the_broker_not_the_clock(modern, streams, monkeypatch):
    target = streams("jobs")
    options = {"uri": URI, "stream": target, "producerName": "nightly"}
    clock = [1_700_000_000.0]
    monkeypatch.setattr(sink_module, "time", type("Clock", (), {
        "time": staticmethod(lambda: clock[0]), "monotonic": staticmethod(time.monotonic),
        "sleep": staticmethod(time.sleep)}))

    def job(partitions: dict[int, range], kill: int | None = None) -> BatchWriter:
        writer = BatchWriter(SinkConfig.parse(options, BODY, False))
        write_job(writer, partitions, kill)
        return writer

    # Every job in the same second.
    job({0: range(0, 100), 1: range(100, 200)})
    job({0: range(0), 1: range(200, 300)})        # partition 0 empty
    job({0: range(0), 1: range(300, 400)})        # again, at once
    clock[0] -= 10_000                            # the clock behind
    last = job({0: range(400, 500), 1: range(500, 600)}, kill=50)
    assert write_job(last, {0: range(400, 500), 1: range(500, 600)})  # Spark's retry
    got = stored_bodies(modern, target)
    assert sorted(got) == sorted(f"r{i}".encode() for i in range(600))


def test_a_name_holding_a_later_job_refuses_the_write(modern, streams):
    target = streams("later")
    # A job numbered by the clock (an older pystream) wrote partition 1 only.
    with modern.producer(target, name="old-1") as producer:
        producer.send_batch([b"old"], publishing_id=1_700_000_000 << 32 | 1).result(30)
    writer = BatchWriter(SinkConfig.parse({"uri": URI, "stream": target,
                                           "producerName": "old"}, BODY, False))
    assert write_job(writer, {0: range(0, 10)})
    with pytest.raises(ExactlyOnceError, match="holds publishing id"):
        write_job(writer, {1: range(10, 20)})
    assert len(stored_bodies(modern, target)) == 11


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(codec=st.sampled_from([None, "none", "gzip", "lz4", "zstd", "snappy"]),
       sub=st.integers(1, 300), partitions=st.integers(1, 3), n=st.integers(1, 25_000),
       sizes=st.lists(st.integers(50, 12_000), min_size=2, max_size=3),
       attempts=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=2))
def test_the_scheme_against_the_broker(modern, codec, sub, partitions, n, sizes, attempts):
    """The id scheme's model (tests/test_spark_sink_ids.py) on a real broker:
    a super stream's micro-batch cut off and killed once or twice at drawn
    points, with drawn Arrow batch sizes, then replayed to its end: every
    row once."""
    options = {"uri": URI}
    if codec is not None:
        options |= {"compression": codec, "subEntrySize": str(sub)}
    unit = 1 if codec is None else sub
    with super_stream(modern, partitions) as (name, _):
        config = SinkConfig.parse({**options, "superstream": name}, KEYED, False)
        for size, (cut, kill) in zip(sizes, attempts, strict=False):
            write_stream(config, numbered(0, round(cut * n), size, keyed=True), batch=2,
                         partition=1, kill=int(kill * n), unit=unit)
        assert write_stream(config, numbered(0, n, sizes[-1], keyed=True), batch=2,
                            partition=1)
        got = [b for s in modern.partitions(name) for b in stored_bodies(modern, s)]
        assert len(got) == n
        assert sorted(got) == sorted(f"r{i}".encode() for i in range(n))
