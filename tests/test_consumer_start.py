"""A consumer started at ``"next"`` or ``"last"`` whose connection breaks
before its first chunk: it starts again where it first started, not at a
later ``"next"``, so records stored while it was away are read (RabbitMQ
4.3+, which resolves the start to an offset; older brokers cannot)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

import pystream

from .conftest import LATEST_URI, LEGACY_URI
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


def test_a_next_start_broken_before_its_first_chunk_reads_what_came_meanwhile(
        latest, stream_name, monkeypatch):
    latest.create_stream(stream_name)
    try:
        publish(latest, stream_name, [amqp_message(b"old%d" % i) for i in range(3)])
        reader = pystream.connect(LATEST_URI)
        gate = gate_resubscribing(reader, monkeypatch)
        with reader, reader.consumer(stream_name, offset="next",
                                     recovery_timeout=30) as consumer:
            assert consumer.read(1, timeout=0.5).num_rows == 0
            conn = consumer._subs[stream_name].connection
            gate.clear()
            conn._sock.shutdown(socket.SHUT_RDWR)
            wait_until(lambda: not conn.is_open, 10)
            # Stored while the consumer is away, before it subscribes again.
            wait_until(lambda: gate.held, 10)  # type: ignore[attr-defined]
            publish(latest, stream_name, [amqp_message(b"new%d" % i) for i in range(5)])
            gate.set()
            table = consumer.read(5, timeout=20)
        assert table.column("offset").to_pylist() == [3, 4, 5, 6, 7]
        assert table.column("body").to_pylist() == [b"new%d" % i for i in range(5)]
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
