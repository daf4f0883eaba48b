"""Throughput at a distance: reading and publishing through a relay that
adds 0, 1, 5 and 20 ms to every round trip, as a client in another zone
sees the broker.

    .venv/bin/python -m bench.bench_distance                   # everything, 3 runs
    .venv/bin/python -m bench.bench_distance --rtts 0,20 --only wire,pystream
    .venv/bin/python -m bench.bench_distance --parts consume --repeat 1 --json ''

What it measures
----------------
Every run goes through its own ``bench/relay/relay`` (C, epoll; see
relay.c), started fresh on a free port of 127.0.0.1 in front of the modern
broker (``--uri``), holding each direction's bytes for half the round-trip
time (``--rtts``, milliseconds; 0 is the relay alone, the reference of the
ratios: the same path, no distance). Its buffer (64 MiB each way) holds
three times the bandwidth-delay product of 1 GB/s over 20 ms, so it never
throttles. Clients that dial the node a stream's metadata advertises
(localhost:5552) would go around the relay: pystream gets an
``address_resolver`` and rstream ``load_balancer_mode=True`` so every
connection dials the relay, and each run checks the relay's byte counts
(a run whose messages did not all cross the relay fails).

Consume (bench_consume's readers, the same messages for all): ``100b``,
the first ``--messages-100b`` (2 M) of ``bench-100b``, and ``1k``, the
first ``--messages-1k`` (1 M) of ``bench-1k`` (both filled by
bench_consume's prefill when short), read by ``wire`` (the C reader, 64
chunks of credit: the C reference on that path), ``pystream`` (default
``Credit.adaptive()``), ``rbfly`` and ``rstream``. The clock starts
before the subscription (pystream's consumer and rstream open their
connection to the stream's node inside it, as the C reader does) and
stops at the last message; ``first_data`` marks when the first one
arrived, so each run gives two rates: over the whole window (handshakes
and the first round trips included) and the flow's, messages over the
time from first data to the last message.

Publish (bench_publish's publishers and settings): ``--publish-messages``
(500 k) AMQP messages of 100 B into a fresh stream by ``wire`` (the C
publisher, 1 Mi in flight), ``pystream`` (batches of 100 k, 200 k
in flight), ``rbfly`` (``PublisherBatchFast``, a flush, which awaits its
confirms, every 1000) and ``rstream`` (a 1 MiB frame's worth per call,
200 k in flight); the clock runs from before the producer is declared to
the last confirm; each run checks the stream holds exactly what was sent.

All cases take turns within each repetition (the machine is shared);
figures are medians of ``--repeat`` runs.

Target: pystream at 20 ms >= 90 % of its rate at 0 ms, ahead of rbfly and
rstream at every distance.
"""

from __future__ import annotations

import statistics

from bench import bench_consume, bench_publish, harness
from bench.relay.delay import DelayRelay
from pystream.uri import parse_uri

CLIENTS = ("wire", "pystream", "rbfly", "rstream")
PEERS = ("rbfly", "rstream")
PARTS = ("consume", "publish")


def consume_rows(args) -> dict[str, dict]:
    return {"100b": {"stream": "bench-100b", "body_size": 100,
                     "messages": args.messages_100b},
            "1k": {"stream": "bench-1k", "body_size": 1024,
                   "messages": args.messages_1k}}


def publish_rows(args) -> dict[str, dict]:
    return {"100b": {"body_size": 100, "messages": args.publish_messages}}


# --- children --------------------------------------------------------------------


def child_main(args) -> None:
    harness.start_watchdog(args.stall)
    part, client = args.child.split(":")
    if part == "consume":
        out = bench_consume.read(client, args.uri, args.stream, args.target,
                                 args.body_size, via=True)
        if out["messages"] < args.target:
            raise SystemExit(f"{client} read {out['messages']} of {args.target}")
    else:
        out = bench_publish.publish(client, args, via=True)
    harness.child_done(out)


# --- one run through a fresh relay ----------------------------------------------------


def through_relay(args, rtt: float, run) -> dict:
    """``run(relay_uri)`` with a relay of ``rtt`` ms in front of the broker;
    the result gains the relay's byte counts and CPU time."""
    a = parse_uri(args.uri)
    with DelayRelay(a.host, a.port, rtt_ms=rtt) as relay:
        cpu0 = harness.proc_cpu(relay.proc.pid)
        res = run(relay.uri(args.uri))
        cpu1 = harness.proc_cpu(relay.proc.pid)
    stats = relay.final_stats or {}
    res["relay"] = {**stats, "cpu": (cpu1 or 0) - (cpu0 or 0)}
    return res


def consume_run(args, row: dict, client: str, rtt: float) -> dict:
    def run(relay_uri: str) -> dict:
        if client == "wire":
            cmd = harness.wire_cmd("consume", relay_uri, row["stream"], row["messages"], 64)
        else:
            cmd = [*harness.self_cmd(__spec__), "--uri", relay_uri,
                   "--child", f"consume:{client}", "--stream", row["stream"],
                   "--target", str(row["messages"]),
                   "--body-size", str(row["body_size"]), "--stall", str(args.stall)]
        # args.uri: the broker's process is found by its own port
        return harness.run_child(cmd, args.timeout, args.uri)

    res = through_relay(args, rtt, run)
    payload = row["messages"] * row["body_size"]
    if "error" not in res and res["relay"].get("bytes_down", 0) < payload:
        res["error"] = (f"{res['relay'].get('bytes_down', 0):,} bytes came through "
                        f"the relay, the messages hold {payload:,}: a connection "
                        "went around it")
    return res


def publish_run(args, row: dict, client: str, rtt: float) -> dict:
    name = f"bench-distance-{client}"
    target, size = row["messages"], row["body_size"]
    harness.admin(args.uri, lambda a: a.delete_stream(name, missing_ok=True))
    harness.admin(args.uri, lambda a: a.create_stream(name))
    try:
        batch, in_flight = bench_publish.settings(args, client)

        def run(relay_uri: str) -> dict:
            if client == "wire":
                cmd = harness.wire_cmd("publish", relay_uri, name, target, size,
                                       in_flight)
            else:
                cmd = [*harness.self_cmd(__spec__),
                       "--uri", relay_uri, "--child", f"publish:{client}",
                       "--stream", name, "--target", str(target),
                       "--body-size", str(size), "--batch", str(batch),
                       "--in-flight", str(in_flight), "--stall", str(args.stall),
                       "--timeout", str(args.timeout)]
            return harness.run_child(cmd, args.timeout, args.uri)

        res = through_relay(args, rtt, run)
        if "error" not in res:
            res = bench_publish.counted(args.uri, name, target, res)
            if "error" not in res and res["relay"].get("bytes_up", 0) < target * size:
                res["error"] = "a connection went around the relay"
    finally:
        harness.admin(args.uri, lambda a: a.delete_stream(name, missing_ok=True))
    return res


# --- the parent -------------------------------------------------------------------------


def flow_rate(runs: list[dict]) -> float | None:
    """Median of messages / (seconds after the first data arrived)."""
    rates = [r["messages"] / (r["seconds"] - r["first_data"]) for r in runs
             if "error" not in r and 0 <= r.get("first_data", -1) < r["seconds"]]
    return statistics.median(rates) if rates else None


def summary(runs: list[dict], body_size: int) -> dict | None:
    s = harness.summarize(runs, body_size)
    if s is not None:
        flow = flow_rate(runs)
        if flow is not None:
            s["flow_msg_per_s_median"] = flow
        good = [r for r in runs if "error" not in r]
        if all("first_data" in r for r in good):
            s["first_data_median"] = statistics.median(r["first_data"] for r in good)
        s["relay_cpu_share_median"] = statistics.median(
            r["relay"]["cpu"] / r["seconds"] for r in good)
    return s


def main() -> None:
    ap = harness.parser(__doc__, clients=CLIENTS, repeat=3, result="distance")
    ap.add_argument("--rtts", default="0,1,5,20",
                    help="added round-trip times, ms (default 0,1,5,20)")
    ap.add_argument("--parts", default="consume,publish",
                    help="consume, publish or both")
    ap.add_argument("--messages-100b", type=int, default=2_000_000)
    ap.add_argument("--messages-1k", type=int, default=1_000_000)
    ap.add_argument("--publish-messages", type=int, default=500_000)
    bench_publish.add_settings(ap)
    for hidden in ("--stream", "--target", "--body-size", "--batch", "--in-flight"):
        ap.add_argument(hidden, type=str if hidden == "--stream" else int,
                        default=0, help=harness.argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    clients = harness.chosen(ap, args)
    parts = harness.chosen_rows(ap, args.parts, PARTS)
    rtts = [float(x) for x in args.rtts.split(",")]
    info = harness.machine(args.uri)
    harness.banner(info, "distance")

    cons, pubs = consume_rows(args), publish_rows(args)
    if "consume" in parts:
        wanted: dict[str, int] = {}
        for r in cons.values():
            wanted[r["stream"]] = max(wanted.get(r["stream"], 0), r["messages"])
        for s, n in wanted.items():
            bench_consume.prefill(args.uri, s, bench_consume.STREAMS[s], n)

    cases = [(part, k, rtt, c) for rtt in rtts for part in parts
             for k in (cons if part == "consume" else pubs) for c in clients]

    def run(case) -> dict:
        part, k, rtt, c = case
        if part == "consume":
            return consume_run(args, cons[k], c, rtt)
        return publish_run(args, pubs[k], c, rtt)

    runs = harness.interleave(args.repeat, cases, run,
                              label=lambda case: f"{case[0]} {case[1]} {case[2]:g} ms {case[3]}")

    out: dict[str, dict] = {}
    for i, (part, k, rtt, c) in enumerate(cases):
        row = (cons if part == "consume" else pubs)[k]
        entry = out.setdefault(part, {}).setdefault(k, {**row, "rtt": {}})
        entry["rtt"].setdefault(f"{rtt:g}", {})[c] = {
            "label": harness.label(c) if c in PEERS else c,
            "summary": summary(runs[i], row["body_size"]), "runs": runs[i]}
    for part, part_rows in out.items():
        for k, entry in part_rows.items():
            for rtt, by_client in entry["rtt"].items():
                harness.print_clients(f"{part} {k}: {entry['messages']:,} × "
                                      f"{entry['body_size']} B, +{rtt} ms", by_client)
                for c, v in by_client.items():
                    s = v["summary"]
                    if s and "flow_msg_per_s_median" in s:
                        print(f"   {c:<10} flow {harness.fmt_rate(s['flow_msg_per_s_median'])}"
                              f" msg/s, first data after {s['first_data_median'] * 1e3:.0f} ms")
    harness.write_results(args.json, info, {
        "benchmark": "distance", "repeat": args.repeat, "rtts_ms": rtts,
        "relay_buffer_bytes": 64 << 20, **out})


if __name__ == "__main__":
    main()
