"""pystream._core.decode and StreamDecoder on golden captures and crafted
frames."""

import itertools
import os
import signal
import threading
import time
import zlib

import pyarrow as pa
import pytest

from pystream._core import Chunk, StreamDecoder, _crc32_fold256, crc32, decode, schema
from pystream.errors import CorruptChunk

from .golden import (
    DELIVER_CAPTURES,
    amqp_data,
    chunk,
    deliver,
    deliver_expected,
    deliver_frames,
    simple_entry,
    sub_batch,
)

ALL = ["properties", "application_properties", "message_annotations", "header"]


def check_capture(frames: bytes, expected: list[dict], body: str) -> None:
    """A capture decodes to what its writers sent (tests/data/README.md);
    also run on fresh captures by tests/test_capture_golden.py."""
    batch = decode(frames, columns=ALL, body=body, error_policy="raw")
    assert batch.num_rows == len(expected)
    rows = batch.to_pylist()
    for exp, row in zip(expected, rows, strict=True):
        assert row["body"] == bytes.fromhex(exp["body"])
        # raw entries are not AMQP: kept as they are and flagged
        assert (row["error"] is not None) == (exp["kind"] == "raw")
        if exp["kind"] == "amqp091":
            props = row["properties"]
            for key in ("message_id", "correlation_id", "content_type",
                        "content_encoding", "reply_to"):
                assert props[key] == exp[key]
            created = props["creation_time"].timestamp() * 1000
            assert created == exp["creation_time_ms"]
            assert dict(row["application_properties"]) == {
                k: str(v) for k, v in exp["app"].items()}
            annotations = dict(row["message_annotations"])
            assert annotations["x-routing-key"].startswith("golden-")
    offsets = [r["offset"] for r in rows]
    assert offsets[0] == 0
    steps = [b - a for a, b in itertools.pairwise(offsets)]
    assert sorted(set(steps)) == [1, 2] and steps.count(2) == 1  # tracking gap


@pytest.mark.parametrize("capture", DELIVER_CAPTURES)
@pytest.mark.parametrize("body", ["view", "binary"])
def test_golden_capture(capture, body):
    check_capture(deliver_frames(capture), deliver_expected(capture)["records"],
                  body)


@pytest.mark.parametrize("capture", DELIVER_CAPTURES)
def test_golden_start_offset_and_raw_mode(capture):
    wire = deliver_frames(capture)
    full = decode(wire, error_policy="raw")
    part = decode(wire, error_policy="raw", start_offset=100)
    assert part.column("offset").to_pylist() == [
        o for o in full.column("offset").to_pylist() if o >= 100]
    assert part.column("body").to_pylist() == full.column("body").to_pylist()[-part.num_rows:]
    skipped = decode(wire, error_policy="skip")
    assert skipped.num_rows == full.num_rows - sum(
        1 for r in deliver_expected(capture)["records"] if r["kind"] == "raw")
    raw = decode(wire, amqp=False)
    assert raw.num_rows == full.num_rows
    assert raw.schema.names == ["offset", "chunk_timestamp", "body"]


def test_schema_is_exact():
    s = schema(columns=ALL)
    assert str(s) == str(decode(b"", columns=ALL).schema)
    assert [(f.name, str(f.type)) for f in s] == [
        ("offset", "int64"), ("chunk_timestamp", "timestamp[us, tz=UTC]"),
        ("body", "binary_view"),
        ("properties", "struct<message_id: string, user_id: binary, to: string, "
         "subject: string, reply_to: string, correlation_id: string, content_type: "
         "string, content_encoding: string, absolute_expiry_time: timestamp[us, "
         "tz=UTC], creation_time: timestamp[us, tz=UTC], group_id: string, "
         "group_sequence: int64, reply_to_group_id: string>"),
        ("application_properties", "map<string, string>"),
        ("message_annotations", "map<string, string>"),
        ("header", "struct<durable: bool, priority: int32, ttl: int64, "
         "first_acquirer: bool, delivery_count: int64>")]
    assert str(schema(body="binary").field("body").type) == "binary"
    assert schema(error_policy="raw").names[-1] == "error"


def test_columns_are_only_built_when_named():
    wire = deliver(chunk([simple_entry(amqp_data(b"x"))]))
    assert decode(wire).schema.names == ["offset", "chunk_timestamp", "body"]
    assert decode(wire, columns=["header"]).schema.names[-1] == "header"
    with pytest.raises(ValueError):
        decode(wire, columns=["nope"])
    with pytest.raises(ValueError):
        decode(wire, columns=["header"], amqp=False)


def test_sub_batches_offsets_and_timestamp():
    bodies = [bytes([i]) * (i * 7) for i in range(10)]
    entries = [simple_entry(amqp_data(bodies[0])),
               sub_batch([amqp_data(b) for b in bodies[1:6]], codec=1),
               sub_batch([amqp_data(b) for b in bodies[6:9]], codec=0),
               simple_entry(amqp_data(bodies[9]))]
    wire = deliver(chunk(entries, first_offset=1000, timestamp=1_234), version=2)
    for body in ("view", "binary"):
        b = decode(wire, body=body)
        assert b.column("body").to_pylist() == bodies
        assert b.column("offset").to_pylist() == list(range(1000, 1010))
        assert b.column("chunk_timestamp").cast(pa.int64()).to_pylist() == [1_234_000] * 10
        b = decode(wire, body=body, start_offset=1004)
        assert b.column("body").to_pylist() == bodies[4:]


def test_fast_and_full_paths_interleave_in_order():
    """Data-only messages (the fast path, which keeps the output positions
    in locals) between messages the full path takes, in simple entries and
    sub-batches of several chunks: every row in place."""
    bodies, records = [], []
    for i in range(40):
        body = bytes([i]) * (i * 11 % 300)       # inline, vbin8 and vbin32
        bodies.append(body)
        if i % 3 == 2:                           # two data sections: full path
            records.append(amqp_data(body[:1]) + amqp_data(body[1:]))
        else:
            records.append(amqp_data(body))
    chunks, offset = [], 0
    for part in (records[:10], records[10:25], records[25:]):
        entries = [simple_entry(r) for r in part[:3]]
        entries += [sub_batch(part[3:6], codec=0), sub_batch(part[6:8], codec=1)]
        entries += [simple_entry(r) for r in part[8:]]
        chunks.append(deliver(chunk(entries, first_offset=offset)))
        offset += len(part)
    wire = b"".join(chunks)
    for body in ("view", "binary"):
        for start in (0, 4, 17):
            b = decode(wire, body=body, start_offset=start)
            assert b.column("body").to_pylist() == bodies[start:]
            assert b.column("offset").to_pylist() == list(range(start, 40))
    d = StreamDecoder(max_frame_size=0)
    d.subscribe(0)
    got = []
    for frame in chunks:
        d.feed(frame)
        got += d.next_event().batch.column("body").to_pylist()
    assert got == bodies


def test_multiple_data_sections_concatenate_and_amqp_value_body():
    two = amqp_data(b"hello ") + amqp_data(b"world, and more than twelve")
    value = b"\x00\x53\x77\xa1\x05hello"
    wire = deliver(chunk([simple_entry(two), simple_entry(value)]))
    for body in ("view", "binary"):
        assert decode(wire, body=body).column("body").to_pylist() == [
            b"hello world, and more than twelve", b"hello"]


def test_numpy_views_without_copy():
    wire = deliver(chunk([simple_entry(amqp_data(b"a" * 20))] * 5, first_offset=7))
    b = decode(wire)
    offsets = b.column("offset").to_numpy(zero_copy_only=True)
    assert offsets.tolist() == [7, 8, 9, 10, 11]
    b.column("chunk_timestamp").to_numpy(zero_copy_only=True)


def test_view_body_keeps_input_alive():
    data = bytearray(deliver(chunk([simple_entry(amqp_data(b"z" * 100))])))
    col = decode(data).column("body")
    with pytest.raises(BufferError):
        data.clear()            # pinned while the column points into it
    del col
    data.clear()


@pytest.mark.parametrize("body", ["view", "binary"])
def test_batches_released_in_arrow_s_threads_let_their_input_go(tmp_path, body):
    """A batch is handed to Arrow whole (the C data interface); Arrow's own
    threads may drop it last, and the input it points into is let go then."""
    import gc

    import pyarrow.dataset as ds
    data = bytearray(deliver(chunk([simple_entry(amqp_data(b"v" * 100))] * 200)))
    ds.write_dataset((decode(data, body=body) for _ in range(8)), tmp_path,
                     schema=schema(body=body), format="parquet", use_threads=True)
    gc.collect()
    data.clear()                # no batch pins it any more
    back = ds.dataset(tmp_path, format="parquet").to_table()
    assert back.num_rows == 1600 and set(back.column("body").to_pylist()) == {b"v" * 100}


def frames_of(*chunks):
    return b"".join(chunks)


def test_stream_decoder_events():
    d = StreamDecoder()
    d.subscribe(1, columns=["header"])
    control = b"\x00\x00\x00\x06\x00\x17\x00\x01\x00\x00"
    c1 = deliver(chunk([simple_entry(amqp_data(b"m%d" % i)) for i in range(3)],
                       first_offset=10), subscription_id=1, version=2,
                 committed_chunk_id=9)
    other = deliver(chunk([simple_entry(amqp_data(b"x"))]), subscription_id=2)
    wire = control + c1 + other
    events = []
    for i in range(0, len(wire), 7):        # arbitrary socket reads
        view = d.writable()
        piece = wire[i:i + 7]
        view[:len(piece)] = piece
        d.commit(len(piece))
        while (e := d.next_event()) is not None:
            events.append(e)
    assert events[0] == control[4:]
    ch = events[1]
    assert isinstance(ch, Chunk)
    assert (ch.subscription_id, ch.first_offset, ch.num_records, ch.next_offset,
            ch.committed_chunk_id, ch.size) == (1, 10, 3, 13, 9, len(c1))
    assert ch.batch.column("body").to_pylist() == [b"m0", b"m1", b"m2"]
    assert events[2] == other[4:]            # unregistered subscription
    d.unsubscribe(1)
    d.feed(c1)
    assert isinstance(d.next_event(), bytes)


def test_stream_decoder_recycles_and_keeps_blocks():
    d = StreamDecoder(max_frame_size=0)
    d.subscribe(0)
    body = b"q" * 1000
    frame = deliver(chunk([simple_entry(amqp_data(body))] * 50))
    kept = []
    for i in range(200):                    # far more than one block
        d.feed(frame)
        ch = d.next_event()
        if i % 40 == 0:
            kept.append(ch.batch)
    for batch in kept:                      # still intact after reuse
        assert batch.column("body").to_pylist() == [body] * 50


@pytest.mark.parametrize("capture", DELIVER_CAPTURES)
def test_stream_decoder_golden(capture):
    d = StreamDecoder()
    for sub in range(4):
        d.subscribe(sub, error_policy="raw")
    d.feed(deliver_frames(capture))
    rows = []
    while (e := d.next_event()) is not None:
        rows += e.batch.column("body").to_pylist()
    assert rows == [bytes.fromhex(r["body"]) for r in deliver_expected(capture)["records"]]


@pytest.mark.parametrize("crc", [crc32, _crc32_fold256])
def test_crc32_matches_zlib_at_every_length_and_alignment(crc):
    """ISA-L and the 256-bit folding (run on any CPU with VPCLMULQDQ, from
    512 bytes, though crc32 takes ISA-L's wider one where AVX-512 is there)
    agree with zlib: lengths around its 128-byte rounds, any start value."""
    data = bytes((i * 7919 + (i >> 8)) & 0xFF for i in range(1 << 16))
    lengths = [*range(0, 1100), 4095, 4096, 4097, 65535 - 63]
    for n, start, value in itertools.product(lengths, (0, 1, 31), (0, 0xFFFFFFFF, 0x12345678)):
        piece = data[start:start + n]
        assert crc(piece, value) == zlib.crc32(piece, value), (n, start, value)


@pytest.mark.parametrize("records", [2100, 2301, 4001])
def test_stream_decoder_splits_large_chunk_crc(records):
    """Chunks of 2 MiB and more have each half of their CRC checked on a
    core of its own, combined; zlib's CRC in the header is the oracle, at
    odd lengths, and a flipped byte in either half is caught."""
    bodies = [bytes([i & 0xFF]) * (1000 + i % 7) for i in range(records)]
    frame = deliver(chunk([simple_entry(amqp_data(b)) for b in bodies]))
    assert len(frame) >= 2 << 20
    d = StreamDecoder(max_frame_size=0)
    d.subscribe(0)
    for _ in range(3):                       # the worker is reused
        d.feed(frame)
        assert d.next_event().batch.column("body").to_pylist() == bodies
    data_at = 4 + 5 + 48                     # size, Deliver header, chunk header
    for fed, flip in enumerate((data_at + 10, len(frame) // 2, len(frame) - 3), 3):
        bad = bytearray(frame)
        bad[flip] ^= 0x01
        d.feed(bytes(bad))
        with pytest.raises(CorruptChunk, match="CRC-32 mismatch") as e:
            d.next_event()
        assert e.value.position == fed * len(frame) + 4 + 5 + 32   # its CRC field
    d.feed(frame)                            # and the decoder goes on
    assert d.next_event().num_records == records
    other = StreamDecoder(max_frame_size=0)  # another connection's
    other.subscribe(0)
    other.feed(frame)
    assert other.next_event().num_records == records
    assert len(_crc_workers()) == 1          # one worker for the process


def pieces(data: bytes, sizes=(1, 2, 13, 57, 4093, 65536, 300_000)):
    """``data`` cut into pieces of the given sizes, round and round."""
    at = 0
    for size in itertools.cycle(sizes):
        if at >= len(data):
            return
        yield data[at:at + size]
        at += size


@pytest.mark.parametrize("version", [1, 2])
def test_crc_checked_as_a_frame_arrives(version):
    """Fed in pieces with next_event between them, as a connection reads,
    a chunk's CRC is checked piece by piece as the bytes arrive, the rest at
    the end (on two cores when it is large); zlib's CRC in the header is the
    oracle. A flipped byte early, in the middle or last is caught, and a
    subscription that does not check CRCs is not checked."""
    bodies = [bytes([i & 0xFF]) * (1000 + i % 7) for i in range(3000)]
    frame = deliver(chunk([simple_entry(amqp_data(b)) for b in bodies]), version=version)
    d = StreamDecoder(max_frame_size=0)
    d.subscribe(0)
    d.subscribe(1, crc=False, amqp=False)

    def fed(data: bytes, cut=pieces):
        events = []
        for piece in cut(data):
            d.feed(piece)
            while (e := d.next_event()) is not None:
                events.append(e)
        return events

    def fed_then_whole(data: bytes):     # 100 kB in pieces, the rest at once:
        return fed(data, lambda b: [*pieces(b[:100_000]), b[100_000:]])  # two cores

    for feeding in (fed, fed_then_whole):
        [e] = feeding(frame)
        assert e.batch.column("body").to_pylist() == bodies
    data_at = 4 + (13 if version == 2 else 5) + 48
    position = len(frame) * 2
    for flip in (data_at + 10, len(frame) // 2, len(frame) - 1):
        bad = bytearray(frame)
        bad[flip] ^= 0x01
        for feeding in (fed, fed_then_whole):
            with pytest.raises(CorruptChunk, match="CRC-32 mismatch") as e:
                feeding(bytes(bad))
            assert e.value.position == position + data_at - 16   # its CRC field
            position += len(frame)
        bad[4 + 4] = 1                                # subscription 1: no CRC
        [e] = fed(bytes(bad))
        assert e.num_records == 3000
        position += len(frame)
    [e] = fed(frame)                                  # and the decoder goes on
    assert e.num_records == 3000


def test_crc_checked_as_recv_rest_reads_a_frame():
    """The reads of ``recv_rest`` are checked as they land, as fed pieces
    are: a good chunk decodes, one with a flipped byte is refused."""
    import socket
    import threading
    bodies = [bytes([i & 0xFF]) * 1000 for i in range(3000)]
    frame = deliver(chunk([simple_entry(amqp_data(b)) for b in bodies]))
    bad = bytearray(frame)
    bad[len(frame) // 2] ^= 0x01
    d = StreamDecoder(max_frame_size=0)
    d.subscribe(0)
    a, b = socket.socketpair()
    with a, b:
        for data in (frame, bytes(bad)):
            t = threading.Thread(target=b.sendall, args=(data[100:],))
            t.start()
            d.feed(data[:100])
            assert d.next_event() is None
            assert d.recv_rest(a.fileno(), 65536) is True
            t.join()
            if data is frame:
                assert d.next_event().batch.column("body").to_pylist() == bodies
            else:
                with pytest.raises(CorruptChunk, match="CRC-32 mismatch"):
                    d.next_event()


def test_decoders_share_the_crc_worker_from_several_threads():
    """Decoders in several threads post to the one worker, or check the
    whole CRC themselves while it has another's half: every chunk is
    checked right, a flipped byte caught, whoever checks it."""
    bodies = [b"s" * 1000] * 2200            # 2 MiB and more: split
    frame = deliver(chunk([simple_entry(amqp_data(b)) for b in bodies]))
    bad = bytearray(frame)
    bad[len(frame) * 3 // 4] ^= 0x01
    results: list[tuple[int, int]] = []

    def decode_many() -> None:
        d = StreamDecoder(max_frame_size=0)
        d.subscribe(0)
        good = caught = 0
        for i in range(60):
            d.feed(bytes(bad) if i % 3 == 0 else frame)
            try:
                good += d.next_event().num_records == 2200
            except CorruptChunk:
                caught += 1
        results.append((good, caught))

    threads = [threading.Thread(target=decode_many) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(40, 20)] * 3
    assert len(_crc_workers()) == 1


def _crc_workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pystream-crc"]


def test_stream_decoder_after_fork():
    """A child of fork() has the decoder and the CRC worker but not the
    worker's thread: it checks large chunks with a worker of its own."""
    frame = deliver(chunk([simple_entry(amqp_data(b"f" * 1000))] * 2200))
    d = StreamDecoder(max_frame_size=0)
    d.subscribe(0)
    d.feed(frame)
    assert d.next_event().num_records == 2200    # the worker runs
    pid = os.fork()
    if pid == 0:                                 # the child: exit code says
        ok = False
        try:
            d.feed(frame)
            ok = d.next_event().num_records == 2200
            del d
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child hung")
    assert os.waitstatus_to_exitcode(done[1]) == 0
