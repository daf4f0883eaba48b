"""What the commands share: the broker options turned into a connection,
argument types, the error a command raises to print one line."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import os
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pyarrow as pa

import pystream
from pystream.ranges import DEFAULT_PASSWORD_ENV
from pystream.tls import tls_options

DEFAULT_URI = "rabbitmq-stream://guest:guest@localhost:5552/"
#: Where the password is read when neither the URI nor an option holds it
#: (the Spark data source's default ``passwordEnv`` too).
PASSWORD_ENV = DEFAULT_PASSWORD_ENV
MANAGEMENT_PORT = 15672
MANAGEMENT_TLS_PORT = 15671
OPTIONAL_COLUMNS = ("properties", "application_properties",
                    "message_annotations", "header")

#: ``--from``: "first", "last", "next", an offset or a time.
Start = str | int | dt.datetime
Emit = Callable[[pa.RecordBatch], None]


class CliError(Exception):
    """A failure whose message is already the line to print."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, not {text!r}")
    return value


def port_number(text: str) -> int:
    if not _is_number(text) or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port (0-65535), not {text!r}")
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


def resolve_password(args: argparse.Namespace) -> None:
    """Put the password into ``args.uri``, read from ``--password-file``,
    ``--password-prompt``, else the URI, else ``$PYSTREAM_PASSWORD``, else a
    prompt when stdin is a terminal and the URI names a user without a
    password: a password in argv is in the shell's history and ``ps``."""
    parts = urlsplit(args.uri)
    flags = [flag for flag, given in (("--password-file", args.password_file is not None),
                                      ("--password-prompt", args.password_prompt))
             if given]
    if len(flags) > 1:
        raise CliError("give --password-file or --password-prompt, not both", 2)
    if flags and parts.password is not None:
        raise CliError(f"the URI holds a password: give it there or with "
                       f"{flags[0]}, not both", 2)
    if args.sasl_mechanism == "EXTERNAL":
        if flags:
            raise CliError(f"{flags[0]}: EXTERNAL logs in as the client "
                           "certificate's name and sends no password", 2)
        return
    if args.password_file is not None:
        with open(args.password_file, encoding="utf-8") as f:
            password = f.read().strip("\r\n")
    elif args.password_prompt:
        password = _prompt(args.uri)
    elif parts.password is not None:
        return
    elif PASSWORD_ENV in os.environ:
        password = os.environ[PASSWORD_ENV]
    elif parts.username is not None and sys.stdin.isatty():
        password = _prompt(args.uri)
    else:
        return  # guest, or the user with the default password
    user, _, host = parts.netloc.rpartition("@")
    netloc = f"{user or 'guest'}:{quote(password, safe='')}@{host}"
    args.uri = urlunsplit(parts._replace(netloc=netloc))


def _prompt(uri: str) -> str:
    # getpass reads the terminal, not stdin (publish's input).
    return getpass.getpass(f"password for {pystream.parse_uri(uri).uri()}: ")


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of ``pystream.connect`` the global options ask for; the
    TLS context is built (its files read) here."""
    return {"connection_name": "pystream cli",
            **tls_options(pystream.parse_uri(args.uri).tls, ca_file=args.ca_file,
                          cert_file=args.cert_file, key_file=args.key_file,
                          sasl_mechanism=args.sasl_mechanism)}


def connect(args: argparse.Namespace) -> pystream.Client:
    return pystream.connect(args.uri, **connection_options(args))


def serve_metrics(args: argparse.Namespace) -> None:
    """With --metrics-port: an OpenTelemetry SDK meter provider for
    pystream's metrics, read by the Prometheus exporter and served over HTTP
    on --metrics-host (the command's life long)."""
    if args.metrics_port is None:
        return
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise CliError(f"--metrics-port needs opentelemetry-sdk and "
                       f"opentelemetry-exporter-prometheus ({exc})") from None
    import signal

    from pystream import metrics
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
    # Every shared name, as the other clients serve them: a command's
    # throughput is the terminal's, not the histogram's.
    metrics.record_chunk_sizes()
    # The server's thread inherits a mask without SIGINT: a Ctrl-C taken by
    # that thread would leave the main thread waiting, uninterrupted.
    stop = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        start_http_server(args.metrics_port, addr=args.metrics_host)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
