"""Offset ranges of streams: planned in one place, read anywhere (Spark's
executors, Dask or Ray workers, the command line); no Spark needed.

``plan_ranges`` turns streams and a start/end into ``OffsetRange`` s the way
Spark's Kafka source does (split in proportion to size up to
``min_partitions``, then cap each at ``max_records_per_partition``, never
below ``min_records_per_partition`` since every range re-reads its first
chunk). ``read_range`` reads one of them as Arrow batches; it can run in any
process, and keeps one client per broker and options per Python process.

Offsets count every chunk, offset-tracking chunks included, so a range's
size is an upper bound of its records. What a stream holds now
(``stream_bounds``) is ``bounds``'s, named here too.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

from . import protocol as P
from ._core import schema as core_schema
from .arrow import ArrowStream
from .bounds import StreamBounds, offset_at, probe, stream_bounds, stream_first
from .client import Client
from .credit import Credit
from .errors import (
    CertificateVerificationError,
    DataLoss,
    MissingPassword,
    RequestTimeout,
)
from .records import Filter
from .retry import FIRST_RETRY_DELAY, RECOVERABLE, next_retry_delay
from .tls import check_tls_settings, tls_options
from .uri import BrokerAddress, parse_uri

if TYPE_CHECKING:
    from .consumer import Consumer

__all__ = ["Bound", "BrokerRef", "OffsetRange", "StreamBounds", "plan_ranges",
           "read_range", "split_ranges", "stream_bounds"]

_T = TypeVar("_T")

log = logging.getLogger("pystream.ranges")

#: ``"earliest"``, ``"latest"``, an offset, or a ``datetime``.
Bound = str | int | dt.datetime

POLL = 0.2  # seconds between looks at the position while no records come
#: Seconds a filtered read hears nothing before it reads the rest of its
#: range unfiltered: the broker says nothing of the chunks it skips.
FILTERED_QUIET = 2.0
#: Seconds between questions to the broker while a range read hears nothing.
CHECK_EVERY = 1.0
#: ``min_partitions`` never splits below this many offsets: each range
#: re-reads the chunk its start falls in.
MIN_RANGE = 100_000
DEFAULT_OUTSTANDING = Credit.adaptive().max_outstanding
DEFAULT_PASSWORD_ENV = "PYSTREAM_PASSWORD"


@dataclass(frozen=True)
class BrokerRef:
    """Where a broker is and how to log in, without a secret, so it can
    travel to executors: ``uri`` carries no password; the password is read,
    where a connection is made, from the file ``password_file`` or else the
    environment variable ``password_env``. That variable unset there is
    ``MissingPassword`` when it was named (not the default
    ``PYSTREAM_PASSWORD``) or the URI's user is not ``guest``: logging in
    without it would be as another user, or a wrong password; otherwise the
    URI's default password, ``guest``.

    With a ``rabbitmq-stream+tls://`` URI, TLS trusts the CAs of the PEM
    file ``ca_file`` (None: the system's) and presents the client
    certificate ``cert_file`` with its key ``key_file`` (None: in
    ``cert_file``). Only the paths travel: the files are read, and the
    ``ssl.SSLContext`` built, where the connection is made, so they must
    exist on the driver and on every executor. ``sasl_mechanism`` is
    ``"PLAIN"`` (user and password) or ``"EXTERNAL"`` (log in as the client
    certificate's name; no password is read)."""

    uri: str
    password_env: str | None = DEFAULT_PASSWORD_ENV
    password_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    sasl_mechanism: str = "PLAIN"

    def __post_init__(self) -> None:
        if urlsplit(self.uri).password is not None:
            raise ValueError(
                "the broker URI holds a password, which would travel with the "
                "plan to every executor: remove it and set the environment "
                f"variable {self.password_env or 'PYSTREAM_PASSWORD'} (also on "
                "the executors, e.g. spark.executorEnv.PYSTREAM_PASSWORD) or "
                "name a password file")
        # Fail on the driver, not in every task.
        check_tls_settings(parse_uri(self.uri).tls, ca_file=self.ca_file,
                           cert_file=self.cert_file, key_file=self.key_file,
                           sasl_mechanism=self.sasl_mechanism)

    def address(self) -> BrokerAddress:
        """The ``BrokerAddress`` to connect to, with the password read where
        this runs (``password_env`` or ``password_file``; none for EXTERNAL)."""
        address = parse_uri(self.uri)
        if self.sasl_mechanism == "EXTERNAL":
            return address  # the certificate logs in: no password to read
        if self.password_file:
            with open(self.password_file, encoding="utf-8") as f:
                return replace(address, password=f.read().strip("\r\n"))
        if not self.password_env:
            return address
        if self.password_env in os.environ:
            return replace(address, password=os.environ[self.password_env])
        if self.password_env != DEFAULT_PASSWORD_ENV or address.username != "guest":
            raise MissingPassword(
                f"the password of {address.username!r} is to be read from the "
                f"environment variable {self.password_env}, which is not set "
                f"here (on Spark executors: spark.executorEnv.{self.password_env})",
                source=self.password_env)
        return address

    def connection_options(self) -> dict[str, Any]:
        """``connect`` options for this broker; the TLS context is built
        from the files now, in the calling process."""
        return tls_options(parse_uri(self.uri).tls, ca_file=self.ca_file,
                           cert_file=self.cert_file, key_file=self.key_file,
                           sasl_mechanism=self.sasl_mechanism)


Broker = str | BrokerRef


@dataclass(frozen=True)
class OffsetRange:
    """Records ``start`` (inclusive) to ``end`` (exclusive) of ``stream``."""

    stream: str
    start: int
    end: int

    @property
    def size(self) -> int:
        """``end - start``: the offsets in the range, an upper bound of its
        records (offset-tracking chunks use offsets too)."""
        return self.end - self.start


# by broker and connection options
_clients: dict[tuple[Broker, tuple[tuple[str, Any], ...]], Client] = {}
_clients_pid = os.getpid()
_clients_lock = threading.Lock()


def client_for(broker: Broker, options: dict[str, Any] | None = None) -> Client:
    """This process's client for ``broker`` (a forked worker gets its own).
    A ``BrokerRef``'s TLS settings are part of the key, so its context is
    built once per process and broker."""
    global _clients_pid
    options = options or {}
    key = (broker, tuple(sorted(options.items())))
    with _clients_lock:
        if os.getpid() != _clients_pid:
            _clients.clear()  # the parent's sockets are not ours
            _clients_pid = os.getpid()
        client = _clients.get(key)
        if client is None or client.closed:
            if isinstance(broker, BrokerRef):
                client = _client_for_ref(broker, options)
            else:
                client = Client(broker, **options)
            _clients[key] = client
        return client


def _client_for_ref(broker: BrokerRef, options: dict[str, Any]) -> Client:
    try:
        return Client(broker.address(),
                      **{**broker.connection_options(), **options})
    except CertificateVerificationError as exc:
        raise exc.with_trust_hint(
            "name the CA that signed it: the data source option tlsCaFile, "
            "or BrokerRef(ca_file=...)") from exc.__cause__


def resolve(bound: Bound, client: Client, stream: str, bounds: StreamBounds) -> int:
    """A bound as a concrete offset of ``stream``."""
    if bound == "earliest":
        return bounds.first
    if bound == "latest":
        return bounds.end
    if isinstance(bound, dt.datetime):
        return offset_at(client, stream, bound, bounds)
    if isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0:
        return bound
    raise ValueError(f"an offset bound is 'earliest', 'latest', an offset "
                     f">= 0 or a datetime, not {bound!r}")


def read_range(broker: Broker, stream: str, start: int, end: int, *,
               timeout: float = 60.0, fail_on_data_loss: bool = False,
               connection_options: dict[str, Any] | None = None,
               **consumer_options: Any) -> ArrowStream:
    """The records of ``stream`` from ``start`` up to ``end`` (exclusive) as
    Arrow batches, trimmed at both ends, in an ``ArrowStream`` (iterate it,
    or hand it to DuckDB or Polars). ``broker`` is a URI or a
    ``BrokerRef``; ``consumer_options`` are those of ``Client.consumer``.

    The read ends where the broker shows the range is complete: a record at
    or past ``end`` came, or (RabbitMQ 4.3+) every offset up to ``end`` is
    committed and the read is past the stream's last chunk of records
    (offset-tracking chunks take offsets and are never delivered); never
    because the socket went quiet. A ``filter``'s broker side skips whole
    chunks without a word, so a filtered read that hears nothing for
    ``FILTERED_QUIET`` seconds reads the rest of its range unfiltered (the
    post filter still applies): it then also holds the other rows of those
    chunks, as it may anyway (the broker filters whole chunks).

    ``DataLoss`` if ``fail_on_data_loss`` and retention removed records from
    the range's start (otherwise the read starts at the stream's first
    record); ``RequestTimeout`` if the read makes no progress for
    ``timeout`` seconds before ``end`` is reached."""
    return ArrowStream(
        core_schema(columns=consumer_options.get("columns"),
                    body=consumer_options.get("body", "view"),
                    error_policy=consumer_options.get("error_policy", "raise")),
        _read_range(broker, stream, start, end, timeout, fail_on_data_loss,
                    connection_options, consumer_options))


@dataclass
class _Progress:
    """Where a range read is, and when it last moved (monotonic seconds)."""

    position: int
    moved: float


def _read_range(broker: Broker, stream: str, start: int, end: int, timeout: float,
                fail_on_data_loss: bool, connection_options: dict[str, Any] | None,
                consumer_options: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    if end <= start:
        return
    progress = _Progress(start, time.monotonic())
    client = _retried(lambda: client_for(broker, connection_options),
                      "connecting", stream, end, timeout, progress)
    if fail_on_data_loss:
        first = _retried(lambda: stream_first(client, stream), "its first offset",
                         stream, end, timeout, progress)
        if first is not None and first > start:
            raise DataLoss(f"{stream!r}: offsets {start} to {min(first, end) - 1} "
                           f"were removed by retention before they were read")
    # Decoding in the reader thread overlaps with the caller's work on the
    # previous batch (DuckDB, Spark): bulk reads gain more than a wake-up.
    consumer_options.setdefault("read_while_waiting", False)
    flt: Filter | None = consumer_options.pop("filter", None)
    if flt is not None:
        yield from _read_part(client, stream, end, timeout, progress,
                              {**consumer_options, "filter": flt},
                              quiet_limit=min(FILTERED_QUIET, timeout / 2))
        if progress.position >= end:
            return
    yield from _read_part(client, stream, end, timeout, progress, consumer_options,
                          post=flt if flt is not None and flt.post_filter else None)


def _retried(call: Callable[[], _T], what: str, stream: str, end: int,
             timeout: float, progress: _Progress,
             cause: BaseException | None = None) -> _T:
    """``call()``, again with backoff while it fails in a way reconnecting
    may cure (the broker restarting), until the read has made no progress
    for ``timeout`` seconds: then ``RequestTimeout``. A success after a
    failure (or after ``cause``) is logged as a recovery."""
    delay, began = FIRST_RETRY_DELAY, time.monotonic()
    while True:
        try:
            result = call()
        except RECOVERABLE as exc:
            cause = exc
            delay = _back_off(delay, exc, stream, end, timeout, progress)
            continue
        if cause is not None:
            log.warning("range read of stream %r recovered from %s: %s at offset "
                        "%d after %.2f s", stream, cause, what, progress.position,
                        time.monotonic() - began)
        return result


def _back_off(delay: float, exc: BaseException, stream: str, end: int,
              timeout: float, progress: _Progress) -> float:
    """Wait ``delay`` after ``exc`` and return the next delay, or raise
    ``RequestTimeout`` if that would take the read past ``timeout`` seconds
    without progress."""
    if time.monotonic() + delay - progress.moved >= timeout:
        raise _no_progress(stream, end, timeout, progress) from exc
    time.sleep(delay)
    return next_retry_delay(delay)


def _no_progress(stream: str, end: int, timeout: float,
                 progress: _Progress) -> RequestTimeout:
    return RequestTimeout(f"{stream!r}: no progress past offset {progress.position} "
                          f"for {timeout:g} s; the range ends at {end}")


def _read_part(client: Client, stream: str, end: int, timeout: float,
               progress: _Progress, options: dict[str, Any], *,
               quiet_limit: float | None = None,
               post: Filter | None = None) -> Iterator[pa.RecordBatch]:
    """Read from ``progress.position`` to ``end``, moving ``progress``; back
    early only after ``quiet_limit`` seconds without progress. ``post``
    filters the rows here (the consumer reads unfiltered). A consumer that
    ends for a failure reconnecting may cure (its broker away past its own
    recovery) is opened again at the position, within the budget."""
    # No credit for chunks past the end: a range of 500 000 records of
    # 100 B would otherwise pull as many chunks again past it. A chunk
    # holds a record at least, so a small range never pulls 64 either.
    options.setdefault("credit", Credit.adaptive(
        max_outstanding=min(DEFAULT_OUTSTANDING, end - progress.position), until=end))
    delay = FIRST_RETRY_DELAY
    cause: BaseException | None = None
    while True:
        consumer = _retried(
            lambda: client.consumer(stream, offset=progress.position, **options),
            "subscribed", stream, end, timeout, progress, cause)
        try:
            with consumer:
                yield from _consume(client, consumer, stream, end, timeout, progress,
                                    quiet_limit, post)
            return
        except RECOVERABLE as exc:
            # Everything before the position was handed over: read on from it.
            cause = exc
            delay = _back_off(delay, exc, stream, end, timeout, progress)


def _consume(client: Client, consumer: Consumer, stream: str, end: int,
             timeout: float, progress: _Progress, quiet_limit: float | None,
             post: Filter | None) -> Iterator[pa.RecordBatch]:
    """``_read_part`` 's reading with one consumer."""
    start = progress.position
    next_check, retry = -math.inf, FIRST_RETRY_DELAY
    # The position also moves past chunks without records (offset
    # tracking chunks, rows the post filter dropped), so it, not the
    # rows, says how far the read is.
    while progress.position < end:
        batch = next(iter(consumer.batches(POLL)), None)
        now = time.monotonic()
        if batch is not None:
            offsets = batch.column(0).to_numpy()
            keep = int(np.searchsorted(offsets, end))
            part = batch if keep == batch.num_rows else batch.slice(0, keep)
            if post is not None:
                part = post.apply(part)
            if part.num_rows:
                yield part
            if keep < batch.num_rows:
                progress.position = end
                return
        position = consumer.position
        if batch is not None or (position is not None and position > progress.position):
            progress.position = max(progress.position, position or start)
            progress.moved = now
            next_check, retry = -math.inf, FIRST_RETRY_DELAY
            continue
        quiet = now - progress.moved
        if quiet_limit is not None and quiet >= quiet_limit:
            return
        if quiet >= timeout:
            raise _no_progress(stream, end, timeout, progress)
        if now < next_check:
            continue
        try:
            done = _received_all(client, stream, progress.position, end,
                                 max(POLL, timeout - quiet))
        except RECOVERABLE:
            # The broker away or silent (a restart, a pause): asked again
            # with backoff; the budget decides, as for the consumer.
            next_check, retry = now + retry, next_retry_delay(retry)
            continue
        if done:
            progress.position = end
            return
        next_check, retry = now + CHECK_EVERY, FIRST_RETRY_DELAY


def _received_all(client: Client, stream: str, position: int, end: int,
                  timeout: float) -> bool:
    """Whether the broker shows that no record of ``[position, end)`` is
    left to receive: every offset up to ``end`` is committed (the
    ``committed_offset`` of RabbitMQ 4.3+) and ``position`` is past the
    stream's last chunk of records, probed now (or it has none), so the
    offsets left belong to offset-tracking chunks, which are never
    delivered. A range ending past
    the committed end asks for records not written yet, and waits for them.
    ``RequestTimeout`` if the broker does not answer within ``timeout``."""
    if not client.supports("stream_stats"):
        return False
    stats = client.stream_stats(stream, timeout=timeout)
    if "committed_offset" not in stats or end > stats["committed_offset"] + 1:
        return False
    (last,) = probe(client, stream, [P.OffsetSpec(P.OFFSET_LAST)], timeout)
    return last is None or position >= last.end


def plan_ranges(broker: Broker, streams: Iterable[str],
                start: Bound | dict[str, Bound] = "earliest",
                end: Bound | dict[str, Bound] = "latest", *,
                min_partitions: int | None = None,
                max_records_per_partition: int | None = None,
                min_records_per_partition: int = MIN_RANGE,
                fail_on_data_loss: bool = False,
                connection_options: dict[str, Any] | None = None) -> list[OffsetRange]:
    """Concrete ranges covering ``start``..``end`` of each stream, resolved
    now (so every reader reads a fixed range). ``start`` and ``end`` are a
    bound or a dict of them per stream (missing streams: earliest, latest).
    A start before the stream's first record raises ``DataLoss`` if
    ``fail_on_data_loss``, and is otherwise moved to it."""
    client = client_for(broker, connection_options)
    ranges = []
    for stream in streams:
        bounds = stream_bounds(client, stream)
        lo = start_offset(start, client, stream, bounds, fail_on_data_loss)
        hi = min(resolve(bound_for(end, stream, "latest"), client, stream, bounds),
                 bounds.end)
        if hi > lo:
            ranges.append(OffsetRange(stream, lo, hi))
    return split_ranges(ranges, min_partitions, max_records_per_partition,
                        min_records_per_partition)


def bound_for(bound: Bound | dict[str, Bound], stream: str, default: Bound) -> Bound:
    """``bound``, or its entry for ``stream`` when it is a dict per stream."""
    return bound.get(stream, default) if isinstance(bound, dict) else bound


def start_offset(start: Bound | dict[str, Bound], client: Client, stream: str,
                 bounds: StreamBounds, fail_on_data_loss: bool) -> int:
    """A concrete start (missing from a dict: earliest), checked against
    what retention kept: before the first record it raises ``DataLoss`` if
    ``fail_on_data_loss``, and otherwise moves to that record."""
    lo = resolve(bound_for(start, stream, "earliest"), client, stream, bounds)
    if lo < bounds.first:
        if fail_on_data_loss:
            raise DataLoss(f"{stream!r}: the read starts at offset {lo} but "
                           f"retention removed everything before {bounds.first} "
                           f"(failOnDataLoss=false skips to it)")
        lo = bounds.first
    return lo


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None, min_records: int) -> list[OffsetRange]:
    """Split in proportion to size towards ``min_partitions`` ranges (no
    part below ``min_records``), then so that none holds more than
    ``max_records``."""
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = 1
        if min_partitions and total:
            parts = max(1, min(round(r.size / total * min_partitions),
                               r.size // max(1, min_records)))
        if max_records:
            parts = max(parts, math.ceil(r.size / max_records))
        cuts = [r.start + r.size * i // parts for i in range(parts + 1)]
        out += [OffsetRange(r.stream, a, b) for a, b in itertools.pairwise(cuts)]
    return out

