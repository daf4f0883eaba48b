"""Publish-to-application latency: how long after a message is sent does a
Python consumer hand it to the application?

    .venv/bin/python -m bench.bench_latency                 # everything, 3 runs, ~12 min
    .venv/bin/python -m bench.bench_latency --rates 1000,10000 --seconds 5
    .venv/bin/python -m bench.bench_latency --only pystream --json latency.json

What it measures
----------------
For each rate in ``--rates`` (1 k, 10 k and 100 k msg/s) and each consumer in
``--only`` (wire, pystream, rbfly, rstream), one after another on the same
broker (RabbitMQ 4.0, ``--uri``), taking turns within each of ``--repeat``
(5) repetitions:

1. The stream ``bench-latency`` is created afresh.
2. The consumer starts in a fresh process, subscribes at offset "next" and
   says it is ready once the broker answered the subscription.
3. A publisher starts in another fresh process and publishes ``--seconds``
   (12) at the rate, pystream's producer (``send_batch`` of a
   ``pyarrow.binary()`` array, confirms not awaited until the end), the same
   for every consumer. It paces in ticks of ``--tick-ms`` (1 ms): at each
   tick it sends the messages whose scheduled time (message i at
   ``start + i / rate``) has come, so it catches up when it was late and
   never runs ahead of the schedule. Each message is an AMQP 1.0 message of
   ``--size`` (100) bytes whose body starts with its send time
   (``CLOCK_MONOTONIC`` in ns, shared by all processes on Linux, taken right
   before ``send_batch``) and its sequence number, both little-endian int64;
   a last marker message carries the number sent. The publisher records how
   late each tick was against the schedule (its *lag*); a run whose lag ever
   passed ``--max-lag-ms`` (50) is flagged: the publisher did not keep the
   rate, and its catch-up burst is part of what the consumer saw.
4. The consumer takes ``latency = receive time - send time`` for each
   message, stops at the marker and reports:

   * ``wire``: the C reference latency, ``bench/wire/wire latency`` in C: subscribes at
     "next" with pystream's credit window (64), takes the receive time when
     the ``recv`` that completed a chunk returned and reads each body's
     head in place; what the broker and the publisher leave to any client.
   * ``pystream``: ``client.consumer(stream, offset="next")`` with its
     defaults, iterating batches; the receive time is taken when a batch is
     handed to the application and the batch kept; it stops once it has
     as many rows as were published (the parent says how many: the rate
     times ``--seconds``, and the marker), and the send times are read
     then, vectorised (the body column cast to ``binary``, the first 16
     bytes of each body gathered with numpy), no Python object per
     message, the marker checked last. (The per-message clients keep each
     body's head as it comes, an append, and compare bytes they hold;
     reading a batch's heads, or looking at its last body, costs tens of
     microseconds of numpy or pyarrow calls on a cold cache, however small
     the batch.)
   * ``rbfly``: ``stream_client.subscribe(stream, offset=Offset.NEXT)``, the
     async iterator of message bodies; a receive time per message.
   * ``rstream``: ``Consumer.subscribe(stream, callback,
     decoder=amqp_decoder, offset_specification=NEXT)``; a receive time per
     message, in the callback.

   Messages sent in the first ``--warmup`` seconds (2) are left out. The
   latencies of the rest give the percentiles (p50, p90, p99, p99.9,
   p99.99, max), a histogram and a percentile curve. The count is checked
   against what the publisher sent in the same window (``lost``), and
   ``disorder`` counts the places where a sequence number does not follow
   the one before (a gap, a repeat or a reordering).

A consumer that receives nothing new for ``--stall`` seconds, or has not
caught up ``--timeout`` seconds after the publisher's end, is reported as
failed; the others go on.

Output: a table per rate (each client's median p99 over the runs, the
spread of the runs' p99, and the ratio to the C reference latency's median p99), the
targets (pystream's p99 at most 1.5 times the C reference latency's and below every peer's,
at every rate), the results (bench/results/latency.json: every run's
percentiles, CPU of the consumer and of the broker, the load average), and
in ``--plot-dir`` (bench/results) ``latency-percentiles.png`` (percentile
curves of each client's median run) and ``latency-histogram.png``.

Everything runs on one 2-core machine: the broker, the publisher and the
consumer share it, so the figures include their competition for the cores.

At the rates of ``--together`` (1 k and 10 k msg/s unless told) the
consumers of a run are all subscribed at once (the order of subscribing
turned from run to run) and read the same messages: whatever regime the
broker and the publisher fall into in a run falls on all of them, and
"below a peer" is judged run by run (a sign test over the runs) instead of
across runs whose regimes differ. They then also share the two cores with
each other, which at 100 k msg/s, where the peers fall seconds behind and
take all the CPU they can, would measure the peers' load more than the
latency: there the clients take turns.

Reading the same messages, each client's latency is also set against the
C reference's message by message: the messages it handed 2 ms or more
later are its *stalls* (its process not running, or not reading), counted
in episodes, with the share of its top 1 % that lies in them: what
decides a p99 on a shared machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import harness
from bench.harness import PROGRESS, fmt_rate, make_body
from bench.report_format import lower_verdict

HERE = Path(__file__).resolve().parent

STREAM = "bench-latency"
CLIENTS = ("wire", "pystream", "rbfly", "rstream")
PEERS = ("rbfly", "rstream")
COLORS = {"wire": "tab:gray", "pystream": "tab:blue", "rbfly": "tab:orange",
          "rstream": "tab:green"}
LATENCY_FACTOR = 1.5   # target: pystream's p99 at most this times the C reference latency's

HEAD = 16          # body bytes read back: send time and sequence number
# A message a consumer handed this much later than the C reference did
# was stalled (``stalls``); stalled messages this many apart or closer are
# one episode.
STALL_MS = 2.0
STALL_GAP = 100
# Where a consumer of a run of consumers reading together writes each
# message's latency, for the parent to pair them (``paired``).
DUMP: list[str | None] = [None]
MARKER = -1        # send-time field of the end marker; its sequence = messages sent
MARKER_BYTES = np.array([MARKER], "<i8").tobytes()
PERCENTILES = (50, 90, 99, 99.9, 99.99)
HIST_EDGES_MS = 10 ** np.arange(-2, 5.001, 0.05)   # 0.01 ms to 100 s, 20 a decade
CURVE_STEP = 0.05  # percentile curve: steps of log10(1 / (1 - p))


# --- the publisher (child process) ----------------------------------------------


def publish_paced(uri: str, stream: str, rate: int, seconds: float, size: int,
                  warmup: float, tick_ms: float) -> dict:
    import pyarrow as pa

    import pystream
    total = int(rate * seconds)
    pad = np.frombuffer(make_body(size), np.uint8)
    tick = int(tick_ms * 1e6)
    warm_ns = int(warmup * 1e9)
    lags: list[int] = []
    sent = measured = 0
    with pystream.connect(uri) as client, client.producer(stream) as producer:
        t0 = time.monotonic_ns()
        first_stamp = None
        while sent < total:
            now = time.monotonic_ns()
            due = min(total, (now - t0) * rate // 1_000_000_000 + 1)
            n = due - sent
            if n > 0:
                lags.append(now - (t0 + sent * 1_000_000_000 // rate))
                data = np.tile(pad, n)
                heads = data.reshape(n, size)[:, :HEAD].view("<i8")
                offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
                bodies = pa.Array.from_buffers(
                    pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
                heads[:, 1] = np.arange(sent, sent + n)
                stamp = time.monotonic_ns()
                heads[:, 0] = stamp
                producer.send_batch(bodies)
                if first_stamp is None:
                    first_stamp = stamp
                if stamp >= first_stamp + warm_ns:
                    measured += n
                sent += n
                PROGRESS[0] = sent
            # sleep to the next tick boundary (none when already past it)
            next_tick = t0 + ((time.monotonic_ns() - t0) // tick + 1) * tick
            time.sleep(max(0, next_tick - time.monotonic_ns()) / 1e9)
        elapsed = (time.monotonic_ns() - t0) / 1e9
        marker = np.array([MARKER, sent], "<i8").tobytes() + bytes(size - HEAD)
        producer.send_batch([marker])
        producer.flush(timeout=120)
    lag_ms = np.array(lags) / 1e6
    return {"sent": sent, "measured": measured, "seconds": elapsed,
            "rate": sent / elapsed, "ticks": len(lags),
            "lag_p50_ms": float(np.percentile(lag_ms, 50)),
            "lag_p99_ms": float(np.percentile(lag_ms, 99)),
            "lag_max_ms": float(lag_ms.max())}


# --- the consumers (child processes) ----------------------------------------------


class GcPauses:
    """The cyclic garbage collections from its creation to ``stop()``: one
    stops the consumer's thread, so a pause there is latency the client (or
    what the harness keeps of its messages) caused."""

    def __init__(self) -> None:
        self.pauses: list[int] = []  # ns, one per collection
        self._began = 0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter_ns()
        else:
            self.pauses.append(time.perf_counter_ns() - self._began)

    def stop(self) -> dict:
        gc.callbacks.remove(self._on_gc)
        return {"gc_collections": len(self.pauses),
                "gc_pause_ms": sum(self.pauses) / 1e6,
                "gc_pause_max_ms": max(self.pauses, default=0) / 1e6}


class CpuClock:
    """The consumer process's and the broker's CPU time over wall time, from
    its creation (once subscribed) to ``share()`` (at the end marker), and
    the garbage collections meanwhile (``GcPauses``)."""

    def __init__(self) -> None:
        self.gc = GcPauses()
        self.window = harness.Window()
        self.window.start()

    def share(self) -> dict:
        w = self.window.stop(0)
        out = {"cpu_share": w["cpu"] / w["seconds"], **self.gc.stop()}
        if "broker_cpu" in w:
            out["broker_cpu_share"] = w["broker_cpu"] / w["seconds"]
        return out


def latency_result(recv_ns: np.ndarray, heads: np.ndarray, warmup: float,
                   cpu: dict, extra: dict) -> dict:
    """The RESULT of a consumer from every message's receive time and body
    head (send time, sequence number), the end marker last."""
    stamps, seqs = heads[:, 0], heads[:, 1]
    if not len(stamps) or stamps[-1] != MARKER:
        raise SystemExit("ended without the end marker")
    if seqs[0] != 0:
        raise SystemExit(f"the first message received is #{seqs[0]}, not #0")
    sent = int(seqs[-1])
    stamps, seqs, recv_ns = stamps[:-1], seqs[:-1], recv_ns[:-1]
    keep = stamps >= stamps[0] + int(warmup * 1e9)
    lat = (recv_ns[keep] - stamps[keep]) / 1e6
    if not len(lat):
        raise SystemExit("no message after the warm-up")
    if DUMP[0]:
        np.savez(DUMP[0], seqs=seqs[keep], ms=lat)
    xs = np.arange(0, np.log10(len(lat)) + 1e-9, CURVE_STEP)
    curve = np.quantile(lat, 1 - 10.0 ** -xs)
    hist, _ = np.histogram(np.clip(lat, HIST_EDGES_MS[0], HIST_EDGES_MS[-1]),
                           HIST_EDGES_MS)
    pct = np.percentile(lat, PERCENTILES)
    return {
        "messages": int(len(lat)), "received": int(len(seqs)), "sent": sent,
        "disorder": int(np.count_nonzero(np.diff(seqs) != 1)),
        "mean_ms": float(lat.mean()), "max_ms": float(lat.max()),
        **{f"p{p:g}_ms": float(v) for p, v in zip(PERCENTILES, pct, strict=True)},
        "curve": {"x": [round(float(x), 3) for x in xs],
                  "ms": [float(f"{v:.4g}") for v in curve]},
        "hist": [int(c) for c in hist],
        **cpu, **extra}


def per_message_arrays(recv: array, heads: bytearray) -> tuple:
    """What the per-message consumers collected, as ``latency_result`` takes it."""
    return (np.frombuffer(recv, np.int64),
            np.frombuffer(heads, "<i8").reshape(-1, 2))


def consume_wire(uri: str, stream: str, warmup: float,
                 ready: Callable[[], None], size: int) -> dict:
    """The C reference latency: it writes (receive time, send time, sequence) per
    message to a file, read back here after the end marker."""
    import subprocess
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "latency.bin")
        proc = subprocess.Popen(harness.wire_cmd("latency", uri, stream, size, path),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            proc.wait()
            raise SystemExit(f"the C reader did not subscribe ({proc.returncode})")
        ready()
        rest = proc.stdout.read()
        proc.wait()
        res = harness.parse_result(proc.returncode, rest, "")
        if "error" in res:
            raise SystemExit(res["error"])
        data = np.fromfile(path, np.int64).reshape(-1, 3)
    cpu = {"cpu_share": res["cpu"] / res["seconds"]}
    if "broker_cpu" in res:
        cpu["broker_cpu_share"] = res["broker_cpu"] / res["seconds"]
    return latency_result(data[:, 0], data[:, 1:], warmup, cpu,
                          {"chunks": res["chunks"]})


def consume_pystream(uri: str, stream: str, warmup: float,
                     ready: Callable[[], None], expect: int) -> dict:
    import pyarrow as pa

    import pystream
    received: list[tuple[int, pa.RecordBatch]] = []
    with pystream.connect(uri) as client:
        with client.consumer(stream, offset="next") as consumer:
            ready()
            clock = CpuClock()
            rows = 0
            for batch in consumer:
                received.append((time.monotonic_ns(), batch))
                rows += batch.num_rows
                PROGRESS[0] = rows
                # The count, not a look at the last body (a call into
                # pyarrow, tens of microseconds on a cold cache, where the
                # per-message clients compare bytes they hold): the end
                # marker is checked once the run is over.
                if rows >= expect:
                    break
            cpu = clock.share()
    # The bodies are read once the run is over, as the per-message clients
    # only append each body's head: reading them per batch (some 40 us of
    # numpy calls however small the batch) would delay the next batch.
    gather = np.arange(HEAD)
    recv, heads = [], []
    for now, batch in received:
        body = batch.column("body").cast(pa.binary())
        n = len(body)
        _, offsets, data = body.buffers()
        starts = np.frombuffer(offsets, np.int32, n, body.offset * 4)
        raw = np.frombuffer(data, np.uint8)
        heads.append(raw[starts[:, None] + gather].view("<i8"))
        recv.append(np.full(n, now, np.int64))
    rows = sum(len(r) for r in recv)
    return latency_result(np.concatenate(recv), np.concatenate(heads), warmup,
                          cpu, {"batches": len(received),
                                "rows_per_batch": rows / len(received)})


def consume_rbfly(uri: str, stream: str, warmup: float,
                  ready: Callable[[], None]) -> dict:
    import asyncio
    import logging

    from rbfly.streams import Offset, streams_client

    recv = array("q")
    heads = bytearray()

    async def run() -> dict:
        client = streams_client(uri)
        await client.get_protocol()
        # rbfly subscribes lazily, inside the iterator, and says so only in
        # its log: wait for that line before telling the parent.
        subscribed = asyncio.Event()

        class OnSubscribed(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.getMessage().startswith("(re)subscribed"):
                    subscribed.set()

        log = logging.getLogger("rbfly.streams.client")
        log.setLevel(logging.INFO)
        log.addHandler(OnSubscribed())
        gen = client.subscribe(stream, offset=Offset.NEXT)
        first = asyncio.ensure_future(gen.__anext__())
        waiting = asyncio.ensure_future(subscribed.wait())
        await asyncio.wait({first, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        ready()
        clock = CpuClock()
        now = time.monotonic_ns
        body = await first
        while True:
            recv.append(now())
            heads.extend(body[:HEAD])
            n = len(recv)
            if not n & 1023:
                PROGRESS[0] = n
            if body[:8] == MARKER_BYTES:
                break
            body = await gen.__anext__()
        return clock.share()

    cpu = asyncio.run(run())
    return latency_result(*per_message_arrays(recv, heads), warmup, cpu, {})


def consume_rstream(uri: str, stream: str, warmup: float,
                    ready: Callable[[], None]) -> dict:
    import asyncio

    from rstream import (
        AMQPMessage,
        Consumer,
        ConsumerOffsetSpecification,
        MessageContext,
        OffsetType,
        amqp_decoder,
    )

    from pystream.uri import parse_uri

    a = parse_uri(uri)
    recv = array("q")
    heads = bytearray()

    async def run() -> dict:
        done = asyncio.Event()
        now = time.monotonic_ns

        def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
            recv.append(now())
            body = msg.body
            if not isinstance(body, (bytes, bytearray)):
                body = b"".join(body)
            heads.extend(body[:HEAD])
            n = len(recv)
            if not n & 1023:
                PROGRESS[0] = n
            if body[:8] == MARKER_BYTES:
                done.set()

        consumer = Consumer(a.host, a.port, username=a.username,
                            password=a.password, vhost=a.virtual_host)
        await consumer.start()
        await consumer.subscribe(
            stream, on_message, decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT, None))
        ready()
        clock = CpuClock()
        await done.wait()
        return clock.share()

    cpu = asyncio.run(run())
    return latency_result(*per_message_arrays(recv, heads), warmup, cpu, {})


CONSUMERS = {"rbfly": consume_rbfly, "rstream": consume_rstream}


def settle_heap() -> None:
    """Collect the garbage of the start-up (imports, connection,
    subscription) and move what survives out of the collector's sight, in
    every consumer alike before the publisher starts: left as it is, the
    start-up's pending counts bring one full collection over that heap
    into the measured window, which a service running for days paid
    once, long ago.
    Collections during the run still happen and are counted (``GcPauses``)."""
    gc.collect()
    gc.freeze()


def child_main(args: argparse.Namespace) -> None:
    # A consumer idles from its start until the publisher's first message
    # (a second or two): far less than --stall.
    harness.start_watchdog(args.stall)
    DUMP[0] = args.dump
    if args.child == "publisher":
        out = publish_paced(args.uri, args.stream, args.rate, args.seconds,
                            args.size, args.warmup, args.tick_ms)
    else:
        def ready() -> None:
            """Tell the parent that the subscription is in place, the
            start-up heap collected and frozen first (``settle_heap``)."""
            settle_heap()
            Path(args.ready_file).write_text("ready\n")

        if args.child == "wire":
            out = consume_wire(args.uri, args.stream, args.warmup, ready, args.size)
        elif args.child == "pystream":
            out = consume_pystream(args.uri, args.stream, args.warmup, ready, args.expect)
        else:
            out = CONSUMERS[args.child](args.uri, args.stream, args.warmup, ready)
    harness.child_done(out)


# --- the parent -------------------------------------------------------------------


def child_cmd(args: argparse.Namespace, role: str, *extra: str) -> list[str]:
    return [*harness.self_cmd(__spec__), "--uri", args.uri,
            "--child", role, "--stream", STREAM, "--warmup", str(args.warmup),
            "--stall", str(args.stall), "--size", str(args.size), *extra]


def measure(args: argparse.Namespace, names: list[str], rate: int) -> dict[str, dict]:
    """Consumers ``names`` at one rate, subscribed at once in that order
    (each in its own process), then the publisher: a fresh stream, the
    same messages for every one of them."""
    harness.admin(args.uri, lambda a: (a.delete_stream(STREAM, missing_ok=True),
                                       a.create_stream(STREAM)))
    out: dict[str, dict] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            threads, results = [], {}
            for name in names:
                ready_file = os.path.join(tmp, f"ready-{name}")
                dumps = ("--dump", os.path.join(tmp, f"{name}.npz")) if len(names) > 1 else ()
                cmd = child_cmd(args, name, "--ready-file", ready_file,
                                "--expect", str(int(rate * args.seconds) + 1), *dumps)

                def run(name: str = name, cmd: list[str] = cmd) -> None:
                    results[name] = harness.run_child(
                        cmd, args.seconds + args.timeout + 30, args.uri)
                thread = threading.Thread(target=run)
                thread.start()
                threads.append(thread)
                deadline = time.monotonic() + 60
                while (not os.path.exists(ready_file) and thread.is_alive()
                       and time.monotonic() < deadline):
                    time.sleep(0.01)
                if not os.path.exists(ready_file):
                    for t in threads:
                        t.join()
                    why = results.get(name, {}).get("error", "no answer in 60 s")
                    return {n: {"error": f"{name} did not subscribe: {why}"} for n in names}
            publisher = harness.run_child(
                child_cmd(args, "publisher", "--rate", str(rate),
                          "--seconds", str(args.seconds),
                          "--tick-ms", str(args.tick_ms)),
                args.seconds + 120, args.uri)
            for t in threads:
                t.join()
            pairs = paired(tmp, names) if len(names) > 1 else {}
    finally:
        harness.admin(args.uri, lambda a: a.delete_stream(STREAM, missing_ok=True))
    for name in names:
        r = dict(results[name])
        if len(names) > 1:
            r["together"] = names
            mine = pairs.get(name, {})
            if "stalls" in mine:
                r["stalls"] = mine.pop("stalls")
            if mine:
                r["paired"] = mine
        if "error" in publisher:
            r["error"] = "publisher " + publisher["error"]
        else:
            r["publisher"] = publisher
            r["publisher_flagged"] = publisher["lag_max_ms"] > args.max_lag_ms
            if "error" not in r:
                r["lost"] = publisher["measured"] - r["messages"]
        out[name] = r
    return out


def paired(tmp: str, names: list[str]) -> dict[str, dict]:
    """Of consumers that read the same messages at once, pystream's latency
    against each other's message by message: the median and the 10th and
    90th percentiles of the differences (ms; below 0, pystream handed the
    message first) and the share of messages pystream handed first. What
    pystream adds to a message, apart from what the broker's delivery to
    each subscription adds, which differs from one to the next by a
    millisecond either way and so decides who has the higher p99. Every
    client's ``stalls`` against the C reference's, under its own name."""
    lat: dict[str, dict[int, float]] = {}
    for name in names:
        path = os.path.join(tmp, f"{name}.npz")
        if os.path.exists(path):
            with np.load(path) as d:
                lat[name] = dict(zip(d["seqs"].tolist(), d["ms"].tolist(), strict=True))
    mine = lat.get("pystream")
    out: dict[str, dict] = {}
    for other, theirs in lat.items():
        if mine is None or other == "pystream":
            continue
        common = sorted(mine.keys() & theirs.keys())
        if not common:
            continue
        diff = np.array([mine[s] - theirs[s] for s in common])
        p10, p50, p90 = np.percentile(diff, [10, 50, 90])
        out.setdefault("pystream", {})[other] = {
            "messages": len(common), "diff_p10_ms": float(p10),
            "diff_median_ms": float(p50), "diff_p90_ms": float(p90),
            "pystream_first": float(np.mean(diff < 0))}
    floor = lat.get("wire")
    for name, theirs in lat.items():
        if floor is not None and name != "wire":
            out.setdefault(name, {})["stalls"] = stalls(theirs, floor)
    return out


def stalls(lat: dict[int, float], floor: dict[int, float]) -> dict:
    """Where a consumer's tail comes from: the messages it handed over
    ``STALL_MS`` or more after the C reference did (its process not
    running, or not reading), grouped into episodes (stalled messages
    less than ``STALL_GAP`` messages apart), and how much of its top 1 %
    lies in them."""
    common = sorted(lat.keys() & floor.keys())
    if not common:
        return {}
    ms = np.array([lat[s] for s in common])
    excess = ms - np.array([floor[s] for s in common])
    stalled = np.nonzero(excess >= STALL_MS)[0]
    episodes = int(np.count_nonzero(np.diff(stalled) > STALL_GAP)) + 1 if len(stalled) else 0
    top = ms >= np.percentile(ms, 99)
    return {"episodes": episodes, "stalled_share": float(len(stalled) / len(ms)),
            "top1_stalled_share": float(np.mean(excess[top] >= STALL_MS)),
            "longest_ms": float(excess.max())}


def describe_run(r: dict) -> str:
    if "error" in r:
        return f"FAILED {r['error']}"
    msg = (f"p50 {fmt_ms(r['p50_ms'])} p99 {fmt_ms(r['p99_ms'])} "
           f"p99.9 {fmt_ms(r['p99.9_ms'])} max {fmt_ms(r['max_ms'])} ms, "
           f"{r['messages']:,} messages, lost {r['lost']}, consumer cpu {r['cpu_share']:.0%}")
    pub = r.get("publisher")
    if pub:
        msg += (f"; publisher {fmt_rate(pub['rate'])} msg/s, lag max "
                f"{pub['lag_max_ms']:.1f} ms" + (" (FLAGGED)" if r["publisher_flagged"] else ""))
    if r.get("load"):
        msg += f"; load {r['load'][0][0]:.1f}->{r['load'][1][0]:.1f}"
    return msg


def summarize(runs: list[dict], label: str) -> dict:
    """A client's runs at one rate: the median of the runs' p99 (and of
    their other percentiles), the spread of p99, and the run with the
    median p99 (its curve and histogram for the plots)."""
    good = sorted((r for r in runs if "error" not in r), key=lambda r: r["p99_ms"])
    slim = [{k: v for k, v in r.items() if k not in ("curve", "hist")} for r in runs]
    out: dict = {"label": label, "runs": slim, "failed": len(runs) - len(good)}
    if not good:
        out["error"] = runs[0].get("error", "failed")
        return out
    med = good[(len(good) - 1) // 2]
    out.update({
        "median_run": {k: med[k] for k in ("curve", "hist", "messages", "p99_ms")},
        "p99_median_ms": statistics.median(r["p99_ms"] for r in good),
        "p99_min_ms": good[0]["p99_ms"], "p99_max_ms": good[-1]["p99_ms"],
        "lost": sum(r["lost"] for r in good),
        "publisher_flagged": sum(bool(r.get("publisher_flagged")) for r in good),
    })
    others = {o for r in good for o in r.get("paired", {})}
    for other in sorted(others):
        runs_paired = [r["paired"][other] for r in good if other in r.get("paired", {})]
        out.setdefault("paired", {})[other] = {
            key: statistics.median(x[key] for x in runs_paired)
            for key in ("diff_p10_ms", "diff_median_ms", "diff_p90_ms", "pystream_first")}
        out["paired"][other]["runs"] = len(runs_paired)
    stalled = [r["stalls"] for r in good if r.get("stalls")]
    if stalled:
        out["stalls"] = {key: statistics.median(x[key] for x in stalled)
                         for key in stalled[0]}
    for key in ("p50_ms", "p90_ms", "p99.9_ms", "max_ms", "cpu_share",
                "broker_cpu_share"):
        if all(key in r for r in good):
            out[key.replace("_ms", "") + "_median" + ("_ms" if key.endswith("_ms") else "")] = \
                statistics.median(r[key] for r in good)
    return out


def fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def print_table(rate: int, by_client: dict[str, dict]) -> None:
    print(f"\n### {fmt_rate(rate)} msg/s  (medians of the runs; ms)")
    floor = by_client.get("wire", {}).get("p99_median_ms")
    for _name, r in by_client.items():
        if "error" in r:
            print(f"   {r['label']:<16} FAILED: {r['error']}")
            continue
        ratio = f"{r['p99_median_ms'] / floor:.1f}x C reference" if floor else ""
        print(f"   {r['label']:<16} p50 {fmt_ms(r['p50_median_ms']):>7}  "
              f"p99 {fmt_ms(r['p99_median_ms']):>7} ({fmt_ms(r['p99_min_ms'])}-"
              f"{fmt_ms(r['p99_max_ms'])})  {ratio}  lost {r['lost']}"
              f"{'  publisher flagged' if r['publisher_flagged'] else ''}")
    for other, p in by_client.get("pystream", {}).get("paired", {}).items():
        label = by_client.get(other, {}).get("label", other)
        print(f"   message by message, pystream - {label}: median "
              f"{p['diff_median_ms'] * 1000:+.0f} us (10th {p['diff_p10_ms'] * 1000:+.0f}, "
              f"90th {p['diff_p90_ms'] * 1000:+.0f}); pystream first for "
              f"{p['pystream_first']:.0%} of the messages")
    for _name, r in by_client.items():
        st = r.get("stalls")
        if st:
            print(f"   stalls of {r['label']} (messages {STALL_MS:g} ms or more after the "
                  f"C reference's): {st['episodes']:g} episodes, {st['stalled_share']:.2%} "
                  f"of the messages, {st['top1_stalled_share']:.0%} of its top 1 %, "
                  f"longest {st['longest_ms']:.1f} ms")


def check_targets(results: dict) -> list[dict]:
    """Each target at each rate, as measured: pystream's median p99 at most
    ``LATENCY_FACTOR`` times the C reference latency's, and below every peer's, the runs'
    p99s showing it beyond their spread (``report_format.lower_verdict``).
    The report judges stored results again with this."""
    out = []
    for rate, by_client in results.items():
        p = by_client.get("pystream", {}).get("p99_median_ms")
        mine = p99s(by_client.get("pystream", {}))
        for other in ("wire", *PEERS):
            if other not in by_client:
                continue
            q = by_client[other].get("p99_median_ms")
            met: bool | None | str
            lower_runs: list[int] | None = None
            if p is None or q is None:
                met = None
            elif other == "wire":
                met = p <= q * LATENCY_FACTOR
            else:
                pairs = paired_p99s(by_client["pystream"], by_client[other], other)
                met = (lower_verdict(*pairs, paired=True) if pairs
                       else lower_verdict(mine, p99s(by_client[other])))
                if pairs:
                    lower_runs = [sum(a < b for a, b in zip(*pairs, strict=True)),
                                  len(pairs[0])]
            out.append({"rate": rate, "against": other, "pystream_p99_ms": p,
                        "other_p99_ms": q, "met": met, "lower_runs": lower_runs})
    return out


def p99s(client: dict) -> list[float]:
    return [r["p99_ms"] for r in client.get("runs", []) if "p99_ms" in r]


def paired_p99s(mine: dict, theirs: dict, other: str
                ) -> tuple[list[float], list[float]] | None:
    """pystream's and ``other``'s p99s run by run, when each run read the
    same messages at once (``--together``); None otherwise."""
    pairs = list(zip(mine.get("runs", []), theirs.get("runs", []), strict=False))
    if not pairs or not all(other in a.get("together", ()) and "pystream" in b.get("together", ())
                            for a, b in pairs):
        return None
    good = [(a["p99_ms"], b["p99_ms"]) for a, b in pairs if "p99_ms" in a and "p99_ms" in b]
    return [x for x, _ in good], [y for _, y in good]


def plot(results: dict[int, dict[str, dict]], out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    out_dir.mkdir(parents=True, exist_ok=True)
    styles = ["-", "--", ":", "-."]
    rates = sorted(results)
    ms_ticks = FixedLocator([b * 10.0 ** e for e in range(-2, 6) for b in (1, 2, 5)])
    ms_labels = FuncFormatter(lambda v, _: f"{v:g}")

    fig, ax = plt.subplots(figsize=(10, 6))
    top = 1.0
    for i, rate in enumerate(rates):
        for name, r in results[rate].items():
            if "curve" not in r:
                continue
            x = 10.0 ** np.array(r["curve"]["x"])
            top = max(top, x[-1])
            ax.plot(x, r["curve"]["ms"], styles[i % len(styles)],
                    color=COLORS[name], lw=1.8,
                    label=f"{r['label']}, {fmt_rate(rate)} msg/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [(2, "50%"), (10, "90%"), (100, "99%"), (1e3, "99.9%"),
             (1e4, "99.99%"), (1e5, "99.999%"), (1e6, "99.9999%")]
    ticks = [t for t in ticks if t[0] <= top * 1.01]
    ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(1, top)
    ax.yaxis.set_major_locator(ms_ticks)
    ax.yaxis.set_major_formatter(ms_labels)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("percentile (the last point of a line is its maximum)")
    ax.set_ylabel("latency, publish to application (ms)")
    ax.set_title("Publish-to-application latency by percentile")
    ax.grid(True, alpha=0.4)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    curves = out_dir / "latency-percentiles.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)

    # x range: the bins that hold any message, a bin to spare either side
    used = [np.nonzero(r["hist"])[0] for runs in results.values()
            for r in runs.values() if "hist" in r]
    lo = max(0, min(u[0] for u in used) - 1) if used else 0
    hi = min(len(HIST_EDGES_MS) - 1, max(u[-1] for u in used) + 2) if used else -1
    fig, axes = plt.subplots(len(rates), 1, figsize=(10, 3.2 * len(rates)),
                             sharex=True, squeeze=False)
    for ax, rate in zip(axes[:, 0], rates, strict=True):
        for name, r in results[rate].items():
            if "hist" not in r:
                continue
            share = np.array(r["hist"]) / r["messages"]
            ax.stairs(np.where(share > 0, share, np.nan), HIST_EDGES_MS,
                      color=COLORS[name], lw=1.6,
                      label=f"{r['label']}\np99 {fmt_ms(r['p99_ms'])} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(HIST_EDGES_MS[lo], HIST_EDGES_MS[hi])
        ax.xaxis.set_major_locator(ms_ticks)
        ax.xaxis.set_major_formatter(ms_labels)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_ylabel("share of messages")
        ax.set_title(f"{fmt_rate(rate)} msg/s", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    axes[-1, 0].set_xlabel("latency, publish to application (ms); "
                           "bins of 1/20 decade")
    fig.tight_layout()
    hist = out_dir / "latency-histogram.png"
    fig.savefig(hist, dpi=120)
    plt.close(fig)
    return [curves, hist]


def parse_rates(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def main() -> None:
    # Five: at 1 k and 10 k msg/s each run falls into one of two regimes of
    # the broker's and the publisher's (docs/benchmarks.md, Latency).
    ap = harness.parser(__doc__, clients=CLIENTS, repeat=5, result="latency")
    ap.set_defaults(stall=20)
    ap.add_argument("--rates", default="1000,10000,100000",
                    help="comma-separated publishing rates in msg/s")
    ap.add_argument("--seconds", type=float, default=12,
                    help="how long the publisher sends at each rate")
    ap.add_argument("--warmup", type=float, default=2,
                    help="leave out messages sent in the first S seconds")
    ap.add_argument("--size", type=int, default=100, help="body bytes (>= 16)")
    ap.add_argument("--tick-ms", type=float, default=1.0,
                    help="the publisher's pacing step")
    ap.add_argument("--max-lag-ms", type=float, default=50,
                    help="flag a run whose publisher fell further behind")
    ap.add_argument("--catch-up", type=float, default=120,
                    help="seconds a consumer may take to catch up after the "
                         "publisher's end")
    ap.add_argument("--together", default="1000,10000",
                    help="rates at which every consumer of a run reads the same "
                         "messages at once, their p99s compared run by run "
                         "('' for none: taking turns)")
    ap.add_argument("--plot-dir", default=str(HERE / "results"),
                    help="where the PNGs go ('' for none)")
    ap.add_argument("--stream", help=harness.argparse.SUPPRESS)
    ap.add_argument("--rate", type=int, help=harness.argparse.SUPPRESS)
    ap.add_argument("--ready-file", help=harness.argparse.SUPPRESS)
    ap.add_argument("--expect", type=int, help=harness.argparse.SUPPRESS)
    ap.add_argument("--dump", help=harness.argparse.SUPPRESS)
    args = ap.parse_args()
    args.timeout = args.catch_up
    if args.child:
        child_main(args)
        return

    clients = harness.chosen(ap, args)
    if args.size < HEAD:
        ap.error(f"--size must be at least {HEAD}")
    if args.warmup >= args.seconds:
        ap.error("--warmup must be shorter than --seconds")
    rates = parse_rates(args.rates)
    together = set(parse_rates(args.together)) if args.together else set()
    info = harness.machine(args.uri)
    harness.banner(info, f"latency at {', '.join(fmt_rate(r) for r in rates)} msg/s, "
                         f"{args.seconds:g} s each (first {args.warmup:g} s left out)")

    runs: dict[int, dict[str, list[dict]]] = {r: {c: [] for c in clients} for r in rates}
    for rate in rates:
        for run in range(args.repeat):
            if rate in together:
                # all at once, the order of subscribing turned each run
                k = run % len(clients)
                groups = [[*clients[k:], *clients[:k]]]
            else:
                groups = [[name] for name in clients]  # taking turns
            for group in groups:
                got = measure(args, group, rate)
                if any("error" in r for r in got.values()):
                    # other users of the shared broker close connections
                    why = next(r["error"] for r in got.values() if "error" in r)
                    print(f"{fmt_rate(rate):>6} msg/s {'+'.join(group)} run {run + 1}: "
                          f"FAILED {why}; once more", flush=True)
                    harness.broker_version(args.uri)
                    got = {n: {**r, "retried_after": why}
                           for n, r in measure(args, group, rate).items()}
                for name in group:
                    r = got[name]
                    runs[rate][name].append(r)
                    print(f"{fmt_rate(rate):>6} msg/s {name:<9} run {run + 1}: "
                          f"{describe_run(r)}", flush=True)
    results = {rate: {name: summarize(rs, harness.label(name) if name in PEERS
                                      else "C reference latency" if name == "wire" else name)
                      for name, rs in by_client.items()}
               for rate, by_client in runs.items()}

    for rate in rates:
        print_table(rate, results[rate])
    targets = check_targets(results)
    print("\nTargets:")
    for t in targets:
        verdict = {True: "met", False: "NOT met", None: "not measured"}.get(
            t["met"], "not shown (within the runs' spread)")
        rule = (f"<= {LATENCY_FACTOR:g}x the C reference latency's" if t["against"] == "wire"
                else f"below {t['against']}'s")
        print(f"- {fmt_rate(t['rate'])} msg/s: pystream p99 {rule}: {verdict}")

    if args.plot_dir:
        curves = {rate: {name: {**r["median_run"], "label": r["label"]}
                         for name, r in by_client.items() if "median_run" in r}
                  for rate, by_client in results.items()}
        for path in plot(curves, Path(args.plot_dir)):
            print(f"plot written to {path}")
    harness.write_results(args.json, info, {
        "benchmark": "latency", "repeat": args.repeat, "seconds": args.seconds,
        "together": sorted(together),
        "warmup": args.warmup, "size": args.size, "tick_ms": args.tick_ms,
        "max_lag_ms": args.max_lag_ms,
        "hist_edges_ms": [float(f"{e:.6g}") for e in HIST_EDGES_MS],
        "targets": targets,
        "rates": {str(rate): by_client for rate, by_client in results.items()}})


if __name__ == "__main__":
    main()
