"""Decode throughput of pystream._core beside rbfly's Cython decoder.

    .venv/bin/python -m bench.bench_decode            # 15 rounds, medians
    .venv/bin/python -m bench.bench_decode --repeat 5 --json ''

What it measures
----------------
Frames are generated here (correct chunk layout and CRC): 64 Deliver frames
of ~1 MiB chunks of AMQP 1.0 messages whose body is one data section of
100 bytes or 1 KiB. pystream decodes the whole buffer with CRC checks, with
``body="view"`` and ``body="binary"``; rbfly's ``decode_messages`` runs over
the same frames (it also checks the CRC and builds one Python message per
record). No broker, one process; the decoders take turns within each of
``--repeat`` rounds; medians in msg/s and GB/s of frames, the ratio to
rbfly, the CPU time of each round beside its wall time, and the load average
before and after each round (bench/results/decode.json).
"""

from __future__ import annotations

import asyncio
import os
import struct
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS threads spin on 2 cores

from bench import harness
from pystream._core import decode
from tools.frames import amqp_data, chunk, deliver, simple_entry

FRAMES = 64             # chunks per buffer
FRAME_BYTES = 1 << 20   # about this much entry data per chunk
SIZES = (100, 1024)
DECODERS = ("pystream-view", "pystream-binary", "rbfly")


def make_frames(body_size: int) -> tuple[bytes, int]:
    """A buffer of Deliver frames, and its record count."""
    body = bytes(range(256)) * (body_size // 256) + bytes(body_size % 256)
    entry = simple_entry(amqp_data(body))
    per_chunk = FRAME_BYTES // len(entry)
    frames, offset = [], 0
    for _ in range(FRAMES):
        frames.append(deliver(chunk([entry] * per_chunk, first_offset=offset)))
        offset += per_chunk
    return b"".join(frames), offset


def rbfly_decoder():
    """A function decoding all frames of a buffer with rbfly: its records."""
    from rbfly.streams._codec import decode_messages
    from rbfly.streams._mqueue import MessageQueue
    from rbfly.streams.types import SubscriptionInfo

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    queue = MessageQueue(10, 60000)
    info = SubscriptionInfo("bench", None, None, True, None)

    def run(buf: bytes) -> int:
        pos, n = 0, 0
        while pos < len(buf):
            (size,) = struct.unpack_from(">I", buf, pos)
            decode_messages(buf[pos + 4:pos + 4 + size], 5, 0, queue, info)
            n += len(queue.data)
            queue.data.clear()
            pos += 4 + size
        return n
    return run


def decoders() -> dict:
    return {
        "pystream-view": lambda buf: decode(buf, crc=True, body="view").num_rows,
        "pystream-binary": lambda buf: decode(buf, crc=True, body="binary").num_rows,
        "rbfly": rbfly_decoder(),
    }


def main() -> None:
    ap = harness.parser(__doc__, clients=DECODERS, repeat=15, result="decode")
    args = ap.parse_args()
    names = harness.chosen(ap, args)
    info = harness.machine(None)
    harness.banner({**info, "broker": "none", "broker_address": "-"}, "decode")
    data = {size: make_frames(size) for size in SIZES}
    fns = decoders()
    cases = [(size, name) for size in SIZES for name in names]

    def one(case) -> dict:
        size, name = case
        buf, records = data[size]
        load = harness.loadavg()
        cpu0, t0 = time.process_time(), time.perf_counter()
        got = fns[name](buf)
        t1, cpu1 = time.perf_counter(), time.process_time()
        if got != records:
            return {"error": f"{got} records, expected {records}"}
        return {"messages": records, "seconds": t1 - t0, "cpu": cpu1 - cpu0,
                "bytes": len(buf), "load": [load, harness.loadavg()]}

    for case in cases:  # once untimed: imports, caches
        one(case)
    runs = harness.interleave(args.repeat, cases, one,
                              label=lambda c: f"{c[0]} B {c[1]}")
    out: dict = {}
    for i, (size, name) in enumerate(cases):
        s = harness.summarize(runs[i], size)
        if s:
            s["gb_per_s_median"] = s["msg_per_s_median"] * len(data[size][0]) \
                / data[size][1] / 1e9
        out.setdefault(str(size), {})[name] = {
            "label": harness.label("rbfly") + " (Cython)" if name == "rbfly" else name,
            "summary": s, "runs": runs[i]}
    print(f"\n{'body':>6} {'decoder':>16} {'msg/s':>12} {'GB/s':>7} {'x rbfly':>8}")
    for size, by in out.items():
        base = (by.get("rbfly", {}).get("summary") or {}).get("msg_per_s_median")
        for name, v in by.items():
            s = v["summary"]
            if s is None:
                continue
            ratio = f"{s['msg_per_s_median'] / base:8.1f}" if base else ""
            print(f"{size:>6} {name:>16} {s['msg_per_s_median']:>12,.0f} "
                  f"{s['gb_per_s_median']:>7.2f} {ratio}")
    harness.write_results(args.json, info, {
        "benchmark": "decode", "repeat": args.repeat, "frames": FRAMES,
        "frame_bytes": FRAME_BYTES, "sizes": out})


if __name__ == "__main__":
    main()
