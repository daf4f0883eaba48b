"""The producer's frames read and patched where they lie, at the fixed
positions of their layouts (``protocol`` has the layouts as commands):
a fast producer writes runs of Publish frames and gets millions of
confirmed ids a second, too many to decode one command at a time."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import numpy as np

from .errors import TruncatedFrame

# A size-prefixed Publish frame: size u32, key u16, version u16, then these.
PUBLISH_PUBLISHER_ID_AT = 8
PUBLISH_COUNT_AT = 9


def publish_frames(data: memoryview) -> Iterator[tuple[memoryview, int]]:
    """Each size-prefixed Publish frame of a run written back to back (as
    the producer's encoder writes them), with its message count."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < PUBLISH_COUNT_AT + 4:
            raise TruncatedFrame("Publish frame header", position=pos)
        size, = struct.unpack_from(">I", data, pos)
        count, = struct.unpack_from(">I", data, pos + PUBLISH_COUNT_AT)
        if pos + 4 + size > len(data):
            raise TruncatedFrame(f"Publish frame of {size} bytes", position=pos)
        yield data[pos:pos + 4 + size], count
        pos += 4 + size


def join_publish_frames(frames: Iterable[memoryview], publisher_id: int) -> bytearray:
    """The frames back to back in one buffer, each now from ``publisher_id``
    (a producer that reconnected may have been given another one)."""
    out = bytearray()
    for frame in frames:
        start = len(out)
        out += frame
        out[start + PUBLISH_PUBLISHER_ID_AT] = publisher_id
    return out


# A PublishConfirm frame without its size prefix: key, version, the
# publisher id, then the array of publishing ids. A fast producer gets
# millions of ids a second, so they are read as one array, not as a tuple.
CONFIRM_PUBLISHER_ID_AT = 4
_CONFIRM_IDS_AT = 9


def confirmed_ids(frame: memoryview) -> np.ndarray:
    """The publishing ids of a PublishConfirm frame, as int64."""
    if len(frame) < _CONFIRM_IDS_AT:
        raise TruncatedFrame(f"PublishConfirm frame of {len(frame)} bytes",
                             position=0)
    count = int.from_bytes(frame[CONFIRM_PUBLISHER_ID_AT + 1:_CONFIRM_IDS_AT], "big")
    if _CONFIRM_IDS_AT + 8 * count > len(frame):
        raise TruncatedFrame(f"PublishConfirm of {count} ids in {len(frame)} bytes",
                             position=_CONFIRM_IDS_AT)
    return np.frombuffer(frame, dtype=">u8", count=count,
                         offset=_CONFIRM_IDS_AT).astype(np.int64)
