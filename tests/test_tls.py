"""TLS against the modern broker's stream TLS listener (5551), which
scripts/broker opens when the CA and certificates of tests/certificates.py
are in the node's state folder: server certificate and host-name
verification, SASL PLAIN and EXTERNAL (client certificate), and the extra
connections producers and consumers open, all over TLS."""

from __future__ import annotations

import pathlib
import secrets
import ssl
import threading
import time
import uuid

import pytest

import pystream
from pystream import (
    AuthenticationFailure,
    CertificateVerificationError,
    Endpoint,
    SaslMechanismNotSupported,
)
from pystream.connection import Connection

from . import brokers
from .conftest import EXTERNAL_URI, TLS_PORT, TLS_URI, broker_connections

pytestmark = pytest.mark.broker


def ca_context(folder: pathlib.Path, ca: str = "ca.pem") -> ssl.SSLContext:
    return ssl.create_default_context(cafile=folder / ca)


def client_cert_context(folder: pathlib.Path) -> ssl.SSLContext:
    context = ca_context(folder)
    context.load_cert_chain(folder / "client.pem", folder / "client.key")
    return context


def round_trip(client: pystream.Client, stream: str, n: int = 100) -> None:
    """Publish ``n`` messages and read them back."""
    bodies = [b"tls %d" % i for i in range(n)]
    with client.producer(stream) as producer:
        assert producer.send_batch(bodies).result(30) == n
    with client.consumer(stream, offset="first") as consumer:
        assert consumer.read(n, timeout=15).column("body").to_pylist() == bodies


def test_round_trip_over_tls(tls_dir, stream_name):
    """PLAIN over TLS with the test CA: publish and consume back; every
    connection (the client's and those its producer and consumer open to the
    node metadata names) is TLS on 5551."""
    name = f"pystream-tls-{uuid.uuid4().hex[:8]}"
    with pystream.connect(TLS_URI, ssl_context=ca_context(tls_dir),
                          connection_name=name) as client:
        sock = client.connection._sock
        assert isinstance(sock, ssl.SSLSocket)
        assert sock.version() in ("TLSv1.2", "TLSv1.3")
        client.create_stream(stream_name)
        try:
            assert client.locate(stream_name) == Endpoint("localhost", TLS_PORT)
            bodies = [b"tls %d" % i for i in range(100)]
            with client.producer(stream_name) as producer, \
                    client.consumer(stream_name, offset="first") as consumer:
                assert producer.send_batch(bodies).result(30) == 100
                read = consumer.read(100, timeout=15)
                seen = broker_connections(name)
            assert read.column("body").to_pylist() == bodies
            assert len(seen) >= 2  # the client's, and the pool's to the leader
            assert all(c["ssl"] and c["port"] == TLS_PORT and c["user"] == "guest"
                       for c in seen), seen
        finally:
            client.delete_stream(stream_name)


def test_system_cas_reject_the_test_ca(tls_dir):
    """No ssl_context: the system's CAs, which do not know the test CA."""
    with pytest.raises(CertificateVerificationError) as raised:
        pystream.connect(TLS_URI)
    message = str(raised.value)
    assert message.startswith(f"TLS handshake with rabbitmq-stream+tls://"
                              f"guest@localhost:{TLS_PORT}/ failed: the "
                              f"broker's certificate did not verify: ")
    assert "self-signed certificate in certificate chain" in message
    assert "ssl_context=" in message
    assert raised.value.untrusted
    assert raised.value.reason == "self-signed certificate in certificate chain"
    assert isinstance(raised.value.__cause__, ssl.SSLCertVerificationError)


def test_wrong_ca_is_rejected(tls_dir):
    with pytest.raises(CertificateVerificationError,
                       match="certificate did not verify: self-signed"):
        pystream.connect(TLS_URI, ssl_context=ca_context(tls_dir, "wrong-ca.pem"))


def test_host_name_mismatch_is_rejected(tls_dir):
    """The server certificate names localhost only, not 127.0.0.1."""
    with pytest.raises(CertificateVerificationError) as raised:
        pystream.connect(TLS_URI.replace("localhost", "127.0.0.1"),
                         ssl_context=ca_context(tls_dir))
    assert str(raised.value) == (
        f"TLS handshake with rabbitmq-stream+tls://guest@127.0.0.1:{TLS_PORT}/ "
        f"failed: the broker's certificate did not verify: IP address "
        f"mismatch, certificate is not valid for '127.0.0.1' (connect with a "
        f"host name the certificate lists)")
    assert not raised.value.untrusted


def test_ssl_context_needs_a_tls_uri(tls_dir):
    with pytest.raises(ValueError, match="needs a rabbitmq-stream\\+tls:// URI"):
        pystream.connect(TLS_URI.replace("+tls", ""), ssl_context=ca_context(tls_dir))


def test_plain_uri_to_the_tls_port_says_so(tls_dir):
    with pytest.raises(pystream.ProtocolError, match="answered with TLS: use a "
                       "rabbitmq-stream\\+tls:// URI"):
        pystream.connect(TLS_URI.replace("+tls", ""), connect_timeout=5)


def test_certificate_failure_is_not_retried(tls_dir, stream_name):
    """A node metadata names but the certificate does not (here dialled as
    127.0.0.1): the consumer fails at once instead of retrying for its
    recovery timeout."""
    context = ca_context(tls_dir)
    with pystream.connect(TLS_URI, ssl_context=context,
                          address_resolver=lambda e: Endpoint("127.0.0.1", e.port)
                          ) as client:
        client.create_stream(stream_name)
        try:
            started = time.monotonic()
            with pytest.raises(CertificateVerificationError):
                client.consumer(stream_name, recovery_timeout=120)
            with pytest.raises(CertificateVerificationError):
                client.producer(stream_name, recovery_timeout=120)
            assert time.monotonic() - started < 10
        finally:
            client.delete_stream(stream_name)


def test_external_authenticates_as_certificate_cn(tls_dir, cert_user,
                                                  stream_name):
    """No password anywhere: the broker logs the connection in as the
    client certificate's CN, which may then publish and consume."""
    name = f"pystream-external-{uuid.uuid4().hex[:8]}"
    with pystream.connect(EXTERNAL_URI, ssl_context=client_cert_context(tls_dir),
                          sasl_mechanism="EXTERNAL",
                          connection_name=name) as client:
        seen = broker_connections(name)
        assert [(c["user"], c["ssl"]) for c in seen] == [(cert_user, True)]
        client.create_stream(stream_name)
        try:
            round_trip(client, stream_name)
        finally:
            client.delete_stream(stream_name)


def test_external_without_client_certificate_fails(tls_dir):
    with pytest.raises(AuthenticationFailure) as raised:
        pystream.connect(EXTERNAL_URI, ssl_context=ca_context(tls_dir),
                         sasl_mechanism="EXTERNAL")
    assert str(raised.value) == (
        "authenticate with EXTERNAL as the TLS client certificate's name (was "
        "one loaded in ssl_context?): AuthenticationFailure (response code "
        "0x08)")


def test_external_is_not_offered_without_tls(tls_dir):
    with pytest.raises(SaslMechanismNotSupported, match="EXTERNAL is not offered"):
        pystream.connect(brokers.MODERN.uri(""),
                         sasl_mechanism="EXTERNAL")


def test_plain_with_a_client_certificate_uses_the_uri_user(tls_dir):
    """A client certificate alone does not change who PLAIN logs in as."""
    name = f"pystream-plain-cert-{uuid.uuid4().hex[:8]}"
    with pystream.connect(TLS_URI, ssl_context=client_cert_context(tls_dir),
                          connection_name=name):
        assert [c["user"] for c in broker_connections(name)] == ["guest"]


def test_wrong_password_over_tls(tls_dir):
    password = f"not-the-password-{secrets.token_hex(4)}"
    with pytest.raises(AuthenticationFailure) as raised:
        pystream.connect(TLS_URI.replace("guest@", f"{password}@"),
                         ssl_context=ca_context(tls_dir))
    assert str(raised.value) == ("authenticate user 'guest' with PLAIN: "
                                 "AuthenticationFailure (response code 0x08)")
    assert password not in repr(raised.value)


def test_closed_connection_never_reads_the_next_ones_handshake(tls_dir):
    """Dropping a connection while its reader waits in recv (as a failed
    send or a missed heartbeat does), then opening the next one at once: the
    new socket often gets the same descriptor number. The reader closes its
    own socket, so no stale reader takes the new handshake's bytes (before,
    about 1 in 20 handshakes here failed with WRONG_VERSION_NUMBER)."""
    context = ca_context(tls_dir)
    address = pystream.parse_uri(TLS_URI)
    for _ in range(100):
        old = Connection(address, ssl_context=context)
        old.open()
        new = Connection(address, ssl_context=context)
        old._fail(None)
        new.open()
        new.close()


def test_no_two_threads_are_ever_inside_one_connections_tls_layer(
        tls_dir, stream_name, monkeypatch):
    """OpenSSL allows one thread at a time in an SSL object: an SSL_read
    in the reader thread beside an SSL_write in a sender may corrupt its
    state (and crash the process), and the ssl module takes no lock. With
    a producer and a consumer on TLS connections, each connection read by
    its reader thread (confirms, deliveries) while senders write (publish,
    credit, heartbeats), no call into an SSLSocket runs while another
    thread's call into the same one does; and every record comes back.
    (Before, the reader thread waited inside recv_into while senders
    wrote: thousands of overlaps a run.)"""
    guard = threading.Lock()
    inside: dict[int, dict[int, int]] = {}  # socket -> thread -> depth
    overlaps: list[str] = []

    def tracked(method):
        def call(self, *args, **kwargs):
            me = threading.get_ident()
            with guard:
                threads = inside.setdefault(id(self), {})
                if any(depth for t, depth in threads.items() if t != me):
                    overlaps.append(method.__name__)
                threads[me] = threads.get(me, 0) + 1
            try:
                return method(self, *args, **kwargs)
            finally:
                with guard:
                    inside[id(self)][me] -= 1
        return call

    for name in ("recv_into", "recv", "read", "send", "sendall", "write"):
        monkeypatch.setattr(ssl.SSLSocket, name, tracked(getattr(ssl.SSLSocket, name)))
    batches, size = 200, 500
    with pystream.connect(TLS_URI, ssl_context=ca_context(tls_dir)) as client:
        client.create_stream(stream_name)
        try:
            with client.producer(stream_name) as producer, \
                    client.consumer(stream_name, offset="first") as consumer:
                sends = [producer.send_batch([b"%d-%d" % (i, j) for j in range(size)])
                         for i in range(batches)]
                read = consumer.read(batches * size, timeout=60)
                assert [s.result(30) for s in sends][-1] == batches * size  # the last id
            assert read.num_rows == batches * size
            assert read.column("offset").to_pylist() == list(range(batches * size))
        finally:
            client.delete_stream(stream_name)
    assert not overlaps, f"{len(overlaps)} calls overlapped another thread's: {overlaps[:5]}"
