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

import threading
import time
from collections.abc import Callable


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
