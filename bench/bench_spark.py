"""Spark batch read: the rabbitmq_stream data source beside Parquet.

    .venv/bin/python bench/bench_spark.py                   # 10 M x 100 B, 3 runs
    .venv/bin/python bench/bench_spark.py --messages 2000000 --repeat 5

What it measures
----------------
The ``bench-100b`` stream of ``bench_consume.py`` (10 M AMQP messages of a
100-byte body, topped up if short) is read by Spark ``local[2]`` with the
query ``count(*), sum(length(body))`` over its first ``--messages`` records:

* ``parquet``: the same rows (stream, offset, chunk_timestamp, body),
  written once by pyarrow to a Snappy Parquet file cached outside the
  clone, read by Spark's vectorised Parquet reader (which reads only the
  body column).
* ``pystream``: ``spark.read.format("rabbitmq_stream")`` with
  ``minPartitions`` = 4 and ``endingOffsets`` at the same record; every
  column crosses from the Python workers to the JVM.
* ``pystream-body``: the same with ``.schema("body binary")``: the source
  then sends only the bodies, as Parquet reads only them.
* ``python-ceiling``: a Python data source with no I/O at all, yielding
  one prebuilt batch of 100-byte bodies over and over from 4 partitions:
  what Spark's Python-worker-to-JVM path alone allows on this machine,
  the ceiling of any Python data source.

One session serves every run; each reader is warmed up once, then the
readers take turns ``--repeat`` times. Medians of the wall time of the
query; rows/s and the ratio to Parquet are printed. The machine's two cores
run the broker, Spark's JVM and its Python workers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _runs import fmt_rate  # noqa: E402
from bench_consume import DEFAULT_URI, prefill  # noqa: E402

STREAM = "bench-100b"
CACHE = pathlib.Path(os.environ.get("PYSTREAM_BENCH_CACHE",
                                    pathlib.Path.home() / ".cache" / "pystream" / "bench"))


def write_parquet(uri: str, stream: str, count: int, path: pathlib.Path) -> None:
    """The stream's first ``count`` records as the data source returns them."""
    from pystream.spark import arrow_schema, read_range

    schema = arrow_schema()
    name = pa.scalar(stream)
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, schema, compression="snappy") as writer:
        for batch in read_range(uri, stream, 0, count, body="binary"):
            writer.write_batch(pa.RecordBatch.from_arrays(
                [pa.repeat(name, batch.num_rows), *batch.columns], schema=schema))
    tmp.rename(path)


def ceiling_source():
    """A data source whose partitions yield the same batch of bodies."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Reader(DataSourceReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def partitions(self):
            return [InputPartition(i) for i in range(4)]

        def read(self, partition):
            step = 8192  # about the rows of one bench-100b chunk
            body = pa.array([bytes(100)] * step, pa.binary())
            batch = pa.RecordBatch.from_arrays([body], names=["body"])
            left = self.rows // 4  # --messages is a multiple of 4
            while left > 0:
                yield batch if left >= step else batch.slice(0, left)
                left -= step

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ceiling"

        def schema(self) -> str:
            return "body binary"

        def reader(self, schema):
            return Reader(int(self.options["rows"]))

    return Ceiling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default=os.environ.get("PYSTREAM_TEST_URI", DEFAULT_URI))
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write machine-readable results here")
    args = ap.parse_args()

    import pystream
    prefill(args.uri, STREAM, 100, args.messages)
    CACHE.mkdir(parents=True, exist_ok=True)
    parquet = CACHE / f"{STREAM}-{args.messages}.parquet"
    if not parquet.exists():
        print(f"writing {parquet}", flush=True)
        write_parquet(args.uri, STREAM, args.messages, parquet)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession, functions as F
    from pystream.spark import RabbitMQStreamDataSource

    spark = (SparkSession.builder.master("local[2]")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RabbitMQStreamDataSource)
    spark.dataSource.register(ceiling_source())
    uri = pystream.parse_uri(args.uri).uri()  # the source takes no password

    def source(count: int, schema: str | None = None):
        reader = spark.read.format("rabbitmq_stream")
        if schema:
            reader = reader.schema(schema)
        return (reader.option("uri", uri).option("stream", STREAM)
                .option("minPartitions", 4)
                .option("endingOffsets", json.dumps({STREAM: count})).load())

    readers = {
        "parquet": lambda n: spark.read.parquet(str(parquet)),  # holds exactly n
        "pystream": lambda n: source(n),
        "pystream-body": lambda n: source(n, "body binary"),
        "python-ceiling": lambda n: spark.read.format("ceiling").option("rows", n).load(),
    }

    def measure(name: str, count: int) -> float:
        started = time.perf_counter()
        rows, size = readers[name](count).agg(
            F.count("*"), F.sum(F.length("body"))).first()
        seconds = time.perf_counter() - started
        if rows != count or size != 100 * count:
            raise SystemExit(f"{name}: read {rows} rows, {size} bytes; "
                             f"expected {count}, {100 * count}")
        return seconds

    measure("parquet", args.messages)  # JVM and Python workers warm
    for name in ("pystream", "pystream-body", "python-ceiling"):
        measure(name, min(args.messages, 200_000))
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    for run in range(args.repeat):
        for name in readers:
            seconds[name].append(measure(name, args.messages))
            print(f"run {run + 1}: {name:14} {seconds[name][-1]:6.2f} s", flush=True)
    spark.stop()

    medians = {name: statistics.median(s) for name, s in seconds.items()}
    base = args.messages / medians["parquet"]
    print(f"\nSpark local[2], {args.messages:,} records of 100 B, "
          f"count(*) + sum(length(body)), medians of {args.repeat}:\n")
    print("| reader | seconds | rows/s | vs Parquet |")
    print("|---|---|---|---|")
    for name, median in medians.items():
        rate = args.messages / median
        print(f"| {name} | {median:.2f} | {fmt_rate(rate)} | {rate / base:.2f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"messages": args.messages, "seconds": seconds, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
