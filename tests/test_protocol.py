"""Encode/decode round trip of every command, and malformed frames."""

import struct

import pytest

from pystream import protocol as P
from pystream.errors import ProtocolError, TruncatedFrame
from pystream.publish_frames import CONFIRM_PUBLISHER_ID_AT, confirmed_ids

OFF = P.OffsetSpec(P.OFFSET_OFFSET, 42)

SAMPLES = [
    P.DeclarePublisher(1, 7, "writer", "s"),
    P.DeclarePublisherResponse(1, 1),
    P.Publish(7, (P.Message(1, b"a"), P.Message(2, b""))),
    P.Publish(7, (P.FilteredMessage(1, "eu", b"a"),
                  P.FilteredMessage(2, None, b"b")), version=2),
    P.PublishConfirm(7, (1, 2, 3)),
    P.PublishError(7, (P.PublishingError(4, 0x12),)),
    P.QueryPublisherSequence(2, "writer", "s"),
    P.QueryPublisherSequenceResponse(2, 1, 99),
    P.DeletePublisher(3, 7),
    P.DeletePublisherResponse(3, 1),
    P.Subscribe(4, 0, "s", P.OffsetSpec(P.OFFSET_FIRST), 10),
    P.Subscribe(4, 1, "s", OFF, 10, {"name": "n"}),
    P.Subscribe(4, 2, "s", P.OffsetSpec(P.OFFSET_TIMESTAMP, -5), 1),
    P.SubscribeResponse(4, 2),
    P.Deliver(1, b"\x50chunk"),
    P.Deliver(1, b"\x50chunk", committed_chunk_id=77, version=2),
    P.Credit(1, 5),
    P.CreditResponse(4, 1),
    P.StoreOffset("ref", "s", 1 << 40),
    P.QueryOffset(5, "ref", "s"),
    P.QueryOffsetResponse(5, 1, 12),
    P.Unsubscribe(6, 1),
    P.UnsubscribeResponse(6, 1),
    P.Create(7, "s", {"max-age": "1h"}),
    P.CreateResponse(7, 5),
    P.Delete(8, "s"),
    P.DeleteResponse(8, 2),
    P.Metadata(9, ("a", "b")),
    P.MetadataResponse(9, (P.Broker(0, "localhost", 5552),),
                       (P.StreamMetadata("a", 1, 0, (0,)),
                        P.StreamMetadata("b", 2, P.NO_LEADER, ()))),
    P.MetadataUpdate(6, "s"),
    P.PeerProperties(10, {"product": "pystream"}),
    P.PeerPropertiesResponse(10, 1, {"version": "4.0.5"}),
    P.SaslHandshake(11),
    P.SaslHandshakeResponse(11, 1, ("PLAIN", "AMQPLAIN")),
    P.SaslAuthenticate(12, "PLAIN", b"\0guest\0guest"),
    P.SaslAuthenticate(12, "EXTERNAL", None),
    P.SaslAuthenticateResponse(12, 1),
    P.SaslAuthenticateResponse(12, 0x0A, "challenge"),
    P.Tune(1 << 20, 60),
    P.TuneResponse(1 << 20, 30),
    P.Open(13, "/"),
    P.OpenResponse(13, 1, {"advertised_host": "h", "advertised_port": "5552"}),
    P.OpenResponse(13, 0x0C),
    P.Close(14, 1, "bye"),
    P.CloseResponse(14, 1),
    P.Heartbeat(),
    P.Route(15, "key", "super"),
    P.RouteResponse(15, 1, ("super-0", "super-1")),
    P.Partitions(16, "super"),
    P.PartitionsResponse(16, 1, ("super-0",)),
    P.ConsumerUpdate(17, 1, 1),
    P.ConsumerUpdateResponse(17, 1, P.OffsetSpec(P.OFFSET_NEXT)),
    P.ConsumerUpdateResponse(17, 1, OFF),
    P.ExchangeCommandVersions(18, (P.CommandVersion(8, 1, 2),)),
    P.ExchangeCommandVersionsResponse(18, 1, (P.CommandVersion(8, 1, 2),)),
    P.StreamStats(19, "s"),
    P.StreamStatsResponse(19, 1, {"first_chunk_id": 0,
                                  "committed_chunk_id": -1}),
    P.CreateSuperStream(20, "super", ("super-0",), ("0",),
                        {"max-age": "1h"}),
    P.CreateSuperStreamResponse(20, 1),
    P.DeleteSuperStream(21, "super"),
    P.DeleteSuperStreamResponse(21, 1),
    P.ResolveOffsetSpec(22, "s", P.OffsetSpec(P.OFFSET_LAST)),
    P.ResolveOffsetSpec(22, "s", P.OffsetSpec(P.OFFSET_TIMESTAMP, 1700000000000),
                        {"filter.0": "eu", "match-unfiltered": "false"}),
    P.ResolveOffsetSpecResponse(22, 1, OFF),
    P.ResolveOffsetSpecResponse(22, 2),
    P.StreamStatsResponse(23, 1, {"first_chunk_id": 0, "committed_chunk_id": 10,
                                  "committed_offset": 14}),
]


@pytest.mark.parametrize("cmd", SAMPLES, ids=lambda c: type(c).__name__)
def test_round_trip(cmd):
    frame = P.encode(cmd)
    (size,) = struct.unpack_from(">I", frame)
    assert size == len(frame) - 4
    assert P.decode(frame[4:]) == cmd


def test_every_command_key_is_covered():
    keys = {type(c).KEY & ~P.RESPONSE_BIT for c in SAMPLES}
    assert keys == set(range(0x0001, 0x0020))
    assert {type(c).KEY for c in SAMPLES} == set(P.COMMANDS)


def test_resolve_offset_spec_bytes():
    # As rabbit_stream_core 4.3.6 lays them out: the request is the stream,
    # an offset specification as Subscribe's and a string map, left out when
    # empty; the answer a code, then an offset specification of type offset
    # (4) with its u64.
    frame = P.encode(P.ResolveOffsetSpec(7, "s", P.OffsetSpec(P.OFFSET_OFFSET, 3)))
    assert frame == bytes.fromhex(
        "00000015" "001f" "0001" "00000007" "0001" "73" "0004" "0000000000000003")
    frame = P.encode(P.ResolveOffsetSpec(7, "s", P.OffsetSpec(P.OFFSET_LAST),
                                         {"chunk_selector": "all"}))
    assert frame == bytes.fromhex(
        "00000026" "001f" "0001" "00000007" "0001" "73" "0002" "00000001"
        "000e" + b"chunk_selector".hex() + "0003" + b"all".hex())
    answer = P.decode(bytes.fromhex(
        "801f" "0001" "00000007" "0001" "0004" "0000000000003039"))
    assert answer == P.ResolveOffsetSpecResponse(7, 1, P.OffsetSpec(P.OFFSET_OFFSET, 12345))
    # an error answer may stop after its code
    assert P.decode(bytes.fromhex("801f" "0001" "00000007" "0002")).offset is None


def test_resolve_offset_spec_is_gated_by_version_and_advertised_commands():
    from pystream.errors import UnsupportedFeature
    from pystream.features import Features
    assert not Features("4.0.5").supports("resolve_offset_spec")
    assert Features("4.3.6").supports("resolve_offset_spec")
    assert Features("4.3.6", {0x001F: (1, 1)}).supports("resolve_offset_spec")
    not_listed = Features("4.3.6", {0x001C: (1, 1)})
    assert not not_listed.supports("resolve_offset_spec")
    with pytest.raises(UnsupportedFeature, match="did not advertise command 0x001f"):
        not_listed.require("resolve_offset_spec")
    with pytest.raises(UnsupportedFeature, match="needs RabbitMQ 4.3"):
        Features("4.0.5", {0x001F: (1, 1)}).require("resolve_offset_spec")


def test_known_bytes():
    # PeerProperties as the reference's grammar lays it out, by hand.
    frame = P.encode(P.PeerProperties(5, {"a": "bc"}))
    assert frame == bytes.fromhex(
        "00000013" "0011" "0001" "00000005" "00000001" "0001" "61" "0002" "6263")
    # Credit: u8 subscription id, u16 credit, no correlation id.
    assert P.encode(P.Credit(3, 258)) == bytes.fromhex("00000007000900010301" "02")


def test_open_response_without_properties():
    # RabbitMQ leaves the property count out when it has none.
    body = bytes.fromhex("8015" "0001" "00000009" "0001")
    assert P.decode(body) == P.OpenResponse(9, 1, {})


def test_route_response_of_old_brokers():
    # Before 3.11 Route answered one string, not a list.
    body = bytes.fromhex("8018" "0001" "00000001" "0001" "0003") + b"s-0"
    assert P.decode(body).streams == ("s-0",)


def test_consumer_update_response_types_without_value():
    frame = P.encode(P.ConsumerUpdateResponse(1, 1, P.OffsetSpec(P.OFFSET_FIRST)))
    assert len(frame) == 4 + 4 + 4 + 2 + 2


@pytest.mark.parametrize("frame", [
    b"",
    b"\x00",
    b"\x00\x11\x00",
])
def test_short_frames(frame):
    with pytest.raises(TruncatedFrame):
        P.decode(frame)


def test_every_cut_is_truncated():
    for cmd in SAMPLES:
        body = P.encode(cmd)[4:]
        for cut in range(4, len(body)):
            try:
                decoded = P.decode(body[:cut])
            except ProtocolError:
                continue
            # A cut can only decode where the tail is an optional field, or
            # (Route) where the old one-string answer reads as an empty name.
            assert type(decoded) in (P.OpenResponse, P.SaslAuthenticateResponse,
                                     P.Subscribe, P.Deliver, P.RouteResponse,
                                     P.ResolveOffsetSpec,
                                     P.ResolveOffsetSpecResponse), (cmd, cut)


def test_unknown_key():
    with pytest.raises(ProtocolError, match="unknown command key 0x0077"):
        P.decode(b"\x00\x77\x00\x01")


def test_bytes_left_over():
    body = P.encode(P.Heartbeat())[4:] + b"\x00"
    with pytest.raises(ProtocolError, match="left after"):
        P.decode(body)


def test_lying_array_count():
    body = bytes.fromhex("800f" "0001" "00000001" "7fffffff")
    with pytest.raises(TruncatedFrame):
        P.decode(body)


def test_negative_lengths_are_null_or_errors():
    """A null is a value only where the protocol allows one (a publisher's
    reference, a filter value); elsewhere it is a protocol error at its
    position, not a ``None`` that a caller trips over later."""
    body = bytes.fromhex("0011" "0001" "00000001" "00000001" "ffff" "0001") + b"x"
    with pytest.raises(ProtocolError, match="null where a string") as caught:
        P.decode(body)
    assert caught.value.position == 12
    mechanisms = bytes.fromhex("8012" "0001" "00000001" "0001"
                               "00000002" "0005") + b"PLAIN" + bytes.fromhex("ffff")
    with pytest.raises(ProtocolError, match="null where a string"):
        P.decode(mechanisms)
    anonymous = P.DeclarePublisher(3, 1, None, "s")
    assert P.decode(P.encode(anonymous)[4:]) == anonymous
    with pytest.raises(TruncatedFrame):
        P.decode(bytes.fromhex("0011" "0001" "00000001" "ffffffff"))


def test_invalid_utf8():
    body = bytes.fromhex("000e" "0001" "00000001" "0002" "ff fe")
    with pytest.raises(ProtocolError, match="UTF-8"):
        P.decode(body)


def test_values_out_of_range_are_refused_on_encode():
    with pytest.raises(ValueError):
        P.encode(P.Credit(256, 1))
    with pytest.raises(ValueError):
        P.encode(P.Delete(1, "x" * 40000))


def test_confirmed_ids_reads_the_array_the_broker_sends():
    """The producer's fast path: PublishConfirm's ids as one array, read from
    the layout of the protocol reference (key, version, publisher id, u32
    count, u64 ids), and refused when the count runs past the frame."""
    ids = (1, 2 ** 63 - 1, 5)
    frame = struct.pack(">HHBI3Q", 0x0003, 1, 7, 3, *ids)
    assert frame[CONFIRM_PUBLISHER_ID_AT] == 7
    assert confirmed_ids(memoryview(frame)).tolist() == list(ids)
    assert P.decode(frame) == P.PublishConfirm(7, ids)
    for short in (frame[:8], frame[:-1]):
        with pytest.raises(TruncatedFrame):
            confirmed_ids(memoryview(short))
