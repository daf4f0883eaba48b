"""Batches as an Arrow C stream (the PyCapsule interface,
``__arrow_c_stream__``), so DuckDB, Polars, pyarrow and others read a
stream's records as they come, without a copy where the engine takes the
batches' own types (``binary_view`` bodies: Polars and DuckDB do)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

import pyarrow as pa

if TYPE_CHECKING:
    from .consumer import Consumer

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
        reader = pa.RecordBatchReader.from_batches(self.schema, iter(self))
        return reader.__arrow_c_stream__(requested_schema)

    def read_all(self) -> pa.Table:
        return pa.Table.from_batches(list(self), schema=self.schema)


def consumer_stream(consumer: Consumer, idle: float = IDLE_END) -> ArrowStream:
    """What ``consumer`` delivers until ``idle`` seconds pass without a
    batch (so an engine's scan ends once the stream's present is read)."""
    return ArrowStream(consumer.schema, consumer.batches(timeout=idle))
