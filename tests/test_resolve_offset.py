"""RabbitMQ 4.3: ResolveOffsetSpec against what a consumer receives, and
exact tails from StreamStats ``committed_offset`` against the probe of the
last chunk that older brokers need."""

from __future__ import annotations

import datetime as dt
import time

import pytest

import pystream
from pystream.bounds import StreamBounds, offset_at, stream_bounds
from pystream.errors import StreamDoesNotExist, UnsupportedFeature
from pystream.features import COMMAND_KEY
from pystream.ranges import plan_ranges, read_range, resolve

from .conftest import LEGACY_URI, MODERN_URI
from .waiting import wait_until

pytestmark = pytest.mark.broker  # every test here talks to a test broker


@pytest.fixture
def latest_stream(latest, stream_name):
    latest.create_stream(stream_name)
    yield stream_name
    latest.delete_stream(stream_name, missing_ok=True)


def first_received(client, stream: str, offset, *, filter=None) -> int | None:
    """The offset of the first record a consumer at ``offset`` gets."""
    with client.consumer(stream, offset=offset, amqp=False, filter=filter) as consumer:
        head = consumer.read(1, timeout=2).column("offset")
    return head[0].as_py() if len(head) else None


def publish_chunks(client, stream: str, sizes: list[int], **options) -> list[dt.datetime]:
    """One confirmed batch per size, each one sub-entry and so one chunk
    (the broker may cut a plain Publish frame's messages into several); the
    time before each."""
    options.setdefault("compression", "none")
    times = []
    with client.producer(stream, **options) as producer:
        for i, n in enumerate(sizes):
            times.append(dt.datetime.now(dt.UTC))
            time.sleep(0.02)
            producer.send_batch([b"m%d-%d" % (i, j) for j in range(n)]).result(10)
            time.sleep(0.02)
    return times


def test_resolve_matches_what_a_consumer_receives(latest, latest_stream):
    times = publish_chunks(latest, latest_stream, [10, 5, 7])  # chunks 0, 10, 15
    assert latest.resolve_offset(latest_stream, "first") == first_received(
        latest, latest_stream, "first") == 0
    assert latest.resolve_offset(latest_stream, "last") == first_received(
        latest, latest_stream, "last") == 15
    assert latest.resolve_offset(latest_stream, times[1]) == first_received(
        latest, latest_stream, times[1]) == 10
    # An offset resolves to the chunk holding it: the broker sends that chunk
    # whole and the consumer drops the records before the offset.
    assert latest.resolve_offset(latest_stream, 12) == 10
    assert first_received(latest, latest_stream, 12) == 12
    assert first_received(latest, latest_stream, 10) == 10
    # "next": the first record written from now on.
    resolved = latest.resolve_offset(latest_stream, "next")
    assert resolved == 22
    with latest.consumer(latest_stream, offset="next", amqp=False) as consumer:
        time.sleep(0.3)
        with latest.producer(latest_stream) as producer:
            producer.send_batch([b"late"]).result(10)
        assert consumer.read(1, timeout=5).column("offset").to_pylist() == [resolved]
    # a time after the last chunk: the end, where "next" waits
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    assert latest.resolve_offset(latest_stream, later) == 23


def test_resolve_with_a_filter(latest, latest_stream):
    with latest.producer(latest_stream, filter_value="color") as producer:
        for color in ("red", "blue", "red"):
            producer.send(b"x", application_properties={"color": color})
            producer.flush(10)
    only_blue = pystream.Filter(["blue"])
    # RabbitMQ 4.3.6 resolves where reading starts and applies the filter to
    # the chunks read from there: the answer is the same with or without it,
    # and the consumer's first record is the first chunk at or after it
    # whose bloom filter may hold "blue".
    for spec, consumer_first in (("first", 1), (0, 1), (1, 1), ("last", None)):
        resolved = latest.resolve_offset(latest_stream, spec, filter=only_blue)
        assert resolved == latest.resolve_offset(latest_stream, spec)
        assert first_received(latest, latest_stream, spec, filter=only_blue) == consumer_first
        assert consumer_first is None or consumer_first >= resolved


def test_resolve_errors(latest, modern):
    with pytest.raises(StreamDoesNotExist):
        latest.resolve_offset("no-such-stream-here", "first")
    with pytest.raises(UnsupportedFeature, match="needs RabbitMQ 4.3"):
        modern.resolve_offset("any", "first")
    with pystream.connect(LEGACY_URI) as legacy:
        with pytest.raises(UnsupportedFeature, match="needs RabbitMQ 4.3"):
            legacy.resolve_offset("any", "first")


def test_exact_tail_equals_the_probe(latest, latest_stream):
    assert stream_bounds(latest, latest_stream) == stream_bounds(
        latest, latest_stream, exact=False) == StreamBounds(0, 0, None)
    publish_chunks(latest, latest_stream, [10, 5], compression="gzip")
    exact = stream_bounds(latest, latest_stream)
    probed = stream_bounds(latest, latest_stream, exact=False)
    assert (exact.first, exact.end) == (probed.first, probed.end) == (0, 15)
    assert exact.last_timestamp is None and probed.last_timestamp is not None
    assert latest.stream_stats(latest_stream)["committed_offset"] == 14


def test_exact_tail_counts_a_trailing_tracking_chunk(latest, latest_uri, latest_stream):
    # A stored offset appends an offset-tracking chunk: committed_offset
    # counts it, the probe (the last user chunk) does not, and a read up to
    # the exact end still ends (no record of it is ever delivered).
    publish_chunks(latest, latest_stream, [10])
    latest.store_offset(latest_stream, "billing", 4)
    wait_until(lambda: latest.stream_stats(latest_stream)["committed_offset"] >= 10, 5)
    assert stream_bounds(latest, latest_stream).end == 11
    assert stream_bounds(latest, latest_stream, exact=False).end == 10
    ranges = plan_ranges(latest_uri, [latest_stream])
    assert [(r.start, r.end) for r in ranges] == [(0, 11)]
    started = time.monotonic()
    rows = sum(b.num_rows for b in read_range(latest_uri, latest_stream, 0, 11,
                                              timeout=30))
    assert rows == 10 and time.monotonic() - started < 10
    # a range inside the last user chunk, and one inside the tracking chunk
    assert [b.column("offset").to_pylist() for b in read_range(
        latest_uri, latest_stream, 7, 11, timeout=30)] == [[7, 8, 9]]
    assert list(read_range(latest_uri, latest_stream, 10, 11, timeout=30)) == []


def test_older_brokers_keep_the_probe(stream_name):
    with pystream.connect(MODERN_URI) as modern:
        modern.create_stream(stream_name)
        try:
            publish_chunks(modern, stream_name, [3, 4])
            assert "committed_offset" not in modern.stream_stats(stream_name)
            bounds = stream_bounds(modern, stream_name)
            assert (bounds.first, bounds.end) == (0, 7)
            assert bounds.last_timestamp is not None
        finally:
            modern.delete_stream(stream_name)


def without_resolve(client) -> None:
    """Mask ResolveOffsetSpec as a broker that did not advertise it would:
    its statistics still carry ``committed_offset``."""
    features = client.connection.features
    features.commands = {k: v for k, v in (features.commands or {}).items()
                         if k != COMMAND_KEY["resolve_offset_spec"]}
    assert not client.supports("resolve_offset_spec")


def test_timestamps_resolve_without_resolve_offset_spec(latest, latest_stream):
    """With ``committed_offset`` the bounds carry no last chunk time: a
    time is probed, not taken for the stream's end (startingTimestamp,
    ``dump --from`` and timestamp pushdown all come through offset_at)."""
    times = publish_chunks(latest, latest_stream, [10, 5, 7])  # chunks 0, 10, 15
    without_resolve(latest)
    bounds = stream_bounds(latest, latest_stream)
    assert bounds == StreamBounds(0, 22, None)
    assert offset_at(latest, latest_stream, times[0], bounds) == 0
    assert offset_at(latest, latest_stream, times[1], bounds) == 10
    assert resolve(times[2], latest, latest_stream, bounds) == 15
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    assert offset_at(latest, latest_stream, later, bounds) == 22
