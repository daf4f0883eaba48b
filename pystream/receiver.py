"""Reading one connection's socket into its frame decoder.

The connection's reader thread reads (``run``) and never blocks on the
application; an application thread waiting for a consumer's next batch
takes its turn and reads meanwhile (``read_until``, see ``readturn``).
Either way, each read's whole frames go to their owners at once
(``drain``: ``FrameRoutes.drain``), and a read that ends amid a frame waits
for its rest, which a broker sends right after its header.

What a read that fails does to the connection is the connection's
business (``failed``); this side only says which read failed and how.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from . import locks
from ._core import StreamDecoder
from .errors import ConnectionLost, ProtocolError, ReadInterrupted
from .readturn import ReadTurn
from .tls_channel import TlsChannel

# The most one read takes: the decoder checks the CRC of what a read brought
# of a chunk right after it (StreamDecoder.commit), while it is still in the
# cache, not once the whole chunk (some 8 MB of 1 KiB records) came in.
READ_SLICE = 1 << 20


class Receiver:
    """The read side of a connection to ``uri``: ``decoder`` is its buffer,
    ``drain()`` hands the whole frames in it over, ``failed(exc)`` ends the
    connection after a read failed, ``closed`` is set once it ended, and
    ``shutdown()`` then ``close()`` drop the socket as the reader thread
    leaves."""

    def __init__(self, uri: str, decoder: StreamDecoder, *,
                 drain: Callable[[], None],
                 failed: Callable[[BaseException], None],
                 closed: locks.Event,
                 shutdown: Callable[[], None],
                 close: Callable[[], None]) -> None:
        self._uri = uri
        self._decoder = decoder
        self._drain = drain
        self._failed = failed
        self._closed = closed
        self._shutdown = shutdown
        self._close = close
        self._sock: socket.socket | None = None
        self._tls: TlsChannel | None = None
        self._turn: ReadTurn | None = None  # who reads the socket (see readturn)
        self._committed = False  # every byte read is in the decoder's buffer
        # Taken (popped) by the reader thread as it begins, or by ``abandon``
        # if the connection gave up before it could: whoever takes it drops
        # the socket at the end, and only they.
        self._unclaimed = [True]

    def attach(self, sock: socket.socket, *, tls: TlsChannel | None) -> None:
        """Read ``sock`` from now on (once connected, before ``run``). A TLS
        socket has no turn: bytes may wait in the TLS layer, unpolled, so
        only the reader thread reads it."""
        self._sock, self._tls = sock, tls
        if tls is None:
            self._turn = ReadTurn(sock.fileno())

    # --- the reader thread ----------------------------------------------------------

    def run(self) -> None:
        """The reader thread: read until the socket ends, then drop it."""
        try:
            self._unclaimed.pop()
        except IndexError:
            return  # abandoned before this thread began
        sock, turn = self._sock, self._turn
        assert sock is not None
        first = self._tls is None
        try:
            while True:
                if turn is None:
                    self._read_once(sock, first)
                    first = False
                    continue
                turn.reader_take()
                try:
                    if turn.torn:
                        raise ReadInterrupted(
                            f"a read from {self._uri} was interrupted "
                            f"(KeyboardInterrupt or a signal handler's exception)")
                    while not turn.wanted:
                        if self._left_undrained():
                            self._drain()
                        if turn.poll(None):
                            self._read_once(sock, first)
                            first = False
                finally:
                    turn.give()
        except BaseException as exc:
            self._failed(exc)
        finally:
            self._shutdown()  # done already, unless a BaseException
            if turn is not None:
                turn.end()
            self._close()
            # Nobody reads any more. The connection holds this object and
            # these are its methods: let go of them, so that the two (and
            # the decoder's receive blocks) go when the last reference does,
            # not at the next collection of cycles.
            self._drain = self._shutdown = self._close = _nothing
            self._failed = _nothing

    def abandon(self) -> bool:
        """Opening the connection failed (or an interrupt stopped it) after
        the reader thread was made: whether that thread never began, and
        never will read. Then the caller closes the socket; the turn ends
        here."""
        try:
            self._unclaimed.pop()
        except IndexError:
            return False  # the reader thread drops the socket as it ends
        if self._turn is not None:
            self._turn.end()
        return True

    # --- either thread ----------------------------------------------------------------

    def _read_once(self, sock: socket.socket, first: bool = False) -> None:
        decoder = self._decoder
        view = decoder.writable()  # whatever is there
        room = len(view)
        size = READ_SLICE if room > READ_SLICE else room
        tls = self._tls
        n = sock.recv_into(view, size) if tls is None else tls.recv_into(view, size)
        if n == 0:
            raise ConnectionLost(f"{self._uri} closed the socket")
        if first:
            self._check_not_tls(view[:n])
        decoder.commit(n)
        # The TLS layer reads through its own object: no waiting below.
        if tls is not None:
            self._drain()
            return
        # A read that brought only the start of a frame (a broker writes a
        # chunk's header, then sendfile()s its records) has nothing to hand
        # over yet; otherwise the whole frames go before any wait.
        if not decoder.unfinished:
            self._drain()
            if not decoder.unfinished:
                return
        # The rest of the frame begun is on its way: wait for it in reads of
        # READ_SLICE, not a wake-up from poll and then a read. recv_rest
        # commits each read before a signal handler may raise: an
        # interrupt from here to the drain loses no byte, and the frames it
        # leaves in the buffer are drained by the next read.
        self._committed = True
        if not decoder.recv_rest(sock.fileno(), READ_SLICE):
            raise ConnectionLost(f"{self._uri} closed the socket")
        self._committed = False
        self._drain()

    def _left_undrained(self) -> bool:
        """Whether whole frames wait in the buffer: an interrupt after the
        reads of a chunk (``_committed``) left them there undrained."""
        return bool(self._decoder.frames_ready)

    def _check_not_tls(self, first: memoryview) -> None:
        """A TLS listener answers plain bytes with a TLS record (type 0x15
        alert or 0x16 handshake, version 3.x), which would read as a frame
        of some 350 MB: say what it is."""
        if len(first) >= 2 and first[0] in (0x15, 0x16) and first[1] == 0x03:
            raise ProtocolError(
                f"{self._uri} answered with TLS: use a rabbitmq-stream+tls:// URI")

    # --- application threads -----------------------------------------------------------

    def read_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """In an application thread waiting for data: read the socket (and
        dispatch what comes, as the reader thread would) until ``done()``,
        ``timeout`` seconds pass or the connection ends. False if this
        connection cannot be read here (TLS) or ended: wait as usual.

        Once ``done()``, this thread lends the turn (``ReadTurn.lend``)
        rather than give it back: the reader thread, woken then, would
        compete with it for a core and the GIL while it hands the data
        over. It never leaves holding the turn outright, whatever exception
        goes through."""
        turn, sock, closed = self._turn, self._sock, self._closed
        if turn is None or sock is None or turn.torn:
            return False
        deadline = None if timeout is None else time.monotonic() + timeout
        lend = False
        try:
            if not turn.app_take(timeout):
                return not closed.is_set()
            while not closed.is_set():
                if done():
                    lend = True
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                undrained = self._left_undrained()
                if not undrained and not turn.poll(left):
                    continue
                try:
                    if undrained:
                        self._drain()
                    else:
                        self._read_once(sock)
                except Exception:
                    self._committed = False
                    raise
                except BaseException:
                    # An interrupt (KeyboardInterrupt, a signal handler's
                    # exception) amid a read or a drain: bytes read, or a
                    # frame taken off the buffer and not yet handed over,
                    # may be lost, unless it came while every byte read
                    # was committed and no frame taken (``_committed``).
                    # Then the reader thread, which no signal interrupts,
                    # ends the connection and so rewinds its consumers
                    # (ReadInterrupted). Stores, no calls: a second
                    # interrupt cannot come in between.
                    if self._committed:
                        self._committed = False
                    else:
                        turn.torn = True
                    raise
        except Exception as exc:
            self._failed(exc)
        finally:
            if lend:
                turn.lend()
            else:
                turn.give()
        return not closed.is_set()

    def end_read(self) -> None:
        """Lend the turn again, if this thread has it, now that the data
        ``read_until`` brought is handed over: it reads on if back soon,
        else the reader thread takes over (``ReadTurn.lend``)."""
        if self._turn is not None:
            self._turn.lend()

    def interrupt_read(self) -> None:
        """Stop an application thread's ``read_until`` (its consumer ended
        or moved)."""
        if self._turn is not None:
            self._turn.interrupt()


def _nothing(*_: object) -> None:
    """What an ended receiver calls instead of its connection."""
