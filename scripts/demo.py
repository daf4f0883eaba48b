"""The main job, end to end, on the local modern broker (`make demo`):
connect, create a demo stream, and print what the broker says of itself and
of the stream."""

from __future__ import annotations

import os
import sys

import pystream

URI = os.environ.get("PYSTREAM_URI", "rabbitmq-stream://guest:guest@localhost:5552/")
STREAM = "pystream-demo"


def main() -> int:
    with pystream.connect(URI) as client:
        props = client.server_properties
        print(f"connected to {client.connection.address.uri()}: "
              f"{props.get('product')} {props.get('version')} "
              f"({props.get('platform')}, cluster {props.get('cluster_name')})")
        conn = client.connection
        print(f"negotiated frame_max={conn.frame_max} heartbeat={conn.heartbeat}s")
        client.create_stream(STREAM, exist_ok=True, max_length_bytes=1 << 30)
        info = client.metadata(STREAM)[STREAM]
        print(f"stream {STREAM!r}: leader {info.leader.host}:{info.leader.port}, "
              f"{len(info.replicas)} replicas")
        if client.supports("stream_stats"):
            stats = client.stream_stats(STREAM)
            print("stream stats: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
