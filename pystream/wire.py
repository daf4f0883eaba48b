"""The stream protocol's primitive wire types, as the protocol reference
names them: ``string`` is an i16 length and UTF-8 bytes (-1: null),
``bytes`` an i32 length (-1: null), an array an i32 count then its items, a
map an i32 count of key/value pairs; integers are big-endian. Commands
(``protocol``) list their fields as ``(name, WireType)`` pairs.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from .errors import ProtocolError, TruncatedFrame

# Offset specification types (Subscribe, ConsumerUpdate response,
# ResolveOffsetSpec).
OFFSET_NONE = 0
OFFSET_FIRST = 1
OFFSET_LAST = 2
OFFSET_NEXT = 3
OFFSET_OFFSET = 4
OFFSET_TIMESTAMP = 5


class Reader:
    """Reads a frame body; every read past its end is a ``TruncatedFrame``."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: bytes | memoryview, pos: int, what: str) -> None:
        self.buf = memoryview(buf)
        self.pos = pos
        self.what = what

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise TruncatedFrame(
                f"{self.what}: needs {n} bytes at {self.pos}, frame has "
                f"{len(self.buf)}", position=self.pos)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct) -> int:
        value: int = st.unpack(self.take(st.size))[0]  # every Struct here is one integer
        return value


class Writer:
    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out = bytearray()

    def pack(self, st: struct.Struct, value: int) -> None:
        self.out += st.pack(value)


# --- wire types --------------------------------------------------------------

class WireType:
    def write(self, w: Writer, value: Any) -> None:
        raise NotImplementedError

    def read(self, r: Reader) -> Any:
        raise NotImplementedError


#: A command's or record's fields in wire order: (attribute, wire type).
Fields = tuple[tuple[str, WireType], ...]


class Fielded(Protocol):
    """A record type (``Record``): a dataclass that lists its ``FIELDS``."""

    FIELDS: ClassVar[Fields]

    def __init__(self, **fields: Any) -> None: ...


class Int(WireType):
    def __init__(self, fmt: str) -> None:
        self.st = struct.Struct(">" + fmt)

    def write(self, w: Writer, value: int) -> None:
        try:
            w.pack(self.st, value)
        except struct.error as exc:
            raise ValueError(f"{value!r} does not fit {self.st.format}") from exc

    def read(self, r: Reader) -> int:
        return r.unpack(self.st)


U8, U16, U32, U64 = Int("B"), Int("H"), Int("I"), Int("Q")
I16, I32, I64 = Int("h"), Int("i"), Int("q")


class String(WireType):
    """A string the protocol never leaves null: a null from the broker is a
    protocol error here rather than a ``None`` that fails far away."""

    def write(self, w: Writer, value: str) -> None:
        data = value.encode()
        if len(data) > 0x7FFF:
            raise ValueError(f"string of {len(data)} bytes exceeds 32767")
        w.pack(I16.st, len(data))
        w.out += data

    def read(self, r: Reader) -> str:
        n = I16.read(r)
        if n < 0:
            raise ProtocolError(f"{r.what}: null where a string is required",
                                position=r.pos - 2)
        try:
            return str(r.take(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{r.what}: string is not UTF-8",
                                position=r.pos - n) from exc


class NullableString(WireType):
    """A string that may be null (length -1): a publisher's reference, a
    message's filter value."""

    def __init__(self) -> None:
        self.inner = String()

    def write(self, w: Writer, value: str | None) -> None:
        if value is None:
            w.pack(I16.st, -1)
        else:
            self.inner.write(w, value)

    def read(self, r: Reader) -> str | None:
        if r.remaining() >= 2 and I16.st.unpack_from(r.buf, r.pos)[0] < 0:
            r.pos += 2
            return None
        return self.inner.read(r)


class Bytes(WireType):
    def write(self, w: Writer, value: bytes | None) -> None:
        if value is None:
            w.pack(I32.st, -1)
            return
        w.pack(I32.st, len(value))
        w.out += value

    def read(self, r: Reader) -> bytes | None:
        n = I32.read(r)
        return None if n < 0 else bytes(r.take(n))


STRING, NULLABLE_STRING, BYTES = String(), NullableString(), Bytes()


class Array(WireType):
    def __init__(self, item: WireType) -> None:
        self.item = item

    def write(self, w: Writer, value: Sequence[Any]) -> None:
        w.pack(I32.st, len(value))
        for v in value:
            self.item.write(w, v)

    def read(self, r: Reader) -> tuple[Any, ...]:
        n = I32.read(r)
        if n < 0 or n > r.remaining():  # every item takes at least one byte
            raise TruncatedFrame(f"{r.what}: array of {n} items in "
                                 f"{r.remaining()} bytes", position=r.pos)
        return tuple(self.item.read(r) for _ in range(n))


class Map(WireType):
    def __init__(self, key: WireType, value: WireType) -> None:
        self.pair = Array(Pair(key, value))

    def write(self, w: Writer, value: dict[Any, Any]) -> None:
        self.pair.write(w, list(value.items()))

    def read(self, r: Reader) -> dict[Any, Any]:
        return dict(self.pair.read(r))


class Pair(WireType):
    def __init__(self, first: WireType, second: WireType) -> None:
        self.first, self.second = first, second

    def write(self, w: Writer, value: tuple[Any, Any]) -> None:
        self.first.write(w, value[0])
        self.second.write(w, value[1])

    def read(self, r: Reader) -> tuple[Any, Any]:
        return self.first.read(r), self.second.read(r)


class Record(WireType):
    """A nested record given as a dataclass with its own FIELDS."""

    def __init__(self, cls: type[Fielded]) -> None:
        self.cls = cls

    def write(self, w: Writer, value: Any) -> None:
        write_fields(w, value, value.FIELDS)

    def read(self, r: Reader) -> Any:
        return self.cls(**read_fields(r, self.cls.FIELDS))


class Trailing(WireType):
    """A last field the broker leaves out when it is empty (Open's
    properties, SaslAuthenticate's challenge, Subscribe's properties)."""

    def __init__(self, inner: WireType, empty: Any) -> None:
        self.inner, self.empty = inner, empty

    def write(self, w: Writer, value: Any) -> None:
        if value != self.empty:
            self.inner.write(w, value)

    def read(self, r: Reader) -> Any:
        return self.inner.read(r) if r.remaining() else self.empty


class Rest(WireType):
    """Everything to the end of the frame, untouched (a Deliver's chunk)."""

    def write(self, w: Writer, value: bytes) -> None:
        w.out += value

    def read(self, r: Reader) -> bytes:
        return bytes(r.take(r.remaining()))


@dataclass(frozen=True)
class OffsetSpec:
    """Where a subscription starts: ``OFFSET_FIRST/LAST/NEXT`` carry no value;
    ``OFFSET_OFFSET`` an offset, ``OFFSET_TIMESTAMP`` milliseconds since the
    epoch."""

    type: int
    value: int = 0

    def __post_init__(self) -> None:
        if not OFFSET_NONE <= self.type <= OFFSET_TIMESTAMP:
            raise ValueError(f"unknown offset type {self.type}")


class OffsetSpecType(WireType):
    def write(self, w: Writer, value: OffsetSpec) -> None:
        U16.write(w, value.type)
        if value.type == OFFSET_OFFSET:
            U64.write(w, value.value)
        elif value.type == OFFSET_TIMESTAMP:
            I64.write(w, value.value)

    def read(self, r: Reader) -> OffsetSpec:
        kind = U16.read(r)
        if kind == OFFSET_OFFSET:
            return OffsetSpec(kind, U64.read(r))
        if kind == OFFSET_TIMESTAMP:
            return OffsetSpec(kind, I64.read(r))
        if kind > OFFSET_TIMESTAMP:
            raise ProtocolError(f"{r.what}: unknown offset type {kind}",
                                position=r.pos - 2)
        return OffsetSpec(kind)


class RouteStreams(WireType):
    """Route answers: a list of streams on 3.11+, one string before."""

    def write(self, w: Writer, value: tuple[str, ...]) -> None:
        Array(STRING).write(w, value)

    def read(self, r: Reader) -> tuple[str, ...]:
        if r.remaining() >= 2:
            n = I16.st.unpack(r.buf[r.pos:r.pos + 2])[0]
            if n + 2 == r.remaining():  # an array needs at least 4 bytes
                return (STRING.read(r),)
        return Array(STRING).read(r)


STRING_MAP = Map(STRING, STRING)
OFFSET_SPEC = OffsetSpecType()


def write_fields(w: Writer, obj: Any, spec: Fields) -> None:
    for name, wire in spec:
        wire.write(w, getattr(obj, name))


def read_fields(r: Reader, spec: Fields) -> dict[str, Any]:
    return {name: wire.read(r) for name, wire in spec}
