"""Credentials audit: a broker user with a distinctive password, and every
place a password could leak checked for it: ``repr``/``str`` of the public
objects, every log record pystream writes (debug included) and every
metric (attributes and values) through connecting, publishing, consuming and
recovering from a closed connection,
the text and whole traceback of the errors a user sees, and what a Spark
plan pickles for its executors. Also: a password variable named but missing
where a connection is made is an error, not a login as guest, and the users
the tests make do not stay on the brokers."""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator

import pytest

import pystream
from pystream.spark import BrokerRef, plan_ranges

from . import leftovers
from .conftest import MANAGEMENT, MODERN_URI, ROOT, broker_ctl, broker_user, local_spark

pytestmark = pytest.mark.broker

USER = f"pystream-audit-{os.getpid()}"


@pytest.fixture(scope="module")
def password() -> Iterator[str]:
    secret = f"audit-{secrets.token_hex(8)}"
    with broker_user(["modern"], USER, secret, ".*", ".*", ".*"):
        yield secret


@pytest.fixture
def audit_uri(password) -> str:
    address = pystream.parse_uri(MODERN_URI)
    return f"rabbitmq-stream://{USER}:{password}@{address.host}:{address.port}/"


def everything_said(error: BaseException) -> str:
    """The error as a user could ever see it: message, repr, arguments and
    the whole formatted chain."""
    return "\n".join([str(error), repr(error), repr(error.args),
                      *traceback.format_exception(error)])


def test_no_password_in_reprs_or_logs(audit_uri, password, stream_name, caplog):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    reader = metrics_reader()
    with pystream.connect(audit_uri, heartbeat=2) as client:
        client.create_stream(stream_name)
        address = pystream.parse_uri(audit_uri)
        seen += [repr(address), str(address), address.uri(), repr(client),
                 str(client), repr(client.connection)]
        with client.producer(stream_name, name="audit") as producer:
            seen.append(repr(producer))
            producer.send_batch([b"before"] * 100).result(30)
        with client.consumer(stream_name, offset="first", name="audit-reader",
                             recovery_timeout=60) as consumer:
            seen.append(repr(consumer))
            assert consumer.read(100, timeout=30).num_rows == 100
            # Recovery logs what it does; it must not log how it logs in.
            broker_ctl("modern", "close_all_connections", "credentials audit")
            with client.producer(stream_name) as producer:
                producer.send_batch([b"after"] * 10).result(30)
            assert consumer.read(10, timeout=60).num_rows == 10
            # Every metric's attributes and values, the recovery's included.
            seen += [repr(reader.get_metrics_data().to_json())]
        client.delete_stream(stream_name)
    logged = [r.getMessage() for r in caplog.records]
    logged += ["".join(traceback.format_exception(*r.exc_info))
               for r in caplog.records if r.exc_info]
    assert any("resubscribed" in line for line in logged)
    recoveries = [r for r in caplog.records if r.levelno == logging.WARNING
                  and "recovered from" in r.getMessage()]
    assert recoveries and all(r.name.startswith("pystream.") for r in recoveries)
    assert "pystream.recoveries" in seen[-1]
    for text in seen + logged:
        assert password not in text, text


def metrics_reader():
    """pystream's metrics on a fresh SDK meter provider, read in memory."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from pystream import metrics
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def test_no_password_in_errors(audit_uri, password):
    wrong = f"wrong-{secrets.token_hex(8)}"
    with pytest.raises(pystream.AuthenticationFailure) as refused:
        pystream.connect(audit_uri.replace(password, wrong))
    port = f":{pystream.parse_uri(audit_uri).port}"
    unreachable = audit_uri.replace(port, ":1")
    with pytest.raises(pystream.StreamError) as not_there:
        pystream.connect(unreachable, connect_timeout=2)
    with pytest.raises(pystream.StreamError) as no_vhost:
        pystream.connect(audit_uri + "no-such-vhost")
    with pytest.raises(ValueError) as malformed:
        pystream.connect(audit_uri.replace(port, ":port"))
    for raised, secret in ((refused, wrong), (not_there, password),
                           (no_vhost, password), (malformed, password)):
        said = everything_said(raised.value)
        assert secret not in said, said
    assert USER in str(refused.value)  # who was refused is useful, and safe


def test_no_password_in_a_spark_plan(audit_uri, password, stream_name,
                                     monkeypatch):
    from pyspark import cloudpickle

    from pystream.spark import RabbitMQStreamDataSource

    address = pystream.parse_uri(audit_uri)
    with pytest.raises(ValueError, match="holds a password") as refused:
        BrokerRef(audit_uri)
    assert password not in everything_said(refused.value)
    monkeypatch.setenv("PYSTREAM_AUDIT_PASSWORD", password)
    uri = f"rabbitmq-stream://{USER}@{address.host}:{address.port}/"
    with pystream.connect(audit_uri) as client:
        client.create_stream(stream_name)
        with client.producer(stream_name) as producer:
            producer.send_batch([b"x"] * 1000).result(30)
        broker = BrokerRef(uri, password_env="PYSTREAM_AUDIT_PASSWORD")
        ranges = plan_ranges(broker, [stream_name], min_records_per_partition=100,
                             min_partitions=4)
        source = RabbitMQStreamDataSource({
            "uri": uri, "passwordEnv": "PYSTREAM_AUDIT_PASSWORD",
            "stream": stream_name, "minPartitions": "2"})
        reader = source.reader(source.schema())
        partitions = reader.partitions()
        shipped = (pickle.dumps((broker, ranges)) +
                   cloudpickle.dumps((source, reader, partitions)))
        assert password.encode() not in shipped
        assert len(ranges) == 4 and len(partitions) >= 1
        assert sum(b.num_rows for b in reader.read(partitions[0])) > 0
        client.delete_stream(stream_name)


def test_password_changed_while_away_fails_instead_of_retrying(
        audit_uri, password, stream_name):
    """Recovery retries what reconnecting may cure; a refused login is not
    that: the producer's and consumer's next calls raise it."""
    with pystream.connect(audit_uri) as client:
        client.create_stream(stream_name)
        producer = client.producer(stream_name, recovery_timeout=120)
        consumer = client.consumer(stream_name, offset="first", recovery_timeout=120)
        producer.send_batch([b"x"] * 10).result(30)
        assert consumer.read(10, timeout=30).num_rows == 10
        broker_ctl("modern", "change_password", USER, f"new-{password}")
        try:
            broker_ctl("modern", "close_all_connections", "password changed")
            started = time.monotonic()
            with pytest.raises(pystream.AuthenticationFailure) as refused:
                producer.send_batch([b"y"] * 10).result(60)
            with pytest.raises(pystream.AuthenticationFailure):
                consumer.read(10, timeout=60)
            assert time.monotonic() - started < 30
            assert password not in everything_said(refused.value)
        finally:
            broker_ctl("modern", "change_password", USER, password)
        producer.close()
        consumer.close()
        client.delete_stream(stream_name)


# --- a password variable named but missing ------------------------------------

def test_a_named_password_variable_missing_is_an_error(monkeypatch):
    """Where a connection is made (a Spark executor), a passwordEnv that is
    not set is MissingPassword naming it, not a login with the default
    password; the default variable may be missing for guest only."""
    from pystream.spark.options import broker_ref, normalize

    monkeypatch.delenv("PYSTREAM_AUDIT_PASSWORD", raising=False)
    monkeypatch.delenv("PYSTREAM_PASSWORD", raising=False)
    named = broker_ref(normalize({"uri": "rabbitmq-stream://localhost:5552/",
                                  "passwordEnv": "PYSTREAM_AUDIT_PASSWORD"}))
    with pytest.raises(pystream.MissingPassword,
                       match="PYSTREAM_AUDIT_PASSWORD") as missing:
        named.address()
    assert missing.value.source == "PYSTREAM_AUDIT_PASSWORD"
    assert "spark.executorEnv.PYSTREAM_AUDIT_PASSWORD" in str(missing.value)
    # Sent to the driver as it is (Spark pickles a task's exception).
    assert pickle.loads(pickle.dumps(missing.value)).source == "PYSTREAM_AUDIT_PASSWORD"
    alice = broker_ref(normalize({"uri": "rabbitmq-stream://alice@localhost:5552/"}))
    with pytest.raises(pystream.MissingPassword, match="PYSTREAM_PASSWORD"):
        alice.address()
    guest = broker_ref(normalize({"uri": "rabbitmq-stream://localhost:5552/"}))
    assert guest.address().password == "guest"
    monkeypatch.setenv("PYSTREAM_AUDIT_PASSWORD", "from-the-environment")
    assert named.address().password == "from-the-environment"


@pytest.mark.spark
def test_a_spark_executor_without_the_password_variable_fails(
        modern, stream_name, monkeypatch):
    """The variable is set in this process only after the local Spark JVM
    started: its Python workers (the executors) lack it. The read fails
    naming it, rather than logging in as guest with the default password."""
    address = pystream.parse_uri(MODERN_URI)
    modern.create_stream(stream_name)
    try:
        with modern.producer(stream_name) as producer:
            producer.send_batch([b"x"] * 10).result(30)
        spark = local_spark()
        variable = f"PYSTREAM_AUDIT_PASSWORD_{os.getpid()}"
        monkeypatch.setenv(variable, address.password)
        reader = (spark.read.format("rabbitmq_stream")
                  .option("uri", f"rabbitmq-stream://{address.host}:{address.port}/")
                  .option("passwordEnv", variable)
                  .option("stream", stream_name))
        with pytest.raises(Exception, match="MissingPassword") as failed:
            reader.load().count()
        assert variable in str(failed.value)
    finally:
        modern.delete_stream(stream_name)


# --- the tests' users ---------------------------------------------------------

def test_the_reader_user_is_deleted_after_its_tests():
    """The read-only user of test_client.py's access test is gone from every
    broker once that test ran, whatever the suite's own cleanup does."""
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_client.py::test_access_refused"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYSTREAM_TEST_KEEP_LEFTOVERS": "1"})
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out
    user = f"pystream-reader-{run.pid}"
    for url in MANAGEMENT.values():
        assert ("users", "", user) not in leftovers.leftovers(leftovers.Management(url))
