"""Shared fixtures: the two real brokers that `scripts/broker up` starts.

Tests find them through PYSTREAM_TEST_URI (RabbitMQ 4.0, default port 5552)
and PYSTREAM_TEST_LEGACY_URI (RabbitMQ 3.10, default port 5562).
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import socket
import ssl
import subprocess
import sys
import time
import uuid
from typing import Any, Iterator

import pytest

import pystream

from .certificates import CLIENT_CN, ensure_certificates

ROOT = pathlib.Path(__file__).resolve().parent.parent
BROKER_SCRIPT = ROOT / "scripts" / "broker"
MODERN_URI = os.environ.get("PYSTREAM_TEST_URI",
                            "rabbitmq-stream://guest:guest@localhost:5552/")
LEGACY_URI = os.environ.get("PYSTREAM_TEST_LEGACY_URI",
                            "rabbitmq-stream://guest:guest@localhost:5562/")
BROKERS = {"modern": MODERN_URI, "legacy": LEGACY_URI}
# RabbitMQ 4.3 (Debian forky): ResolveOffsetSpec, committed_offset.
LATEST_URI = os.environ.get("PYSTREAM_TEST_LATEST_URI",
                            "rabbitmq-stream://guest:guest@localhost:5582/")
# Spark's Python workers run this interpreter (the venv's), not "python3".
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


BROKER_FIXTURES = {"broker", "uri", "client", "modern", "legacy", "stream",
                   "reader_user", "tls_dir", "cert_user", "latest_uri", "latest"}


def pytest_collection_modifyitems(items):
    """Mark the tests that need a running broker (`-m "not broker"` skips
    them)."""
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)


def run_broker(*args: str, timeout: float = 600) -> str:
    """Run ``scripts/broker ARGS``; its output, or CalledProcessError
    (with its stderr) when it fails."""
    return subprocess.run([str(BROKER_SCRIPT), *args], check=True,
                          capture_output=True, text=True, timeout=timeout).stdout


def broker_ctl(broker: str, *args: str) -> str:
    """Run rabbitmqctl against one of the test brokers."""
    return run_broker("ctl", broker, *args, timeout=120)


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


@pytest.fixture(scope="session")
def latest_uri() -> str:
    """The RabbitMQ 4.3 broker's URI; skips only when its port does not
    answer (it is started by `scripts/broker up latest`)."""
    address = pystream.parse_uri(LATEST_URI)
    try:
        socket.create_connection((address.host, address.port), timeout=2).close()
    except OSError as exc:
        pytest.skip(f"the RabbitMQ 4.3 broker ({address.host}:{address.port}, "
                    f"PYSTREAM_TEST_LATEST_URI) does not answer: {exc}")
    return LATEST_URI


@pytest.fixture
def latest(latest_uri):
    with pystream.connect(latest_uri) as c:
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


# --- TLS: the modern broker's stream TLS listener -------------------------

CACHE = pathlib.Path(os.environ.get("PYSTREAM_BROKER_CACHE")
                     or pathlib.Path.home() / ".cache" / "pystream" / "brokers")
TLS_PORT = 5551
MANAGEMENT_TLS_PORT = 15671
TLS_URI = f"rabbitmq-stream+tls://guest:guest@localhost:{TLS_PORT}/"
EXTERNAL_URI = f"rabbitmq-stream+tls://localhost:{TLS_PORT}/"


def serves_tls(folder: pathlib.Path, wait: float = 0) -> bool:
    """Whether the stream and management TLS ports complete a handshake
    verified by our CA (within ``wait`` seconds)."""
    context = ssl.create_default_context(cafile=folder / "ca.pem")
    deadline = time.monotonic() + wait
    while True:
        try:
            for port in (TLS_PORT, MANAGEMENT_TLS_PORT):
                with socket.create_connection(("localhost", port), timeout=5) as sock:
                    with context.wrap_socket(sock, server_hostname="localhost"):
                        pass
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


def broker_command(command: str) -> None:
    """Run ``scripts/broker COMMAND modern``."""
    try:
        run_broker(command, "modern")
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"scripts/broker {command} modern failed:\n"
                    f"{exc.stderr[-2000:]}")


@pytest.fixture(scope="session")
def tls_dir() -> pathlib.Path:
    """The certificates of tests/certificates.py, served by the modern
    broker on TLS_PORT and MANAGEMENT_TLS_PORT. The node reads them (and
    its config) at start only: a node started before they existed, or with
    an older config, is restarted, once, since the cache folder outlives
    test runs."""
    folder = ensure_certificates(CACHE / "modern" / "tls")
    if serves_tls(folder):
        return folder
    # `up` first: a node that is down or restarting (another run's doing)
    # comes up with the certificates, and is not restarted once more.
    broker_command("up")
    if not serves_tls(folder, wait=5):
        broker_command("restart")
        if not serves_tls(folder, wait=30):
            pytest.fail(f"the modern broker does not serve TLS on {TLS_PORT} "
                        f"and {MANAGEMENT_TLS_PORT} with the CA in {folder}")
    return folder


@pytest.fixture(scope="session")
def cert_user(tls_dir) -> Iterator[str]:
    """The broker user the client certificate names (its CN). Its password
    is random, in hex since rabbitmqctl reads a leading '-' as an option:
    EXTERNAL never sends one."""
    try:
        broker_ctl("modern", "add_user", CLIENT_CN, secrets.token_hex(24))
    except subprocess.CalledProcessError as exc:
        if "already exists" not in exc.stderr:
            raise
    broker_ctl("modern", "set_permissions", "-p", "/", CLIENT_CN,
               ".*", ".*", ".*")
    yield CLIENT_CN
    broker_ctl("modern", "delete_user", CLIENT_CN)


def broker_connections(name: str) -> list[dict[str, Any]]:
    """The modern broker's view of the stream connections named ``name``."""
    out = broker_ctl("modern", "list_stream_connections", "--formatter",
                     "json", "client_properties", "user", "ssl", "port")
    return [c for c in json.loads(out[out.index("["):])
            if ["connection_name", "longstr", name] in c["client_properties"]]
