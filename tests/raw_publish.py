"""A minimal publisher for the consumer tests: AMQP 1.0 bodies (and string
application properties) in Publish frames over a pystream ``Connection``,
waiting for every confirm. Deliberately independent of pystream's producer
so that consumer tests do not rest on it."""

from __future__ import annotations

import struct
import threading
from typing import Sequence

from pystream import protocol as P
from pystream.client import Client


def amqp_message(body: bytes, app: dict[str, str] | None = None) -> bytes:
    out = b""
    if app:
        items = b"".join(_str32(k) + _str32(v) for k, v in app.items())
        out += b"\x00\x53\x74\xd1" + struct.pack(">II", len(items) + 4,
                                                 2 * len(app)) + items
    return out + b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body


def _str32(s: str) -> bytes:
    b = s.encode()
    return b"\xb1" + struct.pack(">I", len(b)) + b


def publish(client: Client, stream: str, messages: Sequence[bytes], *,
            filter_values: Sequence[str | None] | None = None,
            batch: int = 500, publisher_id: int = 7,
            timeout: float = 60.0) -> None:
    """Publish encoded ``messages`` (see ``amqp_message``) in order; with
    ``filter_values`` (one per message) as Publish v2."""
    conn = client.pool.acquire(client.locate(stream, replica=False))
    confirmed = 0
    done = threading.Event()
    errors: list = []

    def on_confirm(frame) -> None:
        nonlocal confirmed
        cmd = P.decode(frame)
        if isinstance(cmd, P.PublishError):
            errors.extend(cmd.errors)
            done.set()
            return
        confirmed += len(cmd.publishing_ids)
        if confirmed >= len(messages):
            done.set()

    conn.on_frame(P.PublishConfirm.KEY, on_confirm)
    conn.on_frame(P.PublishError.KEY, on_confirm)
    try:
        conn.request(lambda c: P.DeclarePublisher(c, publisher_id, "", stream),
                     "declare publisher")
        for start in range(0, len(messages), batch):
            part = range(start, min(start + batch, len(messages)))
            if filter_values is None:
                cmd = P.Publish(publisher_id, tuple(
                    P.Message(i + 1, messages[i]) for i in part))
            else:
                cmd = P.Publish(publisher_id, tuple(
                    P.FilteredMessage(i + 1, filter_values[i], messages[i])
                    for i in part), version=2)
            conn.send(cmd)
        if messages and not done.wait(timeout):
            raise TimeoutError(f"{confirmed} of {len(messages)} confirmed")
        if errors:
            raise RuntimeError(f"publish errors: {errors[:5]}")
        conn.request(lambda c: P.DeletePublisher(c, publisher_id),
                     "delete publisher")
    finally:
        client.pool.release(conn)


def fill(uri: str, stream: str, count: int, body: bytes, *,
         batch: int = 2000) -> None:
    """Append ``count`` AMQP messages of ``body`` quickly (rbfly's batch
    publisher): for the large streams of the recovery and memory tests."""
    import asyncio

    import rbfly.streams as rbfly

    async def run() -> None:
        client = rbfly.streams_client(uri)
        async with client.publisher(stream, cls=rbfly.PublisherBatchFast) as p:
            for start in range(0, count, batch):
                for _ in range(min(batch, count - start)):
                    p.batch(body)
                await p.flush()
        await client.disconnect()

    asyncio.run(run())
