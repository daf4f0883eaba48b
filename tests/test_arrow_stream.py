"""Consumers and read_range results as Arrow C streams: DuckDB and Polars
read a stream's records directly, as pyarrow would."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from pystream.arrow import ArrowStream
from pystream.errors import CorruptChunk
from pystream.spark import read_range

from .conftest import MODERN_URI
from .waiting import wait_until

duckdb = pytest.importorskip("duckdb")
pl = pytest.importorskip("polars")

N = 50_000


@pytest.fixture
def filled(modern, modern_stream):
    with modern.producer(modern_stream) as producer:
        for lo in range(0, N, 10_000):
            producer.send_batch([b"%d" % i for i in range(lo, lo + 10_000)])
        producer.flush()
    return modern_stream


def expected_bytes(lo: int, hi: int) -> int:
    return sum(len(b"%d" % i) for i in range(lo, hi))


@pytest.mark.broker
def test_duckdb_reads_a_range_and_a_consumer(modern, filled):
    rows = read_range(MODERN_URI, filled, 1000, 41_000)
    assert rows.schema.field("body").type == pa.binary_view()  # no copy on the way
    got = duckdb.sql('SELECT count(*), sum(octet_length(body)), min("offset"), '
                     'max("offset") FROM rows').fetchall()[0]
    assert got == (40_000, expected_bytes(1000, 41_000), 1000, 40_999)
    # DuckDB finds the consumer by its Python name in the query
    with modern.consumer(filled, offset="first") as consumer:  # noqa: F841
        got = duckdb.sql("SELECT count(*) FROM consumer").fetchall()[0]
    assert got == (N,)


@pytest.mark.broker
def test_polars_reads_a_range(filled):
    frame = pl.DataFrame(read_range(MODERN_URI, filled, 0, N, body="binary"))
    assert frame.height == N
    assert frame["offset"].to_list() == list(range(N))
    assert frame["body"][12_345] == b"12345"


def test_an_arrow_stream_is_read_once():
    batch = pa.record_batch([pa.array([1, 2])], names=["offset"])
    rows = ArrowStream(batch.schema, [batch, batch])
    assert pa.RecordBatchReader.from_stream(rows).read_all().num_rows == 4
    with pytest.raises(RuntimeError, match="read once"):
        rows.read_all()


def handing_over() -> bool:
    return any(t.name == "pystream-arrow-stream" for t in threading.enumerate())


def wait_handed_over(seconds: float = 10.0) -> None:
    wait_until(lambda: not handing_over(), seconds, 0.01, what="handed over")


@pytest.mark.broker
def test_duckdb_stopping_early_ends_the_range_read(filled):
    rows = read_range(MODERN_URI, filled, 0, N)  # noqa: F841 (DuckDB finds it)
    got = duckdb.sql('SELECT "offset" FROM rows LIMIT 10').fetchall()
    assert len(got) == 10
    # the thread reading the range into the stream stops, closing its
    # consumer, though most of the range was never read
    wait_handed_over()


def offsets(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(lo, hi), pa.int64())], names=["offset"])


def test_an_early_stop_closes_the_batches():
    closed = threading.Event()

    def batches():
        try:
            for lo in range(0, 10_000_000, 1000):
                yield offsets(lo, lo + 1000)
        finally:
            closed.set()

    rows = ArrowStream(offsets(0, 1).schema, batches())  # noqa: F841
    assert duckdb.sql("SELECT * FROM rows LIMIT 10").fetchall() == [(i,) for i in range(10)]
    assert closed.wait(10)
    wait_handed_over()


def failing(after: int):
    def batches():
        for lo in range(0, after, 100):
            yield offsets(lo, lo + 100)
        raise CorruptChunk("chunk CRC mismatch", position=123)
    return ArrowStream(offsets(0, 1).schema, batches())


def test_an_error_mid_stream_reaches_the_engine_with_its_type():
    # iterated in Python, the typed error itself
    with pytest.raises(CorruptChunk):
        list(failing(300))
    # engines raise their own exceptions: the message names pystream's
    rows = failing(300)  # noqa: F841
    with pytest.raises(duckdb.Error, match="pystream.errors.CorruptChunk: chunk CRC mismatch"):
        duckdb.sql("SELECT count(*) FROM rows").fetchall()
    reader = pa.RecordBatchReader.from_stream(failing(300))
    assert sum(reader.read_next_batch().num_rows for _ in range(3)) == 300  # nothing lost
    with pytest.raises(OSError, match="pystream.errors.CorruptChunk"):
        reader.read_next_batch()
    with pytest.raises(pl.exceptions.ComputeError, match="pystream.errors.CorruptChunk"):
        pl.DataFrame(failing(300))
    wait_handed_over()


def test_a_requested_schema_casts_the_batches():
    batch = pa.record_batch([pa.array([b"a", b"bc"], pa.binary_view())], names=["body"])
    wanted = pa.schema([("body", pa.binary())])
    rows = ArrowStream(batch.schema, [batch, batch])
    table = pa.RecordBatchReader.from_stream(rows, schema=wanted).read_all()
    assert table.schema == wanted
    assert table.column("body").to_pylist() == [b"a", b"bc"] * 2


def test_an_unread_stream_stops_its_thread():
    rows = ArrowStream(offsets(0, 1).schema, (offsets(i, i + 1) for i in range(100)))
    rows.__arrow_c_stream__()  # dropped at once: released unread
    wait_handed_over()
