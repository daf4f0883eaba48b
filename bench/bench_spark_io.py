"""Spark writing to a stream, Spark reading against the Python data source
ceiling, and DuckDB reading a range, each beside pystream alone, in one run.

    .venv/bin/python bench/bench_spark_io.py --messages 2000000 --repeat 3

What it measures (records of 100 B; medians of ``--repeat`` runs):

* ``producer``: pystream's producer publishing ``--messages`` bodies in
  batches of 10 000 (``send_batch``, then ``flush``) to a new stream.
* ``spark-write``: ``df.write.format("rabbitmq_stream")`` of the same
  count from a cached DataFrame of 2 partitions, to a new stream.
* ``spark-read``: ``count(*), sum(length(body))`` over the ``bench-100b``
  stream's first ``--messages`` records with ``.schema("body binary")``
  and ``minPartitions`` 4 (as ``bench_spark.py``'s ``pystream-body``).
* ``python-ceiling``: the same query over a Python data source with no I/O
  (``bench_spark.py``'s), the ceiling of any Python data source here.
* ``read-range``: the data source's own work without Spark: the four
  ranges read one after the other in this process, each batch given its
  ``stream`` column as the data source does.
* ``consume``: ``read_range`` over the first ``--duckdb-messages`` records,
  counting rows (pystream's consume rate).
* ``duckdb``: ``SELECT count(*), sum(octet_length(body))`` over the same
  ``read_range`` through the Arrow C stream interface.

Results go to ``--json`` (default ``bench/results/spark_io.json``) with the
commit, versions, machine and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import pyarrow as pa

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _runs import fmt_rate  # noqa: E402
from bench_consume import DEFAULT_URI, prefill  # noqa: E402
from bench_spark import STREAM, ceiling_source  # noqa: E402

TARGET = "bench-spark-io-target"
BODY = bytes(100)


def fresh(client, name: str) -> None:
    client.delete_stream(name, missing_ok=True)
    client.create_stream(name)


def producer_write(uri: str, count: int) -> float:
    import pystream
    bodies = pa.array([BODY] * 10_000, pa.binary())
    with pystream.connect(uri) as client:
        fresh(client, TARGET)
        started = time.perf_counter()
        with client.producer(TARGET) as producer:
            for lo in range(0, count, 10_000):
                producer.send_batch(bodies.slice(0, min(10_000, count - lo)))
            producer.flush()
        return time.perf_counter() - started


def machine() -> dict:
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True,
                                  cwd=HERE).stdout.strip()
        except OSError:
            return ""

    import duckdb
    import pyspark
    import pystream
    return {"commit": run("git", "rev-parse", "HEAD"),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
            "python": platform.python_version(), "pyspark": pyspark.__version__,
            "pyarrow": pa.__version__, "duckdb": duckdb.__version__,
            "pystream": getattr(pystream, "__version__", "")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default=os.environ.get("PYSTREAM_TEST_URI", DEFAULT_URI))
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--duckdb-messages", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=str(HERE / "results" / "spark_io.json"))
    args = ap.parse_args()

    import duckdb

    import pystream
    from pystream.spark import BrokerRef, RabbitMQStreamDataSource, plan_ranges, read_range
    prefill(args.uri, STREAM, 100, max(args.messages, args.duckdb_messages))
    uri = pystream.parse_uri(args.uri).uri()  # the data source takes no password

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession, functions as F
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RabbitMQStreamDataSource)
    spark.dataSource.register(ceiling_source())

    rows = (spark.range(args.messages, numPartitions=2)
            .select(F.lit(BODY).alias("body")).cache())
    rows.count()

    def spark_write(n: int) -> float:
        with pystream.connect(args.uri) as client:
            fresh(client, TARGET)
        started = time.perf_counter()
        (rows.limit(n) if n < args.messages else rows).write.format("rabbitmq_stream") \
            .mode("append").option("uri", uri).option("stream", TARGET).save()
        return time.perf_counter() - started

    def query(df, n: int) -> float:
        started = time.perf_counter()
        count, size = df.agg(F.count("*"), F.sum(F.length("body"))).first()
        seconds = time.perf_counter() - started
        assert (count, size) == (n, 100 * n), (count, size)
        return seconds

    def spark_read(n: int) -> float:
        return query(spark.read.format("rabbitmq_stream").schema("body binary")
                     .option("uri", uri).option("stream", STREAM)
                     .option("minPartitions", 4)
                     .option("endingOffsets", json.dumps({STREAM: n})).load(), n)

    def ceiling(n: int) -> float:
        return query(spark.read.format("ceiling").option("rows", n).load(), n)

    def range_alone(n: int) -> float:
        broker = BrokerRef(uri)
        started = time.perf_counter()
        name = pa.scalar(STREAM)
        total = 0
        for r in plan_ranges(broker, [STREAM], 0, n, min_partitions=4):
            for batch in read_range(broker, r.stream, r.start, r.end, body="binary"):
                out = pa.RecordBatch.from_arrays(
                    [pa.repeat(name, batch.num_rows), *batch.columns],
                    names=["stream", *batch.schema.names])
                total += out.num_rows
        assert total == n
        return time.perf_counter() - started

    def consume(n: int) -> float:
        started = time.perf_counter()
        total = sum(b.num_rows for b in read_range(args.uri, STREAM, 0, n))
        assert total == n
        return time.perf_counter() - started

    def duck(n: int) -> float:
        started = time.perf_counter()
        rows_ = read_range(args.uri, STREAM, 0, n)  # noqa: F841 (DuckDB finds it)
        got = duckdb.sql("SELECT count(*), sum(octet_length(body)) FROM rows_").fetchall()[0]
        assert got == (n, 100 * n), got
        return time.perf_counter() - started

    n, big = args.messages, args.duckdb_messages
    cases = {"producer": (lambda: producer_write(args.uri, n), n),
             "spark-write": (lambda: spark_write(n), n),
             "spark-read": (lambda: spark_read(n), n),
             "python-ceiling": (lambda: ceiling(n), n),
             "read-range": (lambda: range_alone(n), n),
             "consume": (lambda: consume(big), big),
             "duckdb": (lambda: duck(big), big)}
    spark_write(min(n, 100_000))  # warm the JVM and the Python workers
    spark_read(min(n, 200_000))
    ceiling(min(n, 200_000))
    seconds: dict[str, list[float]] = {k: [] for k in cases}
    for run in range(args.repeat):
        for name, (fn, _) in cases.items():
            seconds[name].append(fn())
            print(f"run {run + 1}: {name:14} {seconds[name][-1]:6.2f} s", flush=True)
    spark.stop()
    with pystream.connect(args.uri) as client:
        client.delete_stream(TARGET, missing_ok=True)

    medians = {k: statistics.median(v) for k, v in seconds.items()}
    rates = {k: cases[k][1] / medians[k] for k in cases}
    ratios = {"spark-write / producer": rates["spark-write"] / rates["producer"],
              "spark-read / python-ceiling": rates["spark-read"] / rates["python-ceiling"],
              "duckdb / consume": rates["duckdb"] / rates["consume"]}
    print(f"\n{n:,} records of 100 B ({big:,} for consume and duckdb), "
          f"medians of {args.repeat}:\n")
    print("| case | seconds | rows/s |")
    print("|---|---|---|")
    for k in cases:
        print(f"| {k} | {medians[k]:.2f} | {fmt_rate(rates[k])} |")
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    pathlib.Path(args.json).write_text(json.dumps(
        {**machine(), "messages": n, "duckdb_messages": big, "repeat": args.repeat,
         "seconds": seconds, "medians": medians, "rows_per_second": rates,
         "ratios": ratios}, indent=2) + "\n")


if __name__ == "__main__":
    main()
