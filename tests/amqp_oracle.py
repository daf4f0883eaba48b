"""qpid-proton as the oracle for AMQP 1.0: building messages section by
section, and what the rendering rules of docs/decoding.md make of a value proton
decoded (the expected cell of a pystream column)."""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
import uuid
from typing import Any

from proton import (
    UNDESCRIBED,
    Array,
    Data,
    Described,
    Message,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    symbol,
    timestamp,
)

UTC = dt.UTC
# Sections by descriptor code (amqp.h).
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, SEQUENCE, VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78


def encode_value(value: Any) -> bytes:
    data = Data()
    data.put_object(value)
    return data.encode()


def section(code: int, value: Any) -> bytes:
    """``00 53 code`` and proton's encoding of ``value``."""
    return bytes([0x00, 0x53, code]) + encode_value(value)


def data_section(payload: bytes) -> bytes:
    return section(DATA, payload)


def message_head(**fields: Any) -> bytes:
    """Header, annotations, properties, application properties as proton
    encodes them (``Message(**fields).encode()`` without a body)."""
    return Message(**fields).encode()


class Raw:
    """Bytes that a proton sender sends as one message, as they are."""

    def __init__(self, encoded: bytes) -> None:
        self.encoded = encoded

    def send(self, sender: Any, tag: Any = None) -> Any:
        delivery = sender.delivery(tag or sender.delivery_tag())
        sender.stream(self.encoded)
        sender.advance()
        return delivery


def decode(entry: bytes) -> Message:
    message = Message()
    message.decode(entry)
    return message


# --- docs/decoding.md's rendering rules, from proton's values -----------------

def iso(ms: int) -> str:
    t = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def ms_of(value: Any) -> int:
    """A proton timestamp (ms) or a float of seconds (Message fields) as ms."""
    if isinstance(value, timestamp):
        return int(value)
    return round(value * 1000)


def shortest(value: float, single: bool) -> str:
    """Floats: the fewest digits that read back, without exponent from 1e-5
    to 1e17 (100.0 reads 100)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    for digits in range(1, 18):
        text = f"{value:.{digits - 1}e}"
        back = float(text)
        if (struct.unpack(">f", struct.pack(">f", back))[0] == value if single
                else back == value):
            break
    exponent = int(text.split("e")[1])
    if -5 <= exponent < 17:
        return f"{value:.{max(digits - 1 - exponent, 0)}f}"
    return text


def text(value: Any) -> str | None:
    """A map value, an id, a footer value: docs/decoding.md's text."""
    if value is None:
        return None
    if isinstance(value, (Described, list, dict, Array)):
        return as_json(value)
    return scalar_text(value)


def scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (decimal32, decimal64)):
        return struct.pack(">I" if isinstance(value, decimal32) else ">Q", int(value)).hex()
    if isinstance(value, decimal128):
        return bytes(value).hex()
    if isinstance(value, timestamp):
        return iso(int(value))
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float32):
        return shortest(float(value), True)
    if isinstance(value, float):
        return shortest(value, False)
    if isinstance(value, char):
        return str(value)
    if isinstance(value, (symbol, str)):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"no rendering rule for {type(value).__name__}: {value!r}")


def as_json(value: Any) -> str:
    """Lists, arrays, maps and described values as JSON: numbers and
    booleans bare (non-finite floats quoted), null, everything else as its
    text, quoted; map keys always strings."""
    if value is None:
        return "null"
    if isinstance(value, Described):
        return (f'{{"descriptor": {as_json(value.descriptor)}, '
                f'"value": {as_json(value.value)}}}')
    if isinstance(value, Array):
        if value.descriptor is not UNDESCRIBED:
            return "[" + ", ".join(as_json(Described(value.descriptor, e))
                                   for e in value.elements) + "]"
        return "[" + ", ".join(as_json(e) for e in value.elements) + "]"
    if isinstance(value, list):
        return "[" + ", ".join(as_json(e) for e in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(text(k), ensure_ascii=False)}: {as_json(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (float32, float)) and not isinstance(value, timestamp):
        rendered = scalar_text(value)
        return rendered if math.isfinite(float(value)) else json.dumps(rendered)
    if isinstance(value, int) and not isinstance(value, (timestamp, char, decimal32,
                                                          decimal64)):
        return str(int(value))
    return json.dumps(scalar_text(value), ensure_ascii=False)


def sections(entry: bytes) -> list[tuple[int, Any]]:
    """The sections of a stored entry, decoded by proton one by one."""
    out, pos, data = [], 0, Data()
    while pos < len(entry):
        data.clear()
        pos += data.decode(entry[pos:])
        data.rewind()
        data.next()
        described = data.get_object()
        out.append((int(described.descriptor), owned(described.value)))
    return out


def owned(value: Any) -> Any:
    """``value`` with proton's binary views (into a buffer it reuses) copied."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, Described):
        return Described(owned(value.descriptor), owned(value.value))
    if isinstance(value, Array):
        return Array(value.descriptor, value.type, *map(owned, value.elements))
    if isinstance(value, list):
        return [owned(v) for v in value]
    if isinstance(value, dict):
        return type(value)((owned(k), owned(v)) for k, v in value.items())
    return value


def section_value(entry: bytes, code: int) -> Any:
    """The value of the (first) section ``code``; None when it is absent."""
    return next((v for c, v in sections(entry) if c == code), None)


def text_map(mapping: dict | None) -> list[tuple[str, str | None]] | None:
    """A map section as pystream's map<string, string> column reads it."""
    if mapping is None:
        return None
    return [(text(k), text(v)) for k, v in mapping.items()]


def properties_row(fields: list | None) -> dict[str, Any] | None:
    """The properties struct pystream reads for a properties list."""
    if fields is None:
        return None
    f = list(fields) + [None] * (13 - len(fields))

    def when(value: Any) -> dt.datetime | None:
        return None if value is None else (
            dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=int(value)))
    return {
        "message_id": text(f[0]), "user_id": None if f[1] is None else bytes(f[1]),
        "to": f[2], "subject": f[3], "reply_to": f[4], "correlation_id": text(f[5]),
        "content_type": text(f[6]), "content_encoding": text(f[7]),
        "absolute_expiry_time": when(f[8]), "creation_time": when(f[9]),
        "group_id": f[10], "group_sequence": None if f[11] is None else int(f[11]),
        "reply_to_group_id": f[12],
    }


def header_row(fields: list | None) -> dict[str, Any] | None:
    """A header list with the AMQP defaults for absent or null fields."""
    if fields is None:
        return None
    f = list(fields) + [None] * (5 - len(fields))
    pick = lambda v, default: default if v is None else v  # noqa: E731
    return {"durable": pick(f[0], False), "priority": int(pick(f[1], 4)),
            "ttl": None if f[2] is None else int(f[2]),
            "first_acquirer": pick(f[3], False), "delivery_count": int(pick(f[4], 0))}


def sample_values() -> dict[str, Any]:
    """One value of every AMQP primitive type (as proton writes them)."""
    from proton import byte, int32, short, ubyte, uint, ulong, ushort
    return {
        "null": None, "bool": True, "ubyte": ubyte(200), "ushort": ushort(60000),
        "uint": uint(4000000000), "ulong": ulong(2 ** 64 - 1), "byte": byte(-100),
        "short": short(-30000), "int": int32(-2000000000), "long": -(2 ** 63),
        "float": float32(1.5), "double": 0.1, "decimal32": decimal32(0x2234_5678),
        "decimal64": decimal64(0x1122_3344_5566_7788),
        "decimal128": decimal128(bytes(range(16))), "char": char("é"),
        "timestamp": timestamp(1_700_000_000_123), "uuid": uuid.UUID(int=0x1234),
        "binary": b"\x00\xff", "string": "grüße \"q\"", "symbol": symbol("sym"),
    }


def compound_values() -> dict[str, Any]:
    from proton import int32, ulong
    return {
        "list": [1, "two", None, True, 1.5, b"\x01", [symbol("s")]],
        "map": {symbol("k"): [1, 2], "text": {"n": None}},
        "array": Array(UNDESCRIBED, Data.INT, int32(1), int32(2), int32(3)),
        "described": [Described(symbol("com.example:t"), "v"),
                      Described(ulong(0x1234), 7)],
        "described-array": Array(symbol("com.example:d"), Data.STRING, "a", "b"),
    }
