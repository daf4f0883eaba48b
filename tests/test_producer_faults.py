"""The producer's rows of the fault x feature check: a named producer
(deduplication on) sends 50 000 messages while the broker drops its
connections under it, and every message it confirmed is in the stream
exactly once.

Only this test's connections are dropped (killed on the modern broker by
their connection name), so that the other tests sharing the broker carry
on undisturbed."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
import uuid
from collections import Counter

import pytest

import pystream

from .conftest import MODERN_URI, broker_ctl

pytestmark = pytest.mark.broker

N = 50_000


def kill_connections(name: str) -> int:
    """Kill the modern broker's stream connections named ``name``: their
    sockets close under the client without a Close, as when a node drops
    them. How many there were."""
    for attempt in range(5):
        try:
            out = broker_ctl("modern", "list_stream_connections", "--formatter",
                             "json", "pid", "client_properties")
            break
        except subprocess.CalledProcessError:
            # A connection that closes while it is listed fails the listing.
            if attempt == 4:
                raise
            time.sleep(0.2)
    pids = []
    for line in out.splitlines():
        line = line.strip().lstrip(",")
        if line.startswith("{"):
            conn = json.loads(line)
            if ["connection_name", "longstr", name] in conn["client_properties"]:
                # #PID<remote.id.serial> as the CLI names it; <0.id.serial> on the node.
                pids.append("<0." + conn["pid"].split(".", 1)[1])
    if pids:
        listed = ",".join(f'"{pid}"' for pid in pids)
        broker_ctl("modern", "eval",
                   f"[exit(list_to_pid(P), kill) || P <- [{listed}]], ok.")
    return len(pids)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["send", "send_batch"])
def test_every_confirmed_message_is_stored_once_across_dropped_connections(
        modern_stream, path, caplog):
    connection_name = f"pystream-producer-faults-{uuid.uuid4().hex[:8]}"
    bodies = [b"%06d" % i for i in range(N)]
    sent = [0]
    kills: list[tuple[int, int, int]] = []  # sent before, connections, sent after
    stop = threading.Event()
    dropped = threading.Event()  # both drops done

    def drop_connections() -> None:
        for share in (0.15, 0.5):
            while sent[0] < share * N and not stop.is_set():
                time.sleep(0.01)
            before = sent[0]
            killed = kill_connections(connection_name)
            kills.append((before, killed, sent[0]))
        dropped.set()

    futures = []
    caplog.set_level(logging.WARNING, "pystream.producer")
    with pystream.connect(MODERN_URI, connection_name=connection_name) as client:
        producer = client.producer(modern_stream, name="exactly-once",
                                   max_in_flight=5000)
        killer = threading.Thread(target=drop_connections, daemon=True)
        killer.start()
        try:
            for start in range(0, N, 100):
                part = bodies[start:start + 100]
                if path == "send":
                    futures += [producer.send(b, timeout=60) for b in part]
                else:
                    futures.append(producer.send_batch(part, timeout=60))
                sent[0] = start + len(part)
                time.sleep(0.02)  # some 10 s of sending, for the drops to land in
                if sent[0] == 9 * N // 10:  # a slow rabbitmqctl: the drops land first
                    dropped.wait(120)
            producer.flush(120)
        finally:
            stop.set()
            killer.join(60)
            producer.close(30)
        assert len(kills) == 2
        for before, killed, after in kills:
            assert killed >= 1 and before < N and after < N, kills
        assert [r for r in caplog.records if r.name == "pystream.producer"
                and "recovered from connection lost" in r.getMessage()]
        per_message = (futures if path == "send" else
                       [f for f in futures for _ in range(100)])
        confirmed = [b for b, f in zip(bodies, per_message, strict=True)
                     if f.exception() is None]
        with client.consumer(modern_stream, offset="first") as consumer:
            stored = consumer.read(2 * N, timeout=5).column("body").to_pylist()
    counts = Counter(stored)
    assert not [b for b, c in counts.items() if c > 1], "stored twice"
    assert not [b for b in confirmed if b not in counts], "confirmed, not stored"
    # The named producer recovered and sent again what was unconfirmed.
    assert len(confirmed) == N and stored == bodies
