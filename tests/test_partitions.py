"""True network partitions of a three-node RabbitMQ 4.0 cluster (`scripts/broker
up netcluster`: each node in its own network namespace), cut by
tests/netfault.py while the soak's named producer and consumer run in the
client namespace (tests/partitions.py has the cases). Every confirmed
record must be read exactly once and in order, and both must be moving again
after the heal.

With PYSTREAM_PARTITION_RESULTS=PATH (``make partitions`` sets it) the
figures are stored there, for bench/report.py's table in the README's
"Reliability" section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tools import results

from . import netfault
from .conftest import ROOT, run_broker
from .partitions import CASES

pytestmark = [pytest.mark.broker, pytest.mark.slow]

RECOVERY = 60.0    # seconds after the heal within which both must move again
CASE_TIMEOUT = 400  # seconds for one case's process, checker included
RESULTS: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def netcluster() -> Iterator[None]:
    """The netcluster for this module only: three Erlang nodes on two shared
    cores, and namespaces nothing else needs."""
    machine = results.machine(None)  # the load at the start
    try:
        run_broker("up", "netcluster")
        yield
    finally:
        run_broker("down", "netcluster")
    store_results(machine)


def run_case(case: str, tmp_path) -> dict[str, Any]:
    out = tmp_path / f"{case}.json"
    done = subprocess.run(
        ["ip", "netns", "exec", netfault.namespace("client"), sys.executable, "-m",
         "tests.partitions", case, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=CASE_TIMEOUT, check=False)
    print(done.stdout)
    print(done.stderr[-20000:])
    assert done.returncode == 0, f"{case}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", CASES)
def test_every_confirmed_record_read_once_in_order_across_a_partition(
        netcluster, case, tmp_path):
    r = run_case(case, tmp_path)
    RESULTS[case] = r
    assert r["faults"], r
    assert r["published"] > 0.8 * r["seconds"] * r["rate"]
    assert r["confirmed"] == r["published"]
    assert (r["lost"], r["duplicates"], r["out_of_order"]) == (0, 0, 0)
    assert r["body_mismatches"] == 0
    assert r["consumed"] == r["published"]
    assert (r["first_offset"], r["last_offset"]) == (0, r["published"] - 1)
    assert r["crc32_consumed"] == r["crc32_expected"]
    assert r["producer_after_heal"] is not None and r["producer_after_heal"] < RECOVERY
    assert r["consumer_after_heal"] is not None and r["consumer_after_heal"] < RECOVERY
    if case in ("leader", "one-way"):
        # The majority elects another leader while the old one is cut off.
        assert r["new_leader"] not in (None, r["old_leader"]), r["leaders"]


def store_results(info: dict[str, Any]) -> None:
    """The figures, into PYSTREAM_PARTITION_RESULTS (make partitions:
    bench/results/partitions.json) when every case ran, through the
    harness's writer."""
    path = os.environ.get("PYSTREAM_PARTITION_RESULTS")
    if not path or set(RESULTS) != set(CASES):
        return
    info["broker"] = RESULTS[CASES[0]]["broker"]
    info["broker_address"] = "netcluster (3 nodes, network namespaces)"
    keep = ("seconds", "rate", "published", "confirmed", "consumed", "lost",
            "duplicates", "out_of_order", "body_mismatches", "old_leader",
            "new_leader", "new_leader_after", "producer_stall", "consumer_stall",
            "producer_after_heal", "consumer_after_heal", "faults")
    results.write_results(path, info, {"cases": {
        case: {k: RESULTS[case].get(k) for k in keep} for case in CASES}})


def test_netfault_cuts_one_way_both_ways_and_heals(netcluster):
    """The fault tool itself: a cut drops what it says, and heal restores it."""
    try:
        assert netfault.reachable("client", "net1")
        netfault.cut("net1", "net2", "client")
        assert not netfault.reachable("client", "net1")
        assert not netfault.reachable("net2", "net1")
        assert netfault.reachable("net3", "net1")
        netfault.heal()
        # One way: net1's packets to the client dropped, the client's arrive
        # (a connection still fails: the answer is lost).
        netfault.cut("net1", "client", way="out")
        assert f"ip daddr {netfault.ADDRESS['client']} drop" in netfault.show("net1")
        assert not netfault.reachable("client", "net1")
        netfault.heal()
        netfault.rate("net1", "10mbit")
        assert "tbf" in netfault.show("net1")
    finally:
        netfault.heal()
    assert "tbf" not in netfault.show("net1")
    assert netfault.reachable("client", "net1")
