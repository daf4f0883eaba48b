"""Broker addresses: ``rabbitmq-stream://user:pass@host:port/vhost``.

``rabbitmq-stream+tls://`` selects TLS. User, password and virtual host are
percent-decoded (``%2F`` is the default virtual host ``/``). Defaults: guest /
guest, port 5552 (5551 with TLS), virtual host ``/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

SCHEMES = {"rabbitmq-stream": False, "rabbitmq-stream+tls": True}
DEFAULT_PORT = 5552
DEFAULT_TLS_PORT = 5551


@dataclass(frozen=True)
class BrokerAddress:
    """Where and how to connect: what ``parse_uri`` makes of a URI (the
    password is kept out of its ``repr`` and of ``uri()``)."""

    host: str = "localhost"
    port: int = DEFAULT_PORT
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    virtual_host: str = "/"
    tls: bool = False

    def uri(self) -> str:
        """The address as a URI, without the password."""
        scheme = "rabbitmq-stream+tls" if self.tls else "rabbitmq-stream"
        vhost = "" if self.virtual_host == "/" else _quote(self.virtual_host)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{_quote(self.username)}@{host}:{self.port}/{vhost}"


def parse_uri(uri: str) -> BrokerAddress:
    """Parse a broker URI; a malformed one raises ``ValueError`` naming the
    part that is wrong (never echoing the password)."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise ValueError(f"broker URI is malformed: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"broker URI scheme {parts.scheme!r} is not one of "
                         f"{', '.join(SCHEMES)}")
    tls = SCHEMES[parts.scheme]
    if parts.query or parts.fragment:
        raise ValueError("broker URI has a query or fragment; pystream takes "
                         "options as keyword arguments")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("broker URI port is not a number from 0 to 65535") from None
    if port == 0:
        raise ValueError("broker URI port must not be 0")
    host = parts.hostname
    if not host:
        host = "localhost"
    path = parts.path
    if path in ("", "/"):
        vhost = "/"
    else:
        if "/" in path[1:]:
            raise ValueError("broker URI virtual host must be one path "
                             "segment; write '/' inside it as %2F")
        try:
            vhost = unquote(path[1:], errors="strict")
        except UnicodeDecodeError:
            raise ValueError("broker URI virtual host is not valid "
                             "percent-encoded UTF-8") from None
    return BrokerAddress(
        host=host,
        port=port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT),
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        virtual_host=vhost,
        tls=tls,
    )


def _quote(text: str) -> str:
    return quote(text, safe="")
