"""pystream: read, write and manage RabbitMQ streams from the shell.

Commands (pystream COMMAND --help for each one's options):

  tail STREAM       follow a stream: a table, JSON lines or raw bodies
  watch STREAM      a stream's end and its consumers' stored offsets, lag
                    and rates, refreshed like top
  dump STREAM       write records to a Parquet or Arrow IPC file
  stats STREAM      first offset, end, chunk ids, leader and replicas
  streams           list the streams (management HTTP API)
  create STREAM     create a stream, with retention options
  delete STREAM     delete a stream
  publish STREAM    publish each line of stdin as one message

The broker is --uri, else $PYSTREAM_URI, else
rabbitmq-stream://guest:guest@localhost:5552/. Its password is better not in
the URI (shell history, ps): --password-file, $PYSTREAM_PASSWORD or the
prompt (--password-prompt; by itself when stdin is a terminal and the URI
names a user without a password). A rabbitmq-stream+tls:// URI connects over
TLS (--ca-file, --cert-file, --key-file, --sasl-mechanism
EXTERNAL for a private CA and a client certificate). An error prints one line,
"pystream: error: ...", and exits 1 (2 for usage errors); --debug shows its
traceback instead. Ctrl-C ends tail and watch with status 0, other commands
with 130. --metrics-port PORT serves pystream's OpenTelemetry metrics in the
Prometheus text format while the command runs.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from pystream import build_info
from pystream.tls import SASL_MECHANISMS

from .admin import cmd_create, cmd_delete, cmd_stats, cmd_streams
from .common import (
    DEFAULT_URI,
    MANAGEMENT_PORT,
    MANAGEMENT_TLS_PORT,
    OPTIONAL_COLUMNS,
    PASSWORD_ENV,
    broker_uri,
    columns_list,
    dump_path,
    management_url,
    max_age,
    offset_int,
    port_number,
    positive_float,
    positive_int,
    start_spec,
)
from .dump import cmd_dump
from .publish import cmd_publish
from .tail import cmd_tail
from .watch import cmd_watch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pystream", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=str(build_info()))
    _add_global_options(parser, top=True)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND",
                                     required=True)

    def command(name: str, run: Callable[[argparse.Namespace], int],
                help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        _add_global_options(sub, top=False)
        sub.set_defaults(run=run, broker=True)
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
    tail.add_argument("--stats", action="store_true",
                      help="a status line on stderr every second: position, "
                      "messages/s and lag")

    watch = command("watch", cmd_watch, "a stream's committed end and write "
                    "rate, and each named consumer's stored offset, lag and "
                    "rate, refreshed like top (Ctrl-C stops it, exit status 0)")
    watch.add_argument("stream")
    watch.add_argument("--consumer", action="append", default=[],
                       metavar="NAME", help="a consumer name (repeat for more)")
    watch.add_argument("--interval", type=positive_float, default=1.0,
                       metavar="SECONDS", help="seconds between refreshes "
                       "(default 1)")
    watch.add_argument("--iterations", type=positive_int, metavar="N",
                       help="stop after N refreshes")

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
    streams.add_argument("--allow-plain-http", action="store_true",
                         help="log in to an http:// management URL on another "
                         "host (refused by default: Basic auth sends the "
                         "password readable); redirects are never followed")
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
    parser.add_argument("--password-file", metavar="PATH", default=default(None),
                        help="read the password from this file (its text, "
                        "without the line end), not from the URI")
    parser.add_argument("--password-prompt", action="store_true",
                        default=default(False),
                        help="ask for the password on the terminal (also done "
                        "when stdin is a terminal and the URI names a user "
                        f"without a password, and ${PASSWORD_ENV} is unset)")
    parser.add_argument("--debug", action="store_true", default=default(False),
                        help="show the traceback of an error")
    parser.add_argument("--metrics-port", type=port_number, metavar="PORT",
                        default=default(None),
                        help="serve the metrics in the Prometheus text format "
                        "on this port (needs opentelemetry-sdk and "
                        "opentelemetry-exporter-prometheus)")
    parser.add_argument("--metrics-host", metavar="ADDRESS",
                        default=default("127.0.0.1"),
                        help="the address --metrics-port binds (default "
                        "127.0.0.1)")
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
