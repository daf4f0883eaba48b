"""``wait_until``: the tests' one way to wait for a condition, instead of a
fixed sleep that is too short on a loaded machine and too long otherwise."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05,
               what: str = "", ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a true
    value, and return that value; AssertionError after ``timeout`` seconds,
    naming ``what``. An exception of a class in ``ignore`` counts as false."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignore:
            value = None  # type: ignore[assignment]
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{what or getattr(predicate, '__name__', 'condition')}: "
                                 f"not within {timeout} s (last: {value!r})")
        time.sleep(min(interval, left))
