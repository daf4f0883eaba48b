"""How many records a stream holds, found without pystream's consumer
(the benchmarks check what they published with it): ``WireClient`` is a
blocking socket with the handshake (PeerProperties, SASL PLAIN, Tune, Open)
and request/response for a few commands, from the frame layouts of
``pystream.protocol``; ``stream_end`` subscribes at "last" and reads the
last chunk's header. The wire limits themselves are C (``wire/wire.c``).
"""

from __future__ import annotations

import socket
import struct

from pystream import protocol as P
from pystream.uri import parse_uri

CHUNK_HEAD = struct.Struct(">BBHIq")  # magic, type, entries, records, timestamp
CHUNK_FIRST_OFFSET = struct.Struct(">Q")

KEY_DELIVER = P.Deliver.KEY
KEY_CLOSE = P.Close.KEY


class WireError(RuntimeError):
    pass


class WireClient:
    """A blocking connection that speaks just enough of the protocol."""

    def __init__(self, uri: str, *, heartbeat: int = 0,
                 timeout: float = 10.0, buffer_size: int = 1 << 20) -> None:
        self.address = parse_uri(uri)
        if self.address.tls:
            raise WireError("the wire client does not do TLS")
        self.sock = socket.create_connection(
            (self.address.host, self.address.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(buffer_size)
        self.start = self.end = 0  # unread bytes are buf[start:end]
        self.corr = 0
        self.server_properties: dict[str, str] = {}
        self.frame_max = 0
        self._handshake(heartbeat)

    # --- blocking frame I/O (handshake and requests only) ---------------------

    def _fill(self, need: int) -> None:
        """Make buf[start:end] hold at least ``need`` bytes."""
        while self.end - self.start < need:
            if self.start + need > len(self.buf):
                if need > len(self.buf):
                    self.buf.extend(bytes(need - len(self.buf)))
                n = self.end - self.start
                self.buf[:n] = self.buf[self.start:self.end]
                self.start, self.end = 0, n
            got = self.sock.recv_into(memoryview(self.buf)[self.end:])
            if not got:
                raise WireError("the broker closed the socket")
            self.end += got

    def read_frame(self) -> bytes:
        """The next frame, without its size prefix."""
        self._fill(4)
        (size,) = struct.unpack_from(">I", self.buf, self.start)
        self._fill(4 + size)
        frame = bytes(self.buf[self.start + 4:self.start + 4 + size])
        self.start += 4 + size
        return frame

    def send(self, cmd: P.Command) -> None:
        self.sock.sendall(P.encode(cmd))

    def request(self, make) -> P.Command:
        self.corr += 1
        cmd = make(self.corr)
        self.send(cmd)
        want = cmd.KEY | P.RESPONSE_BIT
        while True:
            frame = self.read_frame()
            key = struct.unpack_from(">H", frame)[0]
            if key == want:
                answer = P.decode(frame)
                if answer.response_code != P.RESPONSE_OK:
                    raise WireError(f"{type(cmd).__name__}: response code "
                                    f"{answer.response_code:#x}")
                return answer
            if key == P.Tune.KEY:
                self._tune = P.decode(frame)
            elif key == KEY_CLOSE:
                raise WireError(f"broker closed: {P.decode(frame)}")
            # anything else (heartbeats, metadata updates) is ignored

    def _handshake(self, heartbeat: int) -> None:
        self._tune = None
        props = {"product": "pystream-bench-wire", "version": "0",
                 "platform": "Python"}
        peer = self.request(lambda c: P.PeerProperties(c, props))
        self.server_properties = dict(peer.properties)
        self.request(P.SaslHandshake)
        a = self.address
        data = b"\0" + a.username.encode() + b"\0" + a.password.encode()
        self.request(lambda c: P.SaslAuthenticate(c, "PLAIN", data))
        while self._tune is None:
            frame = self.read_frame()
            if struct.unpack_from(">H", frame)[0] == P.Tune.KEY:
                self._tune = P.decode(frame)
        self.frame_max = self._tune.frame_max
        self.send(P.TuneResponse(self.frame_max, heartbeat))
        self.request(lambda c: P.Open(c, a.virtual_host))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the stream's end -----------------------------------------------------------


def stream_end(uri: str, stream: str, timeout: float = 3.0) -> int:
    """The offset after the last record of ``stream`` (0 when it is empty):
    subscribe at "last", which delivers the last chunk, and read its header."""
    with WireClient(uri) as c:
        c.request(lambda corr: P.Subscribe(corr, 1, stream,
                                           P.OffsetSpec(P.OFFSET_LAST), 1))
        c.sock.settimeout(timeout)
        try:
            while True:
                frame = c.read_frame()
                key, version = struct.unpack_from(">HH", frame)
                if key != KEY_DELIVER:
                    continue
                head = 5 + (8 if version >= 2 else 0)
                magic, ctype, _, records, _ = CHUNK_HEAD.unpack_from(frame, head)
                (first,) = CHUNK_FIRST_OFFSET.unpack_from(frame, head + 24)
                return first + records
        except (socket.timeout, TimeoutError):
            return 0  # nothing delivered: an empty stream
