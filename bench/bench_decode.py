"""Decode throughput of pystream._core against rbfly's Cython decoder.

    .venv/bin/python -m pytest bench/bench_decode.py --benchmark-only

Frames are generated here (correct chunk layout and CRC): chunks of AMQP 1.0
messages whose body is one data section of 100 bytes or 1 KiB.  pystream
decodes the whole buffer with CRC checks, ``body="view"`` and
``body="binary"``; rbfly's ``decode_messages`` runs over the same frames
(it also checks the CRC and builds one Python message per record).  A table
of medians in msg/s and GB/s, and the ratio to rbfly, is printed at the end.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # idle BLAS threads spin on 2 cores

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.golden import amqp_data, chunk, deliver, simple_entry  # noqa: E402

from pystream._core import decode  # noqa: E402

FRAMES = 64             # chunks per buffer
FRAME_BYTES = 1 << 20   # about this much entry data per chunk
RESULTS: dict[tuple[int, str], float] = {}


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


DATA = {size: make_frames(size) for size in (100, 1024)}


def rbfly_decoder():
    """A function decoding all frames of a buffer with rbfly."""
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
            frame = buf[pos + 4:pos + 4 + size]
            decode_messages(frame, 5, 0, queue, info)
            n += len(queue.data)
            queue.data.clear()
            pos += 4 + size
        return n
    return run


@pytest.fixture(scope="module", autouse=True)
def table(request):
    yield
    if not RESULTS:
        return
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print_table()


def print_table():
    print()
    print(f"{'body':>6} {'decoder':>14} {'msg/s':>14} {'GB/s':>7} {'x rbfly':>8}")
    for size in (100, 1024):
        buf, records = DATA[size]
        base = RESULTS.get((size, "rbfly"))
        for name in ("pystream view", "pystream binary", "rbfly"):
            t = RESULTS.get((size, name))
            if t is None:
                continue
            ratio = f"{base / t:8.1f}" if base else ""
            print(f"{size:>6} {name:>14} {records / t:>14,.0f} "
                                f"{len(buf) / t / 1e9:>7.2f} {ratio}")


def record(benchmark, size, name):
    RESULTS[(size, name)] = benchmark.stats.stats.median


@pytest.mark.parametrize("size", [100, 1024])
@pytest.mark.parametrize("body", ["view", "binary"])
def test_pystream(benchmark, size, body):
    buf, records = DATA[size]
    batch = benchmark(decode, buf, crc=True, body=body)
    assert batch.num_rows == records
    record(benchmark, size, f"pystream {body}")


@pytest.mark.parametrize("size", [100, 1024])
def test_rbfly(benchmark, size):
    pytest.importorskip("rbfly")
    buf, records = DATA[size]
    run = rbfly_decoder()
    assert benchmark.pedantic(run, (buf,), rounds=5, iterations=1) == records
    record(benchmark, size, "rbfly")
