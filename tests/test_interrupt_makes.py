"""A caught interrupt (a ``KeyboardInterrupt``, or a signal handler's
exception) anywhere in making a client, a consumer or a producer leaves
nothing open: no hold on a pooled connection, no connection outside the
pool, and the client works on. The sweep of ``test_interrupt_points``:
the n-th point of the call interrupted, for every n in turn."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

import pystream

from .conftest import MODERN_URI
from .test_interrupt_points import Interrupter, client  # noqa: F401
from .test_interrupt_sends import stream  # noqa: F401
from .waiting import wait_until

pytestmark = pytest.mark.broker


def left_open() -> tuple[int, int]:
    """The descriptors open in this process (a connection's socket and its
    wake-up pair), and the connections' reader threads alive."""
    return (len(os.listdir("/proc/self/fd")),
            sum(t.name.startswith("pystream-reader") and t.is_alive()
                for t in threading.enumerate()))


def none_left(before: tuple[int, int]) -> bool:
    """Nothing open beyond ``before``, once cycles are collected if need
    be: a traceback the interrupt left may hold a half-made object in one
    until then, but nothing for good. (Collecting every time would cost a
    long test session's whole heap at each point.)"""
    def within() -> bool:
        return all(n <= m for n, m in zip(left_open(), before, strict=True))
    if within():
        return True
    gc.collect()
    return within()


@pytest.mark.parametrize("what", ["connect", "producer", "consumer"])
def test_an_interrupt_at_any_point_of_making_one_leaves_nothing_open(
        client: pystream.Client, stream: str, what: str) -> None:  # noqa: F811
    makers: dict[str, Callable[[], Any]] = {
        "connect": lambda: pystream.connect(MODERN_URI),
        "producer": lambda: client.producer(stream, name=stream),
        "consumer": lambda: client.consumer(stream, offset="first", name=stream),
    }
    make = makers[what]
    interrupter = Interrupter()
    before = left_open()
    landed, at = 0, 1
    made: list[Any] = []
    while True:
        made.clear()
        try:
            interrupter.call(at, lambda: made.append(make()))
        except KeyboardInterrupt:
            landed += 1
        for thing in made:
            thing.close()
        where = f"an interrupt at point {at}, {interrupter.where},"
        assert not client.pool.holders(), f"{where} kept a hold"
        wait_until(lambda: none_left(before), 10,
                   what=f"the connections {where} left open to close")
        if interrupter.points < at:
            break
        at += 1
    assert landed >= 50
    # The client works on.
    with client.producer(stream) as producer:
        producer.send_batch([b"after"]).result(10)
