"""A producer's publisher on the broker: the connection it is declared on
and its id there, declared, deleted, and declared again from a new
connection after a loss (a connection lost or closed by the broker, the
stream's leader moved, the publisher refused as gone), with the frames
not yet confirmed sent again. The connection's reader thread reports to
it (``routing.PublisherSink``); the producer sends through it and fails
when it cannot recover."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import locks, metrics
from . import protocol as P
from .errors import ConnectionClosed, StreamError
from .publish_frames import confirmed_ids
from .retry import Backoff, retryable

if TYPE_CHECKING:
    from .admin import Admin
    from .confirms import Confirms
    from .connection import Connection
    from .metrics import PublisherStats

log = logging.getLogger("pystream.producer")


class PublisherLink:
    """The link of a producer to its publisher on ``stream``. ``connection``
    and ``publisher_id`` are those of the publisher declared last (``None``
    and -1 between a loss and the recovery that declares it again).

    From its producer it takes the producer's lock (for its recovery
    state) and send lock (frames sent again go out before new ones), the
    confirms to settle and send again, and three calls: whether the
    producer is closed, whether it failed, and ``fail`` for a loss it
    cannot recover from."""

    def __init__(self, client: Admin, stream: str, name: str | None, *,
                 recovery_timeout: float, lock: threading.RLock,
                 send_lock: threading.RLock, confirms: Confirms,
                 stats: PublisherStats, closed: Callable[[], bool],
                 failed: Callable[[], bool],
                 fail: Callable[[BaseException], None]) -> None:
        self.client = client
        self.stream = stream
        self.name = name
        self.recovery_timeout = recovery_timeout
        self._lock = lock
        self._send_lock = send_lock
        self._confirms = confirms
        self._stats = stats
        self._closed = closed
        self._failed = failed
        self._fail = fail
        self.connection: Connection | None = None
        self.publisher_id = -1
        self.recovering = False
        # Why the publisher was lost again while recovering (the recovery
        # goes round once more).
        self._lost_again: str | None = None

    # --- what the reader thread reports -------------------------------------

    def on_confirm(self, frame: memoryview) -> None:
        """A PublishConfirm frame: its publishing ids settle their futures."""
        self._confirms.confirmed(confirmed_ids(frame))

    def on_publish_error(self, errors: tuple[P.PublishingError, ...]) -> None:
        """PublishError entries: their futures raise ``PublishError`` with
        the broker's code, except a refusal for want of the publisher,
        sent again after recovery."""
        if self._confirms.refused(errors, self.recovery_timeout):
            self.lost("publisher_gone")

    def on_metadata_update(self, code: int) -> None:
        """The stream moved or went away (a MetadataUpdate with ``code``):
        the publisher is declared again on the stream's leader."""
        log.info("stream %r moved or went away (code %#x): reconnecting the "
                 "producer", self.stream, code)
        self.lost("metadata_update")

    def on_connection_closed(self, error: StreamError | None) -> None:
        """The connection ended: with ``error``, the link recovers (or the
        producer fails with it); ``None`` means the client was closed."""
        if error is None and not self._closed():
            self._fail(ConnectionClosed("the client was closed"))
        elif error is not None:
            self.lost("connection_closed" if isinstance(error, ConnectionClosed)
                      else "connection_lost")

    # --- declaring and deleting ---------------------------------------------

    def connect(self) -> Connection:
        """Declare the publisher on a connection to the stream's leader."""
        endpoint = self.client.locate(self.stream, replica=False)
        conn = self.client.pool.acquire(endpoint, self)
        try:
            pid = conn.add_publisher(self)
            try:
                conn.request(lambda c: P.DeclarePublisher(
                    c, pid, self.name or "", self.stream),
                    f"declare a publisher on {self.stream!r}")
            except BaseException:
                conn.remove_publisher(pid, self)
                raise
        except BaseException:
            self.client.pool.release(conn, self)
            raise
        self.connection, self.publisher_id = conn, pid
        return conn

    def disconnect(self, *, delete: bool, timeout: float = 5.0) -> None:
        """Delete the publisher (``delete``), free its id and give the
        connection back. Each step is done once however often this is
        called: one an interrupt stopped (``close`` in the application's
        thread) is finished by the next call."""
        conn = self.connection
        if conn is not None:
            pid = self.publisher_id
            if delete and conn.is_open and conn.has_publisher(pid, self):
                try:
                    conn.request(lambda c: P.DeletePublisher(c, pid),
                                 "delete publisher", timeout=timeout)
                except StreamError:
                    pass
            conn.remove_publisher(pid, self)
        self.connection = None
        self.client.pool.release_all(self)

    # --- recovery -----------------------------------------------------------

    def lost(self, cause: str) -> None:
        """The publisher is gone or unreachable: recover in a thread of its
        own (once; a loss during a recovery makes it go round again)."""
        with self._lock:
            if self._closed() or self._failed():
                return
            if self.recovering:
                # Lost again before the recovery ended (the leader moved
                # once more): the publisher it declared may be gone already.
                self._lost_again = cause
                return
            self.recovering = True
            self._lost_again = None
        locks.new_thread(self._recover, "pystream-producer-recovery",
                         (cause,)).start()

    def _recover(self, cause: str) -> None:
        # Deleted on a connection still open (a loss it did not cause, told
        # late): the broker refuses a second publisher of one name on a
        # connection (PreconditionFailed), and the pool may hand it back.
        self.disconnect(delete=True)
        started = time.monotonic()
        backoff = Backoff(self.recovery_timeout)
        backoff.start()
        while not self._closed():
            try:
                with self._send_lock:
                    connection = self.connect()
                    if self._closed():  # closed while it reconnected
                        self.disconnect(delete=True)
                        return
                    with self._lock:
                        frames, first = self._confirms.unsettled(self.publisher_id)
                    # With a name the broker drops the ids it already has.
                    for f in frames:
                        connection.send_bytes(f)
                        self._stats.written_bytes += len(f)
                with self._lock:
                    again, self._lost_again = self._lost_again, None
                    if again is None:
                        self.recovering = False
                if again is None:
                    self._recovered(cause, first, len(frames),
                                    time.monotonic() - started)
                    return
                log.info("producer of stream %r lost again while recovering "
                         "(%s): reconnecting once more", self.stream,
                         again.replace("_", " "))
                self.disconnect(delete=True)
                time.sleep(backoff.failed())
            except Exception as exc:
                if not retryable(exc):  # e.g. the stream deleted, a password changed
                    self._fail(exc)
                    return
                if backoff.expired():
                    self._fail(backoff.final(self.stream, exc))
                    return
                self.disconnect(delete=True)
                time.sleep(backoff.failed())

    def _recovered(self, cause: str, first: int | None, batches: int,
                   seconds: float) -> None:
        who = f"producer {self.name!r}" if self.name is not None else "producer"
        resent = (f"sent {batches} unconfirmed batches again from publishing "
                  f"id {first}" if first is not None else "nothing to send again")
        log.warning("%s of stream %r recovered from %s: %s after %.2f s", who,
                    self.stream, cause.replace("_", " "), resent, seconds)
        metrics.recovered("producer", cause, self.stream, seconds,
                          self.client.address)
