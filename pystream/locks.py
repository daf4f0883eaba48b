"""Waiting on a condition so that an interrupt (a ``KeyboardInterrupt``,
or whatever a signal handler raises) leaves its lock held, as the
``with`` block around the wait expects.

CPython runs signal handlers at the return of a C call: in
``threading.Condition.wait`` one can land right after the lock was let go
and before the ``try`` that takes it again, and in ``Condition.__enter__``
(Python code) right after the lock was taken and before the ``with`` block
that lets it go. So: hold the condition's lock itself (``with lock``, whose
C ``__enter__`` leaves no such gap), and wait through ``wait`` below. The
lock must be an ``RLock``: it knows its owner."""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")


def wait(cond: threading.Condition, timeout: float | None) -> bool:
    """``cond.wait(timeout)``, with the lock held again when it raises."""
    try:
        return cond.wait(timeout)
    except BaseException:
        if not cond._is_owned():  # type: ignore[attr-defined]
            cond.acquire()
        raise


def wait_for(cond: threading.Condition, predicate: Callable[[], bool],
             timeout: float | None) -> bool:
    """``cond.wait_for(predicate, timeout)`` through ``wait``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not (result := predicate()):
        left = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
        wait(cond, left)
    return result


def let_go(*locks: threading.RLock) -> None:
    """Release every hold this thread has on ``locks`` (reentrant locks,
    which know their owner): after an interrupt that may have come between
    taking one and the block that lets it go."""
    for lock in locks:
        while lock._is_owned():  # type: ignore[attr-defined]
            lock.release()


class Condition(threading.Condition):
    """A condition over an ``RLock`` (``lock``) whose ``wait`` raises
    holding it, as ``wait`` above: for code that waits through
    ``threading.Condition`` methods of its own (``concurrent.futures``).
    Its Python ``__enter__`` keeps the gap after the lock was taken: the
    caller lets go of ``lock`` after an interrupt (``let_go``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        super().__init__(self.lock)

    def wait(self, timeout: float | None = None) -> bool:
        try:
            return super().wait(timeout)
        except BaseException:
            if not self._is_owned():  # type: ignore[attr-defined]
                self.acquire()
            raise


_Method = TypeVar("_Method", bound=Callable[..., Any])


def letting_go(held: Callable[[Any], tuple[threading.RLock, ...]]) -> Callable[[_Method], _Method]:
    """A decorator for a method that never returns holding one of the
    reentrant locks ``held(self)`` names: after an interrupt (not an
    ``Exception``) that may have come between taking one and the block
    that lets it go, this thread lets go of it (``let_go``)."""
    def decorate(method: _Method) -> _Method:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    let_go(*held(self))
                raise
        return cast(_Method, call)
    return decorate


# Each call of ``Future`` goes through ``with self._condition``.
_letting_go = letting_go(lambda future: (future._condition.lock,))


class Future(concurrent.futures.Future[T]):
    """A ``concurrent.futures.Future`` that an interrupt in a thread
    waiting on it or adding a callback to it (the application's) leaves
    working: the thread that resolves it (a connection's reader) takes
    the same lock, and would wait for good for a lock left held."""

    def __init__(self) -> None:
        super().__init__()
        self._condition: Condition = Condition()

    _F = concurrent.futures.Future
    result = _letting_go(_F.result)
    exception = _letting_go(_F.exception)
    done = _letting_go(_F.done)
    running = _letting_go(_F.running)
    cancelled = _letting_go(_F.cancelled)
    add_done_callback = _letting_go(_F.add_done_callback)
    set_result = _letting_go(_F.set_result)
    set_exception = _letting_go(_F.set_exception)
    del _F


class Event:
    """A ``threading.Event`` that an interrupt in ``set`` or ``wait`` (in
    the application's thread) leaves working: its lock is taken by the
    lock's own ``with`` (no gap) and waited on through ``wait`` above."""

    def __init__(self) -> None:
        self._cond = Condition()
        self._flag = False

    def _at_fork_reinit(self) -> None:
        # threading calls it on a thread's start event in a forked child.
        self._cond._at_fork_reinit()  # type: ignore[attr-defined]

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._cond.lock:
            self._flag = True
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond.lock:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond.lock:
            if not self._flag:
                wait(self._cond, timeout)
            return self._flag


def new_thread(target: Callable[..., object], name: str,
               args: tuple[Any, ...] = ()) -> threading.Thread:
    """A daemon thread (not started) whose ``start`` an interrupt in the
    starting thread cannot break. ``Thread.start`` waits on an event of the
    thread's own, through ``Condition.__enter__``: an interrupt there would
    keep that event's lock, and the new thread, which sets the event before
    it runs anything, would wait for it for good. Here that event is an
    ``Event`` above."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread._started = Event()  # type: ignore[attr-defined]
    return thread
