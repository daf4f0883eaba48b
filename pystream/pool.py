"""Connections to the broker nodes that serve streams.

Consumers (and producers) talk to the node that holds their stream's leader
or a replica, not necessarily the one the client first connected to. The
pool opens those connections, shares each between up to
``max_subscriptions`` subscriptions, and closes it when the last one leaves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .connection import Connection
from .uri import BrokerAddress


@dataclass(frozen=True)
class Endpoint:
    """A broker node's stream listener as metadata advertises it."""

    host: str
    port: int


AddressResolver = Callable[[Endpoint], Endpoint]
"""Maps the ``Endpoint`` metadata advertises to the one to dial (NAT,
containers, a load balancer in front of the nodes)."""

# Behind a load balancer a connection may land on another node than the one
# wanted; retry that many times before taking it anyway.
LOAD_BALANCER_ATTEMPTS = 5


class ConnectionPool:
    def __init__(self, address: BrokerAddress, options: dict[str, Any],
                 resolver: AddressResolver | None,
                 max_subscriptions: int = 255) -> None:
        self.address = address
        self.options = options
        self.resolver = resolver
        self.max_subscriptions = max_subscriptions
        self._lock = threading.Lock()
        self._connections: dict[Endpoint, list[Connection]] = {}
        self._users: dict[Connection, int] = {}

    def acquire(self, endpoint: Endpoint) -> Connection:
        """An open connection to ``endpoint`` with room for one more user;
        give it back with :meth:`release`."""
        with self._lock:
            for conn in self._connections.get(endpoint, []):
                if conn.is_open and self._users[conn] < self.max_subscriptions:
                    self._users[conn] += 1
                    return conn
        conn = self._open(endpoint)
        with self._lock:
            self._connections.setdefault(endpoint, []).append(conn)
            self._users[conn] = 1
        return conn

    def release(self, conn: Connection) -> None:
        with self._lock:
            users = self._users.get(conn, 1) - 1
            if users > 0:
                self._users[conn] = users
                return
            self._users.pop(conn, None)
            for conns in self._connections.values():
                if conn in conns:
                    conns.remove(conn)
        conn.close()

    def close(self) -> None:
        with self._lock:
            conns = list(self._users)
            self._users.clear()
            self._connections.clear()
        for conn in conns:
            conn.close()

    def address_of(self, endpoint: Endpoint) -> BrokerAddress:
        """The address to dial for an advertised endpoint."""
        target = self.resolver(endpoint) if self.resolver else endpoint
        return replace(self.address, host=target.host, port=target.port)

    def _open(self, endpoint: Endpoint) -> Connection:
        address = self.address_of(endpoint)
        attempts = 1
        while True:
            conn = Connection(address, **self.options)
            conn.open()
            props = conn.connection_properties
            landed = Endpoint(props.get("advertised_host", endpoint.host),
                              int(props.get("advertised_port", endpoint.port)))
            if landed == endpoint or attempts == LOAD_BALANCER_ATTEMPTS:
                return conn
            conn.close()
            attempts += 1
