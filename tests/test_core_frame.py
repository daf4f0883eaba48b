"""FrameReader and crc32 of pystream._core."""

import os
import struct
import zlib

import pytest

from pystream._core import FrameReader, crc32
from pystream.errors import FrameTooLarge, ProtocolError, TruncatedFrame

from .golden import DELIVER_CAPTURES, deliver_frames


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def drain(reader):
    out = []
    while (f := reader.next_frame()) is not None:
        out.append(f)
    return out


def test_crc32_matches_zlib():
    data = os.urandom(1 << 20)
    for n in (0, 1, 3, 15, 16, 63, 64, 100, 1000, 4096, 65537, len(data)):
        assert crc32(data[:n]) == zlib.crc32(data[:n])
        assert crc32(memoryview(data)[:n], 12345) == zlib.crc32(data[:n], 12345)
    assert crc32(bytearray(b"123456789")) == 0xCBF43926


def test_crc32_continues():
    data = os.urandom(10000)
    assert crc32(data[5000:], crc32(data[:5000])) == zlib.crc32(data)


def test_frames_split_byte_by_byte():
    frames = [b"\x00\x08\x00\x01" + os.urandom(n) for n in (0, 1, 100, 70000)]
    wire = b"".join(frame(f) for f in frames)
    r = FrameReader()
    got = []
    for i in range(len(wire)):
        r.feed(wire[i:i + 1])
        got += drain(r)
    assert got == frames
    assert r.buffered() == 0


def test_writable_commit_like_recv_into():
    frames = [b"\x00\x0a\x00\x01" + os.urandom(n) for n in range(0, 300000, 7919)]
    wire = b"".join(frame(f) for f in frames)
    r = FrameReader(max_frame_size=0)
    got, pos = [], 0
    step = 1
    while pos < len(wire):
        view = r.writable(1024)
        assert len(view) >= 1024
        n = min(len(view), step, len(wire) - pos)
        view[:n] = wire[pos:pos + n]
        r.commit(n)
        pos += n
        step = step * 3 % 100003 + 1
        got += drain(r)
    assert got == frames


def test_writable_grows_for_a_large_pending_frame():
    big = b"\x00\x08\x00\x02" + os.urandom(5 << 20)
    r = FrameReader(max_frame_size=0)
    r.feed(frame(big)[:10])
    assert len(r.writable(1)) >= len(big) - 6
    r.feed(frame(big)[10:])
    assert r.next_frame() == big


def test_writable_ends_where_the_pending_frame_ends():
    # A read must not run into the next frame: if that frame then needs a
    # new block, what was read of it gets copied.
    big = frame(b"\x00\x08\x00\x02" + os.urandom(300000))
    r = FrameReader(max_frame_size=0)
    r.feed(big[:10])
    assert len(r.writable(1024)) == len(big) - 10
    r.feed(big[10:])
    assert len(r.writable(1024)) == 1024  # the frame is whole: min_size
    assert r.next_frame() == big[4:]


def test_unfinished_counts_what_a_begun_frame_lacks():
    # What Connection waits for in one blocking read (MSG_WAITALL).
    r = FrameReader()
    assert r.unfinished == 0                # nothing begun: nothing owed
    r.feed(b"\x00\x00")
    assert r.unfinished == 2                # the rest of the size
    r.feed(b"\x00\x05\x00\x08")
    assert r.unfinished == 3
    r.feed(b"\x00\x01\x07\x00")
    assert r.next_frame() == b"\x00\x08\x00\x01\x07"
    assert r.unfinished == 3                # the next frame's size begun
    r.feed(b"\x00\x00\x04\x00\x08\x00\x01")
    assert r.next_frame() == b"\x00\x08\x00\x01"
    assert r.unfinished == 0


def test_buffered_and_incomplete():
    r = FrameReader()
    r.feed(b"\x00\x00\x00\x05\x00\x08")
    assert r.next_frame() is None
    assert r.buffered() == 6
    r.feed(b"\x00\x01\x07")
    assert r.next_frame() == b"\x00\x08\x00\x01\x07"
    assert r.buffered() == 0


def test_commit_beyond_writable_is_refused():
    r = FrameReader()
    n = len(r.writable())
    with pytest.raises(ValueError):
        r.commit(n + 1)


def test_frame_too_large_has_position():
    r = FrameReader(max_frame_size=100)
    r.feed(frame(b"\x00\x08\x00\x01" + b"x" * 96))
    r.feed(struct.pack(">I", 101) + b"\x00" * 101)
    assert len(r.next_frame()) == 100
    with pytest.raises(FrameTooLarge) as e:
        r.next_frame()
    assert e.value.position == 104
    assert isinstance(e.value, ProtocolError)
    r.max_frame_size = 0
    assert len(r.next_frame()) == 101


def test_deliver_frames_may_pass_frame_max_up_to_max_deliver_size():
    """Brokers send a chunk whole in one Deliver, whatever frame_max says."""
    r = FrameReader(max_frame_size=100)
    r.max_deliver_size = 1000
    deliver = b"\x00\x08\x00\x01" + b"d" * 496
    r.feed(struct.pack(">I", len(deliver)))
    assert r.next_frame() is None          # the key decides: wait for it
    r.feed(deliver[:2])
    assert r.next_frame() is None
    r.feed(deliver[2:])
    assert r.next_frame() == deliver
    r.feed(frame(b"\x00\x08\x00\x01" + b"d" * 997))  # 1001 bytes
    with pytest.raises(FrameTooLarge):
        r.next_frame()
    other = FrameReader(max_frame_size=100)
    other.max_deliver_size = 1000
    other.feed(frame(b"\x00\x0f\x00\x01" + b"m" * 200))  # not a Deliver
    with pytest.raises(FrameTooLarge):
        other.next_frame()


def test_truncated_frame():
    r = FrameReader()
    r.feed(b"\x00\x00\x00\x03abc")
    with pytest.raises(TruncatedFrame) as e:
        r.next_frame()
    assert e.value.position == 0


def test_max_frame_size_range():
    r = FrameReader()
    with pytest.raises(ValueError):
        r.max_frame_size = -1
    r.max_frame_size = 0xFFFFFFFF
    assert r.max_frame_size == 0xFFFFFFFF


@pytest.mark.parametrize("capture", DELIVER_CAPTURES)
def test_golden_frames_split(capture):
    wire = deliver_frames(capture)
    r = FrameReader()
    r.feed(wire)
    frames = drain(r)
    assert sum(len(f) + 4 for f in frames) == len(wire)
    assert all(f[:2] == b"\x00\x08" for f in frames)


# --- recv_rest: the rest of a begun frame, read from a socket -----------------


def _sender(sock, data: bytes, piece: int, then_close: bool = False):
    """Send ``data`` from a thread in pieces, a pause between them."""
    import threading
    import time

    def run():
        for i in range(0, len(data), piece):
            sock.sendall(data[i:i + piece])
            time.sleep(0.001)
        if then_close:
            sock.close()
    t = threading.Thread(target=run)
    t.start()
    return t


def test_recv_rest_reads_the_frame_begun_and_nothing_past_it():
    import socket
    big = frame(b"\x00\x08\x00\x02" + os.urandom(3 << 20))
    after = frame(b"\x00\x08\x00\x01next")
    a, b = socket.socketpair()
    with a, b:
        r = FrameReader(max_frame_size=0)
        r.feed(big[:3])                    # not even the size whole
        t = _sender(b, big[3:] + after, 100_003)
        assert r.recv_rest(a.fileno(), 65536) is True
        t.join()
        assert r.unfinished == 0
        assert r.buffered() == len(big)    # the next frame is still in the socket
        assert r.next_frame() == big[4:]
        assert a.recv(100) == after


def test_recv_rest_says_when_the_peer_closed_amid_the_frame():
    import socket
    big = frame(b"\x00\x08\x00\x02" + os.urandom(1 << 20))
    a, b = socket.socketpair()
    with a:
        r = FrameReader(max_frame_size=0)
        r.feed(big[:10])
        t = _sender(b, big[10:500_000], 65536, then_close=True)
        assert r.recv_rest(a.fileno()) is False
        t.join()
        assert r.buffered() == 500_000     # what came is kept
        assert r.next_frame() is None


def test_recv_rest_reads_nothing_for_a_refused_frame():
    import socket
    a, b = socket.socketpair()
    with a, b:
        r = FrameReader(max_frame_size=1000)
        r.feed(struct.pack(">I", 1 << 30) + b"\x00\x08")
        b.sendall(b"x" * 100)
        assert r.recv_rest(a.fileno()) is True   # nothing owed: next_frame says why
        with pytest.raises(FrameTooLarge):
            r.next_frame()
        assert a.recv(200) == b"x" * 100


def test_recv_rest_runs_signal_handlers_and_keeps_what_it_read():
    """A handler that returns lets the read go on (EINTR); one that raises
    ends it with what was read committed, as ``recv_into`` would."""
    import signal
    import socket
    big = frame(b"\x00\x08\x00\x02" + os.urandom(1 << 20))
    calls = []

    def quiet(signum, frame):
        calls.append(signum)

    class Stop(Exception):
        pass

    def loud(signum, frame):
        raise Stop

    old = signal.getsignal(signal.SIGALRM)
    a, b = socket.socketpair()
    try:
        with a, b:
            r = FrameReader(max_frame_size=0)
            r.feed(big[:10])
            signal.signal(signal.SIGALRM, quiet)
            signal.setitimer(signal.ITIMER_REAL, 0.02)
            t = _sender(b, big[10:], 20_000)  # 1 ms pauses: the alarm lands amid them
            assert r.recv_rest(a.fileno(), 1 << 20) is True
            t.join()
            assert calls == [signal.SIGALRM]
            assert r.next_frame() == big[4:]
            # nothing more comes: the raising handler ends the wait
            r.feed(big[:10])
            b.sendall(big[10:1000])
            signal.signal(signal.SIGALRM, loud)
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(Stop):
                r.recv_rest(a.fileno(), 1 << 20)
            assert r.buffered() == 1000
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_recv_rest_raises_the_sockets_error():
    import socket
    a, b = socket.socketpair()
    r = FrameReader()
    r.feed(b"\x00\x00\x00\x10\x00\x08")
    fd = a.detach()
    os.close(fd)
    b.close()
    with pytest.raises(OSError):
        r.recv_rest(fd)


def test_last_arrival_moves_with_each_read_of_a_frame():
    """The connection's heartbeat watch asks the reader when bytes last
    came: a frame that takes long to arrive keeps it fresh read by read."""
    import socket
    import threading
    import time
    big = frame(b"\x00\x08\x00\x02" + os.urandom(300_000))
    r = FrameReader(max_frame_size=0)
    assert abs(r.last_arrival - time.monotonic()) < 1
    r.feed(big[:10])
    seen = []
    a, b = socket.socketpair()
    with a, b:
        def send():
            for i in range(10, len(big), 100_000):
                time.sleep(0.05)
                seen.append(r.last_arrival)
                b.sendall(big[i:i + 100_000])
        t = threading.Thread(target=send)
        t.start()
        assert r.recv_rest(a.fileno(), 100_000) is True
        t.join()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert time.monotonic() - r.last_arrival < 0.05
