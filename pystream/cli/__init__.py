"""The ``pystream`` command line: ``main`` runs it. One module per command
(``tail``, ``watch``, ``dump``, ``admin``, ``publish``), the
argument parsing in ``parser``, what they share in ``common``."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable

import pystream

from .common import CliError, resolve_password, serve_metrics, start_spec
from .parser import build_parser
from .publish import PUBLISH_BATCH, line_batches

__all__ = ["main", "describe", "build_parser", "start_spec", "CliError",
           "line_batches", "PUBLISH_BATCH"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage error (2)
        return int(stop.code or 0)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        if args.broker:
            resolve_password(args)
        serve_metrics(args)
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
