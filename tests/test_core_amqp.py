"""AMQP 1.0 decoding: the golden messages of other implementations, and
differential tests against rbfly's and rstream's decoders."""

import datetime as dt
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pystream._core import decode
from pystream.errors import MalformedMessage

from .golden import amqp10, amqp10_names, amqp_data, chunk, deliver, simple_entry

ALL = ["properties", "application_properties", "message_annotations", "header"]
UUID = "00112233-4455-6677-8899-aabbccddeeff"
UTC = dt.UTC


def one(message: bytes, **kw) -> dict:
    batch = decode(deliver(chunk([simple_entry(message)])), columns=ALL, **kw)
    (row,) = batch.to_pylist()
    for key in ("application_properties", "message_annotations"):
        row[key] = dict(row[key]) if row[key] is not None else None
    return row


def test_every_golden_file_decodes():
    names = amqp10_names()
    assert len(names) == 13
    for name in names:
        one(amqp10(name))


def test_golden_values():
    assert one(amqp10("empty_message.bin"))["body"] == b""
    r = one(amqp10("message_body_250.bin"))
    assert 0 < len(r["body"]) <= 255 and r["properties"] is None
    assert r["application_properties"] is None
    assert len(one(amqp10("message_body_700.bin"))["body"]) > 255
    r = one(amqp10("message_random_application_properties_300.bin"))
    assert len(r["body"]) > 255 and r["application_properties"]
    assert one(amqp10("message_random_application_properties_500.bin"))["application_properties"]

    r = one(amqp10("message_random_application_properties_properties_900.bin"))
    assert all(len(k) >= 900 and len(v) >= 900 for k, v in r["application_properties"].items())
    p = r["properties"]
    t = dt.datetime.fromtimestamp(1710440652, UTC)
    assert (p["message_id"], p["correlation_id"], p["content_type"], p["content_encoding"],
            p["group_sequence"], p["creation_time"], p["absolute_expiry_time"]) == (
        "33333333", UUID, "json", "myCoding", 10, t, t)
    assert p["reply_to"] and p["group_id"]

    r = one(amqp10("static_test_message_compare.bin"))
    assert r["body"] == b"test"
    p = r["properties"]
    for key in ("subject", "message_id", "reply_to", "content_type", "content_encoding",
                "group_id", "reply_to_group_id"):
        assert p[key] == "test"
    assert p["user_id"] == b"test"
    assert r["application_properties"] == {"test": "test", "double": "64.646464"}
    assert r["message_annotations"] == {"test": "test", "1": "1", "100000": "100000"}

    r = one(amqp10("header_amqpvalue_message.bin"))
    assert r["header"] == {"durable": True, "priority": 100, "ttl": None,
                           "first_acquirer": True, "delivery_count": 300}
    assert r["body"] == b"header"           # the data section wins, like rbfly

    r = one(amqp10("message_unicode_message.bin"))
    assert r["body"].startswith(b"Alan  Mathison Turing  ( 23 June 1912")
    assert set(r["application_properties"]) == {
        "from_go", "from_go_ch_long", "from_go_greek", "from_go_byte"}

    p = one(amqp10("uuid_message.bin"))["properties"]
    assert p["message_id"] == p["correlation_id"] == UUID

    r = one(amqp10("nil_and_types.bin"))
    assert r["body"] == b""
    assert r["application_properties"] == {
        "null": None, "long_value": "91000001001", "byte_value": "216",
        "bool_value": "true", "int_value": "1", "float": "1.1", "double": "1.1",
        "uuid": UUID, "empty": ""}

    shovel = one(amqp10("shovel_annotations.bin"))["message_annotations"]["x-shovelled"]
    assert '"dest-exchange-key": "hello-key"' in shovel and '"src-queue": "from"' in shovel
    assert '"dest-exchange": "to"' in shovel and '"shovel-type": "dynamic"' in shovel

    r = one(amqp10("message_from_version_1_0_0.bin"))   # sizes 4 bytes short
    p = r["properties"]
    assert r["body"] == b"Message100"
    assert (p["message_id"], p["correlation_id"], p["content_type"], p["content_encoding"],
            p["user_id"], p["group_sequence"], p["reply_to_group_id"]) == (
        "MyMessageId", "MyCorrelationId", "text/plain", "utf-8", b"guest", 9999,
        "MyReplyToGroupId")
    assert r["application_properties"] == {"key_string": "value", "key2_int": "1111",
                                           "key2_decimal": "10000000000", "key2_bool": "true"}


def test_rendering_rules():
    ts = struct.pack(">q", 1710440652123)
    items = [(b"\xa1\x01t", b"\x83" + ts), (b"\xa1\x01b", b"\xa0\x02\xab\xcd"),
             (b"\xa1\x01f", b"\x42"), (b"\xa1\x01c", b"\x73\x00\x00\x00\xe9"),
             (b"\xa1\x01l", b"\xc0\x05\x03\x41\x40\x54\xff")]
    body = b"".join(k + v for k, v in items)
    msg = b"\x00\x53\x74\xd1" + struct.pack(">II", len(body) + 4, 2 * len(items)) + body
    app = one(msg + amqp_data(b""))["application_properties"]
    assert app == {"t": "2024-03-14T18:24:12.123Z", "b": "abcd", "f": "false",
                   "c": "é", "l": "[true, null, -1]"}


# --- described values, sequences, footer (hand-made bytes) ------------------

STR_T = b"\xa3\x01t"               # symbol "t", a descriptor


def section(code: int, value: bytes) -> bytes:
    return b"\x00\x53" + bytes([code]) + value


def test_described_values_keep_their_descriptor():
    described_str = b"\x00" + STR_T + b"\xa1\x02ab"
    described_num = b"\x00\x53\x07\x55\x05"          # ulong 7 -> smalllong 5
    # a body that is a described value is its whole encoding, whatever it holds
    assert one(section(0x77, described_str))["body"] == described_str
    assert one(section(0x77, described_num))["body"] == described_num
    assert one(section(0x77, b"\xa1\x02ab"))["body"] == b"ab"
    # as text: {"descriptor": d, "value": v}, at the top as in lists
    items = (b"\xa1\x01s" + described_str + b"\xa1\x01n" + described_num
             + b"\xa1\x01l" + b"\xc0\x09\x01" + described_str
             # an array of described strings: the descriptor is the array's
             + b"\xa1\x01a" + b"\xe0\x0a\x02\x00" + STR_T + b"\xa1\x01x\x01y")
    msg = section(0x74, b"\xc1" + bytes([len(items) + 1, 8]) + items)
    app = one(msg + amqp_data(b""))["application_properties"]
    assert app == {"s": '{"descriptor": "t", "value": "ab"}',
                   "n": '{"descriptor": 7, "value": 5}',
                   "l": '[{"descriptor": "t", "value": "ab"}]',
                   "a": '[{"descriptor": "t", "value": "x"}, {"descriptor": "t", "value": "y"}]'}
    # a typed field refuses one
    props = section(0x73, b"\xc0\x06\x02\x40" + b"\x00" + STR_T + b"\xa0\x00")
    with pytest.raises(Exception, match="wrong type"):
        one(props + amqp_data(b""))


def test_several_sequences_and_absent_sections():
    seq1, seq2 = b"\xc0\x03\x01\x55\x01", b"\x45"
    r = one(section(0x76, seq1) + section(0x76, seq2))
    assert r["body"] == seq1 + seq2
    assert one(section(0x76, seq1))["body"] == seq1
    assert (r["properties"], r["header"], r["application_properties"],
            r["message_annotations"]) == (None, None, None, None)
    # a header section present but empty: the AMQP defaults
    assert one(section(0x70, b"\x45") + amqp_data(b""))["header"] == {
        "durable": False, "priority": 4, "ttl": None, "first_acquirer": False,
        "delivery_count": 0}


def test_footer_column():
    footer = section(0x78, b"\xc1\x08\x02\xa3\x03x-f\x55\x2a")
    frame = deliver(chunk([simple_entry(amqp_data(b"b") + footer),
                           simple_entry(amqp_data(b"c"))]))
    batch = decode(frame, columns=["footer"])
    assert batch.schema.names == ["offset", "chunk_timestamp", "body", "footer"]
    assert batch.column("footer").to_pylist() == [[("x-f", "42")], None]
    assert decode(frame).schema.names == ["offset", "chunk_timestamp", "body"]


def test_encoder_refuses_non_ascii_symbols():
    import pyarrow as pa

    from pystream._core import encode_publish
    ann = pa.array([[("x-ok", "ü")], [("x-ünï", "v")]], pa.map_(pa.string(), pa.string()))
    with pytest.raises(ValueError, match="message 1: message_annotations: a key is not ASCII"):
        encode_publish(0, 0, [b"a", b"b"], message_annotations=ann)
    for name in ("content_type", "content_encoding"):
        props = pa.array([{name: "té"}], pa.struct([(name, pa.string())]))
        with pytest.raises(ValueError, match=f"message 0: {name} is not ASCII"):
            encode_publish(0, 0, [b"a"], properties=props)
    # strings are UTF-8: application property keys and every value
    app = pa.array([[("ünï", "ü")]], pa.map_(pa.string(), pa.string()))
    encode_publish(0, 0, [b"a"], application_properties=app, message_annotations=pa.array(
        [[("x-a", "ü")]], pa.map_(pa.string(), pa.string())))


# --- differential tests -------------------------------------------------------

import rbfly.amqp as rbfly_amqp  # noqa: E402  (oracles: rbfly and rstream decode the same bytes)
import rstream.amqp as rstream_amqp  # noqa: E402

# rbfly (the encoder here) takes 2**31 for an int32, one past its largest,
# and raises OverflowError: leave that one value out.
values = st.one_of(
    st.none(), st.booleans(),
    st.integers(-2 ** 63, 2 ** 63 - 1).filter(lambda i: i != 2 ** 31),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))


def as_text(v):
    """Our rendering of a Python value decoded by the other libraries."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.decode()
    return v if isinstance(v, str) else str(v)


def same(ours, theirs):
    if isinstance(theirs, float):
        return ours is not None and math.isclose(float(ours), theirs, rel_tol=0, abs_tol=0)
    return ours == as_text(theirs)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=600),
       app=st.dictionaries(st.text(min_size=1, max_size=20), values, max_size=8))
def test_against_rbfly_and_rstream(body, app):
    buf = bytearray(1 << 16)
    n = rbfly_amqp.encode_amqp(buf, rbfly_amqp.MessageCtx(body, None, None, None, None,
                                                          app, None))
    message = bytes(buf[:n])
    ours = one(message)
    theirs = rbfly_amqp.decode_amqp(message)
    other = rstream_amqp.amqp_decoder(message)
    assert ours["body"] == theirs.body == other.body
    got = ours["application_properties"] or {}
    assert got.keys() == theirs.app_properties.keys() == {
        k.decode() for k in (other.application_properties or {})}
    for key, value in theirs.app_properties.items():
        assert same(got[key], value), (key, got[key], value)


@settings(max_examples=50, deadline=None)
@given(bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=40),
       first=st.integers(0, 2 ** 40))
def test_chunks_against_rbfly(bodies, first):
    import asyncio

    from rbfly.streams._codec import decode_messages
    from rbfly.streams._mqueue import MessageQueue
    from rbfly.streams.types import SubscriptionInfo

    frame = deliver(chunk([simple_entry(amqp_data(b)) for b in bodies], first_offset=first))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        queue = MessageQueue(10, 1000)
        decode_messages(frame[4:], 5, 0, queue, SubscriptionInfo("s", None, None, True, None))
        theirs = list(queue.data)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    ours = decode(frame)
    assert ours.column("body").to_pylist() == [m.body for m in theirs] == bodies
    assert ours.column("offset").to_pylist() == [m.stream_offset for m in theirs]


# --- the text budget: rendering bombs -----------------------------------------
#
# A record's text columns may take 16 bytes per message byte + 1 KiB
# (csrc/amqp.h, docs/decoding.md); rendering stops when they would take more.

def budget(message: bytes) -> int:
    return min(16 * len(message) + 1024, 256 << 20)


def compound(code: int, *items: bytes) -> bytes:
    """A list (0xc0) or map (0xc1) of these encoded items, 8- or 32-bit sizes."""
    body = b"".join(items)
    if len(body) < 255 and len(items) < 256:
        return bytes([code, len(body) + 1, len(items)]) + body
    return bytes([code + 0x10]) + struct.pack(">II", len(body) + 4, len(items)) + body


def array32(count: int, element: bytes, payload: bytes = b"") -> bytes:
    """An array32 of ``count`` items of the element constructor ``element``
    (a described one: ``00 descriptor constructor``)."""
    body = element + payload
    return b"\xf0" + struct.pack(">II", len(body) + 4, count) + body


def text(code: int, s: bytes) -> bytes:
    return bytes([code, len(s)]) + s if len(s) < 256 else (
        bytes([code + 0x10]) + struct.pack(">I", len(s)) + s)


def app_message(*items: bytes, code: int = 0x74) -> bytes:
    return section(code, compound(0xc1, *items)) + amqp_data(b"x")


def nested_keys(leaf: bytes, levels: int) -> bytes:
    """{{{leaf: null}: null}: null}: each level a map whose key is the
    level inside, so each level quotes the text of the one inside again."""
    key = leaf
    for _ in range(levels):
        key = compound(0xc1, key, b"\x40")
    return key


def described_chain(levels: int) -> bytes:
    """An array of 255 described nulls whose descriptor is such an array,
    ``levels`` deep: every item repeats its descriptor's text."""
    value = b"\x53\x01"
    for _ in range(levels):
        value = b"\xe0" + bytes([len(value) + 3, 255, 0x00]) + value + b"\x40"
    return value


BOMBS = {
    # the 182-byte message: 80 quotes as a key nested 22 maps deep
    "quoted_keys": section(0x74, compound(0xc1, nested_keys(text(0xa1, b'"' * 80), 22),
                                          b"\x40")) + amqp_data(b""),
    "escaped_symbol_keys": app_message(nested_keys(text(0xa3, b"\\\x01" * 20), 28), b"\x40",
                                       code=0x72),
    "deep_nesting_in_footer": app_message(
        text(0xa3, b"x-k"), nested_keys(compound(0xc0, *[b"\x45"] * 30), 24), code=0x78),
    "described_chain": app_message(text(0xa1, b"k"), described_chain(4)),
    "many_empty_arrays": app_message(text(0xa1, b"k"),
                                     compound(0xc0, *[array32(65536, b"\x40")] * 40)),
    "many_tiny_described_items": app_message(
        text(0xa1, b"k"), array32(20000, b"\x00\x53\xff\x55", bytes(20000))),
    "zero_width_items_in_many_values": app_message(
        *[text(0xa1, b"k%d" % i) + array32(60000, b"\x41") for i in range(8)]),
    "properties_ids": section(0x73, compound(
        0xc0, array32(40000, b"\x42"), *[b"\x40"] * 4, array32(40000, b"\x42")))
    + amqp_data(b""),
}

# Runs in a child process whose address space is capped, so that a bomb that
# the renderer does not stop fails the test instead of the machine.
CHILD = r"""
import json, resource, sys, time
from pystream._core import decode
from tests.golden import chunk, deliver, simple_entry
bombs = json.loads(sys.stdin.read())
soft = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (soft + (512 << 20), resource.RLIM_INFINITY))
cols = ["properties", "application_properties", "message_annotations", "footer"]
out = {}
for name, hexmsg in bombs.items():
    t0 = time.perf_counter()
    try:
        decode(deliver(chunk([simple_entry(bytes.fromhex(hexmsg))])), columns=cols)
        what = "rendered"
    except BaseException as e:
        what = f"{type(e).__name__}: {e}"
    out[name] = (what, time.perf_counter() - t0)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def bomb_outcomes() -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=root, capture_output=True,
                         text=True, timeout=600,
                         input=json.dumps({k: v.hex() for k, v in BOMBS.items()}))
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_rendering_bomb_stops_at_the_budget(name, bomb_outcomes):
    what, seconds = bomb_outcomes[name]
    assert what.startswith("MalformedMessage: ") and "text budget" in what, what
    assert seconds < 2.0, f"{name} took {seconds:.1f} s"


def test_the_quoted_keys_bomb_is_182_bytes():
    assert len(BOMBS["quoted_keys"]) == 182


def test_budget_is_exact_and_per_record():
    # the value [null, null, ...] of n items is 6n bytes of text, the key 1;
    # the item count takes no input bytes, so the message keeps its size
    def msg(n: int, code: int = 0x74) -> bytes:
        return app_message(text(0xa1, b"k"), array32(n, b"\x40"), code=code)

    fits = (budget(msg(1)) - 1) // 6
    (row,) = decode(deliver(chunk([simple_entry(msg(fits))])),
                    columns=["application_properties"]).to_pylist()
    assert len(row["application_properties"][0][1]) == 6 * fits
    with pytest.raises(MalformedMessage, match="text budget"):
        decode(deliver(chunk([simple_entry(msg(fits + 1))])), columns=["application_properties"])
    # the budget is the record's, shared by its columns
    def two(n: int) -> bytes:
        value = compound(0xc1, text(0xa1, b"k"), array32(n, b"\x40"))
        return section(0x74, value) + section(0x72, value) + amqp_data(b"x")

    half = budget(two(1)) // 12 + 1
    assert 6 * half + 1 < budget(two(half)) < 2 * (6 * half + 1)
    wire = deliver(chunk([simple_entry(two(half))]))
    assert decode(wire, columns=["application_properties"]).num_rows == 1
    with pytest.raises(MalformedMessage, match="text budget"):
        decode(wire, columns=["application_properties", "message_annotations"])


def test_budget_error_follows_the_error_policy():
    good = app_message(text(0xa1, b"k"), text(0xa1, b"v"))
    bomb = BOMBS["many_empty_arrays"]
    wire = deliver(chunk([simple_entry(good), simple_entry(bomb), simple_entry(good)]))
    cols = ["application_properties"]
    with pytest.raises(MalformedMessage, match="text budget") as e:
        decode(wire, columns=cols)
    assert e.value.position == 4 + 5 + 48 + 4 + len(good) + 4
    skip = decode(wire, columns=cols, error_policy="skip")
    assert skip.column("offset").to_pylist() == [0, 2]
    assert skip.column("application_properties").to_pylist() == [[("k", "v")]] * 2
    raw = decode(wire, columns=cols, error_policy="raw")
    assert raw.column("body").to_pylist()[1] == bomb
    assert raw.column("application_properties").to_pylist() == [[("k", "v")], None,
                                                                [("k", "v")]]
    errors = raw.column("error").to_pylist()
    assert errors[0] is None and "text budget" in errors[1] and errors[2] is None
    # the body alone renders nothing: the bomb is a row like any other
    assert decode(wire).num_rows == 3


def test_zero_width_items_are_bounded_by_the_budget_only():
    # an amqp-value body of 2**20 nulls is a valid message: only its text
    # (in a column) is bounded
    nulls = array32(1 << 20, b"\x40")
    assert one(section(0x77, nulls))["body"] == nulls
    with pytest.raises(MalformedMessage, match="text budget"):
        one(app_message(text(0xa1, b"k"), nulls))


def test_large_plain_values_fit_the_budget():
    big = bytes(range(32, 127)) * 11_000           # about 1 MiB of text
    ctl = b"\x01\"\\" * 1000                        # 6x, 2x, 2x inside JSON
    msg = app_message(text(0xa1, b"big"), text(0xa1, big), text(0xa1, b"ctl"),
                      compound(0xc0, text(0xa1, ctl)),
                      text(0xa1, b"bin"), text(0xa0, bytes(5000)))
    (row,) = decode(deliver(chunk([simple_entry(msg)])),
                    columns=["application_properties"]).to_pylist()
    app = dict(row["application_properties"])
    assert app["big"] == big.decode() and app["bin"] == "00" * 5000
    assert app["ctl"] == '["' + '\\u0001\\"\\\\' * 1000 + '"]'


def test_keys_quoted_inside_quoted_keys():
    # the text of a key that is not a string is quoted once per level
    inner = compound(0xc1, text(0xa1, b'a"\\\x01'), b"\x55\x01")   # {'a"\\\x01': 1}
    key2 = compound(0xc1, inner, b"\x40")                            # {inner: null}
    lst = compound(0xc0, text(0xa3, b"x\x02"), b"\xa0\x01\xff", b"\x00\xa3\x01d\xa1\x01v")
    app = one(app_message(text(0xa1, b"k1"), key2, inner, b"\x41", key2, lst,
                          b"\xa0\x01\xab", b"\x40"))["application_properties"]
    assert app == {
        "k1": '{"{\\"a\\\\\\"\\\\\\\\\\\\u0001\\": 1}": null}',
        '{"a\\"\\\\\\u0001": 1}': "true",
        '{"{\\"a\\\\\\"\\\\\\\\\\\\u0001\\": 1}": null}':
            '["x\\u0002", "ff", {"descriptor": "d", "value": "v"}]',
        "ab": None}
