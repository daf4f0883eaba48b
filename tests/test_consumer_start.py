"""A consumer started at ``"next"`` or ``"last"`` whose connection breaks
before its first chunk: it starts again where it first started, not at a
later ``"next"``, so records stored while it was away are read (RabbitMQ
4.3+, which resolves the start to an offset; older brokers cannot): with a
filter, on a super stream, and when the broker restarts."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

import pystream
from pystream import Filter

from .conftest import LATEST_URI, LEGACY_URI, run_broker
from .publishers import amqp_message, publish
from .waiting import wait_until

pytestmark = pytest.mark.broker


def gate_resubscribing(client: pystream.Client, monkeypatch: Any) -> threading.Event:
    """An event that, while clear, holds the consumer's resubscription
    (which locates the stream first)."""
    gate = threading.Event()
    gate.set()
    held: list[str] = []
    gate.held = held  # type: ignore[attr-defined]
    admin = client._admin  # what a consumer locates its streams with
    locate = admin.locate

    def gated(stream: str, **options: Any) -> Any:
        if not gate.is_set():
            held.append(stream)
        assert gate.wait(30)
        return locate(stream, **options)

    monkeypatch.setattr(admin, "locate", gated)
    return gate


def break_before_first_chunk(consumer: Any, streams: list[str],
                             gate: threading.Event) -> None:
    """Shut the consumer's connections down under it, and wait until it
    asks to subscribe again (held by ``gate``: one stream at a time)."""
    conns = list({id(c): c for c in (consumer._subs[s].connection for s in streams)}.values())
    gate.clear()
    for conn in conns:
        conn._sock.shutdown(socket.SHUT_RDWR)
    for conn in conns:
        wait_until(lambda conn=conn: not conn.is_open, 10)
    wait_until(lambda: gate.held, 10)  # type: ignore[attr-defined]


def test_a_filtered_next_start_broken_early_reads_what_matched_meanwhile(
        latest, stream_name, monkeypatch):
    """The filter still applies from the pinned offset: the matching chunks
    stored meanwhile, once each, and nothing of the others."""
    latest.create_stream(stream_name)
    try:
        publish(latest, stream_name, [amqp_message(b"old-red")] * 3, filter_values=["red"] * 3)
        reader = pystream.connect(LATEST_URI)
        gate = gate_resubscribing(reader, monkeypatch)
        with reader, reader.consumer(stream_name, offset="next", filter=Filter(["red"]),
                                     recovery_timeout=30) as consumer:
            assert consumer.read(1, timeout=0.5).num_rows == 0
            break_before_first_chunk(consumer, [stream_name], gate)
            for i, color in enumerate(["red", "blue", "red", "blue"]):  # a chunk each
                publish(latest, stream_name, [amqp_message(b"%s%d" % (color.encode(), i))] * 4,
                        filter_values=[color] * 4)
            gate.set()
            table = consumer.read(8, timeout=20)
            more = consumer.read(1, timeout=1)
        assert table.column("body").to_pylist() == [b"red0"] * 4 + [b"red2"] * 4
        assert table.column("offset").to_pylist() == [3, 4, 5, 6, 11, 12, 13, 14]
        assert more.num_rows == 0
    finally:
        latest.delete_stream(stream_name, missing_ok=True)


def test_a_super_stream_next_start_broken_early_reads_every_partition_s_meanwhile(
        latest, stream_name, monkeypatch):
    latest.create_super_stream(stream_name, partitions=2)
    try:
        parts = latest.partitions(stream_name)
        for p in parts:
            publish(latest, p, [amqp_message(b"old")] * 2)
        reader = pystream.connect(LATEST_URI)
        gate = gate_resubscribing(reader, monkeypatch)
        with reader, reader.consumer(None, super_stream=stream_name, offset="next",
                                     recovery_timeout=30) as consumer:
            assert consumer.read(1, timeout=0.5).num_rows == 0
            break_before_first_chunk(consumer, parts, gate)
            for k, p in enumerate(parts):
                publish(latest, p, [amqp_message(b"new%d-%d" % (k, i)) for i in range(3)])
            gate.set()
            got: dict[str, list[tuple[int, bytes]]] = {p: [] for p in parts}
            rows = 0
            for batch in consumer.batches(timeout=20):
                part = batch.schema.metadata[b"stream"].decode()
                got[part] += zip(batch.column("offset").to_pylist(),
                                 batch.column("body").to_pylist(), strict=True)
                rows += batch.num_rows
                if rows >= 6:
                    break
            more = consumer.read(1, timeout=1)
        assert got == {p: [(2 + i, b"new%d-%d" % (k, i)) for i in range(3)]
                       for k, p in enumerate(parts)}
        # A partition not held by the gate asked to subscribe again only once
        # it opened, after the publishing: a "next" then would have read
        # none of its records.
        assert more.num_rows == 0
    finally:
        latest.delete_super_stream(stream_name, missing_ok=True)


def publish_once_writable(client: pystream.Client, stream: str, messages: list[bytes]) -> None:
    """``publish``, again while a restarted node refuses every message
    (publisher does not exist, 18: none stored, so none stored twice)."""
    for _ in range(40):
        try:
            publish(client, stream, messages)
            return
        except RuntimeError as exc:
            if len(messages) > 5 or str(exc).count("code=18") != len(messages):
                raise
            time.sleep(0.25)
    raise AssertionError(f"{stream} refused the publisher for 10 s")


@pytest.mark.parametrize("fault", ["close", pytest.param("restart", marks=pytest.mark.slow)])
def test_a_next_start_broken_before_its_first_chunk_reads_what_came_meanwhile(
        latest, stream_name, monkeypatch, fault):
    """The socket shut down under the consumer, or the broker restarted,
    before its first chunk: it comes back to the offset it first resolved."""
    latest.create_stream(stream_name)
    try:
        publish(latest, stream_name, [amqp_message(b"old%d" % i) for i in range(3)])
        reader = pystream.connect(LATEST_URI)
        gate = gate_resubscribing(reader, monkeypatch)
        with reader, reader.consumer(stream_name, offset="next",
                                     recovery_timeout=120) as consumer:
            assert consumer.read(1, timeout=0.5).num_rows == 0
            if fault == "close":
                break_before_first_chunk(consumer, [stream_name], gate)
            else:
                conn = consumer._subs[stream_name].connection
                gate.clear()
                run_broker("restart", "latest")
                wait_until(lambda: not conn.is_open, 30)
                wait_until(lambda: gate.held, 60)  # type: ignore[attr-defined]
            # Stored while the consumer is away, before it subscribes again.
            publish_once_writable(latest, stream_name,
                                  [amqp_message(b"new%d" % i) for i in range(5)])
            gate.set()
            table = consumer.read(5, timeout=60)
            more = consumer.read(1, timeout=1)
        assert table.column("offset").to_pylist() == [3, 4, 5, 6, 7]
        assert table.column("body").to_pylist() == [b"new%d" % i for i in range(5)]
        assert more.num_rows == 0
    finally:
        latest.delete_stream(stream_name, missing_ok=True)


def test_a_next_start_on_an_older_broker_starts_as_before(stream_name):
    """Without ResolveOffsetSpec, the start stays "next": the consumer sees
    only what is stored after it subscribed."""
    with pystream.connect(LEGACY_URI) as client:
        client.create_stream(stream_name)
        try:
            publish(client, stream_name, [amqp_message(b"old")])
            with client.consumer(stream_name, offset="next") as consumer:
                assert consumer.read(1, timeout=0.5).num_rows == 0
                assert consumer.position is None
                publish(client, stream_name, [amqp_message(b"new")])
                table = consumer.read(1, timeout=10)
            assert table.column("body").to_pylist() == [b"new"]
        finally:
            client.delete_stream(stream_name, missing_ok=True)
