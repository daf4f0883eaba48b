"""Smoke test of an installed pystream, without a broker: the C core loads
with its native libraries (ISA-L, zlib, lz4, zstd, snappy) and decodes two
real Deliver frames captured from RabbitMQ 3.10.8 (from
tests/data/golden/deliver/rabbitmq-3.10.8-v1: a chunk holding one gzip
sub-batch, and one of messages published over AMQP 0-9-1).

Run by the conda recipe's test (conda/meta.yaml) and by
tests/test_packaging.py in a fresh venv holding the wheel; the latter also
checks these frames and values against the golden capture.
"""

import hashlib
import zlib

import pystream
from pystream import _core

# Size-prefixed Deliver frames (v1), as read off the socket.
GZIP_FRAME = bytes.fromhex(
    "0000015e00080001015000000100000003000001a1fd6c51890000000000000001000000"
    "000000003b2a8f5f0d0000012900000014000000009000030000021a0000011e1f8b0800"
    "6863016b02ff6360605463082eddc0c0c0286762606e6064646a64666035cac460323030"
    "4803436a8198a185a1a1a5b9a999a989151213287d16247de257986ad114ee1fdb22ecce"
    "4c6051bccaa82015fa366287f7e56bf73fa46a5c3871dccbccf5ed5e9903331d6b4f572a"
    "777f0c0d7dea2ff6dfa874fd0b81f4a712dd95d37e0816aaedbd28c1d5fa32fbd69deea3"
    "d667eecc5ba6d7d6f2a162bd66e986add2cec972526f3304a71e8a34ca2f583475eefb25"
    "0e85bce521dc77377fcdd8f160dfb1ed470d172ddb10b1b8f15de0dd7dd6077d52ba6665"
    "eb7632ccd1e07c3599efcf3a83898755fd5db67dfedccfc9ebbeeed544d1fe93fff8c28d"
    "57dc14aae5bd15e232bdf9dffac75f645714ac090400f2bba07b1a020000"
)
AMQP091_FRAME = bytes.fromhex(
    "000001c700080001015000000200000002000001a1fd6c53b10000000000000001000000"
    "00000000d6005be2e3000001920000002c00000000000000c5005372c15508a30d782d72"
    "6f7574696e672d6b6579a108676f6c64656e2d31a30a782d65786368616e6765a100a310"
    "782d62617369632d7072696f726974795003a315782d62617369632d64656c6976657279"
    "2d6d6f64655002005373c0390da1076d69642d312d30404040a1027271a106636f72722d"
    "30a30a746578742f706c61696ea3057574662d3840830000018bcfe56800404040005374"
    "c11504a105682d737472a1027630a105682d696e74542a005375a00e616d717030393120"
    "626f64792030000000c5005372c15508a30d782d726f7574696e672d6b6579a108676f6c"
    "64656e2d31a30a782d65786368616e6765a100a310782d62617369632d7072696f726974"
    "795003a315782d62617369632d64656c69766572792d6d6f64655002005373c0390da107"
    "6d69642d312d31404040a1027271a106636f72722d31a30a746578742f706c61696ea305"
    "7574662d3840830000018bcfe56be8404040005374c11504a105682d737472a1027631a1"
    "05682d696e74542b005375a00e616d717030393120626f64792031"
)

# One per record, from the capture's expected.json ("body" as its SHA-256).
EXPECTED = [
    {"offset": 59, "kind": "sub-batch-1",
     "body": "369c02b413a72f67862af7f4d5dd63e7502a0879f7e1b5ba9db5d3c62bcf0990"},
    {"offset": 60, "kind": "sub-batch-1",
     "body": "c90cde4a427cda2640c86eeee8332e318c47d9b76acfa3d63e2daaef907d45cb"},
    {"offset": 61, "kind": "sub-batch-1",
     "body": "2d3680ca881b065c12d9e2d24d9c3a684e24e3a08fc5a44db46e1919b1499326"},
    {"offset": 214, "kind": "amqp091",
     "body": "acaab8c614d757f03b5ae61511be3a3df277c468522aa012a1a82d9ccd2c664a",
     "message_id": "mid-1-0", "correlation_id": "corr-0",
     "content_type": "text/plain", "content_encoding": "utf-8",
     "reply_to": "rq", "creation_time_ms": 1700000000000,
     "app": {"h-str": "v0", "h-int": 42}},
    {"offset": 215, "kind": "amqp091",
     "body": "39dc7b10b6367e740dffbf619ece198d12f995077ae8ddf53e2b6f5a7ecd90e4",
     "message_id": "mid-1-1", "correlation_id": "corr-1",
     "content_type": "text/plain", "content_encoding": "utf-8",
     "reply_to": "rq", "creation_time_ms": 1700000001000,
     "app": {"h-str": "v1", "h-int": 43}},
]
PROPERTIES = ("message_id", "correlation_id", "content_type",
              "content_encoding", "reply_to")


def main() -> None:
    # CRC-32 (ISA-L) agrees with zlib's
    data = bytes(range(256)) * 64
    assert pystream.crc32(b"123456789") == 0xCBF43926
    assert pystream.crc32(data) == zlib.crc32(data)

    batch = pystream.decode(GZIP_FRAME + AMQP091_FRAME,
                            columns=["properties", "application_properties"])
    rows = batch.to_pylist()
    assert len(rows) == len(EXPECTED), len(rows)
    for exp, row in zip(EXPECTED, rows):
        assert row["offset"] == exp["offset"], (row["offset"], exp)
        assert hashlib.sha256(row["body"]).hexdigest() == exp["body"], exp
        if exp["kind"] == "amqp091":
            props = row["properties"]
            for key in PROPERTIES:
                assert props[key] == exp[key], (key, props[key], exp)
            created = props["creation_time"].timestamp() * 1000
            assert created == exp["creation_time_ms"], (created, exp)
            assert dict(row["application_properties"]) == {
                k: str(v) for k, v in exp["app"].items()}

    # the chunk CRC is checked: one flipped bit is refused
    corrupt = bytearray(GZIP_FRAME)
    corrupt[-1] ^= 1
    try:
        pystream.decode(bytes(corrupt))
    except pystream.CorruptChunk:
        pass
    else:
        raise AssertionError("a corrupt chunk was decoded")

    # every codec compresses (each library is called, not only linked)
    bodies = [b"pystream " * 100] * 20
    plain, _ = _core.encode_publish(1, 0, bodies, compression="none")
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        frames, counts = _core.encode_publish(1, 0, bodies, compression=codec)
        assert list(counts) == [20] and frames.size < plain.size / 4, codec

    print(f"pystream {pystream.__version__}: the C core decodes golden frames")


if __name__ == "__main__":
    main()
