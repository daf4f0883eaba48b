"""A super stream's producer: messages routed to its partitions' producers
by key, as the Java and Go clients route them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import locks
from ._core import murmur3_32
from .arrow import Batch, as_batch, take_rows
from .confirms import ConfirmFuture
from .errors import PartitionsFailed, RoutingError
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
    partition indices. A message without a key (null or missing), or that
    ``route`` gives no valid index, fails the whole batch with
    ``RoutingError`` before anything is sent.

    With ``name``, each partition's producer is named so (the broker
    deduplicates per stream and name), and a batch sent again with the
    publishing ids of its first sending (``PartitionsFailed.resend_ids``)
    is stored once. Other options as for ``Producer``. An operation that
    fails on some partitions (``send_batch``, ``flush``, ``close``, opening
    the producers) raises ``PartitionsFailed`` naming each failed partition
    and its error, and what the others did; ``close`` and a failed
    ``__init__`` close every partition's producer whatever fails."""

    def __init__(self, client: Admin, super_stream: str, *,
                 routing_key: str | Callable[[pa.RecordBatch], Any] | None = None,
                 route: Callable[[pa.RecordBatch], Any] | None = None,
                 name: str | None = None, **options: Any) -> None:
        if (routing_key is None) == (route is None):
            raise ValueError("give routing_key or route")
        self.client = client
        self.super_stream = super_stream
        self.partitions = client.partitions(super_stream)
        self.routing_key = routing_key
        self.route = route
        self.name = name
        opened: dict[str, Producer] = {}
        failed: dict[str, BaseException] = {}
        try:
            for partition in self.partitions:
                try:
                    opened[partition] = Producer(client, partition, name=name,
                                                 **options)
                except Exception as exc:
                    failed[partition] = exc
        finally:
            if len(opened) < len(self.partitions):  # failed, or interrupted
                failed.update(_close_all(opened, 5.0))
        if failed:
            raise PartitionsFailed(
                f"super stream {super_stream!r}: opening its partitions' "
                "producers", failed=failed) from next(iter(failed.values()))
        self._producers = [opened[p] for p in self.partitions]

    def __enter__(self) -> SuperStreamProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def last_publishing_id(self, partition: str | int) -> int:
        """The last publishing id of a partition's producer (its name or
        index): the last one it sent, or the broker had for ``name``."""
        return self._producers[self._index(partition)].last_publishing_id

    def partition_of(self, batch: pa.RecordBatch) -> np.ndarray:
        """The partition index of each message of ``batch``; raises
        ``RoutingError`` for a message without a valid one."""
        if self.route is not None:
            return _checked_route(self.route(batch), batch.num_rows,
                                  len(self.partitions))
        return hash_route(self._keys(batch), len(self.partitions))

    def _keys(self, batch: pa.RecordBatch) -> Any:
        key = self.routing_key
        assert key is not None  # without route, __init__ required a routing_key
        if callable(key):
            keys = key(batch)
            if len(keys) != batch.num_rows:
                raise RoutingError(f"routing_key gave {len(keys)} keys for a "
                                   f"batch of {batch.num_rows} messages")
            return keys
        if key in batch.schema.names:
            return batch.column(key)
        if "application_properties" not in batch.schema.names:
            raise RoutingError(f"the batch has no column or application "
                               f"property {key!r} to route by", index=0)
        return pc.map_lookup(batch.column("application_properties"),
                             pa.scalar(key), "first")

    def send_batch(self, messages: Batch, *,
                   publishing_ids: Mapping[str | int, int] | None = None,
                   timeout: float | None = None) -> Future[None]:
        """Route and publish; the future resolves when every partition
        confirmed its share, or raises ``PartitionsFailed`` once every
        partition settled its share, if any failed. ``publishing_ids`` maps
        partitions (names or indices) to the publishing id of the first
        message of their share (``PartitionsFailed.resend_ids``); the
        others continue after their last. ``timeout`` bounds the call's
        waits for room in the partitions' in-flight windows. A batch
        nothing of which was sent raises ``PartitionsFailed`` at once."""
        deadline = None if timeout is None else time.monotonic() + timeout
        batch = as_batch(messages)
        parts = self.partition_of(batch)
        first_ids = {self.partitions[self._index(p)]: i
                     for p, i in (publishing_ids or {}).items()}
        unusable: dict[str, BaseException] = {}
        for partition, producer in zip(self.partitions, self._producers, strict=True):
            try:
                producer._check()  # closed or failed: nothing is sent
            except Exception as exc:
                unusable[partition] = exc
        if unusable:
            raise PartitionsFailed(f"super stream {self.super_stream!r}: "
                                   "send_batch sent nothing", failed=unusable)
        futures: dict[str, ConfirmFuture[int]] = {}
        failed: dict[str, BaseException] = {}
        for i, producer in enumerate(self._producers):
            rows = np.nonzero(parts == i)[0]
            if not len(rows):
                continue
            partition = self.partitions[i]
            share = batch if len(rows) == batch.num_rows else take_rows(batch, rows)
            left = (None if deadline is None
                    else max(deadline - time.monotonic(), 0.0))
            try:
                futures[partition] = producer.send_batch(
                    share, publishing_id=first_ids.get(partition), timeout=left)
            except Exception as exc:
                failed[partition] = exc
        if failed and not futures:
            raise PartitionsFailed(f"super stream {self.super_stream!r}: "
                                   "send_batch sent nothing", failed=failed)
        return _all_of(self.super_stream, futures, failed)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every partition's producer has all its confirms, at
        most ``timeout`` seconds in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failed: dict[str, BaseException] = {}
        for partition, p in zip(self.partitions, self._producers, strict=True):
            try:
                p.flush(None if deadline is None
                        else max(deadline - time.monotonic(), 0.0))
            except Exception as exc:
                failed[partition] = exc
        self._raise(failed, "flush")

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush and close every partition's producer (at most ``timeout``
        seconds in all), even when some fail."""
        self._raise(_close_all(dict(zip(self.partitions, self._producers,
                                        strict=True)), timeout), "close")

    def _raise(self, failed: dict[str, BaseException], what: str) -> None:
        if failed:
            succeeded = {p: producer.last_publishing_id for p, producer
                         in zip(self.partitions, self._producers, strict=True)
                         if p not in failed}
            raise PartitionsFailed(f"super stream {self.super_stream!r}: {what}",
                                   failed=failed, succeeded=succeeded
                                   ) from next(iter(failed.values()))

    def _index(self, partition: str | int) -> int:
        if isinstance(partition, str):
            if partition not in self.partitions:
                raise ValueError(f"{partition!r} is not a partition of super "
                                 f"stream {self.super_stream!r}: "
                                 f"{self.partitions}")
            return self.partitions.index(partition)
        if type(partition) is not int or not 0 <= partition < len(self.partitions):
            raise ValueError(f"partition {partition!r}: super stream "
                             f"{self.super_stream!r} has partitions 0 to "
                             f"{len(self.partitions) - 1}")
        return partition


def _close_all(producers: dict[str, Producer],
               timeout: float | None) -> dict[str, BaseException]:
    """Close every producer, at most ``timeout`` seconds in all; the errors
    by partition."""
    deadline = None if timeout is None else time.monotonic() + timeout
    failed: dict[str, BaseException] = {}
    for partition, p in producers.items():
        try:
            p.close(None if deadline is None
                    else max(deadline - time.monotonic(), 0.0))
        except Exception as exc:
            failed[partition] = exc
    return failed


def _all_of(super_stream: str, futures: dict[str, ConfirmFuture[int]],
            failed: dict[str, BaseException]) -> Future[None]:
    """A future for the partitions' futures: None once all succeeded, or
    ``PartitionsFailed`` (with ``failed``, those that raised before
    sending) once all settled."""
    combined: Future[None] = locks.Future()
    left = [len(futures)]
    lock = threading.Lock()

    def settle() -> None:
        errors = dict(failed)
        succeeded: dict[str, int] = {}
        ids: dict[str, tuple[int, int]] = {}
        for partition, f in futures.items():
            if f.publishing_ids is not None:
                ids[partition] = f.publishing_ids
            error = f.exception()
            if error is not None:
                errors[partition] = error
            else:
                succeeded[partition] = f.result()
        if errors:
            combined.set_exception(PartitionsFailed(
                f"super stream {super_stream!r}: send_batch", failed=errors,
                succeeded=succeeded, publishing_ids=ids))
        else:
            combined.set_result(None)

    def one_done(_: Future[int]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            settle()

    if not futures:
        settle()
    for f in futures.values():
        f.add_done_callback(one_done)
    return combined


def _checked_route(indices: Any, messages: int, partitions: int) -> np.ndarray:
    """What ``route`` returned, as partition indices, or ``RoutingError``
    naming the first message it gives no valid index."""
    if isinstance(indices, (pa.Array, pa.ChunkedArray)):
        if indices.null_count:
            first = int(np.flatnonzero(
                indices.is_null().to_numpy(zero_copy_only=False))[0])
            raise RoutingError(f"route gave no partition (null) for message "
                               f"{first}", index=first)
        indices = indices.to_numpy(zero_copy_only=False)
    out = np.asarray(indices)
    if out.size == 0 and messages == 0:
        return np.zeros(0, np.int64)
    if out.dtype.kind not in "iu":
        raise RoutingError(f"route must give integer partition indices, not "
                           f"{out.dtype} values")
    if out.shape != (messages,):
        raise RoutingError(f"route gave {out.size} partition indices for a "
                           f"batch of {messages} messages")
    bad = np.flatnonzero((out < 0) | (out >= partitions))
    if len(bad):
        first = int(bad[0])
        raise RoutingError(f"route gave partition {out[first]} for message "
                           f"{first}: the super stream has partitions 0 to "
                           f"{partitions - 1}", index=first)
    return out.astype(np.int64)


def hash_route(keys: Any, partitions: int) -> np.ndarray:
    """The partition index of each key (strings), as the Java and Go clients
    route: ``(murmur3_32(utf8(key), seed 104729) & 0x7FFFFFFF) % partitions``.
    A null key raises ``RoutingError`` (it has no partition)."""
    if isinstance(keys, (list, tuple)):
        keys = pa.array(keys)
    if isinstance(keys, (pa.Array, pa.ChunkedArray)) and keys.null_count:
        first = int(np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))[0])
        raise RoutingError(f"message {first} has no routing key (null or "
                           "missing)", index=first)
    hashes = murmur3_32(keys).astype(np.int64) & 0x7FFFFFFF
    return hashes % partitions
