"""The producer: messages encoded in C into Publish frames, confirms counted
with numpy, memory bounded by ``max_in_flight``, deduplication for named
producers, and unconfirmed frames sent again after a reconnection (so an
unnamed producer may duplicate what the broker stored but never confirmed).

A batch (``send_batch``, or the messages ``send`` gathered for up to
``batch_size`` messages or ``linger_ms``, which the producer's thread
sends) is one ``confirms._Batch``: its frames are kept until every
publishing id in it is confirmed (or refused), then its future is
resolved (``confirms`` keeps that account). Publishing ids increase: one
per message, or one per sub-batch with compression. The publisher on the
broker, and its recovery after a loss, is ``publisher_link``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from . import locks, metrics
from ._core import check_codec, encode_publish
from .arrow import Batch, as_batch
from .confirms import CallbackThread, ConfirmFuture, Confirms, _Batch
from .errors import (
    ConfirmTimeout,
    ProducerClosed,
    SendTimeout,
    StreamError,
)
from .gathered import Row, check_symbols, rows_batch
from .publisher_link import PublisherLink

if TYPE_CHECKING:
    from ._core import Codec
    from .admin import Admin
    from .connection import Connection

log = logging.getLogger("pystream.producer")

FilterValue = str | Callable[[pa.RecordBatch], Any] | None
CODECS: tuple[None, Codec, Codec, Codec, Codec, Codec] = (
    None, "none", "gzip", "snappy", "lz4", "zstd")


def codec(name: str | None) -> Codec | None:
    """``name``, checked against the codecs the encoder knows and this build
    has (:class:`~pystream.errors.CodecUnavailable` names a missing one)."""
    for known in CODECS:
        if name == known:
            if known is not None:
                check_codec(known)
            return known
    raise ValueError(f"compression must be one of {CODECS[1:]}")


# A public call of the producer never returns holding one of its locks.
_lets_go_on_interrupt = locks.letting_go(
    lambda p: (p._lock, p._send_lock, p._buffer_lock))


class Producer:
    """Publishes to one stream. Use as a context manager, or call
    ``close()`` (which waits for the confirms).

    ``send(body, ...)`` gathers messages into batches of ``batch_size`` (or
    what ``linger_ms`` collected) and returns a future per message;
    ``send_batch(bodies)`` publishes a list of bytes, a pyarrow binary or
    string array, or a RecordBatch/Table with a ``body`` column and
    optional ``properties`` / ``application_properties`` /
    ``message_annotations`` columns (the consumer's schema), and returns one
    future for the batch. Futures resolve to the last publishing id, or
    raise ``PublishError``; their done-callbacks run on the producer's
    callback thread, one at a time, never on the connection's reader.
    ``flush(timeout)`` waits for every confirm.

    Options: ``name`` (deduplication: the broker drops publishing ids it
    already has for this name, and the producer continues after the last
    one), ``compression`` (``"gzip"``, ``"snappy"``, ``"lz4"``, ``"zstd"``:
    sub-batches of ``sub_batch_size`` messages), ``filter_value`` (3.13+:
    the name of an application property, or a callable from the batch to a
    string array), ``max_in_flight`` (messages sent and not yet confirmed;
    sending waits beyond it, at most its ``timeout``), ``amqp=False``
    (bodies are published as raw entries), ``recovery_timeout``.
    """

    def __init__(self, client: Admin, stream: str, *, name: str | None = None,
                 batch_size: int = 1000, linger_ms: float = 10.0,
                 compression: str | None = None, sub_batch_size: int = 100,
                 filter_value: FilterValue = None, max_in_flight: int = 100_000,
                 amqp: bool = True, recovery_timeout: float = 300.0) -> None:
        checked_compression = codec(compression)
        if compression not in (None, "none") and filter_value is not None:
            raise ValueError("filter values cannot be combined with "
                             "compressed sub-batches")
        if filter_value is not None:
            client.connection.features.require("filtering")
        if batch_size < 1 or max_in_flight < 1:
            raise ValueError("batch_size and max_in_flight must be positive")
        self.client = client
        self.stream = stream
        self.name = name
        self.batch_size = batch_size
        self.linger = linger_ms / 1000.0
        self.compression = checked_compression
        self.sub_batch_size = sub_batch_size
        self.filter_value = filter_value
        self.max_in_flight = max_in_flight
        self.amqp = amqp
        self.recovery_timeout = recovery_timeout

        # Reentrant locks know their owner: after an interrupt, the thread
        # it stopped lets go of what it held (``_lets_go_on_interrupt``).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._send_lock = threading.RLock()  # frames go out in id order
        self._stats = metrics.publisher_stats(client.address, stream)
        self._confirms = Confirms(self._cond, self._stats)
        self._buffer: list[Row] = []
        # ``send``'s batches leave in the order their messages came (the
        # producer's thread and ``send`` itself may both send the buffer).
        self._buffer_lock = threading.RLock()
        # Messages taken from the buffer and not sent (or failed) yet: they
        # count in the window, and flush and close wait for them too.
        self._taken = 0
        self._closed = False        # no more sends
        self._closed_whole = False  # close() ran to its end
        self._unsent: list[Row] = []  # the buffer at close, failed one by one
        self._error: BaseException | None = None
        # The publisher on the broker, declared again after a loss.
        self._link = PublisherLink(
            client, stream, name, recovery_timeout=recovery_timeout,
            lock=self._lock, send_lock=self._send_lock, confirms=self._confirms,
            stats=self._stats, closed=self._is_closed, failed=self._has_failed,
            fail=self._fail)
        self.last_publishing_id = 0    # last id sent, or the broker had for its name
        # The producer's thread (waiting on ``_wake``) sends what send()
        # gathered once asked: after lingering, or at once (``_want``).
        self._wake = threading.Condition(self._lock)
        self._linger_wanted = False
        self._flush_wanted = False
        self._callbacks = CallbackThread("pystream-producer-callbacks")
        try:
            self._link.connect()
            if name is not None:
                self.last_publishing_id = client.query_publisher_sequence(stream, name)
            locks.new_thread(self._linger_loop, "pystream-producer").start()
        except BaseException:
            # Failed, or an interrupt came after the publisher was declared
            # or a thread started: undone as any producer is.
            self.close()
            raise

    def __repr__(self) -> str:
        return (f"<pystream.Producer {self.stream!r} "
                f"last_publishing_id={self.last_publishing_id}>")

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the application's side ---------------------------------------------

    @_lets_go_on_interrupt
    def send(self, body: bytes, *, properties: dict[str, Any] | None = None,
             application_properties: dict[str, Any] | None = None,
             message_annotations: dict[str, Any] | None = None,
             filter_value: str | None = None,
             timeout: float | None = None) -> ConfirmFuture[int]:
        """Queue one message; the future resolves to its publishing id.
        A symbol that is not ASCII (an annotation key, ``content_type``,
        ``content_encoding``) raises ``ValueError`` here, before it is
        queued. With ``max_in_flight`` messages queued or awaiting their
        confirm, it waits for room, at most ``timeout`` seconds (``None``:
        until there is room, or the producer fails or closes), then raises
        ``SendTimeout`` and queues nothing."""
        check_symbols(properties, message_annotations)
        deadline = _deadline(timeout)
        future: ConfirmFuture[int] = ConfirmFuture(self._callbacks)
        with self._lock:
            self._check()
            while self._window_full(len(self._buffer) + self._taken, 1):
                self._hand_over()
                self._wait(deadline, timeout, "to queue a message")
                self._check()
            self._buffer.append((body, properties, application_properties,
                                 message_annotations, filter_value, future))
            full = len(self._buffer) >= self.batch_size
        if full:
            self._send_buffer(wait=False)
        else:
            self._want(flush=False)
        return future

    @_lets_go_on_interrupt
    def send_batch(self, messages: Batch, *, publishing_id: int | None = None,
                   filter_values: Any = None,
                   timeout: float | None = None) -> ConfirmFuture[int]:
        """Publish a batch; ``publishing_id`` (for deduplication) is the id
        of its first message: it must exceed the ids of this producer still
        awaiting their confirm, and ids the broker already has for ``name``
        are dropped by it (so a named producer may send a batch again with
        the ids it had). With ``max_in_flight`` messages awaiting their
        confirm, it waits for room, at most ``timeout`` seconds (``None``:
        until there is room, or the producer fails or closes), then raises
        ``SendTimeout`` and sends nothing. The future's ``publishing_ids``
        is the batch's first and last publishing ids."""
        deadline = _deadline(timeout)
        if isinstance(messages, (list, tuple)) and (
                filter_values is not None or self.filter_value is None):
            # Bodies alone: the encoder reads the bytes objects in place.
            bodies: Any = tuple(messages)
            batch = None
        else:
            batch = as_batch(messages)
            bodies = batch.column("body")
            if filter_values is None:
                filter_values = self._filter_values(batch)
        if len(bodies) == 0:
            done: ConfirmFuture[int] = ConfirmFuture(self._callbacks)
            done.set_result(self.last_publishing_id)
            return done
        return self._publish(bodies, batch, filter_values, publishing_id, None,
                             deadline, timeout)

    @_lets_go_on_interrupt
    def flush(self, timeout: float | None = None) -> None:
        """Send what ``send`` gathered and wait for every confirm, and for
        the done-callbacks of the futures they resolved to have run (so that
        what the callbacks record is complete when it returns). Raises
        ``ConfirmTimeout`` (a ``RequestTimeout``) if confirms are missing
        after ``timeout`` seconds, ``TimeoutError`` if every message was
        confirmed but callbacks still run then, or the error that failed the
        producer. Called from a done-callback, it waits for no callback."""
        deadline = _deadline(timeout)
        self._await_confirms(deadline, timeout)
        if not self._callbacks.drain(deadline):
            raise TimeoutError(f"every message to {self.stream!r} was confirmed, but "
                               f"done-callbacks still ran after {timeout:g} s")

    def _await_confirms(self, deadline: float | None, timeout: float | None) -> None:
        """Send what ``send`` gathered and wait for every confirm; raise
        ``ConfirmTimeout`` at the deadline, or the error that failed the
        producer (once the callbacks of the futures it failed have run)."""
        self._send_buffer(wait=False)
        with self._lock:
            while ((self._buffer or self._taken or self._confirms.pending)
                   and self._error is None):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise ConfirmTimeout(
                        f"{self._confirms.in_flight + len(self._buffer) + self._taken} "
                        f"message(s) to {self.stream!r} not confirmed within "
                        f"{timeout:g} s")
                locks.wait(self._cond, left)
            error = self._error
        if error is not None:
            self._callbacks.drain(deadline)
            raise error

    @_lets_go_on_interrupt
    def close(self, timeout: float | None = 30.0) -> None:
        """Send what ``send`` gathered, wait for every confirm (at most
        ``timeout`` seconds), then delete the publisher on the broker. Every
        future of the producer is resolved when it returns: a message still
        unconfirmed at the deadline fails with ``ConfirmTimeout`` (the broker
        may or may not have stored it; close raises it too), one not sent
        yet with ``ProducerClosed``; and their done-callbacks have run,
        unless one still runs at the deadline. A close an interrupt stopped
        stops waiting and finishes on the next call of ``close``."""
        if self._closed_whole:
            return
        deadline = _deadline(timeout)
        try:
            if self._error is None and not self._closed:
                self._await_confirms(deadline, timeout)
        finally:
            with self._lock:
                self._closed = True
                # One statement: no interrupt between the two lists.
                self._unsent, self._buffer = self._unsent + self._buffer, []
                self._cond.notify_all()
            self._hand_over()
            closed = ProducerClosed(f"the producer of {self.stream!r} was closed "
                                    "before the message was sent")
            while self._unsent:
                future = self._unsent[-1][-1]
                if not future.done():
                    future.set_exception(closed)
                self._unsent.pop()
            with self._lock:
                # The producer's thread fails what it holds once it sees
                # the producer closed.
                locks.wait_for(self._cond, lambda: not self._taken,
                               _left(deadline, at_least=1.0))
            self._confirms.fail_all(ConfirmTimeout(
                f"not confirmed before the producer of {self.stream!r} closed"
                + ("" if timeout is None else f" ({timeout:g} s)")
                + ": the broker may or may not have stored it"))
            self._link.disconnect(delete=True, timeout=_left(
                deadline, at_least=1.0, at_most=5.0))
            if not self._callbacks.drain(deadline):
                log.warning("producer of %r closed while done-callbacks still ran",
                            self.stream)
            self._callbacks.stop()
            self._closed_whole = True

    # --- batches ------------------------------------------------------------

    def _filter_values(self, batch: pa.RecordBatch) -> Any:
        f = self.filter_value
        if f is None:
            return None
        if callable(f):
            return f(batch)
        if "application_properties" not in batch.schema.names:
            raise ValueError(f"filter_value={f!r} names an application property "
                             "but the batch has no application_properties")
        return pc.map_lookup(batch.column("application_properties"),
                             pa.scalar(f), "first")

    def _window_full(self, queued: int, n: int) -> bool:
        """Whether ``n`` more messages would overflow ``max_in_flight``,
        with ``queued`` messages gathered or taken but not sent (under the
        lock). A batch larger than the window goes alone."""
        used = self._confirms.in_flight + queued
        return (used > 0 and used + n > self.max_in_flight
                and self._error is None and not self._closed)

    def _wait(self, deadline: float | None, timeout: float | None,
              what: str) -> None:
        """Wait for the condition once, or raise ``SendTimeout`` past the
        deadline (under the lock)."""
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise SendTimeout(f"no room in the in-flight window of {self.stream!r} "
                              f"(max_in_flight={self.max_in_flight}) {what} "
                              f"within {timeout:g} s: nothing was sent")
        locks.wait(self._cond, left)

    def _lock_send(self, deadline: float | None, timeout: float | None) -> None:
        """Take the send lock; a recovery may hold it while it reconnects,
        so wait in steps that see a close and the deadline."""
        while not self._send_lock.acquire(timeout=0.05):
            with self._lock:
                self._check()
                if deadline is not None and time.monotonic() >= deadline:
                    self._wait(deadline, timeout, "to send a batch")

    def _hand_over(self) -> None:
        """Have the producer's thread send the buffer now."""
        self._want(flush=True)

    def _want(self, *, flush: bool) -> None:
        """Ask the producer's thread to send the buffer, after lingering or
        (``flush``) at once. Flags under the producer's lock, which an
        interrupt cannot leave held, unlike a ``threading.Event``'s."""
        if self._linger_wanted and not flush:
            return  # asked already (send's path, a message at a time)
        with self._lock:
            # Each flag set after its notify: one an interrupt stopped
            # (Condition.notify is Python code) is notified again next time.
            if flush and not self._flush_wanted:
                self._wake.notify()
                self._flush_wanted = True
            if not self._linger_wanted:
                self._wake.notify()
                self._linger_wanted = True

    def _send_buffer(self, *, wait: bool) -> None:
        """Send what ``send`` gathered: from the producer's thread
        (``wait``: for room in the window and for the send lock), or from
        ``send`` and ``flush``, which wait for nothing and leave the buffer
        to that thread when they would have to."""
        if not self._buffer_lock.acquire(blocking=wait):
            self._hand_over()
            return
        locked = False
        rows: list[Row] = []
        made: list[_Batch] = []  # the batch _publish made of the rows, if it got so far
        try:
            if not wait:
                locked = self._send_lock.acquire(blocking=False)
            with self._lock:
                while wait and self._window_full(0, len(self._buffer)):
                    locks.wait(self._cond, None)
                rows = self._buffer
                if rows and not wait and (
                        not locked or self._window_full(0, len(rows))):
                    self._hand_over()
                    return
                self._buffer = []  # taken: no call since the line above
                self._taken = len(rows)
            if rows:
                self._publish_rows(rows, locked, made)
        except Exception:
            pass  # the futures carry the error
        except BaseException:
            if rows and self._buffer is not rows and not (made and self._owns(made[0])):
                self._give_back(rows)
            raise
        finally:
            if locked:
                self._send_lock.release()
            with self._lock:
                self._taken = 0
                self._cond.notify_all()
            self._buffer_lock.release()

    def _publish_rows(self, rows: list[Row], locked: bool, made: list[_Batch]) -> None:
        futures = [row[-1] for row in rows]
        try:
            batch, filter_values = rows_batch(rows)
            if filter_values is None:
                filter_values = self._filter_values(batch)
            self._publish(batch.column("body"), batch, filter_values, None,
                          futures, None, None, taken=True, locked=locked, made=made)
        except Exception as exc:
            for f in futures:
                f.set_exception(exc)
            raise

    def _publish(self, bodies: Any, batch: pa.RecordBatch | None,
                 filter_values: Any, publishing_id: int | None,
                 message_futures: list[Future[int]] | None,
                 deadline: float | None, timeout: float | None, *,
                 taken: bool = False, locked: bool = False,
                 made: list[_Batch] | None = None) -> ConfirmFuture[int]:
        """Encode and send ``bodies`` (an Arrow array, or a tuple of bytes),
        with the other columns of ``batch``. Messages ``taken`` from the
        buffer had their room in the window when taken; ``locked``: the
        caller holds the send lock (and releases it)."""
        if not taken:
            with self._lock:
                # Back-pressure: wait for confirms rather than grow memory
                # (not under the send lock: recovery needs it to send them
                # again).
                while self._window_full(self._taken, len(bodies)):
                    self._wait(deadline, timeout, "to send a batch")
        if not locked:
            self._lock_send(deadline, timeout)
        record: _Batch | None = None
        sent = False
        try:
            with self._lock:
                self._check()
                first = self.last_publishing_id + 1
                if publishing_id is not None:
                    # Ids the broker already has may be sent again (it drops
                    # them for a name): the ids awaiting confirms must
                    # increase, as confirms are matched to them in order.
                    last = self._confirms.last_pending_id
                    if last is not None and publishing_id <= last:
                        raise ValueError(f"publishing_id {publishing_id} does not "
                                         f"follow {last}, the last one awaiting "
                                         "its confirm")
                    first = publishing_id
                conn = self._link.connection
            frames, counts = encode_publish(
                self._link.publisher_id, first, bodies,
                properties=_column(batch, "properties"),
                application_properties=_column(batch, "application_properties"),
                message_annotations=_column(batch, "message_annotations"),
                filter_values=filter_values, amqp=self.amqp,
                compression=self.compression, sub_batch_size=self.sub_batch_size,
                max_frame_size=(conn.frame_max if conn else 0) or (1 << 20))
            future: ConfirmFuture[int] = ConfirmFuture(self._callbacks)
            record = _Batch(first, counts, frames, message_futures, future)
            if made is not None:
                made.append(record)
            future.publishing_ids = (first, record.last_id)
            with self._lock:
                self._check()  # closed or failed meanwhile: nothing is sent
                self._confirms.add(record)
                self.last_publishing_id = max(self.last_publishing_id,
                                              record.last_id)
            if conn is not None:
                try:
                    conn.send_bytes(frames)
                except StreamError:
                    pass  # recovery sends it again
            sent = True
        except BaseException as exc:
            if record is not None and not sent and not isinstance(exc, Exception):
                self._cut_send(record, conn)
            raise
        finally:
            if not locked:
                self._send_lock.release()
        return future

    # --- interrupts ---------------------------------------------------------

    def _pending(self, record: _Batch) -> bool:
        """Whether ``record`` awaits its confirms (under the lock)."""
        return any(b is record for b in self._confirms.pending)

    def _owns(self, record: _Batch) -> bool:
        """Whether ``record`` made it into the pending batches (it is there,
        or was settled or failed since)."""
        with self._lock:
            return (self._pending(record) or bool(record.settled.any())
                    or record.future.done())

    def _cut_send(self, record: _Batch, conn: Connection | None) -> None:
        """An interrupt stopped the send of ``record`` (the caller's
        thread): if it is still pending, the producer owns it and sends it
        whole from a new connection (its frames may be cut on this one, or
        not sent at all)."""
        with self._lock:
            if not self._pending(record):
                return
            self.last_publishing_id = max(self.last_publishing_id, record.last_id)
        if conn is not None:
            conn.end_interrupted_send()

    def _give_back(self, rows: list[Row]) -> None:
        """Rows an interrupt stopped between the buffer and a pending batch
        (the caller's thread) go back to the head of the buffer, to be sent
        as if never taken."""
        with self._lock:
            self._buffer[:0] = rows
        self._want(flush=False)


    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = error  # from now on nothing more is sent
            self._cond.notify_all()
        self._confirms.fail_all(error)

    def _is_closed(self) -> bool:
        return self._closed

    def _has_failed(self) -> bool:
        return self._error is not None

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ProducerClosed(f"the producer of {self.stream!r} is closed")

    def _linger_loop(self) -> None:
        while not self._closed:
            with self._lock:
                while not (self._linger_wanted or self._closed):
                    self._wake.wait()
                self._linger_wanted = False
                end = time.monotonic() + self.linger
                while not (self._flush_wanted or self._closed):
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                self._flush_wanted = False
            self._send_buffer(wait=True)


def _column(batch: pa.RecordBatch | None, name: str) -> pa.Array[Any] | None:
    if batch is None:
        return None
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None, *, at_least: float,
          at_most: float | None = None) -> float:
    """The time left to ``deadline``, within bounds (a wait that must end)."""
    if deadline is None:
        return at_most if at_most is not None else at_least
    left = max(deadline - time.monotonic(), at_least)
    return left if at_most is None else min(left, at_most)
