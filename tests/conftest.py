"""Shared fixtures: the two real brokers that `scripts/broker up` starts.

Tests find them through PYSTREAM_TEST_URI (RabbitMQ 4.0, default port 5552)
and PYSTREAM_TEST_LEGACY_URI (RabbitMQ 3.10, default port 5562).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import uuid

import pytest

import pystream

ROOT = pathlib.Path(__file__).resolve().parent.parent
BROKER_SCRIPT = ROOT / "scripts" / "broker"
MODERN_URI = os.environ.get("PYSTREAM_TEST_URI",
                            "rabbitmq-stream://guest:guest@localhost:5552/")
LEGACY_URI = os.environ.get("PYSTREAM_TEST_LEGACY_URI",
                            "rabbitmq-stream://guest:guest@localhost:5562/")
BROKERS = {"modern": MODERN_URI, "legacy": LEGACY_URI}
# Spark's Python workers run this interpreter (the venv's), not "python3".
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


BROKER_FIXTURES = {"broker", "uri", "client", "modern", "legacy", "stream",
                   "reader_user"}


def pytest_collection_modifyitems(items):
    """Mark the tests that need a running broker (`-m "not broker"` skips
    them)."""
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)


def broker_ctl(broker: str, *args: str) -> str:
    """Run rabbitmqctl against one of the test brokers."""
    out = subprocess.run([str(BROKER_SCRIPT), "ctl", broker, *args],
                         check=True, capture_output=True, text=True, timeout=120)
    return out.stdout


@pytest.fixture(params=sorted(BROKERS))
def broker(request) -> str:
    """Each test using it runs once per broker: 'legacy' and 'modern'."""
    return request.param


@pytest.fixture
def uri(broker) -> str:
    return BROKERS[broker]


@pytest.fixture
def client(uri):
    with pystream.connect(uri) as c:
        yield c


@pytest.fixture
def modern():
    with pystream.connect(MODERN_URI) as c:
        yield c


@pytest.fixture
def legacy():
    with pystream.connect(LEGACY_URI) as c:
        yield c


@pytest.fixture
def stream_name(request) -> str:
    return f"test-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace(
        "[", "-").replace("]", "")


@pytest.fixture
def stream(client, stream_name):
    client.create_stream(stream_name)
    yield stream_name
    if client.connection.is_open:
        client.delete_stream(stream_name, missing_ok=True)


@pytest.fixture
def modern_stream(modern, stream_name):
    """A new stream on the modern broker (``stream`` is on each broker)."""
    modern.create_stream(stream_name)
    yield stream_name
    modern.delete_stream(stream_name, missing_ok=True)
