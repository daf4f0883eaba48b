"""``pystream dump``: a range of a stream to a Parquet or Arrow IPC file."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import pystream
from pystream.bounds import StreamBounds, last_chunk_start, offset_at, stream_bounds
from pystream.ranges import read_range

from .common import CliError, Emit, Start, connection_options

PROGRESS_INTERVAL = 0.2       # at most five progress redraws a second
PARQUET_ROW_GROUP = 64 << 20  # Arrow bytes gathered per Parquet write

# --- dump -------------------------------------------------------------------

def cmd_dump(args: argparse.Namespace) -> int:
    if not args.to.parent.is_dir():
        raise CliError(f"cannot write {args.to}: {args.to.parent} is not a "
                       "directory")
    options = connection_options(args)
    with pystream.connect(args.uri, **options) as client:
        bounds = stream_bounds(client, args.stream)
        start = _start_offset(client, args.stream, args.start, bounds)
    end = bounds.end if args.to_offset is None else min(args.to_offset, bounds.end)
    started = time.monotonic()
    records, body_bytes = _write_range(args, options, start, max(start, end))
    seconds = time.monotonic() - started
    print(f"{records:,} records, {body_bytes / 1e6:,.1f} MB of bodies, in "
          f"{seconds:.2f} s ({records / seconds:,.0f} records/s, "
          f"{body_bytes / 1e6 / seconds:,.1f} MB/s) to {args.to}",
          file=sys.stderr)
    return 0


def _write_range(args: argparse.Namespace, options: dict[str, Any], start: int,
                 end: int) -> tuple[int, int]:
    """Write the records from ``start`` to ``end`` to ``args.to``; returns
    how many records and body bytes."""
    # Written beside the target and renamed when complete: an interrupted
    # dump leaves no half file under the final name.
    part = args.to.with_name(f".{args.to.name}.{os.getpid()}.part")
    schema = pystream.schema(columns=args.columns, body="binary")
    parquet = args.to.suffix.lower() == ".parquet"
    records = body_bytes = 0
    try:
        with (_terminate_as_interrupt(), _file_writer(part, schema, parquet) as write,
              Progress(end - start, args.progress or sys.stderr.isatty()) as progress):
            for batch in read_range(args.uri, args.stream, start, end,
                                    connection_options=options,
                                    body="binary", columns=args.columns):
                write(batch)
                records += batch.num_rows
                body_bytes += _body_bytes(batch)
                progress.update(batch.column(0)[-1].as_py() + 1 - start,
                                records, body_bytes)
        os.replace(part, args.to)
    finally:
        part.unlink(missing_ok=True)
    return records, body_bytes


def _start_offset(client: pystream.Client, stream: str, start: Start,
                  bounds: StreamBounds) -> int:
    if start == "first":
        return bounds.first
    if start == "next":
        return bounds.end
    if start == "last":
        last = last_chunk_start(client, stream)
        return bounds.end if last is None else last
    if isinstance(start, dt.datetime):
        return offset_at(client, stream, start, bounds)
    return max(int(start), bounds.first)  # retention removed what came before


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Make SIGTERM (kill, a job scheduler's stop) unwind like Ctrl-C, so
    that the partial file is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _body_bytes(batch: pa.RecordBatch) -> int:
    # pyarrow-stubs type binary_length for the concrete array classes only
    lengths = pc.binary_length(batch.column("body"))  # type: ignore[call-overload]
    total: int = pc.sum(lengths).as_py() or 0
    return total


@contextlib.contextmanager
def _file_writer(path: pathlib.Path, schema: pa.Schema,
                 parquet: bool) -> Iterator[Emit]:
    """A function writing batches to ``path``, a Parquet or else an Arrow
    IPC file."""
    if not parquet:
        with pa.ipc.new_file(str(path), schema) as ipc:
            yield ipc.write_batch
        return
    import pyarrow.parquet as pq  # only dumps to Parquet pay for its import
    gathered: list[pa.RecordBatch] = []
    size = 0

    def flush() -> None:
        nonlocal size
        writer.write_table(pa.Table.from_batches(gathered, schema))
        gathered.clear()
        size = 0

    def write(batch: pa.RecordBatch) -> None:
        # One write per chunk would make a row group per chunk: gather.
        nonlocal size
        gathered.append(batch)
        size += batch.nbytes
        if size >= PARQUET_ROW_GROUP:
            flush()

    with pq.ParquetWriter(str(path), schema) as writer:
        yield write
        if gathered:
            flush()


class Progress:
    """A progress line on stderr: records, MB/s of bodies and the time left,
    from the share of the offset range done."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled and total > 0
        self.started = self.shown = time.monotonic()
        self.width = 0  # of the line drawn, to blank what a shorter one leaves

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.width:
            sys.stderr.write("\n")

    def update(self, done: int, records: int, body_bytes: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.shown < PROGRESS_INTERVAL
                                and done < self.total):
            return
        self.shown = now
        elapsed = max(now - self.started, 1e-9)
        share = min(done / self.total, 1.0)
        left = elapsed * (1 - share) / share if share else 0.0
        bar = "#" * int(share * 20)
        line = (f"[{bar:<20}] {share:4.0%}  {records:,} records  "
                f"{body_bytes / 1e6 / elapsed:,.1f} MB/s  "
                f"ETA {int(left) // 60}:{int(left) % 60:02d}")
        sys.stderr.write("\r" + line.ljust(self.width))
        sys.stderr.flush()
        self.width = len(line)
