"""OpenTelemetry metrics: the names, units and attributes of the RabbitMQ
stream clients in Go and .NET (``rabbitmq.stream.*``), plus what only
pystream knows (``pystream.*``: credit, buffers, decoding, recoveries, lag).

Counters are plain integers of a ``ConsumerStats`` / ``PublisherStats``
that the consumer and producer bump once per chunk or batch; OpenTelemetry
reads them through observable instruments when a reader collects. The
histograms call the API: the recovery time as it happens and, once
``record_chunk_sizes`` asks for it, the entries per chunk when a reader
collects (see ``chunk_received``). Without ``opentelemetry-api`` installed
(the ``pystream[otel]`` extra) the instruments are never made and every
hook returns at once.

pystream uses the global ``MeterProvider`` of ``opentelemetry.metrics``
unless ``set_meter_provider`` names another.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .uri import BrokerAddress

METER_NAME = "pystream"
SYSTEM = "rabbitmq"

# name: (kind, unit, description); kind is the instrument's.
INSTRUMENTS: dict[str, tuple[str, str, str]] = {
    "rabbitmq.stream.connections": (
        "updown", "{connection}", "Number of open connections"),
    "rabbitmq.stream.published": (
        "counter", "{message}", "Number of messages published"),
    "rabbitmq.stream.confirmed": (
        "counter", "{message}", "Number of messages confirmed"),
    "rabbitmq.stream.errored": (
        "counter", "{message}", "Number of messages the broker refused"),
    "rabbitmq.stream.outstanding_publish_confirmations": (
        "updown", "{confirmation}", "Number of messages awaiting confirmation"),
    "rabbitmq.stream.chunks": (
        "counter", "{chunk}", "Number of chunks received"),
    "rabbitmq.stream.chunk_size": (
        "histogram", "{entries}", "Number of entries in a chunk received"),
    "rabbitmq.stream.consumed": (
        "counter", "{message}", "Number of messages handed to the application"),
    "rabbitmq.stream.read_bytes": (
        "counter", "By", "Bytes of chunks received"),
    "rabbitmq.stream.written_bytes": (
        "counter", "By", "Bytes of Publish frames written (resends included)"),
    "pystream.consumer.chunks_in_flight": (
        "gauge", "{chunk}", "Chunks granted by credit and not yet received"),
    "pystream.consumer.bytes_in_flight": (
        "gauge", "By", "Chunks in flight times the measured decoded chunk size"),
    "pystream.consumer.buffered_bytes": (
        "gauge", "By", "Decoded bytes of chunks received and not yet handed"),
    "pystream.consumer.max_buffered_bytes": (
        "gauge", "By", "The adaptive credit policy's max_buffered_bytes"),
    "pystream.consumer.credit_granted": (
        "counter", "{chunk}", "Credits granted to the broker"),
    "pystream.consumer.decode_time": (
        "counter", "s", "Time spent decoding chunks in C (over "
        "rabbitmq.stream.chunks: the mean per chunk)"),
    "pystream.consumer.filtered": (
        "counter", "{message}", "Records the post filter removed"),
    "pystream.consumer.lag": (
        "gauge", "{message}", "Records committed on the broker and not yet "
        "handed (to within a chunk)"),
    "pystream.consumer.stored_offset": (
        "gauge", "{offset}", "The last offset stored for a named consumer"),
    "pystream.consumer.offsets_stored": (
        "counter", "{store}", "StoreOffset commands sent"),
    "pystream.recoveries": (
        "counter", "{recovery}", "Consumers resubscribed and producers "
        "reconnected after a failure"),
    "pystream.recovery.duration": (
        "histogram", "s", "From a failure to the resubscription or reconnection"),
}

# Histogram buckets where the SDK's default (0 to 10 000) says nothing;
# chunk_size keeps the default, as the Go client does.
BUCKETS = {
    "pystream.recovery.duration": [
        0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
}

Attributes = dict[str, Any]


def base_attributes(address: BrokerAddress, stream: str) -> Attributes:
    """The attributes the Go client puts on every point."""
    return {"messaging.system": SYSTEM, "server.address": address.host,
            "server.port": address.port,
            "messaging.destination.name": stream}


class ConsumerStats:
    """The counters of the consumers of one stream and name at one broker;
    kept after they close so that the counters never go back."""

    __slots__ = ("attributes", "chunk_sizes", "chunks",
                 "read_bytes", "consumed", "filtered", "credit_granted",
                 "offsets_stored", "decode_ns", "__weakref__")

    def __init__(self, attributes: Attributes) -> None:
        self.attributes = attributes
        # chunk_size values not yet handed to the histogram (chunk_received)
        self.chunk_sizes: deque[int] = deque()
        self.decode_ns = 0
        self.chunks = 0
        self.read_bytes = 0
        self.consumed = 0
        self.filtered = 0
        self.credit_granted = 0
        self.offsets_stored = 0


class PublisherStats:
    """The counters of the producers of one stream at one broker."""

    __slots__ = ("attributes", "settle_attributes", "published", "confirmed",
                 "errored", "written_bytes")

    def __init__(self, attributes: Attributes) -> None:
        self.attributes = {**attributes, "messaging.operation.type": "send",
                           "messaging.operation.name": "publish"}
        self.settle_attributes = {**attributes,
                                  "messaging.operation.type": "settle",
                                  "messaging.operation.name": "confirm"}
        self.published = 0
        self.confirmed = 0
        self.errored: dict[str, int] = {}   # by error.type
        self.written_bytes = 0


_lock = threading.Lock()
_Stats = TypeVar("_Stats")
# keyed by (host, port, stream, consumer name)
_consumer_stats: dict[tuple[str, int, str, str | None], ConsumerStats] = {}
_publisher_stats: dict[tuple[str, int, str], PublisherStats] = {}
# The connections that opened, by broker: the gauge counts those still
# open, so that an interrupt between an open (or a close) and its record
# here cannot leave the count off for good.
_connections: dict[tuple[str, int], weakref.WeakSet[Any]] = {}
# Live subscriptions, for the gauges (credit, buffers, lag, stored offset).
_subscriptions: weakref.WeakSet[Any] = weakref.WeakSet()


def consumer_attributes(address: BrokerAddress, stream: str,
                        name: str | None) -> Attributes:
    attributes = {**base_attributes(address, stream),
                  "messaging.operation.type": "receive",
                  "messaging.operation.name": "deliver"}
    if name is not None:
        attributes["messaging.consumer.group.name"] = name
    return attributes


def consumer_stats(address: BrokerAddress, stream: str,
                   name: str | None) -> ConsumerStats:
    key = (address.host, address.port, stream, name)
    with _lock:
        stats = _consumer_stats.get(key)
        if stats is None:
            stats = _consumer_stats[key] = ConsumerStats(
                consumer_attributes(address, stream, name))
        return stats


def publisher_stats(address: BrokerAddress, stream: str) -> PublisherStats:
    key = (address.host, address.port, stream)
    with _lock:
        stats = _publisher_stats.get(key)
        if stats is None:
            stats = _publisher_stats[key] = PublisherStats(
                base_attributes(address, stream))
        return stats


def watch_subscription(sub: Any) -> None:
    """Report ``sub``'s gauges while it lives (see ``subscription_gauges``)."""
    with _lock:
        _subscriptions.add(sub)


def connection_opened(address: BrokerAddress, connection: Any) -> None:
    """``connection`` (with an ``is_open``) opened to ``address``."""
    key = (address.host, address.port)
    with _lock:
        _connections.setdefault(key, weakref.WeakSet()).add(connection)


# --- the OpenTelemetry side ----------------------------------------------------

class _Instruments:
    """The synchronous instruments (histograms) of one meter; the observable
    ones live in the meter and call back into the tables above."""

    def __init__(self, meter: Any) -> None:
        from opentelemetry.metrics import Observation

        def observe(read: Callable[[], Iterable[tuple[float, Attributes]]]
                    ) -> Callable[[Any], Iterator[Any]]:
            def callback(options: Any) -> Iterator[Any]:
                flush_chunk_sizes()  # whichever instrument a view keeps
                for value, attributes in read():
                    yield Observation(value, attributes)
            return callback

        makers = {"counter": meter.create_observable_counter,
                  "updown": meter.create_observable_up_down_counter,
                  "gauge": meter.create_observable_gauge}
        self.histograms: dict[str, Any] = {}
        for name, (kind, unit, description) in INSTRUMENTS.items():
            if kind == "histogram":
                self.histograms[name] = meter.create_histogram(
                    name, unit=unit, description=description,
                    explicit_bucket_boundaries_advisory=BUCKETS.get(name))
            else:
                makers[kind](name, callbacks=[observe(_READERS[name])],
                             unit=unit, description=description)
        self.chunk_size = self.histograms["rabbitmq.stream.chunk_size"]
        self.recovery = self.histograms["pystream.recovery.duration"]


_instruments: _Instruments | None = None
_ready = False
_chunk_sizes_asked = False
# The per-chunk hook's one test: instruments made and chunk_size asked for.
_holding = False
# Held while instruments are made, which takes the SDK's lock; a collection
# holds that lock while the callbacks take _lock: one lock for both could
# deadlock a first consumer against a collection.
_making = threading.Lock()


def instruments() -> _Instruments | None:
    """The instruments on the chosen meter provider; None without
    opentelemetry-api. Made when the first client connects, so that
    importing pystream does not import OpenTelemetry."""
    global _instruments, _ready
    if not _ready:
        with _making:
            if not _ready:
                try:
                    from opentelemetry import metrics as otel
                except ImportError:
                    _instruments = None
                else:
                    _instruments = _Instruments(_meter(otel.get_meter_provider()))
                _ready = True
                _set_holding()
    return _instruments


def _set_holding() -> None:
    global _holding
    _holding = _instruments is not None and _chunk_sizes_asked


def record_chunk_sizes(enabled: bool = True) -> None:
    """Record ``rabbitmq.stream.chunk_size``, one histogram value per chunk
    received, as the Go and .NET clients do; off until asked for
    (``pystream --metrics-port`` asks).

    The OpenTelemetry SDK's work for a histogram value, one a chunk, costs
    a consumer of small records more throughput than the 2 % every other
    instrument together stays well within (docs/monitoring.md, measured by
    bench/bench_otel.py). ``rabbitmq.stream.chunks`` and
    ``rabbitmq.stream.consumed`` give the mean chunk without it."""
    global _chunk_sizes_asked
    with _making:
        _chunk_sizes_asked = enabled
        _set_holding()


def set_meter_provider(provider: Any) -> None:
    """Report to ``provider`` (an ``opentelemetry.metrics.MeterProvider``)
    instead of the global one; None goes back to the global one."""
    global _instruments, _ready
    from opentelemetry import metrics as otel
    chosen = provider if provider is not None else otel.get_meter_provider()
    with _making:
        made = _Instruments(_meter(chosen))
        flush_chunk_sizes()  # what was received so far goes to the old provider
        _instruments, _ready = made, True
        _set_holding()


def _meter(provider: Any) -> Any:
    return provider.get_meter(METER_NAME)


# --- hooks (one call per chunk, batch or recovery) -------------------------------

# chunk_size values a consumer holds for the next collection to record. Past
# this many (collections far apart, chunks coming fast) the consumer records
# the oldest CHUNK_SIZE_BURST itself, which bounds what it holds (some 150 kB).
CHUNK_SIZE_HELD = 4096
CHUNK_SIZE_BURST = 64


def chunk_received(stats: ConsumerStats, entries: int, size: int,
                   decode_ns: int) -> None:
    """Once per chunk, when the application was handed its last record
    (the consumer counts each chunk once, see ``Subscription.count_handed``).

    The SDK takes some 4 µs to record a histogram value, and 2.5 µs more
    for two attributes, which it checks, copies and hashes each time (the
    API has no call for several values or for a value seen n times): 1.5
    to 2.5 % of the CPU a chunk of 8 000 small records costs to read. So
    chunk_size has no attributes, as in the .NET client (``chunks`` and
    ``read_bytes`` carry the stream), and the consumer only holds the
    chunk_size value, and every collection records what is held, in the
    collecting thread, before it reads anything: each collection exports
    exactly what one call per chunk would have (counts, sums, buckets, min
    and max; no exemplars, as the consumer's thread has no span). Only when
    ``CHUNK_SIZE_HELD`` are held does the consumer record some itself. The
    decode time is a counter for the same reason. Even so the SDK's work
    for the values costs more than 2 % of throughput: chunk_size is held
    only once ``record_chunk_sizes`` asks for it."""
    stats.chunks += 1
    stats.read_bytes += size
    stats.decode_ns += decode_ns
    if _holding:
        held = stats.chunk_sizes
        held.append(entries)
        if len(held) > CHUNK_SIZE_HELD:
            _record_chunk_sizes(stats, CHUNK_SIZE_BURST)


def _record_chunk_sizes(stats: ConsumerStats, most: int = -1) -> None:
    """Record the values ``stats`` holds, oldest first (``most`` of them, or
    all); threads may race here (the consumer and a collection): each value
    is taken, hence recorded, once."""
    inst = _instruments
    held = stats.chunk_sizes
    if inst is None:
        held.clear()
        return
    record = inst.chunk_size.record
    while most:
        try:
            entries = held.popleft()
        except IndexError:
            return
        record(entries)
        most -= 1


def flush_chunk_sizes() -> None:
    """Record every consumer's held chunk_size values (at each collection)."""
    for stats in _snapshot(_consumer_stats):
        if stats.chunk_sizes:
            _record_chunk_sizes(stats)


def recovered(role: str, cause: str, stream: str, seconds: float,
              address: BrokerAddress) -> None:
    key = (address.host, address.port, stream, role, cause)
    with _lock:
        _recoveries[key] = _recoveries.get(key, 0) + 1
    inst = instruments()
    if inst is not None:
        inst.recovery.record(seconds, _recovery_attributes(key))


RecoveryKey = tuple[str, int, str, str, str]  # host, port, stream, role, cause
_recoveries: dict[RecoveryKey, int] = {}


def _recovery_attributes(key: RecoveryKey) -> Attributes:
    host, port, stream, role, cause = key
    return {"messaging.system": SYSTEM, "server.address": host,
            "server.port": port, "messaging.destination.name": stream,
            "pystream.role": role, "pystream.recovery.cause": cause}


# --- what the observable instruments read -----------------------------------------

def _snapshot(table: dict[Any, _Stats]) -> list[_Stats]:
    with _lock:
        return list(table.values())


def _consumer_counter(field: str) -> Callable[[], Iterator[tuple[float, Attributes]]]:
    def read() -> Iterator[tuple[float, Attributes]]:
        for stats in _snapshot(_consumer_stats):
            yield getattr(stats, field), stats.attributes
    return read


def _published() -> Iterator[tuple[float, Attributes]]:
    for stats in _snapshot(_publisher_stats):
        yield stats.published, stats.attributes


def _confirmed() -> Iterator[tuple[float, Attributes]]:
    for stats in _snapshot(_publisher_stats):
        yield stats.confirmed, stats.settle_attributes


def _errored() -> Iterator[tuple[float, Attributes]]:
    for stats in _snapshot(_publisher_stats):
        for error, count in list(stats.errored.items()):
            yield count, {**stats.settle_attributes, "error.type": error}


def _outstanding() -> Iterator[tuple[float, Attributes]]:
    for stats in _snapshot(_publisher_stats):
        yield (stats.published - stats.confirmed - sum(stats.errored.values()),
               stats.attributes)


def _written() -> Iterator[tuple[float, Attributes]]:
    for stats in _snapshot(_publisher_stats):
        yield stats.written_bytes, stats.attributes


def _open_connections() -> Iterator[tuple[float, Attributes]]:
    with _lock:
        items = [(key, list(conns)) for key, conns in _connections.items()]
    for (host, port), conns in items:
        count = sum(1 for conn in conns if conn.is_open)
        yield count, {"messaging.system": SYSTEM, "server.address": host,
                      "server.port": port}


def _recovery_counts() -> Iterator[tuple[float, Attributes]]:
    with _lock:
        items = list(_recoveries.items())
    for key, count in items:
        yield count, _recovery_attributes(key)


def _subscription_gauge(read: Callable[[Any], float | None]
                        ) -> Callable[[], Iterator[tuple[float, Attributes]]]:
    def gauge() -> Iterator[tuple[float, Attributes]]:
        with _lock:
            subs = list(_subscriptions)
        for sub in subs:
            if not sub.reporting():
                continue
            value = read(sub)
            if value is not None:
                yield value, sub.stats.attributes
    return gauge


def _max_buffered(sub: Any) -> float | None:
    if sub.credit is None:  # a consumer watched from outside (pystream watch)
        return None
    policy = sub.credit.policy
    return policy.max_buffered_bytes if policy.mode == "adaptive" else None


_READERS: dict[str, Callable[[], Iterable[tuple[float, Attributes]]]] = {
    "rabbitmq.stream.connections": _open_connections,
    "rabbitmq.stream.published": _published,
    "rabbitmq.stream.confirmed": _confirmed,
    "rabbitmq.stream.errored": _errored,
    "rabbitmq.stream.outstanding_publish_confirmations": _outstanding,
    "rabbitmq.stream.chunks": _consumer_counter("chunks"),
    "rabbitmq.stream.consumed": _consumer_counter("consumed"),
    "rabbitmq.stream.read_bytes": _consumer_counter("read_bytes"),
    "rabbitmq.stream.written_bytes": _written,
    "pystream.consumer.credit_granted": _consumer_counter("credit_granted"),
    "pystream.consumer.decode_time": lambda: (
        (stats.decode_ns * 1e-9, stats.attributes)
        for stats in _snapshot(_consumer_stats)),
    "pystream.consumer.filtered": _consumer_counter("filtered"),
    "pystream.consumer.offsets_stored": _consumer_counter("offsets_stored"),
    "pystream.recoveries": _recovery_counts,
    "pystream.consumer.chunks_in_flight": _subscription_gauge(
        lambda sub: sub.credit and sub.credit.outstanding),
    "pystream.consumer.bytes_in_flight": _subscription_gauge(
        lambda sub: sub.credit and sub.credit.outstanding * sub.credit.chunk_estimate),
    "pystream.consumer.buffered_bytes": _subscription_gauge(
        lambda sub: sub.credit and sub.credit.queued_bytes),
    "pystream.consumer.max_buffered_bytes": _subscription_gauge(_max_buffered),
    "pystream.consumer.lag": _subscription_gauge(lambda sub: sub.lag()),
    "pystream.consumer.stored_offset": _subscription_gauge(
        lambda sub: sub.stored_offset()),
}
