"""Other clients publishing into a stream, for the consumer's interop tests.

Each function publishes its messages in order, waits until the broker has
confirmed every one of them, and returns. They take the stream URI the tests
use (``rabbitmq-stream://user:pass@host:port/vhost``) and speak each client's
own API:

- ``publish_rbfly``: rbfly (asyncio) ``PublisherBatchFast``, AMQP 1.0 encoded
  by rbfly (application properties and body only: rbfly 0.10 writes no
  header, properties or annotations), or ``PublisherBinBatch`` for raw
  entries.
- ``publish_rstream``: rstream's ``Producer``: single messages (``send``,
  batched by rstream up to the frame size) and sub-entries (``send_sub_entry``,
  codec none or gzip), in the order given.
- ``publish_amqp091``: pika over AMQP 0-9-1 into the default exchange with
  the stream's name as routing key, with publisher confirms.
- ``publish``: raw Publish frames (``amqp_message`` bodies, optional filter
  values) over a pystream ``Connection``, independent of pystream's
  producer so that consumer tests do not rest on it.
- ``fill``: many identical messages fast (rbfly), for the large streams of
  the recovery and memory tests and the demo.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from pystream import protocol as P
from pystream.client import Client
from pystream.uri import parse_uri

from .brokers import LATEST, LEGACY, MODERN

# Stream port -> AMQP 0-9-1 port of the test brokers (scripts/brokers.tsv).
AMQP091_PORTS = {MODERN.stream: MODERN.amqp, LEGACY.stream: LEGACY.amqp,
                 LATEST.stream: LATEST.amqp}


def amqp091_url(stream_uri: str) -> str:
    """The AMQP 0-9-1 URL of the broker behind a stream URI:
    ``PYSTREAM_TEST_AMQP091_URI`` (modern) / ``PYSTREAM_TEST_LEGACY_AMQP091_URI``
    (legacy) / ``PYSTREAM_TEST_LATEST_AMQP091_URI`` (latest) when set, else
    the same host and credentials on the AMQP port that ``scripts/broker``
    gives the broker (scripts/brokers.tsv)."""
    address = parse_uri(stream_uri)
    env = {MODERN.stream: "PYSTREAM_TEST_AMQP091_URI",
           LEGACY.stream: "PYSTREAM_TEST_LEGACY_AMQP091_URI",
           LATEST.stream: "PYSTREAM_TEST_LATEST_AMQP091_URI"}.get(address.port)
    if env and os.environ.get(env):
        return os.environ[env]
    port = AMQP091_PORTS.get(address.port, MODERN.amqp)
    q = urllib.parse.quote
    return (f"amqp://{q(address.username, safe='')}:{q(address.password, safe='')}"
            f"@{address.host}:{port}/{q(address.virtual_host, safe='')}")


def _run(coro) -> Any:
    """Run a coroutine on a fresh event loop (the tests are synchronous)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, 120))
    finally:
        asyncio.set_event_loop(None)
        loop.close()


# Publishers write as fast as the broker confirms; the broker's writer puts
# whatever is pending into one chunk. The helpers wait for the confirms every
# ``burst_bytes`` (default 512 KiB) so that a test stream holds many chunks;
# test_consumer_interop.test_chunk_larger_than_frame_max lifts that to get a
# chunk past frame_max.
BURST_BYTES = 512 << 10


def publish_rbfly(uri: str, stream: str, messages: Sequence[Any], *,
                  raw: bool = False, burst_bytes: int = BURST_BYTES) -> None:
    """Publish ``messages`` with rbfly: each an ``AMQPBody`` (bytes: a data
    section; str, Symbol, numbers, lists, dicts...: an amqp-value) or a
    ``MessageCtx`` (for application properties). ``raw=True`` sends bytes
    as they are (``PublisherBinBatch``, no AMQP). Flushes (and so waits for
    the broker's confirms) every ``burst_bytes`` of encoded messages."""
    import rbfly.streams as rbs
    from rbfly.amqp import MessageCtx, encode_amqp
    from rbfly.streams._client import PublisherBinBatch

    cls = PublisherBinBatch if raw else rbs.PublisherBatchFast
    scratch = bytearray(4 << 20)

    def size(m: Any) -> int:
        if raw:
            return len(m)
        if type(m) is not MessageCtx:
            m = MessageCtx(m, None, None, None, None, None, None)
        return encode_amqp(scratch, m)

    async def go() -> None:
        client = rbs.streams_client(uri)
        try:
            async with client.publisher(stream, cls=cls,
                                        name=f"interop-{stream}") as publisher:
                pending = 0
                for m in messages:
                    n = size(m) + 12
                    if pending and pending + n > burst_bytes:
                        await publisher.flush()
                        pending = 0
                    publisher.batch(m)
                    pending += n
                await publisher.flush()
        finally:
            await client.disconnect()

    _run(go())


# --- rstream ----------------------------------------------------------------

def publish_rstream(uri: str, stream: str,
                    segments: Iterable[tuple[str, Sequence[Any]]], *,
                    burst_bytes: int = BURST_BYTES, timeout: float = 60) -> None:
    """Publish with rstream's ``Producer``. ``segments`` is a sequence of
    ``(kind, messages)``: kind ``"send"`` publishes each message on its own
    (``Producer.send``: rstream buffers them and writes Publish frames of up
    to frame_max), ``"sub-none"`` / ``"sub-gzip"`` publishes the messages as
    one sub-entry with that codec (``send_sub_entry``). Messages are
    ``rstream.AMQPMessage`` or bytes. rstream queues both kinds in one
    buffer and writes it in order, so the stream holds the messages in the
    order given. Waits for the confirms every ``burst_bytes``, and returns
    once every message is confirmed."""
    from rstream import CompressionType, Producer

    address = parse_uri(uri)
    codecs = {"sub-none": CompressionType.No, "sub-gzip": CompressionType.Gzip}
    items: list[tuple[str, Any, int]] = []     # (kind, message(s), bytes)
    for kind, messages in segments:
        if kind == "send":
            items.extend(("send", m, len(bytes(m)) + 12) for m in messages)
        elif messages:
            items.append((kind, list(messages),
                          sum(len(bytes(m)) + 4 for m in messages) + 20))

    async def go() -> None:
        confirmed = failed = 0
        changed = asyncio.Event()

        def on_confirm(status) -> None:
            nonlocal confirmed, failed
            confirmed += 1
            failed += not status.is_confirmed
            changed.set()

        async def wait_for(count: int) -> None:
            async def loop() -> None:
                while confirmed < count:
                    changed.clear()
                    await changed.wait()
            await asyncio.wait_for(loop(), timeout)
            if failed:
                raise AssertionError(f"rstream: {failed} messages not confirmed")

        producer = Producer(address.host, address.port,
                            username=address.username, password=address.password,
                            vhost=address.virtual_host)
        await producer.start()
        try:
            sent = pending = 0
            for kind, entry, n in items:
                if pending and pending + n > burst_bytes:
                    await wait_for(sent)
                    pending = 0
                if kind == "send":
                    await producer.send(stream, entry, on_publish_confirm=on_confirm)
                else:
                    await producer.send_sub_entry(stream, entry,
                                                  compression_type=codecs[kind],
                                                  on_publish_confirm=on_confirm)
                sent += 1
                pending += n
            await wait_for(sent)
        finally:
            await producer.close()

    _run(go())


# --- reading back (what pystream's producer wrote) --------------------------

def read_rbfly(uri: str, stream: str, count: int) -> list[Any]:
    """The first ``count`` messages of ``stream`` as rbfly's ``MessageCtx``
    (rbfly 0.10 reads simple entries only, not sub-batches)."""
    import rbfly.streams as rbs

    async def go() -> list[Any]:
        client = rbs.streams_client(uri)
        out: list[Any] = []
        try:
            async for _ in client.subscribe(stream, offset=rbs.Offset.FIRST):
                out.append(rbs.get_message_ctx())
                if len(out) == count:
                    break
        finally:
            await client.disconnect()
        return out

    return _run(go())


def read_rstream(uri: str, stream: str, count: int, timeout: float = 60) -> list[Any]:
    """The first ``count`` messages of ``stream`` as rstream's
    ``AMQPMessage`` (its decoder, every codec it has)."""
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    address = parse_uri(uri)

    async def go() -> list[Any]:
        out: list[Any] = []
        done = asyncio.Event()

        def on_message(message: Any, context: Any) -> None:
            out.append(message)
            if len(out) >= count:
                done.set()

        consumer = Consumer(address.host, address.port, username=address.username,
                            password=address.password, vhost=address.virtual_host)
        await consumer.start()
        await consumer.subscribe(
            stream, on_message, decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        task = asyncio.create_task(consumer.run())
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            await consumer.close()
            task.cancel()
        return out[:count]

    return _run(go())


# --- AMQP 0-9-1 (pika) ------------------------------------------------------

def declare_stream_amqp091(url: str, stream: str) -> None:
    """Declare ``stream`` as an AMQP 0-9-1 queue of type stream."""
    import pika

    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.queue_declare(stream, durable=True,
                              arguments={"x-queue-type": "stream"})


def publish_amqp091(url: str, stream: str,
                    messages: Sequence[tuple[bytes, Any]]) -> None:
    """Publish ``(body, pika.BasicProperties)`` pairs through the default
    exchange with ``routing_key=stream``, on a channel in confirm mode
    (``basic_publish`` returns once the broker confirmed; an unroutable
    message raises, ``mandatory=True``)."""
    import pika

    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for body, properties in messages:
            channel.basic_publish(exchange="", routing_key=stream, body=body,
                                  properties=properties, mandatory=True)


# --- raw frames over a pystream connection --------------------------------------

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
