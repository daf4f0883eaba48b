"""Every error class from crafted bytes, the codecs, and regressions for
fuzzer findings."""

import struct

import pyarrow as pa
import pytest

from pystream._core import decode
from pystream.errors import (
    CorruptChunk,
    DecompressionLimit,
    MalformedMessage,
    ProtocolError,
    StreamError,
    TruncatedFrame,
)

from .golden import (
    DELIVER_CAPTURES,
    amqp_data,
    chunk,
    deliver,
    deliver_frames,
    simple_entry,
    sub_batch,
)

MSGS = [amqp_data(b"message %d " % i * (i + 1)) for i in range(40)]


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def snappy_framed(data: bytes) -> bytes:
    """Snappy framing format: stream identifier, one compressed chunk."""
    crc = crc32c(data)
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    block = pa.compress(data, codec="snappy", asbytes=True)
    body = struct.pack("<I", masked) + block
    return (b"\xff\x06\x00\x00sNaPpY" + bytes([0])
            + struct.pack("<I", len(body))[:3] + body)


COMPRESS = {
    0: lambda b: b,
    1: None,                                  # gzip (helper default)
    2: snappy_framed,
    3: lambda b: pa.compress(b, codec="lz4", asbytes=True),   # lz4 frame
    4: lambda b: pa.compress(b, codec="zstd", asbytes=True),
}


@pytest.mark.parametrize("codec", sorted(COMPRESS))
@pytest.mark.parametrize("body", ["view", "binary"])
def test_every_codec(codec, body):
    wire = deliver(chunk([sub_batch(MSGS, codec, COMPRESS[codec])]))
    got = decode(wire, body=body).column("body").to_pylist()
    assert got == [b"message %d " % i * (i + 1) for i in range(40)]


def one_frame(capture=DELIVER_CAPTURES[0]) -> bytearray:
    wire = deliver_frames(capture)
    (n,) = struct.unpack_from(">I", wire)
    return bytearray(wire[:4 + n])


def test_flipped_crc_byte():
    frame = one_frame()
    frame[-1] ^= 0x01
    with pytest.raises(CorruptChunk, match="CRC") as e:
        decode(frame)
    assert e.value.position == 4 + 5 + 32      # the CRC field
    assert decode(frame, crc=False).num_rows == 13  # verification can be off


def test_cut_frame():
    frame = one_frame()
    with pytest.raises(TruncatedFrame) as e:
        decode(frame[:-10])
    assert e.value.position == 0
    assert isinstance(e.value, ProtocolError)
    with pytest.raises(TruncatedFrame):
        decode(struct.pack(">I", 20) + bytes(frame[4:24]))   # inside the header


def test_bad_magic_and_lying_lengths():
    entries = [simple_entry(m) for m in MSGS[:3]]
    with pytest.raises(CorruptChunk, match="magic"):
        decode(deliver(chunk(entries, magic=0x51)))
    with pytest.raises(CorruptChunk, match="data length"):
        decode(deliver(chunk(entries, data_length=10_000)))
    with pytest.raises(CorruptChunk, match="record count"):
        decode(deliver(chunk(entries, num_records=4)))
    lying = bytearray(simple_entry(MSGS[0]))
    lying[3] += 100                                       # entry size too big
    with pytest.raises(CorruptChunk, match="entry size"):
        decode(deliver(chunk([bytes(lying)])))
    bad_record = bytearray(sub_batch(MSGS[:2]))
    bad_record[14] += 1                                   # inner record size
    with pytest.raises(CorruptChunk, match="sub-batch"):
        decode(deliver(chunk([bytes(bad_record)])), amqp=False)


def test_bad_codec_and_bad_data():
    entry = bytearray(sub_batch(MSGS[:2]))
    entry[0] = 0x80 | 5 << 4
    with pytest.raises(CorruptChunk, match="codec"):
        decode(deliver(chunk([bytes(entry)])))
    for codec in (1, 2, 3, 4):
        garbage = sub_batch(MSGS[:2], codec, lambda b: b"\x00garbage" * 5,
                            announced=sum(len(m) + 4 for m in MSGS[:2]))
        with pytest.raises(CorruptChunk):
            decode(deliver(chunk([garbage])))


def test_zstd_bomb():
    bomb = pa.compress(bytes(10 << 20), codec="zstd", asbytes=True)
    lie = sub_batch(MSGS[:1], 4, lambda b: bomb, announced=100)
    with pytest.raises(DecompressionLimit) as e:
        decode(deliver(chunk([lie])))
    assert isinstance(e.value, CorruptChunk) and e.value.position > 0
    huge = sub_batch(MSGS[:1], 4, lambda b: bomb, announced=100 << 20)
    with pytest.raises(DecompressionLimit, match="max_subbatch_size"):
        decode(deliver(chunk([huge])))
    ok = sub_batch(MSGS[:2], 4, COMPRESS[4])
    with pytest.raises(DecompressionLimit, match="max_chunk_size"):
        decode(deliver(chunk([ok, ok])), max_subbatch_size=60, max_chunk_size=60)
    short = sub_batch(MSGS[:2], 4, COMPRESS[4], announced=10_000)
    with pytest.raises(DecompressionLimit, match="less than"):
        decode(deliver(chunk([short])))


def test_gzip_bytes_after_the_member():
    import gzip

    plain = b"".join(simple_entry(m) for m in MSGS[:2])
    one_member = gzip.compress(plain)
    # RFC 1952: a gzip stream is a series of members, read one after the other
    two = sub_batch(MSGS[:2], 1, lambda b: gzip.compress(b[:7]) + gzip.compress(b[7:]))
    assert decode(deliver(chunk([two]))).num_rows == 2
    # anything else after a member is corrupt, even when the member alone
    # gives the announced length
    for trailer in (b"\x00", b"\x00" * 8, b"garbage!", b"\x1f"):
        bad = sub_batch(MSGS[:2], 1, lambda b, t=trailer: gzip.compress(b) + t)
        with pytest.raises(CorruptChunk, match="after the gzip member") as e:
            decode(deliver(chunk([bad])))
        assert not isinstance(e.value, DecompressionLimit)
        assert e.value.position == 4 + 5 + 48 + 11 + len(one_member)
    cut = sub_batch(MSGS[:2], 1, lambda b: gzip.compress(b) + one_member[:10])
    with pytest.raises(CorruptChunk, match="gzip"):
        decode(deliver(chunk([cut])))
    # a second member that adds bytes past the announced length
    more = sub_batch(MSGS[:2], 1, lambda b: gzip.compress(b) + gzip.compress(b"x"))
    with pytest.raises(DecompressionLimit):
        decode(deliver(chunk([more])))
    assert len(plain) == len(gzip.decompress(one_member))


def test_malformed_message_policies():
    bad = b"\x00\x53\x75\xb0\x00\x00\x10\x00abc"        # data runs past the entry
    wire = deliver(chunk([simple_entry(MSGS[0]), simple_entry(bad),
                          simple_entry(MSGS[1])]))
    with pytest.raises(MalformedMessage) as e:
        decode(wire)
    assert e.value.position == 4 + 5 + 48 + 4 + len(MSGS[0]) + 4 + 3
    assert decode(wire, error_policy="skip").column("offset").to_pylist() == [0, 2]
    raw = decode(wire, error_policy="raw", columns=["properties"])
    assert raw.column("body").to_pylist()[1] == bad
    errors = raw.column("error").to_pylist()
    assert errors[0] is None and "runs past" in errors[1] and errors[2] is None
    assert raw.column("properties").to_pylist()[1] is None


def test_wrong_value_type_in_properties():
    # properties list [null, int 1]: user-id must be binary
    msg = b"\x00\x53\x73\xc0\x07\x02\x40\x71\x00\x00\x00\x01" + amqp_data(b"x")
    wire = deliver(chunk([simple_entry(msg)]))
    assert decode(wire).num_rows == 1                       # not looked at
    with pytest.raises(MalformedMessage):
        decode(wire, columns=["properties"])


def test_not_a_deliver_frame():
    with pytest.raises(ProtocolError, match="not a Deliver"):
        decode(b"\x00\x00\x00\x06\x00\x17\x00\x01\x00\x00")
    assert issubclass(CorruptChunk, StreamError)


# --- fuzzer findings --------------------------------------------------------

def test_fuzz_timestamp_overflow():
    with pytest.raises(CorruptChunk, match="timestamp"):
        decode(deliver(chunk([simple_entry(MSGS[0])], timestamp=2 ** 63 - 1)))


def test_fuzz_empty_binary_rendered_as_text():
    app = b"\x00\x53\x74\xc1\x06\x02\xa1\x01k\xa0\x00"     # {"k": b""}
    wire = deliver(chunk([simple_entry(app + amqp_data(b"x"))]))
    got = decode(wire, columns=["application_properties"])
    assert got.column("application_properties").to_pylist() == [[("k", "")]]


def test_fuzz_array_of_empty_items_is_bounded():
    # annotation value: array32 of 2**20 nulls (zero bytes each) would render
    # into megabytes of text from 14 input bytes
    array = b"\xf0" + struct.pack(">II", 5, 1 << 20) + b"\x40"
    body = b"\xa1\x01k" + array
    ann = b"\x00\x53\x72\xc1" + bytes([len(body) + 1, 2]) + body
    wire = deliver(chunk([simple_entry(ann + amqp_data(b"x"))]))
    with pytest.raises(MalformedMessage, match="text budget"):
        decode(wire, columns=["message_annotations"])
