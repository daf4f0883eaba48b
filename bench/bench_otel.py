"""What pystream's OpenTelemetry metrics cost: consume and publish
throughput with and without them.

    .venv/bin/python bench/bench_otel.py                        # 5 runs a mode
    .venv/bin/python bench/bench_otel.py --repeat 9 --consume-messages 10000000
    .venv/bin/python bench/bench_otel.py --rows consume --only absent,sdk --json ''

What it measures
----------------
Three modes (the "clients" of ``--only``), each run in a fresh process
against the modern broker (``--uri``):

* ``absent``: opentelemetry cannot be imported (as without the
  ``pystream[otel]`` extra): pystream never makes its instruments.
* ``api``: opentelemetry-api importable, no SDK: the API's no-op proxies.
* ``sdk``: the real SDK, a ``MeterProvider`` with a
  ``PeriodicExportingMetricReader`` collecting every ``--interval`` seconds
  (1 s, far more often than a real deployment's 60 s) into an exporter that
  discards what it gets: the cost of collecting, not of shipping.

First, on its own, the time of the one hook per chunk (counters, and with
the SDK the ``chunk_size`` histogram value) and of one collection of every
instrument (``hook_costs``; the best of 5 repeats), once per mode.

Two rows (``--rows``):

* ``consume``: ``client.consumer(stream, offset="first")`` with its defaults
  reads ``--consume-messages`` 100-byte AMQP messages of ``bench-otel-100b``,
  filled once by the C publisher (as bench_consume.py fills ``bench-100b``)
  and deleted at the end;
* ``publish``: ``producer.send_batch`` of ``--publish-messages`` 100-byte
  messages in batches of 10 000 into a fresh stream
  (``bench-otel-publish``, deleted after each run), every confirm awaited.

The clock starts after connecting and stops when the last message is read
or confirmed; each run records the process's CPU time and the broker's
over that window and the load average before and after (bench/harness.py).
The modes take turns within each repetition (absent, api, sdk, absent,
...) so that the machine's noise falls on all of them; figures are medians
of ``--repeat`` runs, and the overhead is the sdk median against the
absent one. Results: bench/results/otel.json, rendered into the README's
Monitoring section by bench/report.py.

Target: the SDK costs at most 2 % of consume and publish throughput.
"""

from __future__ import annotations

import statistics
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
from harness import PROGRESS, Window, make_body  # noqa: E402

MODES = ("absent", "api", "sdk")
ROWS = ("consume", "publish")
CONSUME_STREAM = "bench-otel-100b"
PUBLISH_STREAM = "bench-otel-publish"
BODY = 100
PUBLISH_BATCH = 10_000
HOOK_ENTRIES, HOOK_BYTES = 7700, 800_000    # the chunk the hook is timed with


# --- in the child -------------------------------------------------------------------


def setup_mode(mode: str, interval: float) -> None:
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
        return
    if mode == "sdk":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            MetricExporter,
            MetricExportResult,
            PeriodicExportingMetricReader,
        )

        class Discard(MetricExporter):
            def export(self, metrics_data, timeout_millis=10_000, **kwargs):
                return MetricExportResult.SUCCESS

            def force_flush(self, timeout_millis=10_000):
                return True

            def shutdown(self, timeout_millis=30_000, **kwargs):
                pass

        reader = PeriodicExportingMetricReader(
            Discard(), export_interval_millis=interval * 1000)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


def hook_costs(mode: str, uri: str) -> dict:
    """The time of the per-chunk hook (``metrics.chunk_received``) and, with
    the SDK, of one collection of every instrument: the cost the throughput
    runs are too noisy to resolve, measured on its own."""
    import timeit

    from pystream import metrics
    from pystream.uri import parse_uri
    stats = metrics.consumer_stats(parse_uri(uri), "hooks", None)
    collect_ms = None
    if mode == "sdk":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    else:
        metrics.instruments()
    n = 20_000
    per_chunk = min(timeit.repeat(
        lambda: metrics.chunk_received(stats, HOOK_ENTRIES, HOOK_BYTES, 50_000),
        number=n, repeat=5)) / n
    if mode == "sdk":
        collect_ms = min(timeit.repeat(reader.get_metrics_data, number=20,
                                       repeat=5)) / 20 * 1e3
    return {"chunk_hook_us": per_chunk * 1e6, "collect_ms": collect_ms,
            "chunk_entries": HOOK_ENTRIES}


def consume(client, stream: str, target: int, clock: Window) -> dict:
    n = chunks = 0
    clock.start()
    with client.consumer(stream, offset="first") as consumer:
        for batch in consumer:
            n += batch.num_rows
            chunks += 1
            PROGRESS[0] = n
            if consumer.position >= target:
                break
        out = clock.stop(target, records_received=n, batches=chunks)
    if n < target:
        raise SystemExit(f"read {n} of {target}")
    return out


def publish(client, stream: str, target: int, clock: Window) -> dict:
    import pyarrow as pa
    batch = pa.array([make_body(BODY)] * PUBLISH_BATCH, pa.binary())
    clock.start()
    with client.producer(stream) as producer:
        for start in range(0, target, PUBLISH_BATCH):
            producer.send_batch(batch)
            PROGRESS[0] = start + PUBLISH_BATCH
        producer.flush(300)
        out = clock.stop(-(-target // PUBLISH_BATCH) * PUBLISH_BATCH,
                         batch=PUBLISH_BATCH)
    return out


def child_main(args) -> None:
    mode = args.child
    setup_mode(mode, args.interval)
    if args.kind == "hooks":
        harness.child_done(hook_costs(mode, args.uri))
    import pystream
    harness.start_watchdog(args.stall)
    clock = Window()
    with pystream.connect(args.uri) as client:
        run = consume if args.kind == "consume" else publish
        out = run(client, args.stream, args.target, clock)
        out["instrumented"] = pystream.metrics.instruments() is not None
    harness.child_done(out)


# --- the parent -----------------------------------------------------------------------


def child_cmd(args, mode: str, kind: str, stream: str = "", target: int = 0) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--uri", args.uri,
            "--child", mode, "--kind", kind, "--stream", stream,
            "--target", str(target), "--interval", str(args.interval),
            "--stall", str(args.stall)]


def one_run(args, kind: str, mode: str, target: int) -> dict:
    if kind == "consume":
        return harness.run_child(child_cmd(args, mode, kind, CONSUME_STREAM, target),
                                 args.timeout, args.uri)
    harness.admin(args.uri, lambda a: a.delete_stream(PUBLISH_STREAM, missing_ok=True))
    harness.admin(args.uri, lambda a: a.create_stream(
        PUBLISH_STREAM, max_length_bytes=2_000_000_000))
    try:
        return harness.run_child(child_cmd(args, mode, kind, PUBLISH_STREAM, target),
                                 args.timeout, args.uri)
    finally:
        harness.admin(args.uri, lambda a: a.delete_stream(PUBLISH_STREAM,
                                                          missing_ok=True))


def otel_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("opentelemetry-api", "opentelemetry-sdk"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def vs_absent(row: dict, mode: str) -> dict:
    """sdk (or api) against absent, as fractions: the medians' msg/s and CPU
    per message, and the median of the repetitions' paired msg/s ratios."""
    a = row["clients"].get("absent", {}).get("summary")
    m = row["clients"].get(mode, {}).get("summary")
    if not (a and m):
        return {}
    pairs = [x["messages"] / x["seconds"] / (y["messages"] / y["seconds"])
             for x, y in zip(row["clients"][mode]["runs"], row["clients"]["absent"]["runs"],
                             strict=True)
             if "error" not in x and "error" not in y]
    return {"msg_per_s": m["msg_per_s_median"] / a["msg_per_s_median"] - 1,
            "msg_per_s_paired": statistics.median(pairs) - 1 if pairs else None,
            "cpu_s_per_m": m["cpu_s_per_m_median"] / a["cpu_s_per_m_median"] - 1}


def main() -> None:
    ap = harness.parser(__doc__, clients=MODES, result="otel")
    ap.add_argument("--rows", default=",".join(ROWS), help="consume, publish")
    ap.add_argument("--consume-messages", type=int, default=5_000_000)
    ap.add_argument("--publish-messages", type=int, default=1_000_000)
    ap.add_argument("--interval", type=float, default=1.0,
                    help="the periodic reader's interval in sdk mode (s)")
    ap.add_argument("--kind", help=harness.argparse.SUPPRESS)
    ap.add_argument("--stream", help=harness.argparse.SUPPRESS)
    ap.add_argument("--target", type=int, default=0, help=harness.argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    modes = harness.chosen(ap, args)
    kinds = harness.chosen_rows(ap, args.rows, ROWS)
    targets = {"consume": args.consume_messages, "publish": args.publish_messages}
    info = harness.machine(args.uri)
    info["versions"] = {**info["versions"], **otel_versions()}
    harness.banner(info, "otel")

    hooks = {}
    for mode in modes:
        hooks[mode] = harness.run_child(child_cmd(args, mode, "hooks"),
                                        args.timeout, args.uri)
        print(f"hooks {mode:<7} {hooks[mode]}", flush=True)

    cases = [(k, m) for k in kinds for m in modes]
    try:
        if "consume" in kinds:
            from bench_consume import prefill
            prefill(args.uri, CONSUME_STREAM, BODY, args.consume_messages)
        runs = harness.interleave(
            args.repeat, cases, lambda case: one_run(args, case[0], case[1],
                                                     targets[case[0]]),
            label=lambda case: f"{case[0]} {case[1]}")
    finally:
        harness.admin(args.uri, lambda a: a.delete_stream(CONSUME_STREAM,
                                                          missing_ok=True))

    grouped = harness.by_row(cases, runs)
    out_rows = {}
    for k in kinds:
        clients = {mode: {"label": mode, "summary": harness.summarize(m_runs, BODY),
                          "runs": m_runs}
                   for mode, m_runs in grouped[k].items()}
        row = {"messages": targets[k], "body_size": BODY, "clients": clients}
        if k == "consume":
            per_chunk = [r["records_received"] / r["batches"]
                         for c in clients.values() for r in c["runs"]
                         if "error" not in r and r.get("batches")]
            row["records_per_chunk_median"] = (statistics.median(per_chunk)
                                               if per_chunk else None)
        row["vs_absent"] = {m: vs_absent(row, m) for m in modes if m != "absent"}
        out_rows[k] = row

    print(f"\n{'':10}" + "".join(f"{m:>12}" for m in modes) + f"{'sdk vs absent':>16}")
    for k, row in out_rows.items():
        cells = "".join(
            f"{harness.fmt_rate(s['msg_per_s_median']) if s else 'failed':>10}/s"
            for s in (row["clients"][m]["summary"] for m in modes))
        change = row["vs_absent"].get("sdk", {}).get("msg_per_s")
        print(f"{k:10}{cells}{'' if change is None else f'{change:+.1%}':>16}")
    harness.write_results(args.json, info, {
        "benchmark": "otel", "repeat": args.repeat,
        "sdk_export_interval_s": args.interval, "hook_costs": hooks,
        "rows": out_rows})


if __name__ == "__main__":
    main()
