"""A consumer's memory is bounded in decoded bytes, not wire bytes
(docs/reliability.md, the limits table; ``credit.py``): sub-batches that
inflate a thousandfold, read by a slow application from the real broker
or pushed by a peer that ignores credit, stay within
``max_buffered_bytes`` plus the chunk at the head of the queue. Peak RSS
is measured in a subprocess (``ru_maxrss``) against its own baseline."""

from __future__ import annotations

import json
import pathlib
import struct
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import pystream
from pystream._core import Chunk, StreamDecoder, decode, encode_publish

from . import golden
from .conftest import MODERN_URI
from .hostile_server import HostileServer

ROOT = pathlib.Path(__file__).resolve().parent.parent
MiB = 1 << 20
BUDGET = 16 * MiB        # the consumers' max_buffered_bytes here
MESSAGE = 1_000_000      # bytes of zeros a message: some 100 bytes in zstd
PER_CHUNK = 8            # messages a chunk (one publish each)
CHUNKS = 50              # 400 MB decoded in all
# What the process may grow by beyond the documented bound: the batch the
# application holds and its bodies' copies, the allocator's slack.
SLACK = 24 * MiB


def peak_growth(script: str) -> dict:
    """Run ``script`` (Python, in a fresh interpreter, at the repository's
    root) after a baseline is taken; it sets ``result``. The peak RSS
    growth past the baseline and ``result``, as JSON. The baseline is
    taken after a small read of the same kind, which loads and warms what
    any read needs (modules, Arrow's kernels, threads, receive blocks)."""
    code = (
        "import json, resource\n"
        "from tests import test_memory_bound as t\n"
        "t.read_flood(2, size=1024)\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"{script}\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'growth': (peak - base) * 1024, 'result': result}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_slowly(uri: str, stream: str, **options) -> dict:
    """Every record of ``stream``, one chunk's batch at a time, 20 ms a
    batch: how many, the longest first body of a batch, and the error
    that ended the read."""
    rows = longest = 0
    error = None
    with pystream.connect(uri) as client:
        with client.consumer(stream, offset="first", max_batch_rows=PER_CHUNK,
                             recovery_timeout=1.0,
                             credit=pystream.Credit.adaptive(BUDGET),
                             **options) as consumer:
            try:
                for batch in consumer.batches(timeout=5):
                    rows += batch.num_rows
                    if batch.num_rows:  # one body: copies would count
                        longest = max(longest, len(batch.column("body")[0].as_py()))
                    time.sleep(0.02)
            except pystream.StreamError as exc:
                error = type(exc).__name__
    return {"rows": rows, "longest": longest, "error": error}


@pytest.mark.broker
def test_compressed_backlog_stays_within_the_decoded_budget(modern, stream_name):
    """Chunks of eight zstd sub-batches of 1 MB of zeros (8 MB decoded,
    1 kB on the wire), 50 of them, read by an application slower than the
    broker: the consumer decodes a chunk only once it fits the budget
    beside what is queued, so the process grows by the budget and a chunk
    or two, not by the 400 MB in the stream."""
    modern.create_stream(stream_name)
    try:
        with modern.producer(stream_name, compression="zstd") as producer:
            for _ in range(CHUNKS):
                producer.send_batch([bytes(MESSAGE)] * PER_CHUNK).result(30)
        got = peak_growth(
            f"result = t.read_slowly({MODERN_URI!r}, {stream_name!r}, amqp=False)")
    finally:
        modern.delete_stream(stream_name)
    result = got["result"]
    assert result["error"] is None
    assert result["rows"] == CHUNKS * PER_CHUNK
    assert result["longest"] >= MESSAGE
    chunk = PER_CHUNK * MESSAGE
    assert got["growth"] < BUDGET + chunk + SLACK, got


def flood(count: int, size: int = MiB):
    """A peer that, once subscribed, sends ``count`` chunks of eight zstd
    sub-batches of ``size`` zeros (8 MiB decoded, a few hundred bytes on
    the wire each) at once, whatever credit it was given."""
    frames, _ = encode_publish(0, 1, pa.array([bytes(size)]), compression="zstd",
                               sub_batch_size=1, max_frame_size=0)
    entry = bytes(frames)[4 + 2 + 2 + 1 + 4 + 8:]

    def fault(conn, sub, n) -> None:
        conn.sendall(b"".join(
            golden.deliver(golden.chunk([entry] * PER_CHUNK, first_offset=i * PER_CHUNK),
                           subscription_id=sub.subscription_id)
            for i in range(count)))
    return fault


def read_flood(count: int, size: int = MiB) -> dict:
    with HostileServer(flood(count, size)) as server:
        return read_slowly(server.uri, "s", amqp=False)


def test_chunks_beyond_credit_are_counted_against_the_budget():
    """A peer ignoring credit pushes 100 chunks of 8 MiB decoded (800 MiB):
    those that fit the budget are taken, the first that does not ends the
    consumer with ``ProtocolError`` after the records before it, and
    nothing was queued unaccounted."""
    got = peak_growth("result = t.read_flood(100)")
    result = got["result"]
    assert result["error"] == "ProtocolError", got
    assert 0 < result["rows"] < 100 * PER_CHUNK
    assert got["growth"] < BUDGET + PER_CHUNK * MiB + SLACK, got


def test_decoded_size_is_the_same_however_the_frame_arrives():
    """The entry headers are walked as their bytes arrive (with the CRC,
    while they are in the cache) and the walk is finished once the frame
    is whole: fed in pieces down to single bytes, a frame declares the
    decoded size it declares whole, an unreadable entry included."""
    frames, _ = encode_publish(0, 1, pa.array([bytes(1000)] * 3), compression="zstd",
                               sub_batch_size=3, max_frame_size=0)
    zstd = bytes(frames)[4 + 2 + 2 + 1 + 4 + 8:]
    plain = golden.simple_entry(golden.amqp_data(b"p" * 10))
    cases = [
        golden.deliver(golden.chunk([plain, zstd, plain, zstd, plain])),
        golden.deliver(golden.chunk([zstd, plain]), version=2, committed_chunk_id=7),
        # a sub-batch header cut short: the walk stops there, as in one go
        golden.deliver(golden.chunk([plain, zstd, b"\x80\x00\x05"], num_records=5)),
    ]
    for frame in cases:
        sizes = set()
        for step in (len(frame), 1, 3, 11, 64, 1000):
            decoder = StreamDecoder(max_frame_size=0)
            decoder.subscribe(0)
            got: list[int] = []
            decoder.admit = lambda chunk, seen=got: bool(seen.append(chunk.decoded_size))
            for i in range(0, len(frame), step):
                decoder.feed(frame[i:i + step])
                decoder.next_event()  # a chunk once whole; the walk goes on before
            assert len(got) == 1, step
            sizes.add(got[0])
        assert len(sizes) == 1, sizes


def test_decoded_size_is_read_from_the_headers_and_decoding_can_wait():
    """``Chunk.decoded_size``: the frame, what its compressed sub-batches
    declare, 32 bytes a record, known before anything is inflated; a chunk
    whose admission says no stays undecoded (its CRC checked) and decodes
    later to the batch it would have had."""
    frames, _ = encode_publish(0, 1, pa.array([bytes(1000)] * 3), compression="zstd",
                               sub_batch_size=3, max_frame_size=0)
    zstd = bytes(frames)[4 + 2 + 2 + 1 + 4 + 8:]
    plain = golden.simple_entry(golden.amqp_data(b"p" * 10))
    frame = golden.deliver(golden.chunk([zstd, plain], first_offset=5))
    decoder = StreamDecoder(max_frame_size=0)
    decoder.subscribe(0)
    seen: list[Chunk] = []
    decoder.admit = lambda chunk: bool(seen.append(chunk))
    decoder.feed(frame)
    chunk = decoder.next_event()
    assert seen == [chunk] and chunk.batch is None and chunk.num_records == 4
    declared = struct.unpack(">I", zstd[3:7])[0]
    assert chunk.decoded_size == len(frame) + declared + 4 * 32
    chunk.decode()
    assert chunk.batch.column("offset").to_pylist() == [5, 6, 7, 8]
    assert chunk.batch.equals(decode(frame))
    decoder.admit = None  # decoded at once, as without a consumer
    decoder.feed(frame)
    assert decoder.next_event().batch.equals(decode(frame))
    corrupt = golden.deliver(golden.chunk([plain], crc=1))
    decoder.admit = lambda chunk: False
    decoder.feed(corrupt)
    with pytest.raises(pystream.CorruptChunk):
        decoder.next_event()
