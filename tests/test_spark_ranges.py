"""Offset ranges for parallel readers: planning and reading (no Spark
needed)."""

from __future__ import annotations

import pytest

from pystream import RequestTimeout
from pystream.spark import OffsetRange, plan_ranges, read_range, split_ranges

from .publishers import amqp_message, publish

N = 10_000


def test_split_in_proportion_then_capped():
    ranges = [OffsetRange("a", 0, 900_000), OffsetRange("b", 100, 300_100)]
    parts = split_ranges(ranges, 4, None, 1)
    assert [(r.stream, r.size) for r in parts] == [
        ("a", 300_000), ("a", 300_000), ("a", 300_000), ("b", 300_000)]
    capped = split_ranges(ranges, None, 250_000, 1)
    assert max(r.size for r in capped) <= 250_000
    assert sum(r.size for r in capped) == 1_200_000
    assert capped[-1].end == 300_100


def test_split_keeps_parts_large_enough():
    parts = split_ranges([OffsetRange("a", 0, 250_000)], 100, None, 100_000)
    assert [r.size for r in parts] == [125_000, 125_000]


def test_no_ranges():
    assert split_ranges([], 4, 10, 1) == []


@pytest.fixture
def filled(client, stream):
    for part in range(4):  # several chunks
        publish(client, stream, [amqp_message(b"%05d" % i)
                                 for i in range(part * N // 4, (part + 1) * N // 4)])
    return stream


def test_ranges_read_back_the_whole_stream(uri, filled):
    planned = plan_ranges(uri, [filled], min_partitions=7,
                          min_records_per_partition=1)
    assert len(planned) == 7
    assert planned[0].start == 0 and planned[-1].end == N
    bodies = []
    for r in planned:
        for batch in read_range(uri, r.stream, r.start, r.end):
            bodies += batch.column("body").to_pylist()
    assert bodies == [b"%05d" % i for i in range(N)]


def test_range_inside_chunks(uri, filled):
    offsets = [o for b in read_range(uri, filled, 1234, 5678)
               for o in b.column("offset").to_pylist()]
    assert offsets == list(range(1234, 5678))


def test_bounds_per_stream(uri, filled):
    assert plan_ranges(uri, [filled], {filled: 100}, {filled: 200}) == [
        OffsetRange(filled, 100, 200)]
    assert plan_ranges(uri, [filled], "latest") == []
    with pytest.raises(ValueError):
        plan_ranges(uri, [filled], "newest")


def test_range_past_the_end_times_out(uri, filled):
    with pytest.raises(RequestTimeout):
        list(read_range(uri, filled, N - 5, N + 5, timeout=0.5))


def test_stored_offsets_at_the_end_do_not_hang_a_range(uri, client, filled):
    """A stored offset writes a tracking chunk at the end of the stream."""
    client.store_offset(filled, "someone", 42)
    planned = plan_ranges(uri, [filled])
    assert planned[0].start == 0 and planned[-1].end >= N
    rows = sum(b.num_rows for r in planned
               for b in read_range(uri, r.stream, r.start, r.end, timeout=5))
    assert rows == N
