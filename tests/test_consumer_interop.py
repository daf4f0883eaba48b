"""The consumer reading streams that other clients wrote, on the real brokers.

Publishers (``tests/publishers.py``): rbfly and rstream over the stream
protocol, pika over AMQP 0-9-1 through the default exchange. In the other
direction rbfly and rstream read what pystream's producer wrote, with
every codec they can read, and every property is compared. Each test
publishes a few thousand messages with varied bodies (empty, binary, large,
amqp-value) and properties, reads them back with ``pystream`` and checks
every record in order: offsets 0..N-1 with no gap, the body, and every
property, header field, annotation and application property against what
was sent, rendered by the rules of docs/decoding.md: map values
and ids as text, binary as lowercase hex, timestamps ISO 8601 with
milliseconds, uuids canonical, lists and maps as JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import uuid
from typing import Any

import pytest

import pystream

from .conftest import MODERN_URI
from .publishers import (
    amqp091_url,
    declare_stream_amqp091,
    publish_amqp091,
    publish_rbfly,
    publish_rstream,
    read_rbfly,
    read_rstream,
)

pytestmark = pytest.mark.broker  # every test here talks to a test broker

UTC = dt.UTC
COLUMNS = ["properties", "application_properties", "message_annotations", "header"]
PROPERTY_FIELDS = ("message_id", "user_id", "to", "subject", "reply_to",
                   "correlation_id", "content_type", "content_encoding",
                   "absolute_expiry_time", "creation_time", "group_id",
                   "group_sequence", "reply_to_group_id")
N = 3000


# --- expected renderings ------------------------------------------------------

class SameFloat:
    """Equal to the text of a float that reads back to ``value`` (the sign
    of zero included; "nan", "inf", "-inf" for the special values)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        try:
            got = float(other)
        except ValueError:
            return False
        if math.isnan(self.value):
            return other == "nan"
        return got == self.value and math.copysign(1, got) == math.copysign(1, self.value)

    def __repr__(self) -> str:
        return f"SameFloat({self.value!r})"


def iso(t: dt.datetime) -> str:
    """docs/decoding.md: timestamps ISO 8601 UTC with milliseconds (naive = UTC)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def ms_time(ms: int) -> dt.datetime:
    """An AMQP timestamp (ms since the epoch) as the column's datetime."""
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms)


def render(value: Any) -> Any:
    """A map value (application property, annotation) as pystream renders it."""
    from rbfly.streams import Symbol
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return SameFloat(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Symbol):
        return value.name
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        return iso(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)        # separators ", " and ": ", as pystream
    raise TypeError(value)


def render_id(value: Any) -> str | None:
    """message-id / correlation-id: ulong decimal, uuid canonical, binary hex."""
    if value is None or isinstance(value, str):
        return value
    return render(value)


def render_map(mapping: dict | None) -> dict | None:
    if not mapping:
        return None
    return {str(k): render(v) for k, v in mapping.items()}


# --- consuming and checking ---------------------------------------------------

def consume(uri: str, stream: str, count: int, offset: Any = "first",
            **options: Any) -> list[dict]:
    """Every record from ``offset`` on (``count`` of them, and no more)."""
    options.setdefault("columns", COLUMNS)
    with pystream.connect(uri) as client:
        with client.consumer(stream, offset=offset, **options) as consumer:
            table = consumer.read(max_rows=count, timeout=60)
            extra = consumer.read(max_rows=1, timeout=1)
    assert table.num_rows == count, f"read {table.num_rows} of {count} records"
    assert extra.num_rows == 0, f"a record past the last: {extra.to_pylist()[:1]}"
    return table.to_pylist()


def as_dict(pairs: list | None) -> dict | None:
    return None if pairs is None else dict(pairs)


def check(rows: list[dict], expected: list[dict], first: int = 0) -> None:
    """Offsets first..first+N-1 in order; body and every optional column of
    each record equal to the expectation (keys absent from an expectation
    are not checked)."""
    assert [r["offset"] for r in rows] == list(range(first, first + len(expected)))
    for row, exp in zip(rows, expected, strict=True):
        where = f"offset {row['offset']}"
        assert row["body"] == exp["body"], where
        for key in ("properties", "header"):
            if key in exp:
                assert row[key] == exp[key], (where, key)
        for key in ("application_properties", "message_annotations"):
            if key in exp:
                got = row[key]
                assert as_dict(got) == exp[key], (where, key, got)
                if got is not None:  # keys are unique
                    assert len(got) == len(exp[key]), (where, key, got)


def props(**fields: Any) -> dict:
    """A full properties struct: the fields given, the others null."""
    unknown = set(fields) - set(PROPERTY_FIELDS)
    assert not unknown, unknown
    return {name: fields.get(name) for name in PROPERTY_FIELDS}


def header(durable=False, priority=4, ttl=None, first_acquirer=False,
           delivery_count=0) -> dict:
    """docs/decoding.md: absent header fields take the AMQP defaults (ttl null)."""
    return {"durable": durable, "priority": priority, "ttl": ttl,
            "first_acquirer": first_acquirer, "delivery_count": delivery_count}


def body_for(rng: random.Random, i: int) -> bytes:
    """Empty, short binary, text, a few KiB, now and then 100-300 KiB."""
    kind = i % 10
    if kind == 0:
        return b""
    if kind in (1, 2, 3):
        return rng.randbytes(rng.randrange(1, 64))
    if kind in (4, 5):
        return f"message {i} é ✓".encode() * rng.randrange(1, 4)
    if kind == 6 and i % 500 == 6:
        return rng.randbytes(rng.randrange(100_000, 300_000))
    if kind in (6, 7):
        return rng.randbytes(rng.randrange(255, 4096))   # around the 1-byte size limit
    if kind == 8:
        return bytes([i % 256]) * 256
    return rng.randbytes(255)


def stamp(rng: random.Random, *, millis: bool = True) -> dt.datetime:
    seconds = rng.randrange(0, 4_000_000_000)
    micro = rng.randrange(1000) * 1000 if millis else rng.choice([0, 125_000, 250_000, 500_000])
    return dt.datetime.fromtimestamp(seconds, UTC).replace(microsecond=micro)


# --- rbfly --------------------------------------------------------------------

def rbfly_messages(n: int) -> tuple[list, list[dict]]:
    """rbfly 0.10 writes application properties and a body (a data section
    for bytes, else an amqp-value), never header, properties or
    annotations."""
    from rbfly.amqp import MessageCtx, encode_amqp
    from rbfly.streams import Symbol

    def value_body(value: Any) -> bytes:
        """docs/decoding.md: an amqp-value string/symbol/binary gives its payload, any
        other value its encoding (rbfly's, without the section's 00 53 77)."""
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, Symbol):
            return value.name.encode()
        buf = bytearray(1 << 12)
        size = encode_amqp(buf, MessageCtx(value, None, None, None, None, None, None))
        assert buf[:3] == b"\x00\x53\x77"
        return bytes(buf[3:size])

    rng = random.Random(1)
    values = ["text é ✓", "", Symbol("a-symbol"), 42, -7, 2 ** 40, 2 ** 64 - 1,
              1.5, True, False, None, [1, "a", None], {"k": [1, 2]},
              uuid.UUID(int=rng.getrandbits(128)), stamp(rng, millis=False)]
    messages, expected = [], []
    for i in range(n):
        if i % 7 == 3:
            body: Any = values[(i // 7) % len(values)]
            data = value_body(body)
        else:
            body = data = body_for(rng, i)
        app: dict | None = None
        if i % 3:
            app = {"seq": i, "name": f"msg-{i}", "kind": ["a", "b", "c"][i % 3]}
            if i % 2:
                app.update({
                    "neg": -rng.randrange(1, 2 ** 31), "long": rng.randrange(2 ** 31 + 1, 2 ** 62),
                    "ulong": rng.randrange(2 ** 63 + 1, 2 ** 64),
                    "float": rng.choice([0.1, -2.75, 1e300, 5e-324, 100.0, -0.0, 3.0]),
                    "flag": bool(i % 4 == 1), "none": None, "bin": rng.randbytes(i % 9),
                    "uuid": uuid.UUID(int=rng.getrandbits(128)),
                    # rbfly writes int(timestamp() * 1000): whole binary fractions only
                    "when": stamp(rng, millis=False), "sym": Symbol(f"s{i % 5}"),
                    "list": [i, "x", True, None], "map": {"a": i, "b": [False]},
                    "empty": "", "unicode": "ключ ✓ 🐇"})
        if app is not None:
            messages.append(MessageCtx(body, None, None, None, None, app, None))
        else:
            messages.append(body)
        expected.append({"body": data, "properties": None, "header": None,
                         "message_annotations": None,
                         "application_properties": render_map(app)})
    return messages, expected


def test_rbfly(uri, stream):
    messages, expected = rbfly_messages(N)
    publish_rbfly(uri, stream, messages)
    check(consume(uri, stream, N), expected)
    # the per-record API on the same stream
    with pystream.connect(uri) as client:
        with client.consumer(stream, offset="first", columns=COLUMNS) as consumer:
            seen = 0
            for i, m in enumerate(consumer.messages(timeout=10)):
                exp = expected[i]
                assert (m.offset, m.body) == (i, exp["body"])
                assert m.application_properties == exp["application_properties"]
                assert (m.properties, m.header, m.message_annotations) == (None, None, None)
                seen += 1
                if seen == 300:
                    break
            assert seen == 300


def test_rbfly_raw_entries(uri, stream):
    """rbfly's binary publisher writes bytes with no AMQP framing: read back
    untouched with ``amqp=False``."""
    rng = random.Random(2)
    bodies = [body_for(rng, i) for i in range(N)]
    publish_rbfly(uri, stream, bodies, raw=True)
    rows = consume(uri, stream, N, columns=None, amqp=False, body="binary")
    assert [r["offset"] for r in rows] == list(range(N))
    assert [r["body"] for r in rows] == bodies


# --- rstream ------------------------------------------------------------------

def rstream_messages(n: int) -> tuple[list, list[dict]]:
    from rstream import AMQPMessage, Header, Properties

    rng = random.Random(3)
    messages, expected = [], []
    for i in range(n):
        kw: dict[str, Any] = {}
        exp: dict[str, Any] = {}
        if i % 11 == 5:                       # amqp-value string body
            text = f"value {i} ✓"
            kw["value"] = text
            exp["body"] = text.encode()
        else:
            data = body_for(rng, i)
            kw["body"] = data                 # rstream writes no section for b""
            exp["body"] = data
        exp["properties"] = exp["header"] = None
        exp["application_properties"] = exp["message_annotations"] = None
        if i % 4 != 0:
            message_id = [f"id-{i}", i * 1_000_003, uuid.UUID(int=rng.getrandbits(128)),
                          rng.randbytes(8)][i % 4]
            correlation_id = [uuid.UUID(int=i), f"corr-{i}", b"", 2 ** 63 + i][i % 4]
            fields = dict(
                message_id=message_id, correlation_id=correlation_id,
                user_id=[b"guest", rng.randbytes(5), b""][i % 3],
                to=f"to-{i}" if i % 2 else None, subject=f"subject {i} ✓",
                reply_to=f"reply-{i % 5}", content_type=["text/plain", "application/json"][i % 2],
                content_encoding="utf-8" if i % 3 else None,
                absolute_expiry_time=1_700_000_000_000 + i if i % 2 else None,
                creation_time=[1_700_000_000_000 + i * 1001, 0, -86_400_123][i % 3],
                group_id=f"group-{i % 7}" if i % 5 else None,
                group_sequence=[i, 0, 2 ** 32 - 1][i % 3] if i % 5 else None,
                reply_to_group_id=f"rtg-{i}" if i % 6 else None)
            kw["properties"] = Properties(**fields)
            expiry = fields["absolute_expiry_time"]
            exp["properties"] = props(**{
                **fields, "message_id": render_id(message_id),
                "correlation_id": render_id(correlation_id),
                "absolute_expiry_time": None if expiry is None else ms_time(expiry),
                "creation_time": ms_time(fields["creation_time"])})
        if i % 5 == 1:
            h = [dict(durable=True, priority=9, ttl=60_000, first_acquirer=True, delivery_count=3),
                 dict(priority=0), dict(durable=False, ttl=0), dict()][(i // 5) % 4]
            kw["header"] = Header(**h)
            # an all-null header is still a header section: the defaults
            exp["header"] = header(**h)
        if i % 6 == 2:
            ann = {"x-opt-seq": i, "x-opt-name": f"n{i}", "x-opt-flag": i % 4 == 2,
                   7: "ulong key"}
            kw["message_annotations"] = ann
            exp["message_annotations"] = render_map(ann)
        if i % 3 != 0:
            app = {"seq": i, "text": f"t{i} ✓", "kind": ["a", "b"][i % 2]}
            if i % 2:
                app.update({
                    "neg": -i, "long": -(2 ** 40) - i, "max": 2 ** 63 - 1, "min": -(2 ** 63),
                    "float": rng.choice([0.1, -2.75, 1e300, 5e-324, 100.0, -0.0, 1.0,
                                         math.inf, -math.inf, math.nan]),
                    "flag": i % 4 == 1, "none": None, "bin": rng.randbytes(i % 7),
                    "uuid": uuid.UUID(int=rng.getrandbits(128)),
                    "when": stamp(rng), "empty": ""})
            kw["application_properties"] = app
            exp["application_properties"] = render_map(app)
        messages.append(AMQPMessage(**kw))
        expected.append(exp)
    return messages, expected


def test_rstream(uri, stream):
    messages, expected = rstream_messages(N)
    # single messages, then sub-entries (codec none and gzip) of 1 to 150
    # records, then single messages again
    segments: list[tuple[str, list]] = [("send", messages[:1000])]
    at = 1000
    sizes = [1, 2, 150, 37, 100, 3, 7]
    k = 0
    while at < 2500:
        size = min(sizes[k % len(sizes)], 2500 - at)
        segments.append((["sub-none", "sub-gzip"][k % 2], messages[at:at + size]))
        at += size
        k += 1
    segments.append(("send", messages[2500:]))
    publish_rstream(uri, stream, segments)

    check(consume(uri, stream, N), expected)
    # body="binary", and a start in the middle of a sub-batch: the records
    # below it are dropped, the offsets stay exact
    start = 1000 + 1 + 2 + 75
    rows = consume(uri, stream, N - start, offset=start, body="binary")
    check(rows, expected[start:], first=start)


# --- AMQP 0-9-1 ---------------------------------------------------------------

def amqp091_messages(n: int, stream: str, broker: str) -> tuple[list, list[dict]]:
    """Messages for pika, and what the broker turns them into.

    RabbitMQ converts AMQP 0-9-1 to AMQP 1.0 on the way into a stream
    (golden data and PROTOCOL-NOTES.md; the header lists below were checked
    against the raw entries):

    - both: message-id, user-id, reply-to, correlation-id, content-type,
      content-encoding as properties; timestamp (s) -> creation-time (ms);
      annotations ``x-exchange`` "" and ``x-routing-key`` the stream; headers
      with simple values -> application properties (list and table headers
      are dropped); no properties section when none of those is set.
    - 4.0: a header section always (durable = delivery-mode 2, priority,
      ttl = expiration, first-acquirer true); app-id -> group-id; type ->
      annotation ``x-basic-type``; ``x-*`` headers -> annotations.
    - 3.10: no header; priority, delivery-mode, expiration -> annotations
      ``x-basic-*`` (as text); type, app-id -> application properties
      ``x-basic-type``, ``x-basic-app-id``; ``x-*`` headers stay
      application properties.

    Decimal headers are left out: both brokers close the connection with
    INTERNAL_ERROR when one is published into a stream.
    """
    import pika

    modern = broker != "legacy"   # 4.0 and 4.3 alike
    rng = random.Random(4)
    messages, expected = [], []
    for i in range(n):
        body = body_for(rng, i)
        p: dict[str, Any] = {}
        if i % 5 != 0:
            p.update(message_id=[f"mid-{i}", str(uuid.UUID(int=rng.getrandbits(128)))][i % 2],
                     correlation_id=f"corr-{i}" if i % 3 else None,
                     content_type=["text/plain", "application/octet-stream"][i % 2],
                     content_encoding="gzip" if i % 4 == 1 else None,
                     reply_to=f"rq-{i % 3}" if i % 2 else None,
                     timestamp=1_700_000_000 + i if i % 3 != 2 else None,
                     user_id="guest" if i % 7 == 1 else None,   # must be the connection's user
                     app_id=f"app-{i % 4}" if i % 6 == 1 else None)
        if i % 4 == 3:
            p.update(type=f"type-{i % 3}", expiration=str(1000 * (i % 50 + 1)),
                     priority=i % 10, delivery_mode=2)
        elif i % 4 == 2:
            p.update(delivery_mode=1)
        headers: dict[str, Any] = {}
        if i % 3 != 0:
            headers = {"h-str": f"v{i} ✓", "h-int": i, "h-neg": -i - 1,
                       "h-long": 2 ** 40 + i, "h-bool": i % 2 == 0,
                       "h-bytes": rng.randbytes(i % 6),
                       "h-time": dt.datetime(2024, 3, 14, 18, 24, 12) + dt.timedelta(seconds=i),
                       "h-none": None, "h-empty": ""}
            if i % 2:
                headers.update({"x-trace": f"trace-{i}", "h-list": [1, "a"],
                                "h-table": {"k": "v"}})
        if headers:
            p["headers"] = headers
        messages.append((body, pika.BasicProperties(**p)))

        g = p.get
        reply_to = g("reply_to")
        if reply_to is not None and broker == "latest":
            reply_to = "/queues/" + reply_to   # names here need no %-encoding
        mapped = dict(message_id=g("message_id"), user_id=g("user_id") and g("user_id").encode(),
                      reply_to=reply_to, correlation_id=g("correlation_id"),
                      content_type=g("content_type"), content_encoding=g("content_encoding"),
                      creation_time=g("timestamp") and ms_time(g("timestamp") * 1000))
        if modern:
            mapped["group_id"] = g("app_id")
        properties = props(**mapped) if any(v is not None for v in mapped.values()) else None
        simple = {k: v for k, v in headers.items() if not isinstance(v, (list, dict))}
        annotations: dict[str, Any] = {"x-exchange": "", "x-routing-key": stream}
        app: dict[str, Any] = {}
        if modern:
            head = header(durable=g("delivery_mode") == 2,
                          priority=4 if g("priority") is None else g("priority"),
                          ttl=g("expiration") and int(g("expiration")),
                          first_acquirer=True)
            if g("type") is not None:
                annotations["x-basic-type"] = g("type")
            for k, v in simple.items():
                (annotations if k.startswith("x-") else app)[k] = v
        else:
            head = None
            for name in ("priority", "delivery_mode", "expiration"):
                if g(name) is not None:
                    annotations["x-basic-" + name.replace("_", "-")] = str(g(name))
            for name in ("type", "app_id"):
                if g(name) is not None:
                    app["x-basic-" + name.replace("_", "-")] = g(name)
            app.update(simple)
        expected.append({"body": body, "properties": properties, "header": head,
                         "message_annotations": render_map(annotations),
                         "application_properties": render_map(app)})
    return messages, expected


def test_amqp091(uri, broker, stream_name):
    import pika  # noqa: F401  (the AMQP 0-9-1 publisher of tests/publishers.py)
    url = amqp091_url(uri)
    declare_stream_amqp091(url, stream_name)       # a queue of type stream
    try:
        with pystream.connect(uri) as client:
            assert client.stream_exists(stream_name)
        messages, expected = amqp091_messages(N, stream_name, broker)
        publish_amqp091(url, stream_name, messages)
        check(consume(uri, stream_name, N), expected)
    finally:
        with pystream.connect(uri) as client:
            client.delete_stream(stream_name, missing_ok=True)


# --- found with these publishers, fixed since ------------------------------

def test_chunk_larger_than_frame_max(modern, stream_name):
    """rstream sends 8 messages of 400 KiB (Publish frames of two) without
    waiting; the broker writes them into as few chunks as it can. When its
    stats show a last chunk holding 3 or more of them (it starts at offset
    5 or below: more than 1 MiB), pystream must still read all 8."""
    from rstream import AMQPMessage

    rng = random.Random(5)
    bodies = [rng.randbytes(400 << 10) for _ in range(8)]
    for attempt in range(5):
        name = f"{stream_name}-{attempt}"
        modern.create_stream(name)
        try:
            publish_rstream(MODERN_URI, name,
                            [("send", [AMQPMessage(body=b) for b in bodies])],
                            burst_bytes=1 << 40)
            if modern.stream_stats(name)["last_chunk_id"] <= 5:
                with pystream.connect(MODERN_URI) as client:
                    with client.consumer(name, offset="first") as consumer:
                        table = consumer.read(max_rows=8, timeout=10)
                assert table.column("offset").to_pylist() == list(range(8))
                assert table.column("body").to_pylist() == bodies
                return
        finally:
            modern.delete_stream(name, missing_ok=True)
    pytest.skip("the broker never wrote a chunk over 1 MiB")


def test_float_rendering_as_documented(modern, stream_name):
    """Application property doubles written by rstream, rendered as the
    documentation promises (docs/decoding.md)."""
    from rstream import AMQPMessage

    cases = {"hundred": (100.0, "100"), "twelve-hundred": (1200.0, "1200"),
             "neg": (-2500.0, "-2500"), "three": (3.0, "3"), "half": (0.5, "0.5"),
             "tenth": (0.1, "0.1"), "big": (123456.0, "123456")}
    modern.create_stream(stream_name)
    try:
        app = {k: value for k, (value, _) in cases.items()}
        publish_rstream(MODERN_URI, stream_name,
                        [("send", [AMQPMessage(body=b"f", application_properties=app)])])
        (row,) = consume(MODERN_URI, stream_name, 1)
        assert dict(row["application_properties"]) == {k: text for k, (_, text) in cases.items()}
    finally:
        modern.delete_stream(stream_name, missing_ok=True)


# --- the other direction: what pystream's producer writes, read by others ----

def producer_messages() -> tuple[Any, list[dict]]:
    """Every property field, string and null map values, bodies of several
    sizes (as in test_amqp_conformance)."""
    import proton  # noqa: F401

    from .test_amqp_conformance import producer_batch
    return producer_batch()


def _text(value: Any) -> Any:
    """A value another client decoded, as the text or bytes pystream sent."""
    if isinstance(value, bytes):
        return value
    name = getattr(value, "name", None)      # rbfly's Symbol
    return name if name is not None else value


def _millis(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int):
        return ms_time(value)
    return value


def _sent_properties(p: dict | None, *, as_bytes: bool) -> dict | None:
    """What pystream sent, in the types another client decodes: timestamps
    to the millisecond; rstream gives strings and symbols as UTF-8 bytes."""
    if p is None:
        return None
    out = dict(p)
    for key in ("absolute_expiry_time", "creation_time"):
        out[key] = out[key].replace(microsecond=out[key].microsecond // 1000 * 1000)
    if as_bytes:
        out = {k: v.encode() if isinstance(v, str) else v for k, v in out.items()}
    return out


def test_rbfly_reads_what_pystream_writes(modern, modern_stream):
    batch, expected = producer_messages()
    with modern.producer(modern_stream) as producer:
        producer.send_batch(batch).result(timeout=30)
    got = read_rbfly(MODERN_URI, modern_stream, len(expected))
    for i, (ctx, want) in enumerate(zip(got, expected, strict=True)):
        assert bytes(ctx.body) == want["body"], i
        props = {f: _text(getattr(ctx.properties, f)) for f in PROPERTY_FIELDS}
        for f in ("absolute_expiry_time", "creation_time"):
            props[f] = _millis(props[f])
        assert (props if any(v is not None for v in props.values()) else None) == \
            _sent_properties(want["properties"], as_bytes=False), i
        assert ({k: _text(v) for k, v in ctx.app_properties.items()} or None) == \
            want["application_properties"], i
        assert ({_text(k): _text(v) for k, v in ctx.annotations.items()} or None) == \
            want["message_annotations"], i


# rstream 1.1.1 decompresses none and gzip sub-batches (its snappy, lz4 and
# zstd codecs are abstract classes); rbfly 0.10 reads simple entries only.
@pytest.mark.parametrize("compression", [None, "none", "gzip"])
def test_rstream_reads_what_pystream_writes(modern, modern_stream, compression):
    batch, expected = producer_messages()
    with modern.producer(modern_stream, compression=compression) as producer:
        producer.send_batch(batch).result(timeout=30)
    got = read_rstream(MODERN_URI, modern_stream, len(expected))
    for i, (message, want) in enumerate(zip(got, expected, strict=True)):
        assert bytes(message.body) == want["body"], i
        p = message.properties
        props = None if p is None else {f: getattr(p, f) for f in PROPERTY_FIELDS}
        if props is not None:
            for f in ("absolute_expiry_time", "creation_time"):
                props[f] = _millis(props[f])
        assert props == _sent_properties(want["properties"], as_bytes=True), i
        sent_app = want["application_properties"]
        assert (message.application_properties or None) == (None if sent_app is None else {
            k.encode(): None if v is None else v.encode() for k, v in sent_app.items()}), i
        sent_ann = want["message_annotations"]
        assert (message.message_annotations or None) == (None if sent_ann is None else {
            k.encode(): None if v is None else v.encode() for k, v in sent_ann.items()}), i
