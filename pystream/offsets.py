"""Offsets: where a subscription starts, and where a named consumer's
progress is stored.

An offset counts records (not entries, not chunks): the first record of a
stream is 0, and a sub-batch of 100 records occupies 100 offsets.
A consumer's *position* is the offset of the next record it will hand to the
application; the broker stores, for a consumer name, the offset of a record
before it: the last one handed (``position - 1``, as the other clients do) on
a clean close or ``store_offset()``, otherwise the last one the application
processed (it came back for more after it). docs/consuming.md has the table.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from . import protocol as P

#: What ``Client.consumer(offset=...)`` accepts.
Offset = str | int | dt.datetime

NAMED = {"first": P.OFFSET_FIRST, "last": P.OFFSET_LAST, "next": P.OFFSET_NEXT}


def offset_spec(offset: Offset) -> P.OffsetSpec:
    """The Subscribe offset for ``"first"``, ``"last"`` (the last chunk),
    ``"next"`` (records written from now on), an offset, or a time (the
    first chunk written at or after it; naive datetimes are local time)."""
    if isinstance(offset, str):
        try:
            return P.OffsetSpec(NAMED[offset])
        except KeyError:
            raise ValueError(f"offset must be 'first', 'last', 'next', an int "
                             f"or a datetime, not {offset!r}") from None
    if isinstance(offset, bool):
        raise TypeError("offset must not be a bool")
    if isinstance(offset, int):
        if not 0 <= offset < 1 << 64:
            raise ValueError(f"offset {offset} is out of range")
        return P.OffsetSpec(P.OFFSET_OFFSET, offset)
    if isinstance(offset, dt.datetime):
        return P.OffsetSpec(P.OFFSET_TIMESTAMP, int(offset.timestamp() * 1000))
    raise TypeError(f"offset must be str, int or datetime, not "
                    f"{type(offset).__name__}")


class OffsetTracker:
    """Stores a named consumer's position every ``every_records`` records or
    ``every_seconds`` seconds (checked as records are handed), and on demand.
    It is given a position (the next offset) and ``store(offset)`` receives
    the offset before it: the consumer gives the position up to which the
    application processed (``Subscription.completed``), not the records it
    is handing, so an offset is never stored past failed work."""

    def __init__(self, store: Callable[[int], None], *, every_records: int,
                 every_seconds: float) -> None:
        self._store = store
        self.every_records = every_records
        self.every_seconds = every_seconds
        self.stored: int | None = None  # last offset stored
        self._pending_records = 0
        self._last_time = time.monotonic()

    def handed(self, records: int, position: int | None) -> None:
        self._pending_records += records
        if (self._pending_records >= self.every_records
                or time.monotonic() - self._last_time >= self.every_seconds):
            self.flush(position)

    def flush(self, position: int | None) -> None:
        """Store ``position - 1`` if it moved since the last store."""
        self._pending_records = 0
        self._last_time = time.monotonic()
        if position is None or position == 0:
            return
        last = position - 1
        if last != self.stored:
            self._store(last)
            self.stored = last
