"""Reading and writing streams in parallel with Spark.

``plan_ranges`` and ``read_range`` (``pystream.ranges``, re-exported here;
no Spark needed) split streams into offset ranges and read one of them
anywhere, for ``mapInArrow``; ``RabbitMQStreamDataSource`` is the PySpark
data source and sink ``rabbitmq_stream`` (imported on first use: it needs
the ``spark`` extra).
"""

from __future__ import annotations

from typing import Any

from ..bounds import StreamBounds, stream_bounds
from ..ranges import BrokerRef, OffsetRange, plan_ranges, read_range, split_ranges

__all__ = ["BrokerRef", "OffsetRange", "StreamBounds", "plan_ranges",
           "read_range", "split_ranges", "stream_bounds",
           "RabbitMQStreamDataSource", "arrow_schema"]


def __getattr__(name: str) -> Any:
    if name in ("RabbitMQStreamDataSource", "arrow_schema"):
        from . import datasource
        return getattr(datasource, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
