#!/usr/bin/env python3
"""atheris harness of the Python side of frame handling: whatever bytes a
peer sends, the connection's frame dispatch (the C frame reader, then
``protocol.decode`` and the handlers) raises a ``StreamError`` or nothing,
never another exception.

The same bytes, read as the broker's size-prefixed frames, also answer a
connection's handshake (peer properties, SASL, Tune, Open, command
versions): each request the client sends is answered by the frames up to
the next response, its correlation id set to the request's so that the
fuzzer reaches every step. The handshake must open or raise a
``StreamError``, and what it negotiated must hold together.

    PATH=.venv/bin:$PATH fuzz/dispatch.py -max_total_time=60 CORPUS_DIR

(run as a program: libFuzzer's -merge=1 starts it again by its path)
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from pystream import protocol as P
    from pystream.connection import Connection
    from pystream.errors import StreamError
    from pystream.handshake import Negotiated, handshake
    from pystream.uri import parse_uri

ADDRESS = parse_uri("rabbitmq-stream://fuzz/")


class Sink:
    """A subscription that takes whatever it is given."""

    def __init__(self) -> None:
        self.stream = "fuzz"

    def admit(self, chunk) -> bool:
        return True

    def on_chunks(self, chunks) -> None:
        for chunk in chunks:
            chunk.batch.validate(full=True)

    def on_chunk_error(self, error) -> None:
        pass

    def on_consumer_update(self, correlation_id, active) -> None:
        pass

    def on_metadata_update(self, code) -> None:
        pass

    def on_connection_closed(self, error) -> None:
        pass


def broker_frames(data: bytes) -> list[bytes]:
    """The size-prefixed frames of ``data`` (the last one cut short if the
    bytes end early)."""
    frames, pos = [], 0
    while pos + 4 <= len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        frames.append(data[pos:pos + 4 + n])
        pos += 4 + n
    return frames


def fuzz_handshake(data: bytes) -> None:
    frames = broker_frames(data)
    connection = Connection(ADDRESS, frame_max=1 << 16, max_deliver_size=1 << 20)
    reader = connection._reader

    def answer(frame: bytes | bytearray) -> None:
        """The broker's side: the next frames, up to and including a
        response, that one under the request's correlation id (the
        client's own answers, such as TuneResponse, get none)."""
        if len(frame) < 12 or frame[4] & 0x80:
            return
        corr = bytes(frame[8:12])
        while frames:
            reply = bytearray(frames.pop(0))
            response = len(reply) >= 12 and reply[4] & 0x80
            if response:
                reply[8:12] = corr
            reader.feed(bytes(reply))
            connection._drain()
            if response:
                return

    connection.send_bytes = answer  # type: ignore[method-assign]
    tuned = []
    try:
        out = handshake(connection, ADDRESS, connection._tune, sasl_mechanism="PLAIN",
                        connection_name="fuzz", frame_max=1 << 20, heartbeat=60,
                        timeout=0, on_tuned=tuned.append)
    except StreamError:
        return
    assert isinstance(out, Negotiated)
    assert tuned == [out.frame_max]
    assert 0 <= out.frame_max <= 1 << 20 and out.frame_max != 0
    assert 0 <= out.heartbeat <= 0xFFFFFFFF


def test_one_input(data: bytes) -> None:
    fuzz_handshake(data)
    # Every frame also goes through the generic decoder directly.
    try:
        P.decode(data[4:])
    except StreamError:
        pass
    connection = Connection(ADDRESS, frame_max=1 << 16, max_deliver_size=1 << 20)
    connection.send_bytes = lambda frame: None  # answers go nowhere
    connection.add_subscription(Sink())
    reader = connection._reader
    try:
        # Fed in two pieces, so frames also straddle reads.
        cut = len(data) // 2
        for piece in (data[:cut], data[cut:]):
            reader.feed(piece)
            connection._drain()
    except StreamError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
