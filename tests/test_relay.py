"""The delay relay of the distance benchmark (bench/relay): a round trip
through it takes the round-trip time it was given, and the bytes arrive as
they left (a consume through it, with jitter, equals the direct one)."""

from __future__ import annotations

import socket
import statistics
import struct
import time

import pyarrow as pa
import pytest

import pystream
from bench.relay.delay import DelayRelay

from . import brokers
from .conftest import MODERN_URI

pytestmark = pytest.mark.broker

BROKER = (brokers.MODERN.advertised, brokers.MODERN.stream)
PEER_PROPERTIES = 0x0011


def peer_properties_round_trip(host: str, port: int) -> float:
    """Seconds from a PeerProperties request to the broker's response, on a
    fresh connection (the frame goes out in one write)."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = struct.pack(">HHIi", PEER_PROPERTIES, 1, 7, 0)
        t0 = time.perf_counter()
        sock.sendall(struct.pack(">I", len(body)) + body)
        head = b""
        while len(head) < 12:
            part = sock.recv(12 - len(head))
            assert part, "the broker closed the connection"
            head += part
        elapsed = time.perf_counter() - t0
    _size, key, _version, correlation = struct.unpack(">IHHI", head)
    assert key == 0x8000 | PEER_PROPERTIES and correlation == 7
    return elapsed


@pytest.mark.parametrize("rtt_ms", [5, 20])
def test_a_round_trip_takes_the_configured_time(rtt_ms):
    direct = statistics.median(peer_properties_round_trip(*BROKER) for _ in range(5))
    with DelayRelay(*BROKER, rtt_ms=rtt_ms) as relay:
        times = [peer_properties_round_trip(relay.host, relay.port) for _ in range(5)]
        stats = relay.stats()
    # Never early: each way holds the bytes for half the round trip.
    assert min(times) >= rtt_ms / 1000
    added = statistics.median(times) - direct
    # Late by at most 8 ms: the relay itself adds tens of microseconds, the
    # rest is the shared machine's scheduling (its load reaches 20).
    assert rtt_ms / 1000 - 0.001 <= added <= rtt_ms / 1000 + 0.008, times
    assert stats["accepted"] == 5 and stats["bytes_up"] == 5 * 16


def test_bytes_pass_intact_with_jitter(modern, modern_stream):
    n = 20_000
    bodies = [i.to_bytes(8, "big") * (1 + i % 50) for i in range(n)]
    with modern.producer(modern_stream) as producer:
        for start in range(0, n, 5000):
            producer.send_batch(bodies[start:start + 5000])
        producer.flush(30)
    with modern.consumer(modern_stream, offset="first") as consumer:
        direct = consumer.read(n, timeout=30)
    assert direct.num_rows == n
    with DelayRelay(*BROKER, rtt_ms=4, jitter_ms=1.5, seed=3) as relay:
        with pystream.connect(relay.uri(MODERN_URI),
                              address_resolver=relay.resolver) as client:
            # Small credit: many round trips, each delayed differently.
            with client.consumer(modern_stream, offset="first",
                                 credit=pystream.Credit.on_arrival(2)) as consumer:
                relayed = consumer.read(n, timeout=60)
    stats = relay.final_stats
    assert relayed.num_rows == n
    assert relayed.equals(direct)
    assert relayed.column("body").to_pylist() == bodies
    # Every connection (the client's and its consumer's) went through it.
    assert stats["accepted"] == 2
    assert stats["bytes_down"] > sum(map(len, bodies))


def test_a_bandwidth_cap_holds(modern, modern_stream):
    n, size, rate = 2000, 1000, 2_000_000
    with modern.producer(modern_stream) as producer:
        producer.send_batch([bytes(size)] * n)
        producer.flush(30)
    with DelayRelay(*BROKER, rate=rate) as relay:
        with pystream.connect(relay.uri(MODERN_URI),
                              address_resolver=relay.resolver) as client:
            with client.consumer(modern_stream, offset="first") as consumer:
                t0 = time.perf_counter()
                table = consumer.read(n, timeout=30)
                elapsed = time.perf_counter() - t0
        down = relay.stats()["bytes_down"]
    assert table.num_rows == n
    assert elapsed >= n * size / rate * 0.9
    assert isinstance(table, pa.Table) and down > n * size
