"""Reading streams in parallel: offset ranges planned on the driver, read
on executors.

``plan_ranges`` turns streams and a start/end into ``OffsetRange`` s the way
Spark's Kafka source does (split in proportion to size up to
``min_partitions``, then cap each at ``max_records_per_partition``, never
below ``min_records_per_partition`` since every range re-reads its first
chunk). ``read_range`` reads one of them as Arrow batches; it can run in any
process, and keeps one client per broker and options per Python process.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Union

import numpy as np
import pyarrow as pa

from .client import Client
from .errors import RequestTimeout

#: ``"earliest"``, ``"latest"``, an offset, or one of those per stream.
Bound = Union[str, int]

POLL = 0.2  # seconds between looks at the position while no records come


@dataclass(frozen=True)
class OffsetRange:
    """Records ``start`` (inclusive) to ``end`` (exclusive) of ``stream``."""

    stream: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


_clients: dict[tuple, Client] = {}
_clients_pid = os.getpid()
_clients_lock = threading.Lock()


def _client(uri: str, options: dict[str, Any]) -> Client:
    """This process's client for ``uri`` (a forked worker gets its own)."""
    global _clients_pid
    key = (uri, tuple(sorted(options.items())))
    with _clients_lock:
        if os.getpid() != _clients_pid:
            _clients.clear()  # the parent's sockets are not ours
            _clients_pid = os.getpid()
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = Client(uri, **options)
        return client


def read_range(uri: str, stream: str, start: int, end: int, *,
               timeout: float = 60.0, connection_options: dict | None = None,
               **consumer_options: Any) -> Iterator[pa.RecordBatch]:
    """The records of ``stream`` from ``start`` up to ``end`` (exclusive) as
    Arrow batches, trimmed at both ends. ``consumer_options`` are those of
    ``Client.consumer``; ``RequestTimeout`` if no record comes for
    ``timeout`` seconds before ``end`` is reached."""
    if end <= start:
        return
    client = _client(uri, connection_options or {})
    with client.consumer(stream, offset=start, **consumer_options) as consumer:
        idle = 0.0
        # The position also moves past chunks without records (offset
        # tracking chunks), so it, not the rows, says when the range is done.
        while (consumer.position or start) < end:
            batch = next(iter(consumer.batches(POLL)), None)
            if batch is None:
                idle += POLL
                if idle >= timeout:
                    raise RequestTimeout(
                        f"{stream!r}: nothing after offset {consumer.position} "
                        f"for {timeout:g} s; the range ends at {end}")
                continue
            idle = 0.0
            offsets = batch.column(0).to_numpy()
            keep = int(np.searchsorted(offsets, end))
            if keep:
                yield batch if keep == batch.num_rows else batch.slice(0, keep)
            if keep < batch.num_rows:
                return


def stream_bounds(client: Client, stream: str) -> tuple[int, int]:
    """The first record's offset and the offset after the last chunk (both
    0 for an empty stream)."""
    with client.consumer(stream, offset="last", amqp=False) as consumer:
        for _ in consumer.batches(timeout=0.5):
            pass
        after_last = consumer.position or 0
    with client.consumer(stream, offset="first", amqp=False) as consumer:
        first = consumer.read(1, timeout=2.0).column(0)
    return (first[0].as_py() if len(first) else after_last), after_last


def plan_ranges(uri: str, streams: Iterable[str], start: Bound | dict = "earliest",
                end: Bound | dict = "latest", *, min_partitions: int | None = None,
                max_records_per_partition: int | None = None,
                min_records_per_partition: int = 100_000,
                connection_options: dict | None = None) -> list[OffsetRange]:
    """Concrete ranges covering ``start``..``end`` of each stream, resolved
    now (so every reader reads a fixed range)."""
    client = _client(uri, connection_options or {})
    ranges = []
    for stream in streams:
        first, after_last = stream_bounds(client, stream)
        lo = _resolve(start, stream, first, after_last)
        hi = _resolve(end, stream, first, after_last)
        if hi > lo:
            ranges.append(OffsetRange(stream, max(lo, first), min(hi, after_last)))
    return split_ranges([r for r in ranges if r.size > 0], min_partitions,
                        max_records_per_partition, min_records_per_partition)


def _resolve(bound: Bound | dict, stream: str, first: int, after_last: int) -> int:
    if isinstance(bound, dict):
        bound = bound.get(stream, "earliest")
    if bound == "earliest":
        return first
    if bound == "latest":
        return after_last
    if isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0:
        return bound
    raise ValueError(f"an offset bound is 'earliest', 'latest' or an offset "
                     f">= 0, not {bound!r}")


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None, min_records: int) -> list[OffsetRange]:
    """Split in proportion to size towards ``min_partitions`` ranges (no
    part below ``min_records``), then so that none holds more than
    ``max_records``."""
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = 1
        if min_partitions and total:
            parts = max(1, min(round(r.size / total * min_partitions),
                               r.size // max(1, min_records)))
        if max_records:
            parts = max(parts, math.ceil(r.size / max_records))
        cuts = [r.start + r.size * i // parts for i in range(parts + 1)]
        out += [OffsetRange(r.stream, a, b) for a, b in zip(cuts, cuts[1:])]
    return out
