"""A real pystream consumer against a peer that sends hostile bytes
(``hostile_server.py``): each fault gets its typed error or documented
policy, nothing hangs, memory stays bounded, and the records before the
fault reach the application."""

from __future__ import annotations

import gzip
import resource
import struct
import time

import pyarrow as pa
import pytest

import pystream
from pystream import protocol as P
from pystream._core import encode_publish

from . import golden
from .hostile_server import HostileServer, records_chunk

GOOD = 1000  # records served before the fault, in two chunks


def serve_good(conn, sub) -> None:
    for first in (0, GOOD // 2):
        conn.sendall(golden.deliver(records_chunk(first, GOOD // 2),
                                    subscription_id=sub.subscription_id))


def consume(uri: str, *, deadline: float = 30.0, **options):
    """Offsets received, and the error that ended the consumer (None if it
    went quiet instead); fails if it takes longer than ``deadline``."""
    offsets: list[int] = []
    started = time.monotonic()
    error = None
    with pystream.connect(uri) as client:
        with client.consumer("s", offset="first", recovery_timeout=1.0,
                             **options) as consumer:
            try:
                for batch in consumer.batches(timeout=10.0):
                    offsets += batch.column("offset").to_pylist()
            except pystream.StreamError as exc:
                error = exc
    assert time.monotonic() - started < deadline, "the consumer hung"
    return offsets, error


def after_good(extra: bytes):
    def fault(conn, sub, n):
        serve_good(conn, sub)
        conn.sendall(extra)
    return fault


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def bomb(codec_data: bytes, plain_size: int, announced: int | None = None) -> bytes:
    """A chunk of one gzip sub-batch whose records expand to ``plain_size``."""
    entry = (bytes([0x80 | 1 << 4])
             + struct.pack(">HII", 1, plain_size if announced is None else announced,
                           len(codec_data)) + codec_data)
    return golden.chunk([entry], num_records=1, first_offset=GOOD)


def zeros_record(size: int) -> bytes:
    return gzip.compress(golden.simple_entry(b"\0" * size), compresslevel=1)


def zstd_bomb(records: int, size: int) -> bytes:
    """A chunk of one zstd sub-batch of ``records`` zero bodies of ``size``
    bytes, as pystream's own encoder compresses it (unbounded by frame_max);
    the entry follows the Publish frame's header and publishing id."""
    frames, _ = encode_publish(0, 1, pa.array([bytes(size)] * records),
                               compression="zstd", sub_batch_size=records,
                               max_frame_size=0)
    entry = bytes(frames)[4 + 2 + 2 + 1 + 4 + 8:]
    return golden.chunk([entry], num_records=records, first_offset=GOOD)


@pytest.mark.parametrize("extra, error", [
    # a chunk whose CRC is wrong
    (golden.deliver(golden.chunk([golden.simple_entry(golden.amqp_data(b"y"))],
                                 first_offset=GOOD, crc=1)), pystream.CorruptChunk),
    # a gzip sub-batch of 100 MB of zeros (100 kB on the wire), honestly announced
    (golden.deliver(bomb(zeros_record(100 << 20), (100 << 20) + 4)),
     pystream.DecompressionLimit),
    # a zstd sub-batch of 100 MiB of zeros (about 4 kB on the wire)
    (golden.deliver(zstd_bomb(100, 1 << 20)), pystream.DecompressionLimit),
    # the gzip bomb announcing 1 kB: decompression stops at what was announced
    (golden.deliver(bomb(zeros_record(100 << 20), (100 << 20) + 4, announced=1000)),
     pystream.CorruptChunk),
    # a frame other than Deliver above frame_max (1 MiB)
    (frame(struct.pack(">HH", P.MetadataUpdate.KEY, 1) + b"\0" * (2 << 20)),
     pystream.FrameTooLarge),
    # an unknown command key
    (frame(struct.pack(">HH", 0x0077, 1) + b"\0" * 8), pystream.ProtocolError),
])
def test_fault_after_good_chunks(extra, error):
    with HostileServer(after_good(extra)) as server:
        offsets, raised = consume(server.uri)
    assert offsets == list(range(GOOD))
    assert isinstance(raised, error), raised


@pytest.mark.parametrize("extra, error", [
    (b"\xff\xff\xff\xff" + b"\0" * 64, pystream.FrameTooLarge),
    (frame(struct.pack(">HH", 0x0077, 1) + b"\0" * 8), pystream.ProtocolError),
])
def test_fault_before_the_clients_credit(extra, error):
    """A delivery on the Subscribe's initial credit, then the fault, in the
    subscribe answer's segment, so before the client's first Credit: the
    consumer is made, and its reader gets the records, then the error."""
    def fault(conn, sub, n):
        conn.sendall(golden.deliver(records_chunk(0, 10),
                                    subscription_id=sub.subscription_id) + extra)

    with HostileServer(fault, eager=True) as server:
        offsets, raised = consume(server.uri)
    assert offsets == list(range(10))
    assert isinstance(raised, error), raised


def test_size_prefix_of_4_gib_allocates_nothing():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with HostileServer(after_good(b"\xff\xff\xff\xff" + b"\0" * 64)) as server:
        offsets, raised = consume(server.uri)
    assert offsets == list(range(GOOD))
    assert isinstance(raised, pystream.FrameTooLarge)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64


def test_deliver_for_an_unknown_subscription_is_ignored():
    def fault(conn, sub, n):
        serve_good(conn, sub)
        conn.sendall(golden.deliver(records_chunk(GOOD, 10),
                                    subscription_id=sub.subscription_id + 7))
        conn.sendall(golden.deliver(records_chunk(GOOD, 10),
                                    subscription_id=sub.subscription_id))

    with HostileServer(fault) as server:
        offsets, raised = consume(server.uri)
    assert offsets == list(range(GOOD + 10)) and raised is None


def test_frame_cut_then_closed_recovers_without_loss_or_repeat():
    def fault(conn, sub, n):
        if n == 1:
            serve_good(conn, sub)
            cut = golden.deliver(records_chunk(GOOD, 500))
            conn.sendall(cut[:len(cut) // 2])
            conn.shutdown(2)
            return
        # The consumer comes back at the record after the last one it handed
        # over; whole frames read before the cut may not have been.
        start = sub.offset.value
        conn.sendall(golden.deliver(records_chunk(start, GOOD + GOOD // 2 - start),
                                    subscription_id=sub.subscription_id))

    with HostileServer(fault) as server:
        offsets, raised = consume(server.uri)
    assert offsets == list(range(GOOD + GOOD // 2)) and raised is None


def test_silent_server_is_lost_after_two_heartbeats():
    server = HostileServer(lambda conn, sub, n: (serve_good(conn, sub),
                                                 server.close()), heartbeat=1)
    started = time.monotonic()
    offsets, raised = consume(server.uri)
    assert offsets == list(range(GOOD))
    assert isinstance(raised, pystream.ConnectionLost)
    assert time.monotonic() - started < 10


def test_a_frame_trickling_in_is_not_silence():
    """A chunk arriving slower than a read's slice per two heartbeat
    intervals (a slow link, a congested path) keeps the connection: that
    bytes arrive is the kernel's to say, not the last read's end."""
    def fault(conn, sub, n):
        serve_good(conn, sub)
        slow = golden.deliver(records_chunk(GOOD, 1500, body=b"t" * 1000),
                              subscription_id=sub.subscription_id)
        step = len(slow) // 40  # some 1.5 MB over 4 s: 1 MiB takes 2.8 s
        for i in range(0, len(slow), step):
            conn.sendall(slow[i:i + step])
            time.sleep(0.1)
        server.close()

    server = HostileServer(fault, heartbeat=1, frame_max=4 << 20)
    offsets, raised = consume(server.uri, deadline=20.0)
    assert offsets == list(range(GOOD + 1500))
    assert isinstance(raised, pystream.ConnectionLost)  # only once it is over


def test_frame_max_0_keeps_the_deliver_size_limit():
    """frame_max=0 on both sides lifts the negotiated limit only: a Deliver
    size prefix of 4 GiB still fails on max_deliver_size, before the reader
    makes room for it."""
    deliver_head = struct.pack(">IHH", 0xFFFFFFF0, P.Deliver.KEY, 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    offsets: list[int] = []
    with HostileServer(after_good(deliver_head + b"\0" * 64), frame_max=0) as server:
        with pystream.connect(server.uri, frame_max=0) as client:
            assert client.connection.frame_max == 0
            with client.consumer("s", offset="first",
                                 recovery_timeout=1.0) as consumer:
                with pytest.raises(pystream.FrameTooLarge, match="max_deliver_size"):
                    for batch in consumer.batches(timeout=10.0):
                        offsets += batch.column("offset").to_pylist()
    assert offsets == list(range(GOOD))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64


def test_frame_max_0_bounds_frames_before_tune():
    """Before the broker's Tune, a client asking for frame_max=0 reads with
    max_deliver_size as its bound, not none."""
    from pystream.connection import Connection
    from pystream.uri import parse_uri
    conn = Connection(parse_uri("rabbitmq-stream://127.0.0.1:1"), frame_max=0,
                      max_deliver_size=1 << 20)
    reader = conn._reader
    reader.feed(struct.pack(">IHH", 0xFFFFFFF0, P.PeerPropertiesResponse.KEY, 1))
    assert len(reader.writable()) < 2 << 20
