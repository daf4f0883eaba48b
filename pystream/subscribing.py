"""Making and undoing a consumer's subscriptions on the broker: where a
stream's subscription starts, the node and pooled connection it goes to,
the Subscribe command with its credit, and the Unsubscribe.

``subscription.Subscriptions`` holds one ``Subscribing`` and calls it from
the application's thread (the first subscriptions, ``close``) and from its
maintenance thread (recovery); a subscription's state changes under the
lock of the ``Subscriptions`` that owns it, passed in here.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from . import protocol as P
from .credit import subscribe_credit
from .errors import ConnectionLost, NoOffset, StreamError
from .records import Filter
from .stream_subscription import Subscription

if TYPE_CHECKING:
    from .admin import Admin


class Subscribing:
    """The broker's side of subscribing for one consumer: its name, single
    active consumer and super stream, filter and decoding options, through
    ``client``'s pool; ``lock`` is the one its subscriptions' state changes
    under."""

    def __init__(self, client: Admin, lock: threading.RLock, *, name: str | None,
                 single_active: bool, super_stream: str | None,
                 filter: Filter | None, decode_options: dict[str, Any]) -> None:
        self.client = client
        self._lock = lock
        self.name = name
        self.single_active = single_active
        self.super_stream = super_stream
        self.filter = filter
        self._decode_options = decode_options

    def pinned(self, stream: str, start: P.OffsetSpec) -> P.OffsetSpec:
        """``"next"`` and ``"last"`` as the offset they stand for now, where
        the broker says (RabbitMQ 4.3+): a subscription that breaks before
        its first chunk then starts again there, not at a later end of the
        stream, which would skip what was stored while it was away. A
        single active consumer starts where it is activated, not here."""
        name = {P.OFFSET_NEXT: "next", P.OFFSET_LAST: "last"}.get(start.type)
        if (name is None or self.single_active
                or not self.client.supports("resolve_offset_spec")):
            return start
        try:
            offset = self.client.resolve_offset(stream, name, filter=self.filter)
        except NoOffset:
            return start
        return P.OffsetSpec(P.OFFSET_OFFSET, offset)

    def subscribe(self, sub: Subscription) -> P.OffsetSpec:
        """Subscribe ``sub`` on a connection to a node holding its stream;
        where it subscribed."""
        with self._lock:
            spec, rewinds = sub.resume_spec(), sub.rewinds
        endpoint = self.client.locate(sub.stream)
        conn = self.client.pool.acquire(endpoint, sub)
        try:
            start_offset = spec.value if spec.type == P.OFFSET_OFFSET else 0
            sub_id = conn.add_subscription(sub, start_offset=start_offset,
                                           **self._decode_options)
        except BaseException:
            self.client.pool.release(conn, sub)
            raise
        with self._lock:
            stale = sub.rewinds != rewinds
            if not stale:
                sub.connection, sub.subscription_id = conn, sub_id
                sub.live = True
                now, after = subscribe_credit(sub.credit.start())
        if stale:  # rewound meanwhile (_rewind): the next attempt starts there
            conn.remove_subscription(sub_id, sub)
            self.client.pool.release(conn, sub)
            raise ConnectionLost(f"{sub.stream!r} was rewound while resubscribing")
        try:
            conn.request(lambda c: P.Subscribe(c, sub_id, sub.stream, spec,
                                               now, self._properties()),
                         f"subscribe to {sub.stream!r}")
        except BaseException:
            with self._lock:
                sub.live = False
            conn.remove_subscription(sub_id, sub)
            self.client.pool.release(conn, sub)
            sub.connection = None
            raise
        sub.stats.credit_granted += now
        if after:
            try:
                conn.send(P.Credit(sub_id, after))
                sub.stats.credit_granted += after
            except StreamError:
                # Deliveries on the initial credit may already have broken
                # the connection: ``sub`` heard of it, and recovers or ends
                # after handing over what it read.
                pass
        return spec

    def _properties(self) -> dict[str, str]:
        props: dict[str, str] = {}
        if self.name is not None:
            props["name"] = self.name
        if self.single_active:
            props["single-active-consumer"] = "true"
            if self.super_stream is not None:
                props["super-stream"] = self.super_stream
        if self.filter is not None:
            props.update(self.filter.properties())
        return props

    def unsubscribe(self, sub: Subscription) -> None:
        """Unsubscribe ``sub``, free its id and give its connection back.
        Each step is done once however often this is called: one an
        interrupt stopped (``close`` in the application's thread) is
        finished by the next call."""
        conn, sid = sub.connection, sub.subscription_id
        if conn is not None:
            if conn.is_open and conn.has_subscription(sid, sub):
                try:
                    conn.request(lambda c: P.Unsubscribe(c, sid),
                                 f"unsubscribe from {sub.stream!r}", timeout=5.0)
                except StreamError:
                    pass  # going anyway
            conn.remove_subscription(sid, sub)
            with self._lock:
                if sub.connection is conn:
                    sub.connection = None
        self.client.pool.release_all(sub)
