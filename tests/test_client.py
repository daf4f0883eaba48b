"""The protocol client against the two real brokers."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest

import pystream
from pystream import protocol as P
from pystream.features import FIRST_RELEASE
from pystream.uri import DEFAULT_PORT, parse_uri

from .conftest import BROKERS, MODERN_URI, broker_ctl, broker_user, run_broker
from .waiting import wait_until

EXPECTED_VERSION = {"modern": "4.0.", "legacy": "3.10.", "latest": "4.3."}


@pytest.mark.broker
def test_handshake(client, broker):
    props = client.server_properties
    assert props["product"] == "RabbitMQ"
    assert props["version"].startswith(EXPECTED_VERSION[broker])
    conn = client.connection
    assert conn.frame_max == 1 << 20
    assert conn.heartbeat == 60
    assert conn.connection_properties["advertised_port"] == str(
        parse_uri(BROKERS[broker]).port)
    assert "guest:guest" not in repr(client)


@pytest.mark.broker
def test_tune_takes_the_minimum(uri):
    with pystream.connect(uri, frame_max=65536, heartbeat=5) as c:
        assert (c.connection.frame_max, c.connection.heartbeat) == (65536, 5)
    with pystream.connect(uri, frame_max=0, heartbeat=0) as c:
        # 0 is "no limit" on our side: the broker's proposal stands.
        assert c.connection.frame_max == 1 << 20
        assert c.connection.heartbeat == 60


@pytest.mark.broker
def test_command_versions_only_on_new_brokers(client, broker):
    if broker == "legacy":
        assert client.connection.command_versions == {}
    else:
        assert client.connection.command_versions[P.Publish.KEY][1] >= 2


@pytest.mark.broker
def test_stream_lifecycle(client, stream_name):
    client.create_stream(stream_name, max_length_bytes=10_000_000,
                         max_age="1h", stream_max_segment_size_bytes=1_000_000)
    assert client.stream_exists(stream_name)
    with pytest.raises(pystream.StreamAlreadyExists) as info:
        client.create_stream(stream_name, max_length_bytes=10_000_000,
                             max_age="1h", stream_max_segment_size_bytes=1_000_000)
    assert info.value.code == 0x05
    client.create_stream(stream_name, exist_ok=True, max_length_bytes=10_000_000,
                         max_age="1h", stream_max_segment_size_bytes=1_000_000)
    info = client.metadata(stream_name, "no-such-stream")
    assert info[stream_name].leader.port == client.connection.address.port
    assert info[stream_name].error is None
    assert isinstance(info["no-such-stream"].error, pystream.StreamDoesNotExist)
    client.delete_stream(stream_name)
    assert not client.stream_exists(stream_name)
    with pytest.raises(pystream.StreamDoesNotExist):
        client.delete_stream(stream_name)
    client.delete_stream(stream_name, missing_ok=True)


@pytest.mark.broker
def test_precondition_failed_on_different_arguments(modern, stream_name):
    modern.create_stream(stream_name, max_age="1h")
    try:
        with pytest.raises(pystream.PreconditionFailed):
            modern.create_stream(stream_name, max_age="2h")
    finally:
        modern.delete_stream(stream_name)


@pytest.mark.broker
def test_stream_stats(modern, stream_name):
    modern.create_stream(stream_name)
    try:
        stats = modern.stream_stats(stream_name)
        assert stats["first_chunk_id"] == -1  # empty stream
        assert "committed_chunk_id" in stats
        with pytest.raises(pystream.StreamDoesNotExist):
            modern.stream_stats(stream_name + "-missing")
    finally:
        modern.delete_stream(stream_name)


@pytest.mark.broker
def test_stream_stats_of_4_3_add_the_committed_offset(latest, stream_name):
    """4.3 adds ``committed_offset`` (of the last committed record) to the
    chunk ids 4.0 gives; pystream passes every field through."""
    latest.create_stream(stream_name)
    try:
        with latest.producer(stream_name) as producer:
            producer.send_batch([b"x"] * 10).result(30)
        assert latest.stream_stats(stream_name) == {
            "first_chunk_id": 0, "last_chunk_id": 0, "committed_chunk_id": 0,
            "committed_offset": 9}
    finally:
        latest.delete_stream(stream_name)


@pytest.mark.broker
def test_offsets(client, stream):
    with pytest.raises(pystream.NoOffset):
        client.query_offset(stream, "reader")
    client.store_offset(stream, "reader", 0)
    # StoreOffset is not answered: poll until it shows.
    wait_until(lambda: client.query_offset(stream, "reader") == 0, 5,
               ignore=(pystream.NoOffset,))


@pytest.mark.broker
def test_publisher_sequence(client, stream):
    assert client.query_publisher_sequence(stream, "writer") == 0
    conn = client.connection
    confirmed = threading.Event()
    conn.on_frame(P.PublishConfirm.KEY, lambda frame: confirmed.set())
    conn.request(lambda c: P.DeclarePublisher(c, 1, "writer", stream), "declare")
    conn.send(P.Publish(1, (P.Message(41, b"a"), P.Message(42, b"b"))))
    assert confirmed.wait(10)
    assert client.query_publisher_sequence(stream, "writer") == 42
    conn.request(lambda c: P.DeletePublisher(c, 1), "delete publisher")


@pytest.mark.broker
def test_super_stream(modern):
    name = f"super-{uuid.uuid4().hex[:8]}"
    modern.create_super_stream(name, partitions=3)
    try:
        assert modern.partitions(name) == [f"{name}-0", f"{name}-1", f"{name}-2"]
        assert modern.route(name, "2") == [f"{name}-2"]
        assert modern.route(name, "no-such-key") == []
        with pytest.raises(pystream.StreamAlreadyExists):
            modern.create_super_stream(name, partitions=3)
    finally:
        modern.delete_super_stream(name)
    with pytest.raises(pystream.StreamDoesNotExist):
        modern.partitions(name)
    regions = f"regions-{uuid.uuid4().hex[:8]}"
    modern.create_super_stream(regions, binding_keys=["eu", "us"])
    try:
        assert modern.route(regions, "us") == [f"{regions}-us"]
    finally:
        modern.delete_super_stream(regions)


@pytest.mark.broker
def test_legacy_broker_refuses_newer_features_up_front(legacy, stream_name):
    with pytest.raises(pystream.UnsupportedFeature, match="3.11"):
        legacy.stream_stats("anything")
    with pytest.raises(pystream.UnsupportedFeature, match="3.13"):
        legacy.create_super_stream("s", partitions=2)
    with pytest.raises(pystream.UnsupportedFeature, match="3.13"):
        legacy.delete_super_stream("s")
    with pytest.raises(pystream.UnsupportedFeature, match="3.13"):
        legacy.create_stream(stream_name, filter_size=32)
    # Nothing was sent: the broker did not drop the connection.
    assert legacy.connection.is_open
    assert not legacy.stream_exists(stream_name)
    assert not legacy.supports("single_active_consumer")


@pytest.mark.broker
def test_features_by_broker(client, broker):
    """What each test broker is refused up front (pystream/features.py):
    3.10 every gated feature; 4.0 only what came with 4.3; 4.3 none."""
    refused = {f for f in FIRST_RELEASE if not client.supports(f)}
    assert refused == {"legacy": set(FIRST_RELEASE),
                       "modern": {"resolve_offset_spec"},
                       "latest": set()}[broker]
    for feature in refused:
        with pytest.raises(pystream.UnsupportedFeature, match=client.server_properties["version"]):
            client.connection.features.require(feature)


@pytest.mark.broker
def test_wrong_password(uri):
    bad = uri.replace("guest:guest@", "guest:wrong-password@")
    with pytest.raises(pystream.AuthenticationFailure) as info:
        pystream.connect(bad)
    assert info.value.code == 0x08
    assert "wrong-password" not in str(info.value)


@pytest.mark.broker
def test_password_longer_than_a_pre_open_frame(uri, broker):
    """A 10 kB password (say an OAuth2 token) makes a SaslAuthenticate frame
    over 8192 bytes: 3.10 and 4.0 check it and refuse the password; 4.3
    closes the socket unanswered (stream.initial_frame_max), which
    pystream explains."""
    long = uri.replace("guest:guest@", "guest:" + "p" * 10_000 + "@")
    if broker == "latest":
        with pytest.raises(pystream.ConnectionLost,
                           match="10026 bytes.*initial_frame_max"):
            pystream.connect(long)
    else:
        with pytest.raises(pystream.AuthenticationFailure):
            pystream.connect(long)


@pytest.mark.broker
def test_unknown_vhost(uri):
    with pytest.raises(pystream.VirtualHostAccessFailure) as info:
        pystream.connect(uri + "no-such-vhost")
    assert info.value.code == 0x0C


@pytest.mark.broker
def test_sasl_mechanism_not_offered(uri):
    with pytest.raises(pystream.SaslMechanismNotSupported):
        pystream.connect(uri, sasl_mechanism="NO-SUCH-MECHANISM")


#: The read-only user's name, this session's own (``broker_user``).
READER_USER = f"pystream-reader-{os.getpid()}"


@pytest.fixture(scope="module")
def reader_user():
    """A user that may read but not configure, on every broker."""
    with broker_user(BROKERS, READER_USER, "reader-pw", "^$", "^$", ".*"):
        yield f"{READER_USER}:reader-pw"


@pytest.mark.broker
def test_access_refused(uri, reader_user, stream_name):
    with pystream.connect(uri.replace("guest:guest", reader_user)) as c:
        with pytest.raises(pystream.AccessRefused) as info:
            c.create_stream(stream_name)
        assert info.value.code == 0x10


def test_connection_refused_is_connection_lost():
    with pytest.raises(pystream.ConnectionLost, match="cannot connect"):
        pystream.connect("rabbitmq-stream://localhost:1/", connect_timeout=2)


@pytest.mark.broker
def test_short_heartbeat_keeps_the_connection(uri):
    with pystream.connect(uri, heartbeat=1) as c:
        assert c.connection.heartbeat == 1
        time.sleep(3.5)
        assert c.connection.is_open
        assert c.connection.heartbeats_received >= 1
        assert c.stream_exists("no-such-stream") is False


@pytest.mark.broker
def test_close_by_client(client):
    conn = client.connection
    client.close()
    assert not conn.is_open
    assert conn.error is None
    with pytest.raises(pystream.ConnectionClosed):
        client.stream_exists("x")
    client.close()  # twice is fine


@pytest.mark.broker
def test_close_by_broker(broker):
    name = f"close-me-{uuid.uuid4().hex[:8]}"
    c = pystream.connect(BROKERS[broker], connection_name=name)
    lost = threading.Event()
    first = c.connection
    first.on_close(lambda error: lost.set())
    broker_ctl(broker, "close_all_connections", "test closes it")
    assert lost.wait(30)
    assert isinstance(first.error,
                      (pystream.ConnectionClosed, pystream.ConnectionLost))
    # The client reconnects on its next request.
    assert not c.stream_exists("x")
    assert c.connection is not first and c.connection.is_open
    c.close()


@pytest.mark.broker
def test_requests_from_many_threads(client):
    results = []

    def ask():
        for _ in range(20):
            results.append(client.stream_exists("no-such-stream"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [False] * 160


@pytest.mark.broker
def test_uri_defaults_reach_the_modern_broker():
    if MODERN_URI != f"rabbitmq-stream://guest:guest@localhost:{DEFAULT_PORT}/":
        pytest.skip("modern broker is not on the default address")
    with pystream.connect() as c:
        assert c.server_properties["product"] == "RabbitMQ"


@pytest.mark.slow
@pytest.mark.broker
def test_silent_broker_is_detected(broker):
    """A broker that stops answering (SIGSTOP) is declared lost after two
    heartbeat intervals; pending requests fail instead of hanging."""
    c = pystream.connect(BROKERS[broker], heartbeat=1)
    conn = c.connection
    try:
        run_broker("pause", broker)
        started = time.monotonic()
        with pytest.raises(pystream.ConnectionLost, match="two heartbeat"):
            c.stream_exists("x")
        assert time.monotonic() - started < 5
    finally:
        run_broker("resume", broker)
    assert not conn.is_open
    assert not c.stream_exists("x")  # the broker is back: the client reconnects
    c.close()


class Relay:
    """A TCP relay on loopback to a broker, closed at will: the node a
    client's URI names goes away while the broker behind it stays."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("localhost", self.target))
            self.sockets += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst),
                                 daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        dst.close()

    def close(self) -> None:
        # shutdown, not just close, wakes the threads blocked on the sockets.
        for sock in [self.listener, *self.sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@pytest.mark.broker
def test_admin_connection_moves_to_another_node_when_its_own_goes(
        modern, modern_stream):
    """The URI's node (here a relay to the modern broker) goes away: the
    client's requests go to a node its stream metadata named instead."""
    relay = Relay(parse_uri(MODERN_URI).port)
    c = pystream.connect(f"rabbitmq-stream://guest:guest@127.0.0.1:{relay.port}/")
    try:
        leader = c.metadata(modern_stream)[modern_stream].leader
        lost = threading.Event()
        c.connection.on_close(lambda error: lost.set())
        relay.close()
        assert lost.wait(10)
        assert c.stream_exists(modern_stream)
        assert leader is not None
        assert (c.connection.address.host, c.connection.address.port) == (
            leader.host, leader.port)
    finally:
        c.close()


@pytest.mark.broker
def test_a_closed_connection_goes_with_its_last_reference(uri):
    """The connection, its read side and the decoder's receive blocks are
    freed as the last reference goes, with the cycle collector off: a
    process that opens connection after connection (recoveries) does not
    hold their buffers until the next collection of cycles."""
    import gc
    import weakref

    from pystream.connection import Connection
    enabled = gc.isenabled()
    gc.disable()
    try:
        conn = Connection(parse_uri(uri))
        conn.open()
        reader_thread = conn._reader_thread
        assert reader_thread is not None
        refs = [weakref.ref(conn), weakref.ref(conn._receiver)]
        conn.close()
        reader_thread.join(10)
        assert not reader_thread.is_alive()
        del conn, reader_thread
        # The heartbeat thread, woken by the close, lets go of it as it ends.
        wait_until(lambda: [r() for r in refs] == [None, None], 10, 0.01)
    finally:
        if enabled:
            gc.enable()
