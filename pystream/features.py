"""Which broker release brought which feature: the one place that decides
whether a command may be sent, from the version the broker gave in its peer
properties and, on 3.11+, the command versions it advertised, so that an old
broker is never sent a command that makes it drop the connection (RabbitMQ
3.10 answers an unknown command with Close)."""

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

#: Features that are one command: a broker that advertised its command
#: versions must also have listed this key (a 4.3 with the command turned off
#: or a build without it would not).
COMMAND_KEY: dict[str, int] = {
    "resolve_offset_spec": 0x001F,
}


def parse_version(text: str) -> tuple[int, ...]:
    """'4.0.5' -> (4, 0, 5); a suffix such as '+rc.1' or '-alpha' is ignored,
    an unreadable version reads as (0,)."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else (0,)


class Features:
    """``commands``: what ExchangeCommandVersions answered, ``{key: (min,
    max)}``; None until it did (or on brokers before 3.11)."""

    def __init__(self, server_version: str,
                 commands: dict[int, tuple[int, int]] | None = None) -> None:
        self.server_version = server_version
        self.version = parse_version(server_version)
        self.commands = commands

    def supports(self, feature: str) -> bool:
        if self.version < FIRST_RELEASE[feature]:
            return False
        key = COMMAND_KEY.get(feature)
        return key is None or self.commands is None or key in self.commands

    def require(self, feature: str) -> None:
        if not self.supports(feature):
            major, minor = FIRST_RELEASE[feature]
            if self.version >= (major, minor):
                raise UnsupportedFeature(
                    f"{feature.replace('_', ' ')}: the broker "
                    f"({self.server_version}) did not advertise command "
                    f"{COMMAND_KEY[feature]:#06x}")
            raise UnsupportedFeature(
                f"{feature.replace('_', ' ')} needs RabbitMQ {major}.{minor} "
                f"or later; the broker is {self.server_version or 'unknown'}")
