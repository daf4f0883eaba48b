"""Opening a connection: peer properties, SASL, Tune, Open and the command
versions, in the order the broker expects them.

It speaks through the connection's request/response methods (``Requester``)
and returns what was negotiated; the connection keeps the socket, the
reader and the frame routing.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from . import protocol as P
from ._version import __version__
from .errors import ConnectionLost, RequestTimeout, SaslMechanismNotSupported
from .features import Features
from .uri import BrokerAddress

_Answer = TypeVar("_Answer", bound=P.Command)

# Command versions this client speaks, announced to 3.11+ brokers.
CLIENT_COMMAND_VERSIONS = (
    P.CommandVersion(P.Publish.KEY, 1, 2),
    P.CommandVersion(P.Deliver.KEY, 1, 2),
)

# RabbitMQ 4.3 closes the socket, unanswered, on a frame over 8192 bytes
# before the connection is open (its stream.initial_frame_max default).
PRE_OPEN_FRAME_MAX = 8192


class Requester(Protocol):
    """The connection's side of the handshake."""

    def send(self, cmd: P.Command) -> None: ...

    def request(self, make: Callable[[int], P.Request], context: str, *,
                timeout: float | None = None) -> P.Command: ...

    def query(self, answer: type[_Answer], make: Callable[[int], P.Request], context: str,
              *, timeout: float | None = None) -> _Answer: ...


@dataclass
class Negotiated:
    """What the broker told the client while opening."""

    server_properties: dict[str, str]
    features: Features
    frame_max: int
    heartbeat: int
    connection_properties: dict[str, str] = field(default_factory=dict)
    command_versions: dict[int, tuple[int, int]] = field(default_factory=dict)


def negotiate(client: int, server: int) -> int:
    """Tune negotiation: 0 means no limit on either side; else the minimum."""
    if client == 0 or server == 0:
        return max(client, server)
    return min(client, server)


def handshake(conn: Requester, address: BrokerAddress, tune: Future[P.Tune], *,
              sasl_mechanism: str, connection_name: str | None, frame_max: int,
              heartbeat: int, timeout: float,
              on_tuned: Callable[[int], None]) -> Negotiated:
    """Open the connection; ``tune`` is the broker's Tune (the connection's
    reader resolves it), ``on_tuned(frame_max)`` runs before the answer to
    it goes out."""
    props = {"product": "pystream", "version": __version__,
             "platform": f"Python {platform.python_version()}",
             "information": "pystream: RabbitMQ streams to Arrow"}
    if connection_name:
        props["connection_name"] = connection_name
    peer = conn.query(P.PeerPropertiesResponse, lambda c: P.PeerProperties(c, props),
                      "peer properties", timeout=timeout)
    server_properties = dict(peer.properties)
    features = Features(server_properties.get("version", "0"))

    mechanisms = conn.query(P.SaslHandshakeResponse, P.SaslHandshake, "SASL handshake",
                            timeout=timeout).mechanisms
    if sasl_mechanism not in mechanisms:
        raise SaslMechanismNotSupported(
            f"SASL mechanism {sasl_mechanism} is not offered by the "
            f"broker (it offers {', '.join(mechanisms)})", code=0x07)
    _authenticate(conn, address, sasl_mechanism, timeout)

    try:
        tuned = tune.result(timeout)
    except FutureTimeout:
        raise RequestTimeout("the broker sent no Tune after "
                             "authentication") from None
    out = Negotiated(server_properties, features,
                     negotiate(frame_max, tuned.frame_max),
                     negotiate(heartbeat, tuned.heartbeat))
    on_tuned(out.frame_max)
    conn.send(P.TuneResponse(out.frame_max, out.heartbeat))

    opened = conn.query(
        P.OpenResponse, lambda c: P.Open(c, address.virtual_host),
        f"open virtual host {address.virtual_host!r}", timeout=timeout)
    out.connection_properties = dict(opened.properties)

    if features.supports("exchange_command_versions"):
        answer = conn.query(
            P.ExchangeCommandVersionsResponse,
            lambda c: P.ExchangeCommandVersions(c, CLIENT_COMMAND_VERSIONS),
            "exchange command versions", timeout=timeout)
        out.command_versions = {
            v.key: (v.min_version, v.max_version) for v in answer.commands}
        out.features = Features(features.server_version, out.command_versions)
    return out


def _authenticate(conn: Requester, address: BrokerAddress, mechanism: str,
                  timeout: float) -> None:
    if mechanism == "PLAIN":
        data = b"\0" + address.username.encode() + b"\0" + address.password.encode()
        context = f"authenticate user {address.username!r} with PLAIN"
    elif mechanism == "EXTERNAL":
        data = b""
        # The URI's user plays no part: the broker takes the name from
        # the TLS client certificate.
        context = ("authenticate with EXTERNAL as the TLS client "
                   "certificate's name (was one loaded in ssl_context?)")
    else:
        data = b""
        context = f"authenticate with {mechanism}"
    try:
        conn.request(lambda c: P.SaslAuthenticate(c, mechanism, data),
                     context, timeout=timeout)
    except ConnectionLost as exc:
        # Key, version, correlation id and the two length prefixes.
        size = 14 + len(mechanism) + len(data)
        if size <= PRE_OPEN_FRAME_MAX:
            raise
        raise ConnectionLost(
            f"{context}: the broker closed the connection; the "
            f"SaslAuthenticate frame ({size} bytes: a long password or "
            f"token?) is over the {PRE_OPEN_FRAME_MAX} bytes RabbitMQ "
            f"4.3+ accepts before a connection is open "
            f"(stream.initial_frame_max)") from exc
