"""pystream: the fastest way to read a RabbitMQ stream from Python.

Deliver frames are decoded in C into Arrow columns; the documentation is
in docs/ (README.md links its pages).
"""

from . import metrics
from ._core import Chunk, FrameReader, StreamDecoder, crc32, decode, schema
from ._version import __version__
from .build import BuildInfo, build_info
from .client import Client, StreamInfo, connect
from .consumer import Consumer
from .credit import Credit
from .errors import (
    AccessRefused,
    AuthenticationFailure,
    AuthenticationFailureLoopback,
    CertificateVerificationError,
    CodecUnavailable,
    ConfirmTimeout,
    ConnectionClosed,
    ConnectionLost,
    CorruptChunk,
    DataLoss,
    DecompressionLimit,
    ExactlyOnceError,
    FrameTooLarge,
    InternalError,
    MalformedMessage,
    MissingPassword,
    NoOffset,
    PartitionsFailed,
    PreconditionFailed,
    ProducerClosed,
    ProtocolError,
    PublisherDoesNotExist,
    PublishError,
    ReadInterrupted,
    RequestTimeout,
    ResponseError,
    RoutingError,
    SaslError,
    SaslMechanismNotSupported,
    SendInterrupted,
    SendTimeout,
    StreamAlreadyExists,
    StreamDoesNotExist,
    StreamError,
    StreamNotAvailable,
    SubscriptionIdAlreadyExists,
    SubscriptionIdDoesNotExist,
    TruncatedFrame,
    UnknownFrame,
    UnsupportedFeature,
    VirtualHostAccessFailure,
)
from .pool import AddressResolver, Endpoint
from .producer import Producer
from .records import Filter, Message
from .super_stream import SuperStreamProducer
from .tls import tls_context
from .uri import BrokerAddress, parse_uri

__all__ = [
    "__version__", "connect", "metrics", "Client", "Endpoint", "StreamInfo",
    "BrokerAddress", "parse_uri", "AddressResolver", "tls_context",
    "Consumer", "Filter", "Message", "Credit", "Producer",
    "SuperStreamProducer", "PublishError",
    "decode", "schema", "StreamDecoder", "Chunk", "FrameReader", "crc32",
    "StreamError", "ConnectionLost", "ReadInterrupted", "SendInterrupted",
    "CertificateVerificationError", "ConnectionClosed", "RequestTimeout",
    "UnsupportedFeature", "ProtocolError", "TruncatedFrame", "FrameTooLarge",
    "CorruptChunk", "DataLoss", "DecompressionLimit", "MalformedMessage", "ResponseError",
    "ExactlyOnceError",
    "StreamDoesNotExist", "SubscriptionIdAlreadyExists",
    "SubscriptionIdDoesNotExist", "StreamAlreadyExists", "StreamNotAvailable",
    "SaslMechanismNotSupported", "AuthenticationFailure", "SaslError",
    "AuthenticationFailureLoopback", "VirtualHostAccessFailure",
    "UnknownFrame", "InternalError", "AccessRefused", "PreconditionFailed",
    "PublisherDoesNotExist", "NoOffset", "MissingPassword",
    "ConfirmTimeout", "SendTimeout", "ProducerClosed", "RoutingError",
    "PartitionsFailed", "CodecUnavailable", "BuildInfo", "build_info",
]
