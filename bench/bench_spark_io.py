"""Spark writing to a stream, Spark reading against the Python data source
ceiling, and DuckDB reading a range, each beside pystream alone.

    .venv/bin/python -m bench.bench_spark_io      # 10 M records each case, 3 runs
    .venv/bin/python -m bench.bench_spark_io --messages 2000000 --write-messages 2000000

What it measures (records of 100 B; medians of ``--repeat`` runs, the
cases taking turns within each run):

* ``producer``: pystream's producer publishing ``--write-messages`` bodies
  in batches of 10 000 (``send_batch``, then ``flush``) to a new stream.
* ``spark-write``: ``df.write.format("rabbitmq_stream")`` of the same
  count from a DataFrame of 2 partitions (``spark.range`` with a literal
  body, made as the write goes: the JVM makes rows far faster than the
  Python workers send them), to a new stream.
* ``spark-read``: ``count(*), sum(length(body))`` over the ``--stream``
  stream's first ``--messages`` records with ``.schema("body binary")``
  and ``minPartitions`` 4 (as ``bench_spark.py``'s ``pystream-body``).
* ``python-ceiling``: the same query over a Python data source with no I/O
  (``bench_spark.py``'s), the ceiling of any Python data source here.
* ``read-range``: the data source's own work without Spark: the four
  ranges read one after the other in one process, each batch given its
  ``stream`` column as the data source does.
* ``consume``: ``read_range`` over the first ``--duckdb-messages`` records,
  counting rows (pystream's consume rate).
* ``duckdb``: ``SELECT count(*), sum(octet_length(body))`` over the same
  ``read_range`` through the Arrow C stream interface.

The Spark cases run in one ``local[2]`` session of this process (warmed up
once); the others each in a fresh process. For the Spark reads, each run
also records the CPU time of the JVM and of its Python workers
(``jvm_cpu``, ``python_cpu``: the two cores are shared by them and the
broker, so the read's extra CPU time, not its wall time alone, says where
it loses to the ceiling). The ratios docs/spark.md states
(write / producer, read / ceiling, duckdb / consume) are of the medians;
``bench/report.py`` renders them, with the targets, from
``bench/results/spark_io.json`` (the runs, the broker's CPU time and the
load average of each, the machine, commit and versions).
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics

import pyarrow as pa

from bench import harness
from bench.bench_consume import prefill
from bench.bench_spark import STREAM, ceiling_source
from bench.harness import PROGRESS, Window

TARGET = "bench-sparkio-target"
BODY = bytes(100)
CASES = ("producer", "spark-write", "spark-read", "python-ceiling",
         "read-range", "consume", "duckdb")
SPARK = ("spark-write", "spark-read", "python-ceiling")
WARM_ROWS = 40_000  # the untimed query before each timed Spark read
# (numerator, denominator) of the ratios docs/spark.md states
RATIOS = (("spark-write", "producer"), ("spark-read", "python-ceiling"),
          ("duckdb", "consume"))


def fresh(uri: str, name: str) -> None:
    def make(client) -> None:
        client.delete_stream(name, missing_ok=True)
        client.create_stream(name)
    harness.admin(uri, make)


# --- the cases without Spark, each in a fresh process ----------------------------


def producer_write(uri: str, count: int) -> dict:
    import pystream
    bodies = pa.array([BODY] * 10_000, pa.binary())
    fresh(uri, TARGET)
    window = Window()
    with pystream.connect(uri) as client:
        window.start()
        with client.producer(TARGET) as producer:
            for lo in range(0, count, 10_000):
                producer.send_batch(bodies.slice(0, min(10_000, count - lo)))
                PROGRESS[0] = lo
            producer.flush()
        return window.stop(count)


def range_alone(uri: str, stream: str, count: int) -> dict:
    import pystream
    from pystream.spark import BrokerRef, plan_ranges, read_range
    broker = BrokerRef(pystream.parse_uri(uri).uri())
    name = pa.scalar(stream)
    window = Window()
    window.start()
    for r in plan_ranges(broker, [stream], 0, count, min_partitions=4):
        for batch in read_range(broker, r.stream, r.start, r.end, body="binary"):
            out = pa.RecordBatch.from_arrays(
                [pa.repeat(name, batch.num_rows), *batch.columns],
                names=["stream", *batch.schema.names])
            PROGRESS[0] += out.num_rows
    res = window.stop(PROGRESS[0])
    return res if PROGRESS[0] == count else {"error": f"read {PROGRESS[0]} of {count}"}


def consume(uri: str, stream: str, count: int) -> dict:
    from pystream.spark import read_range
    window = Window()
    window.start()
    for batch in read_range(uri, stream, 0, count):
        PROGRESS[0] += batch.num_rows
    res = window.stop(PROGRESS[0])
    return res if PROGRESS[0] == count else {"error": f"read {PROGRESS[0]} of {count}"}


def duck(uri: str, stream: str, count: int) -> dict:
    import duckdb

    from pystream.spark import read_range
    window = Window()
    window.start()
    rows_ = read_range(uri, stream, 0, count)  # noqa: F841 (DuckDB finds it)
    got = duckdb.sql("SELECT count(*), sum(octet_length(body)) FROM rows_").fetchall()[0]
    res = window.stop(count)
    return res if got == (count, 100 * count) else {"error": f"duckdb read {got}"}


def child_main(args) -> None:
    if args.child != "duckdb":  # DuckDB reads without telling its progress
        harness.start_watchdog(args.stall)
    n, big = args.messages, args.duckdb_messages
    harness.child_done({
        "producer": lambda: producer_write(args.uri, args.write_messages),
        "read-range": lambda: range_alone(args.uri, args.stream, n),
        "consume": lambda: consume(args.uri, args.stream, big),
        "duckdb": lambda: duck(args.uri, args.stream, big),
    }[args.child]())


# --- the Spark cases, in this process's session ------------------------------------


def _children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (the JVM starts the Python
    daemon from a thread other than its main one)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = pathlib.Path(f"/proc/{pid}/task/{task}/children").read_text()
            out += [int(x) for x in text.split()]
    except OSError:
        pass
    return out


def _cpu_times(pid: int) -> tuple[float, float]:
    """CPU seconds of the JVM child ``pid`` of this process (its own
    threads) and of the Python processes under it, reaped workers included
    (their parent's cutime and cstime)."""
    tick = os.sysconf("SC_CLK_TCK")
    jvm = python = 0.0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            fields = pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        if p == pid:
            jvm = own / tick
        else:
            python += (own + reaped) / tick
        stack += _children(p)
    return jvm, python


def _jvm_pid() -> int | None:
    for pid in _children(os.getpid()):
        try:
            if "java" in pathlib.Path(f"/proc/{pid}/comm").read_text():
                return pid
        except OSError:
            pass
    return None



def spark_cases(args):
    """{case: run(count) -> result} over one warmed-up Spark session."""
    import pystream
    spark = harness.spark_session({"spark.driver.memory": "2g"})
    from pyspark.sql import functions as F
    spark.dataSource.register(ceiling_source())
    uri = pystream.parse_uri(args.uri).uri()  # the data source takes no password
    jvm = _jvm_pid()

    def timed(action, count: int) -> dict:
        """The Window of ``action()`` without its CPU time (this process's
        is the driver's alone), with the JVM's and its Python workers'."""
        load = harness.loadavg()
        before = _cpu_times(jvm) if jvm else None
        window = Window()
        window.start()
        error = action()
        res = window.stop(count)
        res.pop("cpu")
        if before is not None:
            after = _cpu_times(jvm)
            res["jvm_cpu"], res["python_cpu"] = (b - a for a, b in zip(before, after, strict=True))
        res["load"] = [load, harness.loadavg()]
        return {"error": error, "load": res["load"]} if error else res

    def write(n: int) -> dict:
        fresh(args.uri, TARGET)
        rows = spark.range(n, numPartitions=2).select(F.lit(BODY).alias("body"))
        return timed(lambda: rows.write.format("rabbitmq_stream").mode("append")
                     .option("uri", uri).option("stream", TARGET).save(), n)

    def query(df, n: int) -> dict:
        def run():
            count, size = df.agg(F.count("*"), F.sum(F.length("body"))).first()
            if (count, size) != (n, 100 * n):
                return f"read {count} rows, {size} bytes; expected {n}, {100 * n}"
        return timed(run, n)

    def source(n: int):
        return (spark.read.format("rabbitmq_stream").schema("body binary")
                .option("uri", uri).option("stream", args.stream)
                .option("minPartitions", 4)
                .option("endingOffsets", json.dumps({args.stream: n})).load())

    def no_io(n: int):
        return spark.read.format("ceiling").option("rows", n).load()

    def measured(frame, n: int) -> dict:
        # An untimed query of the same kind first: right after the write,
        # the read's Python workers took 0.44 s of CPU per M records against
        # 0.17 after another read (2026-11-23), as if started afresh.
        frame(WARM_ROWS).agg(F.count("*")).first()
        return query(frame(n), n)

    return spark, {"spark-write": write,
                   "spark-read": lambda n: measured(source, n),
                   "python-ceiling": lambda n: measured(no_io, n)}


def summary(runs: list[dict]) -> dict | None:
    """``harness.summarize``, with the medians of the JVM's and the Python
    workers' CPU seconds per million records where the runs have them."""
    out = harness.summarize(runs, 100)
    good = [r for r in runs if "error" not in r]
    if out is not None:
        for key in ("jvm_cpu", "python_cpu"):
            if all(key in r for r in good):
                out[f"{key}_s_per_m_median"] = statistics.median(
                    r[key] / r["messages"] * 1e6 for r in good)
    return out


def main() -> None:
    ap = harness.parser(__doc__, clients=CASES, repeat=3, result="spark_io")
    ap.add_argument("--messages", type=int, default=10_000_000,
                    help="records of the Spark reads and the ranges (a multiple of 4)")
    ap.add_argument("--write-messages", type=int, default=10_000_000,
                    help="records of the producer and the Spark write")
    ap.add_argument("--duckdb-messages", type=int, default=10_000_000,
                    help="records of consume and duckdb")
    ap.add_argument("--stream", default=STREAM,
                    help=f"the stream read (default {STREAM}, topped up if short)")
    args = ap.parse_args()
    if args.child:
        return child_main(args)
    names = harness.chosen(ap, args)
    info = harness.machine(args.uri)
    harness.banner(info, "spark_io")
    os.environ[harness.BROKER_PID_ENV] = str(harness.broker_pid(args.uri))
    n, big = args.messages, args.duckdb_messages
    prefill(args.uri, args.stream, 100, max(n, big))

    spark, cases = None, {}
    if set(names) & set(SPARK):
        spark, cases = spark_cases(args)
        for name in names:  # the JVM and the Python workers warm
            if name in cases:
                cases[name](min(n, 200_000 if name != "spark-write" else 100_000))

    def run(name: str) -> dict:
        if name in cases:
            return cases[name](args.write_messages if name == "spark-write" else n)
        cmd = [*harness.self_cmd(__spec__), "--uri", args.uri,
               "--child", name, "--stream", args.stream, "--messages", str(n),
               "--write-messages", str(args.write_messages),
               "--duckdb-messages", str(big), "--stall", str(args.stall)]
        return harness.run_child(cmd, args.timeout, args.uri)

    try:
        runs = harness.interleave(args.repeat, names, run)
    finally:
        if spark is not None:
            spark.stop()
        harness.admin(args.uri, lambda c: c.delete_stream(TARGET, missing_ok=True))

    out = {name: {"summary": summary(runs[i]), "runs": runs[i]}
           for i, name in enumerate(names)}
    print(f"\n{n:,} records of 100 B read ({args.write_messages:,} written, {big:,} "
          f"for consume and duckdb), medians of {args.repeat}:\n")
    for name, c in out.items():
        s = c["summary"]
        if s:
            cpu = "".join(f", {what} {s[key]:.2f}" for what, key in (
                ("JVM", "jvm_cpu_s_per_m_median"), ("workers", "python_cpu_s_per_m_median"),
                ("broker", "broker_cpu_s_per_m_median")) if key in s)
            print(f"  {name:16} {s['seconds_median']:6.2f} s "
                  f"{harness.fmt_rate(s['msg_per_s_median'])} rows/s"
                  + (f" (CPU s per M records{cpu})" if cpu else ""))
    for a, b in RATIOS:
        sa, sb = (out.get(x, {}).get("summary") for x in (a, b))
        if sa and sb:
            print(f"  {a} / {b}: {sa['msg_per_s_median'] / sb['msg_per_s_median']:.2f}")
    harness.write_results(args.json, info, {
        "benchmark": "spark_io", "repeat": args.repeat, "messages": n,
        "write_messages": args.write_messages, "duckdb_messages": big, "body_size": 100,
        "stream": args.stream,
        "cases": out})


if __name__ == "__main__":
    main()
