"""The PySpark data source ``rabbitmq_stream`` (PySpark 4.2+), batch and
streaming, over the ranges of ``pystream.ranges``; its sink is ``sink.py``,
the filters it takes ``pushdown.py``.

The driver resolves every start and end to concrete offsets before a task
runs, so each task reads a fixed range and a retried task reads the same
records. Streaming offsets are ``{stream: next offset}``; Spark's checkpoint
is their only source of truth (``commit`` stores them on the broker under
``consumerName`` for monitoring alone).

Options (case-insensitive), all strings as Spark passes them:

- ``uri`` (no password in it), ``passwordEnv`` (default
  ``PYSTREAM_PASSWORD``), ``passwordFile``: see ``BrokerRef``.
- With a ``rabbitmq-stream+tls://`` URI: ``tlsCaFile``, ``tlsCertFile``,
  ``tlsKeyFile`` (paths that must exist on the driver and every executor)
  and ``saslMechanism`` (``PLAIN`` or ``EXTERNAL``): see ``BrokerRef``.
- One of ``stream``, ``streams`` (comma-separated) or ``superstream``.
- ``startingOffsets``: ``earliest``, ``latest`` or JSON ``{"s": offset}``
  (``-2`` earliest, ``-1`` latest, as in Spark's Kafka source; missing
  streams start at earliest). Default: earliest for batch, latest for
  streaming. ``startingTimestamp`` (ms since the epoch) overrides it.
- ``endingOffsets`` (batch): ``latest`` or JSON as above.
- ``minPartitions``, ``maxRecordsPerPartition``: how ranges are split
  (``minPartitions`` makes no range smaller than ``MIN_RANGE`` offsets).
- ``maxOffsetsPerTrigger`` (or ``maxRecordsPerTrigger``),
  ``maxBytesPerTrigger``, ``minOffsetsPerTrigger`` with ``maxTriggerDelay``
  (streaming): see ``triggers.py``.
- ``filterValues``, ``filterMatchUnfiltered``, ``filterProperty``: broker
  filtering and its client post-filter (``options.source_filter``).
- ``failOnDataLoss`` (default true): raise ``DataLoss`` when retention
  removed records a read needed, or a stream a streaming query reads was
  deleted and created again, instead of skipping them.
- ``columns``: optional columns, comma-separated (``properties``,
  ``application_properties``, ``message_annotations``, ``header``,
  ``footer``: the AMQP sections, as ``pystream.decode`` renders them).
- ``amqp`` (default true; false: bodies are the raw entries),
  ``readTimeout`` (seconds a task's read may make no progress, and
  planning may wait for the broker's answers, before it raises
  ``RequestTimeout``),
  ``consumerName`` (streaming: where ``commit`` stores offsets).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .._core import schema as core_schema
from ..bounds import stream_bounds
from ..client import Client
from ..errors import DataLoss, StreamDoesNotExist
from ..ranges import (
    MIN_RANGE,
    Bound,
    BrokerRef,
    OffsetRange,
    bound_for,
    client_for,
    read_range,
    resolve,
    split_ranges,
    start_offset,
)
from ..records import Filter as StreamFilter
from .options import bool_option, broker_ref, int_option, normalize, source_filter
from .pushdown import Pushed
from .sink import BatchWriter, SinkConfig, StreamWriter
from .triggers import TriggerLimits, share

if TYPE_CHECKING:
    from .._core import Column

log = logging.getLogger("pystream.spark")

OPTIONAL_COLUMNS: tuple[Column, ...] = (
    "properties", "application_properties", "message_annotations", "header", "footer")
#: A micro-batch offset as Spark stores it (JSON): stream -> offset or sentinel.
Offsets = dict[str, Any]
#: Rows per batch handed to Spark: queued chunks (some 8 000 records of
#: 100 B each) are joined up to this, since the JVM's cost per Arrow batch
#: it takes from a Python worker outweighs the copy (some 13 % less JVM CPU
#: time at 65 536 rows than at 8 192, for the no-I/O source and this one).
BATCH_ROWS = 65_536
#: Spark's Kafka source writes these for earliest and latest in JSON offsets.
JSON_SENTINELS = {-2: "earliest", -1: "latest"}


def arrow_schema(columns: Sequence[str] = ()) -> pa.Schema:
    """The Arrow schema of the rows: the stream, then the consumer's columns
    with bodies as ``binary`` (Spark has no view types)."""
    # in the core's order, as core_schema puts them anyway
    core = core_schema(columns=[c for c in OPTIONAL_COLUMNS if c in columns] or None,
                       body="binary")
    return pa.schema([pa.field("stream", pa.string(), nullable=False), *core])


@dataclass(frozen=True)
class _Config:
    """The options, parsed and checked once on the driver; picklable and
    free of secrets, so it travels to executors with the partitions."""

    broker: BrokerRef
    streams: tuple[str, ...]
    super_stream: str | None
    starting: Any  # a Bound, or a dict of them per stream
    ending: Any
    min_partitions: int | None
    max_records_per_partition: int | None
    triggers: TriggerLimits
    filter: StreamFilter | None
    fail_on_data_loss: bool
    columns: tuple[str, ...]
    amqp: bool
    read_timeout: float
    consumer_name: str | None

    @classmethod
    def parse(cls, options: Any, *, streaming: bool) -> _Config:
        opts = normalize(options)
        broker = broker_ref(opts)
        named = [k for k in ("stream", "streams", "superstream") if k in opts]
        if len(named) != 1:
            raise ValueError("name exactly one of the options stream, streams "
                             f"and superstream (got {named or 'none'})")
        streams: tuple[str, ...] = ()
        if "superstream" not in opts:
            streams = tuple(s.strip() for s in opts[named[0]].split(",") if s.strip())
            if not streams:
                raise ValueError(f"option {named[0]!r} names no stream")
        starting = _bounds_option(opts.get("startingoffsets"),
                                  "latest" if streaming else "earliest",
                                  "startingOffsets")
        millis = int_option(opts, "startingtimestamp", 0)
        if millis is not None:
            starting = dt.datetime.fromtimestamp(millis / 1000, dt.UTC)
        if streaming and "endingoffsets" in opts:
            raise ValueError("endingOffsets is for batch reads; a streaming "
                             "query ends when it is stopped")
        columns = tuple(c.strip() for c in opts.get("columns", "").split(",") if c.strip())
        unknown = set(columns) - set(OPTIONAL_COLUMNS)
        if unknown:
            raise ValueError(f"unknown columns {sorted(unknown)}; the optional "
                             f"columns are {', '.join(OPTIONAL_COLUMNS)}")
        return cls(
            broker=broker,
            streams=streams,
            super_stream=opts.get("superstream"),
            starting=starting,
            ending=_bounds_option(opts.get("endingoffsets"), "latest", "endingOffsets"),
            min_partitions=int_option(opts, "minpartitions", 1),
            max_records_per_partition=int_option(opts, "maxrecordsperpartition", 1),
            triggers=TriggerLimits.parse(opts),
            filter=source_filter(opts),
            fail_on_data_loss=bool_option(opts, "failondataloss", True),
            columns=columns,
            amqp=bool_option(opts, "amqp", True),
            read_timeout=float(opts.get("readtimeout", 60)),
            consumer_name=opts.get("consumername"),
        )

    def client(self) -> Client:
        return client_for(self.broker)

    def current_streams(self) -> tuple[str, ...]:
        if self.super_stream is None:
            return self.streams
        return tuple(self.client().partitions(self.super_stream))

    def partitions(self, ranges: list[OffsetRange]) -> list[InputPartition]:
        """The non-empty ranges, split as the options say, one per task."""
        parts = split_ranges([r for r in ranges if r.size > 0], self.min_partitions,
                             self.max_records_per_partition, MIN_RANGE)
        return [InputPartition(p) for p in parts]

    def _read_columns(self) -> list[str] | None:
        """The columns to decode: the post-filter needs application
        properties, whether or not they are selected."""
        wanted = set(self.columns)
        if self.filter is not None and self.filter.post_filter is not None:
            wanted.add("application_properties")
        return [c for c in OPTIONAL_COLUMNS if c in wanted] or None

    def read(self, partition: InputPartition,
             schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """One range as batches of ``schema`` (a selection of the columns).
        Spark hands ``InputPartition(None)`` when there were no ranges."""
        part = partition.value
        if part is None:
            return
        name = pa.scalar(part.stream, pa.string())
        # body="binary" (Spark has no view types) copies each body once,
        # after the consumer joins the chunks into a batch.
        for batch in read_range(self.broker, part.stream, part.start, part.end,
                                timeout=self.read_timeout,
                                fail_on_data_loss=self.fail_on_data_loss,
                                body="binary", amqp=self.amqp, max_batch_rows=BATCH_ROWS,
                                columns=self._read_columns(), filter=self.filter):
            yield pa.RecordBatch.from_arrays(
                [pa.repeat(name, batch.num_rows) if f.name == "stream"
                 else batch.column(f.name) for f in schema], schema=schema)


def _bounds_option(text: str | None, default: str, key: str) -> Any:
    """``earliest``, ``latest`` or a JSON object of offsets per stream."""
    text = (text or default).strip()
    if text in ("earliest", "latest"):
        return text
    try:
        spec = json.loads(text)
        if not isinstance(spec, dict):
            raise ValueError
        return {str(s): _json_bound(v) for s, v in spec.items()}
    except ValueError:
        raise ValueError(f"option {key} is 'earliest', 'latest' or a JSON "
                         f'object like {{"stream": 42}}, not {text!r}') from None


def _json_bound(value: Any) -> Bound:
    if isinstance(value, str) and value in ("earliest", "latest"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value in JSON_SENTINELS:
            return JSON_SENTINELS[value]
        if value >= 0:
            return value
    raise ValueError


def _schema(config: _Config) -> StructType:
    return from_arrow_schema(arrow_schema(config.columns), prefer_timestamp_ntz=False)


def _output_schema(schema: StructType, config: _Config) -> pa.Schema:
    """The Arrow schema Spark expects back: the user's selection of our
    columns, in the user's order."""
    ours = arrow_schema(config.columns)
    wanted = to_arrow_schema(schema, timezone="UTC")
    unknown = [n for n in wanted.names if n not in ours.names]
    if unknown:
        raise ValueError(f"rabbitmq_stream has no columns {unknown}; it has "
                         f"{ours.names} (optional ones through the columns option)")
    return wanted


class RabbitMQStreamDataSource(DataSource):
    """``spark.read.format("rabbitmq_stream")``: see the module's options."""

    @classmethod
    def name(cls) -> str:
        """The format's name: ``spark.read.format("rabbitmq_stream")``."""
        return "rabbitmq_stream"

    def schema(self) -> StructType:
        """The rows' schema: ``stream``, ``offset``, ``chunk_timestamp``, ``body``
        and the optional columns the ``columns`` option names."""
        return _schema(_Config.parse(self.options, streaming=False))

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader: offset ranges planned on the driver, read by the
        executors (narrowed by pushed-down filters when Spark pushes them)."""
        config = _Config.parse(self.options, streaming=False)
        if _planning_pushdown():
            return _PushingBatchReader(config, schema)
        return _BatchReader(config, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The streaming reader: micro-batches of offset ranges, their
        positions in Spark's checkpoint."""
        return _StreamReader(_Config.parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer (``df.write``): one producer per task; only
        ``append`` mode."""
        return BatchWriter(SinkConfig.parse(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming writer (``df.writeStream``): exactly once under the
        conditions the Spark page lists."""
        return StreamWriter(SinkConfig.parse(self.options, schema, overwrite))


class _BatchReader(DataSourceReader):
    def __init__(self, config: _Config, schema: StructType) -> None:
        self.config = config
        self.output = _output_schema(schema, config)
        self.pushed = Pushed()

    def partitions(self) -> Sequence[InputPartition]:
        config = self.config
        client = config.client()
        ranges = []
        for stream in config.current_streams():
            if not self.pushed.wants(stream):
                continue
            bounds = stream_bounds(client, stream, timeout=config.read_timeout)
            lo = start_offset(config.starting, client, stream, bounds,
                              config.fail_on_data_loss)
            hi = min(resolve(bound_for(config.ending, stream, "latest"), client,
                             stream, bounds), bounds.end)
            ranges += self.pushed.narrow(OffsetRange(stream, lo, hi), client, bounds)
        return config.partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.config.read(partition, self.output)


class _PushingBatchReader(_BatchReader):
    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        return self.pushed.push(filters)


def _planning_pushdown() -> bool:
    """Whether Spark is creating the reader to push filters into it. Spark
    refuses a reader that has ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is true (false by default),
    and creates the reader in its pushdown worker only when it is: a
    setting the reader cannot read itself."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back
    return False


def _initial(bound: Bound) -> Any:
    """A start as it is written in an offset: a number, or a sentinel the
    first micro-batch resolves (so a replay of it resolves the same way)."""
    if isinstance(bound, dt.datetime):
        return f"timestamp:{int(bound.timestamp() * 1000)}"
    return bound


def _from_offset(value: Any) -> Bound:
    if isinstance(value, str) and value.startswith("timestamp:"):
        millis = int(value.split(":", 1)[1])
        return dt.datetime.fromtimestamp(millis / 1000, dt.UTC)
    if isinstance(value, str | int):  # an offset, or "earliest" / "latest"
        return value
    raise ValueError(f"not a stream offset: {value!r}")


def _after_reset(prior: Any, stream: str, end: int, fail_on_data_loss: bool) -> Any:
    """The start of a stream whose end is now before the query's position
    ``prior`` (an offset from the checkpoint): ends never move back, so the
    stream was deleted and created again, and the records of the new one
    up to ``prior`` would be skipped. ``DataLoss`` with
    ``fail_on_data_loss``; else a warning and a start from its first record."""
    if not isinstance(prior, int) or prior <= end:
        return prior
    if fail_on_data_loss:
        raise DataLoss(f"{stream!r} ends at offset {end}, before the query's "
                       f"position {prior}: it was deleted and created again "
                       f"(failOnDataLoss=false reads it again from its start)")
    log.warning("stream %r ends at offset %d, before the query's position %d: "
                "it was deleted and created again; reading it from its start "
                "(failOnDataLoss=false)", stream, end, prior)
    return "earliest"


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, config: _Config, schema: StructType) -> None:
        self.config = config
        self.output = _output_schema(schema, config)
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow
        self.latest: dict[str, int] | None = None
        self.last_batch = time.monotonic()  # minOffsetsPerTrigger's delay

    def initialOffset(self) -> Offsets:
        return {s: _initial(bound_for(self.config.starting, s, "earliest"))
                for s in self.config.current_streams()}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.config.triggers.max_offsets
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        client = self.config.client()
        timeout = self.config.read_timeout
        self.target = {s: stream_bounds(client, s, timeout=timeout).end
                       for s in self.config.current_streams()}

    def reportLatestOffset(self) -> Offsets | None:
        return self.latest

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        config = self.config
        client = config.client()
        streams = list(dict.fromkeys([*start, *config.current_streams()]))
        starts: dict[str, int] = {}
        ends: dict[str, int] = {}
        for stream in streams:
            try:
                bounds = stream_bounds(client, stream, timeout=config.read_timeout)
            except StreamDoesNotExist:
                if config.fail_on_data_loss:
                    raise DataLoss(f"{stream!r} was deleted while the query "
                                   f"read it (failOnDataLoss=false drops it)") from None
                log.warning("stream %r was deleted while the query read it: "
                            "dropped from the query (failOnDataLoss=false)", stream)
                continue
            # A new super stream partition is read from its beginning.
            prior = _after_reset(start.get(stream, "earliest"), stream, bounds.end,
                                 config.fail_on_data_loss)
            lo = start_offset(_from_offset(prior), client, stream, bounds,
                              config.fail_on_data_loss)
            hi = bounds.end
            if self.target is not None:
                hi = min(hi, self.target.get(stream, lo))
            starts[stream], ends[stream] = lo, max(lo, hi)
        self.latest = ends
        if isinstance(limit, ReadMaxRows):
            ends = share(starts, ends, limit.max_rows)
        ends = config.triggers.admit(client, starts, ends,
                                     time.monotonic() - self.last_batch,
                                     available_now=self.target is not None)
        if ends != starts:
            self.last_batch = time.monotonic()
        return ends

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        config = self.config
        client = config.client()
        ranges = []
        for stream, hi in end.items():
            first = start.get(stream, "earliest")
            if first == "latest":
                continue  # the first micro-batch resolved "latest" to ``hi``
            if isinstance(first, int) and first > hi:
                # latestOffset found the stream created again (see _after_reset)
                first = _after_reset(first, stream, hi, config.fail_on_data_loss)
            if isinstance(first, int):
                lo = first  # read_range checks retention on the executor
            else:
                bounds = stream_bounds(client, stream, timeout=config.read_timeout)
                lo = start_offset(_from_offset(first), client, stream, bounds,
                                  config.fail_on_data_loss)
            ranges.append(OffsetRange(stream, lo, hi))
        return config.partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.config.read(partition, self.output)

    def commit(self, end: Offsets) -> None:
        name = self.config.consumer_name
        if not name:
            return
        client = self.config.client()
        for stream, offset in end.items():
            if isinstance(offset, int) and offset > 0:
                client.store_offset(stream, name, offset - 1)
