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


class _Anonymous:
    """A holder of a connection that did not name itself."""


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
        # Who holds each connection: one list operation takes or gives
        # back a hold, so an interrupt lands before or after it, never
        # halfway; a named holder's give-back is done at most once.
        self._holders: dict[Connection, list[object]] = {}

    def holders(self) -> dict[Connection, int]:
        """How many hold each connection of the pool."""
        with self._lock:
            return {c: len(h) for c, h in self._holders.items()}

    def acquire(self, endpoint: Endpoint, holder: object = None) -> Connection:
        """An open connection to ``endpoint`` with room for one more user;
        give it back with :meth:`release` (``holder``: with the same)."""
        holder = _Anonymous() if holder is None else holder
        # What this call took, noted before it is taken: an interrupt (a
        # KeyboardInterrupt the application catches) that lands anywhere
        # in here gives it back, and a caller it kept from learning of a
        # hold does not keep it for good.
        taken: list[Connection] = []
        opened: list[Connection] = []
        try:
            with self._lock:
                for conn in self._connections.get(endpoint, []):
                    holders = self._holders[conn]
                    if conn.is_open and len(holders) < self.max_subscriptions:
                        taken.append(conn)
                        holders.append(holder)
                        return conn
            conn = self._open(endpoint, opened)
            with self._lock:
                taken.append(conn)
                self._holders[conn] = [holder]
                self._connections.setdefault(endpoint, []).append(conn)
            return conn
        except BaseException:
            for conn in taken:
                self.release(conn, holder)  # closed, if it was the last hold
            for conn in opened:
                with self._lock:
                    listed = conn in self._holders
                if not listed:  # opened here and never handed out
                    conn.close()
            raise

    def release(self, conn: Connection, holder: object = None) -> None:
        """Give back a hold on ``conn``: one of an unnamed holder's, or
        ``holder``'s if it has one (else nothing: a give-back repeated
        after an interrupt). The last one closes it."""
        with self._lock:
            holders = self._holders.get(conn)
            if holders is not None:
                if holder is None:
                    # A loop, not next() over a generator, whose finalizer
                    # would print and drop an interrupt landing in it.
                    for h in holders:
                        if isinstance(h, _Anonymous):
                            holder = h
                            break
                if holder in holders:
                    holders.remove(holder)
        self._close_unheld()

    def release_all(self, holder: object) -> None:
        """Give back every hold ``holder`` has, as many times as it is asked."""
        with self._lock:
            held = [c for c, h in self._holders.items() if holder in h]
        for conn in held:
            self.release(conn, holder)
        self._close_unheld()

    def _close_unheld(self) -> None:
        """Close the connections nobody holds. They stay listed, with no
        holder, until closed: the next give-back closes one that an
        interrupt kept from it."""
        with self._lock:
            unheld = [c for c, h in self._holders.items() if not h]
            for conn in unheld:
                for conns in self._connections.values():
                    if conn in conns:
                        conns.remove(conn)  # handed out no more
        for conn in unheld:
            conn.close()
        with self._lock:
            for conn in unheld:
                if not self._holders.get(conn, True):
                    del self._holders[conn]

    def close(self) -> None:
        with self._lock:
            conns = list(self._holders)
            self._holders.clear()
            self._connections.clear()
        for conn in conns:
            conn.close()

    def address_of(self, endpoint: Endpoint) -> BrokerAddress:
        """The address to dial for an advertised endpoint."""
        target = self.resolver(endpoint) if self.resolver else endpoint
        return replace(self.address, host=target.host, port=target.port)

    def _open(self, endpoint: Endpoint, opened: list[Connection]) -> Connection:
        """A new connection to ``endpoint``, noted in ``opened`` (with any
        it closed on the way) before it is opened."""
        address = self.address_of(endpoint)
        attempts = 1
        while True:
            conn = Connection(address, **self.options)
            opened.append(conn)
            conn.open()
            props = conn.connection_properties
            landed = Endpoint(props.get("advertised_host", endpoint.host),
                              int(props.get("advertised_port", endpoint.port)))
            if landed == endpoint or attempts == LOAD_BALANCER_ATTEMPTS:
                return conn
            conn.close()
            attempts += 1
