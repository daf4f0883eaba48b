"""Shared fixtures: the three real brokers that `scripts/broker up` starts.

Tests find them through PYSTREAM_TEST_URI (RabbitMQ 4.0),
PYSTREAM_TEST_LEGACY_URI (RabbitMQ 3.10) and PYSTREAM_TEST_LATEST_URI
(RabbitMQ 4.3), by default on the ports of scripts/brokers.tsv. What the tests
create there is removed when the suite ends (tests/leftovers.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import pystream

from . import brokers, leftovers
from .backstop import pytest_configure, pytest_runtest_protocol  # noqa: F401 (hooks: a hung run ends, a crash says where)
from .certificates import CLIENT_CN, ensure_certificates

ROOT = pathlib.Path(__file__).resolve().parent.parent
BROKER_SCRIPT = ROOT / "scripts" / "broker"
MODERN_URI = os.environ.get("PYSTREAM_TEST_URI", brokers.MODERN.uri())
LEGACY_URI = os.environ.get("PYSTREAM_TEST_LEGACY_URI", brokers.LEGACY.uri())
LATEST_URI = os.environ.get("PYSTREAM_TEST_LATEST_URI", brokers.LATEST.uri())
BROKERS = {"modern": MODERN_URI, "legacy": LEGACY_URI, "latest": LATEST_URI}
# Each broker's management API (HTTP, guest from localhost only).
MANAGEMENT = {name: brokers.NODES[name].management_url() for name in BROKERS}
# Spark's Python workers run this interpreter (the venv's), not "python3".
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# Every port a test broker of scripts/broker listens on (stream, TLS, AMQP,
# management): a test that dials one needs a broker.
BROKER_PORTS = brokers.LOOPBACK_PORTS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that runs Spark (the ``spark`` fixture) carries the
    ``spark`` mark, which ``make check`` leaves out."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(autouse=True)
def _unmarked_tests_dial_no_broker(request, monkeypatch):
    """A test that needs a broker carries the ``broker`` mark itself
    (``make unit`` runs ``-m "not broker"`` with every broker stopped). One
    that lacks it and dials a broker's port fails here, saying so, instead
    of passing only while a broker happens to run."""
    if request.node.get_closest_marker("broker"):
        return
    connect = socket.socket.connect

    def guarded(sock, address):
        if (sock.family in (socket.AF_INET, socket.AF_INET6)
                and address[1] in BROKER_PORTS):
            pytest.fail(f"{request.node.nodeid} dials port {address[1]} of a "
                        f"test broker but is not marked broker",
                        pytrace=False)
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


def local_spark() -> Any:
    """The tests' local Spark session (2 cores, no UI, UTC, the data source
    registered); the Spark test modules' ``spark`` fixtures start from it."""
    from pyspark.sql import SparkSession

    from pystream.spark import RabbitMQStreamDataSource

    session = (SparkSession.builder.master("local[2]")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    # SQL settings after getOrCreate: another module's session may be reused.
    session.conf.set("spark.sql.shuffle.partitions", "2")
    session.conf.set("spark.sql.session.timeZone", "UTC")
    session.dataSource.register(RabbitMQStreamDataSource)
    return session


def sigint_default() -> None:
    """``preexec_fn`` for a command a test stops with SIGINT: a shell that
    started the tests in the background left SIGINT ignored, which the
    command would inherit (and Python then installs no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
    """Each test using it runs once per broker: 'latest', 'legacy' and
    'modern'."""
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
    """The RabbitMQ 4.3 broker (`scripts/broker up` starts it with the
    others)."""
    return LATEST_URI


@pytest.fixture
def latest():
    with pystream.connect(LATEST_URI) as c:
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
TLS_PORT = brokers.MODERN.stream_tls
MANAGEMENT_TLS_PORT = brokers.MODERN.management_tls
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


@contextmanager
def broker_user(brokers: Iterable[str], name: str, password: str,
                *permissions: str) -> Iterator[str]:
    """A user on each broker, with ``permissions`` (configure, write, read)
    on vhost "/", deleted when the block ends, also on failure: the suite's
    own cleanup runs only when no other session shares the brokers. Name it
    per session (its pid): a concurrent session's block would delete a
    shared name under it."""
    brokers = list(brokers)
    try:
        for broker in brokers:
            broker_ctl(broker, "add_user", name, password)
            broker_ctl(broker, "set_permissions", "-p", "/", name, *permissions)
        yield name
    finally:
        for broker in brokers:
            try:
                broker_ctl(broker, "delete_user", name)
            except subprocess.CalledProcessError as exc:
                if "does not exist" not in exc.stderr:
                    raise


def broker_connections(name: str) -> list[dict[str, Any]]:
    """The modern broker's view of the stream connections named ``name``."""
    out = broker_ctl("modern", "list_stream_connections", "--formatter",
                     "json", "client_properties", "user", "ssl", "port")
    return [c for c in json.loads(out[out.index("["):])
            if ["connection_name", "longstr", name] in c["client_properties"]]


# --- leftovers: what the suite created goes when it ends -----------------

SESSIONS = CACHE / "sessions"


def _start_time(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat): with the pid, it
    tells a live test session from a pid reused since."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _other_sessions_running(me: pathlib.Path) -> bool:
    """Whether another test session against these brokers is still running
    (each registers a file named by its pid, holding its start time)."""
    for entry in SESSIONS.glob("*"):
        if entry == me:
            continue
        try:
            started = entry.read_text().strip()
        except OSError:
            continue
        if entry.name.isdigit() and _start_time(int(entry.name)) == started:
            return True
        entry.unlink(missing_ok=True)  # a session that died: not running
    return False


@contextmanager
def registered_session() -> Iterator[Callable[[], bool]]:
    """This process registered as a session using the brokers while the
    block runs, so that a test suite ending meanwhile leaves what it uses
    (the fault matrix run as a script registers too); yields a call saying
    whether another session is running."""
    SESSIONS.mkdir(parents=True, exist_ok=True)
    me = SESSIONS / str(os.getpid())
    me.write_text(_start_time(os.getpid()) or "")
    try:
        yield lambda: _other_sessions_running(me)
    finally:
        me.unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def remove_leftovers() -> Iterator[None]:
    """When the suite ends, also after failures, delete every stream, super
    stream, user and vhost on the brokers named as the tests name them
    (tests/leftovers.py), but the streams kept between runs. Several
    suites may run against the same brokers at once: only the last one to
    end cleans, so that none deletes another's streams in mid-test.
    PYSTREAM_TEST_KEEP_LEFTOVERS=1 keeps everything (to look at a failure;
    or when suites with an older conftest share the brokers)."""
    with registered_session() as others_running:
        try:
            yield
        finally:
            others = others_running()
    if not others and not os.environ.get("PYSTREAM_TEST_KEEP_LEFTOVERS"):
        for url in MANAGEMENT.values():
            api = leftovers.Management(url)
            if api.reachable():
                leftovers.remove(api, leftovers.leftovers(api))


# --- a build without some libraries (tests/test_build_options.py) -----------

# The libraries the build under test was made without on purpose
# (PYSTREAM_WITHOUT when it was built): set only by the run of the
# broker-free tests against such a build. Everywhere else the build must
# have everything (test_build_options.py::test_this_build_has_everything).
BUILT_WITHOUT = frozenset(
    name for name in os.environ.get("PYSTREAM_TEST_WITHOUT", "").split(",") if name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In a run against a build made without a codec, a test that fails
    with that codec's CodecUnavailable needs the codec: it is reported as
    skipped, naming it. Any other failure stays a failure."""
    outcome = yield
    report = outcome.get_result()
    if not BUILT_WITHOUT or call.excinfo is None or report.when != "call":
        return
    if not call.excinfo.errisinstance(pystream.CodecUnavailable):
        return
    codec = str(call.excinfo.value).split(":", 1)[0].split()[0]
    if codec in BUILT_WITHOUT:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: needs {codec}, which this build lacks")
