"""The benchmarks' C reference reader checks what it says it checks: with
``crc`` it verifies each chunk's CRC-32 as the entries arrive (over
several reads for a chunk of megabytes), and stops at a wrong one."""

from __future__ import annotations

import json
import subprocess

from bench import harness

from . import golden
from .hostile_server import HostileServer, records_chunk

RECORDS = 3000                 # a chunk of 1 KiB records: 3 MB, several reads


def chunks(flip: int | None = None) -> list[bytes]:
    out = [records_chunk(i * RECORDS, RECORDS, b"w" * 1000) for i in range(3)]
    if flip is not None:       # a byte in the middle of a chunk's entries
        bad = bytearray(out[flip])
        bad[len(bad) // 2] ^= 0x01
        out[flip] = bytes(bad)
    return out


def read(served: list[bytes], *extra: str) -> subprocess.CompletedProcess[str]:
    def fault(conn, sub, n):
        conn.sendall(b"".join(golden.deliver(c, subscription_id=sub.subscription_id)
                              for c in served))

    with HostileServer(fault) as server:
        return subprocess.run(
            harness.wire_cmd("consume", server.uri, "s", len(served) * RECORDS, 64, *extra),
            capture_output=True, text=True, timeout=60)


def result(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def test_the_crc_checking_reader_reads_good_chunks():
    res = result(read(chunks(), "crc"))
    assert res["crc"] is True
    assert res["records_received"] == 3 * RECORDS
    assert res["recvs"] > 3    # the chunks came in more reads than chunks


def test_the_crc_checking_reader_stops_at_a_corrupt_chunk():
    done = read(chunks(flip=1), "crc")
    assert done.returncode != 0
    assert "chunk CRC-32 mismatch" in done.stderr
    # the same bytes pass the reader that does not check
    res = result(read(chunks(flip=1)))
    assert res["crc"] is False
    assert res["records_received"] == 3 * RECORDS
