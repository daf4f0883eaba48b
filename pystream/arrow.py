"""The Arrow helpers: row selection that also works on ``binary_view``
columns, which Arrow 26 has no take or filter kernels for; what the
producers accept as one RecordBatch; and batches as an Arrow C stream (the
PyCapsule interface, ``__arrow_c_stream__``), so DuckDB, Polars, pyarrow and
others read a stream's records as they come, without a copy where the
engine takes the batches' own types (``binary_view`` bodies: Polars and
DuckDB do)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._core import BatchHandoff

#: What a producer publishes: bodies, or a batch or table with a body column.
#: (A string: pyarrow's classes take no type arguments at run time.)
Batch: TypeAlias = ("Sequence[bytes] | pa.Array[Any] | pa.ChunkedArray[Any] | pa.RecordBatch"
                    " | pa.Table")


def take_rows(batch: pa.RecordBatch, rows: np.ndarray) -> pa.RecordBatch:
    """``batch.take(rows)`` that also works on ``binary_view`` bodies: the
    16-byte views of the kept rows are gathered, the body bytes stay where
    they are."""
    keep = pa.array(rows, pa.int64())
    columns = []
    for column in batch.columns:
        if column.type == pa.binary_view():
            columns.append(_take_views(column, rows))
        else:
            columns.append(column.take(keep))
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _take_views(array: pa.Array[Any], rows: np.ndarray) -> pa.Array[Any]:
    buffers = array.buffers()
    views_buffer = buffers[1]
    assert views_buffer is not None  # a binary_view array always has its views
    views = np.frombuffer(memoryview(views_buffer), dtype=np.uint64).reshape(-1, 2)
    gathered = views[array.offset:array.offset + len(array)][rows]
    validity = None
    if array.null_count:
        validity = array.is_valid().take(rows).buffers()[1]
    return pa.Array.from_buffers(pa.binary_view(), len(rows),
                                 [validity, pa.py_buffer(gathered)] + buffers[2:])


def filter_batch(batch: pa.RecordBatch, mask: Any) -> pa.RecordBatch:
    """``batch.filter(mask)`` that also works on ``binary_view`` bodies."""
    mask = pa.array(mask, pa.bool_()) if not isinstance(mask, pa.Array) else mask
    return take_rows(batch, pc.indices_nonzero(mask.fill_null(False)).to_numpy())


def rows_matching(batch: pa.RecordBatch, expression: pc.Expression) -> np.ndarray:
    """Rows where ``expression`` holds, evaluated without the binary_view
    columns (no kernels for them)."""
    plain = [i for i, t in enumerate(batch.schema.types) if t != pa.binary_view()]
    table = pa.Table.from_batches([batch.select(plain)]).append_column(
        "__row", pa.array(np.arange(batch.num_rows)))
    return table.filter(expression).column("__row").to_numpy()


def binary_bodies(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its ``binary_view`` bodies copied into ``binary``: the
    copy owns its bytes, so it no longer holds the receive buffer the views
    point into."""
    i = batch.schema.get_field_index("body")
    field = batch.schema.field(i)
    return batch.set_column(i, field.with_type(pa.binary()),
                            batch.column(i).cast(pa.binary()))


def as_batch(messages: Batch) -> pa.RecordBatch:
    """What ``send_batch`` takes, as one RecordBatch with a body column."""
    if isinstance(messages, pa.Table):
        batches = messages.combine_chunks().to_batches()
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=messages.schema)
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)  # type: ignore[attr-defined]  # pyarrow 19+; pyarrow-stubs 20 lacks it
    if isinstance(messages, pa.RecordBatch):
        if "body" not in messages.schema.names:
            raise ValueError("a RecordBatch to publish needs a body column")
        return messages
    if isinstance(messages, pa.ChunkedArray):
        messages = messages.combine_chunks()
    if not isinstance(messages, pa.Array):
        messages = bytes_array(messages) or pa.array(messages, pa.binary())
    return pa.RecordBatch.from_arrays([messages], names=["body"])


def bytes_array(items: Sequence[Any]) -> pa.Array[Any] | None:
    """A list of ``bytes`` as a binary array over one joined buffer (None
    for anything else). ``pa.array`` on a list imports pandas the first
    time, to probe it: half a second on an idle machine, several on a busy
    one, inside the first ``send_batch``."""
    if not isinstance(items, list) or not all(type(x) is bytes for x in items):
        return None
    n = len(items)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, items), np.int64, n), out=offsets[1:])
    large = offsets[-1] >= 2**31
    offsets = offsets if large else offsets.astype(np.int32)
    return pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), n,
                                 [None, pa.py_buffer(offsets.data),
                                  pa.py_buffer(b"".join(items))])


#: Seconds without a batch after which a consumer's Arrow stream ends.
IDLE_END = 1.0


class ArrowStream:
    """Record batches of one ``schema``, read once: iterate them, call
    ``read_all()``, or hand the object to an engine that takes Arrow C
    streams (``duckdb.sql("... FROM rows")``, ``polars.DataFrame(rows)``)."""

    def __init__(self, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> None:
        self.schema = schema
        self._batches: Iterator[pa.RecordBatch] | None = iter(batches)

    def __repr__(self) -> str:
        state = "read" if self._batches is None else "unread"
        return f"<pystream.ArrowStream {state} {self.schema.names}>"

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        batches, self._batches = self._batches, None
        if batches is None:
            raise RuntimeError("an ArrowStream is read once, and this one was")
        return batches

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The batches as an Arrow C stream, cast to ``requested_schema``
        (a schema capsule) if given. A thread of its own reads them into
        the stream as the engine works on the ones before, which pulls
        without the GIL; an error ends the stream with its type and
        message, and the reading stops when the engine releases it."""
        batches, schema = iter(self), self.schema
        if requested_schema is not None:
            wanted = pa.Schema._import_from_c_capsule(requested_schema)
            if wanted != schema:
                batches, schema = (b.cast(wanted) for b in batches), wanted
        handoff = BatchHandoff(schema)
        capsule = handoff.capsule()
        threading.Thread(target=_hand_over, args=(batches, handoff), daemon=True,
                         name="pystream-arrow-stream").start()
        return capsule

    def read_all(self) -> pa.Table:
        return pa.Table.from_batches(list(self), schema=self.schema)


def _hand_over(batches: Iterator[pa.RecordBatch], handoff: BatchHandoff) -> None:
    try:
        for batch in batches:
            if not handoff.put(batch):
                break  # the engine stopped reading (a LIMIT)
    except BaseException as exc:
        handoff.finish(exc)
    else:
        handoff.finish()
    finally:
        # Ends a read_range's subscription now, not when the thread's
        # frame is collected.
        close = getattr(batches, "close", None)
        if close is not None:
            close()


class BatchSource(Protocol):
    """What ``consumer_stream`` reads: a ``Consumer`` (named by shape, so
    that this module imports no more of pystream than its C core)."""

    schema: pa.Schema

    def batches(self, *, timeout: float) -> Iterator[pa.RecordBatch]: ...


def consumer_stream(consumer: BatchSource, idle: float = IDLE_END) -> ArrowStream:
    """What ``consumer`` delivers until ``idle`` seconds pass without a
    batch (so an engine's scan ends once the stream's present is read)."""
    return ArrowStream(consumer.schema, consumer.batches(timeout=idle))
