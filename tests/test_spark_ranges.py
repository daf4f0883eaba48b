"""Offset ranges for parallel readers: planning and reading (no Spark
needed)."""

from __future__ import annotations

import os
import pickle
import ssl
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest

import pystream
from pystream import CertificateVerificationError, ConnectionLost, RequestTimeout
from pystream.ranges import client_for
from pystream.spark import (
    BrokerRef,
    OffsetRange,
    plan_ranges,
    read_range,
    split_ranges,
)
from pystream.spark.options import PropertyIn

from .conftest import (
    BROKERS,
    EXTERNAL_URI,
    MODERN_URI,
    TLS_URI,
    broker_connections,
    run_broker,
)
from .holding import HoldingProxy
from .publishers import amqp_message, publish
from .waiting import wait_until

N = 10_000


def test_split_in_proportion_then_capped():
    ranges = [OffsetRange("a", 0, 900_000), OffsetRange("b", 100, 300_100)]
    parts = split_ranges(ranges, 4, None, 1)
    assert [(r.stream, r.size) for r in parts] == [
        ("a", 300_000), ("a", 300_000), ("a", 300_000), ("b", 300_000)]
    capped = split_ranges(ranges, None, 250_000, 1)
    assert max(r.size for r in capped) <= 250_000
    assert sum(r.size for r in capped) == 1_200_000
    assert capped[-1].end == 300_100


def test_split_keeps_parts_large_enough():
    parts = split_ranges([OffsetRange("a", 0, 250_000)], 100, None, 100_000)
    assert [r.size for r in parts] == [125_000, 125_000]


def test_no_ranges():
    assert split_ranges([], 4, 10, 1) == []


@pytest.fixture
def filled(client, stream):
    for part in range(4):  # several chunks
        publish(client, stream, [amqp_message(b"%05d" % i)
                                 for i in range(part * N // 4, (part + 1) * N // 4)])
    return stream


@pytest.mark.broker
def test_ranges_read_back_the_whole_stream(uri, filled):
    planned = plan_ranges(uri, [filled], min_partitions=7,
                          min_records_per_partition=1)
    assert len(planned) == 7
    assert planned[0].start == 0 and planned[-1].end == N
    bodies = []
    for r in planned:
        for batch in read_range(uri, r.stream, r.start, r.end):
            bodies += batch.column("body").to_pylist()
    assert bodies == [b"%05d" % i for i in range(N)]


@pytest.mark.broker
def test_range_inside_chunks(uri, filled):
    offsets = [o for b in read_range(uri, filled, 1234, 5678)
               for o in b.column("offset").to_pylist()]
    assert offsets == list(range(1234, 5678))


@pytest.mark.broker
def test_bounds_per_stream(uri, filled):
    assert plan_ranges(uri, [filled], {filled: 100}, {filled: 200}) == [
        OffsetRange(filled, 100, 200)]
    assert plan_ranges(uri, [filled], "latest") == []
    with pytest.raises(ValueError):
        plan_ranges(uri, [filled], "newest")


@pytest.mark.broker
def test_range_past_the_end_times_out(uri, filled):
    with pytest.raises(RequestTimeout):
        list(read_range(uri, filled, N - 5, N + 5, timeout=0.5))


@pytest.mark.broker
def test_stored_offsets_at_the_end_do_not_hang_a_range(uri, client, filled):
    """A stored offset writes a tracking chunk at the end of the stream."""
    client.store_offset(filled, "someone", 42)
    planned = plan_ranges(uri, [filled])
    assert planned[0].start == 0 and planned[-1].end >= N
    rows = sum(b.num_rows for r in planned
               for b in read_range(uri, r.stream, r.start, r.end, timeout=5))
    assert rows == N


# --- TLS --------------------------------------------------------------------

#: The TLS listener as a BrokerRef takes it: user guest, no password.
TLS_REF_URI = pystream.parse_uri(TLS_URI).uri()


def test_broker_ref_refuses_tls_settings_that_cannot_work():
    with pytest.raises(ValueError, match="needs a rabbitmq-stream\\+tls:// URI"):
        BrokerRef("rabbitmq-stream://localhost:5552/", ca_file="ca.pem")
    with pytest.raises(ValueError, match="SASL EXTERNAL .* client certificate file"):
        BrokerRef(EXTERNAL_URI, sasl_mechanism="EXTERNAL")
    with pytest.raises(ValueError, match="SASL EXTERNAL .* rabbitmq-stream\\+tls://"):
        BrokerRef("rabbitmq-stream://localhost:5552/", sasl_mechanism="EXTERNAL")
    with pytest.raises(ValueError, match="one of PLAIN, EXTERNAL, not 'SCRAM'"):
        BrokerRef(EXTERNAL_URI, sasl_mechanism="SCRAM")
    with pytest.raises(ValueError, match="key needs its certificate"):
        BrokerRef(TLS_REF_URI, key_file="client.key").connection_options()


def test_missing_tls_file_is_named(tmp_path):
    ref = BrokerRef(TLS_REF_URI, ca_file=str(tmp_path / "ca.pem"))
    with pytest.raises(ValueError, match=f"cannot load the TLS CA file "
                       f"{tmp_path}/ca.pem: No such file or directory"):
        plan_ranges(ref, ["any"])


@pytest.fixture
def tls_filled(tls_dir, modern_stream) -> str:
    """``N`` messages in several chunks, published over TLS."""
    context = pystream.tls_context(str(tls_dir / "ca.pem"))
    with pystream.connect(TLS_URI, ssl_context=context) as client, \
            client.producer(modern_stream) as producer:
        for part in range(4):
            producer.send_batch([b"%05d" % i for i in range(part * N // 4,
                                                            (part + 1) * N // 4)])
            producer.flush()
    return modern_stream


def read_planned(broker: BrokerRef, stream: str, **options) -> list[bytes]:
    planned = plan_ranges(broker, [stream], min_partitions=3,
                          min_records_per_partition=1, **options)
    assert len(planned) == 3
    return [body for r in planned
            for batch in read_range(broker, r.stream, r.start, r.end, **options)
            for body in batch.column("body").to_pylist()]


@pytest.mark.broker
def test_ranges_over_tls(tls_dir, tls_filled):
    """PLAIN over TLS, trusting the test CA named by its path; the ref
    pickles as the path alone."""
    broker = BrokerRef(TLS_REF_URI, ca_file=str(tls_dir / "ca.pem"))
    assert pickle.loads(pickle.dumps(broker)) == broker
    assert read_planned(broker, tls_filled) == [b"%05d" % i for i in range(N)]
    client = client_for(broker)
    assert isinstance(client.connection._sock, ssl.SSLSocket)
    assert client is client_for(broker)  # one context and client per process


@pytest.mark.broker
def test_ranges_over_tls_with_external(tls_dir, cert_user, tls_filled, monkeypatch):
    """No password anywhere: every connection logs in as the client
    certificate's CN."""
    monkeypatch.delenv("PYSTREAM_PASSWORD", raising=False)
    broker = BrokerRef(EXTERNAL_URI, password_env=None,
                       ca_file=str(tls_dir / "ca.pem"),
                       cert_file=str(tls_dir / "client.pem"),
                       key_file=str(tls_dir / "client.key"),
                       sasl_mechanism="EXTERNAL")
    name = f"pystream-ranges-external-{uuid.uuid4().hex[:8]}"
    options = {"connection_options": {"connection_name": name}}
    assert read_planned(broker, tls_filled, **options) == [
        b"%05d" % i for i in range(N)]
    seen = broker_connections(name)
    assert seen and all(c["user"] == cert_user and c["ssl"] for c in seen), seen


@pytest.mark.broker
def test_wrong_ca_fails_when_planning(tls_dir):
    """The hint names the settings a Spark user has, not ssl_context=; the
    error pickles whole, as it travels from executors."""
    broker = BrokerRef(TLS_REF_URI, ca_file=str(tls_dir / "wrong-ca.pem"))
    with pytest.raises(CertificateVerificationError,
                       match="certificate did not verify: self-signed") as raised:
        plan_ranges(broker, ["any"])
    error = raised.value
    assert error.untrusted and error.reason.startswith("self-signed")
    assert str(error).endswith("(name the CA that signed it: the data source "
                               "option tlsCaFile, or BrokerRef(ca_file=...))")
    assert "ssl_context" not in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.reason, copy.untrusted) == (
        str(error), error.reason, True)


# --- a broker that pauses in mid-range ----------------------------------------

#: Longer than any quiet spell a range read lets pass before it acts
#: (FILTERED_QUIET, CHECK_EVERY), well under the heartbeat.
PAUSE = 3.5
BATCH = 500  # records per published batch: a chunk each, of one color
BATCHES = 400  # many more chunks than a consumer has credit for (64)
PAUSED_N = BATCH * BATCHES


class Pause:
    """Pauses the modern broker the first time ``once`` is called, and
    resumes it ``PAUSE`` seconds later, or on leaving the ``with`` at the
    latest (other engineers share the broker)."""

    def __init__(self) -> None:
        self.timer: threading.Timer | None = None

    def once(self) -> None:
        if self.timer is None:
            run_broker("pause", "modern")
            self.timer = threading.Timer(PAUSE, run_broker, ("resume", "modern"))
            self.timer.start()

    def __enter__(self) -> Pause:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()
            run_broker("resume", "modern")  # SIGCONT twice is harmless


def color(i: int) -> str:
    """Batch ``i``'s filter value: every other one blue, the last ones red
    (so a filtered range over the stream ends past its last blue chunk)."""
    return "blue" if i % 2 == 0 and i < BATCHES - 10 else "red"


def tag(i: int) -> str:
    """Blue batches near the end are tagged ``keep``, the others ``drop``."""
    return "keep" if color(i) == "blue" and i >= BATCHES - 40 else "drop"


@pytest.fixture(scope="module")
def colored():
    """PAUSED_N records on the modern broker, in chunks of one color each;
    the offsets of the blue ones and of the kept ones."""
    name = f"test-ranges-paused-{os.getpid()}"
    with pystream.connect(MODERN_URI) as client:
        client.create_stream(name)
        try:
            with client.producer(name, filter_value="color") as producer:
                for i in range(BATCHES):
                    keys = pa.array(["color", "tag"] * BATCH)
                    values = pa.array([color(i), tag(i)] * BATCH)
                    props = pa.MapArray.from_arrays(
                        np.arange(0, 2 * BATCH + 1, 2, dtype=np.int32), keys, values)
                    bodies = pa.array([b"%06d" % j for j in range(i * BATCH, (i + 1) * BATCH)])
                    producer.send_batch(pa.RecordBatch.from_arrays(
                        [bodies, props], names=["body", "application_properties"])
                    ).result(30)
            blue = [j for j in range(PAUSED_N) if color(j // BATCH) == "blue"]
            kept = [j for j in range(PAUSED_N) if tag(j // BATCH) == "keep"]
            yield name, blue, kept
        finally:
            client.delete_stream(name)


def offsets_read(stream: str, start: int, end: int, pause: Pause,
                 **options) -> list[int]:
    """The offsets a range read returns; the broker pauses once the first
    batch came (after the consumer has taken all its credit allows)."""
    out: list[int] = []
    for batch in read_range(MODERN_URI, stream, start, end, **options):
        out += batch.column("offset").to_pylist()
        pause.once()
    return out


@pytest.mark.broker
@pytest.mark.parametrize("start,end", [
    (0, PAUSED_N),                        # the whole stream
    (1234, PAUSED_N - 777),               # both ends inside chunks
    (PAUSED_N // 3 + 5, PAUSED_N - 3),   # from inside a chunk to the end
])
@pytest.mark.slow
def test_paused_broker_range_is_exact(colored, start, end):
    """An unfiltered range read is every offset of [start, end) whatever
    pauses the broker; ``filter=None`` is how the Spark source calls it."""
    stream, _, _ = colored
    with Pause() as pause:
        assert offsets_read(stream, start, end, pause, filter=None) == list(range(start, end))
    assert pause.timer is not None  # the pause did happen in mid-range


@pytest.mark.slow
@pytest.mark.broker
def test_paused_broker_filtered_range_holds_every_match(colored):
    """The broker's filter skips whole chunks without a word: a pause is
    no end. Without a post filter, the read may hold other rows too."""
    stream, blue, _ = colored
    with Pause() as pause:
        got = offsets_read(stream, 0, PAUSED_N, pause, filter=pystream.Filter(["blue"]))
    assert got == sorted(set(got)) and 0 <= got[0] and got[-1] < PAUSED_N
    assert set(blue) <= set(got), f"{len(set(blue) - set(got))} blue rows missing"


@pytest.mark.slow
@pytest.mark.broker
def test_paused_broker_filtered_range_with_post_filter_is_exact(colored):
    stream, blue, _ = colored
    only_blue = pystream.Filter(["blue"], post_filter=PropertyIn("color", ("blue",), False))
    with Pause() as pause:
        assert offsets_read(stream, 0, PAUSED_N, pause, filter=only_blue,
                            columns=["application_properties"]) == blue


@pytest.mark.slow
@pytest.mark.broker
def test_post_filter_that_drops_every_row_is_progress(colored):
    """The broker sends blue chunks whose rows the post filter drops, for
    most of the range: no row comes, the position moves. The pause starts
    at the first chunk the post filter sees."""
    stream, _, kept = colored
    keep = PropertyIn("tag", ("keep",), False)
    with Pause() as pause:

        def pausing(batch: pa.RecordBatch) -> pa.Array:
            pause.once()
            return keep(batch)

        got = offsets_read(stream, 0, PAUSED_N, pause,
                           filter=pystream.Filter(["blue"], post_filter=pausing),
                           columns=["application_properties"])
    assert got == kept


@pytest.mark.slow
@pytest.mark.broker
def test_paused_broker_past_read_timeout_raises(colored):
    """``timeout`` (``readTimeout``) bounds how long a read makes no
    progress: a longer pause raises, it never ends the range short."""
    stream, _, _ = colored
    # A small credit budget, so that the rest of the range is still the
    # broker's to send when the pause strikes.
    with Pause() as pause, pytest.raises(RequestTimeout, match="no progress"):
        offsets_read(stream, 0, PAUSED_N, pause, filter=None, timeout=1.5,
                     credit=pystream.Credit.adaptive(max_buffered_bytes=256 << 10))


@pytest.mark.slow
@pytest.mark.broker
def test_paused_broker_spark_task_is_exact(colored):
    """A Spark task (the data source's read of one partition) under a pause
    returns its whole range."""
    from pyspark.sql.datasource import InputPartition

    from pystream.spark.datasource import _Config, arrow_schema

    stream, _, _ = colored
    config = _Config.parse({"uri": pystream.parse_uri(MODERN_URI).uri(),
                            "stream": stream}, streaming=False)
    got: list[int] = []
    with Pause() as pause:
        for batch in config.read(InputPartition(OffsetRange(stream, 10, PAUSED_N)),
                                 arrow_schema()):
            got += batch.column("offset").to_pylist()
            pause.once()
    assert got == list(range(10, PAUSED_N))


# --- planning while the broker holds back what it owes ------------------------


@pytest.fixture(params=["legacy", "modern"])
def probed(request):
    """A stream of N records in several chunks on each broker whose
    planning reads chunks (3.10: the first and the last; 4.0: the last)."""
    node = request.param
    name = f"test-probed-{node}-{uuid.uuid4().hex[:8]}"
    with pystream.connect(BROKERS[node]) as client:
        client.create_stream(name)
        try:
            for part in range(4):
                publish(client, name, [amqp_message(b"%05d" % i)
                                       for i in range(part * N // 4, (part + 1) * N // 4)])
            yield node, name
        finally:
            client.delete_stream(name, missing_ok=True)


@pytest.mark.slow
@pytest.mark.broker
def test_plan_is_exact_while_the_broker_holds_back_chunks(probed):
    """A plan is the stream's real bounds, however long the broker takes
    to send the chunk a probe is owed: its end is never taken from
    silence (a paused broker once made the plan empty)."""
    node, stream = probed
    with HoldingProxy(node) as proxy:
        planned = plan_ranges(proxy.uri, [stream],
                              connection_options={"address_resolver": proxy.resolve})
        assert proxy.held  # the broker was paused while planning
    assert planned == [OffsetRange(stream, 0, N)]


@pytest.mark.slow
@pytest.mark.broker
def test_plan_past_its_timeout_raises(probed):
    """A broker that stays away past the planning's timeout raises
    ``RequestTimeout``; it never makes the plan short."""
    node, stream = probed
    with HoldingProxy(node) as proxy, pytest.raises(RequestTimeout):
        plan_ranges(proxy.uri, [stream], connection_options={
            "address_resolver": proxy.resolve, "request_timeout": 1.5})


@pytest.mark.broker
def test_range_of_offset_tracking_chunks_only_ends(latest_uri, latest, stream_name):
    """A stream holding offset-tracking chunks only: 4.3's committed
    offset plans a range over them, and the broker shows there is no chunk
    of records to send (a subscription at "last" is sent none before the
    answer to the next request), so the read ends empty, not at its
    timeout."""
    latest.create_stream(stream_name)
    try:
        latest.store_offset(stream_name, "reader", 0)
        wait_until(lambda: latest.stream_stats(stream_name)["committed_chunk_id"] >= 0, 10)
        planned = plan_ranges(latest_uri, [stream_name])
        assert planned == [OffsetRange(stream_name, 0, 1)]
        assert [b.num_rows for b in read_range(latest_uri, stream_name, 0, 1,
                                               timeout=5)] == []
    finally:
        latest.delete_stream(stream_name, missing_ok=True)


# --- a broker away (restarting) in mid-read -------------------------------------


@pytest.mark.broker
@pytest.mark.parametrize("away", ["consumer", "supports"])
def test_range_read_rides_out_a_broker_away(modern, modern_stream, monkeypatch, away):
    """What a range read asks of the broker besides its consumer's reading
    (opening the consumer; the idle check, whose admin connection reopens
    while the node is down) fails for a while as during a restart: it is
    asked again with backoff within ``timeout``, and the read returns every
    record of the range once. The second half is written while it fails."""
    half = 100
    publish(modern, modern_stream, [amqp_message(b"%05d" % i) for i in range(half)])
    client = client_for(MODERN_URI)
    back = time.monotonic() + 2.5
    real = getattr(client, away)

    def restarting(*args, **kwargs):
        if time.monotonic() < back:
            raise ConnectionLost("injected: the node is restarting")
        return real(*args, **kwargs)

    monkeypatch.setattr(client, away, restarting)
    writer = threading.Timer(1.5, publish, (modern, modern_stream, [
        amqp_message(b"%05d" % i) for i in range(half, 2 * half)]))
    writer.start()
    try:
        got = [b.column("body").to_pylist()
               for b in read_range(MODERN_URI, modern_stream, 0, 2 * half, timeout=20,
                                   amqp=True, body="binary")]
    finally:
        writer.join()
    assert sum(got, []) == [b"%05d" % i for i in range(2 * half)]
