"""Consumers and read_range results as Arrow C streams: DuckDB and Polars
read a stream's records directly, as pyarrow would."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pystream.arrow import ArrowStream
from pystream.spark import read_range

from .conftest import MODERN_URI

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
