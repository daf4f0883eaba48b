"""End-to-end consumer benchmark: how fast can Python read a RabbitMQ stream?

    .venv/bin/python bench/bench_consume.py                   # everything, 3 runs
    .venv/bin/python bench/bench_consume.py --only wire,pystream --repeat 5
    .venv/bin/python bench/bench_consume.py --json results.json
    .venv/bin/python bench/bench_consume.py --plot bench/results/consume.png

What it measures
----------------
Two streams on the modern broker (RabbitMQ 4.0, ``--uri``) are filled once
and reused across runs: ``bench-100b`` with 10 M AMQP 1.0 messages of a
100-byte body and ``bench-1k`` with 1 M messages of a 1 KiB body (one data
section each, ``00 53 75 b0 <u32 len> <body>``). A stream that is missing or
holds fewer messages is topped up by a raw publisher (``_wire.publish``:
pre-encoded Publish frames of ~1 MiB, every confirm awaited).

Each reader then reads a stream from offset "first" until the wanted number
of messages (offsets 0..N-1), in a fresh process with its own connection:

* ``wire``: the wire limit. A raw socket client (``_wire.read_wire``) that
  subscribes, ``recv_into``s a large reusable buffer, looks only at frame
  sizes and the chunk headers' NumRecords and sends Credit 1 per chunk
  (initial credit ``--wire-credit``, 32). No
  CRC, no decoding: the broker plus loopback TCP, with as little Python as
  possible on our side.
* ``pystream``: ``client.consumer(stream, offset="first")`` with its
  defaults (CRC on, AMQP decoded, ``body="view"``), one Arrow RecordBatch
  per chunk.
* ``pystream-raw``: the same with ``amqp=False`` (raw entry bytes as body).
* ``rbfly``: ``stream_client.subscribe(stream, offset=Offset.FIRST)``, the
  async iterator of message bodies (AMQP decoded, CRC checked).
* ``rstream``: ``Consumer.subscribe(stream, callback, decoder=amqp_decoder)``,
  a callback per decoded AMQP message (rstream's documented consumer).

The clock starts just before the subscription is requested (after connect
and imports) and stops when the last wanted message has been handed to the
application (pystream's consumer and rstream's subscribe open their own
connection to the stream's node inside that window: ~10 ms). ``msg/s`` is
messages over that time; ``MB/s`` is body bytes
(100 or 1024 per message, decimal MB) over that time. ``cpu`` is the reader
process's own CPU time in the same window (user + system; the broker runs on
the same 2 cores).

rbfly and rstream are much slower, so by default they read only the first
``--peer-limit`` messages of each stream (2 M); their rate is computed on
that and the table marks it. Every figure is the median of ``--repeat`` runs
(readers interleaved run by run, to spread the machine's noise).
Targets: pystream >= 70% of the wire limit and >= 15x rbfly on 100-byte
messages.

A run that reads nothing new for ``--stall`` seconds (a client retrying
forever) is ended and reported as failed; the other readers go on.

``--pystream-credit`` picks the pystream consumer's credit policy
(``on_arrival:32``, ``adaptive:1e9``, ...; default: the consumer's own).
Worth knowing when reading the figures: RabbitMQ sends each chunk whole in
one Deliver frame whatever frame_max says (the 1 KiB stream's chunks are
~8 MB), and it holds Credit back while a subscription's credit is at most
half of its initial credit (``send_limit = initial div 2`` in
rabbit_stream_reader), so a client that tops up fewer than that stalls.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _runs import (PROGRESS, fmt_rate, make_body, parse_choices,  # noqa: E402
                   run_child_process, start_watchdog, summarize)

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
READERS = ("wire", "pystream", "pystream-raw", "rbfly", "rstream")
PEERS = ("rbfly", "rstream")
LABELS = {
    "wire": "wire limit",
    "pystream": "pystream",
    "pystream-raw": "pystream amqp=False",
    "rbfly": "rbfly 0.10",
    "rstream": "rstream 1.1.1",
}
STREAMS = {  # key: (stream name, body bytes)
    "100b": ("bench-100b", 100),
    "1k": ("bench-1k", 1024),
}


# --- readers (each runs in a child process) --------------------------------------


def read_wire(uri: str, stream: str, target: int, body_size: int,
              credit: int) -> dict:
    import _wire
    r = _wire.read_wire(uri, stream, target, credit=credit)
    recs = sorted(r.chunk_records)
    return {"messages": min(r.records, target), "seconds": r.seconds,
            "cpu": r.cpu,
            "records_received": r.records, "chunks": r.chunks,
            "chunk_records_median": recs[len(recs) // 2] if recs else 0,
            "chunk_records_min": recs[0] if recs else 0,
            "chunk_records_max": recs[-1] if recs else 0,
            "chunk_bytes_mean": r.chunk_bytes / r.chunks if r.chunks else 0,
            "wire_bytes": r.wire_bytes}


def credit_policy(spec: str):
    """``--pystream-credit``: None (the consumer's default) or a Credit."""
    if spec in ("", "default"):
        return None
    import pystream
    mode, *nums = spec.split(":")
    values = [int(float(x)) for x in nums]
    if mode == "adaptive":
        return pystream.Credit.adaptive(*values)
    if mode in ("on_arrival", "on_consumed", "manual"):
        return getattr(pystream.Credit, mode)(*values)
    raise SystemExit(f"unknown credit policy {spec!r}")


def read_pystream(uri: str, stream: str, target: int, body_size: int,
                  amqp: bool, credit: str = "default") -> dict:
    import pystream
    n = chunks = 0
    checked = False
    options = {"amqp": amqp}
    policy = credit_policy(credit)
    if policy is not None:
        options["credit"] = policy
    with pystream.connect(uri) as client:
        cpu0, t0 = time.process_time(), time.perf_counter()
        with client.consumer(stream, offset="first", **options) as consumer:
            for batch in consumer:
                n += batch.num_rows
                chunks += 1
                PROGRESS[0] = n
                if not checked and batch.num_rows:
                    checked = True
                    got = len(batch.column("body")[0].as_py())
                    want = body_size if amqp else body_size + 8
                    if got != want:
                        raise SystemExit(f"body of {got} bytes, expected {want}")
                if consumer.position >= target:
                    break
            t1, cpu1 = time.perf_counter(), time.process_time()
    return {"messages": min(n, target), "seconds": t1 - t0, "cpu": cpu1 - cpu0,
            "records_received": n, "batches": chunks}


def read_rbfly(uri: str, stream: str, target: int, body_size: int) -> dict:
    import asyncio

    from rbfly.streams import Offset, streams_client

    async def run() -> dict:
        client = streams_client(uri)
        await client.get_protocol()  # connect before the clock starts
        n = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        gen = client.subscribe(stream, offset=Offset.FIRST)
        async for body in gen:
            if n == 0 and len(body) != body_size:
                raise SystemExit(f"rbfly body of {len(body)} bytes")
            n += 1
            if not n & 0xFFFF:
                PROGRESS[0] = n
            if n >= target:
                break
        t1, cpu1 = time.perf_counter(), time.process_time()
        return {"messages": n, "seconds": t1 - t0, "cpu": cpu1 - cpu0}

    return asyncio.run(run())


def read_rstream(uri: str, stream: str, target: int, body_size: int) -> dict:
    import asyncio

    from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification,
                         MessageContext, OffsetType, amqp_decoder)

    from pystream.uri import parse_uri

    a = parse_uri(uri)

    async def run() -> dict:
        done = asyncio.Event()
        n = 0

        def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
            nonlocal n
            if n == 0:
                body = msg.body
                size = len(body if isinstance(body, (bytes, bytearray))
                           else b"".join(body))
                if size != body_size:
                    raise SystemExit(f"rstream body of {size} bytes")
            n += 1
            if not n & 0xFFFF:
                PROGRESS[0] = n
            if n == target:
                done.set()

        consumer = Consumer(a.host, a.port, username=a.username,
                            password=a.password, vhost=a.virtual_host)
        await consumer.start()  # connect before the clock starts
        cpu0, t0 = time.process_time(), time.perf_counter()
        await consumer.subscribe(
            stream, on_message, decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await done.wait()
        t1, cpu1 = time.perf_counter(), time.process_time()
        return {"messages": min(n, target), "seconds": t1 - t0, "cpu": cpu1 - cpu0}

    return asyncio.run(run())


def child_main(args: argparse.Namespace) -> None:
    reader, stream, target, body_size = (args.child, args.stream, args.target,
                                         args.body_size)
    if reader != "wire":
        start_watchdog(args.stall)
    if reader == "wire":
        out = read_wire(args.uri, stream, target, body_size, args.wire_credit)
    elif reader in ("pystream", "pystream-raw"):
        out = read_pystream(args.uri, stream, target, body_size,
                            amqp=(reader == "pystream"),
                            credit=args.pystream_credit)
    elif reader == "rbfly":
        out = read_rbfly(args.uri, stream, target, body_size)
    elif reader == "rstream":
        out = read_rstream(args.uri, stream, target, body_size)
    else:
        raise SystemExit(f"unknown reader {reader}")
    if out["messages"] < target:
        raise SystemExit(f"{reader} read {out['messages']} of {target}")
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # do not wait for the peers' slow teardown


# --- the parent -------------------------------------------------------------------


def prefill(uri: str, stream: str, body_size: int, count: int) -> int:
    """Make ``stream`` hold at least ``count`` messages; return its end."""
    import _wire

    import pystream
    with pystream.connect(uri) as client:
        client.create_stream(stream, exist_ok=True)
    have = _wire.stream_end(uri, stream)
    if have < count:
        print(f"pre-fill {stream}: {have:,} -> {count:,} messages of "
              f"{body_size} B", flush=True)
        seconds = _wire.publish(uri, stream, count - have, make_body(body_size))
        n = count - have
        print(f"pre-fill {stream}: {n:,} messages in {seconds:.1f} s "
              f"({n / seconds / 1e6:.2f} M msg/s)", flush=True)
        have = _wire.stream_end(uri, stream)
    else:
        print(f"{stream}: reusing {have:,} messages", flush=True)
    return have


def run_child(args: argparse.Namespace, reader: str, stream: str, target: int,
              body_size: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--uri", args.uri,
           "--child", reader, "--stream", stream, "--target", str(target),
           "--body-size", str(body_size), "--wire-credit", str(args.wire_credit),
           "--stall", str(args.stall)]
    if args.pystream_credit != "default":
        cmd += ["--pystream-credit", args.pystream_credit]
    return run_child_process(cmd, args.timeout)


def print_table(key: str, stream: str, body_size: int, end: int,
                summary: dict, errors: dict, chunk_info: dict | None,
                peer_target: int, target: int) -> dict:
    print()
    print(f"== {stream}: AMQP 1.0 messages of {body_size} B body, "
          f"{target:,} read (stream holds {end:,}) ==")
    if chunk_info:
        print(f"   broker chunks: {chunk_info['chunks']:,} for {target:,} records; "
              f"records per chunk median {chunk_info['chunk_records_median']:,} "
              f"(min {chunk_info['chunk_records_min']:,}, max "
              f"{chunk_info['chunk_records_max']:,}), "
              f"{chunk_info['chunk_bytes_mean'] / 1e3:.0f} kB per chunk")
    head = (f"   {'reader':<22}{'messages':>12}{'median s':>10}{'msg/s':>10}"
            f"{'MB/s':>9}{'cpu':>6}   runs (msg/s)")
    print(head)
    print("   " + "-" * (len(head) - 3))
    for reader in READERS:
        s = summary.get(reader)
        if s is None:
            if reader in errors:
                print(f"   {LABELS[reader]:<22}FAILED: {errors[reader]}")
            continue
        mark = "*" if s["messages"] < target else " "
        cpu = f"{s['cpu_share_median'] * 100:.0f}%" if "cpu_share_median" in s else "-"
        runs = ", ".join(fmt_rate(x) for x in s["msg_per_s_all"])
        print(f"   {LABELS[reader]:<22}{s['messages']:>11,}{mark}"
              f"{s['seconds_median']:>10.3f}{fmt_rate(s['msg_per_s_median']):>10}"
              f"{s['mb_per_s_median']:>9.0f}{cpu:>6}   {runs}")
    if any(s["messages"] < target for s in summary.values()):
        print(f"   * read only the first {peer_target:,} messages (--peer-limit); "
              "rate computed on those")
    ratios = {}
    p = summary.get("pystream")
    for other, label in (("wire", "wire limit"), ("rbfly", "rbfly"),
                         ("rstream", "rstream")):
        o = summary.get(other)
        if p and o:
            ratios[f"pystream/{other}"] = p["msg_per_s_median"] / o["msg_per_s_median"]
    raw = summary.get("pystream-raw")
    if raw and summary.get("wire"):
        ratios["pystream-raw/wire"] = (raw["msg_per_s_median"]
                                       / summary["wire"]["msg_per_s_median"])
    if ratios:
        parts = []
        for name, value in ratios.items():
            txt = f"{value:.0%}" if "wire" in name else f"{value:.1f}x"
            if key == "100b" and name == "pystream/wire":
                txt += " (target >= 70%)"
            if key == "100b" and name == "pystream/rbfly":
                txt += " (target >= 15x)"
            parts.append(f"{name} = {txt}")
        print("   ratios (medians of msg/s): " + "; ".join(parts))
    return ratios


def plot_bars(path: str, results: dict) -> None:
    """A bar chart of the median msg/s: one group per stream, one bar per
    reader (log scale: the readers span two orders of magnitude)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = results["streams"]
    readers = [r for r in READERS
               if any(r in v["summary"] for v in streams.values())]
    width = 0.8 / max(1, len(readers))
    fig, ax = plt.subplots(figsize=(2 + 2.2 * len(streams), 5))
    for i, reader in enumerate(readers):
        xs, ys = [], []
        for j, info in enumerate(streams.values()):
            s = info["summary"].get(reader)
            if s is not None:
                xs.append(j + (i - (len(readers) - 1) / 2) * width)
                ys.append(s["msg_per_s_median"])
        bars = ax.bar(xs, ys, width, label=LABELS[reader])
        ax.bar_label(bars, [fmt_rate(y) for y in ys], fontsize=7, padding=2)
    ax.set_xticks(range(len(streams)), [
        f"{name}: {info['body_size']} B bodies\n{info['messages']:,} read"
        + (f" (rbfly, rstream: {info['peer_messages']:,})"
           if info["peer_messages"] < info["messages"] else "")
        for name, info in streams.items()])
    ax.set_yscale("log")
    ax.set_ylabel("messages per second (median, log scale)")
    ax.set_title(f"Reading a stream to the end (RabbitMQ "
                 f"{results['broker_version']}, median of {results['repeat']} "
                 f"run{'s' if results['repeat'] > 1 else ''})")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default=os.environ.get("PYSTREAM_TEST_URI", DEFAULT_URI))
    ap.add_argument("--messages-100b", type=int, default=10_000_000)
    ap.add_argument("--messages-1k", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=",".join(READERS),
                    help=f"comma-separated readers among {', '.join(READERS)}")
    ap.add_argument("--streams", default="100b,1k",
                    help="which streams: 100b, 1k or both (default)")
    ap.add_argument("--peer-limit", type=int, default=2_000_000,
                    help="rbfly and rstream read only the first K messages "
                         "(0: all); default 2M")
    ap.add_argument("--wire-credit", type=int, default=32,
                    help="initial credit of the wire-limit reader")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds allowed to one reader run")
    ap.add_argument("--stall", type=float, default=20,
                    help="end a run that read nothing new for this many seconds")
    ap.add_argument("--json", help="write machine-readable results here")
    ap.add_argument("--plot", metavar="PATH",
                    help="write a bar chart of the medians here (PNG)")
    ap.add_argument("--pystream-credit", default="default",
                    help="credit policy of the pystream consumer: default, "
                         "adaptive:MAX_BYTES[:MAX_OUTSTANDING], on_arrival:N, "
                         "on_consumed:N")
    # internal: one reader in a child process
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--stream", help=argparse.SUPPRESS)
    ap.add_argument("--target", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--body-size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        child_main(args)
        return

    readers = parse_choices(ap, args.only, READERS, "readers")
    keys = [k.strip() for k in args.streams.split(",") if k.strip()]
    if set(keys) - set(STREAMS):
        ap.error("--streams takes 100b and/or 1k")
    wanted = {"100b": args.messages_100b, "1k": args.messages_1k}

    import pystream
    with pystream.connect(args.uri) as client:
        broker = client.server_properties.get("version", "?")
    print(f"broker RabbitMQ {broker} at {args.uri.split('@')[-1]}; "
          f"{os.cpu_count()} cores; python {platform.python_version()}; "
          f"{args.repeat} runs per reader; readers: {', '.join(readers)}; "
          f"pystream credit policy: {args.pystream_credit}")

    ends = {k: prefill(args.uri, STREAMS[k][0], STREAMS[k][1], wanted[k])
            for k in keys}

    raw: dict[str, dict[str, list[dict]]] = {k: {r: [] for r in readers} for k in keys}
    for rep in range(args.repeat):
        for k in keys:
            stream, body_size = STREAMS[k]
            target = wanted[k]
            peer_target = (min(args.peer_limit, target) if args.peer_limit > 0
                           else target)
            for reader in readers:
                n = peer_target if reader in PEERS else target
                res = run_child(args, reader, stream, n, body_size)
                raw[k][reader].append(res)
                if "error" in res:
                    msg = f"FAILED {res['error']}"
                else:
                    rate = res["messages"] / res["seconds"]
                    msg = (f"{res['messages']:,} in {res['seconds']:.3f} s, "
                           f"{fmt_rate(rate)} msg/s")
                print(f"run {rep + 1}/{args.repeat} {stream:<11} {reader:<13} "
                      f"{msg}", flush=True)

    results = {"broker_version": broker, "uri": args.uri.split("@")[-1],
               "cores": os.cpu_count(), "repeat": args.repeat,
               "pystream_credit": args.pystream_credit,
               "peer_limit": args.peer_limit, "streams": {}}
    for k in keys:
        stream, body_size = STREAMS[k]
        target = wanted[k]
        peer_target = min(args.peer_limit, target) if args.peer_limit > 0 else target
        summary, errors = {}, {}
        for reader in readers:
            s = summarize(raw[k][reader], body_size)
            if s is not None:
                summary[reader] = s
            bad = [r["error"] for r in raw[k][reader] if "error" in r]
            if bad:
                errors[reader] = bad[-1]
        wire_runs = [r for r in raw[k].get("wire", []) if "error" not in r]
        chunk_info = wire_runs[0] if wire_runs else None
        ratios = print_table(k, stream, body_size, ends[k], summary, errors,
                             chunk_info, peer_target, target)
        results["streams"][stream] = {
            "body_size": body_size, "messages": target, "stream_end": ends[k],
            "peer_messages": peer_target, "summary": summary, "ratios": ratios,
            "errors": errors, "runs": raw[k],
            "chunks": ({x: chunk_info[x] for x in chunk_info
                        if x.startswith("chunk")} if chunk_info else None),
        }
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    if args.plot:
        plot_bars(args.plot, results)


if __name__ == "__main__":
    main()
