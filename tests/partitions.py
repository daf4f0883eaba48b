"""Partitions of the netcluster (`scripts/broker up netcluster`): the soak's
named producer and consumer (tests/soak.py) run in the client namespace
against a stream whose leader is net1 while tests/netfault.py cuts real
links; afterwards the soak's checker holds them to every confirmed record
read exactly once, in order, bodies intact.

Cases:
  leader    the leader cut off from the other two nodes, both ways (both
            sides keep running, the client reaches all three), then healed
  client    the client cut off from the leader only (it still reaches the
            replicas), then healed
  one-way   the leader's packets to the other two dropped, theirs to it
            delivered, then healed
  flapping  the leader (whichever node it is) cut off from everyone (the
            other nodes and the client) for FLAP_CUT s, healed for
            FLAP_HEAL s, for FLAP_FOR s

Each case notes, from the moment of the cut: when a node first reports
another leader, and the longest time without a confirm (the producer) and
without a record (the consumer). Runs in the client namespace, as
tests/test_partitions.py starts it::

    ip netns exec pystream-client .venv/bin/python -m tests.partitions leader --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np

import pystream

from . import netfault
from .soak import HEARTBEAT, Fault, Soak, SoakReport, _longest_gap, _Recoveries

CASES = ("leader", "client", "one-way", "flapping")
RATE = 2000          # messages per second (two shared cores, three nodes)
BEFORE = 5.0         # seconds of traffic before the cut
CUT = 25.0           # seconds a cut lasts: past net_ticktime (10 s) and an election
AFTER = 20.0         # seconds of traffic after the heal
FLAP_CUT, FLAP_HEAL, FLAP_FOR = 5.0, 5.0, 60.0
POLL = 0.25          # seconds between metadata queries of each node


@dataclass
class PartitionReport(SoakReport):
    case: str = ""
    broker: str = ""
    old_leader: str | None = None
    # Seconds from the (first) cut: until a node named another leader, and
    # the longest time without a confirm / a record received after it.
    new_leader_after: float | None = None
    new_leader: str | None = None
    producer_stall: float | None = None
    consumer_stall: float | None = None
    # Seconds from the (last) heal until the next confirm / record.
    producer_after_heal: float | None = None
    consumer_after_heal: float | None = None
    leaders: list[tuple[float, str, str | None]] = field(default_factory=list)
    # Sends whose futures failed: how many records, and the first errors.
    failed_records: int = 0
    publish_errors: list[str] = field(default_factory=list)
    # Per second since the start: confirms (callbacks) and batches received.
    timeline: list[tuple[int, int, int]] = field(default_factory=list)


class Partition(Soak):
    def __init__(self, case: str) -> None:
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}: one of {', '.join(CASES)}")
        faulting = FLAP_FOR if case == "flapping" else CUT
        super().__init__(BEFORE + faulting + AFTER, RATE, fault_every=faulting,
                         uri=netfault.uri("net1"))
        self.case = case
        self.stream = f"pystream-partition-{case}-{uuid.uuid4().hex[:8]}"
        self.leaders: list[tuple[float, str, str | None]] = []  # time, asked, leader
        self.polling = threading.Event()
        self.pollers: list[threading.Thread] = []
        self.failed_records = 0
        self.publish_errors: list[str] = []

    # --- who leads, as each node says --------------------------------------

    def poll(self, node: str) -> None:
        """Ask ``node`` for the stream's leader every POLL seconds; note each
        answer that differs from its last."""
        client = None
        last: str | None = "?"
        while self.polling.is_set():
            try:
                if client is None:
                    client = pystream.connect(netfault.uri(node), connect_timeout=1,
                                              request_timeout=1, heartbeat=HEARTBEAT)
                info = client.metadata(self.stream)[self.stream]
                leader = info.leader.host if info.leader else None
                leader = next((n for n, a in netfault.ADDRESS.items() if a == leader),
                              leader)
                if leader != last:
                    self.leaders.append((self.now(), node, leader))
                    last = leader
            except pystream.StreamError:
                if client is not None:
                    client.close()
                client = None
            time.sleep(POLL)
        if client is not None:
            client.close()

    def leader_now(self) -> str | None:
        """The leader the latest answer named."""
        named = [leader for _, _, leader in self.leaders if leader]
        return named[-1] if named else None

    def on_confirm(self, future, first: int, count: int) -> None:
        error = future.exception()
        if error is not None:
            self.failed_records += count
            if len(self.publish_errors) < 5:
                self.publish_errors.append(f"{self.now():.1f} s: {error!r}")
        super().on_confirm(future, first, count)

    # --- the faults ----------------------------------------------------------

    def inject(self, report: SoakReport) -> None:
        self.polling.set()
        for node in netfault.NODES:
            self.pollers.append(threading.Thread(target=self.poll, args=(node,),
                                                 daemon=True))
            self.pollers[-1].start()
        time.sleep(max(0.0, BEFORE - self.now()))
        leader = self.leader_now()
        assert isinstance(report, PartitionReport)
        report.old_leader = leader
        if leader is None:
            raise AssertionError("no node named the stream's leader before the cut")
        others = [n for n in netfault.NODES if n != leader]
        try:
            if self.case == "flapping":
                self.flap(report)
                return
            began = self.now()
            if self.case == "leader":
                netfault.cut(leader, *others)
            elif self.case == "client":
                netfault.cut("client", leader)
            else:
                netfault.cut(leader, *others, way="out")
            time.sleep(CUT)
            netfault.heal()
            report.faults.append(Fault(self.case, began, self.now() - began))
        finally:
            netfault.heal()

    def flap(self, report: SoakReport) -> None:
        end = self.now() + FLAP_FOR
        while self.now() + FLAP_CUT <= end:
            leader = self.leader_now() or "net1"
            began = self.now()
            netfault.isolate(leader)
            time.sleep(FLAP_CUT)
            netfault.heal()
            report.faults.append(Fault(f"cut {leader}", began, self.now() - began))
            time.sleep(FLAP_HEAL)

    # --- the run -------------------------------------------------------------

    def run(self) -> PartitionReport:  # type: ignore[override]
        report = PartitionReport(self.seconds, self.rate, case=self.case)
        netfault.heal()
        self.await_nodes()
        # The stream, its leader on net1 (client-local) and both replicas
        # up, before the soak's actors start.
        report.broker = self.create_stream()
        recoveries = _Recoveries(self)
        logging.getLogger("pystream").addHandler(recoveries)
        logging.getLogger("pystream").setLevel(logging.INFO)
        try:
            self._run(report)
        finally:
            logging.getLogger("pystream").removeHandler(recoveries)
            self.polling.clear()
            for poller in self.pollers:
                poller.join(timeout=10)
            netfault.heal()
        report.leaders = self.leaders
        report.failed_records = self.failed_records
        report.publish_errors = self.publish_errors
        seconds = int(max([self.seconds, *self.confirmed_at, *self.received_at])) + 1
        confirms = np.bincount(np.array(self.confirmed_at, int), minlength=seconds)
        received = np.bincount(np.array(self.received_at, int), minlength=seconds)
        report.timeline = [(t, int(confirms[t]), int(received[t])) for t in range(seconds)]
        return report

    def create_stream(self, wait: float = 180) -> str:
        """Create the stream through net1 and wait for its replicas; the
        broker's version. Tried again while net1 restarts (autoheal, after
        the last case's heal, may restart it even after it served)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                with pystream.connect(self.uri, connect_timeout=5) as admin:
                    admin.create_stream(self.stream, exist_ok=True)
                    self.await_replicas(admin)
                    return admin.server_properties.get("version", "?")
            except pystream.StreamError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)

    def await_nodes(self, wait: float = 180) -> None:
        """Until every node serves stream connections: the last case's heal
        may have one restart its app (autoheal)."""
        deadline = time.monotonic() + wait
        for node in netfault.NODES:
            while True:
                try:
                    with pystream.connect(netfault.uri(node), connect_timeout=5):
                        break
                except pystream.StreamError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)

    def await_replicas(self, admin: pystream.Client, wait: float = 60) -> None:
        """Until metadata names the leader and both replicas."""
        deadline = time.monotonic() + wait
        while True:
            info = admin.metadata(self.stream)[self.stream]
            if info.leader is not None and len(info.replicas) == 2:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"stream {self.stream}: {info} after {wait} s")
            time.sleep(0.5)

    def _delete_stream(self, options: dict) -> None:
        """From any node that answers: the heal may have the losing side
        (net1, often) restart its app just then (autoheal)."""
        deadline = time.monotonic() + 120
        while True:
            for node in netfault.NODES:
                try:
                    with pystream.connect(netfault.uri(node), **options) as admin:
                        admin.delete_stream(self.stream, missing_ok=True)
                    return
                except pystream.StreamError:
                    if time.monotonic() > deadline:
                        raise
            time.sleep(1)

    def _recovery_times(self, report: SoakReport) -> None:
        assert isinstance(report, PartitionReport)
        if not report.faults:
            return
        cut, last = report.faults[0], report.faults[-1]
        healed = last.at + last.took
        after = [(t, leader) for t, _, leader in self.leaders
                 if t >= cut.at and leader and leader != report.old_leader]
        if after:
            report.new_leader_after = after[0][0] - cut.at
            report.new_leader = after[0][1]
        # Up to the last event, the flush and the drain after the run included.
        end = float("inf")
        report.producer_stall = _longest_gap(self.confirmed_at, cut.at, end)
        report.consumer_stall = _longest_gap(self.received_at, cut.at, end)
        report.producer_after_heal = _first_after(self.confirmed_at, healed)
        report.consumer_after_heal = _first_after(self.received_at, healed)


def _first_after(times: list[float], start: float) -> float | None:
    later = [t for t in times if t >= start]
    return min(later) - start if later else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", choices=CASES)
    ap.add_argument("--json", help="write the report there")
    args = ap.parse_args(argv)
    # pystream's recoveries (and why they failed), on stderr, timed.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    report = Partition(args.case).run()
    print(report.summary())
    print(f"leader {report.old_leader} -> {report.new_leader} after "
          f"{report.new_leader_after} s; stalls: producer {report.producer_stall} s, "
          f"consumer {report.consumer_stall} s; after the heal: producer "
          f"{report.producer_after_heal} s, consumer {report.consumer_after_heal} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(report), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
