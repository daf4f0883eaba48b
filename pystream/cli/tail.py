"""``pystream tail``: follow a stream and print its records."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

import pystream

from .common import Emit, connect

STATUS_INTERVAL = 1.0  # seconds between --stats lines


def cmd_tail(args: argparse.Namespace) -> int:
    try:
        with connect(args) as client, client.consumer(
                args.stream, offset=args.start, body="binary",
                columns=args.columns) as consumer:
            emit = PRINTERS[args.format](args.columns)  # a table's header now
            with Status(consumer, args.stats) as status:
                for batch in _first_rows(consumer, args.count):
                    emit(batch)
                    sys.stdout.flush()
                    status.records += batch.num_rows
    except KeyboardInterrupt:
        pass  # the usual way to stop following a stream, not a failure
    return 0


class Status:
    """``tail --stats``: every second a line on stderr with the position,
    the records printed per second and the consumer's lag (redrawn in place
    on a terminal)."""

    def __init__(self, consumer: pystream.Consumer, enabled: bool) -> None:
        self.consumer = consumer
        self.enabled = enabled
        self.records = 0      # printed so far (the main thread adds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="pystream-tail-stats")

    def __enter__(self) -> Status:
        self._started = time.monotonic()
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            # The final line: the rate over the whole run.
            self.show(time.monotonic() - self._started, self.records)

    def _run(self) -> None:
        seen = 0
        while not self._stop.wait(STATUS_INTERVAL):
            records = self.records
            self.show(STATUS_INTERVAL, records - seen)
            seen = records

    def show(self, seconds: float, records: int) -> None:
        try:
            lag = self.consumer.lag()
        except pystream.StreamError:
            lag = None
        line = (f"position {self.consumer.position}  "
                f"{records / max(seconds, 1e-9):,.0f} msg/s  "
                f"lag {'-' if lag is None else f'{lag:,}'}  "
                f"printed {self.records:,}")
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _first_rows(batches: Iterable[pa.RecordBatch],
                count: int | None) -> Iterator[pa.RecordBatch]:
    """The batches, cut after ``count`` rows (all of them if None)."""
    if count is None:
        yield from batches
        return
    left = count
    for batch in batches:
        if batch.num_rows >= left:
            yield batch.slice(0, left)
            return
        left -= batch.num_rows
        yield batch


def table_printer(columns: list[str]) -> Emit:
    head = f"{'OFFSET':>12}  {'TIME (UTC)':<23}  {'SIZE':>8}  "
    print(head + "".join(f"{name.upper()}  " for name in columns) + "BODY")

    def emit(batch: pa.RecordBatch) -> None:
        width = shutil.get_terminal_size().columns
        rows = zip(*(batch.column(name).to_pylist()
                     for name in ("offset", "chunk_timestamp", "body", *columns)), strict=True)
        for offset, stamp, body, *extra in rows:
            when = f"{stamp:%Y-%m-%d %H:%M:%S}.{stamp.microsecond // 1000:03d}"
            line = (f"{offset:>12}  {when}  {len(body):>8}  "
                    + "".join(f"{_json(value)}  " for value in extra))
            print(line + _preview(body, max(20, width - len(line))))
    return emit


def _preview(body: bytes, width: int) -> str:
    """The body as one line of at most ``width`` characters."""
    # A character takes at most 4 bytes: decode no more than can be shown.
    shown = body[:4 * width]
    text = shown.decode("utf-8", "backslashreplace")
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > width or len(shown) < len(body):
        text = text[:width - 3] + "..."
    return text


def json_printer(columns: list[str]) -> Emit:
    def emit(batch: pa.RecordBatch) -> None:
        rows = zip(*(batch.column(name).to_pylist()
                     for name in ("offset", "chunk_timestamp", "body", *columns)), strict=True)
        lines = []
        for offset, stamp, body, *extra in rows:
            record = {"offset": offset,
                      "chunk_timestamp": stamp.isoformat(timespec="milliseconds"),
                      **_body_field(body)}
            record.update(zip(columns, (_plain(value) for value in extra), strict=True))
            lines.append(_json(record) + "\n")
        sys.stdout.write("".join(lines))
    return emit


def raw_printer(columns: list[str]) -> Emit:
    def emit(batch: pa.RecordBatch) -> None:
        bodies = batch.column("body").to_pylist()
        sys.stdout.buffer.write(b"".join((body or b"") + b"\n" for body in bodies))
    return emit


PRINTERS: dict[str, Callable[[list[str]], Emit]] = {
    "table": table_printer, "json": json_printer, "raw": raw_printer}


def _body_field(body: bytes) -> dict[str, str]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_base64": base64.b64encode(body).decode("ascii")}


def _plain(value: Any) -> Any:
    """An optional column's value as JSON-ready data: maps (lists of pairs
    in Arrow) as objects, structs without their unset fields."""
    if isinstance(value, list):
        return dict(value)
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if v is not None}
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):  # properties.user_id: text, else base64
        return _body_field(value).popitem()[1]
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
