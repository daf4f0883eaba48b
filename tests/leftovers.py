"""What the tests leave on the test brokers, and its removal.

The one list of the streams kept on purpose between runs (they take seconds
to fill), and the names by which the tests' own streams, users and vhosts
are told from the brokers' defaults. conftest.py removes a session's
leftovers when the suite ends; ``scripts/broker clean`` runs this file as a
script to remove them and the kept streams. Standard library only: the
broker script runs it with the system's python3, through each broker's
management API (guest may use it from localhost).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable

# Streams the tests keep between runs, on the modern broker.
RECOVERY_STREAM = "pystream-test-recovery-1m"  # 1 M records of 100 bytes
MEMORY_STREAM = "pystream-test-memory-1g"      # 1 M records of 1 KiB
RSS_STREAM = "pystream-test-rss-10m"           # 10 M records
# ... and those that bench/ (bench_consume.py, bench_spark.py) and
# `make demo` (scripts/demo.py) keep.
KEPT_STREAMS = frozenset({RECOVERY_STREAM, MEMORY_STREAM, RSS_STREAM,
                          "bench-100b", "bench-1k", "pystream-demo"})

# Every stream (super streams and their partitions too), user and vhost a
# test creates is named with one of these prefixes; the brokers' own
# (guest, "/", amq.*) never are. The benchmarks name theirs "bench-...".
TEST_PREFIXES = ("test-", "pystream-", "super-", "regions-", "close-me-")
BENCH_PREFIXES = ("bench-",)


class Management:
    """The few calls of the management HTTP API that cleaning needs."""

    def __init__(self, url: str, user: str = "guest",
                 password: str = "guest", timeout: float = 10) -> None:
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}"}
        self.timeout = timeout

    def _call(self, method: str, path: str) -> object:
        request = urllib.request.Request(self.url + path, method=method,
                                         headers=self.headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as reply:
            body = reply.read()
        return json.loads(body) if body else None

    def reachable(self) -> bool:
        try:
            self._call("GET", "/api/overview")
            return True
        except (OSError, ValueError):
            return False

    def list(self, kind: str) -> list[dict]:
        return self._call("GET", f"/api/{kind}")  # type: ignore[return-value]

    def delete(self, kind: str, *names: str) -> bool:
        """Delete one object; False if it was already gone."""
        path = "/".join(urllib.parse.quote(n, safe="") for n in names)
        try:
            self._call("DELETE", f"/api/{kind}/{path}")
            return True
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise


def leftovers(api: Management, keep: Iterable[str] = KEPT_STREAMS,
              prefixes: tuple[str, ...] = TEST_PREFIXES,
              ) -> list[tuple[str, str, str]]:
    """(kind, vhost, name) of every object on the broker whose name starts
    with one of ``prefixes``, but the streams in ``keep``. A test vhost
    goes whole, with what is in it."""
    keep = set(keep)

    def is_test_name(name: str) -> bool:
        return name.startswith(prefixes)

    found: list[tuple[str, str, str]] = []
    vhosts = [v["name"] for v in api.list("vhosts")]
    test_vhosts = {v for v in vhosts if is_test_name(v)}
    found += [("vhosts", "", v) for v in sorted(test_vhosts)]
    for kind in ("queues", "exchanges"):
        for item in api.list(kind):
            name, vhost = item["name"], item["vhost"]
            if (vhost not in test_vhosts and is_test_name(name)
                    and name not in keep):
                found.append((kind, vhost, name))
    found += [("users", "", u["name"]) for u in api.list("users")
              if is_test_name(u["name"])]
    return found


def remove(api: Management, found: list[tuple[str, str, str]]) -> int:
    """Delete what ``leftovers`` found; how many were still there."""
    removed = 0
    for kind, vhost, name in found:
        names = (vhost, name) if vhost else (name,)
        removed += api.delete(kind, *names)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("management_url", nargs="+",
                        help="a broker's management API, e.g. http://localhost:15672")
    parser.add_argument("--kept", action="store_true",
                        help="also delete the streams kept between runs "
                        "and the benchmarks' streams")
    args = parser.parse_args(argv)
    status = 0
    for url in args.management_url:
        api = Management(url)
        if not api.reachable():
            print(f"{url}: management API not answering, skipped")
            status = 1
            continue
        if args.kept:
            found = leftovers(api, keep=(),
                              prefixes=TEST_PREFIXES + BENCH_PREFIXES)
        else:
            found = leftovers(api)
        removed = remove(api, found)
        kinds = sorted({kind for kind, _, _ in found})
        counts = ", ".join(f"{sum(k == kind for k, _, _ in found)} {kind}"
                           for kind in kinds) or "nothing"
        print(f"{url}: deleted {removed} ({counts})")
    return status


if __name__ == "__main__":
    sys.exit(main())
