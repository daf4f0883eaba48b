"""A connection to a broker and its admin operations: what consumers and
producers need of a client. ``client.Client``, the user's handle, holds one
and documents the operations.

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
    """The admin connection to a broker (reopened after a failure), the pool
    of connections to its nodes, and the admin operations over the former:
    those of ``Client``, which documents them."""

    def __init__(self, uri: str | BrokerAddress = "rabbitmq-stream://localhost",
                 *, address_resolver: AddressResolver | None = None,
                 max_subscriptions_per_connection: int = 255,
                 **options: Any) -> None:
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
        try:
            self._connection.open()
            self.pool = ConnectionPool(address, options, address_resolver,
                                       max_subscriptions_per_connection)
        except BaseException:
            # An interrupt too: nobody else could close what was opened.
            self._connection.close()
            raise
        # The cluster's nodes as metadata last named them: where the admin
        # connection goes when the URI's node is down.
        self._nodes: tuple[Endpoint, ...] = ()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connection(self) -> Connection:
        """``Client.connection``, reopened here on first use after it was
        lost (see ``_reopen``)."""
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
            except BaseException:  # an interrupt: nobody else could close it
                conn.close()
                raise
            return conn
        assert error is not None
        raise error

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.pool.close()
        self._connection.close()

    def locate(self, stream: str, *, replica: bool = True,
               timeout: float | None = None) -> Endpoint:
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
        return self.connection.server_properties

    @property
    def server_version(self) -> tuple[int, ...]:
        return self.connection.features.version

    def supports(self, feature: str) -> bool:
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
        if "filter_size" in arguments:
            self.connection.features.require("filtering")
        args = _stream_arguments(arguments)
        self._request(lambda c: P.Create(c, stream, args),
                      f"create stream {stream!r}",
                      tolerate=StreamAlreadyExists if exist_ok else None)

    def delete_stream(self, stream: str, *, missing_ok: bool = False) -> None:
        self._request(lambda c: P.Delete(c, stream),
                      f"delete stream {stream!r}",
                      tolerate=StreamDoesNotExist if missing_ok else None)

    def stream_exists(self, stream: str) -> bool:
        info = self.metadata(stream)[stream]
        return not isinstance(info.error, StreamDoesNotExist)

    def metadata(self, *streams: str,
                 timeout: float | None = None) -> dict[str, StreamInfo]:
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
        self.connection.features.require("stream_stats")
        answer = self.connection.query(P.StreamStatsResponse, lambda c: P.StreamStats(c, stream),
                                       f"stream stats of {stream!r}", timeout=timeout)
        return dict(answer.stats)

    # --- offsets and publisher sequences --------------------------------------

    def resolve_offset(self, stream: str, offset: Offset = "next", *,
                       filter: Filter | None = None) -> int:
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
        return self.connection.query(
            P.QueryOffsetResponse, lambda c: P.QueryOffset(c, reference, stream),
            f"query offset of {reference!r} on {stream!r}").offset

    def store_offset(self, stream: str, reference: str, offset: int) -> None:
        self.connection.send(P.StoreOffset(reference, stream, offset))

    def query_publisher_sequence(self, stream: str, reference: str) -> int:
        return self.connection.query(
            P.QueryPublisherSequenceResponse,
            lambda c: P.QueryPublisherSequence(c, reference, stream),
            f"query publisher sequence of {reference!r} on {stream!r}").sequence

    # --- super streams ----------------------------------------------------------

    def partitions(self, super_stream: str) -> list[str]:
        return list(self.connection.query(
            P.PartitionsResponse, lambda c: P.Partitions(c, super_stream),
            f"partitions of {super_stream!r}").streams)

    def route(self, super_stream: str, routing_key: str) -> list[str]:
        return list(self.connection.query(
            P.RouteResponse, lambda c: P.Route(c, routing_key, super_stream),
            f"route {routing_key!r} in {super_stream!r}").streams)

    def create_super_stream(self, name: str, *, partitions: int | None = None,
                            binding_keys: list[str] | None = None,
                            exist_ok: bool = False, **arguments: Any) -> None:
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
