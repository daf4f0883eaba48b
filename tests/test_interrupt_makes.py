"""A caught interrupt (a ``KeyboardInterrupt``, or a signal handler's
exception) anywhere in making a client, a consumer or a producer leaves
nothing open: no hold on a pooled connection, no connection outside the
pool, and the client works on. The sweep of ``test_interrupt_points``:
the n-th point of the call interrupted, for every n in turn; then again
while the broker closes every connection every 200 ms, so that interrupts
land in the recoveries of what is being made too (where making one may
also fail, with a ``StreamError``, and must then leave nothing open
either)."""

from __future__ import annotations

import contextlib
import gc
import os
import random
import ssl
import threading
from collections.abc import Callable
from typing import Any

import pytest

import pystream
from pystream import metrics

from .conftest import MODERN_URI, TLS_URI
from .test_interrupt_points import Interrupter, client, faults  # noqa: F401
from .test_interrupt_sends import stream  # noqa: F401
from .waiting import wait_until

pytestmark = pytest.mark.broker


def left_open() -> tuple[int, int]:
    """The descriptors open in this process (a connection's socket and its
    wake-up pair), and the connections' reader threads alive."""
    return (len(os.listdir("/proc/self/fd")),
            sum(t.name.startswith("pystream-reader") and t.is_alive()
                for t in threading.enumerate()))


def open_gauge() -> float:
    """What the ``rabbitmq.stream.connections`` gauge reports."""
    return sum(n for n, _ in metrics._open_connections())


def opened() -> str:
    """What is open, to say what was left."""
    threads = sorted(t.name for t in threading.enumerate())
    sockets = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
    return f"threads {threads}; descriptors {sorted(sockets)}"


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


@pytest.mark.parametrize("what,fault", [
    ("connect", None), ("connect-tls", None), ("producer", None), ("consumer", None),
    ("connect", "close"), ("producer", "close"), ("consumer", "close")])
def test_an_interrupt_at_any_point_of_making_one_leaves_nothing_open(
        client: pystream.Client, stream: str, what: str,  # noqa: F811
        fault: str | None, request: pytest.FixtureRequest) -> None:
    tls = (ssl.create_default_context(cafile=request.getfixturevalue("tls_dir") / "ca.pem")
           if what == "connect-tls" else None)
    makers: dict[str, Callable[[], Any]] = {
        "connect": lambda: pystream.connect(MODERN_URI),
        "connect-tls": lambda: pystream.connect(TLS_URI, ssl_context=tls),
        "producer": lambda: client.producer(stream, name=stream),
        "consumer": lambda: client.consumer(stream, offset="first", name=stream),
    }
    make = makers[what]
    interrupter = Interrupter()
    before = left_open()
    gauge = open_gauge()
    landed = failed = 0
    # Under faults, every third point from a random first one: all of them
    # are swept without, and the faults' timing differs from run to run.
    step = 1 if fault is None else 3
    at = 1 if fault is None else random.randint(1, step)
    made: list[Any] = []
    with faults(fault):
        while True:
            made.clear()
            try:
                interrupter.call(at, lambda: made.append(make()))
            except KeyboardInterrupt:
                landed += 1
            except pystream.StreamError:
                failed += 1  # the broker closed it while it was made
            for thing in made:
                with contextlib.suppress(pystream.StreamError):
                    thing.close()
            where = f"an interrupt at point {at}, {interrupter.where},"
            assert not client.pool.holders(), f"{where} kept a hold"
            try:
                wait_until(lambda: none_left(before), 10)
            except AssertionError:
                raise AssertionError(
                    f"the connections {where} left open did not close within 10 s: "
                    f"{left_open()} open, {before} before; {opened()}") from None
            if interrupter.points < at:
                break
            at += step
    assert landed >= 50 / step
    if fault is None:  # under faults, the client's own may be closed now
        assert open_gauge() == gauge, "the connections gauge drifted"
    if fault is not None:
        assert failed < landed, f"{failed} makings failed, {landed} interrupted"
    # The client works on.
    with client.producer(stream) as producer:
        producer.send_batch([b"after"]).result(10)
