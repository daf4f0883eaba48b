"""The ``rabbitmq_stream`` sink: ``df.write`` and ``writeStream``, each task
handing Spark's Arrow batches to a producer's C encoder.

Exactly-once for streaming queries rests on the broker's deduplication: a
named producer's publishing ids at or below the last one the broker stored
for that name are dropped. Each task publishes as ``{prefix}-{query id}-
{partition}`` (the query id survives restarts from the checkpoint) with ids
``batch id << 32 | n``, ``n`` counting from 1 the task's rows for that
target stream. A replayed micro-batch sends the same ids under the same
names, so what the broker already holds is dropped (the task skips those
rows before encoding them). This holds while a replay hands each partition
the same rows in the same order: a deterministic query over a replayable
source (rate, files, a stream), the same partitioning (Spark keeps
``spark.sql.shuffle.partitions`` in the checkpoint), and, with
``compression``, the same Arrow batch size
(``spark.sql.execution.arrow.maxRecordsPerBatch``), since ids then count
sub-batches. Speculative execution should stay off: two attempts of one
task publish under one name at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from ..errors import StreamDoesNotExist
from ..producer import CODECS, Producer, codec
from ..ranges import BrokerRef, client_for
from ..super_stream import hash_route
from .options import bool_option, broker_ref, int_option, normalize

if TYPE_CHECKING:
    from ..admin import Admin

#: Columns a row may carry to the sink, besides ``body``.
MESSAGE_COLUMNS = ("properties", "application_properties", "message_annotations")
#: Columns the source reads that the broker assigns anew: accepted, unused.
IGNORED_COLUMNS = ("stream", "offset", "chunk_timestamp")
#: Spark's local properties naming a streaming task's query and micro-batch.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"
ROUTING = ("hash", "key")


@dataclass(frozen=True)
class SinkConfig:
    """The sink's options, checked on the driver before any task runs."""

    broker: BrokerRef
    stream: str | None
    super_stream: str | None
    routing: str
    producer_name: str | None
    compression: str | None
    sub_batch_size: int
    max_in_flight: int
    amqp: bool
    columns: tuple[str, ...] = field(default=())  # message columns sent

    @classmethod
    def parse(cls, options: Any, schema: StructType, overwrite: bool) -> SinkConfig:
        if overwrite:
            raise ValueError("a stream is append-only: write with .mode('append')")
        opts = normalize(options)
        named = [k for k in ("stream", "superstream") if opts.get(k)]
        if len(named) != 1:
            raise ValueError("name the target with exactly one of the options "
                             f"stream and superstream (got {named or 'none'})")
        if "streams" in opts:
            raise ValueError("the sink writes to one stream (option stream) or "
                             "one super stream (superstream), not streams")
        compression = opts.get("compression", "none").lower()
        if compression not in CODECS[1:]:
            raise ValueError(f"option compression is one of {', '.join(CODECS[1:])}, "
                             f"not {compression!r}")
        routing = opts.get("routingstrategy", "hash").lower()
        if routing not in ROUTING:
            raise ValueError(f"option routingStrategy is hash or key, not {routing!r}")
        config = cls(
            broker=broker_ref(opts),
            stream=opts.get("stream"),
            super_stream=opts.get("superstream"),
            routing=routing,
            producer_name=opts.get("producername"),
            # With no sub-batch size set, messages go one per entry (None).
            compression=None if compression == "none" and "subbatchsize" not in opts
            else compression,
            sub_batch_size=int_option(opts, "subbatchsize", 1) or 100,
            max_in_flight=int_option(opts, "maxinflight", 1) or 100_000,
            amqp=bool_option(opts, "amqp", True),
            columns=_check_schema(schema, opts),
        )
        if "filter_value" in schema.names and config.compression is not None:
            raise ValueError("a filter_value column needs uncompressed entries: "
                             "drop the compression and subBatchSize options")
        config._check_target()
        return config

    def targets(self, client: Admin) -> list[str]:
        """The streams written: the stream, or the super stream's partitions."""
        if self.super_stream is not None:
            return client.partitions(self.super_stream)
        assert self.stream is not None  # parse requires one of the two
        return [self.stream]

    def _check_target(self) -> None:
        client = client_for(self.broker)
        if self.super_stream is not None:
            try:
                partitions = client.partitions(self.super_stream)
            except StreamDoesNotExist:
                partitions = []
            if not partitions:
                raise StreamDoesNotExist(
                    f"super stream {self.super_stream!r} does not exist: create it "
                    "first (pystream.connect(...).create_super_stream)")
        elif not client.stream_exists(self.targets(client)[0]):
            raise StreamDoesNotExist(
                f"stream {self.stream!r} does not exist: create it first "
                "(pystream.connect(...).create_stream, or rabbitmq-streams add_stream)")


def _check_schema(schema: StructType, opts: dict[str, str]) -> tuple[str, ...]:
    names = schema.names
    known = ("body", *MESSAGE_COLUMNS, "filter_value", "routing_key", *IGNORED_COLUMNS)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"rabbitmq_stream cannot write columns {unknown}: select "
                         f"body and any of {', '.join(known[1:])} (e.g. pack the "
                         "others into body with to_json(struct(...)))")
    if "body" not in names:
        raise ValueError("rabbitmq_stream writes a body column (binary or string): "
                         "select or alias one, e.g. df.select(col('value').alias('body'))")
    types = {f.name: f.dataType for f in schema.fields}
    if not isinstance(types["body"], (BinaryType, StringType)):
        raise ValueError(f"column body must be binary or string, not "
                         f"{types['body'].simpleString()}: cast it")
    for name in ("application_properties", "message_annotations"):
        t = types.get(name)
        if t is not None and not (isinstance(t, MapType)
                                  and isinstance(t.keyType, StringType)
                                  and isinstance(t.valueType, StringType)):
            raise ValueError(f"column {name} must be map<string,string>, not "
                             f"{t.simpleString()}")
    if "properties" in types and not isinstance(types["properties"], StructType):
        raise ValueError("column properties must be the struct the source reads "
                         "(option columns=properties)")
    for name in ("filter_value", "routing_key"):
        t = types.get(name)
        if t is not None and not isinstance(t, (StringType, BinaryType)):
            raise ValueError(f"column {name} must be a string, not {t.simpleString()}")
    if "superstream" in opts and "routing_key" not in names:
        raise ValueError("writing to a super stream routes each row by its "
                         "routing_key column: add one (a string)")
    if "superstream" not in opts and "routing_key" in names:
        raise ValueError("a routing_key column routes rows to a super stream's "
                         "partitions: write with the option superstream, or drop it")
    if not bool_option(opts, "amqp", True) and any(c in names for c in MESSAGE_COLUMNS):
        raise ValueError("amqp=false publishes bare bodies: drop the columns "
                         f"{', '.join(c for c in MESSAGE_COLUMNS if c in names)}")
    return tuple(c for c in MESSAGE_COLUMNS if c in names)


class SinkCommit(WriterCommitMessage):
    """What one task published: messages per target stream (including rows
    the broker already held, which a replay skips)."""

    def __init__(self, counts: dict[str, int], skipped: int) -> None:
        self.counts = counts
        self.skipped = skipped


class _Task:
    """One task's producers, one per target stream, named or not."""

    def __init__(self, config: SinkConfig, name: str | None, base: int | None) -> None:
        self.config = config
        self.client = client_for(config.broker)
        self.name = name
        self.base = base            # ids are base + n (n from 1) per stream
        self.targets = config.targets(self.client)
        self.producers: dict[str, Producer] = {}
        self.sent = dict.fromkeys(self.targets, 0)
        self.skipped = 0
        self.futures: list[Future[int]] = []
        self.routes: dict[Any, int] = {}  # routing key -> partition (key routing)

    def producer(self, stream: str) -> Producer:
        p = self.producers.get(stream)
        if p is None:
            c = self.config
            p = Producer(self.client, stream, name=self.name,
                         compression=codec(c.compression), sub_batch_size=c.sub_batch_size,
                         max_in_flight=c.max_in_flight, amqp=c.amqp)
            self.producers[stream] = p
        return p

    def publish(self, batch: pa.RecordBatch) -> None:
        if self.config.super_stream is None:
            self._send(self.targets[0], batch)
            return
        parts = self._route(batch.column("routing_key"))
        for i, stream in enumerate(self.targets):
            rows = np.nonzero(parts == i)[0]
            if len(rows) == len(parts):
                self._send(stream, batch)
            elif len(rows):
                self._send(stream, batch.take(rows))

    def _route(self, keys: pa.Array[Any]) -> np.ndarray:
        if keys.null_count:
            raise ValueError("a routing_key is null: every row needs one")
        if self.config.routing == "hash":
            return hash_route(keys, len(self.targets))
        super_stream = self.config.super_stream
        assert super_stream is not None  # publish routes only for a super stream
        unique = pc.unique(keys)
        for key in unique.to_pylist():
            if key not in self.routes:
                streams = self.client.route(super_stream,
                                            key.decode() if isinstance(key, bytes) else str(key))
                if not streams:
                    raise ValueError(f"routing key {key!r} matches no binding "
                                     f"of super stream {self.config.super_stream!r}")
                self.routes[key] = self.targets.index(streams[0])
        index = pc.index_in(keys, unique).to_numpy()
        partitions: np.ndarray = np.array([self.routes[k] for k in unique.to_pylist()])[index]
        return partitions

    def _send(self, stream: str, batch: pa.RecordBatch) -> None:
        producer = self.producer(stream)
        first = self.sent[stream] + 1           # n of the batch's first row
        self.sent[stream] += batch.num_rows
        publishing_id = None
        if self.base is not None:
            # Ids the broker already holds for this name came from an
            # earlier attempt of this task: skip their rows.
            held = producer.last_publishing_id - (self.base + first) + 1
            if held >= batch.num_rows:
                self.skipped += batch.num_rows
                return
            if held > 0:
                self.skipped += held
                batch, first = batch.slice(held), first + held
            publishing_id = self.base + first
        fv = batch.column("filter_value") if "filter_value" in batch.schema.names else None
        message = pa.RecordBatch.from_arrays(
            [batch.column(c) for c in ("body", *self.config.columns)],
            names=["body", *self.config.columns])
        self.futures.append(producer.send_batch(message, publishing_id=publishing_id,
                                                filter_values=fv))
        self.futures = [f for f in self.futures if not f.done() or f.exception()]

    def finish(self) -> SinkCommit:
        try:
            for p in self.producers.values():
                p.flush()
            for f in self.futures:
                f.result()  # PublishError if the broker refused a message
        finally:
            for p in self.producers.values():
                p.close()
        return SinkCommit(self.sent, self.skipped)


def _write(config: SinkConfig, batches: Iterator[pa.RecordBatch],
           name: str | None, base: int | None) -> SinkCommit:
    task = _Task(config, name, base)
    try:
        for batch in batches:
            if batch.num_rows:
                task.publish(batch)
    except BaseException:
        for p in task.producers.values():
            try:
                p.close(timeout=5.0)
            except Exception:
                pass  # the first error is the one to report
        raise
    return task.finish()


def _task_context() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the rabbitmq_stream writer runs in a Spark task")
    return context


class BatchWriter(DataSourceArrowWriter):
    """``df.write``: with ``producerName``, each task publishes as
    ``{producerName}-{partition}`` with ids ``job << 32 | n``, so a retried
    task does not publish its rows twice. ``job`` is the driver's clock in
    seconds, past the job the broker last stored for partition 0."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config
        self.job: int | None = None
        if config.producer_name is not None:
            client = client_for(config.broker)
            last = max(client.query_publisher_sequence(s, f"{config.producer_name}-0")
                       for s in config.targets(client))
            self.job = max(int(time.time()), (last >> 32) + 1)

    # pyspark's DataSourceArrowWriter narrows DataSourceWriter.write's rows to
    # Arrow batches itself, which mypy reports against the grandparent
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:  # type: ignore[override]
        if self.job is None:
            return _write(self.config, iterator, None, None)
        name = f"{self.config.producer_name}-{_task_context().partitionId()}"
        return _write(self.config, iterator, name, self.job << 32)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class StreamWriter(DataSourceStreamArrowWriter):
    """``writeStream``: exactly-once through named producers (see the
    module's notes)."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    # as BatchWriter.write: pyspark's Arrow writer narrows the rows itself
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:  # type: ignore[override]
        context = _task_context()
        query, batch = context.getLocalProperty(QUERY_ID), context.getLocalProperty(BATCH_ID)
        if query is None or batch is None:
            raise RuntimeError("the rabbitmq_stream stream writer runs in a "
                               "micro-batch query (no query or batch id found)")
        prefix = self.config.producer_name or "spark"
        name = f"{prefix}-{query}-{context.partitionId()}"
        return _write(self.config, iterator, name, int(batch) << 32)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
