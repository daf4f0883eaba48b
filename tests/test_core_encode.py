"""pystream._core.encode_publish and murmur3_32: Publish frames read back
through pystream.protocol and, turned into Deliver frames, through the
decoder (no broker needed)."""

import datetime as dt
import gzip
import random
import struct
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pystream import protocol as P
from pystream._core import decode, encode_publish, murmur3_32, schema
from pystream.errors import TruncatedFrame
from pystream.publish_frames import join_publish_frames, publish_frames

from .golden import amqp_data, chunk, deliver

PROPERTIES = schema(columns=["properties"]).field("properties").type
STRING_MAP = pa.map_(pa.string(), pa.string())
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_NUMBER = {name: i for i, name in enumerate(CODECS)}


# --- reading the frames back -------------------------------------------------

def split_frames(frames) -> list[bytes]:
    """The frames (without size prefix) of a buffer of Publish frames."""
    data = bytes(frames)
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    assert pos == len(data)
    return out


def parse_publish(frame: bytes):
    """(publisher id, version, [(publishing id, filter, entry bytes)]) where
    the entry bytes are what the broker stores: a simple entry (u32 size and
    message) or the sub-batch header and data."""
    key, version, publisher_id, count = struct.unpack_from(">HHBi", frame, 0)
    assert key == 0x0002 and version in (1, 2)
    pos, entries = 9, []
    for _ in range(count):
        (pid,) = struct.unpack_from(">Q", frame, pos)
        pos += 8
        filt = None
        if version == 2:
            (n,) = struct.unpack_from(">h", frame, pos)
            pos += 2
            if n >= 0:
                filt = frame[pos:pos + n].decode()
                pos += n
        if frame[pos] & 0x80:
            assert version == 1
            (length,) = struct.unpack_from(">I", frame, pos + 7)
            size = 11 + length
        else:
            (length,) = struct.unpack_from(">I", frame, pos)
            size = 4 + length
        entries.append((pid, filt, frame[pos:pos + size]))
        pos += size
    assert pos == len(frame)
    return publisher_id, version, entries


def as_deliver(frames, per_chunk: int = 1000) -> bytes:
    """The stored entries of the Publish frames, as Deliver frames of chunks
    (what a consumer would read back)."""
    entries = [e for f in split_frames(frames) for _, _, e in parse_publish(f)[2]]
    out, offset = [], 0
    for i in range(0, len(entries), per_chunk):
        part = entries[i:i + per_chunk]
        c = chunk(part, first_offset=offset)
        offset += struct.unpack_from(">I", c, 4)[0]
        out.append(deliver(c))
    return b"".join(out)


def round_trip(frames, **options) -> pa.RecordBatch:
    return decode(as_deliver(frames), **options)


def publishing_ids(frames) -> list[int]:
    return [pid for f in split_frames(frames) for pid, _, _ in parse_publish(f)[2]]


def bodies_sample() -> list[bytes]:
    rng = random.Random(7)
    return ([b"", b"a", b"twelve bytes", b"thirteen byte", b"x" * 255, b"y" * 256]
            + [rng.randbytes(rng.randrange(0, 600)) for _ in range(200)])


# --- bodies --------------------------------------------------------------------

BODY_TYPES = [pa.binary(), pa.large_binary(), pa.binary_view()]
TEXT_TYPES = [pa.string(), pa.large_string(), pa.string_view()]


@pytest.mark.parametrize("typ", BODY_TYPES + TEXT_TYPES, ids=str)
@pytest.mark.parametrize("amqp", [True, False])
def test_bodies_of_every_type(typ, amqp):
    bodies = bodies_sample()
    if typ in TEXT_TYPES:
        bodies = [b.hex().encode() for b in bodies]
        arr = pa.array([b.decode() for b in bodies], typ)
    else:
        arr = pa.array(bodies, typ)
    frames, counts = encode_publish(1, 100, arr, amqp=amqp)
    assert counts.dtype == np.int64 and counts.tolist() == [1] * len(bodies)
    assert publishing_ids(frames) == list(range(100, 100 + len(bodies)))
    batch = round_trip(frames, amqp=amqp)
    assert batch.column("body").to_pylist() == bodies


@pytest.mark.parametrize("typ", BODY_TYPES, ids=str)
def test_sliced_bodies(typ):
    bodies = bodies_sample()
    arr = pa.array(bodies, typ).slice(5, 100)
    frames, _ = encode_publish(0, 0, arr)
    assert round_trip(frames).column("body").to_pylist() == bodies[5:105]


def test_list_and_chunked_bodies():
    bodies = bodies_sample()
    frames, _ = encode_publish(0, 0, bodies)
    assert round_trip(frames).column("body").to_pylist() == bodies
    chunked = pa.chunked_array([pa.array(bodies[:50]), pa.array(bodies[50:])])
    again, _ = encode_publish(0, 0, chunked)
    assert bytes(again) == bytes(frames)


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_bytes_lists_read_in_place_as_arrow_would(codec):
    """A list or tuple of bytes (read in place, without an Arrow array)
    encodes as its Arrow binary array does: bodies inline in the views
    (12 bytes or less) and past them, across frames; items of other types
    go through pyarrow."""
    rng = random.Random(5)
    bodies = [rng.randbytes(rng.choice([0, 1, 12, 13, 100, 5000])) for _ in range(3000)]
    expected, counts = encode_publish(3, 10, pa.array(bodies, pa.binary()),
                                      compression=codec, max_frame_size=65536)
    for seq in (bodies, tuple(bodies)):
        frames, again = encode_publish(3, 10, seq, compression=codec,
                                       max_frame_size=65536)
        assert bytes(frames) == bytes(expected)
        assert again.tolist() == counts.tolist()
    mixed, _ = encode_publish(0, 0, [b"ab", bytearray(b"cd"), "ef"])
    assert round_trip(mixed).column("body").to_pylist() == [b"ab", b"cd", b"ef"]
    with pytest.raises(ValueError, match="message 1: null body"):
        encode_publish(0, 0, [b"a", None])


def test_publish_v1_layout():
    frames, counts = encode_publish(7, 2 ** 64 - 3, [b"hello", b"", b"x" * 300])
    (frame,) = split_frames(frames)
    cmd = P.decode(frame)
    assert isinstance(cmd, P.Publish) and cmd.version == 1 and cmd.publisher_id == 7
    assert [m.publishing_id for m in cmd.messages] == [2 ** 64 - 3, 2 ** 64 - 2, 2 ** 64 - 1]
    assert [m.data for m in cmd.messages] == [amqp_data(b"hello"), amqp_data(b""),
                                              amqp_data(b"x" * 300)]
    raw, _ = encode_publish(7, 0, [b"hello", b""], amqp=False)
    assert [m.data for m in P.decode(split_frames(raw)[0]).messages] == [b"hello", b""]


def test_publish_frames_splits_and_readdresses_the_encoders_frames():
    """What a recovering producer sends again: some of a batch's frames,
    now from the publisher id of the new connection."""
    frames, counts = encode_publish(3, 10, [b"x" * 100] * 50, max_frame_size=1000)
    split = list(publish_frames(memoryview(frames)))
    assert [bytes(f[4:]) for f, _ in split] == split_frames(frames)
    assert sum(n for _, n in split) == len(counts) and len(split) > 2
    again = join_publish_frames([split[0][0], split[2][0]], 9)
    cmds = [P.decode(f) for f in split_frames(again)]
    assert [c.publisher_id for c in cmds] == [9, 9]
    assert [c.messages[0].publishing_id for c in cmds] == [10, 10 + split[0][1] + split[1][1]]
    with pytest.raises(TruncatedFrame):
        list(publish_frames(memoryview(bytes(frames)[:-1])))


def test_no_messages():
    frames, counts = encode_publish(0, 0, pa.array([], pa.binary()))
    assert len(frames) == 0 and len(counts) == 0
    frames, counts = encode_publish(0, 0, [], compression="zstd")
    assert len(frames) == 0 and len(counts) == 0


def test_null_body_is_refused():
    with pytest.raises(ValueError, match="message 2: null body"):
        encode_publish(0, 0, pa.array([b"a", b"b", None]))


# --- properties and maps ---------------------------------------------------------

def ts(ms):
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def full_properties():
    rows = [
        {"message_id": "m-1", "user_id": b"\x00guest\xff", "to": "/queues/q",
         "subject": "s", "reply_to": "r", "correlation_id": "c-1",
         "content_type": "application/json", "content_encoding": "gzip",
         "absolute_expiry_time": ts(1_700_000_123_456), "creation_time": ts(-1500),
         "group_id": "g", "group_sequence": 4_000_000_000, "reply_to_group_id": "rg"},
        None,
        {"message_id": "only the first"},
        {"reply_to_group_id": "only the last", "group_sequence": 0},
        {"group_sequence": 200, "subject": "é" * 200},
        {},
        {"to": "t" * 1000, "creation_time": ts(0)},
    ]
    return [None if r is None else {name: r.get(name) for name in PROPERTIES.names}
            for r in rows]


def test_properties_round_trip():
    rows = full_properties()
    props = pa.array(rows, PROPERTIES)
    bodies = [b"body %d" % i for i in range(len(rows))]
    frames, _ = encode_publish(0, 0, bodies, properties=props)
    batch = round_trip(frames, columns=["properties"])
    assert batch.column("body").to_pylist() == bodies
    assert batch.column("properties").to_pylist() == rows
    messages = [m.data for m in P.decode(split_frames(frames)[0]).messages]
    assert b"\x00\x53\x73" not in messages[1]            # null row: no section
    # list truncated after the last non-null field; content-type a symbol
    assert messages[2].startswith(b"\x00\x53\x73\xc0\x11\x01\xa1\x0eonly the first")
    assert b"\xa3\x10application/json" in messages[0]
    assert messages[5].startswith(b"\x00\x53\x73\x45")  # all null: empty list


def test_properties_subset_units_and_binary_ids():
    props = pa.StructArray.from_arrays(
        [pa.array([b"\x01\x02", None], pa.binary()),
         pa.array(["ct", None], pa.large_string()),
         pa.array([1_700_000_000, -1], pa.timestamp("s")),
         pa.array([1_700_000_000_123_999, -1], pa.timestamp("us", tz="UTC")),
         pa.array([5, None], pa.uint8())],
        names=["message_id", "content_type", "absolute_expiry_time",
               "creation_time", "group_sequence"])
    frames, _ = encode_publish(0, 0, [b"a", b"b"], properties=props)
    got = round_trip(frames, columns=["properties"]).column("properties").to_pylist()
    assert got[0]["message_id"] == "0102"                   # binary id, rendered as hex
    assert got[0]["content_type"] == "ct"
    assert got[0]["absolute_expiry_time"] == ts(1_700_000_000_000)
    assert got[0]["creation_time"] == ts(1_700_000_000_123)  # ms precision
    assert got[0]["group_sequence"] == 5
    assert got[1]["absolute_expiry_time"] == ts(-1000)
    assert got[1]["creation_time"] == ts(-1)                 # floor, not truncation
    assert got[1]["message_id"] is None and got[1]["group_sequence"] is None


def test_properties_sliced_struct():
    rows = full_properties()
    props = pa.array(rows, PROPERTIES).slice(2, 4)
    frames, _ = encode_publish(0, 0, [b""] * 4, properties=props)
    got = round_trip(frames, columns=["properties"]).column("properties").to_pylist()
    assert got == rows[2:6]


@pytest.mark.parametrize("value", [-1, 2 ** 32])
def test_group_sequence_outside_uint(value):
    props = pa.StructArray.from_arrays([pa.array([1, value], pa.int64())],
                                       names=["group_sequence"])
    with pytest.raises(ValueError, match="message 1: group_sequence"):
        encode_publish(0, 0, [b"", b""], properties=props)


def test_bad_properties():
    bodies = [b"a"]
    with pytest.raises(ValueError, match="unknown properties field 'colour'"):
        encode_publish(0, 0, bodies, properties=pa.StructArray.from_arrays(
            [pa.array(["red"])], names=["colour"]))
    with pytest.raises(TypeError, match="properties.subject must be a string"):
        encode_publish(0, 0, bodies, properties=pa.StructArray.from_arrays(
            [pa.array([b"x"])], names=["subject"]))
    with pytest.raises(ValueError, match="rows"):
        encode_publish(0, 0, bodies + bodies, properties=pa.array(
            [{"subject": "x"}], PROPERTIES))
    with pytest.raises(ValueError, match="amqp=True"):
        encode_publish(0, 0, bodies, amqp=False,
                       properties=pa.array([{"subject": "x"}], PROPERTIES))


def map_rows():
    return [
        [("k", "v"), ("empty", ""), ("null", None)],
        None,
        [],
        [(f"key {i}", f"value {i}") for i in range(200)],     # map32
        [("long", "é" * 300)],
    ]


@pytest.mark.parametrize("column", ["application_properties", "message_annotations"])
def test_maps_round_trip(column):
    rows = map_rows()
    arr = pa.array(rows, STRING_MAP)
    frames, _ = encode_publish(0, 0, [b"x"] * len(rows), **{column: arr})
    got = round_trip(frames, columns=[column]).column(column).to_pylist()
    assert got == rows
    messages = [m.data for m in P.decode(split_frames(frames)[0]).messages]
    key = b"\xa3\x01k" if column == "message_annotations" else b"\xa1\x01k"
    assert key in messages[0]                 # annotation keys are symbols
    sliced = arr.slice(1, 3)
    frames, _ = encode_publish(0, 0, [b"x"] * 3, **{column: sliced})
    assert round_trip(frames, columns=[column]).column(column).to_pylist() == rows[1:4]


def test_all_sections_together():
    rows = full_properties()
    n = len(rows)
    app = pa.array([[("a", str(i))] for i in range(n)], STRING_MAP)
    ann = pa.array([[("x-opt", "y")] if i % 2 else None for i in range(n)], STRING_MAP)
    frames, _ = encode_publish(0, 0, [b"b%d" % i for i in range(n)],
                               properties=pa.array(rows, PROPERTIES),
                               application_properties=app, message_annotations=ann)
    batch = round_trip(frames, columns=["properties", "application_properties",
                                        "message_annotations"])
    assert batch.column("properties").to_pylist() == rows
    assert batch.column("application_properties").to_pylist() == app.to_pylist()
    assert batch.column("message_annotations").to_pylist() == ann.to_pylist()
    data = P.decode(split_frames(frames)[0]).messages[1].data
    # AMQP section order: annotations, (no properties), application properties, data
    assert data.index(b"\x00\x53\x72") < data.index(b"\x00\x53\x74") < data.index(b"\x00\x53\x75")


# --- compression ----------------------------------------------------------------

def compressible_bodies(n, seed=3):
    rng = random.Random(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"stream"]
    return [b" ".join(rng.choice(words) for _ in range(rng.randrange(0, 40)))
            for _ in range(n)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("sub_batch_size", [1, 7, 100, 65535])
def test_compression_round_trip(codec, sub_batch_size):
    bodies = compressible_bodies(1000)
    frames, counts = encode_publish(2, 50, bodies, compression=codec,
                                    sub_batch_size=sub_batch_size)
    assert counts.sum() == len(bodies)
    assert (counts <= sub_batch_size).all() and (counts >= 1).all()
    assert publishing_ids(frames) == list(range(50, 50 + len(counts)))
    if sub_batch_size < 1000:
        assert counts[:-1].tolist() == [sub_batch_size] * (len(counts) - 1)
    for frame in split_frames(frames):
        for _, _, entry in parse_publish(frame)[2]:
            assert entry[0] == 0x80 | CODEC_NUMBER[codec] << 4
    batch = round_trip(frames)
    assert batch.column("body").to_pylist() == bodies
    assert batch.column("offset").to_pylist() == list(range(len(bodies)))


@pytest.mark.parametrize("codec", CODECS)
def test_compression_large_and_random_records(codec):
    # above snappy's 64 KiB block and lz4's, and incompressible data
    # (snappy then stores uncompressed chunks)
    rng = random.Random(11)
    bodies = [rng.randbytes(200_000), b"z" * 150_000, b"", rng.randbytes(70_000)]
    frames, counts = encode_publish(0, 0, bodies, compression=codec, sub_batch_size=10)
    assert counts.sum() == 4
    assert round_trip(frames, amqp=True).column("body").to_pylist() == bodies
    frames, _ = encode_publish(0, 0, bodies, compression=codec, amqp=False)
    assert round_trip(frames, amqp=False).column("body").to_pylist() == bodies


def test_gzip_is_one_rfc1952_member():
    bodies = compressible_bodies(10)
    frames, _ = encode_publish(0, 0, bodies, compression="gzip", amqp=False)
    ((_, _, entry),) = parse_publish(split_frames(frames)[0])[2]
    records, plain_len, length = struct.unpack_from(">HII", entry, 1)
    plain = gzip.decompress(entry[11:])
    assert records == 10 and len(plain) == plain_len and length == len(entry) - 11
    assert plain == b"".join(struct.pack(">I", len(b)) + b for b in bodies)


def test_compression_with_properties():
    rows = full_properties()
    n = len(rows)
    app = pa.array([[("i", str(i))] for i in range(n)], STRING_MAP)
    frames, counts = encode_publish(0, 0, [b"b"] * n, compression="zstd",
                                    properties=pa.array(rows, PROPERTIES),
                                    application_properties=app, sub_batch_size=3)
    assert counts.tolist() == [3, 3, 1]
    batch = round_trip(frames, columns=["properties", "application_properties"])
    assert batch.column("properties").to_pylist() == rows
    assert batch.column("application_properties").to_pylist() == app.to_pylist()


def test_compression_contexts_across_threads():
    bodies = compressible_bodies(3000)
    expected = {c: bytes(encode_publish(0, 0, bodies, compression=c)[0]) for c in CODECS}
    errors = []

    def work(codec):
        try:
            for _ in range(5):
                if bytes(encode_publish(0, 0, bodies, compression=codec)[0]) != expected[codec]:
                    errors.append(codec)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(c,)) for c in CODECS * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --- filter values (Publish v2) --------------------------------------------------

def test_filter_values_v2():
    bodies = [b"a", b"b", b"c", b"d"]
    filters = pa.array(["eu", None, "", "us" * 100])
    frames, counts = encode_publish(9, 5, bodies, filter_values=filters)
    (frame,) = split_frames(frames)
    cmd = P.decode(frame)
    assert cmd.version == 2 and cmd.publisher_id == 9
    assert [m.publishing_id for m in cmd.messages] == [5, 6, 7, 8]
    assert [m.filter_value for m in cmd.messages] == ["eu", None, "", "us" * 100]
    assert [m.data for m in cmd.messages] == [amqp_data(b) for b in bodies]
    assert round_trip(frames).column("body").to_pylist() == bodies
    assert counts.tolist() == [1] * 4


def test_filter_value_limits():
    with pytest.raises(ValueError, match="message 1: filter value above 32767"):
        encode_publish(0, 0, [b"", b""], filter_values=pa.array(["ok", "x" * 32768]))
    frames, _ = encode_publish(0, 0, [b""], filter_values=pa.array(["x" * 32767]))
    assert P.decode(split_frames(frames)[0]).messages[0].filter_value == "x" * 32767
    with pytest.raises(ValueError, match="compression must be None"):
        encode_publish(0, 0, [b""], filter_values=pa.array(["a"]), compression="zstd")
    with pytest.raises(ValueError, match="rows"):
        encode_publish(0, 0, [b""], filter_values=pa.array(["a", "b"]))


# --- frame size --------------------------------------------------------------------

@pytest.mark.parametrize("filtered", [False, True])
def test_frames_split_at_max_frame_size(filtered):
    bodies = compressible_bodies(20_000)
    filters = pa.array([f"f{i % 7}" for i in range(len(bodies))]) if filtered else None
    frames, counts = encode_publish(0, 1, bodies, filter_values=filters,
                                    max_frame_size=4096)
    parts = split_frames(frames)
    assert len(parts) > 50
    assert all(4 + len(f) <= 4096 for f in parts)
    entries = [[8 + (2 + len(fv.encode()) if filtered else 0) + len(e)
                for _, fv, e in parse_publish(f)[2]] for f in parts]
    assert sum(map(len, entries)) == len(bodies)
    # greedy: the next frame's first message would not have fitted
    for frame, following in zip(parts[:-1], entries[1:], strict=True):
        assert 4 + len(frame) + following[0] > 4096
    assert publishing_ids(frames) == list(range(1, 1 + len(bodies)))
    assert round_trip(frames).column("body").to_pylist() == bodies


def test_frame_may_be_exactly_max_frame_size():
    # frame: 13 bytes of header; entry: 8 id + 4 size + message (5 + body)
    body = b"x" * 100
    limit = 13 + 2 * (8 + 4 + 5 + 100)
    frames, _ = encode_publish(0, 0, [body] * 4, max_frame_size=limit)
    assert [4 + len(f) for f in split_frames(frames)] == [limit, limit]
    frames, _ = encode_publish(0, 0, [body] * 4, max_frame_size=limit - 1)
    assert len(split_frames(frames)) == 4


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_frames_split_at_max_frame_size(codec):
    bodies = compressible_bodies(20_000)
    frames, counts = encode_publish(0, 0, bodies, compression=codec,
                                    sub_batch_size=500, max_frame_size=8192)
    parts = split_frames(frames)
    assert all(4 + len(f) <= 8192 for f in parts)
    assert counts.sum() == len(bodies)
    assert round_trip(frames).column("body").to_pylist() == bodies


def test_message_too_large():
    bodies = [b"a", b"b", b"c", b"x" * 5000, b"d"]
    with pytest.raises(ValueError, match="message 3: message does not fit"):
        encode_publish(0, 0, bodies, max_frame_size=4096)
    rng = random.Random(1)
    noise = [b"a", rng.randbytes(5000)]
    for codec in CODECS:
        with pytest.raises(ValueError, match="message 1: message does not fit"):
            encode_publish(0, 0, noise, compression=codec, max_frame_size=4096)


def test_lone_record_checked_after_compression():
    # a record above the frame size goes alone into its sub-batch, and is
    # accepted when it compresses enough
    bodies = [b"a", b"\0" * 100_000, b"b"]
    frames, counts = encode_publish(0, 0, bodies, compression="zstd",
                                    max_frame_size=4096)
    assert counts.tolist() == [1, 1, 1]
    assert round_trip(frames).column("body").to_pylist() == bodies


def test_unlimited_frame_size():
    bodies = compressible_bodies(5000)
    frames, _ = encode_publish(0, 0, bodies, max_frame_size=0)
    assert len(split_frames(frames)) == 1


def test_argument_checks():
    with pytest.raises(ValueError, match="publisher_id"):
        encode_publish(256, 0, [b""])
    with pytest.raises(ValueError, match="first_publishing_id"):
        encode_publish(0, -1, [b""])
    with pytest.raises(ValueError, match="compression"):
        encode_publish(0, 0, [b""], compression="brotli")
    with pytest.raises(ValueError, match="sub_batch_size"):
        encode_publish(0, 0, [b""], compression="gzip", sub_batch_size=65536)
    with pytest.raises(ValueError, match="max_frame_size"):
        encode_publish(0, 0, [b""], max_frame_size=2 ** 32)
    with pytest.raises(TypeError, match="bodies must be"):
        encode_publish(0, 0, pa.array([1, 2]))


@settings(max_examples=150, deadline=None)
@given(bodies=st.lists(st.binary(max_size=3000), max_size=60),
       codec=st.sampled_from([None] + CODECS),
       sub_batch_size=st.integers(1, 20),
       max_frame_size=st.integers(3100, 20_000),
       filtered=st.booleans(), amqp=st.booleans(),
       typ=st.sampled_from(BODY_TYPES))
def test_random_round_trip(bodies, codec, sub_batch_size, max_frame_size,
                           filtered, amqp, typ):
    filters = None
    if filtered and codec is None:
        filters = pa.array([None if i % 3 == 0 else f"f{i}" for i in range(len(bodies))])
    try:
        frames, counts = encode_publish(1, 7, pa.array(bodies, typ),
                                        filter_values=filters, amqp=amqp,
                                        compression=codec,
                                        sub_batch_size=sub_batch_size,
                                        max_frame_size=max_frame_size)
    except ValueError as exc:       # only random bytes may not fit, never text
        assert "does not fit" in str(exc) and codec not in (None, "none")
        return
    assert counts.sum() == len(bodies) and (counts <= sub_batch_size).all()
    assert all(4 + len(f) <= max_frame_size for f in split_frames(frames))
    assert publishing_ids(frames) == list(range(7, 7 + len(counts)))
    if filters is not None:
        got = [fv for f in split_frames(frames) for _, fv, _ in parse_publish(f)[2]]
        assert got == filters.to_pylist()
    assert round_trip(frames, amqp=amqp).column("body").to_pylist() == bodies


# --- murmur3 --------------------------------------------------------------------------

# mmh3.hash(key, 104729, signed=False) (and seed 0), computed with the mmh3 package
MURMUR3 = [
    ("hello", 1321743225, 613153351),
    ("", 3329588566, 0),
    ("abcd", 3421720556, 1139631978),
    ("a", 1086686554, 1009084850),
    ("ab", 398604456, 2613040991),
    ("abc", 3409700625, 3017643002),
    ("abcde", 3837964174, 3902511862),
    ("order-42", 556465915, 1259446670),
    ("héllo wörld ✓", 3366334844, 238508760),
    ("x" * 1000, 1999890650, 1897939982),
]


@pytest.mark.parametrize("typ", TEXT_TYPES + BODY_TYPES, ids=str)
def test_murmur3_vectors(typ):
    keys = [k for k, _, _ in MURMUR3]
    arr = pa.array([k.encode() for k in keys] if typ in BODY_TYPES else keys, typ)
    got = murmur3_32(arr)
    assert got.dtype == np.uint32
    assert got.tolist() == [h for _, h, _ in MURMUR3]
    assert murmur3_32(arr, seed=0).tolist() == [h for _, _, h in MURMUR3]


def test_murmur3_lists_slices_nulls():
    keys = [k for k, _, _ in MURMUR3]
    assert murmur3_32(keys).tolist() == [h for _, h, _ in MURMUR3]
    assert murmur3_32(pa.array(keys).slice(2, 3)).tolist() == [h for _, h, _ in MURMUR3[2:5]]
    assert murmur3_32(["hello", None]).tolist() == [1321743225, 3329588566]
    assert len(murmur3_32([])) == 0
    assert murmur3_32([None]).tolist() == [3329588566]
    # routing as the Java and Go clients do
    parts = (murmur3_32(["order-42"]).astype(np.int64) & 0x7FFFFFFF) % 3
    assert parts.tolist() == [(556465915 & 0x7FFFFFFF) % 3]
