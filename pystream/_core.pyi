"""Type stubs of pystream._core, the C-backed decoder."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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

def _code_paths() -> dict[str, str | int]:
    """The CRC-32 code this CPU runs and the two-thread CRC split."""

def crc32_implementation() -> str:
    """Which code computes crc32 on this build and CPU, in words."""
def codecs() -> tuple[Codec, ...]:
    """The sub-batch codecs this build can decode and encode."""
def check_codec(codec: Codec) -> None:
    """Raise CodecUnavailable if this build lacks ``codec``."""
def schema(*, columns: Iterable[Column] | None = None, body: Body = "view",
           error_policy: ErrorPolicy = "raise") -> pa.Schema:
    """The schema of the batches decoded with these options."""

def decode(buffer: Buffer, *, crc: bool = True, amqp: bool = True,
           start_offset: int = 0, columns: Iterable[Column] | None = None,
           body: Body = "view", error_policy: ErrorPolicy = "raise",
           max_subbatch_size: int = 64 << 20,
           max_chunk_size: int = 1 << 30) -> pa.RecordBatch:
    """Decode the size-prefixed Deliver frames (v1 or v2) in ``buffer`` into
    one ``pyarrow.RecordBatch``, in C, with no Python object per message.

    ``crc`` verifies each chunk's CRC-32; ``amqp=False`` keeps each entry's
    bytes as the body; records below ``start_offset`` are dropped;
    ``columns`` names the optional columns (``properties``,
    ``application_properties``, ``message_annotations``, ``header``,
    ``footer``); ``body`` is ``"view"`` (``binary_view`` pointing into
    ``buffer``) or ``"binary"``; ``error_policy`` says what a record that is
    not valid AMQP 1.0 does: ``"raise"`` ``MalformedMessage``, ``"skip"``, or
    ``"raw"`` (its bytes as body, the reason in an ``error`` column).
    ``max_subbatch_size`` and ``max_chunk_size`` bound decompression
    (``DecompressionLimit``). Corrupt input raises ``CorruptChunk`` or
    ``TruncatedFrame`` with the byte ``position``."""

def send_all(fd: int, data: Any, progress: list[int]) -> None: ...

class FrameReader:
    """Splits the bytes of a stream connection into frames:
    ``sock.recv_into(reader.writable())``, ``reader.commit(n)``, then
    ``next_frame()`` until it returns ``None``."""

    max_frame_size: int
    max_deliver_size: int
    def __init__(self, max_frame_size: int = 1048576) -> None: ...
    def writable(self, min_size: int = 65536) -> memoryview:
        """Free space at the end of the receive buffer, as a writable
        memoryview; write into it, then ``commit`` the count."""
    @property
    def last_arrival(self) -> float:
        """When bytes last came in, on the clock of ``time.monotonic``."""
    @property
    def unfinished(self) -> int:
        """Bytes still to come of a frame whose first bytes are in, else 0."""
    @property
    def frames_ready(self) -> bool:
        """Whether a whole frame waits in the buffer."""
    def commit(self, n: int) -> None:
        """``n`` bytes were written at the start of the last ``writable``."""
    def recv_rest(self, fd: int, slice_size: int = 1048576) -> bool:
        """Receive the rest of the frame begun from the blocking socket
        ``fd`` in ``MSG_WAITALL`` reads of at most ``slice_size`` bytes,
        each committed as it lands; False if the peer closed it first."""
    def feed(self, data: Buffer) -> None:
        """Append a copy of ``data`` (any bytes-like) to the buffer."""
    def next_frame(self) -> bytes | None:
        """The next complete frame without its size prefix, or ``None``."""
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""

class Chunk:
    """One Deliver frame of a subscription: its ``batch`` (``None`` while
    its decoding is deferred: ``decode()``), the chunk's ``first_offset``,
    ``num_records`` (dropped ones included), ``committed_chunk_id``
    (Deliver v2, else ``None``), ``timestamp`` (ms since the epoch, the
    broker's clock), ``chunk_type`` (0 user; 1, 2 tracking, no rows),
    ``size`` (frame bytes), ``decoded_size`` (the frame plus what decoding
    adds, from the headers: declared uncompressed sub-batches and 32 bytes
    a record) and ``decode_ns``; ``ticket`` is the admitting consumer's."""
    subscription_id: int
    batch: pa.RecordBatch | None
    first_offset: int
    num_records: int
    committed_chunk_id: int | None
    timestamp: int
    chunk_type: int
    size: int
    decoded_size: int
    decode_ns: int
    ticket: int | None
    @property
    def next_offset(self) -> int:
        """The offset that follows this chunk (records, not entries)."""
    def decode(self) -> None:
        """Decode a deferred chunk in this thread; nothing once decoded."""

class StreamDecoder(FrameReader):
    """A ``FrameReader`` that also decodes the Deliver frames of the
    subscriptions registered with ``subscribe``.

    ``next_event`` returns the next frame: a ``Chunk`` for a Deliver of a
    registered subscription, otherwise the frame's bytes (control frames and
    Deliver frames of other subscription ids, untouched), or ``None`` when
    no complete frame is buffered. Columns of ``body="view"`` batches point
    into the receive buffer, which stays alive (and out of reuse) while they
    do. ``admit``, if set, sees each chunk before it is decoded; False
    leaves it undecoded (its CRC checked) for ``Chunk.decode``."""
    admit: Callable[[Chunk], bool] | None
    def subscribe(self, subscription_id: int, *, crc: bool = True, amqp: bool = True,
                  start_offset: int = 0, columns: Iterable[Column] | None = None,
                  body: Body = "view", error_policy: ErrorPolicy = "raise",
                  max_subbatch_size: int = 64 << 20,
                  max_chunk_size: int = 1 << 30) -> None:
        """Decode this subscription's chunks with these options (those of
        ``decode``), replacing earlier ones; safe from any thread."""
    def unsubscribe(self, subscription_id: int) -> None:
        """Stop decoding this subscription's chunks (a no-op if unknown)."""
    def next_event(self) -> Chunk | bytes | None:
        """The next ``Chunk`` or control frame (bytes), or ``None``."""

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

class BatchHandoff:
    """Batches of ``schema`` that one thread hands over (``put``, then
    ``finish``) to the Arrow C stream ``capsule()`` exports; the stream's
    reader waits for them without the GIL."""
    schema: pa.Schema
    def __init__(self, schema: pa.Schema) -> None: ...
    def capsule(self) -> Any:
        """A new ``arrow_array_stream`` capsule reading this handoff."""
    def put(self, batch: pa.RecordBatch) -> bool:
        """Queue ``batch``, waiting for room; False once the stream was released."""
    def finish(self, error: BaseException | None = None) -> None:
        """No more batches; ``error`` ends the stream after the queued ones."""
