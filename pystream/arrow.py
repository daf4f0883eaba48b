"""Arrow helpers the consumer and the producers share: row selection that
also works on ``binary_view`` columns, which Arrow 26 has no take or filter
kernels for, and what the producers accept as one RecordBatch."""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: What a producer publishes: bodies, or a batch or table with a body column.
Batch = Union[Sequence[bytes], pa.Array, pa.ChunkedArray, pa.RecordBatch, pa.Table]


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


def _take_views(array: pa.Array, rows: np.ndarray) -> pa.Array:
    buffers = array.buffers()
    views = np.frombuffer(buffers[1], dtype=np.uint64).reshape(-1, 2)
    gathered = views[array.offset:array.offset + len(array)][rows]
    validity = None
    if array.null_count:
        validity = pc.take(array.is_valid(), rows).buffers()[1]
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


def as_batch(messages: Batch) -> pa.RecordBatch:
    """What ``send_batch`` takes, as one RecordBatch with a body column."""
    if isinstance(messages, pa.Table):
        batches = messages.combine_chunks().to_batches()
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=messages.schema)
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    if isinstance(messages, pa.RecordBatch):
        if "body" not in messages.schema.names:
            raise ValueError("a RecordBatch to publish needs a body column")
        return messages
    if isinstance(messages, pa.ChunkedArray):
        messages = messages.combine_chunks()
    if not isinstance(messages, pa.Array):
        messages = pa.array(messages, pa.binary())
    return pa.RecordBatch.from_arrays([messages], names=["body"])
