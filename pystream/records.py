"""What the application sees of single records: ``Message``, a lazy view
of one row of a batch, and ``Filter``, broker-side filtering with a
vectorised post filter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .arrow import filter_batch, rows_matching, take_rows

PostFilter = pc.Expression | Callable[[pa.RecordBatch], Any]


@dataclass(frozen=True)
class Filter:
    """Broker-side filtering (RabbitMQ 3.13+): only chunks whose filter
    values include one of ``values`` (and, with ``match_unfiltered``, chunks
    written without filter values) are sent. The broker filters whole
    chunks, so records of other values still arrive: ``post_filter`` drops
    them, vectorised over each batch. It is an Arrow compute expression
    (``pc.field("application_properties")...``) or a callable taking the
    batch and returning a boolean mask or a filtered batch."""

    values: Sequence[str]
    match_unfiltered: bool = False
    post_filter: PostFilter | None = None

    def properties(self) -> dict[str, str]:
        """The Subscribe properties that ask the broker for this filter
        (``filter.N``, ``match-unfiltered``)."""
        props = {f"filter.{i}": v for i, v in enumerate(self.values)}
        props["match-unfiltered"] = "true" if self.match_unfiltered else "false"
        return props

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` without the rows ``post_filter`` rejects (all of it when
        there is no post filter)."""
        f = self.post_filter
        if f is None or batch.num_rows == 0:
            return batch
        if isinstance(f, pc.Expression):
            return take_rows(batch, rows_matching(batch, f))
        result = f(batch)
        if isinstance(result, pa.RecordBatch):
            return result
        return filter_batch(batch, result)


class Message:
    """One record of a batch, read lazily (a view, not a copy)."""

    __slots__ = ("_batch", "_row")

    def __init__(self, batch: pa.RecordBatch, row: int) -> None:
        self._batch = batch
        self._row = row

    def _get(self, column: str) -> Any:
        i = self._batch.schema.get_field_index(column)
        return None if i < 0 else self._batch.column(i)[self._row].as_py()

    @property
    def offset(self) -> int:
        """The record's offset in its stream."""
        offset: int = self._batch.column(0)[self._row].as_py()
        return offset

    @property
    def timestamp(self) -> Any:
        """The chunk's timestamp (a UTC datetime)."""
        return self._batch.column(1)[self._row].as_py()

    @property
    def body(self) -> bytes:
        """The body, as bytes."""
        body: bytes = self._batch.column(2)[self._row].as_py()
        return body

    @property
    def properties(self) -> dict[str, Any] | None:
        """The AMQP properties as a dict (``None`` when the column was not
        decoded or the message has none)."""
        properties: dict[str, Any] | None = self._get("properties")
        return properties

    @property
    def application_properties(self) -> dict[str, str] | None:
        """The application properties as a dict of strings (``None`` when the
        column was not decoded or the message has none)."""
        value = self._get("application_properties")
        return None if value is None else dict(value)

    @property
    def message_annotations(self) -> dict[str, str] | None:
        """The message annotations as a dict of strings (``None`` when the
        column was not decoded or the message has none)."""
        value = self._get("message_annotations")
        return None if value is None else dict(value)

    @property
    def header(self) -> dict[str, Any] | None:
        """The AMQP header as a dict (``None`` when the column was not decoded
        or the message has none)."""
        header: dict[str, Any] | None = self._get("header")
        return header

    def __repr__(self) -> str:
        return f"<Message offset={self.offset} body={self.body[:32]!r}>"
