"""A connection to a broker and its admin operations: what consumers and
producers need of a client. ``client.Client`` adds opening them.

Each operation is a request of ``protocol`` sent over the ``Connection``,
gated by ``features`` on brokers too old for it.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import metrics
from . import protocol as P
from .connection import Connection
from .errors import (
    ProtocolError,
    StreamAlreadyExists,
    StreamDoesNotExist,
    StreamError,
    StreamNotAvailable,
    error_for_code,
)
from .offsets import Offset, offset_spec
from .pool import AddressResolver, ConnectionPool, Endpoint
from .retry import RECOVERABLE
from .uri import BrokerAddress, parse_uri

if TYPE_CHECKING:
    from .records import Filter

# create_stream keyword -> the broker's queue argument.
STREAM_ARGUMENTS = {
    "max_length_bytes": "max-length-bytes",
    "max_age": "max-age",
    "stream_max_segment_size_bytes": "stream-max-segment-size-bytes",
    "filter_size": "stream-filter-size-bytes",
    "initial_cluster_size": "initial-cluster-size",
    "leader_locator": "queue-leader-locator",
}


@dataclass(frozen=True)
class StreamInfo:
    """Where a stream lives, from ``Client.metadata``. ``error`` is set (and
    leader None) when the broker reports the stream missing or unavailable."""

    stream: str
    leader: Endpoint | None
    replicas: tuple[Endpoint, ...]
    error: StreamError | None = None


class Admin:
    """A connection to a broker with its admin operations. Use as a context
    manager, or call ``close()``."""

    def __init__(self, uri: str | BrokerAddress = "rabbitmq-stream://localhost",
                 *, address_resolver: AddressResolver | None = None,
                 max_subscriptions_per_connection: int = 255,
                 **options: Any) -> None:
        """See ``connect`` for the options."""
        address = parse_uri(uri) if isinstance(uri, str) else uri
        if options.get("ssl_context") is not None and not address.tls:
            # Switching TLS on here would keep the plain port (5552).
            raise ValueError("ssl_context needs a rabbitmq-stream+tls:// URI "
                             "(default port 5551)")
        # The metric instruments, made once per process: here rather than
        # in a first consumer's or producer's work (importing the
        # OpenTelemetry API takes some 6 ms).
        metrics.instruments()
        self.address = address
        self._options = options
        self._closed = False
        self._lock = threading.Lock()
        self._connection = Connection(address, **options)
        self._connection.open()
        self.pool = ConnectionPool(address, options, address_resolver,
                                   max_subscriptions_per_connection)
        # The cluster's nodes as metadata last named them: where the admin
        # connection goes when the URI's node is down.
        self._nodes: tuple[Endpoint, ...] = ()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    @property
    def connection(self) -> Connection:
        """The connection admin requests go over; reopened on first use after
        it was lost (a broker restart; in a cluster, to another node while
        the URI's is down), so the client outlives failures."""
        with self._lock:
            if not self._connection.is_open and not self._closed:
                self._connection = self._reopen()
            return self._connection

    def _reopen(self) -> Connection:
        """A new admin connection: to the URI's node, or, while it is
        down, to another node of its cluster. The node whose connection was
        just lost comes last: cut off from the others by a partition, it
        still accepts connections but answers nothing (metadata waits on
        the rest of the cluster), and each try there would cost a heartbeat
        timeout."""
        lost = self._connection.address
        addresses = [self.address, *map(self.pool.address_of, self._nodes)]
        ordered = [a for a in dict.fromkeys(addresses) if a != lost] + [lost]
        error: BaseException | None = None
        for address in ordered:
            conn = Connection(address, **self._options)
            try:
                conn.open()
            except RECOVERABLE as exc:
                error = exc
                continue
            return conn
        assert error is not None
        raise error

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pystream.{type(self).__name__} {self.connection.address.uri()}>"

    def close(self) -> None:
        """Close the client, its consumers' connections included."""
        with self._lock:
            self._closed = True
        self.pool.close()
        self._connection.close()

    def locate(self, stream: str, *, replica: bool = True,
               timeout: float | None = None) -> Endpoint:
        """The node to read ``stream`` from: a replica when there is one and
        ``replica`` is true, else the leader. ``timeout`` as for
        ``metadata``."""
        info = self.metadata(stream, timeout=timeout)[stream]
        if info.error is not None:
            raise info.error
        if replica and info.replicas:
            return random.choice(info.replicas)
        if info.leader is None:
            raise StreamNotAvailable(f"stream {stream!r} has no leader")
        return info.leader

    @property
    def server_properties(self) -> dict[str, str]:
        """What the broker said of itself: ``product``, ``version``, ..."""
        return self.connection.server_properties

    @property
    def server_version(self) -> tuple[int, ...]:
        """The broker's version as numbers, e.g. ``(4, 0, 5)``."""
        return self.connection.features.version

    def supports(self, feature: str) -> bool:
        """Whether the broker has a feature of ``features.FIRST_RELEASE``."""
        return self.connection.features.supports(feature)

    def _request(self, make: Callable[[int], P.Request], context: str, *,
                 tolerate: type[StreamError] | None = None) -> None:
        """Send a request; an answer of class ``tolerate`` is not an error
        (the ``exist_ok`` / ``missing_ok`` flags)."""
        try:
            self.connection.request(make, context)
        except StreamError as exc:
            if tolerate is None or not isinstance(exc, tolerate):
                raise

    # --- streams --------------------------------------------------------------

    def create_stream(self, stream: str, *, exist_ok: bool = False,
                      **arguments: Any) -> None:
        """Create a stream. Keyword arguments: ``max_length_bytes``,
        ``max_age`` (a ``timedelta`` or the broker's text such as ``"7D"``),
        ``stream_max_segment_size_bytes``, ``filter_size`` (3.13+),
        ``initial_cluster_size``, ``leader_locator``; other broker arguments
        may be given with ``_`` for ``-``."""
        if "filter_size" in arguments:
            self.connection.features.require("filtering")
        args = _stream_arguments(arguments)
        self._request(lambda c: P.Create(c, stream, args),
                      f"create stream {stream!r}",
                      tolerate=StreamAlreadyExists if exist_ok else None)

    def delete_stream(self, stream: str, *, missing_ok: bool = False) -> None:
        """Delete ``stream``; ``StreamDoesNotExist`` if there is none, unless
        ``missing_ok``."""
        self._request(lambda c: P.Delete(c, stream),
                      f"delete stream {stream!r}",
                      tolerate=StreamDoesNotExist if missing_ok else None)

    def stream_exists(self, stream: str) -> bool:
        """Whether ``stream`` exists (asked through metadata)."""
        info = self.metadata(stream)[stream]
        return not isinstance(info.error, StreamDoesNotExist)

    def metadata(self, *streams: str,
                 timeout: float | None = None) -> dict[str, StreamInfo]:
        """Each stream's leader and replicas (``StreamInfo``); a missing stream's
        entry has ``error`` set rather than raising. ``RequestTimeout`` after
        ``timeout`` seconds (None: the connection's ``request_timeout``)."""
        answer = self.connection.query(P.MetadataResponse, lambda c: P.Metadata(c, streams),
                                       f"metadata of {', '.join(streams)}",
                                       timeout=timeout)
        brokers = {b.reference: Endpoint(b.host, b.port) for b in answer.brokers}
        if brokers:
            self._nodes = tuple(brokers.values())
        out = {}
        for m in answer.streams:
            error = (None if m.code == P.RESPONSE_OK
                     else error_for_code(m.code, f"metadata of {m.stream!r}"))
            out[m.stream] = StreamInfo(
                m.stream, brokers.get(m.leader),
                tuple(brokers[r] for r in m.replicas if r in brokers), error)
        return out

    def stream_stats(self, stream: str, *, timeout: float | None = None) -> dict[str, int]:
        """The broker's figures for a stream (3.11+): ``first_chunk_id``,
        ``committed_chunk_id``, and from 4.3 ``committed_offset`` (the last
        committed offset), ...; ``RequestTimeout`` after ``timeout`` seconds
        (None: the connection's ``request_timeout``)."""
        self.connection.features.require("stream_stats")
        answer = self.connection.query(P.StreamStatsResponse, lambda c: P.StreamStats(c, stream),
                                       f"stream stats of {stream!r}", timeout=timeout)
        return dict(answer.stats)

    # --- offsets and publisher sequences --------------------------------------

    def resolve_offset(self, stream: str, offset: Offset = "next", *,
                       filter: Filter | None = None) -> int:
        """Where the broker would start a subscription for ``offset`` (what
        ``consumer(offset=...)`` takes) and ``filter``, without subscribing:
        the first offset of the chunk it would send first (for an offset, the
        chunk holding it, whose records before it a consumer drops; for
        ``"next"`` or a time after the last chunk, the stream's end).
        RabbitMQ 4.3+; ``UnsupportedFeature`` before, ``NoOffset`` when the
        broker cannot resolve it."""
        self.connection.features.require("resolve_offset_spec")
        spec = offset_spec(offset)
        props = filter.properties() if filter is not None else {}
        answer = self.connection.query(
            P.ResolveOffsetSpecResponse, lambda c: P.ResolveOffsetSpec(c, stream, spec, props),
            f"resolve offset {offset!r} of {stream!r}")
        if answer.offset is None or answer.offset.type != P.OFFSET_OFFSET:
            raise ProtocolError(f"resolve offset of {stream!r}: the answer "
                                f"holds no offset ({answer.offset!r})")
        return answer.offset.value

    def query_offset(self, stream: str, reference: str) -> int:
        """The offset stored for a consumer name; ``NoOffset`` if none."""
        return self.connection.query(
            P.QueryOffsetResponse, lambda c: P.QueryOffset(c, reference, stream),
            f"query offset of {reference!r} on {stream!r}").offset

    def store_offset(self, stream: str, reference: str, offset: int) -> None:
        """Store a consumer's offset (the broker does not answer)."""
        self.connection.send(P.StoreOffset(reference, stream, offset))

    def query_publisher_sequence(self, stream: str, reference: str) -> int:
        """The last publishing id the broker kept for a named producer, 0 if
        it knows none."""
        return self.connection.query(
            P.QueryPublisherSequenceResponse,
            lambda c: P.QueryPublisherSequence(c, reference, stream),
            f"query publisher sequence of {reference!r} on {stream!r}").sequence

    # --- super streams ----------------------------------------------------------

    def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of ``super_stream``, in order."""
        return list(self.connection.query(
            P.PartitionsResponse, lambda c: P.Partitions(c, super_stream),
            f"partitions of {super_stream!r}").streams)

    def route(self, super_stream: str, routing_key: str) -> list[str]:
        """The partitions the broker's binding keys route ``routing_key`` to in
        ``super_stream``."""
        return list(self.connection.query(
            P.RouteResponse, lambda c: P.Route(c, routing_key, super_stream),
            f"route {routing_key!r} in {super_stream!r}").streams)

    def create_super_stream(self, name: str, *, partitions: int | None = None,
                            binding_keys: list[str] | None = None,
                            exist_ok: bool = False, **arguments: Any) -> None:
        """Create a super stream of ``partitions`` streams named ``name-0``..
        (binding keys ``0``..), or one partition ``name-KEY`` per binding key.
        Stream arguments as for ``create_stream``. RabbitMQ 3.13+."""
        self.connection.features.require("super_stream_commands")
        if (partitions is None) == (binding_keys is None):
            raise ValueError("give either partitions=N or binding_keys=[...]")
        if partitions is not None:
            if partitions < 1:
                raise ValueError("partitions must be >= 1")
            binding_keys = [str(i) for i in range(partitions)]
        assert binding_keys is not None
        streams = tuple(f"{name}-{key}" for key in binding_keys)
        args = _stream_arguments(arguments)
        self._request(
            lambda c: P.CreateSuperStream(c, name, streams,
                                          tuple(binding_keys), args),
            f"create super stream {name!r}",
            tolerate=StreamAlreadyExists if exist_ok else None)

    def delete_super_stream(self, name: str, *, missing_ok: bool = False) -> None:
        """Delete a super stream and its partitions (RabbitMQ 3.13+);
        ``StreamDoesNotExist`` if there is none, unless ``missing_ok``."""
        self.connection.features.require("super_stream_commands")
        self._request(lambda c: P.DeleteSuperStream(c, name),
                      f"delete super stream {name!r}",
                      tolerate=StreamDoesNotExist if missing_ok else None)


def _stream_arguments(arguments: dict[str, Any]) -> dict[str, str]:
    return {STREAM_ARGUMENTS.get(k, k.replace("_", "-")): _argument(v)
            for k, v in arguments.items()}


def _argument(value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError("stream arguments are numbers or text, not booleans")
    if isinstance(value, dt.timedelta):
        return f"{int(value.total_seconds())}s"
    return str(value)
