"""The user's handle on a broker: ``pystream.connect(uri) -> Client``, the
admin operations and the consumers and producers opened from it.

``Client`` holds an ``admin.Admin``, which owns the admin connection and the
pool of connections to the nodes, and hands it (what consumers and
producers need of a client) to each consumer and producer it opens. The
admin operations here are delegations to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .admin import STREAM_ARGUMENTS, Admin, StreamInfo
from .consumer import Consumer
from .producer import Producer
from .super_stream import SuperStreamProducer
from .uri import BrokerAddress

if TYPE_CHECKING:
    from .connection import Connection
    from .offsets import Offset
    from .pool import AddressResolver, ConnectionPool, Endpoint
    from .records import Filter

__all__ = ["Client", "StreamInfo", "STREAM_ARGUMENTS", "connect"]


class Client:
    """A connection to a broker with its admin operations, consumers and
    producers. Use as a context manager, or call ``close()``."""

    def __init__(self, uri: str | BrokerAddress = "rabbitmq-stream://localhost",
                 *, address_resolver: AddressResolver | None = None,
                 max_subscriptions_per_connection: int = 255,
                 **options: Any) -> None:
        """See ``connect`` for the options."""
        self._admin = Admin(uri, address_resolver=address_resolver,
                            max_subscriptions_per_connection=max_subscriptions_per_connection,
                            **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pystream.{type(self).__name__} {self.connection.address.uri()}>"

    @property
    def address(self) -> BrokerAddress:
        """The broker's address, from the URI."""
        return self._admin.address

    @property
    def pool(self) -> ConnectionPool:
        """The connections consumers and producers open to the nodes of
        their streams."""
        return self._admin.pool

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._admin.closed

    @property
    def connection(self) -> Connection:
        """The connection admin requests go over; reopened on first use after
        it was lost (a broker restart; in a cluster, to another node while
        the URI's is down), so the client outlives failures."""
        return self._admin.connection

    def close(self) -> None:
        """Close the client, its consumers' connections included."""
        self._admin.close()

    @property
    def server_properties(self) -> dict[str, str]:
        """What the broker said of itself: ``product``, ``version``, ..."""
        return self._admin.server_properties

    @property
    def server_version(self) -> tuple[int, ...]:
        """The broker's version as numbers, e.g. ``(4, 0, 5)``."""
        return self._admin.server_version

    def supports(self, feature: str) -> bool:
        """Whether the broker has a feature of ``features.FIRST_RELEASE``."""
        return self._admin.supports(feature)

    def locate(self, stream: str, *, replica: bool = True,
               timeout: float | None = None) -> Endpoint:
        """The node to read ``stream`` from: a replica when there is one and
        ``replica`` is true, else the leader. ``timeout`` as for
        ``metadata``."""
        return self._admin.locate(stream, replica=replica, timeout=timeout)

    # --- streams --------------------------------------------------------------

    def create_stream(self, stream: str, *, exist_ok: bool = False,
                      **arguments: Any) -> None:
        """Create a stream. Keyword arguments: ``max_length_bytes``,
        ``max_age`` (a ``timedelta`` or the broker's text such as ``"7D"``),
        ``stream_max_segment_size_bytes``, ``filter_size`` (3.13+),
        ``initial_cluster_size``, ``leader_locator``; other broker arguments
        may be given with ``_`` for ``-``."""
        self._admin.create_stream(stream, exist_ok=exist_ok, **arguments)

    def delete_stream(self, stream: str, *, missing_ok: bool = False) -> None:
        """Delete ``stream``; ``StreamDoesNotExist`` if there is none, unless
        ``missing_ok``."""
        self._admin.delete_stream(stream, missing_ok=missing_ok)

    def stream_exists(self, stream: str) -> bool:
        """Whether ``stream`` exists (asked through metadata)."""
        return self._admin.stream_exists(stream)

    def metadata(self, *streams: str,
                 timeout: float | None = None) -> dict[str, StreamInfo]:
        """Each stream's leader and replicas (``StreamInfo``); a missing stream's
        entry has ``error`` set rather than raising. ``RequestTimeout`` after
        ``timeout`` seconds (None: the connection's ``request_timeout``)."""
        return self._admin.metadata(*streams, timeout=timeout)

    def stream_stats(self, stream: str, *, timeout: float | None = None) -> dict[str, int]:
        """The broker's figures for a stream (3.11+): ``first_chunk_id``,
        ``committed_chunk_id``, and from 4.3 ``committed_offset`` (the last
        committed offset), ...; ``RequestTimeout`` after ``timeout`` seconds
        (None: the connection's ``request_timeout``)."""
        return self._admin.stream_stats(stream, timeout=timeout)

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
        return self._admin.resolve_offset(stream, offset, filter=filter)

    def query_offset(self, stream: str, reference: str) -> int:
        """The offset stored for a consumer name; ``NoOffset`` if none."""
        return self._admin.query_offset(stream, reference)

    def store_offset(self, stream: str, reference: str, offset: int) -> None:
        """Store a consumer's offset (the broker does not answer)."""
        self._admin.store_offset(stream, reference, offset)

    def query_publisher_sequence(self, stream: str, reference: str) -> int:
        """The last publishing id the broker kept for a named producer, 0 if
        it knows none."""
        return self._admin.query_publisher_sequence(stream, reference)

    # --- super streams ----------------------------------------------------------

    def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of ``super_stream``, in order."""
        return self._admin.partitions(super_stream)

    def route(self, super_stream: str, routing_key: str) -> list[str]:
        """The partitions the broker's binding keys route ``routing_key`` to in
        ``super_stream``."""
        return self._admin.route(super_stream, routing_key)

    def create_super_stream(self, name: str, *, partitions: int | None = None,
                            binding_keys: list[str] | None = None,
                            exist_ok: bool = False, **arguments: Any) -> None:
        """Create a super stream of ``partitions`` streams named ``name-0``..
        (binding keys ``0``..), or one partition ``name-KEY`` per binding key.
        Stream arguments as for ``create_stream``. RabbitMQ 3.13+."""
        self._admin.create_super_stream(name, partitions=partitions,
                                        binding_keys=binding_keys,
                                        exist_ok=exist_ok, **arguments)

    def delete_super_stream(self, name: str, *, missing_ok: bool = False) -> None:
        """Delete a super stream and its partitions (RabbitMQ 3.13+);
        ``StreamDoesNotExist`` if there is none, unless ``missing_ok``."""
        self._admin.delete_super_stream(name, missing_ok=missing_ok)

    # --- consuming --------------------------------------------------------------

    def consumer(self, stream: str | None = None, offset: Any = "next",
                 **options: Any) -> Consumer:
        """Read ``stream`` (or ``super_stream=``) from ``offset``; see
        ``pystream.consumer.Consumer`` for the options."""
        return Consumer(self._admin, stream, offset, **options)

    def producer(self, stream: str | None = None, *,
                 super_stream: str | None = None,
                 **options: Any) -> Producer | SuperStreamProducer:
        """Publish to ``stream``, or to the partitions of ``super_stream``
        (with ``routing_key=`` or ``route=``); see ``pystream.producer``."""
        if stream is not None and super_stream is None:
            return Producer(self._admin, stream, **options)
        if super_stream is not None and stream is None:
            return SuperStreamProducer(self._admin, super_stream, **options)
        raise ValueError("give a stream or super_stream=, not both")


def connect(uri: str | BrokerAddress = "rabbitmq-stream://localhost",
            **options: Any) -> Client:
    """Connect to a broker. Options: ``ssl_context``, ``frame_max``,
    ``heartbeat`` (seconds), ``connect_timeout``, ``request_timeout``,
    ``sasl_mechanism`` ("PLAIN" or "EXTERNAL"), ``connection_name``;
    ``address_resolver`` (maps the ``Endpoint`` metadata advertises to the one
    to dial) and ``max_subscriptions_per_connection`` (255) for the
    connections consumers open to the nodes of their streams."""
    return Client(uri, **options)
