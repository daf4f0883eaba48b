"""The test brokers' ports and addresses, read from scripts/brokers.tsv
(scripts/broker reads the same table): no test writes one of them itself."""

from __future__ import annotations

import pathlib
from typing import NamedTuple

TABLE = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "brokers.tsv"


class Node(NamedTuple):
    """One row of the table; a port is None where the table says "-"."""

    name: str
    suite: str | None
    host: str
    stream: int | None
    amqp: int | None
    management: int | None
    dist: int | None
    epmd: int | None
    stream_tls: int | None
    management_tls: int | None
    replication: range | None

    @property
    def advertised(self) -> str:
        """The host the node's stream listener advertises (and URIs name)."""
        return "localhost" if self.host == "127.0.0.1" else self.host

    def uri(self, credentials: str = "guest:guest@", host: str | None = None) -> str:
        return f"rabbitmq-stream://{credentials}{host or self.advertised}:{self.stream}/"

    def management_url(self) -> str:
        return f"http://{self.advertised}:{self.management}"


def _port(field: str) -> int | None:
    return None if field == "-" else int(field)


def _range(field: str) -> range | None:
    if field == "-":
        return None
    low, high = field.split("-")
    return range(int(low), int(high) + 1)


def _load() -> dict[str, Node]:
    nodes = {}
    for line in TABLE.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, suite, host, *ports, replication = line.split()
        nodes[name] = Node(name, None if suite == "-" else suite, host,
                           *(_port(p) for p in ports), _range(replication))
    return nodes


NODES = _load()
MODERN, LEGACY, LATEST = NODES["modern"], NODES["legacy"], NODES["latest"]
CLUSTER = tuple(NODES[f"cluster{i}"] for i in (1, 2, 3))
NETCLUSTER = tuple(NODES[f"net{i}"] for i in (1, 2, 3))
# Every port a node on the host's loopback listens on for clients (stream,
# TLS, AMQP, management).
LOOPBACK_PORTS = frozenset(
    port for node in NODES.values() if node.host == "127.0.0.1"
    for port in (node.stream, node.stream_tls, node.amqp, node.management,
                 node.management_tls)
    if port is not None)
