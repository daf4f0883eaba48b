"""The main job, end to end, on the local modern broker (`make demo`):
connect, write a demo stream of a million messages, read it all back with
pystream's consumer and print a summary.

Until pystream has its own producer, the data goes in through the test
suite's publisher (rbfly's batch publisher, a test dependency)."""

from __future__ import annotations

import os
import pathlib
import sys
import time

import pystream

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from tests.publishers import fill  # noqa: E402

URI = os.environ.get("PYSTREAM_URI", "rabbitmq-stream://guest:guest@localhost:5552/")
STREAM = "pystream-demo"
COUNT = 1_000_000


def main() -> int:
    with pystream.connect(URI) as client:
        props = client.server_properties
        print(f"connected to {client.connection.address.uri()}: "
              f"{props.get('product')} {props.get('version')}")
        client.delete_stream(STREAM, missing_ok=True)
        client.create_stream(STREAM, max_length_bytes=1 << 30)
        started = time.perf_counter()
        fill(URI, STREAM, COUNT, b"hello from the pystream demo " * 3)
        print(f"published {COUNT:,} messages in {time.perf_counter() - started:.1f} s")

        started = time.perf_counter()
        rows = 0
        with client.consumer(STREAM, offset="first") as consumer:
            for batch in consumer:
                rows += batch.num_rows
                if consumer.position >= COUNT:
                    break
            elapsed = time.perf_counter() - started
            print(f"read {rows:,} records (offsets 0..{consumer.position - 1}) in "
                  f"{elapsed:.2f} s: {rows / elapsed / 1e6:.2f} M msg/s")
            print(f"schema: {', '.join(consumer.schema.names)}; lag now "
                  f"{consumer.lag()}")
    return 0 if rows == COUNT else 1


if __name__ == "__main__":
    sys.exit(main())
