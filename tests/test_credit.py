"""The credit controller on its own: what each policy grants."""

from __future__ import annotations

import heapq
import random

import pytest

from pystream.credit import Credit, CreditController, subscribe_credit
from pystream.errors import ProtocolError


def test_adaptive_never_lets_queue_and_flight_pass_the_budget():
    budget, chunk = 8 << 20, 1 << 20
    c = CreditController(Credit.adaptive(budget, max_outstanding=64), chunk)
    in_flight = c.start()
    assert in_flight == 2   # slow start until a chunk shows its size
    queue: list[int] = []
    rng = random.Random(1)
    for _step in range(10_000):
        if in_flight and rng.random() < 0.7:   # the broker sends a chunk
            size = rng.randint(chunk // 4, chunk)
            in_flight -= 1
            queue.append(size)
            in_flight += c.arrived(size)
        if queue and rng.random() < 0.3:       # a slow application takes one
            in_flight += c.handed(queue.pop(0), 0.0, 1.0)
        assert sum(queue) <= budget + chunk
        assert in_flight == c.outstanding
        assert in_flight or queue, "stalled"


def test_adaptive_keeps_one_credit_when_the_budget_is_below_a_chunk():
    c = CreditController(Credit.adaptive(max_buffered_bytes=1), 1 << 20)
    assert c.start() == 1
    assert c.arrived(1 << 20) == 0      # queue full
    assert c.handed(1 << 20, 0.0, 1.0) == 1


def test_adaptive_fills_the_pipe_when_the_application_keeps_up():
    c = CreditController(Credit.adaptive(64 << 20, max_outstanding=16), 1 << 20)
    assert c.start() == 2
    granted = 0
    for _ in range(100):
        granted += c.arrived(100_000)
        granted += c.handed(100_000, 0.0, 1.0)
    assert c.outstanding >= 12   # topped up in quarter steps
    assert granted >= 100 - 4


def test_adaptive_sizes_its_window_on_chunks_larger_than_the_hint():
    """8 MB chunks on a 1 MiB frame_max (the broker sends chunks whole)."""
    budget, chunk = 64 << 20, 8 << 20
    c = CreditController(Credit.adaptive(budget), 1 << 20)
    in_flight = c.start()
    queued = 0
    for _ in range(50):   # an application that never takes anything
        if not in_flight:
            break
        in_flight -= 1
        queued += chunk
        in_flight += c.arrived(chunk)
        assert queued + in_flight * chunk <= budget + chunk
    assert in_flight == 0 and budget - chunk < queued <= budget + chunk


def test_subscribe_credit_keeps_the_broker_threshold_at_zero():
    assert subscribe_credit(64) == (1, 63)
    assert subscribe_credit(1) == (1, 0)
    assert subscribe_credit(0) == (0, 0)


def test_on_arrival_and_on_consumed():
    a = CreditController(Credit.on_arrival(3), 1)
    assert a.start() == 3 and a.arrived(10) == 1
    c = CreditController(Credit.on_consumed(2, ratio=0.5), 1)
    assert c.start() == 2
    assert c.arrived(10) == 0
    assert c.handed(10, 0.0, 0.4) == 0
    assert c.handed(10, 0.4, 0.6) == 1
    assert c.handed(10, 0.6, 1.0) == 0


def test_manual():
    m = CreditController(Credit.manual(1), 1)
    assert m.start() == 1 and m.arrived(5) == 0 and m.handed(5, 0, 1) == 0
    assert m.manual(4) == 4
    with pytest.raises(ValueError):
        m.manual(-1)


@pytest.mark.parametrize("kwargs", [dict(mode="fast"), dict(max_buffered_bytes=0),
                                    dict(max_outstanding=0), dict(ratio=0)])
def test_bad_policies(kwargs):
    with pytest.raises(ValueError):
        Credit(**kwargs)


def link_flow(policy: Credit, rtt: float, chunk: int = 900_000,
              bandwidth: float = 1e9, chunks: int = 1000) -> float:
    """Bytes per second from the first chunk's arrival to the last one's:
    a broker that sends a chunk per credit over a link of ``bandwidth`` and
    ``rtt``, to an application that takes every chunk at once."""
    c = CreditController(policy, 1 << 20)
    events = [(rtt / 2, "credit", c.start())]   # the Subscribe's credit
    link_free = 0.0
    credit = sent = 0
    arrivals: list[float] = []
    while events:
        now, kind, n = heapq.heappop(events)
        if kind == "credit":
            credit += n
        else:
            arrivals.append(now)
            granted = c.arrived(chunk) + c.handed(chunk, 0.0, 1.0)
            if granted:
                heapq.heappush(events, (now + rtt / 2, "credit", granted))
        while credit and sent < chunks:
            credit -= 1
            sent += 1
            link_free = max(now, link_free) + chunk / bandwidth
            heapq.heappush(events, (link_free + rtt / 2, "chunk", 0))
    assert len(arrivals) == chunks
    return (chunks - 1) * chunk / (arrivals[-1] - arrivals[0])


@pytest.mark.parametrize("rtt_ms", [1, 5, 20])
def test_adaptive_keeps_a_distant_link_full(rtt_ms):
    """At 20 ms the bandwidth-delay product of 1 GB/s is 20 MB: the default
    policy's 64 chunks (58 MB of the benchmark's chunks) cover it, so the
    flow stays at the link's rate; a fixed credit of 10 chunks (the Java
    client's default) gets 9 MB per round trip, under half of it."""
    near = link_flow(Credit.adaptive(), 0.0001)
    assert link_flow(Credit.adaptive(), rtt_ms / 1000) >= 0.9 * near
    if rtt_ms == 20:
        assert link_flow(Credit.on_arrival(10), 0.020) < 0.5 * near


def test_small_chunks_at_a_distance_need_more_chunks_in_flight():
    """A stream written slowly holds small chunks: 20 kB ones at 20 ms
    fill 64 credits with 1.3 MB, 6 % of the link; the byte budget (64 MiB)
    allows more, and ``max_outstanding`` is what lets it."""
    near = link_flow(Credit.adaptive(), 0.0001, chunk=20_000, chunks=5000)
    assert link_flow(Credit.adaptive(), 0.020, chunk=20_000, chunks=5000) < 0.1 * near
    wide = Credit.adaptive(max_outstanding=2048)
    assert link_flow(wide, 0.020, chunk=20_000, chunks=20_000) >= 0.9 * near


def test_adaptive_until_grants_only_the_chunks_left():
    c = CreditController(Credit.adaptive(max_outstanding=64, until=1000), 1 << 20)
    assert c.start() == 2  # slow start: nothing known of the chunks yet
    c.arrived(100_000, next_offset=100, records=100)
    # 900 records left, chunks of 100: nine, one of them already granted
    assert c.outstanding + c.handed(100_000, 0.0, 1.0) == 9
    c.arrived(100_000, next_offset=1000, records=100)
    assert c.handed(100_000, 0.0, 1.0) == 0  # the end arrived: nothing more


def test_chunks_decode_only_within_the_budget():
    """Sizes are decoded bytes, admitted before decoding: a chunk that does
    not fit beside those queued waits counted at its wire size, and is
    counted decoded once decoded at the head; with nothing queued any
    chunk decodes (the one beyond the budget)."""
    c = CreditController(Credit.adaptive(max_buffered_bytes=10 << 20), 1 << 20)
    assert c.start() == 2
    assert c.admit(1000, 8 << 20)            # nothing queued: decodes
    assert not c.admit(1000, 8 << 20)        # 16 MiB would pass 10: waits
    assert c.queued_bytes == (8 << 20) + 1000
    c.handed(8 << 20, 0.0, 1.0)              # the first goes to the application
    c.inflated(1000, 8 << 20)                # the second decodes at the head
    assert c.queued_bytes == 8 << 20
    c.handed(8 << 20, 0.0, 1.0)
    assert c.queued_bytes == 0
    assert c.chunk_estimate == 8 << 20       # credit sized on decoded chunks


def test_a_chunk_beyond_credit_counts_and_must_fit():
    c = CreditController(Credit.manual(1), 1 << 20)
    assert c.start() == 1
    assert c.admit(100, 6 << 20)             # granted
    assert c.admit(100, 1 << 20)             # beyond credit, fits: counted
    assert c.queued_bytes == 7 << 20
    with pytest.raises(ProtocolError):
        c.admit(100, 64 << 20)               # beyond credit, does not fit


def test_dropped_admissions_and_stale_grants_are_forgotten():
    c = CreditController(Credit.manual(4), 1 << 20)
    c.start()
    assert c.admit(100, 1000) and c.admit(100, 1000)
    generation = c.generation
    c.dropped(1000, generation)              # dropped before it was queued
    assert c.queued_bytes == 1000
    c.emptied()                              # a rewind forgets everything
    c.dropped(1000, generation)              # and what was admitted before it
    assert c.queued_bytes == 0
    assert c.manual(3) == 3
    c.start()                                # resubscribed before it was sent
    assert c.claim(3) == 0
    assert c.claim(c.manual(2)) == 2
