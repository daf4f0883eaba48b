"""The PySpark data source on local Spark (local[2]) against the real
broker: batch reads equal a direct read, super streams, options, retention,
and streaming queries that survive a kill with exactly-once output."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable

import pystream
from pystream.spark import (
    BrokerRef,
    RabbitMQStreamDataSource,
    plan_ranges,
    read_range,
    stream_bounds,
)

from . import brokers
from .conftest import EXTERNAL_URI, MODERN_URI, local_spark
from .holding import HoldingProxy
from .waiting import wait_until

pytestmark = pytest.mark.broker  # every test here talks to a test broker

#: The test broker's URI without its password (the data source refuses
#: one); the password is guest, the default.
URI = pystream.parse_uri(MODERN_URI).uri()


@pytest.fixture(scope="module")
def spark():
    session = local_spark()
    yield session


def source(spark, **options):
    reader = spark.read.format("rabbitmq_stream").option("uri", URI)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def properties_batch(lo: int, hi: int) -> pa.RecordBatch:
    ids = np.arange(lo, hi)
    text = pa.array(ids.astype(str))
    properties = pa.StructArray.from_arrays(
        [pc.binary_join_element_wise("m", text, ""), pa.array(ids, pa.int64())],
        names=["message_id", "group_sequence"])
    keys = pa.array(["i"] * len(ids))
    application = pa.MapArray.from_arrays(np.arange(len(ids) + 1, dtype=np.int32),
                                          keys, text)
    return pa.RecordBatch.from_arrays(
        [pc.binary_join_element_wise("body-", text, "").cast(pa.binary()),
         properties, application],
        names=["body", "properties", "application_properties"])


def fill(client, stream, lo, hi, step=100_000):
    with client.producer(stream) as producer:
        for a in range(lo, hi, step):
            producer.send_batch(properties_batch(a, min(hi, a + step)))
        producer.flush()


@pytest.fixture(scope="module")
def million():
    name = f"test-spark-1m-{os.getpid()}"
    with pystream.connect(MODERN_URI) as client:
        client.create_stream(name)
        fill(client, name, 0, 1_000_000)
        yield name
        client.delete_stream(name)


def direct(stream, **options) -> pa.Table:
    with pystream.connect(MODERN_URI) as client:
        with client.consumer(stream, offset="first", body="binary", **options) as consumer:
            return consumer.read(10**9, timeout=2.0)


def test_batch_read_equals_a_direct_read(spark, million):
    columns = "properties,application_properties"
    df = source(spark, stream=million, minPartitions="4", columns=columns)
    assert df.rdd.getNumPartitions() == 4
    got = df.toArrow().sort_by("offset")
    want = direct(million, columns=columns.split(","))
    assert got.num_rows == want.num_rows == 1_000_000
    assert got.column("stream").unique().to_pylist() == [million]
    for name in want.column_names:
        assert got.column(name).combine_chunks().equals(want.column(name).combine_chunks()), name
    properties = got.column("properties").combine_chunks()
    assert properties.field("message_id")[123_456].as_py() == "m123456"


def test_schema_is_sparks_own(spark, million):
    df = source(spark, stream=million, columns="message_annotations")
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema] == [
        ("stream", "string", False), ("offset", "bigint", False),
        ("chunk_timestamp", "timestamp", False), ("body", "binary", False),
        ("message_annotations", "map<string,string>", True)]


def test_header_and_footer_columns(spark, stream_name):
    """The AMQP header and footer sections, as proton (the oracle) decodes
    the entries an AMQP 1.0 publisher stored."""
    from proton import Message, symbol

    from . import amqp_oracle as O
    from .test_amqp_conformance import publish_amqp10

    footer = O.section(O.FOOTER, {symbol("x-sum"): "abc", symbol("x-n"): 7})
    sent = [Message(durable=True, priority=7, ttl=5000, first_acquirer=True,
                    delivery_count=3).encode() + O.data_section(b"a") + footer,
            O.message_head() + O.data_section(b"b"),
            O.data_section(b"c") + footer]
    with pystream.connect(MODERN_URI) as client:
        client.create_stream(stream_name)
        try:
            publish_amqp10(brokers.MODERN.amqp, stream_name, sent)
            with client.consumer(stream_name, offset="first", amqp=False) as consumer:
                raw = consumer.read(3, timeout=30).column("body").cast(pa.binary()).to_pylist()
            df = source(spark, stream=stream_name, columns="footer,header")
            assert [f.name for f in df.schema][-2:] == ["header", "footer"]
            rows = df.orderBy("offset").toArrow().to_pylist()
        finally:
            client.delete_stream(stream_name)
    assert [r["body"] for r in rows] == [b"a", b"b", b"c"]
    for entry, row in zip(raw, rows, strict=True):
        stored = dict(O.sections(entry))
        assert row["header"] == O.header_row(stored.get(O.HEADER))
        assert row["footer"] == O.text_map(stored.get(O.FOOTER))
    assert rows[0]["header"]["priority"] == 7 and rows[0]["header"]["durable"] is True
    assert dict(rows[0]["footer"]) == {"x-sum": "abc", "x-n": "7"}
    assert rows[1]["footer"] is None


def test_offsets_and_timestamps_select_a_range(spark, million):
    df = source(spark, stream=million, startingOffsets=json.dumps({million: 1000}),
                endingOffsets=json.dumps({million: 251_000}), maxRecordsPerPartition="100000")
    assert df.rdd.getNumPartitions() == 3
    row = df.agg(F.count("*").alias("n"), F.min("offset").alias("lo"),
                 F.max("offset").alias("hi")).first()
    assert (row.n, row.lo, row.hi) == (250_000, 1000, 250_999)
    future = int(time.time() * 1000) + 3_600_000
    assert source(spark, stream=million, startingTimestamp=str(future)).count() == 0
    assert source(spark, stream=million, startingTimestamp="0").count() == 1_000_000
    assert source(spark, stream=million, startingOffsets="latest").count() == 0


def test_super_stream(spark, modern):
    name = f"test-spark-super-{os.getpid()}"
    modern.create_super_stream(name, partitions=3)
    try:
        keys = pa.array([f"k{i}" for i in range(30_000)])
        batch = pa.RecordBatch.from_arrays([keys.cast(pa.binary()), keys],
                                           names=["body", "key"])
        with modern.producer(super_stream=name, routing_key="key") as producer:
            producer.send_batch(batch).result(30)
        counts = {r.stream: r["count"] for r in
                  source(spark, superstream=name).groupBy("stream").count().collect()}
        for partition in modern.partitions(name):
            assert counts[partition] == direct(partition).num_rows > 0
        assert sum(counts.values()) == 30_000
    finally:
        modern.delete_super_stream(name)


def test_bad_options_fail_clearly(spark, million):
    with pytest.raises(Exception, match="holds a password"):
        source(spark, stream=million, uri=MODERN_URI.replace("guest@", "guest:secret@"))
    with pytest.raises(Exception, match="'password' option"):
        source(spark, stream=million, password="secret")
    with pytest.raises(Exception, match="exactly one of"):
        source(spark, stream=million, superstream="x")
    with pytest.raises(Exception, match="unknown columns"):
        source(spark, stream=million, columns="colour")
    with pytest.raises(Exception, match="StreamDoesNotExist"):
        source(spark, stream="no-such-stream-here").count()


def test_no_password_travels_with_the_plan(spark, million, monkeypatch, tmp_path):
    from pyspark import cloudpickle

    address = pystream.parse_uri(MODERN_URI)
    monkeypatch.setenv("PYSTREAM_TEST_PASSWORD", address.password)
    source_ = RabbitMQStreamDataSource({
        "uri": f"rabbitmq-stream://{address.host}:{address.port}/",
        "passwordEnv": "PYSTREAM_TEST_PASSWORD", "stream": million,
        "minPartitions": "2"})
    reader = source_.reader(source_.schema())
    parts = reader.partitions()
    assert address.password.encode() not in cloudpickle.dumps((source_, reader, parts))
    assert next(iter(reader.read(parts[0]))).num_rows > 0
    # Spark's Python workers took their environment when the session
    # started; a file is read where the connection is made.
    wrong = tmp_path / "password"
    wrong.write_text("wrong\n")
    with pytest.raises(Exception, match="AuthenticationFailure"):
        source(spark, stream=million, passwordFile=str(wrong)).count()


@pytest.fixture
def truncated(modern, stream_name):
    """A stream whose retention removed its first segments."""
    modern.create_stream(stream_name, max_length_bytes=3_000_000,
                         stream_max_segment_size_bytes=500_000)
    body = b"x" * 1000
    with modern.producer(stream_name) as producer:
        for _ in range(20):
            producer.send_batch([body] * 500)
            producer.flush()
    # Retention runs in the background: wait until it has settled.
    bounds, settled = None, stream_bounds(modern, stream_name)
    while bounds != settled:
        time.sleep(1.0)
        bounds, settled = settled, stream_bounds(modern, stream_name)
    assert bounds.first > 0, "retention did not truncate the stream"
    yield stream_name, bounds
    modern.delete_stream(stream_name, missing_ok=True)


def test_fail_on_data_loss(spark, truncated):
    stream, bounds = truncated
    start = json.dumps({stream: 0})
    with pytest.raises(Exception, match="DataLoss"):
        source(spark, stream=stream, startingOffsets=start).count()
    rows = source(spark, stream=stream, startingOffsets=start, failOnDataLoss="false")
    assert rows.agg(F.min("offset")).first()[0] == bounds.first
    assert source(spark, stream=stream).count() == bounds.end - bounds.first
    with pytest.raises(pystream.DataLoss):
        list(read_range(URI, stream, 0, bounds.end, fail_on_data_loss=True))


def test_map_in_arrow_over_planned_ranges(spark, million):
    broker = BrokerRef(URI)
    ranges = plan_ranges(broker, [million], min_partitions=4)
    assert len(ranges) == 4

    def read(batches):
        for batch in batches:
            for stream, start, end in zip(*batch.to_pydict().values(), strict=True):
                for part in read_range(broker, stream, start, end, body="binary"):
                    yield pa.RecordBatch.from_arrays(
                        [part.column("offset"), pc.binary_length(part.column("body"))],
                        names=["offset", "size"])

    plan = spark.createDataFrame([(r.stream, r.start, r.end) for r in ranges],
                                 "stream string, start long, end long")
    out = plan.repartition(4).mapInArrow(read, "offset long, size int")
    row = out.agg(F.count("*"), F.countDistinct("offset"), F.sum("size")).first()
    assert tuple(row) == (1_000_000, 1_000_000, sum(len(b"body-%d" % i) for i in range(1_000_000)))


# --- TLS --------------------------------------------------------------------

def tls_options(folder, **more: str) -> dict[str, str]:
    """The data source options of the TLS listener with EXTERNAL: paths
    only, no user and no password."""
    return {"uri": EXTERNAL_URI, "tlsCaFile": str(folder / "ca.pem"),
            "tlsCertFile": str(folder / "client.pem"),
            "tlsKeyFile": str(folder / "client.key"),
            "saslMechanism": "external", **more}


def test_tls_batch_read_with_external(spark, tls_dir, cert_user, modern,
                                      modern_stream):
    """Each task builds its TLS context from the paths and logs in as the
    client certificate."""
    for lo in range(0, 3000, 1000):
        publish_range(modern, modern_stream, lo, lo + 1000)
    df = source(spark, **tls_options(tls_dir, stream=modern_stream,
                                     maxRecordsPerPartition="1000"))
    assert df.rdd.getNumPartitions() == 3
    bodies = df.select("body").toArrow().column("body").to_pylist()
    assert sorted(int(b) for b in bodies) == list(range(3000))


def test_tls_plan_carries_paths_not_secrets(tls_dir, modern, modern_stream,
                                            monkeypatch):
    """What the driver sends to executors names the TLS files, but holds
    neither their contents nor a password; a wrong CA fails on the driver,
    while planning."""
    from pyspark import cloudpickle

    publish_range(modern, modern_stream, 0, 100)
    monkeypatch.setenv("PYSTREAM_TEST_PASSWORD", "guest")
    for options in (tls_options(tls_dir),
                    {"uri": "rabbitmq-stream+tls://localhost:5551/",
                     "tlsCaFile": str(tls_dir / "ca.pem"),
                     "passwordEnv": "PYSTREAM_TEST_PASSWORD"}):
        source_ = RabbitMQStreamDataSource({**options, "stream": modern_stream})
        reader = source_.reader(source_.schema())
        parts = reader.partitions()
        pickled = cloudpickle.dumps((source_, reader, parts))
        assert str(tls_dir / "ca.pem").encode() in pickled
        assert b"guest" not in pickled
        for name in ("client.key", "client.pem", "ca.pem"):
            # The base64 lines between the PEM markers.
            for line in (tls_dir / name).read_text().splitlines():
                if not line.startswith("-----"):
                    assert line.encode() not in pickled, name
        assert sum(b.num_rows for b in reader.read(parts[0])) == 100
    wrong = RabbitMQStreamDataSource(tls_options(
        tls_dir, stream=modern_stream, tlsCaFile=str(tls_dir / "wrong-ca.pem")))
    with pytest.raises(pystream.CertificateVerificationError,
                       match="certificate did not verify"):
        wrong.reader(wrong.schema()).partitions()


# --- streaming --------------------------------------------------------------

def stream_source(spark, stream, **options):
    reader = (spark.readStream.format("rabbitmq_stream").option("uri", URI)
              .option("stream", stream).option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def publish_range(client, stream, lo, hi):
    with client.producer(stream) as producer:
        producer.send_batch([b"%d" % i for i in range(lo, hi)])
        producer.flush()


def test_streaming_micro_batches_see_every_record_once(spark, modern, modern_stream):
    publish_range(modern, modern_stream, 0, 1000)
    table = f"t_{os.getpid()}"
    query = (stream_source(spark, modern_stream, consumerName="spark-test")
             .writeStream.format("memory").queryName(table).start())
    try:
        query.processAllAvailable()
        for lo in (1000, 3000):
            publish_range(modern, modern_stream, lo, lo + 2000)
            query.processAllAvailable()
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert len(batches) >= 3
        offsets = spark.sql(f"select offset, body from {table}").toArrow()
    finally:
        query.stop()
    # Each commit stored an offset in a tracking chunk, which takes an offset.
    seen = offsets.column("offset").to_pylist()
    assert len(set(seen)) == len(seen)
    assert sorted(int(b) for b in offsets.column("body").to_pylist()) == list(range(5000))
    # Spark commits a batch to the source when it plans the next one, so the
    # stored offset lags; it is always the last record of some batch.
    assert modern.query_offset(modern_stream, "spark-test") in set(seen)


def test_available_now_respects_max_offsets_per_trigger(spark, modern, modern_stream):
    for lo in range(0, 3000, 500):
        publish_range(modern, modern_stream, lo, lo + 500)
    table = f"a_{os.getpid()}"
    query = (stream_source(spark, modern_stream, maxOffsetsPerTrigger="1000")
             .writeStream.format("memory").queryName(table)
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 3000 and len(sizes) >= 3 and max(sizes) <= 1000
    assert spark.sql(f"select count(distinct offset) from {table}").first()[0] == 3000


def test_latest_start_skips_what_is_there(spark, modern, modern_stream):
    publish_range(modern, modern_stream, 0, 100)
    table = f"l_{os.getpid()}"
    query = (stream_source(spark, modern_stream, startingOffsets="latest")
             .writeStream.format("memory").queryName(table).start())
    try:
        query.processAllAvailable()
        publish_range(modern, modern_stream, 100, 150)
        query.processAllAvailable()
        offsets = spark.sql(f"select offset from {table}").toArrow().column(0)
    finally:
        query.stop()
    assert sorted(offsets.to_pylist()) == list(range(100, 150))


QUERY = textwrap.dedent("""
    import os, sys
    from pyspark.sql import SparkSession
    from pystream.spark import RabbitMQStreamDataSource
    uri, stream, sink, checkpoint, mode = sys.argv[1:]
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RabbitMQStreamDataSource)
    df = (spark.readStream.format("rabbitmq_stream").option("uri", uri)
          .option("stream", stream).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "20000").load())
    writer = (df.select("offset", "body").writeStream.format("parquet")
              .option("path", sink).option("checkpointLocation", checkpoint))
    if mode == "now":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="1 second").start().awaitTermination()
""")


@pytest.mark.spark
@pytest.mark.slow
def test_killed_query_restarts_from_its_checkpoint_exactly_once(
        spark, modern, modern_stream, tmp_path):
    for lo in range(0, 100_000, 10_000):
        publish_range(modern, modern_stream, lo, lo + 10_000)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    script = tmp_path / "query.py"
    script.write_text(QUERY)
    args = [sys.executable, str(script), URI, modern_stream, str(sink), str(checkpoint)]
    log = (tmp_path / "query.log").open("w")
    child = subprocess.Popen([*args, "trigger"], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        def second_batch() -> bool:
            assert child.poll() is None, (tmp_path / "query.log").read_text()[-3000:]
            return (checkpoint / "commits" / "1").exists()

        wait_until(second_batch, 180, 0.1, what="a second micro-batch")
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the JVM too, mid-way if it can
        child.wait()
    publish_range(modern, modern_stream, 100_000, 110_000)
    subprocess.run([*args, "now"], check=True, timeout=300, stdout=log,
                   stderr=subprocess.STDOUT)
    got = spark.read.parquet(str(sink)).toArrow()
    offsets = np.sort(got.column("offset").to_numpy())
    assert len(offsets) == 110_000
    assert (offsets == np.arange(110_000)).all()
    assert sorted(int(b) for b in got.column("body").to_pylist()) == list(range(110_000))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_recreated_stream_is_not_skipped(modern, modern_stream, caplog,
                                         fail_on_data_loss):
    """A stream deleted and created again ends before the query's
    checkpointed position (ends never move back): its records up to that
    position would be skipped. failOnDataLoss fails the query; without it,
    a warning, and the new stream is read from its start."""
    publish_range(modern, modern_stream, 0, 1000)
    source_ = RabbitMQStreamDataSource({
        "uri": URI, "stream": modern_stream,
        "failOnDataLoss": str(fail_on_data_loss).lower()})
    reader = source_.streamReader(source_.schema())
    checkpointed = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert checkpointed == {modern_stream: 1000}
    modern.delete_stream(modern_stream)
    modern.create_stream(modern_stream)
    publish_range(modern, modern_stream, 0, 100)
    if fail_on_data_loss:
        with pytest.raises(pystream.DataLoss, match="deleted and created again"):
            reader.latestOffset(checkpointed, ReadAllAvailable())
        return
    with caplog.at_level(logging.WARNING, "pystream.spark"):
        end = reader.latestOffset(checkpointed, ReadAllAvailable())
    assert end == {modern_stream: 100}
    assert "created again" in caplog.text
    bodies = [int(b) for p in reader.partitions(checkpointed, end)
              for batch in reader.read(p) for b in batch.column("body").to_pylist()]
    assert bodies == list(range(100))


@pytest.mark.slow
@pytest.mark.parametrize("read_timeout", [None, "1.5"])
def test_planning_waits_for_the_broker_or_raises(modern, modern_stream, read_timeout):
    """The source plans a batch from the broker's answers: a broker paused
    while it owes a probe its chunk delays the plan, which is then exact,
    or, past ``readTimeout``, fails it with ``RequestTimeout``; never an
    empty plan."""
    from pystream.ranges import OffsetRange, client_for

    publish_range(modern, modern_stream, 0, 100)
    with HoldingProxy("modern") as proxy:
        options = {"uri": proxy.uri, "stream": modern_stream}
        if read_timeout is not None:
            options["readTimeout"] = read_timeout
        source_ = RabbitMQStreamDataSource(options)
        reader = source_.reader(source_.schema())
        # Every node through the proxy, as the ranges' own tests resolve it.
        client_for(reader.config.broker).pool.resolver = proxy.resolve
        if read_timeout is not None:
            with pytest.raises(pystream.RequestTimeout):
                reader.partitions()
        else:
            parts = reader.partitions()
            assert [p.value for p in parts] == [OffsetRange(modern_stream, 0, 100)]
        assert proxy.held
