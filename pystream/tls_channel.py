"""One TLS connection's socket: read by the connection's reader thread,
written by whichever threads send.

OpenSSL does not allow two threads inside one ``SSL`` object at once: an
``SSL_read`` in the reader thread beside an ``SSL_write`` in a sender may
corrupt its state, and the ``ssl`` module takes no lock of its own. So
every call into the TLS layer is made under one lock, and none of them
blocks: the socket is non-blocking, and a thread that must wait for the
network (the reader for bytes, a sender for room in the socket's buffer)
waits in ``poll`` without the lock, so that the other side goes on
meanwhile (a reader that waited for a blocked sender, or the reverse,
could wait for a broker that waits for them)."""

from __future__ import annotations

import select
import socket
import ssl
import threading
from typing import Any

_POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR
_POLL_OUT = select.POLLOUT | select.POLLHUP | select.POLLERR
#: How long a sender whose write waits for the broker's bytes looks again:
#: only the reader thread reads them, and a poll would see them at once.
_WRITE_WANTS_READ_MS = 5


class TlsChannel:
    """The TLS socket ``sock`` (handshake done), non-blocking from now on."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._lock = threading.Lock()
        self._read_poll = select.poll()  # the reader thread's alone
        self._read_poll.register(self._fd, _POLL_IN)

    def recv_into(self, view: memoryview, size: int) -> int:
        """The reader thread: up to ``size`` bytes into ``view``, waiting
        until some come; 0 once the broker closed (or the socket was shut
        down)."""
        while True:
            with self._lock:
                try:
                    return self._sock.recv_into(view, size)
                except (ssl.SSLWantReadError, BlockingIOError):
                    wait = self._read_poll
                except ssl.SSLWantWriteError:
                    wait = _poll(self._fd, _POLL_OUT)
            wait.poll()

    def send_all(self, data: Any, progress: list[int]) -> None:
        """Send all of ``data`` (any bytes-like; one sender at a time, the
        connection's write lock held). ``progress[0]`` counts the bytes the
        TLS layer took whole, and is -1 while it may hold part of them (a
        write in progress, or one to finish with the same bytes): an
        interrupt then leaves it saying whether a frame may be cut."""
        with memoryview(data) as whole, whole.cast("B") as view:
            total = len(view)
            sent = 0
            while sent < total:
                progress[0] = -1
                events = 0
                with self._lock:
                    try:
                        sent += self._sock.send(view[sent:])
                    except (ssl.SSLWantWriteError, BlockingIOError):
                        events = _POLL_OUT
                    except ssl.SSLWantReadError:
                        events = _POLL_IN
                if not events:
                    progress[0] = sent
                elif events == _POLL_OUT:
                    _poll(self._fd, events).poll()
                else:  # the reader thread takes what came: look again soon
                    _poll(self._fd, events).poll(_WRITE_WANTS_READ_MS)

    def shutdown(self) -> None:
        """End both directions (from any thread): wakes the reader and a
        waiting sender. Under the lock, since ``SSLSocket.shutdown`` drops
        its TLS object, which a reader or sender may be about to call."""
        with self._lock:
            self._sock.shutdown(socket.SHUT_RDWR)


def _poll(fd: int, events: int) -> select.poll:
    poll = select.poll()
    poll.register(fd, events)
    return poll
