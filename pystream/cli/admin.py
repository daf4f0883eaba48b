"""``pystream stats``, ``streams``, ``create`` and ``delete``."""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import ssl
import urllib.error
import urllib.request
from email.message import Message
from typing import IO, Any, NoReturn
from urllib.parse import quote, urlsplit

import pystream
from pystream.bounds import stream_bounds
from pystream.tls import certificate_error, tls_context

from .common import MANAGEMENT_PORT, MANAGEMENT_TLS_PORT, CliError, connect

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
        address.username, address.password, context,
        allow_plain_http=args.allow_plain_http)
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
                        + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)]))
    return 0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses redirects: urllib would send the Authorization header along,
    to whatever host the answer names."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes],
                         code: int, msg: str, headers: Message,
                         newurl: str) -> NoReturn:
        raise CliError(f"the management API at {_origin(req.full_url)} "
                       f"redirected ({code}) to {_origin(newurl)}: not followed, "
                       "the password would go along; give --management-url "
                       "the address it redirects to")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: where it resolves to is not ours to trust


def _management_get(base: str, path: str, user: str, password: str,
                    context: ssl.SSLContext | None, *,
                    allow_plain_http: bool = False) -> Any:
    """GET a management API path with Basic auth. Plain http carries the
    password readable on the network: only to this machine, unless
    ``allow_plain_http``."""
    host = urlsplit(base).hostname or ""
    if base.startswith("http://") and not allow_plain_http and not _is_loopback(host):
        raise CliError(f"the management API at {base} is plain http: the "
                       f"password of {user!r} would cross the network "
                       "readable; use an https:// --management-url, or "
                       "--allow-plain-http to send it anyway", status=2)
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    request = urllib.request.Request(base + path,
                                     headers={"Authorization": f"Basic {token}"})
    opener = urllib.request.build_opener(
        _NoRedirect, urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=30) as answer:
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
