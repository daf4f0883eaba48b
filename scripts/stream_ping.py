#!/usr/bin/env python3
"""Check that a RabbitMQ Stream port speaks the protocol.

Usage: stream_ping.py HOST PORT [--timeout SECONDS]

Sends a PeerProperties request (key 0x0011, version 1) and expects the
PeerProperties response (key 0x8011, response code 1). Prints the broker's
"product version" (e.g. "RabbitMQ 4.0.5") and exits 0; exits 1 otherwise.
Standard library only: scripts/broker runs it before any venv exists.
"""

import argparse
import socket
import struct
import sys

PEER_PROPERTIES = 0x0011
RESPONSE_FLAG = 0x8000
RESPONSE_OK = 1
CORRELATION_ID = 1
MAX_FRAME = 1 << 20  # a PeerProperties answer is tiny; refuse anything absurd


def encode_string(text):
    data = text.encode("utf-8")
    return struct.pack(">h", len(data)) + data


def peer_properties_request(properties):
    body = struct.pack(">HHI", PEER_PROPERTIES, 1, CORRELATION_ID)
    body += struct.pack(">i", len(properties))
    for key, value in properties.items():
        body += encode_string(key) + encode_string(value)
    return struct.pack(">I", len(body)) + body


def read_exact(sock, count):
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("connection closed by the server")
        data += chunk
    return data


def read_string(frame, offset):
    (length,) = struct.unpack_from(">h", frame, offset)
    offset += 2
    if length < 0:  # protocol's null string
        return "", offset
    return frame[offset:offset + length].decode("utf-8", "replace"), offset + length


def parse_response(frame):
    key, _version, correlation, code = struct.unpack_from(">HHIH", frame, 0)
    if key != PEER_PROPERTIES | RESPONSE_FLAG:
        raise ValueError(f"unexpected frame key 0x{key:04x}")
    if correlation != CORRELATION_ID:
        raise ValueError(f"unexpected correlation id {correlation}")
    if code != RESPONSE_OK:
        raise ValueError(f"response code {code}")
    (count,) = struct.unpack_from(">i", frame, 10)
    offset, properties = 14, {}
    for _ in range(count):
        key, offset = read_string(frame, offset)
        properties[key], offset = read_string(frame, offset)
    return properties


def ping(host, port, timeout):
    request = peer_properties_request({"product": "pystream stream_ping"})
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(request)
        (size,) = struct.unpack(">I", read_exact(sock, 4))
        if not 14 <= size <= MAX_FRAME:
            raise ValueError(f"implausible frame size {size}")
        return parse_response(read_exact(sock, size))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    try:
        properties = ping(args.host, args.port, args.timeout)
    except (OSError, ValueError, struct.error) as error:
        print(f"stream_ping: {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    print(properties.get("product", "?"), properties.get("version", "?"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
