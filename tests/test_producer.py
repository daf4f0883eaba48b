"""The producer against the real brokers: batches, single messages,
properties, compression, filter values, deduplication after a crash, super
streams; read back with pystream's consumer (and rstream for gzip)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

import pystream
from pystream import Filter, PublishError, UnsupportedFeature
from pystream.confirms import _Batch

from . import brokers
from .conftest import ROOT
from .waiting import wait_until

COLUMNS = ["properties", "application_properties", "message_annotations"]


def read_all(client, stream, n, **options) -> pa.Table:
    with client.consumer(stream, offset="first", **options) as consumer:
        table = consumer.read(n, timeout=15)
        assert consumer.read(1, timeout=0.3).num_rows == 0, "more than sent"
    return table


@pytest.mark.broker
def test_send_batch_of_bytes(client, stream):
    bodies = [b"m%d" % i * (i % 5) for i in range(10_000)]
    with client.producer(stream) as producer:
        assert producer.send_batch(bodies).result(30) == 10_000
    table = read_all(client, stream, 10_000)
    assert table.column("offset").to_pylist() == list(range(10_000))
    assert table.column("body").to_pylist() == bodies


def test_a_list_of_bytes_becomes_a_binary_array_without_pandas():
    """pa.array on a list imports pandas (seconds on a busy machine) inside
    the first send_batch; the list of bytes is joined into one buffer."""
    from pystream.arrow import as_batch, bytes_array
    bodies = [b"m%d" % i * (i % 5) for i in range(1000)]
    assert bytes_array(bodies).equals(pa.array(bodies, pa.binary()))
    assert bytes_array([b"a", None]) is None and bytes_array((b"a",)) is None
    assert as_batch([b"a", None]).column(0).null_count == 1
    code = ("import sys; from pystream.arrow import as_batch; "
            "as_batch([b'x'] * 10); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.broker
def test_send_with_properties(client, stream):
    with client.producer(stream, batch_size=7, linger_ms=5) as producer:
        futures = [producer.send(
            b"body %d" % i,
            properties={"message_id": f"id-{i}", "content_type": "text/plain",
                        "group_sequence": i} if i % 2 else None,
            application_properties={"n": i, "even": i % 2 == 0},
            message_annotations={"x-tag": "t"} if i == 3 else None)
            for i in range(20)]
        assert [f.result(10) for f in futures] == list(range(1, 21))
    table = read_all(client, stream, 20, columns=COLUMNS)
    rows = table.to_pylist()
    assert [r["body"] for r in rows] == [b"body %d" % i for i in range(20)]
    assert rows[1]["properties"]["message_id"] == "id-1"
    assert rows[1]["properties"]["group_sequence"] == 1
    assert rows[0]["properties"] is None
    assert dict(rows[4]["application_properties"]) == {"n": "4", "even": "True"}
    assert dict(rows[3]["message_annotations"]) == {"x-tag": "t"}


@pytest.mark.broker
def test_record_batch_round_trip(client, stream, stream_name):
    with client.producer(stream) as producer:
        for i in range(3):
            producer.send(b"r%d" % i, properties={"subject": f"s{i}"},
                          application_properties={"k": str(i)})
    read = read_all(client, stream, 3, columns=COLUMNS)
    copy = stream_name + "-copy"
    client.create_stream(copy)
    try:
        with client.producer(copy) as producer:
            producer.send_batch(read.drop_columns(["offset", "chunk_timestamp"])
                                ).result(10)
        again = read_all(client, copy, 3, columns=COLUMNS)
        for name in ("body", *COLUMNS):
            assert again.column(name).to_pylist() == read.column(name).to_pylist()
    finally:
        client.delete_stream(copy)


@pytest.mark.broker
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd", "none"])
def test_compressed_sub_batches(client, stream, codec):
    bodies = [b"compressible %d " % i * 10 for i in range(5000)]
    with client.producer(stream, compression=codec, sub_batch_size=64) as p:
        last = p.send_batch(bodies).result(30)
    assert last == -(-5000 // 64)  # one publishing id per sub-batch
    table = read_all(client, stream, 5000)
    assert table.column("body").to_pylist() == bodies
    assert table.column("offset").to_pylist() == list(range(5000))


@pytest.mark.broker
def test_gzip_is_readable_by_rstream(modern, stream_name):
    import asyncio

    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    modern.create_stream(stream_name)
    bodies = [b"gz %d" % i for i in range(500)]
    try:
        with modern.producer(stream_name, compression="gzip") as p:
            p.send_batch(bodies).result(30)

        async def read() -> list[bytes]:
            got: list[bytes] = []
            done = asyncio.Event()

            async def on_message(msg: AMQPMessage, ctx) -> None:
                got.append(bytes(msg.body if not isinstance(msg.body, list)
                                 else b"".join(msg.body)))
                if len(got) == len(bodies):
                    done.set()

            async with Consumer(brokers.MODERN.advertised, brokers.MODERN.stream, username="guest",
                                password="guest") as consumer:
                await consumer.subscribe(
                    stream_name, on_message, decoder=amqp_decoder,
                    offset_specification=ConsumerOffsetSpecification(
                        OffsetType.FIRST, None))
                await asyncio.wait_for(done.wait(), 20)
            return got

        assert asyncio.run(read()) == bodies
    finally:
        modern.delete_stream(stream_name)


@pytest.mark.broker
def test_filter_values(modern, stream_name):
    modern.create_stream(stream_name)
    try:
        with modern.producer(stream_name, filter_value="color") as p:
            for color in ("red", "blue", "red"):
                p.send_batch(pa.RecordBatch.from_pydict({
                    "body": [color.encode()] * 100,
                    "application_properties": pa.array(
                        [[("color", color)]] * 100,
                        pa.map_(pa.string(), pa.string()))})).result(10)
        with modern.consumer(stream_name, offset="first",
                             filter=Filter(["red"])) as consumer:
            assert set(consumer.read(1000, timeout=1.5).column("body").to_pylist()) \
                == {b"red"}
    finally:
        modern.delete_stream(stream_name)


@pytest.mark.broker
def test_legacy_broker_refuses_filter_values(legacy, stream_name):
    legacy.create_stream(stream_name)
    try:
        with pytest.raises(UnsupportedFeature):
            legacy.producer(stream_name, filter_value="color")
    finally:
        legacy.delete_stream(stream_name)


@pytest.mark.broker
def test_back_pressure_bounds_messages_in_flight(client, stream):
    with client.producer(stream, max_in_flight=1000) as p:
        peak = 0
        for _i in range(30):
            p.send_batch([b"x"] * 500)
            peak = max(peak, p._confirms.in_flight)
        p.flush(30)
    assert peak <= 1000
    assert read_all(client, stream, 15_000).num_rows == 15_000


CRASHING_PUBLISHER = textwrap.dedent("""
    import sys, pystream
    uri, stream = sys.argv[1:3]
    client = pystream.connect(uri)
    p = client.producer(stream, name="crashy", max_in_flight=5000)
    bodies = [b"%06d" % i for i in range(100_000)]
    for start in range(0, 100_000, 1000):
        p.send_batch(bodies[start:start + 1000], publishing_id=start + 1)
        if start == 40_000:
            p.flush(30)
            print("flushed", flush=True)
    p.flush(60)
    print("done", flush=True)
""")


@pytest.mark.slow
@pytest.mark.broker
def test_named_producer_does_not_duplicate_after_a_crash(uri, client, stream):
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_PUBLISHER, uri,
                             stream], stdout=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == b"flushed"
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # mid-way, confirms outstanding
    proc.wait(10)
    bodies = [b"%06d" % i for i in range(100_000)]
    with client.producer(stream, name="crashy") as p:
        kept = p.last_publishing_id
        assert 41_000 <= kept <= 100_000
        p.send_batch(bodies, publishing_id=1).result(60)  # everything again
    table = read_all(client, stream, 200_000)
    assert table.column("body").to_pylist() == bodies


@pytest.mark.slow
@pytest.mark.broker
def test_super_stream_routes_by_murmur3(modern, stream_name):
    modern.create_super_stream(stream_name, partitions=3)
    try:
        keys = [f"customer-{i % 40}" for i in range(3000)]
        with modern.producer(super_stream=stream_name,
                             routing_key="key") as p:
            p.send_batch(pa.RecordBatch.from_pydict({
                "body": [k.encode() for k in keys], "key": keys})).result(30)
        seen: dict[str, str] = {}
        total = 0
        for partition in modern.partitions(stream_name):
            bodies = read_all(modern, partition, 3000).column("body").to_pylist()
            total += len(bodies)
            for b in bodies:
                assert seen.setdefault(b.decode(), partition) == partition
        assert total == 3000 and len(set(seen.values())) == 3
        # The Java and Go clients' routing for a known key.
        hashed = int(pystream._core.murmur3_32(["customer-7"])[0]) & 0x7FFFFFFF
        assert seen["customer-7"] == f"{stream_name}-{hashed % 3}"
    finally:
        modern.delete_super_stream(stream_name)


def test_refused_ids_fail_their_futures():
    batch = _Batch(10, np.ones(3, dtype=np.int64), b"",
                   [Future() for _ in range(3)])
    batch.failures = [(11, 0x12)]
    batch.resolve()
    with pytest.raises(PublishError) as e:
        batch.future.result()
    assert e.value.publishing_id == 11 and e.value.code == 0x12
    assert batch.message_futures[0].result() == 10
    with pytest.raises(PublishError):
        batch.message_futures[1].result()


@pytest.mark.slow
@pytest.mark.broker
def test_producer_resends_after_the_broker_closes_connections(modern, stream_name):
    """A named producer keeps publishing while the broker drops its
    connections: every message lands once, in order."""
    from .conftest import broker_ctl

    modern.create_stream(stream_name)
    n = 200_000
    bodies = pa.array([b"%07d" % i for i in range(n)], pa.binary())
    try:
        with modern.producer(stream_name, name="resender",
                             max_in_flight=20_000) as p:
            for start in range(0, n, 5000):
                p.send_batch(bodies.slice(start, 5000))
                if start in (50_000, 120_000):
                    broker_ctl("modern", "close_all_connections", "test")
            p.flush(120)
        table = read_all(modern, stream_name, n + 1)
        assert table.column("body").to_pylist() == bodies.to_pylist()
    finally:
        modern.delete_stream(stream_name)


@pytest.mark.broker
def test_recovery_sends_again_only_frames_not_confirmed(modern, stream_name, monkeypatch):
    """An unnamed producer recovering mid-batch sends again the frames
    the broker has not confirmed, not the whole batch: the confirmed ones
    would be stored twice (the broker drops repeats only for a name)."""
    modern.create_stream(stream_name)
    bodies = [b"%06d" % i + b"x" * 1000 for i in range(3000)]  # 3 frames of 1 MiB
    try:
        with modern.producer(stream_name) as p:
            conn = p._link.connection
            real = conn.send_bytes

            def first_frame_only(data) -> None:
                # As if the connection broke after the first frame.
                view = memoryview(data)
                real(view[:4 + int.from_bytes(view[:4], "big")])

            monkeypatch.setattr(conn, "send_bytes", first_frame_only)
            future = p.send_batch(bodies)
            (batch,) = p._confirms.pending
            first = int.from_bytes(memoryview(batch.frames)[9:13], "big")
            assert 0 < first < len(bodies)
            wait_until(lambda: batch.settled.sum() >= first, 30, 0.01)
            assert batch.settled[:first].all() and not batch.settled[first:].any()
            monkeypatch.undo()
            p._link.on_metadata_update(0x06)  # recovers as after a lost connection
            assert future.result(30) == len(bodies)
        table = read_all(modern, stream_name, len(bodies))
        assert table.column("body").to_pylist() == bodies
    finally:
        modern.delete_stream(stream_name)


def _drop_publisher(producer) -> None:
    """Delete the producer's publisher on the broker behind its back, as
    the broker does when the stream's leader moves."""
    from pystream import protocol as P
    pid = producer._link.publisher_id
    producer._link.connection.request(lambda c: P.DeletePublisher(c, pid),
                                 "delete publisher")


@pytest.mark.broker
def test_publishes_refused_for_a_vanished_publisher_are_sent_again(modern, stream_name):
    """What the producer sent for a publisher the broker had dropped comes
    back refused, 'publisher does not exist' (0x12): nothing of it was
    written, so the producer declares its publisher again and sends it
    again instead of failing it (the leader moved under it, as in
    tests/test_partitions.py)."""
    modern.create_stream(stream_name)
    try:
        with modern.producer(stream_name, name="vanishing") as p:
            assert p.send_batch([b"a", b"b"]).result(10) == 2
            _drop_publisher(p)
            assert p.send_batch([b"c", b"d"]).result(30) == 4
            assert p.send_batch([b"e"]).result(10) == 5
        table = read_all(modern, stream_name, 5)
        assert table.column("body").to_pylist() == [b"a", b"b", b"c", b"d", b"e"]
    finally:
        modern.delete_stream(stream_name)


@pytest.mark.broker
def test_a_loss_while_recovering_makes_the_recovery_go_round_again(
        modern, stream_name, monkeypatch):
    """A metadata update that arrives while the producer recovers from the
    last one (the leader moved twice in a row, as after a partition heals)
    is not dropped: the publisher the recovery declared is gone, so it
    declares another before it ends."""
    modern.create_stream(stream_name)
    try:
        with modern.producer(stream_name, name="twice") as p:
            assert p.send_batch([b"a"]).result(10) == 1
            declared = []
            connect = p._link.connect

            def connect_then_lose_it() -> None:
                connect()
                declared.append(p._link.publisher_id)
                if len(declared) == 1:
                    _drop_publisher(p)
                    p._link.on_metadata_update(0x06)

            monkeypatch.setattr(p._link, "connect", connect_then_lose_it)
            p._link.on_metadata_update(0x06)  # as the broker's MetadataUpdate does
            wait_until(lambda: not p._link.recovering and len(declared) >= 2, 30)
            assert len(declared) == 2 and not p._link.recovering
            assert p.send_batch([b"b"]).result(10) == 2
        table = read_all(modern, stream_name, 2)
        assert table.column("body").to_pylist() == [b"a", b"b"]
    finally:
        modern.delete_stream(stream_name)
