"""Spark batch read: the rabbitmq_stream data source beside Parquet.

    .venv/bin/python -m bench.bench_spark                   # 10 M x 100 B, 3 runs
    .venv/bin/python -m bench.bench_spark --messages 2000000 --repeat 5

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
  one prebuilt batch of 100-byte bodies over and over from 4 partitions,
  of as many rows as ``rabbitmq_stream`` 's batches (``BATCH_ROWS``):
  what Spark's Python-worker-to-JVM path alone allows on this machine,
  the ceiling of any Python data source.

One session serves every run; each reader is warmed up once, then the
readers take turns ``--repeat`` times. Medians of the wall time of the
query; rows/s and the ratio to Parquet are printed and stored
(bench/results/spark.json, with the broker's CPU time and the load average
of each run). The machine's two cores run the broker, Spark's JVM and its
Python workers at once.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pyarrow as pa
import pyarrow.parquet as pq

from bench import harness
from bench.bench_consume import prefill

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

    from pystream.spark.datasource import BATCH_ROWS

    class Reader(DataSourceReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def partitions(self):
            return [InputPartition(i) for i in range(4)]

        def read(self, partition):
            step = BATCH_ROWS  # the batches rabbitmq_stream hands Spark
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


READERS = ("parquet", "pystream", "pystream-body", "python-ceiling")


def main() -> None:
    ap = harness.parser(__doc__, clients=READERS, repeat=3, result="spark")
    ap.add_argument("--messages", type=int, default=10_000_000)
    args = ap.parse_args()
    names = harness.chosen(ap, args)
    info = harness.machine(args.uri)
    harness.banner(info, "spark")
    broker = harness.broker_pid(args.uri)

    import pystream
    prefill(args.uri, STREAM, 100, args.messages)
    CACHE.mkdir(parents=True, exist_ok=True)
    parquet = CACHE / f"{STREAM}-{args.messages}.parquet"
    if not parquet.exists():
        print(f"writing {parquet}", flush=True)
        write_parquet(args.uri, STREAM, args.messages, parquet)

    spark = harness.spark_session({"spark.driver.memory": "2g"})
    from pyspark.sql import functions as F
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

    def measure(name: str, count: int) -> dict:
        load = harness.loadavg()
        b0 = harness.proc_cpu(broker)
        started = time.perf_counter()
        rows, size = readers[name](count).agg(
            F.count("*"), F.sum(F.length("body"))).first()
        seconds = time.perf_counter() - started
        b1 = harness.proc_cpu(broker)
        if rows != count or size != 100 * count:
            return {"error": f"{name}: read {rows} rows, {size} bytes; "
                             f"expected {count}, {100 * count}"}
        out = {"messages": count, "seconds": seconds,
               "load": [load, harness.loadavg()]}
        if b0 is not None and b1 is not None:
            out["broker_cpu"] = b1 - b0
        return out

    measure("parquet", args.messages)  # JVM and Python workers warm
    for name in names:
        measure(name, min(args.messages, 200_000))
    runs = harness.interleave(args.repeat, names,
                              lambda name: measure(name, args.messages))
    spark.stop()

    out = {name: {"summary": harness.summarize(runs[i], 100), "runs": runs[i]}
           for i, name in enumerate(names)}
    base = (out.get("parquet", {}).get("summary") or {}).get("msg_per_s_median")
    print(f"\nSpark local[2], {args.messages:,} records of 100 B, "
          f"count(*) + sum(length(body)), medians of {args.repeat}:\n")
    for name, v in out.items():
        s = v["summary"]
        if s:
            ratio = f"{s['msg_per_s_median'] / base:.2f}" if base else "-"
            print(f"  {name:16} {s['seconds_median']:6.2f} s "
                  f"{harness.fmt_rate(s['msg_per_s_median'])} rows/s  x{ratio} Parquet")
    harness.write_results(args.json, info, {
        "benchmark": "spark", "repeat": args.repeat, "messages": args.messages,
        "readers": out})


if __name__ == "__main__":
    main()
