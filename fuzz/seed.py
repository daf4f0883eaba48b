"""Write the fuzz seed corpus: each golden Deliver frame and AMQP 1.0
message, prefixed with the harness's mode byte (see decode.c); with
--frames, the Deliver frames alone, as a peer sends them, and a broker's
answers to a handshake (dispatch.py).

    seed.py GOLDEN_DIR OUT_DIR [--frames]"""

import hashlib
import struct
import sys
from pathlib import Path

golden, out = Path(sys.argv[1]), Path(sys.argv[2])
frames_only = "--frames" in sys.argv[3:]
if not any(golden.glob("deliver/*/frames.bin")):
    sys.exit(f"seed.py: no golden Deliver captures under {golden}")


def put(data: bytes) -> None:
    (out / hashlib.sha1(data).hexdigest()).write_bytes(data)


for frames in sorted(golden.glob("deliver/*/frames.bin")):
    wire, pos = frames.read_bytes(), 0
    while pos < len(wire):
        (n,) = struct.unpack_from(">I", wire, pos)
        frame = wire[pos:pos + 4 + n]
        pos += 4 + n
        if frames_only:
            put(frame)
            continue
        for mode in (0x01, 0x21 | 0x10, 0x25, 0x00 | 0x40):
            put(bytes([mode]) + frame)
for msg in [] if frames_only else sorted(golden.glob("amqp10/*.bin")):
    for mode in (0xA0, 0xB4):
        put(bytes([mode]) + msg.read_bytes())



def command(key: int, *fields: bytes) -> bytes:
    body = struct.pack(">HH", key, 1) + b"".join(fields)
    return struct.pack(">I", len(body)) + body


def text(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def string_map(d: dict) -> bytes:
    return struct.pack(">i", len(d)) + b"".join(text(k) + text(v) for k, v in d.items())


# The answers to a handshake, in the order the client asks (the correlation
# ids are the harness's to set): peer properties, SASL mechanisms, Tune,
# authentication, Open, and from 3.11 on the command versions.
OK = struct.pack(">IH", 0, 1)
for version in ("3.10.7", "4.0.5") if frames_only else ():
    answers = [command(0x8011, OK, string_map({"product": "RabbitMQ", "version": version})),
               command(0x8012, OK, struct.pack(">i", 2), text("AMQPLAIN"), text("PLAIN")),
               command(0x0014, struct.pack(">II", 1048576, 60)),
               command(0x8013, OK),
               command(0x8015, OK, string_map({"advertised_host": "fuzz"}))]
    if version >= "3.11":
        answers.append(command(0x801B, OK, struct.pack(">i", 2),
                               struct.pack(">HHH", 2, 1, 2), struct.pack(">HHH", 8, 1, 2)))
    put(b"".join(answers))
