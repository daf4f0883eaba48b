"""A caught interrupt (a ``KeyboardInterrupt``, or a signal handler's
exception) anywhere in making a client, a consumer or a producer leaves
nothing open: no hold on a pooled connection, no connection outside the
pool, and the client works on. The sweep of ``test_interrupt_points``:
the n-th point of the call interrupted, for every n in turn; then, for
``FAULT_SECONDS``, sweep after sweep while the broker closes every
connection every 200 ms, so that interrupts land in the recoveries of what
is being made too (where making one may also fail, with a
``StreamError``, and must then leave nothing open either). Under closes
the broker also ends, within 200 ms, a connection the client forgot: those
cells catch what outlives a connection (a hold, a socket, a reader
thread), the cells without faults a connection left open."""

from __future__ import annotations

import contextlib
import gc
import os
import ssl
import threading
import time
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

FAULT_SECONDS = 30


def descriptors() -> list[str]:
    """What each descriptor open in this process is."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since listed
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def own(of: pystream.Client) -> tuple[set[str], int]:
    """What the client's own connection holds now (its socket, its
    wake-up pair; its reader thread): under faults the broker closes it
    and the client opens another, so it is taken out of the count rather
    than left as slack that would hide a leak."""
    conn = of._admin._connection  # not .connection: that reopens it
    fds = [conn._sock] if conn._sock is not None else []
    turn = conn._receiver._turn
    if turn is not None:
        fds += [turn._wake_r, turn._wake_w]
    names = set()
    for sock in fds:
        with contextlib.suppress(OSError):  # closed since
            if sock.fileno() >= 0:
                names.add(os.readlink(f"/proc/self/fd/{sock.fileno()}"))
    thread = getattr(conn, "_reader_thread", None)
    return names, int(thread is not None and thread.is_alive())


def left_open(of: pystream.Client) -> tuple[int, int]:
    """The sockets open in this process (a connection's socket and its
    wake-up pair) and the connections' reader threads alive, less the
    client's own connection's. Sockets only: the thread that makes the
    faults holds the pipes of a ``rabbitmqctl`` most of the time."""
    names, thread = own(of)
    return (sum(d.startswith("socket:") and d not in names for d in descriptors()),
            sum(t.name.startswith("pystream-reader") and t.is_alive()
                for t in threading.enumerate()) - thread)


def open_gauge() -> float:
    """What the ``rabbitmq.stream.connections`` gauge reports."""
    return sum(n for n, _ in metrics._open_connections())


def opened() -> str:
    """What is open, to say what was left."""
    threads = sorted(t.name for t in threading.enumerate())
    return f"threads {threads}; descriptors {sorted(descriptors())}"


def none_left(of: pystream.Client, before: tuple[int, int]) -> bool:
    """Nothing open beyond ``before``, once cycles are collected if need
    be: a traceback the interrupt left may hold a half-made object in one
    until then, but nothing for good. (Collecting every time would cost a
    long test session's whole heap at each point.)"""
    def within() -> bool:
        return all(n <= m for n, m in zip(left_open(of), before, strict=True))
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
    before = left_open(client)
    gauge = open_gauge()
    landed = failed = 0
    # Under faults, sweeps again and again for FAULT_SECONDS: one sweep
    # takes a few seconds, in which the broker closes the connections only
    # a few times.
    began = time.monotonic()
    at = 1
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
                wait_until(lambda: none_left(client, before), 10)
            except AssertionError:
                raise AssertionError(
                    f"the connections {where} left open did not close within 10 s: "
                    f"{left_open(client)} open, {before} before; {opened()}") from None
            if interrupter.points < at:
                if fault is None or time.monotonic() - began >= FAULT_SECONDS:
                    break
                at = 0
            at += 1
    assert landed >= 50
    if fault is None:  # under faults, the client's own may be closed now
        assert open_gauge() == gauge, "the connections gauge drifted"
    if fault is not None:
        assert failed < landed, f"{failed} makings failed, {landed} interrupted"
    # The client works on.
    with client.producer(stream) as producer:
        producer.send_batch([b"after"]).result(10)
