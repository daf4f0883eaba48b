"""A super stream's producer: messages routed to its partitions' producers
by key, as the Java and Go clients route them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._core import murmur3_32
from .arrow import Batch, as_batch, take_rows
from .producer import Producer

if TYPE_CHECKING:
    from .admin import Admin


class SuperStreamProducer:
    """Publishes to the partitions of a super stream, routing each message
    by ``routing_key``: the name of a column or application property, or a
    callable from the batch to keys (strings). The partition is
    ``(murmur3_32(utf8(key), seed 104729) & 0x7FFFFFFF) % partitions``, as the
    Java and Go clients route, so a key lands in the same partition whoever
    wrote it. ``route`` replaces that with a callable from the batch to
    partition indices. Other options as for ``Producer``."""

    def __init__(self, client: Admin, super_stream: str, *,
                 routing_key: str | Callable[[pa.RecordBatch], Any] | None = None,
                 route: Callable[[pa.RecordBatch], Any] | None = None,
                 **options: Any) -> None:
        if (routing_key is None) == (route is None):
            raise ValueError("give routing_key or route")
        self.client = client
        self.super_stream = super_stream
        self.partitions = client.partitions(super_stream)
        self.routing_key = routing_key
        self.route = route
        self._producers = [Producer(client, p, **options) for p in self.partitions]

    def __enter__(self) -> SuperStreamProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partition_of(self, batch: pa.RecordBatch) -> np.ndarray:
        """The partition index of each message of ``batch``."""
        if self.route is not None:
            return np.asarray(self.route(batch), dtype=np.int64)
        return hash_route(self._keys(batch), len(self.partitions))

    def _keys(self, batch: pa.RecordBatch) -> Any:
        key = self.routing_key
        assert key is not None  # without route, __init__ required a routing_key
        if callable(key):
            return key(batch)
        if key in batch.schema.names:
            return batch.column(key)
        return pc.map_lookup(batch.column("application_properties"),
                             pa.scalar(key), "first")

    def send_batch(self, messages: Batch) -> Future[None]:
        """Route and publish; the future resolves when every partition
        confirmed its share."""
        batch = as_batch(messages)
        parts = self.partition_of(batch)
        futures: list[Future[int]] = []
        for i, producer in enumerate(self._producers):
            rows = np.nonzero(parts == i)[0]
            if len(rows):
                futures.append(producer.send_batch(take_rows(batch, rows)))
        return _all_of(futures)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every partition's producer has all its confirms (at
        most ``timeout`` seconds each)."""
        for p in self._producers:
            p.flush(timeout)

    def close(self) -> None:
        """Flush and close every partition's producer."""
        for p in self._producers:
            p.close()


def _all_of(futures: list[Future[int]]) -> Future[None]:
    combined: Future[None] = Future()
    if not futures:
        combined.set_result(None)
        return combined
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(f: Future[int]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        error = f.exception()
        if error is not None and not combined.done():
            combined.set_exception(error)
        elif last and not combined.done():
            combined.set_result(None)

    for f in futures:
        f.add_done_callback(one_done)
    return combined


def hash_route(keys: Any, partitions: int) -> np.ndarray:
    """The partition index of each key (strings), as the Java and Go clients
    route: ``(murmur3_32(utf8(key), seed 104729) & 0x7FFFFFFF) % partitions``."""
    hashes = murmur3_32(keys).astype(np.int64) & 0x7FFFFFFF
    return hashes % partitions
