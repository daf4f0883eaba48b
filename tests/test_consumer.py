"""The consumer against the real brokers: offsets, batches, credit, stored
offsets, single active consumer, super streams, filtering, deletion."""

from __future__ import annotations

import bisect
import contextlib
import datetime as dt
import itertools
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import pystream
from pystream import Credit, Filter
from pystream.errors import StreamDoesNotExist, UnsupportedFeature

from .conftest import MODERN_URI
from .publishers import amqp091_url, amqp_message, declare_stream_amqp091, publish, publish_rstream
from .waiting import wait_until

pytestmark = pytest.mark.broker  # every test here talks to a test broker

N = 5000


def bodies(n: int, start: int = 0) -> list[bytes]:
    return [f"message {i}".encode() * (1 + i % 3) for i in range(start, start + n)]


@pytest.fixture
def filled(client, stream):
    publish(client, stream, [amqp_message(b) for b in bodies(N)])
    return stream


def test_reads_every_record_in_order(client, filled):
    with client.consumer(filled, offset="first") as consumer:
        table = consumer.read(N, timeout=10)
        assert consumer.position == N
    assert table.column("offset").to_pylist() == list(range(N))
    assert table.column("body").to_pylist() == bodies(N)


def test_batches_end_after_timeout_without_data(client, filled):
    with client.consumer(filled, offset="first") as consumer:
        rows = sum(b.num_rows for b in consumer.batches(timeout=1.0))
    assert rows == N


def test_offset_int_trims_the_first_chunk(client, filled):
    with client.consumer(filled, offset=N - 10) as consumer:
        assert consumer.position == N - 10
        table = consumer.read(10, timeout=10)
    assert table.column("offset").to_pylist() == list(range(N - 10, N))


def test_offset_next_sees_only_new_records(client, filled):
    with client.consumer(filled, offset="next") as consumer:
        assert consumer.read(1, timeout=1.0).num_rows == 0
        publish(client, filled, [amqp_message(b"late")])
        table = consumer.read(1, timeout=10)
    assert table.column("offset").to_pylist() == [N]
    assert table.column("body").to_pylist() == [b"late"]


def test_offset_last_starts_at_the_last_chunk(client, filled):
    with client.consumer(filled, offset="last") as consumer:
        table = consumer.read(N, timeout=1.0)
    assert 0 < table.num_rows < N
    assert table.column("offset").to_pylist()[-1] == N - 1


def test_offset_timestamp(client, filled):
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with client.consumer(filled, offset=later) as consumer:
        assert consumer.read(1, timeout=1.0).num_rows == 0
    with client.consumer(filled, offset=dt.datetime(2000, 1, 1)) as consumer:
        assert consumer.read(N, timeout=10).num_rows == N


def test_read_keeps_the_rest_of_a_chunk(client, filled):
    with client.consumer(filled, offset="first") as consumer:
        seen = []
        while len(seen) < N:
            # No more than is left: a read for more waits out its timeout.
            part = consumer.read(min(7, N - len(seen)), timeout=10)
            assert 0 < part.num_rows <= 7
            seen += part.column("offset").to_pylist()
            assert consumer.position == seen[-1] + 1
    assert seen == list(range(N))


def test_messages_are_views_with_a_position(client, filled):
    with client.consumer(filled, offset=N - 3) as consumer:
        got = []
        for m in consumer.messages(timeout=1.0):
            got.append((m.offset, m.body))
            assert consumer.position == m.offset + 1
    assert got == [(i, b) for i, b in zip(range(N - 3, N), bodies(3, N - 3), strict=True)]


def test_messages_stopped_early_hand_the_rest_once(client, filled):
    """Leaving messages() in the middle of a chunk hands what was taken:
    the next read starts at the record after the last one yielded."""
    with client.consumer(filled, offset="first") as consumer:
        taken = []
        for m in consumer.messages(timeout=1.0):
            taken.append(m.offset)
            if m.offset == 10:
                break
        assert consumer.position == 11
        rest = [o for b in consumer.batches(timeout=1.0) for o in b.column("offset").to_pylist()]
    assert taken + rest == list(range(N))



def test_messages_with_binary_bodies_across_chunks(client, filled):
    """``body="binary"``: each chunk's bodies are copied once, and every
    record's body is its own, through chunks and a loop left and resumed."""
    with client.consumer(filled, offset="first", body="binary") as consumer:
        got = []
        for m in consumer.messages(timeout=1.0):
            got.append(m.body)
            if len(got) == 1234:
                break
        got += [m.body for m in consumer.messages(timeout=1.0)]
    assert got == bodies(N)

def test_coalesced_batches(client, filled, monkeypatch):
    """Chunks queued together are handed as batches of several chunks each,
    up to max_batch_rows."""
    chunks = count_chunks(monkeypatch)
    with client.consumer(filled, offset="first", max_batch_rows=2000) as consumer:
        wait_until(lambda: sum(chunks) >= N, 10, what="every chunk queued")
        batches = list(consumer.batches(timeout=1.0))
    sizes = [b.num_rows for b in batches]
    assert sum(sizes) == N and max(sizes) <= 2000
    # The chunk of each offset: a batch whose first and last records are in
    # different chunks spans several.
    ends = list(itertools.accumulate(chunks))
    spans = [bisect.bisect_right(ends, b.column("offset")[-1].as_py())
             - bisect.bisect_right(ends, b.column("offset")[0].as_py()) + 1
             for b in batches]
    assert len(chunks) > 1 and max(spans) > 1, (chunks, sizes)


def count_chunks(monkeypatch) -> list[int]:
    """The record counts of the chunks every consumer receives from now on,
    in their order."""
    from pystream.subscription import Subscriptions
    chunks: list[int] = []
    arrived = Subscriptions._chunks_arrived

    def counting(self, sub, got):
        chunks.extend(c.num_records for c in got)
        return arrived(self, sub, got)

    monkeypatch.setattr(Subscriptions, "_chunks_arrived", counting)
    return chunks


def test_a_record_is_handed_without_waiting_for_more(client, stream):
    """One record published into a quiet stream reaches the application on
    its own: nothing waits to fill a batch, a timer or more credit."""
    with client.consumer(stream, offset="next") as consumer:
        start = time.monotonic()
        publish(client, stream, [amqp_message(b"alone")])
        batch = next(consumer.batches(timeout=10))
        waited = time.monotonic() - start
    assert batch.column("body").to_pylist() == [b"alone"]
    assert waited < 5  # the machine is shared: seconds, not a timer's ms


def test_queued_small_chunks_join_into_one_batch(client, stream):
    for i in range(20):  # twenty publishes, twenty chunks
        publish(client, stream, [amqp_message(b"%d" % i)])
    with client.consumer(stream, offset="first") as consumer:
        # All queued: the application fell behind.
        wait_until(lambda: consumer._subs.queued() >= 20, 10, 0.01)
        sizes = [b.num_rows for b in consumer.batches(timeout=1.0)]
        assert consumer.position == 20
    assert sizes == [20]


def test_binary_bodies_are_copied_once_after_the_join(uri, client, stream, monkeypatch):
    """body="binary": chunks decode as views and the joined batch gets its
    bodies copied into plain binary once; it equals the body="view" read
    and holds none of the receive buffers (blocks) the views pointed into."""
    from pystream.receiver import Receiver
    blocks: list = []
    read_once = Receiver._read_once

    def recording(self, sock, first=False):
        # Kept alive, so no block is reused and every span stays unique.
        blocks.append(self._decoder.writable().obj)
        return read_once(self, sock, first)

    monkeypatch.setattr(Receiver, "_read_once", recording)
    for i in range(20):  # twenty chunks
        publish(client, stream, [amqp_message(b"body %d " % i * (1 + i))] * 3)

    def joined(body: str) -> pa.RecordBatch:
        with pystream.connect(uri) as fresh, \
                fresh.consumer(stream, offset="first", body=body) as consumer:
            wait_until(lambda: consumer._subs.queued() >= 20, 10, 0.01)
            batches = list(consumer.batches(timeout=1.0))
            assert consumer._subs._decode_options["body"] == "view"  # no copy before the join
        assert [b.num_rows for b in batches] == [60]  # one batch of 20 chunks
        return batches[0]

    def in_blocks(batch: pa.RecordBatch) -> list[int]:
        spans = [(pa.py_buffer(b).address, len(memoryview(b))) for b in blocks]
        return [buf.address for column in batch.columns for buf in column.buffers()
                if buf is not None and any(a <= buf.address < a + n for a, n in spans)]

    binary, views = joined("binary"), joined("view")
    assert binary.schema == pystream.schema(body="binary")
    assert binary.column("body").type == pa.binary()
    assert binary.column("body").to_pylist() == views.column("body").to_pylist()
    assert in_blocks(views)  # the check finds the views' bytes
    assert not in_blocks(binary)


def test_large_chunks_stay_one_batch_each(client, stream, monkeypatch):
    from pystream.consumer import JOIN_ROWS
    chunks = count_chunks(monkeypatch)
    n = 4 * JOIN_ROWS
    publish(client, stream, [amqp_message(b"x" * 10)] * n, batch=n)
    with client.consumer(stream, offset="first") as consumer:
        wait_until(lambda: sum(chunks) >= n, 10, what="every chunk queued")
        sizes = [b.num_rows for b in consumer.batches(timeout=1.0)]
    assert sum(sizes) == n
    # A chunk over JOIN_ROWS is a batch of its own, as it came (not a copy
    # joined with others), and no batch over JOIN_ROWS holds several.
    assert (sorted(s for s in sizes if s > JOIN_ROWS)
            == sorted(c for c in chunks if c > JOIN_ROWS))


def test_named_consumer_stores_and_resumes(client, filled):
    with client.consumer(filled, offset="first", name="app") as consumer:
        assert consumer.read(1234, timeout=10).num_rows == 1234
    # StoreOffset has no answer.
    wait_until(lambda: client.query_offset(filled, "app") == 1233, 5,
               ignore=(pystream.NoOffset,))
    with client.consumer(filled, offset="first", name="app") as consumer:
        table = consumer.read(N - 1234, timeout=10)  # more would wait out the timeout
    assert table.column("offset").to_pylist() == list(range(1234, N))


def test_manual_store_offset(client, filled):
    with client.consumer(filled, offset="first", name="m",
                         auto_store=False) as consumer:
        consumer.read(10, timeout=10)
        consumer.store_offset()
        consumer.store_offset(3)
    # StoreOffset has no answer; the first store (10) may show before the second.
    wait_until(lambda: client.query_offset(filled, "m") == 3, 10,
               ignore=(pystream.NoOffset,))


@pytest.mark.parametrize("credit", [Credit.on_arrival(2), Credit.on_consumed(1),
                                    Credit.adaptive(max_buffered_bytes=1)])
def test_credit_policies_read_everything(client, filled, credit):
    with client.consumer(filled, offset="first", credit=credit) as consumer:
        assert consumer.read(N, timeout=10).num_rows == N


@pytest.mark.parametrize("credit", [Credit.adaptive(max_buffered_bytes=4 << 20),
                                    Credit.on_consumed(10)])
def test_chunks_past_frame_max_do_not_stall_credit(client, stream, credit):
    """Bursts make the broker write chunks of several MB (sent whole, past
    the 1 MiB frame_max): a small credit window must not stall delivery."""
    # Publish frames sent back to back without waiting for confirms: the
    # broker's writer puts what is pending into one chunk.
    n, size = 10_000, 8192
    with client.producer(stream, max_in_flight=n) as producer:
        producer.send_batch([b"%07d" % i + b"x" * (size - 7) for i in range(n)])
    with client.consumer(stream, offset="first", credit=credit) as consumer:
        sizes = []
        rows = 0
        for batch in consumer.batches(timeout=5):
            rows += batch.num_rows
            sizes.append(batch.num_rows * size)
            if rows >= n:
                break
    assert rows == n
    assert max(sizes) > 1 << 20


def test_manual_credit(client, uri, stream):
    # Three chunks of ten. Each is one sub-entry: the broker writes a Publish
    # frame's messages one by one and may cut them into several chunks.
    for _i in range(3):
        publish_rstream(uri, stream, [("sub-none", [amqp_message(b"x")] * 10)])
    with client.consumer(stream, offset="first",
                         credit=Credit.manual(1)) as consumer:
        assert consumer.read(100, timeout=1.0).num_rows == 10
        consumer.grant_credit(2)
        assert consumer.read(100, timeout=1.0).num_rows == 20


def test_deleted_stream_ends_iteration(client, filled):
    with client.consumer(filled, offset="first") as consumer:
        assert consumer.read(N, timeout=10).num_rows == N
        client.delete_stream(filled)
        with pytest.raises(StreamDoesNotExist):
            consumer.read(1, timeout=10)


def test_missing_stream(client):
    with pytest.raises(StreamDoesNotExist):
        client.consumer("no-such-stream-here")


def test_committed_chunk_id_and_lag(modern, stream_name):
    modern.create_stream(stream_name)
    try:
        publish(modern, stream_name, [amqp_message(b) for b in bodies(N)])
        with modern.consumer(stream_name, offset="first") as consumer:
            assert consumer.lag() > 0
            consumer.read(N, timeout=10)
            assert consumer.committed_chunk_id is not None
            assert consumer.lag() == 0
    finally:
        modern.delete_stream(stream_name)


def test_legacy_broker_refuses_new_features(legacy, stream_name):
    legacy.create_stream(stream_name)
    try:
        with pytest.raises(UnsupportedFeature):
            legacy.consumer(stream_name, name="x", single_active=True)
        with pytest.raises(UnsupportedFeature):
            legacy.consumer(stream_name, filter=Filter(["a"]))
        with legacy.consumer(stream_name, offset="first") as consumer:
            assert consumer.committed_chunk_id is None
            assert consumer.lag() is None
    finally:
        legacy.delete_stream(stream_name)


def test_single_active_consumer_failover(modern, stream_name):
    modern.create_stream(stream_name)
    try:
        publish(modern, stream_name, [amqp_message(b) for b in bodies(N)])
        first = modern.consumer(stream_name, offset="first", name="sac",
                                single_active=True)
        second = modern.consumer(stream_name, offset="first", name="sac",
                                 single_active=True)
        try:
            a = first.read(1000, timeout=10).column("offset").to_pylist()
            assert second.read(1, timeout=1.0).num_rows == 0
            first.close()  # stores 999, hands over
            b = second.read(N, timeout=10).column("offset").to_pylist()
        finally:
            first.close()
            second.close()
        assert a + b == list(range(N))
    finally:
        modern.delete_stream(stream_name)



class Boom(Exception):
    """The application's processing failed."""


def stored_soon(client, stream: str, name: str, expected: int | None) -> int | None:
    """The offset stored for ``name`` (None if none), given up to 5 s to
    become ``expected``: StoreOffset has no answer."""
    def stored() -> int | None:
        try:
            return client.query_offset(stream, name)
        except pystream.NoOffset:
            return None

    with contextlib.suppress(AssertionError):  # the caller checks what it got
        wait_until(lambda: stored() == expected, 5)
    return stored()


def first_after_reopen(client, stream: str, name: str, first: int) -> int:
    """The first record a new consumer named ``name`` reads, once the broker
    holds ``first - 1`` (or it has waited for that)."""
    stored_soon(client, stream, name, first - 1 if first else None)
    with client.consumer(stream, offset="first", name=name) as consumer:
        return consumer.read(1, timeout=10).column("offset")[0].as_py()


@pytest.mark.parametrize("k", [0, 1, 1500, N - 1])
def test_exception_in_messages_stores_before_the_failed_record(client, filled, k):
    """Processing record ``k`` of ``messages()`` raises through the
    with-block: the stored offset is ``k - 1`` (record by record stores
    included), so the consumer of that name starts again with ``k``."""
    with pytest.raises(Boom):
        with client.consumer(filled, offset="first", name="msg",
                             store_every_records=1) as consumer:
            for m in consumer.messages(timeout=5):
                if m.offset == k:
                    raise Boom
    assert first_after_reopen(client, filled, "msg", k) == k


@pytest.mark.parametrize("how", ["batches", "read"])
def test_exception_in_batches_or_after_read_stores_no_record_of_it(client, filled, how):
    """Processing a batch (or a read's table) raises through the
    with-block at record k: the consumer of that name starts again at or
    before k, with the first record of what was being processed."""
    k = 2345
    began = None
    with pytest.raises(Boom):
        with client.consumer(filled, offset="first", name=how,
                             store_every_records=1) as consumer:
            while True:
                part = (next(consumer.batches(timeout=5)) if how == "batches"
                        else consumer.read(700, timeout=5))
                offsets = part.column("offset").to_pylist()
                if k in offsets:
                    began = offsets[0]
                    raise Boom
    assert began is not None and first_after_reopen(client, filled, how, began) == began


def test_periodic_store_waits_for_the_application_to_come_back(client, filled):
    """Stores while reading cover what the application came back for more
    after, never the records it was handed and still holds."""
    with client.consumer(filled, offset="first", name="periodic",
                         store_every_records=1) as consumer:
        consumer.read(100, timeout=5)
        time.sleep(0.3)  # StoreOffset has no answer
        with pytest.raises(pystream.NoOffset):
            client.query_offset(filled, "periodic")
        consumer.read(100, timeout=5)  # back for more: the first 100 are done
        assert stored_soon(client, filled, "periodic", 99) == 99
    assert stored_soon(client, filled, "periodic", 199) == 199  # closed cleanly


def test_single_active_consumer_deactivated_hands_and_stores_nothing(modern, stream_name):
    """A super stream's second consumer takes a partition over (the broker
    deactivates the first with a ConsumerUpdate): the first hands no more
    of it, not even the rest of the chunk its messages() was in, and its
    close does not store over the new consumer's progress."""
    modern.create_super_stream(stream_name, partitions=2)
    try:
        p0, p1 = modern.partitions(stream_name)
        publish(modern, p1, [amqp_message(b) for b in bodies(N)])
        options = dict(super_stream=stream_name, offset="first", name="sac",
                       single_active=True)
        a = modern.consumer(None, **options)
        b = None
        try:
            messages = a.messages(timeout=2)
            held = [next(messages).offset for _ in range(10)]
            assert a.positions == {p0: None, p1: 10}
            # Partition 1 goes to the group's second consumer.
            b = modern.consumer(None, **options)
            taken = b.read(1000, timeout=10).column("offset").to_pylist()
            after = [m.offset for m in messages]  # what a hands once deactivated
            b.store_offset()
            assert stored_soon(modern, p1, "sac", taken[-1]) == taken[-1]
            a.close()
            seen = set()
            for _ in range(10):  # a stale store would show
                seen.add(modern.query_offset(p1, "sac"))
                time.sleep(0.1)
            assert (after, seen) == ([], {taken[-1]})
            assert taken[0] == held[-1]  # a held 9, unfinished, when deactivated
        finally:
            a.close()
            if b is not None:
                b.close()
    finally:
        modern.delete_super_stream(stream_name)

def test_super_stream(modern, stream_name):
    modern.create_super_stream(stream_name, partitions=3)
    try:
        partitions = modern.partitions(stream_name)
        for i, p in enumerate(partitions):
            publish(modern, p, [amqp_message(f"{p}:{j}".encode())
                                for j in range(100 * (i + 1))])
        with modern.consumer(super_stream=stream_name,
                             offset="first") as consumer:
            seen: dict[str, list] = {p: [] for p in partitions}
            rows = 0
            for batch in consumer.batches(timeout=2.0):
                p = batch.schema.metadata[b"stream"].decode()
                seen[p] += batch.column("body").to_pylist()
                rows += batch.num_rows
            assert consumer.positions == {p: 100 * (i + 1)
                                          for i, p in enumerate(partitions)}
        for i, p in enumerate(partitions):
            assert seen[p] == [f"{p}:{j}".encode() for j in range(100 * (i + 1))]
    finally:
        modern.delete_super_stream(stream_name)


def test_super_stream_partition_added_later(modern, stream_name):
    import pika
    modern.create_super_stream(stream_name, partitions=2)
    new = f"{stream_name}-2"
    try:
        with modern.consumer(super_stream=stream_name, offset="first",
                             partition_refresh_seconds=0.3) as consumer:
            assert sorted(consumer.positions) == [f"{stream_name}-0",
                                                  f"{stream_name}-1"]
            # Grow the super stream as RabbitMQ tools do: a stream queue
            # bound to the super stream's exchange with the next order.
            declare_stream_amqp091(amqp091_url(MODERN_URI), new)
            with pika.BlockingConnection(pika.URLParameters(
                    amqp091_url(MODERN_URI))) as connection:
                connection.channel().queue_bind(
                    new, stream_name, routing_key="2",
                    arguments={"x-stream-partition-order": 2})
            publish(modern, new, [amqp_message(b"in the new partition")])
            table = consumer.read(1, timeout=10)
            assert table.column("body").to_pylist() == [b"in the new partition"]
            assert consumer.positions[new] == 1
    finally:
        modern.delete_super_stream(stream_name)
        modern.delete_stream(new, missing_ok=True)


def test_filtering(modern, stream_name):
    modern.create_stream(stream_name)
    try:
        for value in ("red", "blue", None, "red"):  # one chunk each
            publish(modern, stream_name,
                    [amqp_message(value.encode() if value else b"none",
                                  {"color": value or "none"})] * 50,
                    filter_values=[value] * 50)

        def read(f: Filter) -> list[bytes]:
            with modern.consumer(stream_name, offset="first",
                                 columns=["application_properties"],
                                 filter=f) as consumer:
                return consumer.read(1000, timeout=1.5).column("body").to_pylist()

        assert read(Filter(["red"])) == [b"red"] * 100
        assert sorted(set(read(Filter(["red"], match_unfiltered=True)))) == [
            b"none", b"red"]
        color = pc.map_lookup(pc.field("application_properties"),
                              pa.scalar("color"), "first")
        assert read(Filter(["red", "blue"], post_filter=color == "blue")) == [
            b"blue"] * 50
        assert read(Filter(["red", "blue"], post_filter=lambda b: pc.not_equal(
            pc.map_lookup(b.column("application_properties"), pa.scalar("color"),
                          "first"), "red"))) == [b"blue"] * 50
    finally:
        modern.delete_stream(stream_name)


def test_consumer_in_another_thread_is_closed_cleanly(client, filled):
    consumer = client.consumer(filled, offset="next")
    got: list = []
    t = threading.Thread(target=lambda: got.extend(consumer))
    t.start()
    time.sleep(0.3)
    consumer.close()
    t.join(5)
    assert not t.is_alive() and got == []


def test_client_close_ends_its_consumers(uri, stream):
    other = pystream.connect(uri)
    consumer = other.consumer(stream, offset="first")
    assert consumer.read(1, timeout=0.3).num_rows == 0
    other.close()
    assert consumer.read(1, timeout=5).num_rows == 0
    assert consumer.closed


def test_the_waiting_thread_reads_and_the_reader_thread_while_it_works(
        client, stream, monkeypatch):
    """A thread waiting for a batch reads the socket itself (no hand-over
    from the reader thread); while it works on a batch, the reader thread
    reads the next ones."""
    from pystream.subscription import Subscriptions
    readers: list[threading.Thread] = []
    arrived = Subscriptions._chunks_arrived

    def spy(self, sub, chunks):
        readers.append(threading.current_thread())
        arrived(self, sub, chunks)

    monkeypatch.setattr(Subscriptions, "_chunks_arrived", spy)
    with client.consumer(stream, offset="next") as consumer:
        later = threading.Timer(0.3, publish, (client, stream, [amqp_message(b"one")]))
        later.start()
        batch = next(consumer.batches(timeout=10))
        later.join()
        assert batch.column("body").to_pylist() == [b"one"]
        assert readers == [threading.current_thread()]
        publish(client, stream, [amqp_message(b"two")])  # not waiting now
        wait_until(lambda: consumer._subs.queued(), 10, 0.01)
        assert len(readers) == 2 and readers[1] is not threading.current_thread()
        assert consumer.read(1, timeout=10).column("body").to_pylist() == [b"two"]


def test_consumers_sharing_a_connection_each_get_theirs(client, stream):
    """Two consumers on one connection, each waited on in its own thread:
    neither waits on the other's reading."""
    with client.consumer(stream, offset="next") as a, \
            client.consumer(stream, offset="next") as b:
        assert a._subs[stream].connection is b._subs[stream].connection
        got: dict[str, list] = {"a": [], "b": []}
        threads = [threading.Thread(target=lambda c=c, k=k: got[k].extend(
                       c.read(1, timeout=10).column("body").to_pylist()))
                   for c, k in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        time.sleep(0.3)
        publish(client, stream, [amqp_message(b"both")])
        for t in threads:
            t.join(15)
    assert got == {"a": [b"both"], "b": [b"both"]}


def test_a_connection_lost_while_the_application_reads_recovers(client, stream):
    """The connection breaks while the application thread reads it: the
    consumer resubscribes on a new one and reads on, nothing lost."""
    import socket
    with client.consumer(stream, offset="first") as consumer:
        conn = consumer._subs[stream].connection
        publish(client, stream, [amqp_message(b"before")])
        assert consumer.read(1, timeout=10).column("body").to_pylist() == [b"before"]
        threading.Timer(0.3, conn._sock.shutdown, (socket.SHUT_RDWR,)).start()
        assert consumer.read(1, timeout=1.5).num_rows == 0  # reading when it broke
        assert not conn.is_open
        publish(client, stream, [amqp_message(b"after")])
        assert consumer.read(1, timeout=30).column("body").to_pylist() == [b"after"]
        assert consumer._subs[stream].connection is not conn


def test_an_unexpected_error_while_resubscribing_ends_the_consumer(
        client, stream, monkeypatch):
    """Recovery hits an error no retry cures and that is no StreamError:
    the consumer ends with it, as a producer's recovery does, rather than
    its maintenance thread dying and the application waiting for records
    that never come."""
    from pystream.subscribing import Subscribing
    publish(client, stream, [amqp_message(b"before")])
    with client.consumer(stream, offset="first") as consumer:
        assert consumer.read(1, timeout=10).column("body").to_pylist() == [b"before"]

        def broken(self, sub):
            raise ValueError("not a stream error")

        monkeypatch.setattr(Subscribing, "subscribe", broken)
        consumer._subs[stream].on_metadata_update(0x06)  # resubscribe
        with pytest.raises(ValueError, match="not a stream error"):
            consumer.read(1, timeout=10)
