"""The RabbitMQ Stream protocol's commands: the one place that knows their
byte layouts (the Deliver chunk inside is the C core's, ``csrc/``; the
primitive types are ``wire``'s; the producer's own frames, read and patched
in place, ``publish_frames``'s).

A frame is ``u32 size | u16 key | u16 version | body``, big-endian; a
response's key is its request's key with bit 15 set. Each command is a frozen
dataclass whose ``FIELDS`` list the body in wire order, so one generic
encoder and decoder serve all of them (``encode`` / ``decode``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import ProtocolError, TruncatedFrame
from .wire import (
    BYTES,
    I64,
    NULLABLE_STRING,
    OFFSET_FIRST,
    OFFSET_LAST,
    OFFSET_NEXT,
    OFFSET_NONE,
    OFFSET_OFFSET,
    OFFSET_SPEC,
    OFFSET_TIMESTAMP,
    STRING,
    STRING_MAP,
    U8,
    U16,
    U32,
    U64,
    Array,
    Fields,
    Map,
    OffsetSpec,
    Reader,
    Record,
    Rest,
    RouteStreams,
    Trailing,
    Writer,
    read_fields,
    write_fields,
)

__all__ = ["OFFSET_FIRST", "OFFSET_LAST", "OFFSET_NEXT", "OFFSET_NONE",
           "OFFSET_OFFSET", "OFFSET_TIMESTAMP", "OffsetSpec"]

RESPONSE_BIT = 0x8000
RESPONSE_OK = 0x01
RESPONSE_SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
RESPONSE_SASL_CHALLENGE = 0x0A

# --- commands ----------------------------------------------------------------

COMMANDS: dict[int, type[Command]] = {}


@dataclass(frozen=True)
class Command:
    KEY: ClassVar[int]
    FIELDS: ClassVar[Fields]
    # Versions whose layout differs list their fields here.
    FIELDS_BY_VERSION: ClassVar[dict[int, Fields]] = {}

    version: int = field(default=1, kw_only=True)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "KEY" in cls.__dict__:
            COMMANDS[cls.KEY] = cls

    @classmethod
    def fields_for(cls, version: int) -> Fields:
        return cls.FIELDS_BY_VERSION.get(version, cls.FIELDS)

    @property
    def response_code(self) -> int:
        return getattr(self, "code", RESPONSE_OK)


def encode(cmd: Command) -> bytes:
    """The frame of ``cmd``, size prefix included."""
    w = Writer()
    w.out += b"\0\0\0\0"
    U16.write(w, cmd.KEY)
    U16.write(w, cmd.version)
    write_fields(w, cmd, cmd.fields_for(cmd.version))
    struct.pack_into(">I", w.out, 0, len(w.out) - 4)
    return bytes(w.out)


def decode(frame: bytes | memoryview) -> Command:
    """Decode one frame given without its size prefix; raises
    ``ProtocolError`` (``TruncatedFrame`` when short) on bad bytes."""
    if len(frame) < 4:
        raise TruncatedFrame(f"frame of {len(frame)} bytes has no key and "
                             "version", position=0)
    key, version = struct.unpack_from(">HH", frame, 0)
    cls = COMMANDS.get(key)
    if cls is None:
        raise ProtocolError(f"unknown command key {key:#06x}", position=0)
    r = Reader(frame, 4, cls.__name__)
    cmd = cls(**read_fields(r, cls.fields_for(version)), version=version)
    if r.remaining():
        raise ProtocolError(f"{cls.__name__}: {r.remaining()} bytes left "
                            f"after the last field", position=r.pos)
    return cmd


def frame_key(frame: bytes | memoryview) -> int:
    if len(frame) < 4:
        raise TruncatedFrame(f"frame of {len(frame)} bytes", position=0)
    key: int = struct.unpack_from(">H", frame, 0)[0]
    return key


CORR = ("correlation_id", U32)
CODE = ("code", U16)


@dataclass(frozen=True)
class Request(Command):
    correlation_id: int


@dataclass(frozen=True)
class Response(Command):
    """A response carrying only its code."""

    correlation_id: int
    code: int
    FIELDS: ClassVar[Fields] = (CORR, CODE)


# 0x0001
@dataclass(frozen=True)
class DeclarePublisher(Request):
    KEY = 0x0001
    publisher_id: int
    reference: str | None
    stream: str
    FIELDS = (CORR, ("publisher_id", U8), ("reference", NULLABLE_STRING),
              ("stream", STRING))


class DeclarePublisherResponse(Response):
    KEY = 0x8001


@dataclass(frozen=True)
class Message:
    publishing_id: int
    data: bytes
    FIELDS: ClassVar[Fields] = (("publishing_id", U64), ("data", BYTES))


@dataclass(frozen=True)
class FilteredMessage:
    publishing_id: int
    filter_value: str | None
    data: bytes
    FIELDS: ClassVar[Fields] = (("publishing_id", U64),
                                ("filter_value", NULLABLE_STRING), ("data", BYTES))


# 0x0002 (v2 adds a filter value per message, RabbitMQ 3.13+)
@dataclass(frozen=True)
class Publish(Command):
    KEY = 0x0002
    publisher_id: int
    messages: tuple[Message, ...] | tuple[FilteredMessage, ...]
    FIELDS = (("publisher_id", U8), ("messages", Array(Record(Message))))
    FIELDS_BY_VERSION = {2: (("publisher_id", U8),
                             ("messages", Array(Record(FilteredMessage))))}


# 0x0003
@dataclass(frozen=True)
class PublishConfirm(Command):
    KEY = 0x0003
    publisher_id: int
    publishing_ids: tuple[int, ...]
    FIELDS = (("publisher_id", U8), ("publishing_ids", Array(U64)))


@dataclass(frozen=True)
class PublishingError:
    publishing_id: int
    code: int
    FIELDS: ClassVar[Fields] = (("publishing_id", U64), ("code", U16))


# 0x0004
@dataclass(frozen=True)
class PublishError(Command):
    KEY = 0x0004
    publisher_id: int
    errors: tuple[PublishingError, ...]
    FIELDS = (("publisher_id", U8), ("errors", Array(Record(PublishingError))))


# 0x0005
@dataclass(frozen=True)
class QueryPublisherSequence(Request):
    KEY = 0x0005
    reference: str
    stream: str
    FIELDS = (CORR, ("reference", STRING), ("stream", STRING))


@dataclass(frozen=True)
class QueryPublisherSequenceResponse(Response):
    KEY = 0x8005
    sequence: int
    FIELDS = (CORR, CODE, ("sequence", U64))


# 0x0006
@dataclass(frozen=True)
class DeletePublisher(Request):
    KEY = 0x0006
    publisher_id: int
    FIELDS = (CORR, ("publisher_id", U8))


class DeletePublisherResponse(Response):
    KEY = 0x8006


# 0x0007
@dataclass(frozen=True)
class Subscribe(Request):
    KEY = 0x0007
    subscription_id: int
    stream: str
    offset: OffsetSpec
    credit: int
    properties: dict[str, str] = field(default_factory=dict)
    FIELDS = (CORR, ("subscription_id", U8), ("stream", STRING),
              ("offset", OFFSET_SPEC), ("credit", U16),
              ("properties", Trailing(STRING_MAP, {})))


class SubscribeResponse(Response):
    KEY = 0x8007


# 0x0008: the chunk is decoded by the C core; here it stays bytes.
@dataclass(frozen=True)
class Deliver(Command):
    KEY = 0x0008
    subscription_id: int
    chunk: bytes
    committed_chunk_id: int | None = None
    FIELDS = (("subscription_id", U8), ("chunk", Rest()))
    FIELDS_BY_VERSION = {2: (("subscription_id", U8),
                             ("committed_chunk_id", U64), ("chunk", Rest()))}


# 0x0009
@dataclass(frozen=True)
class Credit(Command):
    KEY = 0x0009
    subscription_id: int
    credit: int
    FIELDS = (("subscription_id", U8), ("credit", U16))


# Sent only on failure, and without a correlation id.
@dataclass(frozen=True)
class CreditResponse(Command):
    KEY = 0x8009
    code: int
    subscription_id: int
    FIELDS = (CODE, ("subscription_id", U8))


# 0x000a
@dataclass(frozen=True)
class StoreOffset(Command):
    KEY = 0x000A
    reference: str
    stream: str
    offset: int
    FIELDS = (("reference", STRING), ("stream", STRING), ("offset", U64))


# 0x000b
@dataclass(frozen=True)
class QueryOffset(Request):
    KEY = 0x000B
    reference: str
    stream: str
    FIELDS = (CORR, ("reference", STRING), ("stream", STRING))


@dataclass(frozen=True)
class QueryOffsetResponse(Response):
    KEY = 0x800B
    offset: int
    FIELDS = (CORR, CODE, ("offset", U64))


# 0x000c
@dataclass(frozen=True)
class Unsubscribe(Request):
    KEY = 0x000C
    subscription_id: int
    FIELDS = (CORR, ("subscription_id", U8))


class UnsubscribeResponse(Response):
    KEY = 0x800C


# 0x000d
@dataclass(frozen=True)
class Create(Request):
    KEY = 0x000D
    stream: str
    arguments: dict[str, str]
    FIELDS = (CORR, ("stream", STRING), ("arguments", STRING_MAP))


class CreateResponse(Response):
    KEY = 0x800D


# 0x000e
@dataclass(frozen=True)
class Delete(Request):
    KEY = 0x000E
    stream: str
    FIELDS = (CORR, ("stream", STRING))


class DeleteResponse(Response):
    KEY = 0x800E


# 0x000f
@dataclass(frozen=True)
class Metadata(Request):
    KEY = 0x000F
    streams: tuple[str, ...]
    FIELDS = (CORR, ("streams", Array(STRING)))


@dataclass(frozen=True)
class Broker:
    reference: int
    host: str
    port: int
    FIELDS: ClassVar[Fields] = (("reference", U16), ("host", STRING), ("port", U32))


NO_LEADER = 0xFFFF


@dataclass(frozen=True)
class StreamMetadata:
    stream: str
    code: int
    leader: int  # a Broker reference, NO_LEADER when there is none
    replicas: tuple[int, ...]
    FIELDS: ClassVar[Fields] = (("stream", STRING), ("code", U16), ("leader", U16),
              ("replicas", Array(U16)))


@dataclass(frozen=True)
class MetadataResponse(Command):
    KEY = 0x800F
    correlation_id: int
    brokers: tuple[Broker, ...]
    streams: tuple[StreamMetadata, ...]
    FIELDS = (CORR, ("brokers", Array(Record(Broker))),
              ("streams", Array(Record(StreamMetadata))))


# 0x0010
@dataclass(frozen=True)
class MetadataUpdate(Command):
    KEY = 0x0010
    code: int
    stream: str
    FIELDS = (CODE, ("stream", STRING))


# 0x0011
@dataclass(frozen=True)
class PeerProperties(Request):
    KEY = 0x0011
    properties: dict[str, str]
    FIELDS = (CORR, ("properties", STRING_MAP))


@dataclass(frozen=True)
class PeerPropertiesResponse(Response):
    KEY = 0x8011
    properties: dict[str, str]
    FIELDS = (CORR, CODE, ("properties", STRING_MAP))


# 0x0012
@dataclass(frozen=True)
class SaslHandshake(Request):
    KEY = 0x0012
    FIELDS = (CORR,)


@dataclass(frozen=True)
class SaslHandshakeResponse(Response):
    KEY = 0x8012
    mechanisms: tuple[str, ...]
    FIELDS = (CORR, CODE, ("mechanisms", Array(STRING)))


# 0x0013
@dataclass(frozen=True)
class SaslAuthenticate(Request):
    KEY = 0x0013
    mechanism: str
    data: bytes | None = field(repr=False)  # PLAIN carries the password
    FIELDS = (CORR, ("mechanism", STRING), ("data", BYTES))


@dataclass(frozen=True)
class SaslAuthenticateResponse(Response):
    KEY = 0x8013
    challenge: str = ""
    FIELDS = (CORR, CODE, ("challenge", Trailing(STRING, "")))


# 0x0014: the server proposes, the client answers with what it agrees on.
@dataclass(frozen=True)
class Tune(Command):
    KEY = 0x0014
    frame_max: int
    heartbeat: int
    FIELDS = (("frame_max", U32), ("heartbeat", U32))


@dataclass(frozen=True)
class TuneResponse(Tune):
    KEY = 0x8014


# 0x0015
@dataclass(frozen=True)
class Open(Request):
    KEY = 0x0015
    virtual_host: str
    FIELDS = (CORR, ("virtual_host", STRING))


@dataclass(frozen=True)
class OpenResponse(Response):
    KEY = 0x8015
    properties: dict[str, str] = field(default_factory=dict)
    FIELDS = (CORR, CODE, ("properties", Trailing(STRING_MAP, {})))


# 0x0016
@dataclass(frozen=True)
class Close(Request):
    KEY = 0x0016
    closing_code: int
    reason: str
    FIELDS = (CORR, ("closing_code", U16), ("reason", STRING))


class CloseResponse(Response):
    KEY = 0x8016


# 0x0017
@dataclass(frozen=True)
class Heartbeat(Command):
    KEY = 0x0017
    FIELDS = ()


# 0x0018
@dataclass(frozen=True)
class Route(Request):
    KEY = 0x0018
    routing_key: str
    super_stream: str
    FIELDS = (CORR, ("routing_key", STRING), ("super_stream", STRING))


@dataclass(frozen=True)
class RouteResponse(Response):
    KEY = 0x8018
    streams: tuple[str, ...]
    FIELDS = (CORR, CODE, ("streams", RouteStreams()))


# 0x0019
@dataclass(frozen=True)
class Partitions(Request):
    KEY = 0x0019
    super_stream: str
    FIELDS = (CORR, ("super_stream", STRING))


@dataclass(frozen=True)
class PartitionsResponse(Response):
    KEY = 0x8019
    streams: tuple[str, ...]
    FIELDS = (CORR, CODE, ("streams", Array(STRING)))


# 0x001a: asked by the server (single active consumer), answered by us.
@dataclass(frozen=True)
class ConsumerUpdate(Request):
    KEY = 0x001A
    subscription_id: int
    active: int
    FIELDS = (CORR, ("subscription_id", U8), ("active", U8))


@dataclass(frozen=True)
class ConsumerUpdateResponse(Response):
    KEY = 0x801A
    offset: OffsetSpec
    FIELDS = (CORR, CODE, ("offset", OFFSET_SPEC))


@dataclass(frozen=True)
class CommandVersion:
    key: int
    min_version: int
    max_version: int
    FIELDS: ClassVar[Fields] = (("key", U16), ("min_version", U16), ("max_version", U16))


# 0x001b (RabbitMQ 3.11+)
@dataclass(frozen=True)
class ExchangeCommandVersions(Request):
    KEY = 0x001B
    commands: tuple[CommandVersion, ...]
    FIELDS = (CORR, ("commands", Array(Record(CommandVersion))))


@dataclass(frozen=True)
class ExchangeCommandVersionsResponse(Response):
    KEY = 0x801B
    commands: tuple[CommandVersion, ...]
    FIELDS = (CORR, CODE, ("commands", Array(Record(CommandVersion))))


# 0x001c (RabbitMQ 3.11+)
@dataclass(frozen=True)
class StreamStats(Request):
    KEY = 0x001C
    stream: str
    FIELDS = (CORR, ("stream", STRING))


@dataclass(frozen=True)
class StreamStatsResponse(Response):
    KEY = 0x801C
    stats: dict[str, int]
    FIELDS = (CORR, CODE, ("stats", Map(STRING, I64)))


# 0x001d (RabbitMQ 3.13+)
@dataclass(frozen=True)
class CreateSuperStream(Request):
    KEY = 0x001D
    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]
    arguments: dict[str, str]
    FIELDS = (CORR, ("name", STRING), ("partitions", Array(STRING)),
              ("binding_keys", Array(STRING)), ("arguments", STRING_MAP))


class CreateSuperStreamResponse(Response):
    KEY = 0x801D


# 0x001e (RabbitMQ 3.13+)
@dataclass(frozen=True)
class DeleteSuperStream(Request):
    KEY = 0x001E
    name: str
    FIELDS = (CORR, ("name", STRING))


class DeleteSuperStreamResponse(Response):
    KEY = 0x801E


# 0x001f (RabbitMQ 4.3+): the offset a subscription with this offset
# specification and these properties (filter.N, match-unfiltered, and
# chunk_selector "all" to count offset-tracking chunks too) would start at:
# for an offset, the first offset of the chunk holding it. The broker leaves
# out an empty properties map, as in Subscribe, and answers every code with
# an offset specification of type OFFSET_OFFSET (0 on errors; 0x13, NoOffset,
# when the stream's log cannot resolve it).
@dataclass(frozen=True)
class ResolveOffsetSpec(Request):
    KEY = 0x001F
    stream: str
    offset: OffsetSpec
    properties: dict[str, str] = field(default_factory=dict)
    FIELDS = (CORR, ("stream", STRING), ("offset", OFFSET_SPEC),
              ("properties", Trailing(STRING_MAP, {})))


@dataclass(frozen=True)
class ResolveOffsetSpecResponse(Response):
    KEY = 0x801F
    offset: OffsetSpec | None = None
    FIELDS = (CORR, CODE, ("offset", Trailing(OFFSET_SPEC, None)))
