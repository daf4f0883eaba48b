"""Type stubs of pystream._core, the C-backed decoder."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa

Buffer = bytes | bytearray | memoryview
Column = Literal["properties", "application_properties", "message_annotations", "header",
                 "footer"]
Body = Literal["view", "binary"]
ErrorPolicy = Literal["raise", "skip", "raw"]
Codec = Literal["none", "gzip", "snappy", "lz4", "zstd"]
Strings = pa.Array[Any] | pa.ChunkedArray[Any]

def crc32(data: Buffer, value: int = 0) -> int:
    """CRC-32 of ``data`` continuing from ``value``; same as zlib.crc32."""

def schema(*, columns: Iterable[Column] | None = None, body: Body = "view",
           error_policy: ErrorPolicy = "raise") -> pa.Schema: ...

def decode(buffer: Buffer, *, crc: bool = True, amqp: bool = True,
           start_offset: int = 0, columns: Iterable[Column] | None = None,
           body: Body = "view", error_policy: ErrorPolicy = "raise",
           max_subbatch_size: int = 64 << 20,
           max_chunk_size: int = 1 << 30) -> pa.RecordBatch: ...

class FrameReader:
    max_frame_size: int
    max_deliver_size: int
    def __init__(self, max_frame_size: int = 1048576) -> None: ...
    def writable(self, min_size: int = 65536) -> memoryview: ...
    def commit(self, n: int) -> None: ...
    def feed(self, data: Buffer) -> None: ...
    def next_frame(self) -> bytes | None: ...
    def buffered(self) -> int: ...

class Chunk:
    subscription_id: int
    batch: pa.RecordBatch
    first_offset: int
    num_records: int
    committed_chunk_id: int | None
    timestamp: int
    chunk_type: int
    size: int
    decode_ns: int
    @property
    def next_offset(self) -> int: ...

class StreamDecoder(FrameReader):
    def subscribe(self, subscription_id: int, *, crc: bool = True, amqp: bool = True,
                  start_offset: int = 0, columns: Iterable[Column] | None = None,
                  body: Body = "view", error_policy: ErrorPolicy = "raise",
                  max_subbatch_size: int = 64 << 20,
                  max_chunk_size: int = 1 << 30) -> None: ...
    def unsubscribe(self, subscription_id: int) -> None: ...
    def next_event(self) -> Chunk | bytes | None: ...

def encode_publish(publisher_id: int, first_publishing_id: int,
                   bodies: Strings | Sequence[bytes], *,
                   # a struct array and two map<string, string> ones, each
                   # checked at run time (a TypeError names a wrong type)
                   properties: pa.Array[Any] | None = None,
                   application_properties: pa.Array[Any] | None = None,
                   message_annotations: pa.Array[Any] | None = None,
                   filter_values: Strings | None = None, amqp: bool = True,
                   compression: Codec | None = None, sub_batch_size: int = 100,
                   max_frame_size: int = 1 << 20) -> tuple[pa.Buffer, np.ndarray]:
    """Size-prefixed Publish frames (v2 with filter values) and the number
    of messages of each entry (int64), one per publishing id from
    ``first_publishing_id``; no frame exceeds ``max_frame_size`` bytes with
    its size prefix (0: unlimited)."""

def murmur3_32(keys: Strings | Sequence[str | bytes | None],
               seed: int = 104729) -> np.ndarray:
    """MurmurHash3 x86_32 of each key (uint32; a null hashes as empty), as the
    stream clients route super stream messages."""
