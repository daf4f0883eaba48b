"""The super stream producer against the real modern broker: every message
reaches the partition its key names, or the batch fails before anything is
sent; a failure on some partitions names them and what the others stored,
so that a named producer's resend is stored once; close and a failed
open close every partition."""

from __future__ import annotations

import re
import secrets
import subprocess
import time

import numpy as np
import pyarrow as pa
import pytest

import pystream
from pystream import PartitionsFailed, PublishError, RoutingError
from pystream.errors import ConfirmTimeout
from pystream.super_stream import hash_route

from .conftest import MODERN_URI, broker_ctl
from .test_producer import _drop_publisher

pytestmark = pytest.mark.broker

KEYS = [f"customer-{i % 40}" for i in range(600)]


def keyed(keys: list[str | None], tag: str = "") -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "body": [f"{tag}{i}:{k}".encode() for i, k in enumerate(keys)],
        "key": pa.array(keys, pa.string())})


@pytest.fixture
def super_stream(modern, stream_name):
    modern.create_super_stream(stream_name, partitions=3)
    yield stream_name
    modern.delete_super_stream(stream_name, missing_ok=True)


def stored(client, partitions: list[str], at_most: int = 5000) -> list[bytes]:
    """Every body stored in the partitions (checking each holds no more)."""
    bodies: list[bytes] = []
    for partition in partitions:
        with client.consumer(partition, offset="first") as consumer:
            bodies += consumer.read(at_most, timeout=1.5).column("body").to_pylist()
    return bodies


@pytest.mark.parametrize("key", ["column", "property"])
def test_a_message_without_a_key_fails_the_batch_before_sending(
        modern, super_stream, key):
    if key == "column":
        batch = keyed(["customer-1", None, "customer-2"])
    else:  # the second message's properties lack the key
        batch = pa.RecordBatch.from_pydict({
            "body": [b"a", b"b", b"c"],
            "application_properties": pa.array(
                [[("key", "customer-1")], [("other", "x")], [("key", "")]],
                pa.map_(pa.string(), pa.string()))})
    with modern.producer(super_stream=super_stream, routing_key="key") as p:
        with pytest.raises(RoutingError) as e:
            p.send_batch(batch)
        assert e.value.index == 1 and isinstance(e.value, ValueError)
        no_properties = pa.RecordBatch.from_pydict({"body": [b"a"]})
        with pytest.raises(RoutingError, match="no column or application property"):
            p.send_batch(no_properties)
    assert stored(modern, modern.partitions(super_stream)) == []


@pytest.mark.parametrize("bad, index", [
    ([0, 3, 1], 1),                           # out of range
    ([0, -1, 1], 1),                          # negative
    ([0, 1], None),                           # short
    (np.array([True, False, True]), None),    # booleans
    (np.array([0.0, 1.0, 2.0]), None),        # floats
    (pa.array([0, None, 1], pa.int64()), 1),  # a null index
], ids=["out-of-range", "negative", "short", "booleans", "floats", "null"])
def test_bad_route_outputs_fail_the_batch_before_sending(
        modern, super_stream, bad, index):
    batch = keyed(["a", "b", "c"])
    with modern.producer(super_stream=super_stream, route=lambda b: bad) as p:
        with pytest.raises(RoutingError) as e:
            p.send_batch(batch)
        assert e.value.index == index
    assert stored(modern, modern.partitions(super_stream)) == []


def test_route_indices_place_every_message(modern, super_stream):
    batch = keyed(["a", "b", "c", "d"])
    with modern.producer(super_stream=super_stream,
                         route=lambda b: pa.array([2, 0, 2, 1], pa.uint8())) as p:
        p.send_batch(batch).result(10)
    partitions = modern.partitions(super_stream)
    assert [stored(modern, [s]) for s in partitions] == [
        [b"1:b"], [b"3:d"], [b"0:a", b"2:c"]]


def test_a_deleted_partition_is_named_and_the_others_store_once(
        modern, super_stream):
    partitions = modern.partitions(super_stream)
    first, second = keyed(KEYS, "a"), keyed(KEYS, "b")
    with modern.producer(super_stream=super_stream, routing_key="key") as p:
        p.send_batch(first).result(30)
        modern.delete_stream(partitions[1])
        with pytest.raises(PartitionsFailed) as e:
            p.send_batch(second).result(30)
    error = e.value
    assert list(error.failed) == [partitions[1]] and partitions[1] in str(error)
    # The others stored their share, or (the partition's producer had
    # failed already) nothing was sent.
    assert set(error.succeeded) in ({partitions[0], partitions[2]}, set())
    kept = [first] + ([second] if error.succeeded else [])
    expected = [body for batch in kept
                for body, part in zip(batch.column("body").to_pylist(),
                                      hash_route(batch.column("key"), 3), strict=True)
                if part != 1]
    assert sorted(stored(modern, [partitions[0], partitions[2]])) == sorted(expected)


def test_a_resend_after_a_partial_failure_is_stored_once(modern, super_stream):
    """The broker refuses one partition's share (its publisher is gone and
    recovery_timeout=0 sends nothing again); the batch sent again by a new
    producer of the same name, with the ids of the first sending, is
    stored once: the partitions that stored their share drop it."""
    partitions = modern.partitions(super_stream)
    first, second = keyed(KEYS, "a"), keyed(KEYS, "b")
    options = dict(super_stream=super_stream, routing_key="key", name="resender")
    p = modern.producer(**options, recovery_timeout=0)
    try:
        p.send_batch(first).result(30)
        _drop_publisher(p._producers[1])
        with pytest.raises(PartitionsFailed) as e:
            p.send_batch(second).result(30)
    finally:
        p.close()
    error = e.value
    assert list(error.failed) == [partitions[1]]
    assert isinstance(error.failed[partitions[1]], PublishError)
    assert error.failed[partitions[1]].code == 0x12
    assert set(error.succeeded) == {partitions[0], partitions[2]}
    assert set(error.resend_ids) == set(partitions)
    with modern.producer(**options) as again:
        assert again.last_publishing_id(partitions[0]) == error.succeeded[partitions[0]]
        again.send_batch(second, publishing_ids=error.resend_ids).result(30)
        # ... and again in the same producer: every partition drops it now.
        again.send_batch(second, publishing_ids=error.resend_ids).result(30)
    bodies = stored(modern, partitions)
    assert sorted(bodies) == sorted(first.column("body").to_pylist()
                                    + second.column("body").to_pylist())


class DroppingConnection:
    """A partition producer's connection that loses what it publishes."""

    def __init__(self, connection) -> None:
        self._connection = connection

    def send_bytes(self, data) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._connection, name)


def test_close_closes_every_partition_when_one_fails(modern, super_stream):
    partitions = modern.partitions(super_stream)
    p = modern.producer(super_stream=super_stream, routing_key="key")
    lossy = p._producers[1]
    real = lossy._link.connection
    lossy._link.connection = DroppingConnection(real)
    p.send_batch(keyed(KEYS))
    lossy._link.connection = real  # its share stays unconfirmed
    with pytest.raises(PartitionsFailed) as e:
        p.close(timeout=2)
    assert list(e.value.failed) == [partitions[1]]
    assert isinstance(e.value.failed[partitions[1]], ConfirmTimeout)
    assert set(e.value.succeeded) == {partitions[0], partitions[2]}
    assert all(producer._closed for producer in p._producers)
    assert not any(modern.pool.holders().values())  # every publisher let go


@pytest.fixture
def writer(super_stream):
    """A user who may write to the super stream's partitions 0 and 2 only."""
    user = f"pystream-ssp-{secrets.token_hex(4)}"
    password = secrets.token_hex(12)
    broker_ctl("modern", "add_user", user, password)
    allowed = "|".join(re.escape(f"{super_stream}-{i}") for i in (0, 2))
    broker_ctl("modern", "set_permissions", "-p", "/", user, ".*",
               f"^({allowed})$", ".*")
    address = pystream.parse_uri(MODERN_URI)
    yield f"rabbitmq-stream://{user}:{password}@{address.host}:{address.port}/"
    try:
        broker_ctl("modern", "delete_user", user)
    except subprocess.CalledProcessError:
        pass


def test_a_failed_open_closes_every_partition(writer, super_stream):
    with pystream.connect(writer) as client:
        with pytest.raises(PartitionsFailed) as e:
            client.producer(super_stream=super_stream, routing_key="key")
        assert list(e.value.failed) == [f"{super_stream}-1"]
        assert isinstance(e.value.failed[f"{super_stream}-1"], pystream.AccessRefused)
        assert not any(client.pool.holders().values())  # partitions 0 and 2 closed


@pytest.mark.broker
def test_flush_returns_once_every_batch_callback_ran(modern, super_stream):
    """A batch's future settles on a partition's callback thread, after the
    confirm that flush waits for: flush waits for that too."""
    confirmed: list[int] = []
    with modern.producer(super_stream=super_stream,
                         route=lambda b: np.arange(b.num_rows) % 3) as p:
        for i in range(20):
            p.send_batch([b"a", b"b", b"c"]).add_done_callback(
                lambda f, i=i: (time.sleep(0.02), f.result(), confirmed.append(i)))
        p.flush(30)
        # Batches settle on the thread of whichever partition confirmed last.
        assert sorted(confirmed) == list(range(20))
