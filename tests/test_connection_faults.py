"""Malformed bytes from a peer end the connection with a typed error, never
a hang. The peer here is a socket on loopback that answers garbage: a unit
test of the frame dispatch, not a stand-in broker (those tests use the real
brokers)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

import pystream
from pystream import protocol as P


def serve_once(reply: bytes) -> int:
    """Accept one connection, read the first frame, send ``reply``, keep the
    socket open a while; returns the port."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def run():
        with server:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)
                time.sleep(3)

    threading.Thread(target=run, daemon=True).start()
    return port


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("reply, error", [
    (frame(b"\x80"), pystream.TruncatedFrame),                 # no key
    (frame(b"\x00\x77\x00\x01"), pystream.ProtocolError),     # unknown key
    (frame(bytes.fromhex("8011 0001 00000001 0001 7fffffff")),
     pystream.TruncatedFrame),                                 # lying count
    (struct.pack(">I", 1 << 31) + b"\0" * 8, pystream.FrameTooLarge),
    (frame(bytes.fromhex("0016 0001 00000001 0001") + b"\x00"),
     pystream.TruncatedFrame),                                 # cut Close
])
def test_malformed_first_answer(reply, error):
    port = serve_once(reply)
    started = time.monotonic()
    with pytest.raises(error):
        pystream.connect(f"rabbitmq-stream://127.0.0.1:{port}/",
                         connect_timeout=5)
    assert time.monotonic() - started < 2


def test_peer_that_closes_mid_frame():
    port = serve_once(struct.pack(">I", 100) + b"\x80\x11")
    with pytest.raises(pystream.ConnectionLost, match="closed the socket"):
        pystream.connect(f"rabbitmq-stream://127.0.0.1:{port}/",
                         connect_timeout=5)


def test_silent_peer_times_out():
    port = serve_once(b"")
    with pytest.raises(pystream.RequestTimeout, match="peer properties"):
        pystream.connect(f"rabbitmq-stream://127.0.0.1:{port}/",
                         connect_timeout=0.5)


def test_error_code_in_an_answer():
    body = P.encode(P.Heartbeat()) + P.encode(P.PeerPropertiesResponse(1, 0x0D, {}))
    port = serve_once(body)
    with pytest.raises(pystream.UnknownFrame, match="peer properties"):
        pystream.connect(f"rabbitmq-stream://127.0.0.1:{port}/",
                         connect_timeout=5)
