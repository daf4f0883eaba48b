"""A stream-protocol peer on loopback that misbehaves on purpose.

It speaks enough of the protocol for a real pystream consumer to connect,
locate a stream and subscribe (it announces RabbitMQ 3.10, so no command
version exchange and Deliver v1), then serves good chunks followed by one
fault. It is for the hostile-input tests only: every test of behaviour
against a broker uses the real ones of ``scripts/broker``.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

from pystream import protocol as P

from . import golden

OK = P.RESPONSE_OK
#: What the server does once a consumer subscribed: it gets the socket, the
#: Subscribe command and how many subscriptions it saw (1 for the first),
#: and sends what it likes.
Fault = Callable[[socket.socket, P.Subscribe, int], None]


def records_chunk(first: int, count: int, body: bytes = b"x" * 100) -> bytes:
    """A good chunk of ``count`` AMQP records from offset ``first``."""
    return golden.chunk([golden.simple_entry(golden.amqp_data(body))] * count,
                        first_offset=first)


class HostileServer:
    """Accepts any number of connections; each is answered by the script
    below until a consumer subscribes, then ``fault`` takes over: once the
    client grants its credit after subscribing, as a broker's deliveries
    would, or with ``eager``, right after the subscribe answer (a broker may
    deliver on the Subscribe's initial credit before the client's Credit
    arrives)."""

    def __init__(self, fault: Fault, *, frame_max: int = 1 << 20,
                 heartbeat: int = 60, eager: bool = False) -> None:
        self.fault = fault
        self.eager = eager
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{self.port}/"
        self.subscriptions = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        subscribed = None
        with conn:
            try:
                while True:
                    frame = _read_frame(conn)
                    if frame is None:
                        return
                    if struct.unpack_from(">H", frame)[0] & P.RESPONSE_BIT:
                        continue  # the client's Tune answer
                    cmd = P.decode(frame)
                    if isinstance(cmd, P.Subscribe):
                        if self.eager:  # the answer and the fault in one read
                            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
                        conn.sendall(P.encode(P.SubscribeResponse(cmd.correlation_id, OK)))
                        subscribed = cmd
                        if not self.eager:
                            continue
                    if subscribed is not None and (
                            self.eager or isinstance(cmd, P.Credit)):
                        self.subscriptions += 1
                        self.fault(conn, subscribed, self.subscriptions)
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
                        subscribed = None
                        continue
                    for answer in self._answer(cmd):
                        conn.sendall(P.encode(answer))
            except OSError:
                return

    def _answer(self, cmd: P.Command) -> list[P.Command]:
        corr = getattr(cmd, "correlation_id", 0)
        if isinstance(cmd, P.PeerProperties):
            return [P.PeerPropertiesResponse(corr, OK, {"product": "RabbitMQ",
                                                        "version": "3.10.0"})]
        if isinstance(cmd, P.SaslHandshake):
            return [P.SaslHandshakeResponse(corr, OK, ("PLAIN",))]
        if isinstance(cmd, P.SaslAuthenticate):
            return [P.SaslAuthenticateResponse(corr, OK),
                    P.Tune(self.frame_max, self.heartbeat)]
        if isinstance(cmd, P.Open):
            return [P.OpenResponse(corr, OK, {})]
        if isinstance(cmd, P.Metadata):
            broker = P.Broker(0, "127.0.0.1", self.port)
            return [P.MetadataResponse(corr, (broker,), tuple(
                P.StreamMetadata(s, OK, 0, ()) for s in cmd.streams))]
        if isinstance(cmd, P.Unsubscribe):
            return [P.UnsubscribeResponse(corr, OK)]
        if isinstance(cmd, P.Close):
            return [P.CloseResponse(corr, OK)]
        return []  # Credit, Heartbeat, StoreOffset: nothing to answer


def _read_frame(conn: socket.socket) -> bytes | None:
    head = _read_exactly(conn, 4)
    if head is None:
        return None
    return _read_exactly(conn, struct.unpack(">I", head)[0])


def _read_exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            return None
        data += part
    return data
