"""The limits that protect a reader from its input are on by default and
configurable, shown on the real modern broker: a gzip sub-batch that
inflates past the default 64 MiB (a bomb RabbitMQ 4.0 stores without
looking; 4.3 refuses it), a Deliver frame larger than
``max_deliver_size``, and the negotiated ``frame_max``."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import pystream
from pystream import protocol as P
from pystream._core import encode_publish

from .conftest import MODERN_URI

pytestmark = pytest.mark.broker

MiB = 1 << 20


class _Confirms:
    """The least a publisher needs to be told: its confirm or its error."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.answered = threading.Event()
        self.errors: tuple = ()

    def on_confirm(self, frame: memoryview) -> None:
        self.answered.set()

    def on_publish_error(self, errors: tuple) -> None:
        self.errors = errors
        self.answered.set()

    def on_metadata_update(self, code: int) -> None:
        pass

    def on_connection_closed(self, error: pystream.StreamError | None) -> None:
        pass


def publish_bomb(client: pystream.Client, stream: str) -> tuple:
    """Publish one gzip sub-batch of 100 bodies of 1 MiB of zeros: 100 MiB
    inflated from about 100 kB on the wire. pystream's producer never
    writes one (its sub-batches are bounded so any fits a frame), so it is
    encoded here without that bound. The broker's publish errors, if any."""
    connection = client.connection
    confirms = _Confirms(stream)
    publisher = connection.add_publisher(confirms)
    connection.request(lambda c: P.DeclarePublisher(c, publisher, "", stream),
                       "declare a publisher")
    frames, _ = encode_publish(publisher, 1, pa.array([bytes(MiB)] * 100),
                               compression="gzip", sub_batch_size=100,
                               max_frame_size=0)
    assert len(frames) < connection.frame_max
    connection.send_bytes(frames)
    assert confirms.answered.wait(30)
    connection.request(lambda c: P.DeletePublisher(c, publisher), "delete publisher")
    connection.remove_publisher(publisher, confirms)
    return confirms.errors


@pytest.fixture
def bomb(modern, stream_name) -> str:
    """A stream holding the bomb of ``publish_bomb``: RabbitMQ 4.0 stores
    it as is."""
    modern.create_stream(stream_name)
    assert publish_bomb(modern, stream_name) == ()
    yield stream_name
    modern.delete_stream(stream_name)


def test_latest_broker_refuses_a_bomb(latest, stream_name):
    """RabbitMQ 4.3 reads the uncompressed size a sub-batch declares and
    refuses one past stream.max_uncompressed_sub_entry_batch_size (64 MiB
    by default, pystream's max_subbatch_size too): PRECONDITION_FAILED,
    and nothing stored."""
    latest.create_stream(stream_name)
    try:
        errors = publish_bomb(latest, stream_name)
        assert [(e.publishing_id, e.code) for e in errors] == [(1, 0x11)]
        assert latest.stream_stats(stream_name)["committed_chunk_id"] == -1
    finally:
        latest.delete_stream(stream_name)


def test_decompression_limit_is_on_by_default(modern, bomb):
    with modern.consumer(bomb, offset="first") as consumer:
        with pytest.raises(pystream.DecompressionLimit, match="exceeds max_subbatch_size"):
            consumer.read(100, timeout=30)


def test_decompression_limit_is_configurable(modern, bomb):
    with modern.consumer(bomb, offset="first", max_subbatch_size=128 * MiB,
                         columns=None) as consumer:
        table = consumer.read(100, timeout=30)
    assert table.num_rows == 100
    assert set(table.column("body").to_pylist()[:1]) == {bytes(MiB)}


@pytest.mark.slow
def test_deliver_size_limit_is_configurable(modern, stream_name):
    modern.create_stream(stream_name)
    with modern.producer(stream_name) as producer:
        producer.send_batch([b"x" * 1000] * 1000).result(30)  # one 1 MB chunk
    # Deliver frames up to frame_max always pass; above it, up to
    # max_deliver_size (the broker sends a chunk whole, past frame_max).
    with pystream.connect(MODERN_URI, frame_max=64 << 10,
                          max_deliver_size=128 << 10) as small:
        with small.consumer(stream_name, offset="first") as consumer:
            with pytest.raises(pystream.FrameTooLarge, match="max_deliver_size"):
                consumer.read(1000, timeout=30)
    with modern.consumer(stream_name, offset="first") as consumer:
        assert consumer.read(1000, timeout=30).num_rows == 1000
    modern.delete_stream(stream_name)


def test_frame_max_is_negotiated_down_and_on_by_default():
    with pystream.connect(MODERN_URI) as client:
        assert client.connection.frame_max == MiB
    with pystream.connect(MODERN_URI, frame_max=64 << 10) as client:
        assert client.connection.frame_max == 64 << 10


def test_text_budget_follows_the_consumers_error_policy(modern, stream_name):
    """A message whose application properties would render past the text
    budget (a key quoted inside keys 22 levels deep: 182 bytes, 343 MB of
    text) published as raw bytes between two good ones: the consumer
    raises, skips it, or keeps it raw with the reason, as error_policy
    says; the records around it are read either way."""
    from .test_core_amqp import BOMBS, app_message, text

    good = app_message(text(0xa1, b"k"), text(0xa1, b"v"))
    modern.create_stream(stream_name)
    try:
        with modern.producer(stream_name, amqp=False) as producer:
            producer.send_batch([good, BOMBS["quoted_keys"], good]).result(30)
        cols = ["application_properties"]
        with modern.consumer(stream_name, offset="first", columns=cols) as consumer:
            with pytest.raises(pystream.MalformedMessage, match="text budget"):
                consumer.read(3, timeout=30)
        with modern.consumer(stream_name, offset="first", columns=cols,
                             error_policy="skip") as consumer:
            table = consumer.read(2, timeout=30)
        assert table.column("offset").to_pylist() == [0, 2]
        assert table.column("application_properties").to_pylist() == [[("k", "v")]] * 2
        with modern.consumer(stream_name, offset="first", columns=cols,
                             error_policy="raw") as consumer:
            table = consumer.read(3, timeout=30)
        assert table.column("body").to_pylist()[1] == BOMBS["quoted_keys"]
        errors = table.column("error").to_pylist()
        assert errors[0] is None and "text budget" in errors[1] and errors[2] is None
    finally:
        modern.delete_stream(stream_name)
