"""One TCP (or TLS) connection to a broker.

It runs the handshake (``handshake``: peer properties, SASL, Tune, Open), matches responses
to requests by correlation id, sends heartbeats when the line is idle and
declares the peer lost after two silent heartbeat intervals, and hands the
frames the broker sends on its own (Deliver, PublishConfirm, MetadataUpdate,
...) to the handlers registered for their key.

Its ``Receiver`` reads the socket, in a reader thread of its own or in an
application thread waiting for a consumer's next batch (``read_until``).
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, TypeVar

from . import locks, metrics
from . import protocol as P
from ._core import StreamDecoder, send_all
from .errors import (
    ConnectionClosed,
    ConnectionLost,
    ProtocolError,
    RequestTimeout,
    SendInterrupted,
    StreamError,
    error_for_code,
)
from .features import Features
from .handshake import handshake
from .receiver import Receiver
from .routing import FrameHandler, FrameRoutes, PublisherSink, SubscriptionSink
from .tls import certificate_error
from .tls_channel import TlsChannel
from .uri import BrokerAddress

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("pystream.connection")

_Answer = TypeVar("_Answer", bound=P.Command)


class Connection:
    def __init__(self, address: BrokerAddress, *,
                 ssl_context: ssl.SSLContext | None = None,
                 frame_max: int = 1 << 20,
                 max_deliver_size: int = 256 << 20,
                 heartbeat: int = 60,
                 connect_timeout: float = 10.0,
                 request_timeout: float = 30.0,
                 sasl_mechanism: str = "PLAIN",
                 connection_name: str | None = None) -> None:
        if frame_max < 0 or heartbeat < 0:
            raise ValueError("frame_max and heartbeat must be >= 0")
        if not 0 < max_deliver_size < 1 << 32:
            raise ValueError("max_deliver_size must be in [1, 2**32)")
        self.address = address
        self.requested_frame_max = frame_max
        self.requested_heartbeat = heartbeat
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.sasl_mechanism = sasl_mechanism
        self.connection_name = connection_name
        if address.tls and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self.ssl_context = ssl_context

        self.server_properties: dict[str, str] = {}
        self.connection_properties: dict[str, str] = {}
        self.features = Features("0")
        self.command_versions: dict[int, tuple[int, int]] = {}
        self.frame_max = 0
        self.heartbeat = 0
        self.heartbeats_received = 0

        self._sock: socket.socket | None = None
        self._tls: TlsChannel | None = None  # the TLS layer of _sock, if any
        self._reader_thread: threading.Thread | None = None
        self.max_deliver_size = max_deliver_size
        self._reader = StreamDecoder(self._frame_limit(frame_max))
        # The broker sends a chunk whole in one Deliver, past frame_max.
        self._reader.max_deliver_size = max_deliver_size
        self._routes = FrameRoutes(self._reader)
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending: dict[int, Future[P.Command]] = {}
        self._next_corr = 1
        self._close_listeners: list[Callable[[StreamError | None], None]] = []
        self._tune: Future[P.Tune] = locks.Future()
        self._error: StreamError | None = None
        self._closing = False  # we sent Close: the broker's EOF is expected
        # Closed (set once, under the state lock), then ended: everything
        # that closing undoes is undone (``_end``). An interrupt in the
        # application's thread may come between the two, or stop ``_end``;
        # the next ``close`` finishes it.
        self._closed = locks.Event()
        self._ended = False
        self._ending = threading.RLock()
        self._listeners_told = 0
        self._last_write = time.monotonic()
        self._receiver = Receiver(
            address.uri(), self._reader, drain=self._drain, failed=self._read_failed,
            closed=self._closed, shutdown=self._shutdown_socket, close=self._close_socket)

    def __repr__(self) -> str:
        state = "closed" if self._closed.is_set() else "open"
        return f"<Connection {self.address.uri()} {state}>"

    # --- lifecycle -----------------------------------------------------------

    def open(self) -> None:
        try:
            self._connect_socket()
            self._reader_thread = locks.new_thread(
                self._receiver.run, f"pystream-reader-{self.address.port}")
            self._reader_thread.start()
            self._handshake()
        except BaseException:
            self._shutdown_socket()
            if self._receiver.abandon():  # an interrupt kept the thread from starting
                self._close_socket()
            raise
        metrics.connection_opened(self.address, self)  # counted while open
        if self.heartbeat:
            locks.new_thread(self._heartbeat_loop, "pystream-heartbeat").start()

    def _connect_socket(self) -> None:
        # socket.create_connection's own, but each socket is the
        # connection's as soon as it exists: an interrupt that lands in
        # there leaves it to ``open``'s cleanup, not to a frame of a
        # traceback that may live on in a cycle (the descriptor with it).
        try:
            addresses = socket.getaddrinfo(self.address.host, self.address.port,
                                           0, socket.SOCK_STREAM)
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {self.address.uri()}: "
                                 f"{exc}") from exc
        failure: OSError | None = None
        for family, kind, proto, _, where in addresses:
            self._sock = sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self.connect_timeout)
                sock.connect(where)
                break
            except OSError as exc:
                failure = exc
                self._close_socket()
        else:
            raise ConnectionLost(f"cannot connect to {self.address.uri()}: "
                                 f"{failure}") from failure
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            # The TLS socket takes the descriptor over; it is the
            # connection's before its handshake, where an interrupt is most
            # likely to land (waiting for the server), so that ``open``'s
            # cleanup closes it.
            self._sock = sock = self.ssl_context.wrap_socket(
                sock, server_hostname=self.address.host, do_handshake_on_connect=False)
            try:
                sock.do_handshake()
            except ssl.SSLCertVerificationError as exc:
                self._close_socket()
                raise certificate_error(self.address.uri(), exc) from exc
            except (ssl.SSLError, OSError) as exc:
                self._close_socket()
                raise ConnectionLost(f"TLS handshake with "
                                     f"{self.address.uri()} failed: {exc}") from exc
        if isinstance(sock, ssl.SSLSocket):
            self._tls = TlsChannel(sock)
        else:
            sock.settimeout(None)  # the reader thread blocks; close() unblocks it
        self._receiver.attach(sock, tls=self._tls)

    def _handshake(self) -> None:
        done = handshake(self, self.address, self._tune,
                         sasl_mechanism=self.sasl_mechanism,
                         connection_name=self.connection_name,
                         frame_max=self.requested_frame_max,
                         heartbeat=self.requested_heartbeat,
                         timeout=self.connect_timeout, on_tuned=self._tuned)
        self.server_properties = done.server_properties
        self.features = done.features
        self.frame_max, self.heartbeat = done.frame_max, done.heartbeat
        self.connection_properties = done.connection_properties
        self.command_versions = done.command_versions

    def _frame_limit(self, frame_max: int) -> int:
        # frame_max 0 lifts the negotiated limit, not the bound on what a
        # size prefix may make the reader allocate: max_deliver_size stays
        # (one byte less for the other frames, so that the reader's error
        # for a Deliver frame names max_deliver_size).
        return frame_max or max(self.max_deliver_size - 1, 1)

    def _tuned(self, frame_max: int) -> None:
        self._reader.max_frame_size = self._frame_limit(frame_max)

    def close(self, code: int = P.RESPONSE_OK, reason: str = "") -> None:
        """Close politely (Close, wait for its answer) then drop the socket.
        A close an interrupt stopped is finished by the next call."""
        if self._ended:
            return
        if not self._closed.is_set():
            self._closing = True
            try:
                self.request(lambda c: P.Close(c, code, reason), "close",
                             timeout=min(self.request_timeout, 5.0))
            except StreamError:
                pass  # the socket goes anyway
        self._fail(None)

    @property
    def is_open(self) -> bool:
        return not self._closed.is_set()

    @property
    def error(self) -> StreamError | None:
        """Why the connection ended, None while open or after close()."""
        return self._error

    def on_close(self, listener: Callable[[StreamError | None], None]) -> None:
        self._close_listeners.append(listener)

    def send(self, cmd: P.Command) -> None:
        self.send_bytes(P.encode(cmd))

    def send_bytes(self, data: bytes | bytearray | pa.Buffer) -> None:
        """Send frames whole. An interrupt (not an ``Exception``) that
        stopped the send after part of them went ends the connection
        (``end_interrupted_send``): one before the first byte or after the
        last leaves it open, its frames not sent or sent whole."""
        self._check_open()
        progress = [0]  # bytes sent; unknown (-1) through the TLS layer
        try:
            with self._write_lock:  # the reader closes the socket under it
                sock = self._sock
                if sock is None:
                    raise OSError("socket is closed")
                if self._tls is None:
                    send_all(sock.fileno(), data, progress)
                else:
                    self._tls.send_all(data, progress)
                self._last_write = time.monotonic()
        except OSError as exc:
            err = ConnectionLost(f"send to {self.address.uri()} failed: {exc}")
            self._fail(err)
            raise err from exc
        except BaseException as exc:
            if not isinstance(exc, Exception) and progress[0] != 0 \
                    and progress[0] != len(memoryview(data)):
                self.end_interrupted_send()
            raise

    def end_interrupted_send(self) -> None:
        """End the connection after an interrupt (a ``KeyboardInterrupt``, a
        signal handler's exception) stopped a send on it: part of a frame
        may be on the wire, and a frame sent next would be read as its
        rest."""
        self._fail(SendInterrupted(
            f"a send to {self.address.uri()} was interrupted (KeyboardInterrupt "
            f"or a signal handler's exception): a frame may be cut"))

    def request(self, make: Callable[[int], P.Request], context: str, *,
                timeout: float | None = None) -> P.Command:
        """Send the request ``make(correlation_id)`` and wait for its answer;
        a response code other than OK raises its error class."""
        future: Future[P.Command] = locks.Future()
        with self._state_lock:
            self._check_open()
            corr = self._next_corr
            self._next_corr = corr + 1 if corr < 0xFFFFFFFF else 1
            self._pending[corr] = future
        try:
            self.send(make(corr))
            response = future.result(self.request_timeout
                                     if timeout is None else timeout)
        except FutureTimeout:
            raise RequestTimeout(f"{context}: no answer from "
                                 f"{self.address.uri()}") from None
        finally:
            with self._state_lock:
                self._pending.pop(corr, None)
        if response.response_code != P.RESPONSE_OK:
            raise error_for_code(response.response_code, context)
        return response

    def query(self, answer: type[_Answer], make: Callable[[int], P.Request], context: str,
              *, timeout: float | None = None) -> _Answer:
        """``request`` whose answer must be an ``answer``: another command
        under the correlation id is a ``ProtocolError``."""
        response = self.request(make, context, timeout=timeout)
        if not isinstance(response, answer):
            raise ProtocolError(f"{context}: the broker answered with "
                                f"{type(response).__name__}, not {answer.__name__}")
        return response

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise self._error or ConnectionClosed("the connection is closed")

    def _read_failed(self, exc: BaseException) -> None:
        """End the connection after a read failed (in whichever thread
        read); other exceptions go on up."""
        if isinstance(exc, StreamError):
            self._fail(None if self._closing else exc)
        elif isinstance(exc, OSError):
            self._fail(None if self._closing else ConnectionLost(
                f"reading from {self.address.uri()} failed: {exc}"))
        elif isinstance(exc, Exception):  # a handler's bug must not hang requests
            if not self._closed.is_set():  # not a read racing shutdown()
                log.exception("pystream reader thread failed")
                self._fail(ProtocolError(f"frame dispatch failed: {exc!r}"))
        else:
            raise exc

    def read_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Read in this application thread until ``done()`` (see
        ``Receiver.read_until``); False to wait as usual."""
        return self._receiver.read_until(done, timeout)

    def end_read(self) -> None:
        """The data ``read_until`` brought was handed over (``Receiver.end_read``)."""
        self._receiver.end_read()

    def interrupt_read(self) -> None:
        """Stop an application thread's ``read_until`` (its consumer ended
        or moved)."""
        self._receiver.interrupt_read()

    # --- subscriptions, publishers and frame handlers (``FrameRoutes``) ---------

    def on_frame(self, key: int, handler: FrameHandler) -> None:
        """Route every frame with this key to ``handler`` (in the reader
        thread; it must not block)."""
        self._routes.on_frame(key, handler)

    def add_subscription(self, sink: SubscriptionSink,
                         **decode_options: Any) -> int:
        """Give ``sink`` a free subscription id and decode its chunks with
        ``decode_options`` (those of ``_core.decode``); the caller then sends
        Subscribe with that id."""
        self._check_open()
        return self._routes.add_subscription(sink, **decode_options)

    def update_subscription(self, subscription_id: int,
                            **decode_options: Any) -> None:
        """Decode this subscription's next chunks with new options (a new
        ``start_offset`` after a single-active-consumer switch)."""
        self._routes.update_subscription(subscription_id, **decode_options)

    def remove_subscription(self, subscription_id: int, sink: SubscriptionSink) -> None:
        self._routes.remove_subscription(subscription_id, sink)

    def has_subscription(self, subscription_id: int, sink: SubscriptionSink) -> bool:
        """Whether ``sink`` holds ``subscription_id`` on this connection."""
        return self._routes.subscription(subscription_id) is sink

    @property
    def subscription_count(self) -> int:
        return self._routes.subscription_count

    def add_publisher(self, sink: PublisherSink) -> int:
        """Give ``sink`` a free publisher id; the caller then declares it."""
        self._check_open()
        return self._routes.add_publisher(sink)

    def remove_publisher(self, publisher_id: int, sink: PublisherSink) -> None:
        self._routes.remove_publisher(publisher_id, sink)

    def has_publisher(self, publisher_id: int, sink: PublisherSink) -> bool:
        """Whether ``sink`` holds ``publisher_id`` on this connection."""
        return self._routes.publisher(publisher_id) is sink

    def _drain(self) -> None:
        """Hand every complete frame in the buffer to its owner."""
        self._routes.drain(self._reader, self._dispatch)

    def _dispatch(self, frame: memoryview) -> None:
        if self._routes.route(P.frame_key(frame), frame):
            return
        cmd = P.decode(frame)
        if isinstance(cmd, (P.Response, P.MetadataResponse)):
            with self._state_lock:
                future = self._pending.get(cmd.correlation_id)
            if future is None:
                log.debug("answer to a request no longer waited for: %r", cmd)
            elif not future.done():
                future.set_result(cmd)
        elif isinstance(cmd, P.Tune):
            if not self._tune.done():
                self._tune.set_result(cmd)
        elif isinstance(cmd, P.ConsumerUpdate):
            sink = self._routes.subscription(cmd.subscription_id)
            if sink is None:
                self.send(P.ConsumerUpdateResponse(
                    cmd.correlation_id, P.RESPONSE_SUBSCRIPTION_ID_DOES_NOT_EXIST,
                    P.OffsetSpec(P.OFFSET_NEXT)))
            else:
                sink.on_consumer_update(cmd.correlation_id, bool(cmd.active))
        elif isinstance(cmd, P.PublishError):
            publisher = self._routes.publisher(cmd.publisher_id)
            if publisher is not None:
                publisher.on_publish_error(cmd.errors)
        elif isinstance(cmd, P.MetadataUpdate):
            self._routes.metadata_update(cmd.stream, cmd.code)
        elif isinstance(cmd, P.Heartbeat):
            self.heartbeats_received += 1
        elif isinstance(cmd, P.Close):
            self.send(P.CloseResponse(cmd.correlation_id, P.RESPONSE_OK))
            self._fail(ConnectionClosed(
                f"{self.address.uri()} closed the connection: {cmd.reason} "
                f"(code {cmd.closing_code:#04x})", code=cmd.closing_code))
        else:
            log.debug("no handler for %r", cmd)

    def _heartbeat_loop(self) -> None:
        interval = self.heartbeat
        while not self._closed.wait(min(interval / 4, 1.0)):
            now = time.monotonic()
            if (now - self._reader.last_arrival > 2 * interval
                    and _kernel_quiet(self._sock, 2 * interval)):
                self._fail(ConnectionLost(
                    f"{self.address.uri()} sent nothing for {2 * interval} s "
                    f"(two heartbeat intervals)"))
                return
            if now - self._last_write >= interval:
                try:
                    self.send(P.Heartbeat())
                except StreamError:
                    return

    def _fail(self, error: StreamError | None) -> None:
        """End the connection: record why (the first call), then ``_end``."""
        with self._state_lock:
            if not self._closed.is_set():
                self._error = error
                self._closed.set()
        self._end()

    @locks.letting_go(lambda conn: (conn._ending,))  # interrupted before the try
    def _end(self) -> None:
        """Drop the socket, fail every request waiting, tell the listeners
        and the routes; each step once, however often this is called, so
        that a call an interrupt stopped is finished by the next. Not while
        another thread does it: that one may wait for a lock this one holds
        (a consumer's, closing)."""
        if not self._ending.acquire(blocking=False):
            return
        try:
            if not self._ended:
                self._end_steps()
        finally:
            self._ending.release()

    def _end_steps(self) -> None:
        self._shutdown_socket()
        failure = self._error or ConnectionClosed("the connection is closed")
        while True:
            with self._state_lock:
                if not self._pending:
                    break
                corr, future = next(iter(self._pending.items()))
            if not future.done():
                future.set_exception(failure)
            with self._state_lock:
                self._pending.pop(corr, None)
        if not self._tune.done():
            self._tune.set_exception(failure)
        while self._listeners_told < len(self._close_listeners):
            listener = self._close_listeners[self._listeners_told]
            self._listeners_told += 1  # told once, even if it raises
            listener(self._error)
        self._routes.end(self._error)
        self._ended = True

    def _shutdown_socket(self) -> None:
        """End both directions, which wakes the reader and any blocked
        writer. Only the reader thread closes the descriptor, once it has
        left recv: closed earlier, the number could be reused by a new
        connection and the old reader would read (and answer) its bytes."""
        sock = self._sock
        if sock is None:
            return
        try:
            if self._tls is not None:
                self._tls.shutdown()
            else:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader_thread is None:
            self._close_socket()

    def _close_socket(self) -> None:
        with self._write_lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


#: Where ``tcpi_last_data_recv`` (milliseconds since data last came in) sits
#: in Linux's ``struct tcp_info``.
_LAST_DATA_RECV = 52


def _kernel_quiet(sock: socket.socket | None, seconds: float) -> bool:
    """Whether the kernel received no data on ``sock`` for ``seconds``.

    The reader's clock moves when a read ends, and a read waits for all of
    its slice: a frame trickling in slower than that is still arriving.
    Where the kernel cannot tell (not Linux), the reader's clock is taken
    as the answer."""
    if sock is None or not sys.platform.startswith("linux"):
        return True
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError):
        return True
    if len(info) < _LAST_DATA_RECV + 4:
        return True
    return bool(struct.unpack_from("=I", info, _LAST_DATA_RECV)[0] / 1000 > seconds)
