"""A connection's opening handshake: peer properties, SASL, Tune, Open and
(3.11+) the command versions."""

from __future__ import annotations

import platform
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from . import protocol as P
from .errors import (
    ConnectionLost,
    RequestTimeout,
    SaslMechanismNotSupported,
)
from .features import Features

if TYPE_CHECKING:
    from .connection import Connection

# Command versions this client speaks, announced to 3.11+ brokers.
CLIENT_COMMAND_VERSIONS = (
    P.CommandVersion(P.Publish.KEY, 1, 2),
    P.CommandVersion(P.Deliver.KEY, 1, 2),
)

# RabbitMQ 4.3 closes the socket, unanswered, on a frame over 8192 bytes
# before the connection is open (its stream.initial_frame_max default).
PRE_OPEN_FRAME_MAX = 8192


def negotiate(client: int, server: int) -> int:
    """Tune negotiation: 0 means no limit on either side; else the minimum."""
    if client == 0 or server == 0:
        return max(client, server)
    return min(client, server)


def handshake(conn: Connection) -> None:
    """Run the handshake on ``conn``, whose reader thread is running."""
    from . import __version__  # pystream/__init__ imports this module
    timeout = conn.connect_timeout
    props = {"product": "pystream", "version": __version__,
             "platform": f"Python {platform.python_version()}",
             "information": "pystream: RabbitMQ streams to Arrow"}
    if conn.connection_name:
        props["connection_name"] = conn.connection_name
    peer = conn.query(P.PeerPropertiesResponse, lambda c: P.PeerProperties(c, props),
                      "peer properties", timeout=timeout)
    conn.server_properties = dict(peer.properties)
    conn.features = Features(conn.server_properties.get("version", "0"))

    mechanisms = conn.query(P.SaslHandshakeResponse, P.SaslHandshake, "SASL handshake",
                            timeout=timeout).mechanisms
    if conn.sasl_mechanism not in mechanisms:
        raise SaslMechanismNotSupported(
            f"SASL mechanism {conn.sasl_mechanism} is not offered by the "
            f"broker (it offers {', '.join(mechanisms)})", code=0x07)
    if conn.sasl_mechanism == "PLAIN":
        data = (b"\0" + conn.address.username.encode() + b"\0"
                + conn.address.password.encode())
        context = f"authenticate user {conn.address.username!r} with PLAIN"
    elif conn.sasl_mechanism == "EXTERNAL":
        data = b""
        # The URI's user plays no part: the broker takes the name from
        # the TLS client certificate.
        context = ("authenticate with EXTERNAL as the TLS client "
                   "certificate's name (was one loaded in ssl_context?)")
    else:
        data = b""
        context = f"authenticate with {conn.sasl_mechanism}"
    try:
        conn.request(
            lambda c: P.SaslAuthenticate(c, conn.sasl_mechanism, data),
            context, timeout=timeout)
    except ConnectionLost as exc:
        # Key, version, correlation id and the two length prefixes.
        size = 14 + len(conn.sasl_mechanism) + len(data)
        if size <= PRE_OPEN_FRAME_MAX:
            raise
        raise ConnectionLost(
            f"{context}: the broker closed the connection; the "
            f"SaslAuthenticate frame ({size} bytes: a long password or "
            f"token?) is over the {PRE_OPEN_FRAME_MAX} bytes RabbitMQ "
            f"4.3+ accepts before a connection is open "
            f"(stream.initial_frame_max)") from exc

    try:
        tune = conn._tune.result(timeout)
    except FutureTimeout:
        raise RequestTimeout("the broker sent no Tune after "
                             "authentication") from None
    conn.frame_max = negotiate(conn.requested_frame_max, tune.frame_max)
    conn.heartbeat = negotiate(conn.requested_heartbeat, tune.heartbeat)
    conn._reader.max_frame_size = conn.frame_max
    conn.send(P.TuneResponse(conn.frame_max, conn.heartbeat))

    opened = conn.query(
        P.OpenResponse, lambda c: P.Open(c, conn.address.virtual_host),
        f"open virtual host {conn.address.virtual_host!r}", timeout=timeout)
    conn.connection_properties = dict(opened.properties)

    if conn.features.supports("exchange_command_versions"):
        answer = conn.query(
            P.ExchangeCommandVersionsResponse,
            lambda c: P.ExchangeCommandVersions(c, CLIENT_COMMAND_VERSIONS),
            "exchange command versions", timeout=timeout)
        conn.command_versions = {
            v.key: (v.min_version, v.max_version) for v in answer.commands}
        conn.features = Features(conn.features.server_version,
                                 conn.command_versions)
