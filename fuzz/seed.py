"""Write the fuzz seed corpus: each golden Deliver frame and AMQP 1.0
message, prefixed with the harness's mode byte (see decode.c); with
--frames, the Deliver frames alone, as a peer sends them (dispatch.py).

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
