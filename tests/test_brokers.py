"""The test brokers are safe on a developer's machine: nothing that
scripts/broker starts listens beyond the loopback interface.

Checked with `ss` for every process of every node the script started
(beam.smp, epmd, erl_child_setup, inet_gethost...), and for a rabbitmqctl
while it runs. The cluster's nodes are checked when they are up (the
cluster test starts them; this test does not, as a cluster takes a minute
to form); their stream replication listeners are the exception: a replica
listens for its leader on every interface until the leader connects, a
moment later, and RabbitMQ (osiris) has no setting to bind it over TCP.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import time

import pytest

from . import brokers
from .conftest import BROKER_SCRIPT, BROKERS, CACHE, ROOT

pytestmark = pytest.mark.broker

LOOPBACK = ("127.0.0.1", "[::1]", "::1")
DEFAULT_URIS = {name: brokers.NODES[name].uri() for name in BROKERS}
PORTS = {name: (node.stream, node.amqp, node.management, node.dist, node.epmd)
         for name, node in brokers.NODES.items() if name in BROKERS}


def test_the_docs_table_has_the_ports_of_brokers_tsv():
    rows = {}
    for line in (ROOT / "docs" / "brokers.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] in BROKERS:
            rows[cells[0]] = tuple(int(cell) for cell in cells[3:8])
    assert rows == PORTS


def pid_of(name: str, kind: str) -> int | None:
    """The live process a `NAME/KIND.pid` file of scripts/broker names."""
    try:
        pid, start = (CACHE / name / f"{kind}.pid").read_text().split()
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return int(pid) if stat.rsplit(")", 1)[1].split()[19] == start else None


def children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def descendants(roots: list[int]) -> set[int]:
    tree, found, todo = children(), set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += tree.get(pid, [])
    return found


def listeners(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, line) of each TCP or UDP socket a process in ``pids``
    listens on."""
    out = subprocess.run(["ss", "-ltunpH"], check=True, capture_output=True,
                         text=True).stdout
    found = []
    for line in out.splitlines():
        if not pids & {int(p) for p in re.findall(r"pid=(\d+)", line)}:
            continue
        address, port = line.split()[4].rsplit(":", 1)
        found.append((address, int(port), line))
    return found


def started_nodes() -> dict[str, list[int]]:
    """The nodes scripts/broker started that run, with their epmd."""
    nodes = {}
    for name in [*BROKERS, "cluster1", "cluster2", "cluster3"]:
        node = pid_of(name, "node")
        if node is not None:
            epmd = pid_of("cluster" if name.startswith("cluster") else name, "epmd")
            nodes[name] = [node] + ([epmd] if epmd else [])
    return nodes


def test_every_listener_of_the_brokers_is_on_loopback():
    if {name for name, uri in BROKERS.items() if uri != DEFAULT_URIS[name]}:
        pytest.skip("PYSTREAM_TEST_*URI names brokers scripts/broker did not start")
    nodes = started_nodes()
    missing = set(BROKERS) - set(nodes)
    if missing:
        pytest.fail(f"not started by scripts/broker: {sorted(missing)} "
                    f"(run scripts/broker up)")
    wide = []
    for name, roots in nodes.items():
        found = listeners(descendants(roots))
        print(f"{name}:", *(line for _, _, line in found), sep="\n  ")
        for address, port, line in found:
            # A cluster node's stream replication listeners (its range in
            # scripts/brokers.tsv) cannot be bound to one address.
            replication = port in (brokers.NODES[name].replication or ())
            if address not in LOOPBACK and not replication:
                wide.append(f"{name}: {line}")
        if name in PORTS:
            bound = {port for address, port, _ in found if address == "127.0.0.1"}
            epmd = brokers.NODES[name].epmd
            if epmd not in bound and held_on_loopback_only(epmd):
                # An epmd the node found running (scripts/broker uses one
                # that listens on its port already): not the node's to
                # bind, but on loopback all the same.
                bound.add(epmd)
            assert set(PORTS[name]) <= bound, (name, sorted(bound))
    assert not lasting(wide, pids=set().union(*map(descendants, nodes.values()))), \
        "listening beyond loopback:\n" + "\n".join(wide)


def held_on_loopback_only(port: int) -> bool:
    """Whether some process listens on TCP ``port``, on loopback only."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], check=True,
                         capture_output=True, text=True).stdout
    lines = out.splitlines()
    print(f"port {port}:", *lines, sep="\n  ")
    return bool(lines) and all(line.split()[3].rsplit(":", 1)[0] in LOOPBACK
                               for line in lines)


def lasting(wide: list[str], pids: set[int]) -> list[str]:
    """The sockets of ``wide`` still open in every snapshot for 20 s.

    Erlang opens a UDP socket on 0.0.0.0, port 0, for each host query it
    makes through the kernel (inet:gethostname/0, which RabbitMQ 3.10 calls
    for every stream connection; inet:getifaddrs/0), and closes it when the
    query returns. A snapshot can catch one, and on a loaded machine one was
    seen to live for more than a second (6 s on a node booting under
    strace). A listener stays for as long as the node runs.
    """
    deadline = time.monotonic() + 20
    while wide and time.monotonic() < deadline:
        time.sleep(0.5)
        now = {line for _, _, line in listeners(pids)}
        gone = [entry for entry in wide if entry.split(": ", 1)[1] not in now]
        if gone:
            print("closed again (a query's socket):", *gone, sep="\n  ")
        wide = [entry for entry in wide if entry not in gone]
    return wide


def test_rabbitmqctl_listens_on_loopback_only():
    """The CLI tools are an Erlang node too, with a distribution listener
    (35672-35682) of their own while they run."""
    ctl = subprocess.Popen([str(BROKER_SCRIPT), "ctl", "latest", "eval",
                            "timer:sleep(6000)."], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        found: list[tuple[str, int, str]] = []
        while not found and ctl.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            found = [f for f in listeners(descendants([ctl.pid]))
                     if 35672 <= f[1] <= 35682]
        print(*(line for _, _, line in found), sep="\n", file=sys.stderr)
        assert found, "rabbitmqctl never listened"
        assert all(address in LOOPBACK for address, _, _ in found), found
    finally:
        ctl.wait(timeout=60)
