"""Filters Spark pushes to a batch read (``DataSourceReader.pushFilters``),
turned into narrower offset ranges so that only the chunks they need are
read.

- ``stream`` ``=`` / ``IN``: only those streams (exact: Spark drops it).
- ``offset`` ``<``, ``<=``, ``>``, ``>=``: the range's ends (exact, since a
  range is trimmed to the offset at both ends: Spark drops it).
- ``offset`` ``=`` / ``IN``: a range per run of consecutive offsets (one
  span over them past ``MAX_POINT_RANGES`` runs); Spark still checks them.
- ``chunk_timestamp`` ``>``, ``>=``, ``=``: the range starts at the first
  chunk stored from a second before the bound, found with a timestamp
  subscription; Spark still checks them. Upper bounds (``<``, ``<=`` and
  the upper side of ``=``) narrow nothing: chunk timestamps are the clock of
  the node that led the stream when each chunk was written, and go
  backwards when leadership moves to a node whose clock is behind, so no
  offset proves that every later chunk is past the bound. Spark checks them
  on the rows read.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from ..bounds import StreamBounds, offset_at
from ..client import Client
from ..ranges import OffsetRange

#: Past this many runs of ``offset IN (...)``, one span covers them all.
MAX_POINT_RANGES = 100
#: How far before a timestamp bound a range starts.
TIME_MARGIN = dt.timedelta(seconds=1)

_LOWER = (GreaterThan, GreaterThanOrEqual)


@dataclass
class Pushed:
    """What the pushed filters allow: ``streams`` (None: all), offsets in
    ``[lo, hi)`` and in ``points`` (None: any), chunks from the first one
    stored at ``after`` on (None: unbounded)."""

    streams: set[str] | None = None
    lo: int = 0
    hi: int | None = None
    points: set[int] | None = None
    after: dt.datetime | None = None
    description: list[str] = field(default_factory=list)

    def push(self, filters: Iterable[Filter]) -> list[Filter]:
        """Take what narrows the ranges; the filters Spark must still apply."""
        rest = []
        for f in filters:
            column = getattr(f, "attribute", ())
            exact = None
            if column == ("stream",):
                exact = self._stream(f)
            elif column == ("offset",):
                exact = self._offset(f)
            elif column == ("chunk_timestamp",):
                if self._time(f):
                    self.description.append(repr(f))
            if exact is not None:
                self.description.append(repr(f))
            if not exact:
                rest.append(f)
        return rest

    def _stream(self, f: Filter) -> bool | None:
        if isinstance(f, EqualTo) and isinstance(f.value, str):
            names = {f.value}
        elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            names = set(f.value)
        else:
            return None
        self.streams = names if self.streams is None else self.streams & names
        return True

    def _offset(self, f: Filter) -> bool | None:
        value = getattr(f, "value", None)
        if isinstance(f, In):
            if not all(_is_number(v) for v in f.value):
                return None
            points = {int(v) for v in f.value if v == int(v)}
        elif not _is_number(value):
            return None
        elif isinstance(f, EqualTo):
            points = {int(value)} if value == int(value) else set()
        else:
            if isinstance(f, GreaterThan):
                self.lo = max(self.lo, math.floor(value) + 1)
            elif isinstance(f, GreaterThanOrEqual):
                self.lo = max(self.lo, math.ceil(value))
            elif isinstance(f, LessThan):
                self._below(math.ceil(value))
            elif isinstance(f, LessThanOrEqual):
                self._below(math.floor(value) + 1)
            else:
                return None
            return True
        self.points = points if self.points is None else self.points & points
        return False

    def _below(self, hi: int) -> None:
        self.hi = hi if self.hi is None else min(self.hi, hi)

    def _time(self, f: Filter) -> bool:
        value = getattr(f, "value", None)
        if not isinstance(value, dt.datetime):
            return False
        # A naive datetime is the Python worker's local time, as Spark made it.
        when = value if value.tzinfo else value.astimezone()
        if not isinstance(f, (*_LOWER, EqualTo)):
            return False  # an upper bound: see the module's docstring
        after = when - TIME_MARGIN
        self.after = after if self.after is None else max(self.after, after)
        return True

    def wants(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams

    def narrow(self, r: OffsetRange, client: Client,
               bounds: StreamBounds) -> list[OffsetRange]:
        """The parts of ``r`` the filters can match."""
        lo, hi = max(r.start, self.lo), r.end if self.hi is None else min(r.end, self.hi)
        if self.after is not None and lo < hi:
            lo = max(lo, offset_at(client, r.stream, self.after, bounds))
        if lo >= hi:
            return []
        if self.points is None:
            return [OffsetRange(r.stream, lo, hi)]
        points = sorted(p for p in self.points if lo <= p < hi)
        runs: list[list[int]] = []
        for p in points:
            if runs and runs[-1][1] == p:
                runs[-1][1] = p + 1
            else:
                runs.append([p, p + 1])
        if len(runs) > MAX_POINT_RANGES:
            runs = [[runs[0][0], runs[-1][1]]]
        return [OffsetRange(r.stream, a, b) for a, b in runs]


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)
