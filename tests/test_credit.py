"""The credit controller on its own: what each policy grants."""

from __future__ import annotations

import random

import pytest

from pystream.credit import Credit, CreditController, subscribe_credit


def test_adaptive_never_lets_queue_and_flight_pass_the_budget():
    budget, chunk = 8 << 20, 1 << 20
    c = CreditController(Credit.adaptive(budget, max_outstanding=64), chunk)
    in_flight = c.start()
    assert in_flight == 2   # slow start until a chunk shows its size
    queue: list[int] = []
    rng = random.Random(1)
    for step in range(10_000):
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


def test_adaptive_until_grants_only_the_chunks_left():
    c = CreditController(Credit.adaptive(max_outstanding=64, until=1000), 1 << 20)
    assert c.start() == 2  # slow start: nothing known of the chunks yet
    c.arrived(100_000, next_offset=100, records=100)
    # 900 records left, chunks of 100: nine, one of them already granted
    assert c.outstanding + c.handed(100_000, 0.0, 1.0) == 9
    c.arrived(100_000, next_offset=1000, records=100)
    assert c.handed(100_000, 0.0, 1.0) == 0  # the end arrived: nothing more
