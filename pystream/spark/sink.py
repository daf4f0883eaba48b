"""The ``rabbitmq_stream`` sink: ``df.write`` and ``writeStream``, each task
handing Spark's Arrow batches to a producer's C encoder.

Exactly-once rests on the broker's deduplication: a named producer's
publishing ids at or below the last one the broker stored for that name
are dropped. A streaming task publishes as ``{prefix}-{query id}-
{partition}`` (the query id survives restarts from the checkpoint), a
``df.write`` task with ``producerName`` as ``{producerName}-{partition}``;
ids are ``batch << 32 | n`` (``batch`` the micro-batch, or a job number
the broker hands out), ``n`` below 2**32.

A task cuts each target stream's rows into calls of ``call_rows`` rows
whatever Spark's Arrow batch sizes (``Calls``); call ``c`` owns the ids
from ``c * 2 * call_rows + 1``: its whole sub-batches (or, uncompressed,
its messages) count up from there, and a shorter last sub-batch is sent
alone under an id past ``call_rows`` that names the row it ends at. So the
broker's last id for the name says how many rows it holds, even when an
attempt was handed only part of its input and took that for the end (a
Python worker whose JVM died sees its Arrow stream end): a replay skips
those rows and sends the rest under higher ids. This holds while a replay
hands each partition the same rows in the same order with the same
``compression`` and ``subEntrySize``: a deterministic query over a
replayable source and the same partitioning (Spark keeps
``spark.sql.shuffle.partitions`` in the checkpoint). Sub-batches that a
frame could cut short are refused. Speculative execution should stay off:
two attempts of one task publish under one name at once.

A super stream's partitions are read once, on the driver, when the write
starts. A streaming task routing by hash records the list it routes by
(as an offset of ``{prefix}-{query id}-partitions`` on every partition,
``batch << 32 | crc32 of the names``) before it publishes, so a replay
after partitions were added routes as the first attempt did, and refuses
(``ExactlyOnceError``) a list it cannot rebuild.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

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

from ..client import Client
from ..errors import ExactlyOnceError, NoOffset, StreamDoesNotExist
from ..producer import CODECS, Producer, codec
from ..ranges import BrokerRef, client_for
from ..super_stream import hash_route
from .options import bool_option, broker_ref, int_option, normalize

#: Columns a row may carry to the sink, besides ``body``.
MESSAGE_COLUMNS = ("properties", "application_properties", "message_annotations")
#: Columns the source reads that the broker assigns anew: accepted, unused.
IGNORED_COLUMNS = ("stream", "offset", "chunk_timestamp")
#: Spark's local properties naming a streaming task's query and micro-batch.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"
ROUTING = ("hash", "key")
#: Rows of one publish call of a named producer (rounded up to whole
#: sub-batches): also the most ids one call may use.
CALL_ROWS = 10_000
#: A batch's (or job's) ids are its number << ID_BITS | n, n < 2**ID_BITS.
ID_BITS = 32
ID_MASK = (1 << ID_BITS) - 1
#: Bytes an encoded AMQP message adds around its values (sections,
#: descriptors), and each value around its data: generous upper bounds.
MESSAGE_OVERHEAD = 128
VALUE_OVERHEAD = 9
#: Seconds to wait for an offset the sink stored to be read back.
STORE_TIMEOUT = 30.0


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
    # The stream, or the super stream's partitions when the write started.
    streams: tuple[str, ...] = field(default=())

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
        return replace(config, streams=config._targets())

    @property
    def call_rows(self) -> int:
        """Rows per publish call of a named producer."""
        return call_rows(self.compression, self.sub_batch_size)

    def _targets(self) -> tuple[str, ...]:
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
            return tuple(partitions)
        assert self.stream is not None  # parse requires one of the two
        if not client.stream_exists(self.stream):
            raise StreamDoesNotExist(
                f"stream {self.stream!r} does not exist: create it first "
                "(pystream.connect(...).create_stream, or rabbitmq-streams add_stream)")
        return (self.stream,)


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


def call_rows(compression: str | None, sub_batch_size: int, target: int = CALL_ROWS) -> int:
    """Rows per publish call: ``target`` rounded up to whole sub-batches."""
    unit = 1 if compression is None else sub_batch_size
    return -(-target // unit) * unit


def resume_call(held: int, base: int, stride: int) -> int:
    """The first call a named producer sends, given the last id the broker
    holds for its name: the one that id falls in (0 when the broker holds
    none of ``base``'s ids)."""
    return 0 if held <= base else (held - base - 1) // stride


def row_bytes(column: pa.Array[Any]) -> np.ndarray:
    """Per row, at least the bytes ``column`` adds to an encoded message."""
    t = column.type
    data: np.ndarray
    if isinstance(column, pa.StructArray):
        data = sum((row_bytes(f) for f in column.flatten()), np.zeros(len(column), np.int64))
    elif isinstance(column, (pa.ListArray, pa.LargeListArray)):  # maps too
        values = np.concatenate([[0], np.cumsum(row_bytes(column.values))])
        offsets = column.offsets.to_numpy()
        data = values[offsets[1:]] - values[offsets[:-1]]
    elif isinstance(column, (pa.BinaryArray, pa.StringArray, pa.LargeBinaryArray,
                             pa.LargeStringArray)):
        data = pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    else:  # fixed width
        data = np.full(len(column), max(t.bit_width // 8, 1))
    return data.astype(np.int64) + VALUE_OVERHEAD


class Calls:
    """One target stream's rows under a named producer, cut into calls of
    ``call_rows`` rows whatever the sizes of the batches added. Call ``c``
    owns ids ``base + c * 2 * call_rows + 1`` on (``first``): its whole
    sub-batches of ``unit`` messages take ``first``, ``first + 1``..., and
    a shorter last one (the end of the task's rows, or of what it was
    handed before it was cut off) is sent alone as ``first + call_rows +
    end - 1``, ``end`` counting the call's rows up to its last. The
    broker's last id thus tells how many of the call's rows it holds: a
    replay skips them, and after a short sub-batch sends the rest as single
    sub-batches named by their end the same way."""

    def __init__(self, send: Callable[[pa.RecordBatch, int], None], base: int,
                 held: int, call_rows: int, unit: int, frame: int) -> None:
        self.send = send
        self.base = base
        self.held = held
        self.call_rows = call_rows
        self.unit = unit            # messages per sub-batch (1: one id each)
        self.frame = frame          # bytes a sub-batch must fit in
        self.resume = resume_call(held, base, 2 * call_rows)
        self.pending: deque[pa.RecordBatch] = deque()
        self.pending_rows = 0
        self.calls = 0
        self.skipped = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        while self.pending_rows >= self.call_rows:
            self._call(self._take(self.call_rows), final=False)

    def finish(self) -> None:
        """Send the last, shorter call."""
        if self.pending_rows:
            self._call(self._take(self.pending_rows), final=True)

    def _take(self, rows: int) -> pa.RecordBatch:
        parts = []
        self.pending_rows -= rows
        while rows:
            head = self.pending[0]
            if head.num_rows <= rows:
                parts.append(self.pending.popleft())
                rows -= head.num_rows
            else:
                parts.append(head.slice(0, rows))
                self.pending[0] = head.slice(rows)
                rows = 0
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    def _call(self, rows: pa.RecordBatch, final: bool) -> None:
        c, n = self.calls, rows.num_rows
        self.calls += 1
        if c < self.resume:
            self.skipped += n
            return
        if (c + 1) * 2 * self.call_rows > ID_MASK:
            raise ExactlyOnceError(
                f"a task sends more than {ID_MASK // 2 - self.call_rows} rows to one "
                "stream: its publishing ids would run into the next batch's "
                "(use more partitions)")
        first = self.base + c * 2 * self.call_rows + 1
        held, ends = 0, False           # rows of this call the broker holds
        if c == self.resume and self.held >= first:
            at = self.held - first
            ends = at >= self.call_rows
            held = at - self.call_rows + 1 if ends else (at + 1) * self.unit
        self.skipped += min(held, n)
        if held >= n:
            return
        self._check_frames(rows.slice(held))
        if ends:  # after a short sub-batch: one sub-batch per send, named by its end
            for at in range(held, n, self.unit):
                end = min(at + self.unit, n)
                self.send(rows.slice(at, end - at), first + self.call_rows + end - 1)
            return
        short = (n - held) % self.unit if final else 0
        if n - short > held:
            self.send(rows.slice(held, n - short - held), first + held // self.unit)
        if short:
            self.send(rows.slice(n - short), first + self.call_rows + n - 1)

    def _check_frames(self, rows: pa.RecordBatch) -> None:
        """Refuse sub-batches the encoder could cut short to fit a frame:
        their ids would no longer count whole sub-batches."""
        if self.unit == 1:
            return
        sizes = sum((row_bytes(c) for c in rows.columns), np.zeros(rows.num_rows, np.int64))
        sizes = np.concatenate([sizes + MESSAGE_OVERHEAD,
                                np.zeros(-len(sizes) % self.unit, np.int64)])
        worst = int(sizes.reshape(-1, self.unit).sum(axis=1).max())
        if worst + worst // 5 + 256 > self.frame:
            raise ExactlyOnceError(
                f"{self.unit} messages may take {worst} bytes, more than one "
                f"sub-entry can hold in a frame of {self.frame} bytes: exactly-once "
                "needs whole sub-entries (lower subEntrySize)")


def partitions_fingerprint(streams: Sequence[str]) -> int:
    """32 bits naming an ordered partition list."""
    return zlib.crc32("\n".join(streams).encode())


def replay_partitions(streams: Sequence[str], recorded: Sequence[int],
                      batch: int) -> tuple[str, ...] | None:
    """The partitions micro-batch ``batch`` routes by: those its first
    attempt recorded (``recorded``: the values found on ``streams``), the
    current ``streams`` or a prefix of them (partitions added since); None
    when no attempt recorded any (the caller records ``streams``)."""
    first = {v & ID_MASK for v in recorded if v >> ID_BITS == batch}
    if not first:
        return None
    for n in range(len(streams), 0, -1):
        if first == {partitions_fingerprint(streams[:n])}:
            return tuple(streams[:n])
    raise ExactlyOnceError(
        f"micro-batch {batch} was first written to other partitions than the "
        f"super stream has now ({', '.join(streams)}): its replay would route "
        "rows elsewhere and repeat or lose them. Restore the partitions (and "
        "their order) the query had until this batch is committed, or restart "
        "the query with a new checkpoint")


def _stored_offset(client: Client, stream: str, reference: str) -> int | None:
    try:
        return client.query_offset(stream, reference)
    except NoOffset:
        return None


def _store_everywhere(client: Client, streams: Sequence[str], reference: str,
                      value: int) -> None:
    """Store ``value`` under ``reference`` on ``streams`` and wait until the
    broker answers it back (storing is not acknowledged)."""
    for stream in streams:
        client.store_offset(stream, reference, value)
    deadline = time.monotonic() + STORE_TIMEOUT
    for stream in streams:
        while (got := _stored_offset(client, stream, reference)) != value:
            if got is not None and got > value:
                raise ExactlyOnceError(
                    f"{reference!r} on {stream!r} moved past {value} while it was "
                    "stored: another write under this name runs at once")
            if time.monotonic() > deadline:
                raise ExactlyOnceError(
                    f"the broker did not keep {reference!r} = {value} on {stream!r} "
                    f"within {STORE_TIMEOUT:.0f} s")
            time.sleep(0.01)


def route_partitions(client: Client, streams: Sequence[str], reference: str,
                     batch: int) -> tuple[str, ...]:
    """The partitions a streaming task of ``batch`` routes by hash: what its
    first attempt recorded under ``reference``, else ``streams``, recorded
    on each of them before any row is published."""
    recorded = [v for s in streams
                if (v := _stored_offset(client, s, reference)) is not None]
    replay = replay_partitions(streams, recorded, batch)
    if replay is not None:
        return replay
    if any(v >> ID_BITS > batch for v in recorded):
        return tuple(streams)  # an older batch again: the broker holds its ids
    _store_everywhere(client, streams, reference,
                      batch << ID_BITS | partitions_fingerprint(streams))
    return tuple(streams)


def next_job(client: Client, streams: Sequence[str], producer_name: str) -> int:
    """A job number past every job the broker knows under ``producer_name``
    on ``streams``: the counter kept there (an offset of
    ``{producer_name}-jobs``), and the jobs its partition 0 wrote (numbered
    before the counter). The counter is moved on before the job runs."""
    reference = f"{producer_name}-jobs"
    last = 0
    for stream in streams:
        last = max(last, _stored_offset(client, stream, reference) or 0,
                   client.query_publisher_sequence(stream, f"{producer_name}-0") >> ID_BITS)
    _store_everywhere(client, streams, reference, last + 1)
    return last + 1


class _Task:
    """One task's producers, one per target stream, named or not."""

    def __init__(self, config: SinkConfig, name: str | None, base: int | None,
                 streams: Sequence[str], later_ids: str | None = None) -> None:
        self.config = config
        self.client = client_for(config.broker)
        self.name = name
        self.base = base            # call ids are base + c * call_rows + 1 on
        # Why ids of a later batch under this name refuse the write (None:
        # the broker drops them, and they are skipped).
        self.later_ids = later_ids
        self.targets = list(streams)
        self.producers: dict[str, Producer] = {}
        self.calls: dict[str, Calls] = {}
        self.sent = dict.fromkeys(self.targets, 0)
        self.futures: list[Future[int]] = []
        self.routes: dict[Any, int] = {}  # routing key -> partition (key routing)

    @property
    def skipped(self) -> int:
        return sum(c.skipped for c in self.calls.values())

    def producer(self, stream: str) -> Producer:
        p = self.producers.get(stream)
        if p is None:
            c = self.config
            made = self.client.producer(stream, name=self.name,
                                        compression=codec(c.compression),
                                        sub_batch_size=c.sub_batch_size,
                                        max_in_flight=c.max_in_flight, amqp=c.amqp)
            assert isinstance(made, Producer)  # given a stream, not super_stream=
            self.producers[stream] = p = made
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
                if streams[0] not in self.targets:
                    raise ValueError(f"routing key {key!r} routes to {streams[0]!r}, "
                                     "a partition added after the write started")
                self.routes[key] = self.targets.index(streams[0])
        index = pc.index_in(keys, unique).to_numpy()
        partitions: np.ndarray = np.array([self.routes[k] for k in unique.to_pylist()])[index]
        return partitions

    def _send(self, stream: str, batch: pa.RecordBatch) -> None:
        self.sent[stream] += batch.num_rows
        names = ["body", *self.config.columns]
        if "filter_value" in batch.schema.names:
            names.append("filter_value")
        message = batch.select(names)
        if self.base is None:
            self._publish(stream, message, None)
            return
        calls = self.calls.get(stream)
        if calls is None:
            # The broker's last id for the name, before this task sent any.
            held = self.producer(stream).last_publishing_id
            if self.later_ids is not None and held >> ID_BITS > self.base >> ID_BITS:
                raise ExactlyOnceError(
                    f"{self.name!r} holds publishing id {held} on {stream!r}, past "
                    f"this write's ({self.base >> ID_BITS} << {ID_BITS}): "
                    f"{self.later_ids}")
            c = self.config
            calls = self.calls[stream] = Calls(
                lambda rows, first: self._publish(stream, rows, first),
                self.base, held, c.call_rows, 1 if c.compression is None else c.sub_batch_size,
                self.client.connection.frame_max or (1 << 20))
        calls.add(message)

    def _publish(self, stream: str, message: pa.RecordBatch, publishing_id: int | None) -> None:
        fv = None
        if "filter_value" in message.schema.names:
            fv = message.column("filter_value")
            message = message.drop_columns(["filter_value"])
        self.futures.append(self.producer(stream).send_batch(
            message, publishing_id=publishing_id, filter_values=fv))
        self.futures = [f for f in self.futures if not f.done() or f.exception()]

    def finish(self) -> SinkCommit:
        try:
            for calls in self.calls.values():
                calls.finish()
            for p in self.producers.values():
                p.flush()
            for f in self.futures:
                f.result()  # PublishError if the broker refused a message
        finally:
            for p in self.producers.values():
                p.close()
        return SinkCommit(self.sent, self.skipped)


def _write(task: _Task, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
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
    task does not publish its rows twice. ``job`` is one past every job the
    broker knows under the name (``next_job``), taken on the driver."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config
        self.job: int | None = None
        if config.producer_name is not None:
            self.job = next_job(client_for(config.broker), config.streams,
                                config.producer_name)

    # pyspark's DataSourceArrowWriter narrows DataSourceWriter.write's rows to
    # Arrow batches itself, which mypy reports against the grandparent
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:  # type: ignore[override]
        if self.job is None:
            return _write(_Task(self.config, None, None, self.config.streams), iterator)
        name = f"{self.config.producer_name}-{_task_context().partitionId()}"
        later = ("another job under this producerName ran at once, or after it "
                 "(run one job per name at a time)")
        return _write(_Task(self.config, name, self.job << ID_BITS, self.config.streams,
                            later_ids=later), iterator)

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
        prefix = f"{self.config.producer_name or 'spark'}-{query}"
        streams: Sequence[str] = self.config.streams
        if self.config.super_stream is not None and self.config.routing == "hash":
            streams = route_partitions(client_for(self.config.broker), streams,
                                       f"{prefix}-partitions", int(batch))
        name = f"{prefix}-{context.partitionId()}"
        return _write(_Task(self.config, name, int(batch) << ID_BITS, streams), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
