"""Make the golden Deliver captures again, from the project's own brokers
(``scripts/capture-golden``; what they hold: tests/data/README.md).

Other clients write a new stream, one after the other, each waiting for its
confirms, so the stream's order is the order written:

- rbfly: AMQP 1.0 messages of one data section (``amqp-data``);
- rstream: entries that are not AMQP (``raw``), then sub-batches of AMQP
  messages in each of the five codecs (``sub-batch-0`` .. ``-4``); rstream
  itself compresses none and gzip, and takes codecs registered by the user
  for the other three, given here by cramjam (snappy framed, lz4 frame,
  zstd), an implementation unrelated to pystream's libraries;
- rstream again: a stored consumer offset, which the broker keeps as a
  tracking chunk taking one offset (the capture's one gap);
- rbfly again, then pika over AMQP 0-9-1 with properties and headers
  (``amqp091``).

``expected.json`` is what the writers sent. The frames are read off a
socket that subscribes at the first offset and keeps the Deliver frames as
they arrive (asking for Deliver v2 where the broker has it); pystream's
decoder plays no part.

    python -m tests.capture_golden [--broker modern|legacy|all] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import struct
import sys
import uuid
from pathlib import Path
from typing import Any

from pystream import protocol as P
from pystream.uri import parse_uri

from . import brokers
from .golden import GOLDEN
from .publishers import amqp091_url, declare_stream_amqp091, publish_amqp091

URIS = {"modern": brokers.MODERN.uri(), "legacy": brokers.LEGACY.uri()}
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
TRACKING_REFERENCE = "golden-reader"


def plan(seed: int) -> list[tuple[str, list[Any]]]:
    """The segments to write, in order: ``(kind, bodies)``; ``tracking``
    stands for the stored offset."""
    rng = random.Random(seed)

    def repeated(n: int, size: int) -> list[bytes]:
        # Compressible bodies, each its own: codecs must actually compress.
        out = []
        for _ in range(n):
            word = f"{rng.getrandbits(32)}:".encode()
            out.append((word * (size // len(word) + 1))[:rng.randint(1, size)])
        return out

    # Sizes either side of 255 bytes: AMQP vbin8 and vbin32 data sections.
    amqp = [rng.randbytes(rng.choice([1, 40, 255, 256, 700])) for _ in range(20)]
    raw = [b"raw:" + rng.randbytes(rng.randint(0, 300)) for _ in range(8)]
    return [("amqp-data", amqp), ("raw", raw),
            ("sub-batch-0", repeated(38, 600)), ("sub-batch-1", repeated(13, 900)),
            ("tracking", []),
            ("sub-batch-2", repeated(12, 900)), ("sub-batch-3", repeated(80, 300)),
            ("sub-batch-4", repeated(47, 700)),
            ("amqp-data", [rng.randbytes(rng.randint(0, 300)) for _ in range(7)]),
            ("amqp091", [f"amqp091 body {i}".encode() for i in range(2)])]


AMQP091_FIELDS = {"content_type": "text/plain", "content_encoding": "utf-8",
                  "reply_to": "rq", "creation_time_ms": 1_700_000_000_000}


def amqp091_expected(index: int) -> dict[str, Any]:
    return {"message_id": f"mid-1-{index}", "correlation_id": f"corr-{index}",
            **AMQP091_FIELDS, "app": {"h-str": f"v{index}", "h-int": 42}}


# --- the writers -------------------------------------------------------------

def register_rstream_codecs() -> None:
    """rstream compresses none and gzip itself; snappy, lz4 and zstd are
    codecs its users register (rstream.compression.ICompressionCodec)."""
    import cramjam
    from rstream.compression import CompressionType, NoneCompressionCodec, StreamCompressionCodecs

    def codec(kind: int, compress) -> type:
        class Codec(NoneCompressionCodec):
            def compress(self, messages) -> None:
                super().compress(messages)  # the plain sub-batch bytes
                self.buffer = bytes(compress(self.buffer))
                self.compressed_data_size = len(self.buffer)

            def compression_type(self) -> int:
                return kind
        return Codec

    for kind, ctype, compress in (
            (2, CompressionType.Snappy, cramjam.snappy.compress),
            (3, CompressionType.Lz4, cramjam.lz4.compress),
            (4, CompressionType.Zstd, cramjam.zstd.compress)):
        StreamCompressionCodecs.register_codec(ctype, codec(kind, compress)())


async def write_rbfly(uri: str, stream: str, bodies: list[bytes]) -> None:
    """An unnamed rbfly publisher: AMQP 1.0, one data section each."""
    import rbfly.streams as rbs

    client = rbs.streams_client(uri)
    try:
        async with client.publisher(stream, cls=rbs.PublisherBatchFast) as p:
            for body in bodies:
                p.batch(body)
            await p.flush()
    finally:
        await client.disconnect()


async def write_rstream(uri: str, stream: str, kind: str,
                        bodies: list[bytes]) -> None:
    """Raw entries one by one, or one sub-batch of AMQP messages."""
    from rstream import AMQPMessage, CompressionType, Consumer, Producer

    a = parse_uri(uri)
    login = dict(username=a.username, password=a.password, vhost=a.virtual_host)
    if kind == "tracking":
        consumer = Consumer(a.host, a.port, **login)
        await consumer.start()
        try:
            await consumer.store_offset(stream, TRACKING_REFERENCE, 0)
        finally:
            await consumer.close()
        return
    confirmed = asyncio.Event()
    count = 0
    total = len(bodies) if kind == "raw" else 1

    def on_confirm(status) -> None:
        nonlocal count
        if not status.is_confirmed:
            raise RuntimeError(f"rstream: a {kind} publish was not confirmed")
        count += 1
        if count == total:
            confirmed.set()

    producer = Producer(a.host, a.port, **login)
    await producer.start()
    try:
        if kind == "raw":
            for body in bodies:
                await producer.send(stream, body, on_publish_confirm=on_confirm)
        else:
            codec = CompressionType(int(kind.rsplit("-", 1)[1]))
            await producer.send_sub_entry(
                stream, [AMQPMessage(body=b) for b in bodies],
                compression_type=codec, on_publish_confirm=on_confirm)
        await asyncio.wait_for(confirmed.wait(), 60)
    finally:
        await producer.close()


def write_amqp091(uri: str, stream: str, bodies: list[bytes]) -> None:
    import pika

    messages = []
    for i, body in enumerate(bodies):
        exp = amqp091_expected(i)
        messages.append((body, pika.BasicProperties(
            message_id=exp["message_id"], correlation_id=exp["correlation_id"],
            content_type=exp["content_type"],
            content_encoding=exp["content_encoding"], reply_to=exp["reply_to"],
            timestamp=exp["creation_time_ms"] // 1000, headers=exp["app"])))
    publish_amqp091(amqp091_url(uri), stream, messages)


def write(uri: str, stream: str, segments: list[tuple[str, list[Any]]]
          ) -> list[dict[str, Any]]:
    """Write the segments in order; the records as the writers sent them."""
    register_rstream_codecs()
    records: list[dict[str, Any]] = []
    for kind, bodies in segments:
        if kind == "amqp-data":
            asyncio.run(write_rbfly(uri, stream, bodies))
        elif kind == "amqp091":
            write_amqp091(uri, stream, bodies)
        else:
            asyncio.run(write_rstream(uri, stream, kind, bodies))
        for i, body in enumerate(bodies):
            row = {"kind": kind, "body": body.hex()}
            if kind == "amqp091":
                row.update(amqp091_expected(i))
            records.append(row)
    return records


# --- the reader --------------------------------------------------------------

class Capture:
    """A socket that subscribes and keeps Deliver frames byte for byte."""

    def __init__(self, uri: str) -> None:
        self.address = parse_uri(uri)
        self.sock = socket.create_connection(
            (self.address.host, self.address.port), timeout=30)
        self.pending = bytearray()
        self.corr = 0
        self.tune: P.Tune | None = None
        self.frames: list[bytes] = []  # Deliver frames with their size prefix

    def frame(self) -> bytes:
        """The next frame, size prefix included."""
        while True:
            if len(self.pending) >= 4:
                (size,) = struct.unpack_from(">I", self.pending)
                if len(self.pending) >= 4 + size:
                    out = bytes(self.pending[:4 + size])
                    del self.pending[:4 + size]
                    return out
            got = self.sock.recv(1 << 20)
            if not got:
                raise ConnectionError("the broker closed the socket")
            self.pending += got

    def request(self, make) -> P.Command:
        self.corr += 1
        cmd = make(self.corr)
        self.sock.sendall(P.encode(cmd))  # whole frames: see bench notes
        while True:
            frame = self.frame()
            key = P.frame_key(frame[4:])
            if key == P.Deliver.KEY:
                self.frames.append(frame)
            elif key == cmd.KEY | P.RESPONSE_BIT:
                answer = P.decode(frame[4:])
                if answer.response_code != P.RESPONSE_OK:
                    raise RuntimeError(f"{type(cmd).__name__}: response code "
                                       f"{answer.response_code:#x}")
                return answer
            elif key == P.Tune.KEY:
                self.tune = P.decode(frame[4:])

    def open(self) -> tuple[str, int]:
        """Handshake; the broker's version and the Deliver version asked."""
        peer = self.request(lambda c: P.PeerProperties(
            c, {"product": "pystream-capture-golden"}))
        self.request(P.SaslHandshake)
        a = self.address
        self.request(lambda c: P.SaslAuthenticate(
            c, "PLAIN", b"\0" + a.username.encode() + b"\0" + a.password.encode()))
        while self.tune is None:  # the broker tunes right after SASL
            frame = self.frame()
            if P.frame_key(frame[4:]) == P.Tune.KEY:
                self.tune = P.decode(frame[4:])
        self.sock.sendall(P.encode(P.TuneResponse(self.tune.frame_max, 0)))
        self.request(lambda c: P.Open(c, a.virtual_host))
        version = dict(peer.properties).get("version", "unknown")
        deliver = 1
        if not version.startswith("3.10"):  # ExchangeCommandVersions: 3.11+
            self.request(lambda c: P.ExchangeCommandVersions(
                c, (P.CommandVersion(P.Deliver.KEY, 1, 2),)))
            deliver = 2
        return version, deliver

    def read(self, stream: str, end: int) -> list[bytes]:
        """Deliver frames from the first offset until offset ``end`` is
        covered, granting one credit per chunk."""
        self.request(lambda c: P.Subscribe(c, 1, stream,
                                           P.OffsetSpec(P.OFFSET_FIRST), 1))
        taken = covered = 0
        while covered < end:
            while taken < len(self.frames):
                frame = self.frames[taken]
                taken += 1
                version, = struct.unpack_from(">H", frame, 6)
                head = 4 + 5 + (8 if version >= 2 else 0)
                records, = struct.unpack_from(">I", frame, head + 4)
                first, = struct.unpack_from(">Q", frame, head + 24)
                covered = max(covered, first + records)
                self.sock.sendall(P.encode(P.Credit(1, 1)))
            if covered < end:
                frame = self.frame()
                if P.frame_key(frame[4:]) == P.Deliver.KEY:
                    self.frames.append(frame)
        return self.frames

    def close(self) -> None:
        self.sock.close()


def capture(uri: str, out: Path, seed: int = 1) -> Path:
    """Write a new stream with the other clients, capture it into
    ``out/rabbitmq-VERSION-vN``, delete the stream; the folder."""
    stream = f"golden-{uuid.uuid4().hex[:8]}"
    declare_stream_amqp091(amqp091_url(uri), stream)
    reader = Capture(uri)
    try:
        version, deliver = reader.open()
        segments = plan(seed)
        records = write(uri, stream, segments)
        # user records, and the one offset the tracking chunk takes
        frames = reader.read(stream, len(records) + 1)
        reader.request(lambda c: P.Delete(c, stream))
    finally:
        reader.close()
    folder = out / f"rabbitmq-{version}-v{deliver}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "frames.bin").write_bytes(b"".join(frames))
    (folder / "expected.json").write_text(json.dumps(
        {"stream": stream, "deliver_version": deliver,
         "writers": {"amqp-data": "rbfly", "raw": "rstream",
                     **{f"sub-batch-{n}": f"rstream ({name})"
                        for n, name in CODEC_NAMES.items()},
                     "tracking": "rstream store_offset", "amqp091": "pika"},
         "records": records}, indent=1) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/capture-golden",
        description="Make the golden Deliver captures from the test brokers.")
    parser.add_argument("--broker", choices=[*URIS, "all"], default="all")
    parser.add_argument("--out", type=Path, default=GOLDEN / "deliver",
                        help="folder of the captures (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for name in URIS if args.broker == "all" else [args.broker]:
        folder = capture(URIS[name], args.out, args.seed)
        print(f"{name}: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
