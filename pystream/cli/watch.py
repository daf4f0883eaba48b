"""``pystream watch``: a stream's committed end, write rate, and for each
named consumer its stored offset, lag and rate, refreshed like top.

The figures come from the broker (stream statistics, 3.11+, and the stored
offsets), so watching costs a request per consumer a refresh and reads no
records. The end is the broker's last committed chunk (its first offset), so
lag is counted to within a chunk, as ``Consumer.lag()`` counts it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pystream
from pystream import metrics

from .common import connect

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


@dataclass
class Sample:
    when: float
    committed: int | None              # first offset of the last committed chunk
    first: int | None
    stored: dict[str, int | None]      # consumer name -> stored offset


class Watched:
    """A consumer seen through its stored offset, reported to the metrics
    (``pystream.consumer.stored_offset`` and ``.lag``) like a live one."""

    credit = None

    def __init__(self, client: pystream.Client, stream: str, name: str) -> None:
        # Only the gauges: the counters are the consuming process's.
        self.stats = SimpleNamespace(attributes=metrics.consumer_attributes(
            client.address, stream, name))
        self.stored: int | None = None
        self.committed: int | None = None
        metrics.watch_subscription(self)

    def reporting(self) -> bool:
        return True

    def lag(self) -> int | None:
        if self.committed is None:
            return None
        return max(0, self.committed - (-1 if self.stored is None else self.stored) - 1)

    def stored_offset(self) -> int | None:
        return self.stored


def cmd_watch(args: argparse.Namespace) -> int:
    out = sys.stdout
    clear = out.isatty()
    try:
        with connect(args) as client:
            if not client.stream_exists(args.stream):
                raise pystream.StreamDoesNotExist(
                    f"stream {args.stream!r} does not exist")
            watched = {n: Watched(client, args.stream, n) for n in args.consumer}
            previous: Sample | None = None
            shown = 0
            while True:
                sample = take_sample(client, args.stream, args.consumer)
                for name, w in watched.items():
                    w.stored, w.committed = sample.stored[name], sample.committed
                text = render(args.stream, sample, previous, args.interval)
                out.write((CLEAR if clear else "") + text + ("" if clear else "\n"))
                out.flush()
                previous = sample
                shown += 1
                if args.iterations is not None and shown >= args.iterations:
                    return 0
                time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def take_sample(client: pystream.Client, stream: str,
                consumers: list[str]) -> Sample:
    committed = first = None
    if client.supports("stream_stats"):
        stats = client.stream_stats(stream)
        if stats.get("committed_chunk_id", -1) >= 0:
            committed, first = stats["committed_chunk_id"], stats["first_chunk_id"]
    stored: dict[str, int | None] = {}
    for name in consumers:
        try:
            stored[name] = client.query_offset(stream, name)
        except pystream.NoOffset:
            stored[name] = None
    return Sample(time.monotonic(), committed, first, stored)


def render(stream: str, now: Sample, before: Sample | None,
           interval: float) -> str:
    """The screen: the stream's line, then one line per consumer."""
    seconds = (now.when - before.when) if before else 0.0

    def rate(new: int | None, old: int | None) -> str:
        if before is None or new is None or old is None or seconds <= 0:
            return "-"
        return f"{max(0, new - old) / seconds:,.0f}"

    def num(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    clock = dt.datetime.now().strftime("%H:%M:%S")
    lines = [f"pystream watch {stream}  every {interval:g} s  {clock}  "
             f"(Ctrl-C stops)", "",
             f"{'STREAM':<24} {'FIRST':>14} {'COMMITTED':>14} {'WRITES/S':>12}",
             f"{stream:<24} {num(now.first):>14} {num(now.committed):>14} "
             f"{rate(now.committed, before.committed if before else None):>12}"]
    if now.committed is None:
        lines.append("(no committed chunk yet, or a broker before 3.11 without "
                     "stream statistics)")
    if now.stored:
        lines += ["", f"{'CONSUMER':<24} {'STORED OFFSET':>14} {'LAG':>14} "
                      f"{'RATE/S':>12}"]
        for name, stored in now.stored.items():
            lag = (None if now.committed is None else
                   max(0, now.committed - (-1 if stored is None else stored) - 1))
            old = before.stored.get(name) if before else None
            lines.append(f"{name:<24} {num(stored):>14} {num(lag):>14} "
                         f"{rate(stored, old):>12}")
    return "\n".join(lines) + "\n"
