"""pystream: read, write and manage RabbitMQ streams from the shell.

Commands (pystream COMMAND --help for each one's options):

  tail STREAM       follow a stream: a table, JSON lines or raw bodies
  dump STREAM       write records to a Parquet or Arrow IPC file
  stats STREAM      first offset, end, chunk ids, leader and replicas
  streams           list the streams (management HTTP API)
  create STREAM     create a stream, with retention options
  delete STREAM     delete a stream
  publish STREAM    publish each line of stdin as one message
  bench KIND        run the source checkout's latency or throughput benchmark

The broker is --uri, else $PYSTREAM_URI, else
rabbitmq-stream://guest:guest@localhost:5552/; a rabbitmq-stream+tls:// URI
connects over TLS (--ca-file, --cert-file, --key-file, --sasl-mechanism
EXTERNAL for a private CA and a client certificate). An error prints one line,
"pystream: error: ...", and exits 1 (2 for usage errors); --debug shows its
traceback instead. Ctrl-C ends tail with status 0, other commands with 130.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import io
import json
import os
import pathlib
import queue
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Union, cast
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

import pystream
from pystream.ranges import (PROBE_TIMEOUT, StreamBounds, offset_at, read_range,
                             stream_bounds)
from pystream.tls import (SASL_MECHANISMS, certificate_error, tls_context,
                          tls_options)

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
MANAGEMENT_PORT = 15672
MANAGEMENT_TLS_PORT = 15671
#: ``pystream bench`` runs the scripts of the source checkout (a wheel has none).
BENCH_DIR = pathlib.Path(pystream.__file__).resolve().parent.parent / "bench"
BENCH_SCRIPTS = {"latency": "bench_latency.py", "throughput": "bench_consume.py"}
OPTIONAL_COLUMNS = ("properties", "application_properties",
                    "message_annotations", "header")
PUBLISH_BATCH = 10_000        # lines per send_batch
PUBLISH_LINGER = 0.05         # seconds a partial batch waits for more lines
PROGRESS_INTERVAL = 0.2       # at most five progress redraws a second
PARQUET_ROW_GROUP = 64 << 20  # Arrow bytes gathered per Parquet write

#: ``--from``: "first", "last", "next", an offset or a time.
Start = Union[str, int, dt.datetime]
Emit = Callable[[pa.RecordBatch], None]


class CliError(Exception):
    """A failure whose message is already the line to print."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage error (2)
        return int(stop.code or 0)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Whoever read our output left (`| head`): nothing to report, and
        # the interpreter must not fail flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CliError, pystream.StreamError, ValueError, OSError) as exc:
        if args.debug:
            raise
        print(f"pystream: error: {describe(exc, args)}", file=sys.stderr)
        return exc.status if isinstance(exc, CliError) else 1


def describe(exc: BaseException, args: argparse.Namespace) -> str:
    """One line saying what failed, in words (messages never hold the
    password: pystream's errors and URIs leave it out)."""
    stream = getattr(args, "stream", None)
    address = pystream.parse_uri(args.uri)
    if isinstance(exc, pystream.StreamDoesNotExist) and stream:
        text = f"stream {stream!r} does not exist"
    elif isinstance(exc, pystream.StreamAlreadyExists) and stream:
        text = f"stream {stream!r} already exists"
    elif isinstance(exc, pystream.AuthenticationFailureLoopback):
        text = (f"{address.uri()} lets user {address.username!r} connect "
                f"from localhost only")
    elif (isinstance(exc, pystream.AuthenticationFailure)
          and args.sasl_mechanism == "EXTERNAL"):
        text = (f"authentication failed: {address.uri()} refused the TLS "
                f"client certificate (EXTERNAL logs in as its name: is that "
                f"a broker user?)")
    elif isinstance(exc, pystream.AuthenticationFailure):
        text = (f"authentication failed: {address.uri()} refused user "
                f"{address.username!r} (wrong user name or password)")
    elif isinstance(exc, pystream.CertificateVerificationError):
        text = str(exc.with_trust_hint("give --ca-file the CA that signed it"))
    elif isinstance(exc, pystream.StreamError):
        # "create stream 'x': PreconditionFailed (response code 0x11)"
        # reads better with the class name in words.
        name = type(exc).__name__
        text = str(exc).replace(name, _words(name)) or _words(name)
    elif isinstance(exc, OSError) and exc.filename:
        text = f"{exc.strerror}: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _words(name: str) -> str:
    """``StreamNotAvailable`` -> ``stream not available``."""
    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()


# --- arguments --------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pystream", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_global_options(parser, top=True)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND",
                                     required=True)

    def command(name: str, run: Callable[[argparse.Namespace], int],
                help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        _add_global_options(sub, top=False)
        sub.set_defaults(run=run)
        return sub

    tail = command("tail", cmd_tail, "follow a stream and print its messages "
                   "as they come (Ctrl-C stops it, exit status 0)")
    tail.add_argument("stream")
    tail.add_argument("--from", dest="start", type=start_spec, default="last",
                      metavar="first|last|next|OFFSET|TIME",
                      help="where to start (default: last, the stream's last "
                      "chunk then every new message, as tail -f shows the "
                      "end first; next: new messages only; TIME: ISO 8601, "
                      "local time unless it names its zone)")
    tail.add_argument("--format", choices=("table", "json", "raw"),
                      default="table", help="table (default): offset, time, "
                      "size and a body preview; json: one object per line, "
                      "the body as text (\"body\") or, when it is not UTF-8, "
                      "base64 (\"body_base64\"); raw: each body and a newline")
    _add_columns_option(tail)
    tail.add_argument("--count", type=positive_int, metavar="N",
                      help="stop after N messages")

    dump = command("dump", cmd_dump, "write records of a stream to a file, "
                   "Parquet or Arrow IPC by its suffix")
    dump.add_argument("stream")
    dump.add_argument("--to", required=True, type=dump_path,
                      metavar="FILE.parquet|FILE.arrow")
    dump.add_argument("--from", dest="start", type=start_spec, default="first",
                      metavar="first|last|next|OFFSET|TIME",
                      help="first record (default: first)")
    dump.add_argument("--to-offset", type=offset_int, metavar="N",
                      help="stop before offset N (default and limit: the "
                      "stream's end when the dump starts)")
    _add_columns_option(dump)
    dump.add_argument("--progress", action="store_true",
                      help="show the progress bar even when stderr is not "
                      "a terminal")

    stats = command("stats", cmd_stats, "a stream's offsets, chunk ids and "
                    "nodes")
    stats.add_argument("stream")
    stats.add_argument("--json", action="store_true", help="print JSON")

    streams = command("streams", cmd_streams, "list the streams of the "
                      "URI's virtual host (management HTTP API)")
    streams.add_argument(
        "--management-url", type=management_url,
        default=os.environ.get("PYSTREAM_MANAGEMENT_URL"),
        help="the management API (default: $PYSTREAM_MANAGEMENT_URL, else "
        f"http://<broker host>:{MANAGEMENT_PORT}, or "
        f"https://<broker host>:{MANAGEMENT_TLS_PORT} for a TLS URI); the "
        "URI's user and password log in, and an https URL is verified with "
        "--ca-file (and --cert-file, --key-file)")
    streams.add_argument("--json", action="store_true", help="print JSON")

    create = command("create", cmd_create, "create a stream")
    create.add_argument("stream")
    create.add_argument("--max-age", type=max_age, metavar="AGE",
                        help="retention by age: a number and Y, M, D, h, m "
                        "or s (7D)")
    create.add_argument("--max-length-bytes", type=positive_int, metavar="N",
                        help="retention by size")
    create.add_argument("--max-segment-size-bytes", type=positive_int,
                        metavar="N", help="size of the segment files")

    delete = command("delete", cmd_delete, "delete a stream")
    delete.add_argument("stream")

    publish = command("publish", cmd_publish, "publish each line of stdin "
                      "(without its newline) as one message")
    publish.add_argument("stream")

    bench = command("bench", cmd_bench, "run bench/bench_latency.py "
                    "(latency) or bench/bench_consume.py (throughput) of the "
                    "source checkout, with the arguments that follow")
    bench.add_argument("kind", choices=tuple(BENCH_SCRIPTS))
    bench.add_argument("args", nargs=argparse.REMAINDER,
                       help="passed to the script (--help: its options)")
    return parser


def _add_global_options(parser: argparse.ArgumentParser, top: bool) -> None:
    def default(value: Any) -> Any:
        # The global options work after the command too; there SUPPRESS
        # keeps a value given before it.
        return value if top else argparse.SUPPRESS

    parser.add_argument("--uri", type=broker_uri,
                        default=default(os.environ.get("PYSTREAM_URI", DEFAULT_URI)),
                        help="the broker (default: $PYSTREAM_URI, else "
                        f"{DEFAULT_URI})")
    parser.add_argument("--debug", action="store_true", default=default(False),
                        help="show the traceback of an error")
    tls = parser.add_argument_group(
        "TLS", "the files are for a rabbitmq-stream+tls:// URI (refused "
        "with a plain one)")
    tls.add_argument("--ca-file", metavar="PEM", default=default(None),
                     help="trust the CAs in this file (default: the system's)")
    tls.add_argument("--cert-file", metavar="PEM", default=default(None),
                     help="present this client certificate")
    tls.add_argument("--key-file", metavar="PEM", default=default(None),
                     help="the client certificate's private key (default: in "
                     "--cert-file)")
    tls.add_argument("--sasl-mechanism", type=str.upper, choices=SASL_MECHANISMS,
                     default=default("PLAIN"),
                     help="PLAIN (default): the URI's user and password; "
                     "EXTERNAL: log in as the client certificate's name")


def _add_columns_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--columns", type=columns_list, default=[],
                        metavar="NAME,...", help="optional columns: "
                        + ", ".join(OPTIONAL_COLUMNS))


def broker_uri(text: str) -> str:
    try:
        pystream.parse_uri(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def start_spec(text: str) -> Start:
    if text in ("first", "last", "next"):
        return text
    if _is_number(text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected first, last, next, an offset or an ISO 8601 time, "
            f"not {text!r}") from None
    return when.astimezone()  # a naive time is local time


def _is_number(text: str) -> bool:
    return re.fullmatch(r"[0-9]+", text) is not None  # str.isdigit takes "²"


def positive_int(text: str) -> int:
    if not _is_number(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return int(text)


def offset_int(text: str) -> int:
    if not _is_number(text):
        raise argparse.ArgumentTypeError(f"expected an offset (an integer "
                                         f">= 0), not {text!r}")
    return int(text)


def columns_list(text: str) -> list[str]:
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names.difference(OPTIONAL_COLUMNS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown column {', '.join(sorted(unknown))}; the optional "
            f"columns are {', '.join(OPTIONAL_COLUMNS)}")
    # The decoder's order, so the file's schema is the same whatever order
    # the names were given in.
    return [name for name in OPTIONAL_COLUMNS if name in names]


def dump_path(text: str) -> pathlib.Path:
    path = pathlib.Path(text)
    if path.suffix.lower() not in (".parquet", ".arrow"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the file name must end in .parquet or .arrow")
    return path


def max_age(text: str) -> str:
    if not re.fullmatch(r"[0-9]+[YMDhms]", text):
        raise argparse.ArgumentTypeError(
            f"expected a number and one of Y, M, D, h, m, s (7D), not {text!r}")
    return text


def management_url(text: str) -> str:
    if not re.match(r"https?://", text):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, "
                                         f"not {text!r}")
    return text.rstrip("/")


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of ``pystream.connect`` the global options ask for; the
    TLS context is built (its files read) here."""
    return {"connection_name": "pystream cli",
            **tls_options(pystream.parse_uri(args.uri).tls, ca_file=args.ca_file,
                          cert_file=args.cert_file, key_file=args.key_file,
                          sasl_mechanism=args.sasl_mechanism)}


def connect(args: argparse.Namespace) -> pystream.Client:
    return pystream.connect(args.uri, **connection_options(args))


# --- tail -------------------------------------------------------------------

def cmd_tail(args: argparse.Namespace) -> int:
    try:
        with connect(args) as client, client.consumer(
                args.stream, offset=args.start, body="binary",
                columns=args.columns) as consumer:
            emit = PRINTERS[args.format](args.columns)  # a table's header now
            for batch in _first_rows(consumer, args.count):
                emit(batch)
                sys.stdout.flush()
    except KeyboardInterrupt:
        pass  # the usual way to stop following a stream, not a failure
    return 0


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
                     for name in ("offset", "chunk_timestamp", "body", *columns)))
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
                     for name in ("offset", "chunk_timestamp", "body", *columns)))
        lines = []
        for offset, stamp, body, *extra in rows:
            record = {"offset": offset,
                      "chunk_timestamp": stamp.isoformat(timespec="milliseconds"),
                      **_body_field(body)}
            record.update(zip(columns, (_plain(value) for value in extra)))
            lines.append(_json(record) + "\n")
        sys.stdout.write("".join(lines))
    return emit


def raw_printer(columns: list[str]) -> Emit:
    def emit(batch: pa.RecordBatch) -> None:
        sys.stdout.buffer.write(b"".join(
            body + b"\n" for body in batch.column("body").to_pylist()))
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
        with client.consumer(stream, offset="last", amqp=False) as consumer:
            head = consumer.read(1, timeout=PROBE_TIMEOUT).column(0)
        return head[0].as_py() if len(head) else bounds.end
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
    return pc.sum(pc.binary_length(batch.column("body"))).as_py() or 0


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


# --- stats, streams ---------------------------------------------------------

def cmd_stats(args: argparse.Namespace) -> int:
    with connect(args) as client:
        info = client.metadata(args.stream)[args.stream]
        if info.error is not None:
            raise info.error
        bounds = stream_bounds(client, args.stream)
        chunks = (client.stream_stats(args.stream)
                  if client.supports("stream_stats") else {})
    report = {
        "stream": args.stream,
        "first_offset": bounds.first,
        "end_offset": bounds.end,
        # Offsets count offset-tracking records too: an upper bound.
        "approximate_records": bounds.end - bounds.first,
        "last_chunk_time": (bounds.last_timestamp.isoformat(timespec="milliseconds")
                            if bounds.last_timestamp else None),
        "first_chunk_id": chunks.get("first_chunk_id"),
        "committed_chunk_id": chunks.get("committed_chunk_id"),
        "committed_offset": chunks.get("committed_offset"),
        "last_chunk_id": chunks.get("last_chunk_id"),
        "leader": _endpoint(info.leader),
        "replicas": [_endpoint(r) for r in info.replicas],
    }
    if args.json:
        print(json.dumps(report))
        return 0
    for key, value in report.items():
        if isinstance(value, list):
            value = ", ".join(value) or "none"
        elif value is None:
            value = ("n/a (RabbitMQ 3.11+)" if key.endswith("chunk_id")
                     else "n/a (RabbitMQ 4.3+)" if key == "committed_offset"
                     else "not read (the broker gave the end)"
                     if key == "last_chunk_time" and bounds.end > bounds.first
                     else "none")
        print(f"{key.replace('_', ' ') + ':':<21} {value}")
    return 0


def _endpoint(endpoint: pystream.Endpoint | None) -> str | None:
    return None if endpoint is None else f"{endpoint.host}:{endpoint.port}"


def cmd_streams(args: argparse.Namespace) -> int:
    address = pystream.parse_uri(args.uri)
    host = f"[{address.host}]" if ":" in address.host else address.host
    base = args.management_url or (
        f"https://{host}:{MANAGEMENT_TLS_PORT}" if address.tls
        else f"http://{host}:{MANAGEMENT_PORT}")
    context = (tls_context(args.ca_file, args.cert_file, args.key_file)
               if base.startswith("https://") else None)
    queues = _management_get(
        base, f"/api/queues/{quote(address.virtual_host, safe='')}"
        "?columns=name,type,messages,message_bytes,segments",
        address.username, address.password, context)
    streams = sorted(({"name": q["name"], "messages": q.get("messages"),
                       "segments": q.get("segments"),
                       "size": q.get("message_bytes")}
                      for q in queues if q.get("type") == "stream"),
                     key=lambda s: s["name"])
    if args.json:
        print(json.dumps(streams))
        return 0
    # Brokers do not all report a stream's size: its column only when one does.
    fields = ["name", "messages", "segments"]
    if any(s["size"] is not None for s in streams):
        fields.append("size")
    rows = [[f.upper() for f in fields]] + [
        ["-" if s[f] is None else str(s[f]) for f in fields] for s in streams]
    widths = [max(len(row[i]) for row in rows) for i in range(len(fields))]
    for row in rows:
        print("  ".join([row[0].ljust(widths[0])]
                        + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]))
    return 0


def _management_get(base: str, path: str, user: str, password: str,
                    context: ssl.SSLContext | None) -> Any:
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    request = urllib.request.Request(base + path,
                                     headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as exc:
        raise CliError(f"the management API at {base} answered {exc.code} "
                       f"{exc.reason} for user {user!r}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            raise certificate_error(base, exc.reason) from None
        raise CliError(f"cannot reach the management API at {base}: "
                       f"{getattr(exc.reason, 'strerror', None) or exc.reason} "
                       "(is the management plugin on? see --management-url)"
                       ) from None


# --- create, delete, publish ------------------------------------------------

def cmd_create(args: argparse.Namespace) -> int:
    options = {"max_age": args.max_age,
               "max_length_bytes": args.max_length_bytes,
               "stream_max_segment_size_bytes": args.max_segment_size_bytes}
    with connect(args) as client:
        client.create_stream(args.stream, **{k: v for k, v in options.items()
                                             if v is not None})
    print(f"created stream {args.stream!r}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.delete_stream(args.stream)
    print(f"deleted stream {args.stream!r}")
    return 0


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


# --- bench ------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    script = BENCH_DIR / BENCH_SCRIPTS[args.kind]
    if not script.is_file():
        raise CliError(f"{script} not found: the benchmarks come with the "
                       "source checkout of pystream, not with an installed "
                       "package", status=2)
    return subprocess.run([sys.executable, str(script), *args.args]).returncode


if __name__ == "__main__":
    raise SystemExit(main())
