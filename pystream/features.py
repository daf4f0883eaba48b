"""Which broker release brought which feature: the one place that decides
whether a command may be sent, from the version the broker gave in its peer
properties, so that an old broker is never sent a command that makes it drop
the connection (RabbitMQ 3.10 answers an unknown command with Close)."""

from __future__ import annotations

import re

from .errors import UnsupportedFeature

FIRST_RELEASE: dict[str, tuple[int, int]] = {
    "exchange_command_versions": (3, 11),
    "stream_stats": (3, 11),
    "single_active_consumer": (3, 11),
    "super_stream_commands": (3, 13),  # CreateSuperStream, DeleteSuperStream
    "filtering": (3, 13),
    "resolve_offset_spec": (4, 3),
}


def parse_version(text: str) -> tuple[int, ...]:
    """'4.0.5' -> (4, 0, 5); a suffix such as '+rc.1' or '-alpha' is ignored,
    an unreadable version reads as (0,)."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else (0,)


class Features:
    def __init__(self, server_version: str) -> None:
        self.server_version = server_version
        self.version = parse_version(server_version)

    def supports(self, feature: str) -> bool:
        return self.version >= FIRST_RELEASE[feature]

    def require(self, feature: str) -> None:
        if not self.supports(feature):
            major, minor = FIRST_RELEASE[feature]
            raise UnsupportedFeature(
                f"{feature.replace('_', ' ')} needs RabbitMQ {major}.{minor} "
                f"or later; the broker is {self.server_version or 'unknown'}")
