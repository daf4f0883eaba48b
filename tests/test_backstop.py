"""The backstop behind pytest-timeout (tests/backstop.py) ends a run whose
test swallowed its timeout, printing where it hung."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

SWALLOWS = '''
import time

def test_swallows_every_timeout():
    while True:
        try:
            time.sleep(0.05)
        except BaseException:
            pass
'''


def test_a_test_that_swallows_its_timeout_ends_the_run_with_its_stack(
        tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> None:
    if not request.config.pluginmanager.hasplugin("timeout"):
        pytest.skip("pytest-timeout is not installed here: no timeout to back")
    (tmp_path / "conftest.py").write_text(
        "from tests.backstop import pytest_runtest_protocol  # noqa: F401\n")
    (tmp_path / "test_hang.py").write_text(textwrap.dedent(SWALLOWS))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSTREAM_TEST_BACKSTOP_GRACE="1")
    began = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "timeout=1", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    out = run.stdout + run.stderr
    assert run.returncode == 3, out
    assert "[backstop] test_hang.py::test_swallows_every_timeout still runs 2 s" in out
    assert "test_swallows_every_timeout" in out.split("[backstop]", 1)[1]  # its stack
    assert took < 60, out


def test_without_pytest_timeout_there_is_no_backstop(tmp_path: pathlib.Path) -> None:
    """A bare venv (another Python, a root with only a compiler) runs the
    tests without pytest-timeout: its ini value is unknown there."""
    (tmp_path / "conftest.py").write_text(
        "from tests.backstop import pytest_runtest_protocol  # noqa: F401\n")
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:timeout",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
