"""The delay relay (``relay.c``) from Python: the one way the tests and the
benchmarks put distance between a client and the broker.

    with DelayRelay("localhost", 5552, rtt_ms=20) as relay:
        client = pystream.connect(relay.uri(uri), address_resolver=relay.resolver)
        ...
    relay.final_stats   # {"accepted": 2, "bytes_up": ..., "bytes_down": ...}

Half the round trip is added each way. Clients that look up a stream's
node and dial what the broker advertises (localhost:5552) would go around
the relay: pystream takes ``address_resolver=relay.resolver``, rstream
``load_balancer_mode=True`` (it dials the address it was given until the
node it wants answers), and the byte counts in ``stats()`` show what went
through.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
BINARY = HERE / "relay"


def relay_binary() -> Path:
    """The relay, built when missing or older than its source."""
    src = BINARY.with_suffix(".c")
    if not BINARY.exists() or BINARY.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["make", "-s", "-C", str(HERE)], check=True)
    return BINARY


class DelayRelay:
    """A relay on a free port of 127.0.0.1 to ``host:port`` that adds
    ``rtt_ms`` to every round trip (``jitter_ms``: each one-way delay moves
    by up to that much, byte order kept; ``rate``: a link of that many
    bytes per second each way; ``buffer_bytes``: the most held each way)."""

    host = "127.0.0.1"

    def __init__(self, target_host: str, target_port: int, *, rtt_ms: float = 0.0,
                 jitter_ms: float = 0.0, rate: int | None = None,
                 buffer_bytes: int | None = None, seed: int | None = None) -> None:
        if rtt_ms < 0 or jitter_ms < 0:
            raise ValueError("rtt_ms and jitter_ms must be >= 0")
        self.target = (target_host, target_port)
        self.rtt_ms = rtt_ms
        self.args = ["-d", str(round(rtt_ms * 500)), "-j", str(round(jitter_ms * 1000))]
        if rate:
            self.args += ["-r", str(int(rate))]
        if buffer_bytes:
            self.args += ["-b", str(int(buffer_bytes))]
        if seed is not None:
            self.args += ["-s", str(int(seed))]
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.final_stats: dict | None = None

    def start(self) -> DelayRelay:
        cmd = [str(relay_binary()), *self.args, self.target[0], str(self.target[1])]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"relay did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def _stats_after(self, sig: int) -> dict:
        assert self.proc is not None
        self.proc.send_signal(sig)
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("relay exited without its statistics")
            if line.startswith("STATS "):
                return json.loads(line[6:])

    def stats(self) -> dict:
        """Connections accepted and bytes relayed each way so far."""
        return self._stats_after(signal.SIGUSR1)

    def stop(self) -> dict:
        """End the relay (its connections with it); its final statistics."""
        if self.proc is None:
            return self.final_stats or {}
        try:
            self.final_stats = self._stats_after(signal.SIGTERM)
            self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc = None
        return self.final_stats

    def __enter__(self) -> DelayRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- pointing clients at it ----------------------------------------------------

    def uri(self, uri: str) -> str:
        """``uri`` with the relay's address in place of the broker's."""
        parts = urlsplit(uri)
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{self.host}:{self.port}"))

    def resolver(self, endpoint):
        """pystream's ``address_resolver``: every node the broker advertises
        is reached through the relay."""
        from pystream.pool import Endpoint
        return Endpoint(self.host, self.port)
