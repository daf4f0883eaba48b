"""Crafting stream frames byte by byte: AMQP 1.0 data messages, simple and
sub-batch entries, chunks and Deliver frames. The tests build their frames
with these, and so does the decoding benchmark (bench/bench_decode.py), which
must not import the tests: this module is their common ground."""

from __future__ import annotations

import gzip as _gzip
import struct as _struct
import zlib as _zlib


def amqp_data(body: bytes) -> bytes:
    """An AMQP 1.0 message made of one data section."""
    if len(body) < 256:
        return b"\x00\x53\x75\xa0" + bytes([len(body)]) + body
    return b"\x00\x53\x75\xb0" + _struct.pack(">I", len(body)) + body


def simple_entry(record: bytes) -> bytes:
    return _struct.pack(">I", len(record)) + record


def sub_batch(records: list[bytes], codec: int = 0,
              compress=None, announced: int | None = None) -> bytes:
    """A sub-batch entry; ``compress`` turns the plain bytes into the codec's
    (default: identity for codec 0, gzip for codec 1)."""
    plain = b"".join(simple_entry(r) for r in records)
    if compress is None:
        compress = {0: lambda b: b, 1: _gzip.compress}[codec]
    data = compress(plain)
    size = len(plain) if announced is None else announced
    return (bytes([0x80 | codec << 4]) + _struct.pack(">HII", len(records), size, len(data))
            + data)


def chunk(entries: list[bytes], num_records: int | None = None, *,
          first_offset: int = 0, timestamp: int = 1_700_000_000_000,
          chunk_type: int = 0, crc: int | None = None, magic: int = 0x50,
          data_length: int | None = None) -> bytes:
    """A 48-byte chunk header plus the entries (records counted from them
    unless given)."""
    data = b"".join(entries)
    if num_records is None:
        num_records = sum(_struct.unpack_from(">H", e, 1)[0] if e[0] & 0x80 else 1
                          for e in entries)
    return _struct.pack(
        ">BBHIqQQIIIB3x", magic, chunk_type, len(entries), num_records,
        timestamp, 1, first_offset,
        _zlib.crc32(data) if crc is None else crc,
        len(data) if data_length is None else data_length, 0, 0) + data


def deliver(chunk_bytes: bytes, *, version: int = 1, subscription_id: int = 0,
            committed_chunk_id: int = 0) -> bytes:
    """A size-prefixed Deliver frame around a chunk."""
    head = _struct.pack(">HHB", 0x0008, version, subscription_id)
    if version == 2:
        head += _struct.pack(">Q", committed_chunk_id)
    body = head + chunk_bytes
    return _struct.pack(">I", len(body)) + body
