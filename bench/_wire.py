"""Raw-socket helpers for the consumer benchmark (``bench_consume.py``).

Nothing here uses pystream's connection or consumer: only the frame layouts
of ``pystream.protocol`` for the handshake. Three tools:

* ``WireClient``: a blocking socket, the handshake (PeerProperties, SASL
  PLAIN, Tune, Open) and request/response for a few commands.
* ``publish``: a fast raw publisher. It pre-encodes whole Publish frames of
  AMQP 1.0 messages (``00 53 75 b0 <u32 len> <body>``, one data section)
  with numpy, patches only the publishing ids per frame, and counts the
  broker's confirms in a second thread.
* ``read_wire``: the "wire limit" reader. It subscribes at offset first,
  ``recv_into`` a large reusable buffer, looks only at frame sizes and each
  chunk header's NumRecords (skipping the chunk bytes without copying them),
  and sends Credit 1 per chunk. No CRC, no decoding.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from pystream import protocol as P
from pystream.uri import parse_uri

SIZE_KEY = struct.Struct(">IHH")     # frame size, key, version
CHUNK_HEAD = struct.Struct(">BBHIq")  # magic, type, entries, records, timestamp
CHUNK_FIRST_OFFSET = struct.Struct(">Q")
I32 = struct.Struct(">i")

KEY_DELIVER = P.Deliver.KEY
KEY_CONFIRM = P.PublishConfirm.KEY
KEY_PUBLISH_ERROR = P.PublishError.KEY
KEY_HEARTBEAT = P.Heartbeat.KEY
KEY_CLOSE = P.Close.KEY
KEY_CREDIT_RESPONSE = P.CreditResponse.KEY
KEY_METADATA_UPDATE = P.MetadataUpdate.KEY


class WireError(RuntimeError):
    pass


class WireClient:
    """A blocking connection that speaks just enough of the protocol."""

    def __init__(self, uri: str, *, heartbeat: int = 0,
                 timeout: float = 10.0, buffer_size: int = 1 << 20) -> None:
        self.address = parse_uri(uri)
        if self.address.tls:
            raise WireError("the wire client does not do TLS")
        self.sock = socket.create_connection(
            (self.address.host, self.address.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(buffer_size)
        self.start = self.end = 0  # unread bytes are buf[start:end]
        self.corr = 0
        self.server_properties: dict[str, str] = {}
        self.frame_max = 0
        self._handshake(heartbeat)

    # --- blocking frame I/O (handshake and requests only) ---------------------

    def _fill(self, need: int) -> None:
        """Make buf[start:end] hold at least ``need`` bytes."""
        while self.end - self.start < need:
            if self.start + need > len(self.buf):
                if need > len(self.buf):
                    self.buf.extend(bytes(need - len(self.buf)))
                n = self.end - self.start
                self.buf[:n] = self.buf[self.start:self.end]
                self.start, self.end = 0, n
            got = self.sock.recv_into(memoryview(self.buf)[self.end:])
            if not got:
                raise WireError("the broker closed the socket")
            self.end += got

    def read_frame(self) -> bytes:
        """The next frame, without its size prefix."""
        self._fill(4)
        (size,) = struct.unpack_from(">I", self.buf, self.start)
        self._fill(4 + size)
        frame = bytes(self.buf[self.start + 4:self.start + 4 + size])
        self.start += 4 + size
        return frame

    def send(self, cmd: P.Command) -> None:
        self.sock.sendall(P.encode(cmd))

    def request(self, make) -> P.Command:
        self.corr += 1
        cmd = make(self.corr)
        self.send(cmd)
        want = cmd.KEY | P.RESPONSE_BIT
        while True:
            frame = self.read_frame()
            key = struct.unpack_from(">H", frame)[0]
            if key == want:
                answer = P.decode(frame)
                if answer.response_code != P.RESPONSE_OK:
                    raise WireError(f"{type(cmd).__name__}: response code "
                                    f"{answer.response_code:#x}")
                return answer
            if key == P.Tune.KEY:
                self._tune = P.decode(frame)
            elif key == KEY_CLOSE:
                raise WireError(f"broker closed: {P.decode(frame)}")
            # anything else (heartbeats, metadata updates) is ignored

    def _handshake(self, heartbeat: int) -> None:
        self._tune = None
        props = {"product": "pystream-bench-wire", "version": "0",
                 "platform": "Python"}
        peer = self.request(lambda c: P.PeerProperties(c, props))
        self.server_properties = dict(peer.properties)
        self.request(P.SaslHandshake)
        a = self.address
        data = b"\0" + a.username.encode() + b"\0" + a.password.encode()
        self.request(lambda c: P.SaslAuthenticate(c, "PLAIN", data))
        while self._tune is None:
            frame = self.read_frame()
            if struct.unpack_from(">H", frame)[0] == P.Tune.KEY:
                self._tune = P.decode(frame)
        self.frame_max = self._tune.frame_max
        self.send(P.TuneResponse(self.frame_max, heartbeat))
        self.request(lambda c: P.Open(c, a.virtual_host))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the stream's end -----------------------------------------------------------


def stream_end(uri: str, stream: str, timeout: float = 3.0) -> int:
    """The offset after the last record of ``stream`` (0 when it is empty):
    subscribe at "last", which delivers the last chunk, and read its header."""
    with WireClient(uri) as c:
        c.request(lambda corr: P.Subscribe(corr, 1, stream,
                                           P.OffsetSpec(P.OFFSET_LAST), 1))
        c.sock.settimeout(timeout)
        try:
            while True:
                frame = c.read_frame()
                key, version = struct.unpack_from(">HH", frame)
                if key != KEY_DELIVER:
                    continue
                head = 5 + (8 if version >= 2 else 0)
                magic, ctype, _, records, _ = CHUNK_HEAD.unpack_from(frame, head)
                (first,) = CHUNK_FIRST_OFFSET.unpack_from(frame, head + 24)
                return first + records
        except (socket.timeout, TimeoutError):
            return 0  # nothing delivered: an empty stream


# --- the raw publisher -----------------------------------------------------------


def amqp_data_message(body: bytes) -> bytes:
    """An AMQP 1.0 message of one data section (vbin32)."""
    return b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body


def publish(uri: str, stream: str, count: int, body: bytes, *,
            max_in_flight: int = 1 << 20, progress: bool = True) -> float:
    """Publish ``count`` copies of an AMQP message holding ``body``; wait for
    every confirm. Returns the seconds it took."""
    message = amqp_data_message(body)
    rec = 8 + 4 + len(message)                   # publishing id, size, bytes
    with WireClient(uri, buffer_size=4 << 20) as c:
        frame_max = c.frame_max or (1 << 20)
        per_frame = max(1, (frame_max - 13) // rec)
        c.request(lambda corr: P.DeclarePublisher(corr, 1, "", stream))

        confirmed = 0
        error: list[str] = []
        cond = threading.Condition()

        def confirms() -> None:
            nonlocal confirmed
            try:
                while True:
                    frame = c.read_frame()
                    key = struct.unpack_from(">H", frame)[0]
                    if key == KEY_CONFIRM:
                        (n,) = I32.unpack_from(frame, 5)
                        with cond:
                            confirmed += n
                            cond.notify_all()
                    elif key == KEY_PUBLISH_ERROR:
                        raise WireError(f"publish error: {P.decode(frame)}")
                    elif key == KEY_CLOSE:
                        raise WireError(f"broker closed: {P.decode(frame)}")
            except Exception as exc:  # noqa: BLE001 - reported to the sender
                with cond:
                    error.append(repr(exc))
                    cond.notify_all()

        frames: dict[int, tuple[bytearray, np.ndarray]] = {}

        def frame_for(n: int) -> tuple[bytearray, np.ndarray]:
            """A reusable Publish frame of ``n`` messages; the array views
            its publishing-id bytes."""
            if n not in frames:
                buf = bytearray(13 + n * rec)
                struct.pack_into(">IHHBi", buf, 0, len(buf) - 4, P.Publish.KEY,
                                 1, 1, n)
                rows = np.frombuffer(buf, np.uint8, offset=13).reshape(n, rec)
                rows[:, 8:12] = np.frombuffer(struct.pack(">I", len(message)),
                                              np.uint8)
                rows[:, 12:] = np.frombuffer(message, np.uint8)
                frames[n] = (buf, rows[:, :8])
            return frames[n]

        reader = threading.Thread(target=confirms, daemon=True)
        reader.start()
        t0 = time.perf_counter()
        sent, next_report = 0, time.monotonic() + 5
        while sent < count:
            n = min(per_frame, count - sent)
            buf, ids = frame_for(n)
            ids[:] = (np.arange(sent + 1, sent + 1 + n, dtype=">u8")
                      .view(np.uint8).reshape(n, 8))
            with cond:
                while sent - confirmed > max_in_flight and not error:
                    cond.wait(1.0)
                if error:
                    raise WireError(error[0])
            c.sock.sendall(buf)
            sent += n
            if progress and time.monotonic() > next_report:
                next_report += 5
                print(f"  ... {stream}: {sent:,} sent, {confirmed:,} confirmed",
                      flush=True)
        with cond:
            deadline = time.monotonic() + 300
            while confirmed < count and not error and time.monotonic() < deadline:
                cond.wait(1.0)
            if error:
                raise WireError(error[0])
            if confirmed < count:
                raise WireError(f"only {confirmed} of {count} confirmed")
        return time.perf_counter() - t0


# --- the wire-limit reader --------------------------------------------------------


@dataclass
class WireResult:
    records: int = 0         # records counted from chunk headers (all chunks read)
    chunks: int = 0
    chunk_bytes: int = 0     # DataLength total
    wire_bytes: int = 0      # Deliver frames, size prefix included
    seconds: float = 0.0
    cpu: float = 0.0         # this process's CPU seconds over the same time
    chunk_records: list[int] = field(default_factory=list)


def read_wire(uri: str, stream: str, end: int, *, credit: int = 32,
              buffer_size: int = 8 << 20) -> WireResult:
    """Read ``stream`` from offset first until offset ``end`` is reached."""
    out = WireResult()
    with WireClient(uri, buffer_size=buffer_size) as c:
        sock = c.sock
        sock.settimeout(None)
        credit_frame = P.encode(P.Credit(1, 1))
        c.corr += 1
        cpu0, t0 = time.process_time(), time.perf_counter()
        sock.sendall(P.encode(P.Subscribe(c.corr, 1, stream,
                                          P.OffsetSpec(P.OFFSET_FIRST), credit)))
        buf, mv = c.buf, memoryview(c.buf)
        size_buf = len(buf)
        start, stop = c.start, c.end   # bytes left over from the handshake
        skip = 0                       # bytes of the current frame still to drop
        next_offset = 0
        unpack_head = SIZE_KEY.unpack_from
        unpack_chunk = CHUNK_HEAD.unpack_from
        send = sock.send
        subscribed = False
        while next_offset < end:
            # consume what is buffered
            pos = start
            while True:
                if skip:
                    take = stop - pos
                    if take >= skip:
                        pos += skip
                        skip = 0
                    else:
                        skip -= take
                        pos = stop
                        break
                avail = stop - pos
                if avail < 8:
                    break
                size, key, version = unpack_head(buf, pos)
                if key == KEY_DELIVER:
                    head = pos + 9 + (8 if version >= 2 else 0)
                    if head + 48 > stop:
                        break
                    magic, ctype, _, records, _ = unpack_chunk(buf, head)
                    if magic != 0x50:
                        raise WireError(f"bad chunk magic {magic:#x}")
                    send(credit_frame)
                    if ctype == 0:
                        (first,) = CHUNK_FIRST_OFFSET.unpack_from(buf, head + 24)
                        (data_len,) = struct.unpack_from(">I", buf, head + 36)
                        out.records += records
                        out.chunks += 1
                        out.chunk_bytes += data_len
                        out.chunk_records.append(records)
                        next_offset = first + records
                    out.wire_bytes += 4 + size
                    skip = 4 + size
                    continue
                if avail < 4 + size:
                    break
                frame = bytes(buf[pos + 4:pos + 4 + size])
                pos += 4 + size
                if key == (P.Subscribe.KEY | P.RESPONSE_BIT):
                    answer = P.decode(frame)
                    if answer.response_code != P.RESPONSE_OK:
                        raise WireError(f"subscribe failed: {answer}")
                    subscribed = True
                elif key in (KEY_CLOSE, KEY_CREDIT_RESPONSE, KEY_METADATA_UPDATE):
                    raise WireError(f"broker sent {P.decode(frame)}")
            if next_offset >= end:
                break
            # make room: reset when empty, compact a short tail
            if pos == stop:
                start = stop = 0
            else:
                start = pos
                if size_buf - stop < (256 << 10):
                    n = stop - start
                    buf[:n] = buf[start:stop]
                    start, stop = 0, n
            got = sock.recv_into(mv[stop:])
            if not got:
                raise WireError("the broker closed the socket")
            stop += got
        out.seconds = time.perf_counter() - t0
        out.cpu = time.process_time() - cpu0
        if not subscribed and out.chunks == 0:
            raise WireError("no answer to subscribe")
    return out
