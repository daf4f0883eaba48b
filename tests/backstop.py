"""A backstop behind pytest-timeout.

pytest-timeout (signal method) fails a hung test by raising from SIGALRM
in the main thread. Code that catches what an interrupt raises and goes on
(the interrupt tests do it on purpose, and so may the code they test) can
swallow that exception, and the test then hangs until CI's own deadline
ends the whole run with no stack to read. Here a timer thread, armed for
each test at its timeout plus a grace, prints every thread's stack and
ends the run: a hang costs minutes and says where it is."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Iterator

import pytest

# Seconds past a test's timeout before the backstop ends the run (a test
# of the backstop itself sets it low).
GRACE = float(os.environ.get("PYSTREAM_TEST_BACKSTOP_GRACE", "120"))


def _timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:  # no pytest-timeout (a bare venv of another Python)
        return 0.0


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """A crash (SIGSEGV, SIGABRT) dumps the crashing thread's stack only,
    on pytest's own copy of stderr: CI's log is read with its middle cut,
    where all threads' stacks put the one that matters."""
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key
    except ImportError:  # another pytest's internals: keep its own dump
        return
    fd = config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.enable(file=fd, all_threads=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item,
                            nextitem: pytest.Item | None) -> Iterator[None]:
    limit = _timeout(item)
    if limit <= 0:
        yield
        return

    def expire() -> None:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        sys.stderr.write(
            f"\n[backstop] {item.nodeid} still runs {limit + GRACE:g} s after it "
            f"began: its timeout ({limit:g} s) did not end it. Every thread's "
            "stack follows, then the run ends.\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(limit + GRACE, expire)
    timer.daemon = True
    timer.name = "pytest-backstop"
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
