"""OpenTelemetry metrics, read with the real SDK (InMemoryMetricReader) and
through the Prometheus exporter of ``pystream --metrics-port``; the terminal
views (``pystream watch``, ``tail --stats``); the logs of a recovery; and
pystream working unchanged without opentelemetry installed."""

from __future__ import annotations

import ast
import logging
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import opentelemetry.sdk.metrics as sdk
import pyarrow.compute as pc
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import pystream
from pystream import metrics
from pystream.pool import Endpoint
from pystream.stream_subscription import Queued
from pystream.uri import parse_uri

from .conftest import MODERN_URI, sigint_default
from .test_client import Relay
from .waiting import wait_until

ROOT = pathlib.Path(__file__).resolve().parent.parent
N = 25_000


@pytest.fixture
def reader():
    """pystream's metrics on a fresh SDK meter provider, read in memory."""
    memory = InMemoryMetricReader()
    provider = sdk.MeterProvider(metric_readers=[memory])
    metrics.set_meter_provider(provider)
    yield memory
    provider.shutdown()


@pytest.fixture
def chunk_sizes():
    """rabbitmq.stream.chunk_size recorded (it is off by default)."""
    metrics.record_chunk_sizes()
    yield
    metrics.record_chunk_sizes(False)


def collect(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict, Any]]]:
    """name -> [(attributes, value)]: a counter's or gauge's value, a
    histogram's (count, sum)."""
    out: dict[str, list[tuple[dict, Any]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = (point.value if hasattr(point, "value")
                             else (point.count, point.sum))
                    out.setdefault(metric.name, []).append(
                        (dict(point.attributes), value))
    return out


def value(data: dict, name: str, **attributes: Any) -> Any:
    """The one point of ``name`` whose attributes include ``attributes``
    (written with _ for .)."""
    want = {k.replace("__", "."): v for k, v in attributes.items()}
    hits = [v for attrs, v in data.get(name, [])
            if all(attrs.get(k) == x for k, x in want.items())]
    assert len(hits) == 1, (name, want, data.get(name))
    return hits[0]


@pytest.mark.broker
def test_publish_and_consume_counters_equal_the_records(reader, chunk_sizes, modern,
                                                        modern_stream):
    s = modern_stream
    with modern.producer(s) as producer:
        for _i in range(5):
            producer.send_batch([b"m%d" % j for j in range(N // 5)])
        producer.flush(30)
        data = collect(reader)
        dest = {"messaging__destination__name": s}
        assert value(data, "rabbitmq.stream.published", **dest) == N
        assert value(data, "rabbitmq.stream.confirmed", **dest) == N
        assert value(data, "rabbitmq.stream.outstanding_publish_confirmations",
                     **dest) == 0
        assert value(data, "rabbitmq.stream.written_bytes", **dest) > N
        assert "rabbitmq.stream.errored" not in data or not any(
            a["messaging.destination.name"] == s
            for a, _ in data["rabbitmq.stream.errored"])
    # The connections gauge is the whole process's, which earlier tests'
    # interrupted opens and closes may have moved: what this consumer's
    # connection adds is measured from here.
    connections = sum(v for _, v in collect(reader).get("rabbitmq.stream.connections", []))
    with modern.consumer(s, offset="first", name="counted") as consumer:
        assert consumer.read(N, timeout=30).num_rows == N
        consumer.store_offset()

        def caught_up() -> dict:
            # The offset-tracking chunks the stores wrote count in offsets
            # too, and are taken (no rows) as the reads go on.
            assert consumer.read(1, timeout=0.2).num_rows == 0
            data = collect(reader)
            return data if value(data, "pystream.consumer.lag", **dest) == 0 else {}

        data = wait_until(caught_up, 10, 0.2, what="consumer lag 0")
        assert value(data, "rabbitmq.stream.consumed", **dest) == N
        chunks = value(data, "rabbitmq.stream.chunks", **dest)
        # chunk_size has no attributes (as in .NET): this consumer's alone.
        count, entries = value(data, "rabbitmq.stream.chunk_size")
        # Entries of the offset-tracking chunks included.
        assert chunks == count >= 1 and N <= entries <= N + 10
        assert 0 < value(data, "pystream.consumer.decode_time", **dest) < 10
        assert value(data, "rabbitmq.stream.read_bytes", **dest) > N
        assert value(data, "pystream.consumer.credit_granted", **dest) >= chunks
        assert value(data, "pystream.consumer.stored_offset", **dest) == N - 1
        assert value(data, "pystream.consumer.offsets_stored", **dest) >= 1
        assert value(data, "pystream.consumer.buffered_bytes", **dest) == 0
        assert value(data, "pystream.consumer.max_buffered_bytes", **dest) == 64 << 20
        assert value(data, "pystream.consumer.chunks_in_flight", **dest) >= 0
        assert value(data, "pystream.consumer.bytes_in_flight", **dest) >= 0
        attrs = [a for a, _ in data["rabbitmq.stream.consumed"]
                 if a["messaging.destination.name"] == s][0]
        assert attrs == {"messaging.system": "rabbitmq",
                         "server.address": parse_uri(MODERN_URI).host,
                         "server.port": parse_uri(MODERN_URI).port,
                         "messaging.destination.name": s,
                         "messaging.operation.type": "receive",
                         "messaging.operation.name": "deliver",
                         "messaging.consumer.group.name": "counted"}
        assert sum(v for _, v in data["rabbitmq.stream.connections"]) >= connections + 1


def test_chunk_sizes_held_for_collections_export_as_one_value_per_chunk(
        reader, chunk_sizes):
    """chunk_received holds the chunk_size values for the collections to
    record (and records the oldest itself past CHUNK_SIZE_HELD); every
    collection records what is held first, so each one exports what a value
    recorded per chunk would: count, sum, min, max, even while a reader
    thread races the collections."""
    import threading

    stats = metrics.consumer_stats(parse_uri(MODERN_URI), "held-sizes", None)
    chunks = stats.chunks
    held = metrics.CHUNK_SIZE_HELD
    sizes = [1 + (i * 37) % 9000 for i in range(2 * held + 5 * metrics.CHUNK_SIZE_BURST)]

    def point():
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for p in metric.data.data_points:
                        if metric.name == "rabbitmq.stream.chunk_size":
                            assert not p.attributes
                            return p.count, p.sum, p.min, p.max
        return 0, 0, None, None

    for n in (3, 3 + held, len(sizes)):   # held, up to the bound, past it
        for entries in sizes[point()[0]:n]:
            metrics.chunk_received(stats, entries, 100, 10)
        assert len(stats.chunk_sizes) <= held
        assert point() == (n, sum(sizes[:n]), min(sizes[:n]), max(sizes[:n]))
        assert not stats.chunk_sizes

    more = [7] * 20_000
    feeder = threading.Thread(target=lambda: [
        metrics.chunk_received(stats, e, 100, 10) for e in more])
    feeder.start()
    while feeder.is_alive():
        point()
    feeder.join()
    total = sizes + more
    assert point() == (len(total), sum(total), min(total), max(total))
    assert stats.chunks - chunks == len(total)


def test_chunk_size_is_recorded_only_when_asked_for(reader):
    """By default a chunk bumps the counters and holds nothing for the
    chunk_size histogram, which exports no point; asked for, it does."""
    stats = metrics.consumer_stats(parse_uri(MODERN_URI), "unasked-sizes", None)
    metrics.chunk_received(stats, 500, 100, 10)
    assert not stats.chunk_sizes
    data = collect(reader)
    assert "rabbitmq.stream.chunk_size" not in data
    assert value(data, "rabbitmq.stream.chunks",
                 messaging__destination__name="unasked-sizes") == 1
    metrics.record_chunk_sizes()
    try:
        metrics.chunk_received(stats, 700, 100, 10)
        assert value(collect(reader), "rabbitmq.stream.chunk_size") == (1, 700)
    finally:
        metrics.record_chunk_sizes(False)
    metrics.chunk_received(stats, 900, 100, 10)
    assert not stats.chunk_sizes


@pytest.mark.broker
def test_filtered_records_are_counted(reader, chunk_sizes, modern, modern_stream):
    s = modern_stream
    with modern.producer(s, filter_value="colour") as producer:
        for colour in ("red", "blue"):
            producer.send_batch(pystream_batch(colour, 1000))
    def post(batch):
        colour = pc.map_lookup(batch.column("application_properties"),
                               "colour", "first")
        return pc.equal(colour, "red")

    with modern.consumer(s, offset="first", columns=["application_properties"],
                         filter=pystream.Filter(
            ["red"], post_filter=post)) as consumer:
        got = consumer.read(1000, timeout=30).num_rows
        time.sleep(0.5)
        got += consumer.read(1000, timeout=0.5).num_rows
    assert got == 1000
    data = collect(reader)
    dest = {"messaging__destination__name": s}
    filtered = value(data, "pystream.consumer.filtered", **dest)
    # The broker filters whole chunks: what it let through of blue, and no
    # more, was dropped here.
    assert value(data, "rabbitmq.stream.consumed", **dest) == 1000
    chunk_entries = value(data, "rabbitmq.stream.chunk_size")[1]
    assert filtered == chunk_entries - 1000


@pytest.mark.broker
def test_records_and_chunks_read_again_after_a_rewind_count_once(
        reader, modern, modern_stream):
    """An exception amid a read (the post filter's, on the second chunk)
    takes back what the read took and drops the chunks queued; the next
    read gets every record from the first again. The counters say what the
    application got: each record and chunk once, as a read without the
    fault counts them."""
    s = modern_stream
    per_chunk, chunks = 2000, 5
    n = per_chunk * chunks
    with modern.producer(s) as producer:
        for c in range(chunks):
            producer.send_batch([b"r%d" % (c * per_chunk + j)
                                 for j in range(per_chunk)]).result(30)
    calls = 0

    def failing_once(batch):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("the application's filter failed")
        return batch

    flaky = pystream.Filter(["none"], match_unfiltered=True, post_filter=failing_once)
    with modern.consumer(s, offset="first", name="rewound", auto_store=False,
                         filter=flaky) as consumer:
        # Every chunk queued, to be dropped.
        wait_until(lambda: sum(q.chunk.num_records for q in list(consumer._subs._queue)
                               if isinstance(q, Queued)) >= n, 10, 0.01)
        with pytest.raises(RuntimeError):
            consumer.read(n, timeout=10)
        table = consumer.read(n, timeout=10)
    assert table.column("offset").to_pylist() == list(range(n))
    with modern.consumer(s, offset="first", name="clean",
                         auto_store=False) as consumer:
        assert consumer.read(n, timeout=10).num_rows == n
    data = collect(reader)
    counted = {name: {metric: value(data, metric, messaging__destination__name=s,
                                    messaging__consumer__group__name=name)
                      for metric in ("rabbitmq.stream.consumed",
                                     "rabbitmq.stream.chunks",
                                     "rabbitmq.stream.read_bytes")}
               for name in ("rewound", "clean")}
    assert counted["clean"]["rabbitmq.stream.consumed"] == n
    assert counted["clean"]["rabbitmq.stream.chunks"] >= chunks
    assert counted["rewound"] == counted["clean"]


def pystream_batch(colour: str, n: int):
    import pyarrow as pa
    return pa.RecordBatch.from_pydict({
        "body": pa.array([b"%s %d" % (colour.encode(), i) for i in range(n)]),
        "application_properties": pa.array(
            [[("colour", colour)]] * n, pa.map_(pa.string(), pa.string()))})


class DroppingRelay(Relay):
    """A relay whose connections can be dropped while it keeps accepting:
    a network failure the client recovers from."""

    def drop(self) -> None:
        for sock in list(self.sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sockets.clear()


@pytest.mark.broker
def test_recovery_is_counted_timed_and_logged_once(reader, modern, modern_stream,
                                                   caplog):
    caplog.set_level(logging.INFO, logger="pystream")
    s = modern_stream
    relay = DroppingRelay(parse_uri(MODERN_URI).port)
    try:
        with pystream.connect(
                f"rabbitmq-stream://guest:guest@127.0.0.1:{relay.port}/",
                address_resolver=lambda e: Endpoint("127.0.0.1", relay.port)
        ) as client, client.producer(s) as producer, client.consumer(
                s, offset="first", name="recovering") as consumer:
            producer.send_batch([b"before"] * 100).result(30)
            assert consumer.read(100, timeout=30).num_rows == 100
            relay.drop()
            def sent() -> bool:
                producer.send_batch([b"after"] * 10).result(30)
                return True

            wait_until(sent, 60, 0.2, ignore=(pystream.StreamError,))
            table = consumer.read(10, timeout=60)
            assert table.column("offset").to_pylist() == list(range(100, 110))
            data = collect(reader)
    finally:
        relay.close()
    dest = {"messaging__destination__name": s, "server__port": relay.port}
    assert value(data, "pystream.recoveries", pystream__role="consumer",
                 pystream__recovery__cause="connection_lost", **dest) == 1
    assert value(data, "pystream.recoveries", pystream__role="producer",
                 pystream__recovery__cause="connection_lost", **dest) == 1
    for role in ("consumer", "producer"):
        count, seconds = value(data, "pystream.recovery.duration",
                               pystream__role=role, **dest)
        assert count == 1 and 0 < seconds < 60
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "recovered" in r.getMessage()]
    assert sorted(r.name for r in warnings) == ["pystream.consumer",
                                                "pystream.producer"]
    said = {r.name: r.getMessage() for r in warnings}
    assert re.fullmatch(
        rf"consumer 'recovering' of stream '{s}' recovered from connection "
        rf"lost: resubscribed from offset 100 after \d+\.\d\d s",
        said["pystream.consumer"]), said
    assert re.fullmatch(
        rf"producer of stream '{s}' recovered from connection lost: "
        rf"(nothing to send again|sent \d+ unconfirmed batches again from "
        rf"publishing id \d+) after \d+\.\d\d s", said["pystream.producer"]), said
    assert {r.name for r in caplog.records} <= {
        "pystream.connection", "pystream.consumer", "pystream.producer"}


@pytest.mark.broker
def test_lag_is_reported_while_behind(reader, modern, modern_stream):
    s = modern_stream
    with modern.producer(s) as producer:
        producer.send_batch([b"x"] * 5000).result(30)
    with modern.consumer(s, offset="first") as consumer:
        first = consumer.read(1, timeout=30)
        assert first.num_rows == 1
        data = collect(reader)
        lag = value(data, "pystream.consumer.lag", messaging__destination__name=s)
        assert 0 < lag <= 4999
        consumer.read(5000, timeout=5)
        assert value(collect(reader), "pystream.consumer.lag",
                     messaging__destination__name=s) == 0


# --- the command line ---------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int, until: str, process: subprocess.Popen,
           timeout: float = 60) -> str:
    """The Prometheus text at http://127.0.0.1:PORT/ once it matches
    ``until`` (while ``process`` serves it)."""
    def served() -> str:
        if process.poll() is not None:
            raise AssertionError(f"the command ended: {process.communicate()}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=5) as answer:
            text = answer.read().decode()
        return text if re.search(until, text, re.M) else ""

    return wait_until(served, timeout, 0.2, what=f"{until!r} served",
                      ignore=(OSError,))


@pytest.mark.broker
def test_metrics_port_serves_prometheus_text(modern, modern_stream):
    s = modern_stream
    with modern.producer(s) as producer:
        producer.send_batch([b"line %d" % i for i in range(3000)]).result(30)
    port = free_port()
    tail = subprocess.Popen(
        [sys.executable, "-m", "pystream.cli", "--uri", MODERN_URI,
         "--metrics-port", str(port), "tail", s, "--from", "first",
         "--format", "raw"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=sigint_default)
    try:
        stream = re.escape(f'messaging_destination_name="{s}"')
        text = scrape(port, rf"^rabbitmq_stream_consumed_total{{.*{stream}.*}} 3000\.0$",
                      tail)
        assert re.search(rf"^pystream_consumer_lag{{.*{stream}.*}} 0\.0$", text, re.M)
        assert re.search(r"^rabbitmq_stream_connections{.*} [1-9]", text, re.M)
        assert re.search(r"^rabbitmq_stream_chunk_size_count({.*})? [1-9]", text, re.M)
        # Bound to loopback only.
        assert socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        # Ctrl-C ends it at once: the server's thread does not take SIGINT
        # from the main thread, which waits for chunks.
        tail.send_signal(signal.SIGINT)
        _, err = tail.communicate(timeout=30)
    assert tail.returncode == 0, err


def read_and_store(client, stream: str, name: str, records: int, *,
                   wait: bool = True) -> None:
    """1000 records in ``stream``; consumer ``name`` reads ``records`` and
    stores its offset (written without an answer: ``wait`` until it shows)."""
    with client.producer(stream) as producer:
        producer.send_batch([b"x"] * 1000).result(30)
    with client.consumer(stream, offset="first", name=name) as consumer:
        consumer.read(records, timeout=30)
        consumer.store_offset()
    if wait:
        wait_until(lambda: client.query_offset(stream, name) == records - 1, 10,
                   ignore=(pystream.NoOffset,))


@pytest.mark.broker
def test_watch_shows_stored_offset_lag_and_rates(modern, modern_stream, capsys):
    from pystream import cli
    s = modern_stream
    read_and_store(modern, s, "watched", 600)
    assert cli.main(["--uri", MODERN_URI, "watch", s, "--consumer", "watched",
                     "--consumer", "never", "--iterations", "2",
                     "--interval", "0.2"]) == 0
    out = capsys.readouterr().out
    screens = out.split("pystream watch ")[1:]
    assert len(screens) == 2
    last = screens[-1]
    # The tracking chunk of the stored offset is the last committed chunk.
    committed = modern.stream_stats(s)["committed_chunk_id"]
    assert re.search(rf"^{re.escape(s)}\s+0\s+{committed:,}\s+0$", last, re.M), last
    assert re.search(rf"^watched\s+599\s+{committed - 600:,}\s+0$", last, re.M), last
    assert re.search(rf"^never\s+-\s+{committed:,}\s+-$", last, re.M), last


@pytest.mark.broker
def test_watch_of_a_missing_stream_fails(capsys):
    from pystream import cli
    assert cli.main(["--uri", MODERN_URI, "watch", "no-such-stream-x",
                     "--iterations", "1"]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.broker
def test_tail_stats_line(modern, modern_stream, capsys):
    from pystream import cli
    s = modern_stream
    with modern.producer(s) as producer:
        producer.send_batch([b"x"] * 500).result(30)
    assert cli.main(["--uri", MODERN_URI, "tail", s, "--from", "first",
                     "--count", "500", "--stats", "--format", "raw"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(r"position 500  [\d,]+ msg/s  lag 0  printed 500", err[-1]), err


# --- without OpenTelemetry, and the import graph ---------------------------------------

@pytest.mark.broker
def test_nothing_needed_without_opentelemetry(modern_stream):
    """With opentelemetry unimportable, pystream imports, publishes and
    consumes, and its metrics are never made."""
    code = f"""
import sys
sys.modules["opentelemetry"] = None  # as if not installed
import pystream
from pystream import metrics
with pystream.connect({MODERN_URI!r}) as c:
    with c.producer({modern_stream!r}) as p:
        p.send_batch([b"a"] * 10).result(30)
    with c.consumer({modern_stream!r}, offset="first") as co:
        assert co.read(10, timeout=30).num_rows == 10
assert metrics.instruments() is None
assert not any(m.startswith("opentelemetry.") for m in sys.modules)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.stdout.strip() == "ok", done.stderr


def imports_of(path: pathlib.Path, package: str) -> set[str]:
    """The pystream modules ``path`` imports, anywhere in it (functions and
    TYPE_CHECKING blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if path.name != "__init__.py" or node.level > 1:
                    base = base[:len(base) - (node.level - 1)]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            names = [f"{root}.{a.name}" for a in node.names]
            found.update(names if not node.module else [root, *names])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("pystream")}


def test_import_graph_has_no_cycles():
    """No module imports, even lazily, one that imports it back. The
    package's ``__init__`` (the facade importing everything) is left out."""
    modules = {}
    for path in (ROOT / "pystream").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else ".".join(parts[:-1])
        modules[name] = (path, package)
    graph = {}
    for name, (path, package) in modules.items():
        targets = set()
        for target in imports_of(path, package):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]  # an attribute, not a module
            if target in modules and target != "pystream" and target != name:
                targets.add(target)
        graph[name] = targets
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(
                    trail[trail.index(nxt):] + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [])
    assert "pystream.consumer" in graph["pystream.client"]
    assert "pystream.arrow" in graph["pystream.producer"]


@pytest.mark.broker
def test_refused_messages_are_counted_as_errored(reader, modern, modern_stream):
    """The broker refuses what a publisher it no longer knows sends (code
    0x12): to a producer with ``recovery_timeout=0`` (any other sends them
    again, tests/test_producer.py), those
    messages are errored, by code, and no longer outstanding."""
    from pystream import protocol as P
    s = modern_stream
    producer = modern.producer(s, recovery_timeout=0)
    try:
        producer.send_batch([b"kept"] * 5).result(30)
        conn, pid = producer._link.connection, producer._link.publisher_id
        conn.request(lambda c: P.DeletePublisher(c, pid), "delete the publisher")
        with pytest.raises(pystream.PublishError) as refused:
            producer.send_batch([b"refused"] * 7).result(30)
        assert refused.value.code == 0x12
        data = collect(reader)
    finally:
        producer.close()
    dest = {"messaging__destination__name": s}
    assert value(data, "rabbitmq.stream.published", **dest) == 12
    assert value(data, "rabbitmq.stream.confirmed", **dest) == 5
    assert value(data, "rabbitmq.stream.errored", error__type="code 0x12",
                 messaging__operation__name="confirm", **dest) == 7
    assert value(data, "rabbitmq.stream.outstanding_publish_confirmations",
                 **dest) == 0


@pytest.mark.broker
def test_watch_serves_its_consumers_over_the_metrics_port(modern, modern_stream):
    s = modern_stream
    read_and_store(modern, s, "scraped", 400, wait=False)
    port = free_port()
    watch = subprocess.Popen(
        [sys.executable, "-m", "pystream.cli", "--uri", MODERN_URI,
         "--metrics-port", str(port), "watch", s, "--consumer", "scraped",
         "--interval", "0.2", "--iterations", "300"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=sigint_default)
    try:
        group = re.escape('messaging_consumer_group_name="scraped"')
        text = scrape(port, rf"^pystream_consumer_stored_offset{{.*{group}.*}} 399\.0$",
                      watch)
        committed = modern.stream_stats(s)["committed_chunk_id"]
        assert re.search(rf"^pystream_consumer_lag{{.*{group}.*}} "
                         rf"{committed - 400}\.0$", text, re.M), text
        # Counters belong to the consuming process, not to the watcher.
        assert not re.search(rf"^rabbitmq_stream_consumed_total{{.*{group}", text, re.M)
    finally:
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
