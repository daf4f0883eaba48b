"""A TCP proxy in front of a test broker that pauses it while it owes a
subscription its chunks: the window a planning probe once took silence in,
too short to hit with a pause alone."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pystream
from pystream.pool import Endpoint

from .conftest import BROKERS, run_broker

HOLD = 3.0  # seconds the broker stays paused: past the 1 s a probe once waited


class HoldingProxy:
    """A TCP proxy in front of a test broker that, at the first Deliver
    frame it sees, pauses the broker and holds that connection's frames
    from it for ``HOLD`` seconds, then resumes it and passes them on: a
    broker that answered a Subscribe and is paused before it sent the
    chunks it owes (a window too short to hit with a pause alone).
    Requests sent meanwhile reach the paused broker and are answered after
    it resumes, in order."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.target = pystream.parse_uri(BROKERS[node])
        self.server = socket.create_server(("127.0.0.1", 0))
        port = self.server.getsockname()[1]
        #: Without a password (the Spark source refuses one): guest's.
        self.uri = f"rabbitmq-stream://127.0.0.1:{port}/"
        self.endpoint = Endpoint("127.0.0.1", port)
        self.held = False
        self.paused = False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def resolve(self, endpoint: Endpoint) -> Endpoint:
        """The address resolver: every node is reached through the proxy."""
        return self.endpoint

    def __enter__(self) -> HoldingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        if self.paused:
            run_broker("resume", self.node)

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.target.host, self.target.port))
            threading.Thread(target=self._pump, args=(downstream, upstream),
                             daemon=True).start()
            threading.Thread(target=self._frames, args=(upstream, downstream),
                             daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with HoldingProxy._ends(source, sink):
            while data := source.recv(1 << 16):
                sink.sendall(data)

    @staticmethod
    @contextlib.contextmanager
    def _ends(*sockets: socket.socket) -> Iterator[None]:
        """Shut both sides down when one ends (or fails)."""
        try:
            yield
        except OSError:
            pass
        finally:
            for s in sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _frames(self, source: socket.socket, sink: socket.socket) -> None:
        header = b""  # the size and key of the next frame, as they come
        rest = 0  # bytes of the current frame still to pass on
        with self._ends(source, sink):
            while data := source.recv(1 << 16):
                out, i = bytearray(), 0
                while i < len(data):
                    if rest:
                        n = min(rest, len(data) - i)
                        out += data[i:i + n]
                        i, rest = i + n, rest - n
                        continue
                    take = data[i:i + 6 - len(header)]
                    header, i = header + take, i + len(take)
                    if len(header) < 6:
                        break
                    if int.from_bytes(header[4:6], "big") == 0x0008:
                        sink.sendall(out)
                        out.clear()
                        self._hold()
                    out += header
                    rest, header = int.from_bytes(header[:4], "big") - 2, b""
                sink.sendall(out)

    def _hold(self) -> None:
        with self.lock:
            if self.held:
                return
            self.held = self.paused = True
        run_broker("pause", self.node)
        try:
            time.sleep(HOLD)
        finally:
            run_broker("resume", self.node)
            self.paused = False
