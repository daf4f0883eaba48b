"""The user's handle on a broker: ``pystream.connect(uri) -> Client``, the
admin operations (``admin.Admin``) and the consumers and producers opened
from it."""

from __future__ import annotations

from typing import Any

from .admin import STREAM_ARGUMENTS, Admin, StreamInfo
from .consumer import Consumer
from .producer import Producer
from .super_stream import SuperStreamProducer
from .uri import BrokerAddress

__all__ = ["Client", "StreamInfo", "STREAM_ARGUMENTS", "connect"]


class Client(Admin):
    """A connection to a broker with its admin operations, consumers and
    producers. Use as a context manager, or call ``close()``."""

    def __enter__(self) -> Client:
        return self

    # --- consuming --------------------------------------------------------------

    def consumer(self, stream: str | None = None, offset: Any = "next",
                 **options: Any) -> Consumer:
        """Read ``stream`` (or ``super_stream=``) from ``offset``; see
        ``pystream.consumer.Consumer`` for the options."""
        return Consumer(self, stream, offset, **options)

    def producer(self, stream: str | None = None, *,
                 super_stream: str | None = None,
                 **options: Any) -> Producer | SuperStreamProducer:
        """Publish to ``stream``, or to the partitions of ``super_stream``
        (with ``routing_key=`` or ``route=``); see ``pystream.producer``."""
        if stream is not None and super_stream is None:
            return Producer(self, stream, **options)
        if super_stream is not None and stream is None:
            return SuperStreamProducer(self, super_stream, **options)
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
