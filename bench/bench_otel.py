"""What pystream's OpenTelemetry metrics cost: consume and publish
throughput with and without them.

    .venv/bin/python bench/bench_otel.py --json bench/results/otel.json
    .venv/bin/python bench/bench_otel.py --repeat 9 --consume-messages 10000000

Three modes, each run in a fresh process against the modern broker:

* ``absent``: opentelemetry cannot be imported (as without the
  ``pystream[otel]`` extra): pystream never makes its instruments.
* ``api``: opentelemetry-api importable, no SDK: the API's no-op proxies.
* ``sdk``: the real SDK, a ``MeterProvider`` with a
  ``PeriodicExportingMetricReader`` collecting every ``--interval`` seconds
  (1 s, far more often than a real deployment's 60 s) into an exporter that
  discards what it gets: the cost of collecting, not of shipping.

First, on its own, the time of the one hook per chunk (counters, and with
the SDK the ``chunk_size`` histogram value) and of one collection of every
instrument (``hook_costs``; the best of 5 repeats).

Consume: ``client.consumer(stream, offset="first")`` with its defaults reads
``--consume-messages`` 100-byte messages of a stream filled once (as
bench_consume.py fills ``bench-100b``). Publish: ``producer.send_batch`` of
``--publish-messages`` 100-byte messages in batches of 10 000 into a fresh
stream, every confirm awaited. The modes alternate run by run (absent, api,
sdk, absent, ...) so that the machine's noise (2 cores shared with the
broker and other work) falls on all of them; figures are medians of
``--repeat`` runs, and the overhead is the sdk median against the absent
one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import PROGRESS, make_body, run_child_process, start_watchdog  # noqa: E402

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
MODES = ("absent", "api", "sdk")
CONSUME_STREAM = "bench-100b"
PUBLISH_STREAM = "bench-otel-publish"
BODY = 100


def setup_mode(mode: str, interval: float) -> None:
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
        return
    if mode == "sdk":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            MetricExporter, MetricExportResult, PeriodicExportingMetricReader)

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


def hook_costs(mode: str) -> dict:
    """The time of the per-chunk hook (``metrics.chunk_received``) and, with
    the SDK, of one collection of every instrument: the cost the throughput
    runs are too noisy to resolve, measured on its own."""
    import timeit

    from pystream import metrics
    from pystream.uri import parse_uri
    stats = metrics.consumer_stats(parse_uri(DEFAULT_URI), "hooks", None)
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
        lambda: metrics.chunk_received(stats, 7700, 800_000, 50_000),
        number=n, repeat=5)) / n
    if mode == "sdk":
        collect_ms = min(timeit.repeat(reader.get_metrics_data, number=20,
                                       repeat=5)) / 20 * 1e3
    return {"chunk_hook_us": per_chunk * 1e6, "collect_ms": collect_ms}


def child(args: argparse.Namespace) -> dict:
    setup_mode(args.mode, args.interval)
    if args.child == "hooks":
        return hook_costs(args.mode)
    import pystream
    start_watchdog(30)
    with pystream.connect(args.uri) as client:
        if args.child == "consume":
            n = 0
            t0, c0 = time.perf_counter(), time.process_time()
            with client.consumer(CONSUME_STREAM, offset="first") as consumer:
                for batch in consumer:
                    n += batch.num_rows
                    PROGRESS[0] = n
                    if consumer.position >= args.messages:
                        break
            t1, c1 = time.perf_counter(), time.process_time()
        else:
            import pyarrow as pa
            body = make_body(BODY)
            batch = pa.array([body] * 10_000, pa.binary())
            n = args.messages
            t0, c0 = time.perf_counter(), time.process_time()
            with client.producer(PUBLISH_STREAM) as producer:
                for start in range(0, n, 10_000):
                    producer.send_batch(batch)
                    PROGRESS[0] = start
                producer.flush(300)
            t1, c1 = time.perf_counter(), time.process_time()
        instrumented = pystream.metrics.instruments() is not None
    return {"messages": min(n, args.messages), "seconds": t1 - t0,
            "cpu": c1 - c0, "instrumented": instrumented}


def run(args: argparse.Namespace, kind: str, mode: str, messages: int) -> dict:
    cmd = [sys.executable, __file__, "--uri", args.uri, "--child", kind,
           "--mode", mode, "--messages", str(messages),
           "--interval", str(args.interval)]
    return run_child_process(cmd, timeout=600)


def fresh_publish_stream(uri: str) -> None:
    import pystream
    with pystream.connect(uri) as client:
        client.delete_stream(PUBLISH_STREAM, missing_ok=True)
        client.create_stream(PUBLISH_STREAM, max_length_bytes=2_000_000_000)


def versions(uri: str) -> dict:
    from importlib import metadata

    import pystream
    out = {"python": platform.python_version()}
    for name in ("pyarrow", "numpy", "opentelemetry-api", "opentelemetry-sdk"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    with pystream.connect(uri) as client:
        out["broker"] = client.server_properties.get("version")
    return out


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cores": os.cpu_count(),
            "cpu": model, "shared": "the brokers and other work run on the "
            "same cores: figures move by several percent from run to run"}


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default=os.environ.get("PYSTREAM_TEST_URI", DEFAULT_URI))
    ap.add_argument("--consume-messages", type=int, default=5_000_000)
    ap.add_argument("--publish-messages", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--interval", type=float, default=1.0,
                    help="the periodic reader's interval in sdk mode (s)")
    ap.add_argument("--only", default="consume,publish")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--messages", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return

    kinds = [k for k in args.only.split(",") if k]
    hooks = {mode: run(args, "hooks", mode, 0) for mode in MODES}
    for mode, cost in hooks.items():
        print(f"hooks {mode:7} {cost}", flush=True)
    if "consume" in kinds:
        from bench_consume import prefill
        prefill(args.uri, CONSUME_STREAM, BODY, args.consume_messages)
    started = dt.datetime.now(dt.timezone.utc)
    load = [os.getloadavg()[0]]
    runs: dict[str, dict[str, list[dict]]] = {k: {m: [] for m in MODES} for k in kinds}
    for i in range(args.repeat):
        for kind in kinds:
            for mode in MODES:
                if kind == "publish":
                    fresh_publish_stream(args.uri)
                messages = (args.consume_messages if kind == "consume"
                            else args.publish_messages)
                result = run(args, kind, mode, messages)
                runs[kind][mode].append(result)
                rate = (f"{result['messages'] / result['seconds'] / 1e3:,.0f} k msg/s"
                        if "error" not in result else result["error"])
                print(f"run {i + 1}/{args.repeat} {kind:8} {mode:7} {rate}",
                      flush=True)
        load.append(os.getloadavg()[0])
    if "publish" in kinds:
        import pystream
        with pystream.connect(args.uri) as client:
            client.delete_stream(PUBLISH_STREAM, missing_ok=True)

    summary: dict[str, dict] = {}
    for kind in kinds:
        summary[kind] = {}
        for mode in MODES:
            good = [r for r in runs[kind][mode] if "error" not in r]
            rates = [r["messages"] / r["seconds"] for r in good]
            summary[kind][mode] = {
                "runs": len(good), "msg_per_s_median": statistics.median(rates)
                if rates else None, "msg_per_s_all": rates,
                "cpu_s_per_m_msg_median": statistics.median(
                    r["cpu"] / r["messages"] * 1e6 for r in good) if good else None,
                "instrumented": sorted({r["instrumented"] for r in good})}
        base = summary[kind]["absent"]["msg_per_s_median"]
        for mode in ("api", "sdk"):
            m = summary[kind][mode]["msg_per_s_median"]
            summary[kind][mode]["change_vs_absent_pct"] = (
                None if not (base and m) else round((m / base - 1) * 100, 2))
    print()
    print(f"{'':10}" + "".join(f"{m:>16}" for m in MODES) + f"{'sdk vs absent':>16}")
    for kind in kinds:
        row = summary[kind]
        cells = "".join(f"{(row[m]['msg_per_s_median'] or 0) / 1e3:>12,.0f} k/s"
                        for m in MODES)
        print(f"{kind:10}{cells}{row['sdk']['change_vs_absent_pct']:>15}%")
    if args.json:
        out = {"benchmark": "bench/bench_otel.py", "date": started.isoformat(),
               "commit": commit(), "versions": versions(args.uri),
               "machine": machine(), "load_average_1m": load,
               "settings": {"consume_messages": args.consume_messages,
                            "publish_messages": args.publish_messages,
                            "body_bytes": BODY, "repeat": args.repeat,
                            "sdk_export_interval_s": args.interval},
               "hook_costs": hooks, "summary": summary, "runs": runs}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"written to {args.json}")


if __name__ == "__main__":
    main()
