"""End-to-end publisher benchmark: how fast can Python publish to a RabbitMQ
stream, every message confirmed?

    .venv/bin/python -m bench.bench_publish                  # everything, 5 runs
    .venv/bin/python -m bench.bench_publish --only wire,pystream-arrow --repeat 3
    .venv/bin/python -m bench.bench_publish --rows 100b-peers --json ''

What it measures
----------------
Each run publishes AMQP 1.0 messages (one data section of a ``--body-size``,
100-byte, body) into a fresh stream on the modern broker (``--uri``), waits
for every confirm, checks that the stream holds exactly the messages
published and deletes it. Bodies are distinct (an 8-byte big-endian counter,
then a fixed pattern) and are built before the clock starts, as the
application would have them: a Python list of ``bytes``, or for
``pystream-arrow`` one ``pyarrow.binary()`` array over a single buffer.

Two rows, every client in a row publishing the same messages:

* ``100b``: 10 M (``--messages``): the C reference publisher and pystream;
* ``100b-peers``: 1 M (``--peer-messages``): every client (rstream
  publishing AMQP messages would need minutes per run at 10 M).

Clients, each in a fresh process with its own connection:

* ``wire``: the C reference publisher, ``bench/wire/wire publish`` in C: Publish
  frames of ~1 MiB pre-encoded once, only the publishing ids and body
  counters patched, confirms read in the same poll loop, at most
  ``--wire-in-flight`` (1 Mi) unconfirmed.
* ``pystream``: ``client.producer(stream, max_in_flight=F)`` and
  ``producer.send_batch(bodies[i:i + B])`` on the list of ``bytes``, then
  ``producer.flush()``; B = ``--pystream-batch`` (100 k), F =
  ``--pystream-in-flight`` (200 k).
* ``pystream-arrow``: the same with zero-copy slices of the arrow array.
* ``pystream-raw`` (not by default): the list with ``amqp=False`` (raw
  entries: not the same messages as the others).
* ``rbfly``: ``PublisherBatchFast``, its documented fastest path:
  ``publisher.batch(body)`` per message and ``await publisher.flush()``
  every ``--rbfly-batch`` (1000) messages.
* ``rstream``: ``Producer.send_batch(stream, [AMQPMessage(body=b), ...])``,
  a 1 MiB frame's worth per call (``--rstream-batch``), an
  ``on_publish_confirm`` callback counting confirms, at most
  ``--rstream-in-flight`` (200 k) unconfirmed: AMQP messages as the others.
* ``rstream-raw`` (not by default): the same with ``bytes``, which rstream
  publishes as raw entries.

The clock starts after connecting, just before the producer is declared,
and stops when the last confirm has arrived. Each run records the
publisher's CPU time and the broker process's (from /proc) over that window
and the load average before and after; the clients take turns within each
repetition; figures are medians of ``--repeat`` runs.

Targets: pystream >= 90 % of the C reference publisher at 10 M, and ahead of rbfly
and rstream.
"""

from __future__ import annotations

import gc

from bench import harness
from bench.harness import PROGRESS, Window, make_body
from pystream.errors import StreamError

CLIENTS = ("wire", "pystream", "pystream-arrow", "pystream-raw", "rbfly",
           "rstream", "rstream-raw")
DEFAULT = ("wire", "pystream", "pystream-arrow", "rbfly", "rstream")
PEERS = ("rbfly", "rstream", "rstream-raw")
PUBLISH_OVERHEAD = 13           # Publish frame: size, key, version, id, count
ENTRY_OVERHEAD = 12             # publishing id, entry size
AMQP_OVERHEAD = 8               # 00 53 75 b0 <u32 len>
FRAME_MAX = 1 << 20


def frame_capacity(entry_size: int) -> int:
    """Messages of ``entry_size`` bytes that fit in one 1 MiB Publish frame."""
    return max(1, (FRAME_MAX - PUBLISH_OVERHEAD) // (ENTRY_OVERHEAD + entry_size))


# --- bodies (built before the clock starts) ---------------------------------------


def body_matrix(n: int, size: int):
    """An (n, size) uint8 array: row i is the big-endian counter i, then the
    fixed pattern of ``make_body``."""
    import numpy as np
    data = np.empty((n, size), np.uint8)
    data[:] = np.frombuffer(make_body(size), np.uint8)
    k = min(8, size)
    if k:
        ids = np.arange(n, dtype=">u8").view(np.uint8).reshape(n, 8)
        data[:, :k] = ids[:, 8 - k:]
    return data


def body_list(n: int, size: int) -> list[bytes]:
    blob = body_matrix(n, size).tobytes()
    return [blob[i:i + size] for i in range(0, n * size, size)]


def body_array(n: int, size: int):
    """One pyarrow binary array over a single data buffer (large_binary past
    2 GiB)."""
    import numpy as np
    import pyarrow as pa
    data = body_matrix(n, size).reshape(-1)
    large = n * size >= 2**31
    offsets = np.arange(0, (n + 1) * size, size,
                        dtype=np.int64 if large else np.int32)
    return pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), n,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# --- publishers (each runs in a child process) ------------------------------------


def publish_pystream(args, clock: Window, kind: str, via: bool = False) -> dict:
    import pystream
    from bench.bench_consume import through
    n, batch = args.target, args.batch
    if kind == "pystream-arrow":
        bodies = body_array(n, args.body_size)
    else:
        bodies = body_list(n, args.body_size)
    options = {"max_in_flight": args.in_flight}
    if kind == "pystream-raw":
        options["amqp"] = False
    recoveries = recovery_log()
    with pystream.connect(args.uri,
                          address_resolver=through(args.uri) if via else None) as client:
        gc.freeze()
        clock.start()
        producer = client.producer(args.stream, **options)
        send = producer.send_batch
        for start in range(0, n, batch):
            send(bodies[start:start + batch])
            PROGRESS[0] = start + batch
        producer.flush(args.timeout)
        out = clock.stop(n, batch=batch, **options)
        producer.close()
    if recoveries:
        out["recoveries"] = recoveries
    return out


def recovery_log() -> list[str]:
    """What the producer logs when it recovers (another user of the shared
    broker closed its connection, say): an unnamed producer sends its
    unconfirmed frames again, so the stream may hold more than was
    published, and the run's error says why."""
    import logging
    seen: list[str] = []

    class Recoveries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "recovered from" in record.getMessage():
                seen.append(record.getMessage())

    logging.getLogger("pystream.producer").addHandler(Recoveries(logging.WARNING))
    return seen


def publish_rbfly(args, clock: Window) -> dict:
    import asyncio

    from rbfly.streams import PublisherBatchFast, streams_client

    n, batch = args.target, args.batch
    bodies = body_list(n, args.body_size)

    async def run() -> dict:
        client = streams_client(args.uri)
        await client.get_protocol()  # connect before the clock starts
        gc.freeze()
        clock.start()
        async with client.publisher(args.stream, cls=PublisherBatchFast) as publisher:
            add, flush = publisher.batch, publisher.flush
            for start in range(0, n, batch):
                for body in bodies[start:start + batch]:
                    add(body)
                await flush()
                PROGRESS[0] = start + batch
            out = clock.stop(n, batch=batch)
        return out

    return asyncio.run(run())


def publish_rstream(args, clock: Window, amqp: bool, via: bool = False) -> dict:
    import asyncio

    from rstream import AMQPMessage, ConfirmationStatus, Producer

    from pystream.uri import parse_uri

    a = parse_uri(args.uri)
    n, window = args.target, args.in_flight
    entry = args.body_size + (AMQP_OVERHEAD if amqp else 0)
    batch = args.batch or frame_capacity(entry)
    if batch > frame_capacity(entry):
        raise SystemExit(f"--rstream-batch {batch}: at most {frame_capacity(entry)} "
                         f"messages of {entry} B fit in one 1 MiB frame")
    bodies = body_list(n, args.body_size)

    async def run() -> dict:
        confirmed = failed = 0
        wake_at = [0]
        wake = asyncio.Event()

        def on_confirm(status: ConfirmationStatus) -> None:
            nonlocal confirmed, failed
            confirmed += 1
            if not status.is_confirmed:
                failed += 1
            if confirmed >= wake_at[0]:
                wake.set()

        async def confirmed_at_least(count: int) -> None:
            while confirmed < count:
                wake.clear()
                wake_at[0] = count
                await wake.wait()

        # load_balancer_mode: dial the address given, never the node the
        # broker advertises (through a relay, bench_distance)
        producer = Producer(a.host, a.port, username=a.username,
                            password=a.password, vhost=a.virtual_host,
                            load_balancer_mode=via)
        await producer.start()  # connect before the clock starts
        gc.freeze()
        clock.start()
        sent = 0
        for start in range(0, n, batch):
            chunk = bodies[start:start + batch]
            if amqp:
                chunk = [AMQPMessage(body=b) for b in chunk]
            await confirmed_at_least(sent + len(chunk) - window)
            await producer.send_batch(args.stream, chunk,
                                      on_publish_confirm=on_confirm)
            sent += len(chunk)
            PROGRESS[0] = sent
        await asyncio.wait_for(confirmed_at_least(n), args.timeout)
        if failed:
            raise SystemExit(f"rstream: {failed} messages refused")
        return clock.stop(n, batch=batch, max_in_flight=window)

    return asyncio.run(run())


def publish(kind: str, args, via: bool = False) -> dict:
    """One publisher's run; ``via``: ``args.uri`` is a relay every
    connection must go through."""
    clock = Window()
    if kind in ("pystream", "pystream-arrow", "pystream-raw"):
        return publish_pystream(args, clock, kind, via=via)
    if kind == "rbfly":
        return publish_rbfly(args, clock)
    if kind in ("rstream", "rstream-raw"):
        return publish_rstream(args, clock, amqp=(kind == "rstream"), via=via)
    raise SystemExit(f"unknown publisher {kind}")


def child_main(args) -> None:
    harness.start_watchdog(args.stall)
    harness.child_done(publish(args.child, args))


# --- the parent -------------------------------------------------------------------


def settings(args, client: str) -> tuple[int, int]:
    """(batch, in flight) of a client."""
    if client.startswith("pystream"):
        return args.pystream_batch, args.pystream_in_flight
    if client == "rbfly":
        return args.rbfly_batch, 0
    if client.startswith("rstream"):
        return args.rstream_batch, args.rstream_in_flight
    return 0, args.wire_in_flight


def one_run(args, client: str, target: int, name: str) -> dict:
    """Publish into a fresh stream, check what it holds, delete it."""
    harness.admin(args.uri, lambda a: a.delete_stream(name, missing_ok=True))
    harness.admin(args.uri, lambda a: a.create_stream(name))
    try:
        batch, in_flight = settings(args, client)
        if client == "wire":
            res = harness.run_wire("publish", args.uri, name, target,
                                   args.body_size, in_flight, timeout=args.timeout)
        else:
            cmd = [*harness.self_cmd(__spec__), "--uri", args.uri,
                   "--child", client, "--stream", name, "--target", str(target),
                   "--body-size", str(args.body_size), "--batch", str(batch),
                   "--in-flight", str(in_flight), "--stall", str(args.stall),
                   "--timeout", str(args.timeout)]
            res = harness.run_child(cmd, args.timeout, args.uri)
        if "error" not in res:
            res = counted(args.uri, name, target, res)
    finally:
        harness.admin(args.uri, lambda a: a.delete_stream(name, missing_ok=True))
    return res


def counted(uri: str, stream: str, target: int, res: dict) -> dict:
    """``res`` with the count the stream holds, and an error when that is
    not what was published."""
    try:
        end = harness.stream_end(uri, stream)
    except StreamError as exc:
        return {**res, "error": f"could not count the stream: {exc}"}
    res = {**res, "stream_holds": end}
    if end != target:
        res["error"] = f"the stream holds {end:,} messages, {target:,} published"
        if res.get("recoveries"):
            res["error"] += (f" (the producer recovered {len(res['recoveries'])} "
                             f"time(s): {res['recoveries'][0]})")
    return res


def add_settings(ap: harness.argparse.ArgumentParser) -> None:
    """Each publisher's batch and in-flight options (read by ``settings``)."""
    ap.add_argument("--wire-in-flight", type=int, default=1 << 20)
    ap.add_argument("--pystream-batch", type=int, default=100_000)
    ap.add_argument("--pystream-in-flight", type=int, default=200_000)
    ap.add_argument("--rbfly-batch", type=int, default=1000)
    ap.add_argument("--rstream-batch", type=int, default=0,
                    help="messages per send_batch, 0: a 1 MiB frame's worth")
    ap.add_argument("--rstream-in-flight", type=int, default=200_000)


def main() -> None:
    ap = harness.parser(__doc__, clients=CLIENTS, default=DEFAULT, result="publish")
    ap.add_argument("--rows", default="100b,100b-peers",
                    help="which rows: 100b (pystream and the C reference publisher), "
                         "100b-peers (every client)")
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--peer-messages", type=int, default=1_000_000,
                    help="messages of the 100b-peers row (every client)")
    ap.add_argument("--body-size", type=int, default=100)
    add_settings(ap)
    ap.add_argument("--stream", help=harness.argparse.SUPPRESS)
    ap.add_argument("--target", type=int, help=harness.argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=0, help=harness.argparse.SUPPRESS)
    ap.add_argument("--in-flight", type=int, default=0, help=harness.argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    clients = harness.chosen(ap, args)
    all_rows = {"100b": {"messages": args.messages, "peers": False},
                "100b-peers": {"messages": args.peer_messages, "peers": True}}
    keys = harness.chosen_rows(ap, args.rows, all_rows)
    info = harness.machine(args.uri)
    harness.banner(info, "publish")
    cases = [(k, c) for k in keys for c in clients
             if all_rows[k]["peers"] or c not in PEERS]

    runs = harness.interleave(
        args.repeat, cases,
        lambda case: one_run(args, case[1], all_rows[case[0]]["messages"],
                             f"bench-publish-{case[1]}"),
        label=lambda case: f"{case[0]} {case[1]}")

    grouped = harness.by_row(cases, runs)
    out_rows = {}
    for k in keys:
        out_clients = {}
        for c, c_runs in grouped[k].items():
            batch, in_flight = settings(args, c)
            out_clients[c] = {"label": harness.label(c.split("-")[0]) if c in PEERS else c,
                              "batch": batch, "in_flight": in_flight,
                              "summary": harness.summarize(c_runs, args.body_size),
                              "runs": c_runs}
        out_rows[k] = {"messages": all_rows[k]["messages"], "body_size": args.body_size,
                       "clients": out_clients}
        harness.print_clients(f"publish {k}: {all_rows[k]['messages']:,} × "
                              f"{args.body_size} B", out_clients)
    harness.write_results(args.json, info, {
        "benchmark": "publish", "repeat": args.repeat, "rows": out_rows})


if __name__ == "__main__":
    main()
