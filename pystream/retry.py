"""The one retry policy of consumers, producers and range reads: which
failures reconnecting may cure (the rest are final), the backoff between
attempts, and the deadline after which an outage is final too."""

from __future__ import annotations

import random
import time

from .errors import (
    ConnectionClosed,
    ConnectionLost,
    RequestTimeout,
    StreamNotAvailable,
)

#: Failures that reconnecting may cure: consumers and producers retry these
#: (with backoff, up to their recovery timeout) and give up on anything else.
RECOVERABLE = (ConnectionLost, ConnectionClosed, RequestTimeout,
               StreamNotAvailable, OSError)

#: The wait before the first retry; it doubles after each failed one, up to
#: the cap, which bounds how long the application waits after the broker is
#: back (a refused connect costs the broker next to nothing).
FIRST_RETRY_DELAY = 0.1
MAX_RETRY_DELAY = 2.0


def retryable(error: BaseException) -> bool:
    """Whether reconnecting may cure ``error``; anything else is final (the
    stream deleted, a password changed, bad bytes, a bug)."""
    return isinstance(error, RECOVERABLE)


def next_retry_delay(delay: float) -> float:
    """Up to a fifth less at random, so that the clients of a node that
    comes back do not all dial it at the same moment."""
    return min(delay * 2, MAX_RETRY_DELAY) * random.uniform(0.8, 1.0)


class Backoff:
    """One outage's retries: the wait before each next attempt, and whether
    the outage outlasted ``timeout`` seconds (then it is final)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._since: float | None = None
        self._delay = FIRST_RETRY_DELAY

    def start(self) -> None:
        """The outage began now, unless it had already."""
        if self._since is None:
            self._since = time.monotonic()

    def reset(self) -> None:
        """Recovered: the next outage starts afresh."""
        self._since, self._delay = None, FIRST_RETRY_DELAY

    def failed(self) -> float:
        """An attempt failed (or its success was lost at once): the wait
        before the next one."""
        delay, self._delay = self._delay, next_retry_delay(self._delay)
        return delay

    def expired(self) -> bool:
        """Whether the outage began more than ``timeout`` seconds ago."""
        return (self._since is not None
                and time.monotonic() - self._since > self.timeout)

    def final(self, stream: str, error: BaseException) -> ConnectionLost:
        """The error that ends an expired outage of ``stream``."""
        return ConnectionLost(f"stream {stream!r} unreachable for "
                              f"{self.timeout:g} s: {error}")
