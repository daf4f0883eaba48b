"""Leader loss in a three-node RabbitMQ 4.0 cluster (`scripts/broker up
cluster`): a stream with two replicas loses its leader's node while a named
producer publishes and a consumer reads. The producer's deduplication must
keep every record once, the consumer must follow the new leader or a replica,
and nothing may reach the application as an error. Prints (and records as
properties) how long each took to recover.

The client connects to cluster1 and the stream's leader is put there
(``client-local``), so the node that goes is also the one of the client's
own admin connection. The node goes three ways: stopped (``scripts/broker
down``: it leaves the cluster in order), killed (SIGKILL to its whole
process group: a crash), and paused (SIGSTOP: its sockets stay open but
nothing answers, as behind a partition, until the other nodes declare it
down after net_ticktime, 10 s here). Then the replica the consumer reads
from is killed: the consumer must move to another node. The client uses a
2 s heartbeat, which is what notices a silent node."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pytest

import pystream
from pystream.pool import Endpoint

from . import brokers
from .conftest import BROKER_SCRIPT, run_broker
from .waiting import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

CLUSTER_URI = brokers.CLUSTER[0].uri()
NODE_OF_PORT = {node.stream: node.name for node in brokers.CLUSTER}
RATE = 3_000          # messages per second
BATCH = 100           # messages per send_batch
BEFORE_FAULT = 4.0    # seconds of traffic before the leader's node stops
AFTER_FAULT = 10.0    # ... and after it stopped (or after the new leader)
OPTIONS = dict(heartbeat=2, connect_timeout=3, request_timeout=5)


def node_pid(node: str) -> int:
    """The pid scripts/broker noted for a node (its process group leader)."""
    cache = pathlib.Path(os.environ.get("PYSTREAM_BROKER_CACHE",
                                        pathlib.Path.home() / ".cache/pystream/brokers"))
    return int((cache / node / "node.pid").read_text().split()[0])


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    run_broker("up", "cluster")
    yield
    # Three Erlang nodes on two shared cores: free them for the other tests.
    run_broker("down", "cluster")


@dataclass
class Publisher:
    """Publishes sequence numbers (8-byte big-endian bodies equal to their
    publishing ids) at RATE, in a thread, noting when each batch was sent
    and confirmed."""

    producer: pystream.Producer
    sent: list[tuple[int, float]] = field(default_factory=list)        # first id, time
    confirmed: list[tuple[int, int, float]] = field(default_factory=list)  # first, last, time
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    next_id: int = 1

    def run(self) -> None:
        due = time.monotonic()
        while not self.stop.is_set():
            first = self.next_id
            ids = np.arange(first, first + BATCH, dtype=">u8")
            bodies = pa.array([ids[i:i + 1].tobytes() for i in range(BATCH)],
                              pa.binary())
            try:
                future = self.producer.send_batch(bodies, publishing_id=first)
            except pystream.StreamError as exc:
                self.errors.append(exc)
                return
            self.sent.append((first, time.monotonic()))
            future.add_done_callback(self._settled(first))
            self.next_id += BATCH
            due += BATCH / RATE
            time.sleep(max(0.0, due - time.monotonic()))

    def _settled(self, first: int) -> Callable[[Future], None]:
        def done(future: Future) -> None:
            if future.exception() is not None:
                self.errors.append(future.exception())  # type: ignore[arg-type]
            else:
                self.confirmed.append((first, future.result(), time.monotonic()))
        return done


@dataclass
class Reader:
    """Reads the stream from the first record in a thread, noting each
    record's offset, sequence number and arrival time."""

    consumer: pystream.Consumer
    offsets: list[np.ndarray] = field(default_factory=list)
    seqs: list[np.ndarray] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)   # per batch
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    highest: int = 0

    def run(self) -> None:
        try:
            while not (self.stop.is_set() or self.consumer.closed):
                for batch in self.consumer.batches(timeout=0.5):
                    seqs = np.frombuffer(b"".join(batch.column("body").to_pylist()),
                                         dtype=">u8").astype(np.int64)
                    self.offsets.append(batch.column("offset").to_numpy())
                    self.seqs.append(seqs)
                    self.arrived.append(time.monotonic())
                    self.highest = max(self.highest, int(seqs.max()))
                    if self.stop.is_set():
                        return
        except pystream.StreamError as exc:
            self.errors.append(exc)


def consumer_endpoint(consumer: pystream.Consumer, stream: str) -> Endpoint:
    """The node a consumer's subscription is on (the consumer does not say)."""
    connection = consumer._subs[stream].connection
    assert connection is not None
    return Endpoint(connection.address.host, connection.address.port)


def node_of(endpoint: Endpoint | None) -> str | None:
    return None if endpoint is None else NODE_OF_PORT[endpoint.port]


@pytest.mark.parametrize("victim, how", [
    ("leader", "stop"), ("leader", "kill"), ("leader", "pause"),
    # The replica the consumer reads from: it must move to another node.
    ("reader", "kill")])
def test_node_loss(cluster: None, victim: str, how: str,
                   record_property: Callable[[str, object], None]) -> None:
    started = time.monotonic()
    stream = f"test-cluster-{uuid.uuid4().hex[:8]}"
    stopped: str | None = None
    with pystream.connect(CLUSTER_URI, **OPTIONS) as client:
        client.create_stream(stream, initial_cluster_size=3,
                             leader_locator="client-local")
        try:
            info = wait_until(
                lambda: (i := client.metadata(stream)[stream]).leader is not None
                and len(i.replicas) == 2 and i,
                30, what="a leader and two replicas")
            leader = node_of(info.leader)
            assert leader == "cluster1"
            assert {node_of(r) for r in info.replicas} == {"cluster2", "cluster3"}

            producer = client.producer(stream, name=f"cluster-{stream}",
                                       max_in_flight=1_000_000)
            consumer = client.consumer(stream, offset="first")
            publisher, reader = Publisher(producer), Reader(consumer)
            threads = [threading.Thread(target=publisher.run, daemon=True),
                       threading.Thread(target=reader.run, daemon=True)]
            for t in threads:
                t.start()
            time.sleep(BEFORE_FAULT)

            reading_from = node_of(consumer_endpoint(consumer, stream))
            assert reading_from in ("cluster2", "cluster3")  # a replica
            fault = time.monotonic()
            stopped = leader if victim == "leader" else reading_from
            stopping: subprocess.Popen | None = None
            if how == "kill":
                os.killpg(node_pid(stopped), signal.SIGKILL)
            elif how == "pause":
                run_broker("pause", stopped)
            else:
                stopping = subprocess.Popen([str(BROKER_SCRIPT), "down", stopped],
                                            stdout=subprocess.DEVNULL)

            def new_leader() -> tuple[str, float] | None:
                try:
                    now = client.metadata(stream)[stream]
                except (pystream.ConnectionLost, pystream.ConnectionClosed,
                        pystream.RequestTimeout):
                    # Asked on the admin connection as its node went: the
                    # next request goes to another node.
                    return None
                name = node_of(now.leader)
                return (name, time.monotonic()) if name not in (None, leader) else None

            if victim == "leader":
                elected, elected_at = wait_until(new_leader, 60, what="a new leader")
            else:
                elected, elected_at = leader, fault
            node_gone = fault  # a kill or pause acts at once
            if stopping is not None:
                assert stopping.wait(120) == 0
                node_gone = time.monotonic()
            time.sleep(max(0.0, max(fault, elected_at - AFTER_FAULT / 2)
                           + AFTER_FAULT - time.monotonic()))

            publisher.stop.set()
            threads[0].join(30)
            producer.flush(timeout=60)
            last_id = publisher.next_id - 1
            wait_until(lambda: reader.highest >= last_id or reader.errors, 60,
                       what=f"the consumer reading up to {last_id}")
            reader.stop.set()
            threads[1].join(30)
            moved_to = node_of(consumer_endpoint(consumer, stream))
            consumer.close()
            producer.close()
        finally:
            if stopped is not None and how == "pause":
                # Back after the others declared it down, the node stays
                # partitioned from them (Mnesia): a restart rejoins it.
                run_broker("resume", stopped)
                run_broker("restart", stopped)
            elif stopped is not None:
                run_broker("up", stopped)
            client.delete_stream(stream, missing_ok=True)

    assert not publisher.errors, publisher.errors
    assert not reader.errors, reader.errors
    offsets = np.concatenate(reader.offsets)
    seqs = np.concatenate(reader.seqs)
    arrived = np.repeat(reader.arrived, [len(s) for s in reader.seqs])

    # The old leader may confirm for a moment after the stop is issued: the
    # outage starts at the last confirm before the longest silence after
    # it, and ends with the next.
    firsts = np.array([first for first, _, _ in publisher.confirmed])
    confirm_at = np.array([t for _, _, t in publisher.confirmed])
    order = np.argsort(confirm_at)
    firsts, confirm_at = firsts[order], confirm_at[order]
    late = np.nonzero(confirm_at >= fault)[0]
    gaps = np.diff(confirm_at[late[0] - 1:])
    worst = int(np.argmax(gaps)) + late[0] - 1
    outage, resumed = confirm_at[worst], confirm_at[worst + 1]
    producer_recovery = float(gaps.max())
    sent_ids = np.array([first for first, _ in publisher.sent])
    sent_at = np.array([t for _, t in publisher.sent])
    confirmed_at = dict(zip(firsts, confirm_at, strict=True))
    waited = BATCH * sum(1 for first, t in publisher.sent
                         if t < resumed <= confirmed_at[first])
    # The first record sent after the outage began, as read (it may have
    # been stored by the old leader, its confirm lost with the connection).
    first_after = int(sent_ids[sent_at > outage].min())
    consumer_recovery = float(arrived[seqs >= first_after].min()) - outage
    reads = np.array(reader.arrived)
    consumer_gap = float(np.diff(reads[reads >= fault - 1]).max())
    report = (f"{how} of {victim} {stopped} issued at 0 s (consumer read "
              f"from {reading_from}, then {moved_to}), node gone at "
              f"{node_gone - fault:.1f} s; old leader's last confirm at "
              f"{outage - fault:.2f} s; new leader {elected} in metadata at "
              f"{elected_at - fault:.2f} s; producer: confirms again "
              f"{producer_recovery:.2f} s after the last one, "
              f"{waited} messages waited across the outage; consumer: reads "
              f"again {consumer_gap:.2f} s after its last read before, the "
              f"first record sent after the outage began "
              f"{consumer_recovery:.2f} s after it began; {len(seqs)} records "
              f"read, {last_id} sent; test "
              f"{time.monotonic() - started:.0f} s")
    print(f"\n{report}")
    record_property("new_leader", elected)
    record_property("leader_elected_s", round(elected_at - fault, 3))
    record_property("producer_recovery_s", round(producer_recovery, 3))
    record_property("consumer_recovery_s", round(consumer_recovery, 3))
    record_property("consumer_gap_s", round(consumer_gap, 3))

    confirmed = np.concatenate([np.arange(first, last + 1)
                                for first, last, _ in publisher.confirmed])
    assert len(confirmed) == last_id, report          # flush: every id confirmed
    assert (np.diff(offsets) > 0).all(), f"offsets not increasing: {report}"
    assert len(np.unique(seqs)) == len(seqs), f"duplicates: {report}"
    assert (np.diff(seqs) > 0).all(), f"out of order: {report}"
    assert np.isin(confirmed, seqs).all(), f"confirmed records missing: {report}"
    assert seqs.min() >= 1 and seqs.max() <= last_id, report
    assert moved_to != stopped, report
