"""End-to-end consumer benchmark: how fast can Python read a RabbitMQ stream?

    .venv/bin/python -m bench.bench_consume                   # everything, 5 runs
    .venv/bin/python -m bench.bench_consume --only wire,pystream --repeat 3
    .venv/bin/python -m bench.bench_consume --rows 1k --json ''

What it measures
----------------
Two streams on the modern broker (RabbitMQ 4.0, ``--uri``) are filled once
and kept between runs (for speed; delete them to start afresh):
``bench-100b`` with 10 M AMQP 1.0 messages of a 100-byte body and
``bench-1k`` with 1 M of a 1 KiB body (one data section each). A stream
that is missing or short is topped up by the C publisher.

Three rows, each read from offset "first" by every client named in it, the
same messages for all of them (same stream, same count, same encoding):

* ``100b``: 10 M × 100 B, the C reference reader and pystream (the peers would
  need minutes per run);
* ``100b-peers``: the first ``--peer-messages`` (2 M) of the same stream,
  every client;
* ``1k``: 1 M × 1 KiB, every client.

Clients, each run in a fresh process with its own connection:

* ``wire``: the C reference reader, ``bench/wire/wire consume`` in C: connects
  (inside its window, as pystream's consumer opens a connection to the
  stream's node inside its own) and subscribes as pystream's consumer
  does (credit 1, then a Credit of 63: pystream's most), ``recv``s into
  one 64 MiB buffer (a chunk's records in reads of up to 1 MiB with
  ``MSG_WAITALL``, as pystream reads them), walks frame sizes and chunk
  headers, counts records, grants one credit per chunk once all of it is in;
  never reads an entry. What the broker and loopback TCP allow. (Reads of
  whatever is there and credit at a chunk's header made it slower than
  pystream at 1 KiB: 2.3-2.5 against 2.7-2.9 M msg/s.)
* ``wire-crc`` (not by default): the same C reader checking each chunk's
  CRC-32 as its entries arrive (ISA-L, as pystream; the CPU class's fold
  under ``PYSTREAM_BENCH_CPU_CLASS``): what a reader that checks costs.
* ``wire-keep`` (not by default): ``wire-crc`` receiving each chunk whole
  into one of three blocks in turn, as pystream receives each chunk into a
  block its batch keeps (its columns point into it) instead of reading
  into the same hot MiB again and again: what a checking reader that hands
  out its records uncopied costs.
* ``pystream``: ``client.consumer(stream, offset="first")`` with its
  defaults (CRC on, AMQP decoded, ``body="view"``), one Arrow batch per chunk.
* ``pystream-raw`` (not by default): the same with ``amqp=False``.
* ``rbfly``: ``stream_client.subscribe(stream, offset=Offset.FIRST)``, the
  async iterator of message bodies (AMQP decoded, CRC checked).
* ``rstream``: ``Consumer.subscribe(stream, callback, decoder=amqp_decoder)``.

The clock starts just before the subscription is requested (after connect
and imports) and stops when the last wanted message has been handed to the
application. Each run records the reader's CPU time and the broker
process's (``beam.smp``, from /proc) over the same window, and the load
average before and after. The clients take turns within each repetition,
so the machine's noise (it is shared) hits all of them alike; figures are
medians of ``--repeat`` runs.

Targets: pystream >= 95 % of the C reference reader in the ``100b`` and ``1k`` rows.
"""

from __future__ import annotations

from bench import harness
from bench.harness import PROGRESS, Window

CLIENTS = ("wire", "wire-crc", "wire-keep", "pystream", "pystream-raw", "rbfly", "rstream")
DEFAULT = ("wire", "pystream", "rbfly", "rstream")
PEERS = ("rbfly", "rstream")
LABELS = {"wire-crc": "C reader, CRC checked",
          "wire-keep": "C reader, CRC checked, chunks kept whole"}
STREAMS = {"bench-100b": 100, "bench-1k": 1024}


def rows(args) -> dict[str, dict]:
    """Each row: stream, body size, messages, and which clients read it."""
    return {
        "100b": {"stream": "bench-100b", "body_size": 100,
                 "messages": args.messages_100b, "peers": False},
        "100b-peers": {"stream": "bench-100b", "body_size": 100,
                       "messages": args.peer_messages, "peers": True},
        "1k": {"stream": "bench-1k", "body_size": 1024,
               "messages": args.messages_1k, "peers": True},
    }


# --- readers (each runs in a child process) --------------------------------------


def through(uri: str):
    """pystream's ``address_resolver`` sending every node to the URI's
    address (a relay in front of the broker: bench_distance)."""
    from pystream.pool import Endpoint
    from pystream.uri import parse_uri
    a = parse_uri(uri)
    return lambda endpoint: Endpoint(a.host, a.port)


def read_pystream(uri: str, stream: str, target: int, body_size: int,
                  amqp: bool, via: bool = False) -> dict:
    import pystream
    n = chunks = 0
    checked = False
    window = Window()
    with pystream.connect(uri, address_resolver=through(uri) if via else None) as client:
        window.start()
        with client.consumer(stream, offset="first", amqp=amqp) as consumer:
            for batch in consumer:
                window.data()
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
            out = window.stop(target, records_received=n, batches=chunks)
    return out


def read_rbfly(uri: str, stream: str, target: int, body_size: int) -> dict:
    import asyncio

    from rbfly.streams import Offset, streams_client

    async def run() -> dict:
        client = streams_client(uri)
        await client.get_protocol()  # connect before the clock starts
        n = 0
        window = Window()
        window.start()
        async for body in client.subscribe(stream, offset=Offset.FIRST):
            if n == 0:
                window.data()
                if len(body) != body_size:
                    raise SystemExit(f"rbfly body of {len(body)} bytes")
            n += 1
            if not n & 0xFFFF:
                PROGRESS[0] = n
            if n >= target:
                break
        return window.stop(n)

    return asyncio.run(run())


def read_rstream(uri: str, stream: str, target: int, body_size: int,
                 via: bool = False) -> dict:
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

    async def run() -> dict:
        done = asyncio.Event()
        n = 0
        window = Window()

        def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
            nonlocal n
            if n == 0:
                window.data()
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

        # load_balancer_mode: dial the address given, never the node the
        # broker advertises (through a relay, bench_distance)
        consumer = Consumer(a.host, a.port, username=a.username,
                            password=a.password, vhost=a.virtual_host,
                            load_balancer_mode=via)
        await consumer.start()  # connect before the clock starts
        window.start()
        await consumer.subscribe(
            stream, on_message, decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await done.wait()
        return window.stop(min(n, target))

    return asyncio.run(run())


def read(reader: str, uri: str, stream: str, target: int, size: int,
         via: bool = False) -> dict:
    """One reader's run; ``via``: the URI is a relay every connection must
    go through."""
    if reader in ("pystream", "pystream-raw"):
        return read_pystream(uri, stream, target, size, amqp=reader == "pystream",
                             via=via)
    if reader == "rbfly":
        return read_rbfly(uri, stream, target, size)
    if reader == "rstream":
        return read_rstream(uri, stream, target, size, via=via)
    raise SystemExit(f"unknown reader {reader}")


def child_main(args) -> None:
    harness.start_watchdog(args.stall)
    reader, target = args.child, args.target
    out = read(reader, args.uri, args.stream, target, args.body_size)
    if out["messages"] < target:
        raise SystemExit(f"{reader} read {out['messages']} of {target}")
    harness.child_done(out)


# --- the parent -------------------------------------------------------------------


def prefill(uri: str, stream: str, body_size: int, count: int) -> int:
    """Make ``stream`` hold at least ``count`` messages (the C publisher tops
    it up); return its end."""
    import pystream
    with pystream.connect(uri) as client:
        client.create_stream(stream, exist_ok=True)
    have = harness.stream_end(uri, stream)
    if have < count:
        print(f"pre-fill {stream}: {have:,} -> {count:,} messages of "
              f"{body_size} B", flush=True)
        res = harness.run_wire("publish", uri, stream, count - have, body_size)
        if "error" in res:
            raise SystemExit(f"pre-fill {stream}: {res['error']}")
        print(f"pre-fill {stream}: {harness.describe(res)}", flush=True)
        have = harness.stream_end(uri, stream)
    else:
        print(f"{stream}: reusing {have:,} messages", flush=True)
    return have


def run_one(args, row: dict, reader: str) -> dict:
    if reader in ("wire", "wire-crc", "wire-keep"):
        crc = {"wire": [], "wire-crc": ["crc"], "wire-keep": ["crc,keep"]}[reader]
        return harness.run_wire("consume", args.uri, row["stream"], row["messages"],
                                args.wire_window, *crc, timeout=args.timeout)
    cmd = [*harness.self_cmd(__spec__), "--uri", args.uri,
           "--child", reader, "--stream", row["stream"],
           "--target", str(row["messages"]), "--body-size", str(row["body_size"]),
           "--stall", str(args.stall)]
    return harness.run_child(cmd, args.timeout, args.uri)


def main() -> None:
    ap = harness.parser(__doc__, clients=CLIENTS, default=DEFAULT, result="consume")
    ap.add_argument("--rows", default="100b,100b-peers,1k",
                    help="which rows: 100b, 100b-peers, 1k")
    ap.add_argument("--messages-100b", type=int, default=10_000_000)
    ap.add_argument("--peer-messages", type=int, default=2_000_000,
                    help="messages of the 100b-peers row (every client)")
    ap.add_argument("--messages-1k", type=int, default=1_000_000)
    ap.add_argument("--wire-window", type=int, default=64,
                    help="chunks in flight of the C reader (pystream's most: 64)")
    ap.add_argument("--pin", metavar="BROKER/CLIENTS",
                    help="cores of the broker and of the clients, apart (0/1)")
    ap.add_argument("--stream", help=harness.argparse.SUPPRESS)
    ap.add_argument("--target", type=int, help=harness.argparse.SUPPRESS)
    ap.add_argument("--body-size", type=int, help=harness.argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    clients = harness.chosen(ap, args)
    all_rows = rows(args)
    keys = harness.chosen_rows(ap, args.rows, all_rows)
    info = harness.machine(args.uri)
    if args.pin:
        info["pinned"] = harness.pin(args.uri, args.pin)
    harness.banner(info, "consume")

    wanted: dict[str, int] = {}
    for k in keys:
        r = all_rows[k]
        wanted[r["stream"]] = max(wanted.get(r["stream"], 0), r["messages"])
    ends = {s: prefill(args.uri, s, STREAMS[s], n) for s, n in wanted.items()}

    cases = [(k, c) for k in keys for c in clients
             if all_rows[k]["peers"] or c not in PEERS]
    runs = harness.interleave(
        args.repeat, cases, lambda case: run_one(args, all_rows[case[0]], case[1]),
        label=lambda case: f"{case[0]} {case[1]}")

    grouped = harness.by_row(cases, runs)
    out_rows = {}
    for k in keys:
        r = all_rows[k]
        out_clients = {c: {"label": harness.label(c) if c in PEERS else LABELS.get(c, c),
                           "summary": harness.summarize(c_runs, r["body_size"]),
                           "runs": c_runs}
                       for c, c_runs in grouped[k].items()}
        out_rows[k] = {**r, "stream_end": ends[r["stream"]], "clients": out_clients}
        harness.print_clients(f"{k}: {r['messages']:,} × {r['body_size']} B from "
                              f"{r['stream']}", out_clients, mb=True)
        p = out_clients.get("pystream", {}).get("summary")
        for ref in ("wire", "wire-crc", "wire-keep"):
            w = out_clients.get(ref, {}).get("summary")
            if w and p:
                print(f"   pystream / {ref} = "
                      f"{p['msg_per_s_median'] / w['msg_per_s_median']:.1%}")
    harness.write_results(args.json, info, {
        "benchmark": "consume", "repeat": args.repeat, "wire_window": args.wire_window,
        "rows": out_rows})


if __name__ == "__main__":
    main()
