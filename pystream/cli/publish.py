"""``pystream publish``: each line of stdin as one message."""

from __future__ import annotations

import argparse
import io
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, cast

from .common import connect

PUBLISH_BATCH = 10_000        # lines per send_batch
PUBLISH_LINGER = 0.05         # seconds a partial batch waits for more lines


def cmd_publish(args: argparse.Namespace) -> int:
    started = time.monotonic()
    count = 0
    with connect(args) as client, client.producer(args.stream) as producer:
        unconfirmed: deque[Future[Any]] = deque()
        # typeshed calls it a BinaryIO; it is a BufferedReader, with read1.
        stdin = cast(io.BufferedIOBase, sys.stdin.buffer)
        for lines in line_batches(stdin):
            unconfirmed.append(producer.send_batch(lines))
            count += len(lines)
            # A refused message ends the command now, not at end of input.
            while unconfirmed and unconfirmed[0].done():
                unconfirmed.popleft().result()
        producer.flush()
        for future in unconfirmed:
            future.result()
    seconds = time.monotonic() - started
    print(f"published {count:,} messages in {seconds:.2f} s "
          f"({count / seconds:,.0f} msg/s)", file=sys.stderr)
    return 0


def line_batches(source: io.BufferedIOBase) -> Iterator[list[bytes]]:
    """The lines of ``source`` without their newline, in lists of up to
    PUBLISH_BATCH; a shorter list once no line came for PUBLISH_LINGER, so
    lines typed or piped slowly go out at once."""
    chunks: queue.Queue[bytes | OSError] = queue.Queue(maxsize=16)
    # A thread reads, so that waiting for input does not hold a batch back.
    threading.Thread(target=_read_chunks, args=(source, chunks), daemon=True,
                     name="pystream-stdin").start()
    pending: list[bytes] = []
    partial = b""
    deadline = 0.0
    while True:
        try:
            chunk = chunks.get(timeout=max(0.0, deadline - time.monotonic())
                               if pending else None)
        except queue.Empty:
            yield pending
            pending = []
            continue
        if isinstance(chunk, OSError):
            raise chunk
        if not chunk:
            break
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        if lines and not pending:
            deadline = time.monotonic() + PUBLISH_LINGER
        pending += lines
        while len(pending) >= PUBLISH_BATCH:
            yield pending[:PUBLISH_BATCH]
            pending = pending[PUBLISH_BATCH:]
            deadline = time.monotonic() + PUBLISH_LINGER
    if partial:  # a last line without a newline
        pending.append(partial)
    if pending:
        yield pending


def _read_chunks(source: io.BufferedIOBase, chunks: queue.Queue[bytes | OSError]) -> None:
    try:
        while chunk := source.read1(1 << 20):
            chunks.put(chunk)
        chunks.put(b"")
    except OSError as exc:
        chunks.put(exc)
