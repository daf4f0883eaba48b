"""End-to-end publisher benchmark: how fast can Python publish to a RabbitMQ
stream, every message confirmed?

    .venv/bin/python bench/bench_publish.py                  # everything, 3 runs
    .venv/bin/python bench/bench_publish.py --only wire,pystream-arrow --repeat 5
    .venv/bin/python bench/bench_publish.py --only pystream-arrow \\
        --pystream-batch 10000,100000 --pystream-in-flight 200000,1000000
    .venv/bin/python bench/bench_publish.py --json results.json

What it measures
----------------
Each run publishes ``--messages`` messages (10 M) with a ``--body-size``
body (100 bytes) into a fresh stream on the modern broker (RabbitMQ 4.0,
``--uri``), waits for every confirm, checks that the stream holds exactly
the messages published and deletes it. Bodies are distinct (an 8-byte
big-endian counter, then a fixed pattern) and are built before the clock
starts, as the application would have them: a Python list of ``bytes``,
or for ``pystream-arrow`` one ``pyarrow.binary()`` array over a single
buffer.

Each publisher runs in a fresh process with its own connection:

* ``wire``: the wire limit. ``_wire.publish``: pre-encoded Publish frames of
  ~1 MiB of the same AMQP message, only the publishing ids patched (numpy),
  confirms counted by a second thread, up to ``--wire-in-flight`` messages
  unconfirmed (1 Mi). No per-message Python, no per-message body: the
  broker plus loopback TCP.
* ``pystream``: ``client.producer(stream, max_in_flight=F)`` and
  ``producer.send_batch(bodies[i:i + B])`` on the list of ``bytes``, then
  ``producer.flush()``. AMQP 1.0 messages (one data section), as the
  others. ``--pystream-batch`` B (100 k) and ``--pystream-in-flight`` F
  (200 k) take comma-separated lists to compare settings (one row each):
  10 k or 100 k by 100 k, 200 k or 1 M all ran within the noise of each
  other here (the broker is the limit), 100 k batches cost the client a
  little less CPU than 10 k.
* ``pystream-arrow``: the same with zero-copy slices of a pre-built
  ``pyarrow.binary()`` array (no Python object per message).
* ``pystream-raw`` (not run by default): the list, ``amqp=False`` (bodies
  are published as raw entries, as ``rstream`` does with bytes).
* ``pystream-sub`` (not run by default): the arrow slices with
  ``compression="none"``: ``--pystream-sub-batch`` (100) messages per
  uncompressed sub-batch entry, one publishing id and one confirm per
  entry. Not the same work for the broker (it stores and confirms entries,
  not messages), so not the comparison with the peers; consumers see the
  same records (offsets count the messages inside entries).
* ``rbfly``: rbfly 0.10's ``PublisherBatchFast``, its documented fastest
  path: ``publisher.batch(body)`` per message and ``await publisher.flush()``
  every ``--rbfly-batch`` messages (1000: the fastest of 250 to 200 k
  tried on this machine). ``flush`` sends one frame (up to 1 MiB) at a
  time and waits for its confirms before the next, under a lock, so one
  frame is in flight; a flush of many frames' worth costs more (it re-packs
  the rest of its list per frame). rbfly names its publisher ``<host>/<pid>``
  (broker-side deduplication on), its default.
* ``rstream``: rstream 1.1.1's ``Producer.send_batch(stream, bodies)``, one
  Publish frame per call (send_batch does not split by frame_max, so a call
  gets at most a frame's worth: ``--rstream-batch``, 0 = as many as fit in
  1 MiB), with an ``on_publish_confirm`` callback (called per message: the
  only way rstream reports confirms of ``send_batch``) counting confirms;
  at most ``--rstream-in-flight`` messages unconfirmed. Its fastest path
  passes ``bytes``, which rstream publishes as *raw* entries, not AMQP
  messages (8 bytes less per message, no encoding): compare with
  ``pystream-raw``.
* ``rstream-amqp`` (not run by default): the same with ``AMQPMessage(body=...)``
  objects, rstream's AMQP 1.0 encoding.

The clock starts after connecting, just before the producer (publisher) is
declared, and stops when the last confirm has arrived (rstream declares its
publisher on its first ``send_batch``, over a connection it opens to the
stream's leader then: inside the window, ~10 ms). ``msg/s`` is messages
over that time; ``MB/s`` is body bytes over that time (decimal MB).
``cpu`` is the publisher process's CPU time (user + system, all threads)
over the window divided by the window; ``broker`` the same for the
broker's process (``beam.smp``, found by the port it listens on, when it
runs on this machine).

rbfly and rstream are much slower, so by default they publish only the
first ``--peer-limit`` messages (2 M); their rate is computed on that and
the table marks it. Every figure is the median of ``--repeat`` runs
(publishers interleaved run by run, to spread the machine's noise).
Target: pystream at least as fast as the fastest peer.

On this 2-core machine the broker is the limit for one publisher of
100-byte messages: about 1.2 cores of ``beam.smp`` for ~450 k msg/s, the
wire limit and pystream alike (pystream's own CPU: ~10 %, its main thread
mostly blocked in ``sendall``). Other clients of the same broker (a test
suite) skew the figures; one that closes connections makes a producer
without a name send its unconfirmed messages again (duplicates, at least
once): the count check below reports such a run as failed.

Checking the count: after a run the parent subscribes to the stream at
offset "last" (which delivers the last chunk) and reads that chunk's
header: first offset + records is the number of records the stream holds
(``_wire.stream_end``). A run whose stream holds another number than the
messages published fails. A run that sends nothing new for ``--stall``
seconds is ended and reported as failed; the others go on.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _runs import (PROGRESS, fmt_rate, make_body, parse_choices,  # noqa: E402
                   run_child_process, start_watchdog, summarize)

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
CLIENTS = ("wire", "pystream", "pystream-arrow", "pystream-raw",
           "pystream-sub", "rbfly", "rstream", "rstream-amqp")
DEFAULT_CLIENTS = ("wire", "pystream", "pystream-arrow", "rbfly", "rstream")
PYSTREAM = ("pystream", "pystream-arrow", "pystream-raw", "pystream-sub")
PEERS = ("rbfly", "rstream", "rstream-amqp")
LABELS = {
    "wire": "wire limit",
    "pystream": "pystream list",
    "pystream-arrow": "pystream arrow",
    "pystream-raw": "pystream list raw",
    "pystream-sub": "pystream arrow sub-batches",
    "rbfly": "rbfly 0.10",
    "rstream": "rstream 1.1.1 raw",
    "rstream-amqp": "rstream 1.1.1 amqp",
}
PUBLISH_OVERHEAD = 13           # Publish frame: size, key, version, id, count
ENTRY_OVERHEAD = 12             # publishing id, entry size
AMQP_OVERHEAD = 8               # 00 53 75 b0 <u32 len>
FRAME_MAX = 1 << 20


def frame_capacity(entry_size: int) -> int:
    """Messages of ``entry_size`` bytes that fit in one 1 MiB Publish frame."""
    return max(1, (FRAME_MAX - PUBLISH_OVERHEAD) // (ENTRY_OVERHEAD + entry_size))


def short(n: int) -> str:
    for div, unit in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % (div // 10) == 0:
            return f"{n / div:g}{unit}"
    return str(n)


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


class Clock:
    """Wall and CPU time of this process, and the broker's CPU time."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid

    def _broker_cpu(self) -> float | None:
        if self.broker_pid <= 0:
            return None
        try:
            stat = Path(f"/proc/{self.broker_pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        gc.collect()
        self.b0 = self._broker_cpu()
        self.cpu0, self.t0 = time.process_time(), time.perf_counter()

    def stop(self, messages: int, **extra: object) -> dict:
        t1, cpu1 = time.perf_counter(), time.process_time()
        b1 = self._broker_cpu()
        out = {"messages": messages, "seconds": t1 - self.t0,
               "cpu": cpu1 - self.cpu0, **extra}
        if self.b0 is not None and b1 is not None:
            out["broker_cpu"] = b1 - self.b0
        return out


# --- publishers (each runs in a child process) ------------------------------------


def publish_wire(args: argparse.Namespace, clock: Clock) -> dict:
    import _wire
    body = make_body(args.body_size)
    clock.start()
    seconds = _wire.publish(args.uri, args.stream, args.target, body,
                            max_in_flight=args.in_flight, progress=False)
    out = clock.stop(args.target)
    # _wire.publish times itself from after DeclarePublisher; keep the
    # process-wide window for cpu, its own for the rate
    out["cpu"] *= seconds / out["seconds"]
    if "broker_cpu" in out:
        out["broker_cpu"] *= seconds / out["seconds"]
    out["seconds"] = seconds
    return out


def publish_pystream(args: argparse.Namespace, clock: Clock, kind: str) -> dict:
    import pystream
    n, batch = args.target, args.batch
    if kind in ("pystream-arrow", "pystream-sub"):
        bodies = body_array(n, args.body_size)
    else:
        bodies = body_list(n, args.body_size)
    options = {"max_in_flight": args.in_flight}
    if kind == "pystream-raw":
        options["amqp"] = False
    if kind == "pystream-sub":
        options.update(compression="none", sub_batch_size=args.sub_batch)
    with pystream.connect(args.uri) as client:
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
    return out


def publish_rbfly(args: argparse.Namespace, clock: Clock) -> dict:
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


def publish_rstream(args: argparse.Namespace, clock: Clock, amqp: bool) -> dict:
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

        producer = Producer(a.host, a.port, username=a.username,
                            password=a.password, vhost=a.virtual_host)
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


def child_main(args: argparse.Namespace) -> None:
    kind = args.child
    start_watchdog(args.stall)
    clock = Clock(args.broker_pid)
    if kind == "wire":
        out = publish_wire(args, clock)
    elif kind in PYSTREAM:
        out = publish_pystream(args, clock, kind)
    elif kind == "rbfly":
        out = publish_rbfly(args, clock)
    elif kind in ("rstream", "rstream-amqp"):
        out = publish_rstream(args, clock, amqp=(kind == "rstream-amqp"))
    else:
        raise SystemExit(f"unknown publisher {kind}")
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # do not wait for the peers' slow teardown


# --- the parent -------------------------------------------------------------------


def broker_pid(uri: str) -> int:
    """The pid of the process listening on the URI's port, when the broker
    runs here (``ss -ltnp``); 0 when unknown."""
    from pystream.uri import parse_uri
    a = parse_uri(uri)
    if a.host not in ("localhost", "127.0.0.1", "::1"):
        return 0
    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{a.port}"],
                             capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else 0


def variants(args: argparse.Namespace, clients: list[str]) -> list[dict]:
    """One entry per (client, batch, in-flight) combination to run."""
    def ints(text: str) -> list[int]:
        return [int(float(x)) for x in text.split(",") if x.strip()]

    out = []
    for c in clients:
        if c in PYSTREAM:
            combos = [(b, f) for b in ints(args.pystream_batch)
                      for f in ints(args.pystream_in_flight)]
        elif c == "rbfly":
            combos = [(b, 0) for b in ints(args.rbfly_batch)]
        elif c.startswith("rstream"):
            combos = [(b, f) for b in ints(args.rstream_batch)
                      for f in ints(args.rstream_in_flight)]
        else:
            combos = [(0, f) for f in ints(args.wire_in_flight)]
        for b, f in combos:
            label = LABELS[c]
            if len(combos) > 1:
                label += ((f" b={short(b)}" if b else "")
                          + (f" f={short(f)}" if f else ""))
            out.append({"client": c, "batch": b, "in_flight": f,
                        "key": f"{c}/{b}/{f}", "label": label,
                        "swept": len(combos) > 1})
    return out


def run_child(args: argparse.Namespace, v: dict, stream: str, target: int,
              pid: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--uri", args.uri,
           "--child", v["client"], "--stream", stream, "--target", str(target),
           "--body-size", str(args.body_size), "--batch", str(v["batch"]),
           "--in-flight", str(v["in_flight"]), "--stall", str(args.stall),
           "--timeout", str(args.timeout), "--broker-pid", str(pid),
           "--sub-batch", str(args.pystream_sub_batch)]
    return run_child_process(cmd, args.timeout)


def one_run(args: argparse.Namespace, client, v: dict, target: int, pid: int,
            name: str) -> dict:
    """Publish into a fresh stream, check what it holds, delete it."""
    import _wire
    client.delete_stream(name, missing_ok=True)
    client.create_stream(name)
    try:
        res = run_child(args, v, name, target, pid)
        if "error" not in res:
            end = _wire.stream_end(args.uri, name)
            res["stream_holds"] = end
            if end != target:
                res = {"error": f"the stream holds {end:,} messages, "
                                f"{target:,} published", **res}
    finally:
        client.delete_stream(name, missing_ok=True)
    return res


def print_table(args: argparse.Namespace, vs: list[dict], summary: dict,
                errors: dict, peer_target: int) -> dict:
    target = args.messages
    print()
    print(f"== publish {target:,} messages of {args.body_size} B body, every "
          f"confirm awaited; fresh stream per run ==")
    head = (f"   {'publisher':<30}{'messages':>12}{'median s':>10}{'msg/s':>10}"
            f"{'MB/s':>8}{'cpu':>6}{'broker':>8}   runs (msg/s)")
    print(head)
    print("   " + "-" * (len(head) - 3))
    for v in vs:
        s = summary.get(v["key"])
        if s is None:
            if v["key"] in errors:
                print(f"   {v['label']:<30}FAILED: {errors[v['key']][-1]}")
            continue
        mark = "*" if s["messages"] < target else " "
        cpu = f"{s['cpu_share_median'] * 100:.0f}%"
        broker = (f"{s['broker_cpu_share_median'] * 100:.0f}%"
                  if "broker_cpu_share_median" in s else "-")
        runs = ", ".join(fmt_rate(x) for x in s["msg_per_s_all"])
        bad = f"  ({len(errors[v['key']])} failed)" if v["key"] in errors else ""
        print(f"   {v['label']:<30}{s['messages']:>11,}{mark}"
              f"{s['seconds_median']:>10.3f}{fmt_rate(s['msg_per_s_median']):>10}"
              f"{s['mb_per_s_median']:>8.0f}{cpu:>6}{broker:>8}   {runs}{bad}")
    if any(s["messages"] < target for s in summary.values()):
        print(f"   * published only the first {peer_target:,} messages "
              "(--peer-limit); rate computed on those")
    notes = []
    for v in vs:
        if v["swept"]:
            continue  # the label says it
        if v["client"] in PYSTREAM:
            notes.append(f"{v['label']}: batches of {v['batch']:,}, "
                         f"max_in_flight {v['in_flight']:,}"
                         + (f", {args.pystream_sub_batch} messages per "
                            "uncompressed sub-batch entry"
                            if v["client"] == "pystream-sub" else ""))
        elif v["client"] == "rbfly":
            notes.append(f"{v['label']}: flush every {v['batch']:,}")
        elif v["client"] == "wire":
            notes.append(f"{v['label']}: at most {v['in_flight']:,} unconfirmed")
        elif v["client"].startswith("rstream"):
            entry = args.body_size + (AMQP_OVERHEAD if v["client"] == "rstream-amqp"
                                      else 0)
            b = v["batch"] or frame_capacity(entry)
            notes.append(f"{v['label']}: send_batch of {b:,}, "
                         f"at most {v['in_flight']:,} unconfirmed")
    for note in dict.fromkeys(notes):
        print(f"   {note}")
    print("   cpu: the publisher's process, broker: the broker's process "
          "(100% = one core of 2)" if os.cpu_count() == 2 else
          "   cpu: the publisher's process, broker: the broker's process "
          "(100% = one core)")

    # ratios: each pystream row against the wire limit and the peers
    def best(client: str) -> tuple[str, dict] | None:
        cands = [(v["label"], summary[v["key"]]) for v in vs
                 if v["client"] == client and v["key"] in summary]
        return max(cands, key=lambda c: c[1]["msg_per_s_median"], default=None)

    ratios = {}
    peers = {c: best(c) for c in ("wire", *PEERS)}
    for p in PYSTREAM:
        mine = best(p)
        if mine is None:
            continue
        for other, theirs in peers.items():
            if theirs is not None:
                ratios[f"{p}/{other}"] = (mine[1]["msg_per_s_median"]
                                          / theirs[1]["msg_per_s_median"])
    if ratios:
        parts = [f"{k} = {x:.0%}" if k.endswith("/wire") else f"{k} = {x:.1f}x"
                 for k, x in ratios.items()]
        print("   ratios (medians of msg/s, best setting of each): "
              + "; ".join(parts))
        fastest = max(((c, b) for c, b in peers.items()
                       if b is not None and c != "wire"),
                      key=lambda cb: cb[1][1]["msg_per_s_median"], default=None)
        ours = [best(p) for p in PYSTREAM  # messages, not entries
                if p != "pystream-sub" and best(p) is not None]
        if fastest and ours:
            top = max(ours, key=lambda x: x[1]["msg_per_s_median"])
            r = top[1]["msg_per_s_median"] / fastest[1][1]["msg_per_s_median"]
            verdict = "met" if r >= 1 else "NOT met"
            print(f"   target pystream >= the fastest peer ({fastest[1][0]}): "
                  f"{top[0]} {r:.1f}x -> {verdict}")
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default=os.environ.get("PYSTREAM_TEST_URI", DEFAULT_URI))
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=",".join(DEFAULT_CLIENTS),
                    help=f"comma-separated publishers among {', '.join(CLIENTS)} "
                         f"(default: {', '.join(DEFAULT_CLIENTS)})")
    ap.add_argument("--peer-limit", type=int, default=2_000_000,
                    help="rbfly and rstream publish only the first K messages "
                         "(0: all); default 2M")
    ap.add_argument("--wire-in-flight", default=str(1 << 20),
                    help="unconfirmed messages the wire publisher allows "
                         "(comma-separated)")
    ap.add_argument("--pystream-batch", default="100000",
                    help="messages per send_batch (comma-separated: one row each)")
    ap.add_argument("--pystream-in-flight", default="200000",
                    help="the producer's max_in_flight (comma-separated)")
    ap.add_argument("--pystream-sub-batch", type=int, default=100,
                    help="messages per sub-batch entry of pystream-sub")
    ap.add_argument("--rbfly-batch", default="1000",
                    help="messages per PublisherBatchFast.flush (comma-separated)")
    ap.add_argument("--rstream-batch", default="0",
                    help="messages per send_batch, 0: a 1 MiB frame's worth "
                         "(comma-separated)")
    ap.add_argument("--rstream-in-flight", default="200000",
                    help="unconfirmed messages allowed (comma-separated)")
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds allowed to one publisher run")
    ap.add_argument("--stall", type=float, default=30,
                    help="end a run that sent nothing new for this many seconds")
    ap.add_argument("--json", help="write machine-readable results here")
    # internal: one publisher in a child process
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--stream", help=argparse.SUPPRESS)
    ap.add_argument("--target", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--in-flight", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--broker-pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sub-batch", type=int, default=100, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        child_main(args)
        return

    clients = parse_choices(ap, args.only, CLIENTS, "publishers")
    vs = variants(args, clients)
    target = args.messages
    peer_target = (min(args.peer_limit, target) if args.peer_limit > 0
                   else target)

    import pystream
    pid = broker_pid(args.uri)
    with pystream.connect(args.uri) as client:
        broker = client.server_properties.get("version", "?")
        print(f"broker RabbitMQ {broker} at {args.uri.split('@')[-1]}"
              f"{f' (pid {pid})' if pid else ''}; {os.cpu_count()} cores; "
              f"python {platform.python_version()}; {args.repeat} runs each; "
              f"publishers: {', '.join(v['label'] for v in vs)}", flush=True)

        raw: dict[str, list[dict]] = {v["key"]: [] for v in vs}
        for rep in range(args.repeat):
            for i, v in enumerate(vs):
                n = peer_target if v["client"] in PEERS else target
                name = f"bench-publish-{os.getpid()}-{i}"
                res = one_run(args, client, v, n, pid, name)
                raw[v["key"]].append(res)
                if "error" in res:
                    msg = f"FAILED {res['error']}"
                else:
                    rate = res["messages"] / res["seconds"]
                    msg = (f"{res['messages']:,} in {res['seconds']:.3f} s, "
                           f"{fmt_rate(rate)} msg/s, cpu "
                           f"{res['cpu'] / res['seconds']:.0%}")
                    if "broker_cpu" in res:
                        msg += f", broker {res['broker_cpu'] / res['seconds']:.0%}"
                print(f"run {rep + 1}/{args.repeat} {v['label']:<30} {msg}",
                      flush=True)

    summary, errors = {}, {}
    for v in vs:
        s = summarize(raw[v["key"]], args.body_size)
        if s is not None:
            summary[v["key"]] = s
        bad = [r["error"] for r in raw[v["key"]] if "error" in r]
        if bad:
            errors[v["key"]] = bad
    ratios = print_table(args, vs, summary, errors, peer_target)
    if args.json:
        results = {
            "broker_version": broker, "uri": args.uri.split("@")[-1],
            "cores": os.cpu_count(), "repeat": args.repeat,
            "messages": target, "body_size": args.body_size,
            "peer_messages": peer_target, "ratios": ratios,
            "publishers": [{**v, "summary": summary.get(v["key"]),
                            "errors": errors.get(v["key"], []),
                            "runs": raw[v["key"]]} for v in vs],
        }
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nresults written to {args.json}")


if __name__ == "__main__":
    main()
