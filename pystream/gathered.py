"""The single messages ``Producer.send`` gathers: what is checked as each
is given, and the batch (in the consumer's schema) they are sent as."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from ._core import schema

#: A message ``send`` buffers: body, properties, application properties,
#: message annotations, filter value, and its future.
Row = tuple[bytes, dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None,
            str | None, Future[int]]

PROPERTIES = schema(columns=["properties"]).field("properties").type
STRING_MAP = pa.map_(pa.string(), pa.string())


def rows_batch(rows: list[Row]) -> tuple[pa.RecordBatch, pa.Array[Any] | None]:
    """The messages as one batch, and their filter values if any was given."""
    bodies, props, app, ann, filters, _ = zip(*rows, strict=True)
    columns: dict[str, pa.Array[Any]] = {"body": pa.array(bodies, pa.binary())}
    if any(p is not None for p in props):
        columns["properties"] = pa.array(props, PROPERTIES)
    for key, values in (("application_properties", app),
                        ("message_annotations", ann)):
        if any(v is not None for v in values):
            columns[key] = pa.array(
                [None if v is None else [(str(k), str(x)) for k, x in v.items()]
                 for v in values], STRING_MAP)
    filter_values = (pa.array(filters, pa.string())
                     if any(f is not None for f in filters) else None)
    return pa.RecordBatch.from_pydict(columns), filter_values


def check_symbols(properties: dict[str, Any] | None,
                  message_annotations: dict[str, Any] | None) -> None:
    """AMQP symbols are ASCII; the encoder refuses others too, but a single
    message is encoded later, with its batch."""
    for name in ("content_type", "content_encoding"):
        value = (properties or {}).get(name)
        if isinstance(value, str) and not value.isascii():
            raise ValueError(f"{name} is not ASCII (an AMQP symbol): {value!r}")
    for key in message_annotations or {}:
        if not str(key).isascii():  # keys are encoded as str(key)
            raise ValueError(f"message_annotations: the key {key!r} is not ASCII "
                             "(keys are AMQP symbols)")

