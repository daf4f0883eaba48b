"""What pystream's OpenTelemetry metrics cost: consume and publish
throughput with and without them.

    .venv/bin/python -m bench.bench_otel               # absent and sdk, 20 pairs
    .venv/bin/python -m bench.bench_otel --only absent,api,sdk --repeat 10
    .venv/bin/python -m bench.bench_otel --rows consume --repeat 2 --seconds 2 \
        --consume-messages 2000000 --json ''          # a smoke run
    .venv/bin/python -m bench.bench_otel --interval 60 --repeat 6 --rows consume,publish \
        --json bench/results/otel-60s.json      # as deployments collect

What it measures
----------------
Three modes (the "clients" of ``--only``; absent and sdk by default, which
the target concerns), each run in a fresh process against the modern
broker (``--uri``):

* ``absent``: opentelemetry cannot be imported (as without the
  ``pystream[otel]`` extra): pystream never makes its instruments.
* ``api``: opentelemetry-api importable, no SDK: the API's no-op proxies.
* ``sdk``: the real SDK, a ``MeterProvider`` with a
  ``PeriodicExportingMetricReader`` collecting every ``--interval`` seconds
  (1 s, far more often than a real deployment's 60 s) into an exporter that
  discards what it gets: the cost of collecting, not of shipping.

First, on its own and in thread CPU time, what each metric costs on the
hot paths (``hook_costs``, once for each of the three modes): the per-chunk
hook (three integer counters and, with the SDK, holding the ``chunk_size``
value for the next collection to record), one histogram value, the
publisher's per-batch counters, and one collection of every instrument;
the hook and the value both back to back and after evicting the CPU's
caches as a chunk's decode does.

Then, in every sdk run, the thread CPU of each collection and export,
where they run, and of recording the ``chunk_size`` values still held
when the run's window ends (within the window: they are the run's, which
a later collection would record): their share of the run's CPU
(``sdk_cpu_share``), which the machine's load moves far less than it
moves the throughput.

Four rows (``--rows``). The first two run each mode in processes of its
own, each run a window of ``--seconds`` (3 s: with the 1 s reader, two or
three collections fall in it, the steady state a long-lived consumer
sees):

* ``consume``: ``client.consumer(stream, offset="first")`` with its defaults
  reads ``bench-otel-100b`` (``--consume-messages`` 100-byte AMQP
  messages, filled once by the C publisher as bench_consume.py fills
  ``bench-100b``, deleted at the end) to its end, again and again, and
  counts the messages read in the window;
* ``publish``: ``producer.send_batch`` of 100-byte messages in batches of
  10 000 into a fresh stream (``bench-otel-publish``, deleted after each
  run) until the window ends, then every confirm awaited.

The clock starts after connecting; each run records the process's CPU
time and the broker's over the window and the load average before and
after (bench/harness.py). The modes take turns within each repetition and
each repetition starts one case further on (``harness.interleave(
rotate=True)``), so that the machine's noise falls on all of them and no
mode always runs first. The overhead is each sdk run against the absent
run of its repetition (msg/s and CPU per message): the median of those
pairs, their quartiles, and a bootstrap 95 % confidence interval of that
median (``harness.median_ci``), which says whether the runs resolve the
2 % where one mode's spread cannot; here it often does not: separate
processes differ by more than the SDK costs.

The other two, ``consume_windows`` and ``publish_windows``, switch the
metrics on and off within one process, window after window
(bench/otel_windows.py: ``--groups``, ``--passes``, ``--window-seconds``),
and judge the target: off, the SDK, and consuming also the SDK with
``chunk_size`` recorded, each SDK window against the off window of its
group.

A default run takes about 20 minutes (the process rows: 20 repetitions of
four runs of some 4.5 s with the start-up, the hook costs and the
10 M-message fill; the windows: some 12 minutes). Results:
bench/results/otel.json, rendered into docs/monitoring.md by
bench/report.py.

Target: the SDK costs at most 2 % of consume and publish throughput.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time

from bench import harness, otel_windows
from bench.harness import PROGRESS, Window, make_body

MODES = ("absent", "api", "sdk")
ROWS = ("consume", "publish", "consume_windows", "publish_windows")
CONSUME_STREAM = "bench-otel-100b"
PUBLISH_STREAM = "bench-otel-publish"
BODY = 100
PUBLISH_BATCH = 10_000
SECONDS, REPEAT = 3.0, 20    # the process rows: some 7 minutes (absent and sdk)
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

        class TimedReader(PeriodicExportingMetricReader):
            def collect(self, timeout_millis: float = 10_000) -> None:
                with collecting():
                    super().collect(timeout_millis=timeout_millis)
                COLLECTIONS[0] += 1

        reader = TimedReader(Discard(), export_interval_millis=interval * 1000)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


# The SDK's work in a run, in thread CPU seconds: [the chunk_size values
# recorded outside collections (by the reader, once it holds
# CHUNK_SIZE_HELD), every collection and export with the values it
# records] (sdk mode). Timed where it happens, in the run itself, it is
# compared with the run's CPU: a share the machine's noise moves far less
# than the throughput. Per chunk the hook adds only holding a value, timed
# alone (hook_costs): timing each call in the runs would cost more.
SDK_CPU = [0.0, 0.0]
COLLECTIONS = [0]   # the periodic reader's, in the run's process
_in_collection = threading.local()


@contextlib.contextmanager
def collecting():
    """Time a collection (or its stand-in) into SDK_CPU[1], and tell
    ``time_sdk_records`` that the values recorded meanwhile are counted."""
    t0 = time.thread_time()
    _in_collection.on = True
    try:
        yield
    finally:
        _in_collection.on = False
        SDK_CPU[1] += time.thread_time() - t0


class SdkWindow(Window):
    """The run's window, with the SDK's work within it (a collection in
    progress at either end counts when it ends). The chunk_size values the
    consumer still holds at the end are recorded within the window, timed
    as a collection's work: the next collection would record them."""

    def start(self) -> None:
        self.sdk0 = list(SDK_CPU)
        self.collections0 = COLLECTIONS[0]
        super().start()

    def stop(self, messages: int, **extra: object) -> dict:
        from pystream import metrics
        with collecting():
            metrics.flush_chunk_sizes()
        out = super().stop(messages, **extra)
        out["sdk_reader_cpu"] = SDK_CPU[0] - self.sdk0[0]
        out["sdk_collect_cpu"] = SDK_CPU[1] - self.sdk0[1]
        out["collections"] = COLLECTIONS[0] - self.collections0
        return out


def time_sdk_records(metrics) -> None:
    """Time the chunk_size values recorded outside collections into
    SDK_CPU[0]."""
    record = metrics._record_chunk_sizes

    def timed(*args) -> None:
        if getattr(_in_collection, "on", False):
            record(*args)
            return
        t0 = time.thread_time()
        record(*args)
        SDK_CPU[0] += time.thread_time() - t0
    metrics._record_chunk_sizes = timed


def cpu_us(calls: dict, number: int = 2000, repeat: int = 15,
           between=None, reset=None) -> dict[str, float]:
    """The median CPU time of this thread per call of each of ``calls``
    ({name: call}) in µs, the calls taking turns within each repetition so
    that the machine's moods fall on all of them. CPU, not wall time: the
    throughput runs' costs are compared as CPU, and the shared machine
    stretches wall time unevenly. ``between``, untimed, runs before each
    call, ``reset`` before each run of ``number`` calls."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            if reset is not None:
                reset()
            spent = 0.0
            if between is None:
                t0 = time.thread_time()
                for _ in range(number):
                    call()
                spent = time.thread_time() - t0
            else:
                for _ in range(number):
                    between()
                    t0 = time.thread_time()
                    call()
                    spent += time.thread_time() - t0
            times[name].append(spent / number * 1e6)
    return {name: statistics.median(ts) for name, ts in times.items()}


def hook_costs(mode: str, uri: str) -> dict:
    """What each metric costs on the hot paths, measured on its own (the
    throughput runs are too noisy to resolve it): the per-chunk hook
    (``metrics.chunk_received``: three integer counters and, with an SDK
    and ``record_chunk_sizes`` asked, as timed here, holding the
    ``chunk_size`` value, a collection recording what was held
    before each run of calls, untimed), one histogram value recorded by
    itself, the publisher's per-batch counters (two integers the producer
    bumps inline, timed as a call) and, with the SDK, a value held and
    recorded by a collection (``chunk_size_flush_us``: 2 000 held, their
    recording timed) and one collection of every instrument with nothing
    held (the lag gauge's request to the broker left out). The hook and the
    value are timed twice: back to back (the code in the CPU's caches), and
    each after copying ``HOOK_BYTES`` (as decoding a chunk does, evicting
    it: ``_cold``)."""
    from pystream import metrics
    from pystream.uri import parse_uri
    address = parse_uri(uri)
    stats = metrics.consumer_stats(address, "hooks", None)
    pub = metrics.publisher_stats(address, "hooks")
    reader = None
    if mode == "sdk":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        metrics.record_chunk_sizes()   # the hook's dearer path, timed here
    inst = metrics.instruments()

    def batch_hook() -> None:
        pub.published += PUBLISH_BATCH
        pub.written_bytes += PUBLISH_BATCH * BODY

    chunk = bytearray(HOOK_BYTES * 4)
    calls = {"chunk_hook_us": lambda: metrics.chunk_received(
                 stats, HOOK_ENTRIES, HOOK_BYTES, 50_000)}
    if inst is not None:
        calls["chunk_size_record_us"] = lambda: inst.chunk_size.record(
            HOOK_ENTRIES)
    out = {"chunk_entries": HOOK_ENTRIES, "clock": "thread CPU time, median of 15",
           "chunk_size_record_us": None, "collect_ms": None,
           **cpu_us({**calls, "batch_hook_us": batch_hook},
                    reset=metrics.flush_chunk_sizes),
           **{f"{name[:-3]}_cold_us": us for name, us in cpu_us(
               calls, number=256, between=lambda: bytes(chunk),
               reset=metrics.flush_chunk_sizes).items()}}
    if reader is not None:
        metrics.flush_chunk_sizes()
        out["collect_ms"] = cpu_us({"c": reader.get_metrics_data}, number=20)["c"] / 1e3
        flushes = []
        for _ in range(15):
            for _ in range(2000):
                metrics.chunk_received(stats, HOOK_ENTRIES, HOOK_BYTES, 50_000)
            t0 = time.thread_time()
            metrics.flush_chunk_sizes()
            flushes.append((time.thread_time() - t0) / 2000 * 1e6)
        out["chunk_size_flush_us"] = statistics.median(flushes)
    return out


def consume(client, stream: str, end: int, seconds: float, clock: Window) -> dict:
    """Read ``stream`` from its first offset to ``end``, again and again,
    for ``seconds``: a window holding several collections, every message
    read in it counted."""
    n = chunks = passes = 0
    clock.start()
    deadline = time.perf_counter() + seconds
    while True:
        with client.consumer(stream, offset="first") as consumer:
            for batch in consumer:
                n += batch.num_rows
                chunks += 1
                PROGRESS[0] = n
                if time.perf_counter() >= deadline:
                    return clock.stop(n, records_received=n, batches=chunks,
                                      passes=passes + 1)
                if consumer.position >= end:
                    break
        passes += 1
        if consumer.position < end:
            raise SystemExit(f"read to {consumer.position} of {end}")


def publish(client, stream: str, seconds: float, clock: Window) -> dict:
    """Send batches for ``seconds``, then wait for every confirm."""
    import pyarrow as pa
    batch = pa.array([make_body(BODY)] * PUBLISH_BATCH, pa.binary())
    sent = 0
    clock.start()
    deadline = time.perf_counter() + seconds
    with client.producer(stream) as producer:
        while time.perf_counter() < deadline:
            producer.send_batch(batch)
            sent += PUBLISH_BATCH
            PROGRESS[0] = sent
        producer.flush(300)
        return clock.stop(sent, batch=PUBLISH_BATCH)


def child_main(args) -> None:
    mode = args.child
    if mode == "windows":
        harness.start_watchdog(args.stall)
        harness.child_done(otel_windows.run(
            args.uri, args.kind, args.stream, args.target,
            args.groups or otel_windows.GROUPS[args.kind],
            args.passes, args.window_seconds, BODY))
    setup_mode(mode, args.interval)
    if args.kind == "hooks":
        harness.child_done(hook_costs(mode, args.uri))
    import pystream
    harness.start_watchdog(args.stall)
    # The first consumer or producer imports OpenTelemetry and makes the
    # instruments, once in the process's life: timed here, before the
    # clock, which measures throughput.
    t0 = time.thread_time()
    inst = pystream.metrics.instruments()
    setup_ms = (time.thread_time() - t0) * 1e3
    if mode == "sdk":
        time_sdk_records(pystream.metrics)
    clock = SdkWindow() if mode == "sdk" else Window()
    with pystream.connect(args.uri) as client:
        if args.kind == "consume":
            out = consume(client, args.stream, args.target, args.seconds, clock)
        else:
            out = publish(client, args.stream, args.seconds, clock)
        out["instrumented"] = inst is not None
        out["setup_ms"] = setup_ms
    harness.child_done(out)


# --- the parent -----------------------------------------------------------------------


def child_cmd(args, mode: str, kind: str, stream: str = "", target: int = 0) -> list[str]:
    return [*harness.self_cmd(__spec__), "--uri", args.uri,
            "--child", mode, "--kind", kind, "--stream", stream,
            "--target", str(target), "--seconds", str(args.seconds),
            "--interval", str(args.interval), "--groups", str(args.groups or 0),
            "--passes", str(args.passes),
            "--window-seconds", str(args.window_seconds),
            "--stall", str(args.stall)]


def windows_row(args, kind: str, end: int) -> dict:
    """The paired windows of ``kind`` in one child process (otel_windows)."""
    if kind == "consume":
        res = harness.run_child(child_cmd(args, "windows", kind, CONSUME_STREAM, end),
                                args.timeout, args.uri)
    else:
        with fresh_publish_stream(args.uri):
            res = harness.run_child(child_cmd(args, "windows", kind, PUBLISH_STREAM),
                                    args.timeout, args.uri)
    if "error" in res:
        return {"error": res["error"]}
    row = {"body_size": BODY, **otel_windows.summarize(kind, res["windows"], BODY),
           "windows": res["windows"]}
    if kind == "consume":
        row.update(stream_messages=end, passes=args.passes)
    else:
        row["seconds"] = args.window_seconds
    return row


@contextlib.contextmanager
def fresh_publish_stream(uri: str):
    """PUBLISH_STREAM made anew (2 GB retained), deleted after."""
    harness.admin(uri, lambda a: a.delete_stream(PUBLISH_STREAM, missing_ok=True))
    harness.admin(uri, lambda a: a.create_stream(
        PUBLISH_STREAM, max_length_bytes=2_000_000_000))
    try:
        yield
    finally:
        harness.admin(uri, lambda a: a.delete_stream(PUBLISH_STREAM, missing_ok=True))


def one_run(args, kind: str, mode: str) -> dict:
    if kind == "consume":
        return harness.run_child(child_cmd(args, mode, kind, CONSUME_STREAM,
                                           args.consume_messages),
                                 args.timeout, args.uri)
    with fresh_publish_stream(args.uri):
        return harness.run_child(child_cmd(args, mode, kind, PUBLISH_STREAM),
                                 args.timeout, args.uri)




def vs_absent(row: dict, mode: str) -> dict:
    """sdk (or api) against absent, as fractions: the medians' msg/s and CPU
    per message, and the repetitions' paired changes (each run against the
    absent run of its repetition, ``harness.paired_changes``)."""
    a = row["clients"].get("absent", {}).get("summary")
    m = row["clients"].get(mode, {}).get("summary")
    if not (a and m):
        return {}
    pairs = [(x, y) for x, y in zip(row["clients"][mode]["runs"],
                                    row["clients"]["absent"]["runs"], strict=True)
             if "error" not in x and "error" not in y]
    return {"msg_per_s": m["msg_per_s_median"] / a["msg_per_s_median"] - 1,
            "cpu_s_per_m": m["cpu_s_per_m_median"] / a["cpu_s_per_m_median"] - 1,
            **harness.paired_changes(pairs)}


def sdk_share(runs: list[dict]) -> dict:
    """The SDK's work timed within each sdk run over the run's CPU:
    quartiles of the share of the values the reader recorded itself, of
    the collections (with the values they record), of both."""
    good = [r for r in runs if "error" not in r and r.get("cpu") and "sdk_reader_cpu" in r]
    total = [(r["sdk_reader_cpu"] + r["sdk_collect_cpu"]) / r["cpu"] for r in good]
    return {"reader": harness.quartiles([r["sdk_reader_cpu"] / r["cpu"] for r in good]),
            "collect": harness.quartiles([r["sdk_collect_cpu"] / r["cpu"] for r in good]),
            "total": harness.quartiles(total), "total_ci95": harness.median_ci(total)}


def main() -> None:
    ap = harness.parser(__doc__, clients=MODES, default=("absent", "sdk"),
                        result="otel", repeat=REPEAT)
    ap.add_argument("--rows", default=",".join(ROWS), help="consume, publish")
    ap.add_argument("--seconds", type=float, default=SECONDS,
                    help="each run's window (s): messages read or confirmed in it")
    ap.add_argument("--consume-messages", type=int, default=10_000_000,
                    help="the stream the consume runs read, again and again")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="the periodic reader's interval in sdk mode (s)")
    ap.add_argument("--groups", type=int, default=None,
                    help="groups of paired windows (default: consume "
                    f"{otel_windows.GROUPS['consume']}, publish "
                    f"{otel_windows.GROUPS['publish']})")
    ap.add_argument("--passes", type=int, default=2,
                    help="reads of the whole stream in a consume window")
    ap.add_argument("--window-seconds", type=float, default=1.0,
                    help="a publish window (s)")
    ap.add_argument("--kind", help=harness.argparse.SUPPRESS)
    ap.add_argument("--stream", help=harness.argparse.SUPPRESS)
    ap.add_argument("--target", type=int, default=0, help=harness.argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    from pystream import metrics
    modes = harness.chosen(ap, args)
    kinds = harness.chosen_rows(ap, args.rows, ROWS)
    info = harness.machine(args.uri)
    harness.banner(info, "otel")

    hooks = {}
    for mode in MODES:   # a few seconds each: always all three
        hooks[mode] = harness.run_child(child_cmd(args, mode, "hooks"),
                                        args.timeout, args.uri)
        print(f"hooks {mode:<7} {hooks[mode]}", flush=True)

    windowed = [k for k in kinds if k.endswith("_windows")]
    kinds = [k for k in kinds if k not in windowed]
    cases = [(k, m) for k in kinds for m in modes]
    windows = {}
    try:
        end = 0
        if "consume" in kinds or "consume_windows" in windowed:
            from bench.bench_consume import prefill
            end = prefill(args.uri, CONSUME_STREAM, BODY, args.consume_messages)
        runs = harness.interleave(
            args.repeat, cases, lambda case: one_run(args, case[0], case[1]),
            label=lambda case: f"{case[0]} {case[1]}", rotate=True)
        for k in windowed:
            print(f"{k}: paired windows in one process", flush=True)
            windows[k] = windows_row(args, k.removesuffix("_windows"), end)
    finally:
        harness.admin(args.uri, lambda a: a.delete_stream(CONSUME_STREAM,
                                                          missing_ok=True))

    grouped = harness.by_row(cases, runs)
    out_rows = {}
    for k in kinds:
        clients = {mode: {"label": mode, "summary": harness.summarize(m_runs, BODY),
                          "runs": m_runs}
                   for mode, m_runs in grouped[k].items()}
        row = {"seconds": args.seconds, "body_size": BODY, "clients": clients}
        if k == "consume":
            per_chunk = [r["records_received"] / r["batches"]
                         for c in clients.values() for r in c["runs"]
                         if "error" not in r and r.get("batches")]
            row["stream_messages"] = args.consume_messages
            row["records_per_chunk_median"] = (statistics.median(per_chunk)
                                               if per_chunk else None)
        row["vs_absent"] = {m: vs_absent(row, m) for m in modes if m != "absent"}
        row["sdk_cpu_share"] = sdk_share(clients.get("sdk", {}).get("runs", []))
        out_rows[k] = row

    for k, row in windows.items():
        if "error" in row:
            print(f"{k}: {row['error']}")
            continue
        for mode, m in row["modes"].items():
            if mode != "off":
                lo, hi = m["msg_per_s_paired_ci95"] or (float("nan"),) * 2
                print(f"{k} {mode:<15} msg/s {m['msg_per_s_paired']:+.2%} "
                      f"(95 % interval {lo:+.2%} to {hi:+.2%}), CPU per message "
                      f"{m['cpu_s_per_m_paired']:+.2%}", flush=True)
    print(f"\n{'':10}" + "".join(f"{m:>12}" for m in modes) + f"{'sdk vs absent':>16}")
    for k, row in out_rows.items():
        cells = "".join(
            f"{harness.fmt_rate(s['msg_per_s_median']) if s else 'failed':>10}/s"
            for s in (row["clients"][m]["summary"] for m in modes))
        change = row["vs_absent"].get("sdk", {}).get("msg_per_s")
        print(f"{k:10}{cells}{'' if change is None else f'{change:+.1%}':>16}")
    harness.write_results(args.json, info, {
        "benchmark": "otel", "repeat": args.repeat, "order": "rotated",
        "sdk_export_interval_s": args.interval,
        "chunk_size_held": metrics.CHUNK_SIZE_HELD, "hook_costs": hooks,
        "rows": out_rows, "windows": windows})


if __name__ == "__main__":
    main()
