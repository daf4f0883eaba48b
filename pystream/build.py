"""What this build of pystream has: the CRC-32 code and the sub-batch codecs.

A wheel has everything; a source build has what its machine had when it was
built (zlib always; ISA-L, snappy, lz4 and zstd when found).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _core
from ._version import __version__


@dataclass(frozen=True)
class BuildInfo:
    """``version``; ``crc``, the code that checks chunk CRCs on this build and
    CPU, in words (ISA-L's variant for this CPU, pystream's 256-bit folding,
    or ``"zlib crc32"`` in a build without ISA-L); ``codecs``, the
    sub-batch codecs it can read and publish. A missing codec raises
    :class:`~pystream.CodecUnavailable` where a sub-batch needs it."""

    version: str
    crc: str
    codecs: tuple[str, ...]

    def __str__(self) -> str:
        return (f"pystream {self.version} (CRC-32: {self.crc}; codecs: "
                f"{' '.join(self.codecs)})")


def build_info() -> BuildInfo:
    """This build's :class:`BuildInfo` (``pystream --version`` prints it)."""
    return BuildInfo(__version__, _core.crc32_implementation(), _core.codecs())
