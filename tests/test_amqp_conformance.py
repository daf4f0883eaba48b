"""AMQP 1.0 conformance, with qpid-proton (an implementation we did not
write) as the oracle, on the real brokers:

- every entry pystream's producer writes decodes in proton to exactly what
  was sent (each property field, application properties, annotations, body
  sizes, each codec);
- messages published over AMQP 1.0 into a stream queue (every property and
  header field, application properties, annotations and footers of every
  primitive and compound type, every body kind) read in pystream's columns
  as docs/decoding.md's rendering rules say of the entry proton decodes;
- a symbol that is not ASCII is refused before anything is sent.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pyarrow as pa
import pytest
from proton import Described, Message, symbol, ulong
from proton.utils import BlockingConnection

import pystream

from . import amqp_oracle as O
from . import brokers
from .conftest import MODERN_URI

pytestmark = pytest.mark.broker  # every test here talks to a test broker

COLUMNS = ["properties", "application_properties", "message_annotations",
           "header", "footer"]
UTC = dt.UTC
# AMQP 1.0 port of each stream broker.
AMQP_PORTS = {node.stream: node.amqp for node in (brokers.MODERN, brokers.LATEST)}


def read_rows(uri: str, stream: str, count: int) -> tuple[list[bytes], list[dict]]:
    """The stream's raw entries and pystream's decoded rows."""
    with pystream.connect(uri) as client:
        with client.consumer(stream, offset="first", amqp=False) as consumer:
            raw = consumer.read(count, timeout=30)
        with client.consumer(stream, offset="first", columns=COLUMNS,
                             body="binary") as consumer:
            rows = consumer.read(count, timeout=30)
    assert raw.num_rows == rows.num_rows == count
    return raw.column("body").cast(pa.binary()).to_pylist(), rows.to_pylist()


# --- what pystream's producer writes ---------------------------------------------

PROPERTIES = pa.struct([
    ("message_id", pa.string()), ("user_id", pa.binary()), ("to", pa.string()),
    ("subject", pa.string()), ("reply_to", pa.string()),
    ("correlation_id", pa.binary()), ("content_type", pa.string()),
    ("content_encoding", pa.string()),
    ("absolute_expiry_time", pa.timestamp("ms", tz="UTC")),
    ("creation_time", pa.timestamp("us", tz="UTC")), ("group_id", pa.string()),
    ("group_sequence", pa.int64()), ("reply_to_group_id", pa.string()),
])


def producer_batch() -> tuple[pa.RecordBatch, list[dict]]:
    """Messages with every property field (and rows with none), string and
    null map values, bodies of 0, 1, 255, 256 and 70 000 bytes."""
    bodies, props, apps, anns, expected = [], [], [], [], []
    sizes = [0, 1, 255, 256, 70_000]
    for i in range(40):
        body = bytes((i + k) % 256 for k in range(sizes[i % len(sizes)]))
        full = i % 4 != 3
        when = dt.datetime(2024, 3, 14, 18, 24, 12, 345000, tzinfo=UTC) + dt.timedelta(days=i)
        p = {"message_id": f"id-{i}", "user_id": b"guest\x00\xff", "to": "/queues/x",
             "subject": "s ü", "reply_to": "r", "correlation_id": bytes([i, 0, 255]),
             "content_type": "application/json", "content_encoding": "gzip",
             "absolute_expiry_time": when, "creation_time": when,
             "group_id": "g", "group_sequence": 4_000_000_000 + i,
             "reply_to_group_id": "rg"} if full else None
        app = [("k", f"v{i}"), ("ünï", None), ("n", "")] if i % 3 else None
        ann = [("x-opt-a", f"a{i}"), ("x-null", None)] if i % 2 else None
        bodies.append(body)
        props.append(p)
        apps.append(app)
        anns.append(ann)
        expected.append({"body": body, "properties": p,
                         "application_properties": dict(app) if app else None,
                         "message_annotations": dict(ann) if ann else None})
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array(bodies, pa.binary()),
        "properties": pa.array(props, PROPERTIES),
        "application_properties": pa.array(apps, pa.map_(pa.string(), pa.string())),
        "message_annotations": pa.array(anns, pa.map_(pa.string(), pa.string())),
    })
    return batch, expected


def as_sent(m: Message) -> dict:
    """What proton decoded, in the shape of ``producer_batch``'s expectation."""
    def when(seconds: float) -> dt.datetime:
        return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(
            milliseconds=round(seconds * 1000))
    props = None
    if m.id is not None:
        props = {"message_id": m.id, "user_id": bytes(m.user_id), "to": m.address,
                 "subject": m.subject, "reply_to": m.reply_to,
                 "correlation_id": bytes(m.correlation_id),
                 "content_type": m.content_type, "content_encoding": m.content_encoding,
                 "absolute_expiry_time": when(m.expiry_time),
                 "creation_time": when(m.creation_time), "group_id": m.group_id,
                 "group_sequence": m.group_sequence,
                 "reply_to_group_id": m.reply_to_group_id}
        assert isinstance(m.content_type, symbol) and isinstance(m.content_encoding, symbol)
    for name in ("annotations",):
        for key in (getattr(m, name) or {}):
            assert isinstance(key, symbol), key
    return {"body": bytes(m.body) if m.body is not None else b"",
            "properties": props,
            "application_properties": dict(m.properties) if m.properties else None,
            "message_annotations": ({str(k): v for k, v in m.annotations.items()}
                                    if m.annotations else None)}


@pytest.mark.parametrize("compression", [None, "none", "gzip", "snappy", "lz4", "zstd"])
def test_producer_entries_decode_in_proton(modern, modern_stream, compression):
    batch, expected = producer_batch()
    with modern.producer(modern_stream, compression=compression) as producer:
        producer.send_batch(batch).result(timeout=30)
    raw, rows = read_rows(MODERN_URI, modern_stream, len(expected))
    for i, (entry, want) in enumerate(zip(raw, expected, strict=True)):
        m = O.decode(entry)
        assert m.inferred, "the body is one data section"
        got = as_sent(m)
        if want["properties"] is not None:
            # the timestamps travel as milliseconds
            expiry = "absolute_expiry_time"
            assert want["properties"][expiry] == got["properties"][expiry]
        assert got == want, i
        # and pystream reads back what it wrote
        assert rows[i]["body"] == want["body"]
        assert O.as_json is not None
        assert (dict(rows[i]["application_properties"])
                if rows[i]["application_properties"] else None) == want["application_properties"]


def test_non_ascii_symbols_are_refused_before_sending(modern, modern_stream):
    cases = {
        "message_annotations": {"body": [b"x"], "message_annotations": pa.array(
            [[("x-opt-ünï", "v")]], pa.map_(pa.string(), pa.string()))},
        "content_type": {"body": [b"x"], "properties": pa.array(
            [{"content_type": "text/plaïn"}], pa.struct([("content_type", pa.string())]))},
        "content_encoding": {"body": [b"x"], "properties": pa.array(
            [{"content_encoding": "gzïp"}], pa.struct([("content_encoding", pa.string())]))},
    }
    with modern.producer(modern_stream) as producer:
        for field, columns in cases.items():
            with pytest.raises(ValueError, match=f"message 0: {field}.*not ASCII"):
                producer.send_batch(pa.RecordBatch.from_pydict(columns))
        with pytest.raises(ValueError, match="content_type is not ASCII"):
            producer.send(b"x", properties={"content_type": "ü"})
        with pytest.raises(ValueError, match="message_annotations: the key 'x-ü'"):
            producer.send(b"x", message_annotations={"x-ü": "v"})
        # application property keys are strings: any UTF-8 goes
        producer.send_batch(pa.RecordBatch.from_pydict({
            "body": [b"ok"], "application_properties": pa.array(
                [[("ünï", "v")]], pa.map_(pa.string(), pa.string()))})).result(timeout=10)
    raw, rows = read_rows(MODERN_URI, modern_stream, 1)
    assert rows[0]["body"] == b"ok"


# --- what an AMQP 1.0 publisher stores ------------------------------------------------

def amqp_cases(version: tuple[int, ...]) -> list[tuple[str, bytes, bytes, Any]]:
    """(label, message, expected body, footer sent) for every section kind
    and value type that RabbitMQ stores. Left out, as the brokers refuse
    them: annotation values that are null (4.0 and 4.3 end the session) or
    decimals (4.0), a message without a body section (4.0 ends the session,
    4.3 detaches the link: missing_amqp_message_body)."""
    values = {**O.sample_values(), **O.compound_values()}
    refused_annotation = {"null"} | (
        set() if version >= (4, 3) else {"decimal32", "decimal64", "decimal128"})
    cases = []
    head = O.message_head()
    for name, value in values.items():
        ann = {} if name in refused_annotation else {symbol(f"x-{name}"): value}
        message = (O.message_head(properties={f"p-{name}": value}, annotations=ann)
                   + O.data_section(name.encode()))
        cases.append((f"maps:{name}", message, name.encode(), None))
        footer = {symbol(f"x-{name}"): value}
        cases.append((f"footer:{name}", head + O.data_section(b"f") +
                      O.section(O.FOOTER, footer), b"f", footer))
        # amqp-value of each type: the payload of a string, symbol or
        # binary, else the value's encoding
        plain = name in ("string", "symbol", "binary")
        body = (value.encode() if isinstance(value, str) else bytes(value)) if plain \
            else O.encode_value(value)
        cases.append((f"value:{name}", head + O.section(O.VALUE, value), body, None))
    for descriptor in (symbol("com.example:text"), ulong(0x1234)):
        for inner in ("text", b"\x01\x02", 5, [1, "a"]):
            described = Described(descriptor, inner)
            cases.append((f"value:described:{inner!r}", head + O.section(O.VALUE, described),
                          O.encode_value(described), None))
    seq1, seq2 = [1, "two", None], [b"\x03", 4.5]
    cases += [
        ("data:one", head + O.data_section(b"one"), b"one", None),
        ("data:several", head + O.data_section(b"a") + O.data_section(b"") +
         O.data_section(b"bc" * 200), b"a" + b"bc" * 200, None),
        ("data:empty", head + O.data_section(b""), b"", None),
        ("sequence:one", head + O.section(O.SEQUENCE, seq1), O.encode_value(seq1), None),
        ("sequence:several", head + O.section(O.SEQUENCE, seq1) + O.section(O.SEQUENCE, seq2),
         O.encode_value(seq1) + O.encode_value(seq2), None),
    ]
    ids = [ulong(42), uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8"), b"\x00\xab", "id-s"]
    for i, message_id in enumerate(ids):
        m = Message(id=message_id, correlation_id=ids[(i + 1) % 4], user_id=b"guest",
                    address="/queues/somewhere", subject="subj", reply_to="/queues/r",
                    content_type=symbol("application/json"),
                    content_encoding=symbol("gzip"), expiry_time=1_700_000_000.5,
                    creation_time=1_600_000_000.25, group_id="g", group_sequence=7 + i,
                    reply_to_group_id="rg", durable=bool(i % 2), priority=9 - i,
                    ttl=3600 + i, first_acquirer=bool(i % 2), delivery_count=i,
                    instructions={symbol("x-delivery"): "dropped"})
        cases.append((f"properties:{i}", m.encode() + O.data_section(b"p"), b"p", None))
    return cases


def publish_amqp10(port: int, stream: str, messages: list[bytes]) -> None:
    connection = BlockingConnection(f"amqp://guest:guest@localhost:{port}", timeout=30,
                                    allowed_mechs="PLAIN")
    try:
        sender = connection.create_sender(f"/queues/{stream}")
        for message in messages:
            sender.send(O.Raw(message))
    finally:
        connection.close()


@pytest.fixture(params=["modern", "latest"])
def amqp_broker(request) -> str:
    if request.param == "modern":
        return MODERN_URI
    return request.getfixturevalue("latest_uri")


def test_amqp10_messages_read_as_the_rules_say(amqp_broker, stream_name):
    address = pystream.parse_uri(amqp_broker)
    with pystream.connect(amqp_broker) as client:
        cases = amqp_cases(client.server_version)
        client.create_stream(stream_name)
        try:
            publish_amqp10(AMQP_PORTS[address.port], stream_name, [c[1] for c in cases])
            raw, rows = read_rows(amqp_broker, stream_name, len(cases))
        finally:
            client.delete_stream(stream_name)
    for (label, sent, body, footer), entry, row in zip(cases, raw, rows, strict=True):
        stored = dict(O.sections(entry))
        assert row["body"] == body, label
        assert row["properties"] == O.properties_row(stored.get(O.PROPERTIES)), label
        assert row["header"] == O.header_row(stored.get(O.HEADER)), label
        assert row["application_properties"] == O.text_map(
            stored.get(O.APPLICATION_PROPERTIES)), label
        assert row["message_annotations"] == O.text_map(
            stored.get(O.MESSAGE_ANNOTATIONS)), label
        assert row["footer"] == O.text_map(stored.get(O.FOOTER)), label
        # What the broker did to the message: it keeps the body sections and
        # the footer as sent, always writes a header, adds the annotations
        # x-exchange and x-routing-key, and drops the delivery annotations.
        sent_sections = O.sections(sent)
        body_codes = (O.DATA, O.SEQUENCE, O.VALUE, O.FOOTER)
        assert [s for s in O.sections(entry) if s[0] in body_codes] == [
            s for s in sent_sections if s[0] in body_codes], label
        assert O.text_map(stored.get(O.FOOTER)) == O.text_map(footer), label
        assert O.HEADER in stored and O.DELIVERY_ANNOTATIONS not in stored, label
        sent_annotations = dict(sent_sections).get(O.MESSAGE_ANNOTATIONS) or {}
        assert {str(k) for k in stored[O.MESSAGE_ANNOTATIONS]} == {
            *map(str, sent_annotations), "x-exchange", "x-routing-key"}, label


def test_brokers_store_non_ascii_symbols_that_proton_refuses(amqp_broker, stream_name):
    """Why the producer checks: RabbitMQ 4.0 and 4.3 store an annotation key
    that is not ASCII as it came; proton cannot decode the entry; pystream,
    lenient, reads the key as UTF-8."""
    address = pystream.parse_uri(amqp_broker)
    message = (O.message_head(annotations={symbol("x-uu"): 1}).replace(
        b"x-uu", "x-ü".encode()) + O.data_section(b"x"))
    with pystream.connect(amqp_broker) as client:
        client.create_stream(stream_name)
        try:
            publish_amqp10(AMQP_PORTS[address.port], stream_name, [message])
            (entry,), (row,) = read_rows(amqp_broker, stream_name, 1)
        finally:
            client.delete_stream(stream_name)
    with pytest.raises(UnicodeDecodeError):
        O.decode(entry)
    assert ("x-ü", "1") in row["message_annotations"]
