"""The main job, end to end, on the local modern broker (`make demo`):
connect, write a demo stream of a million messages with pystream's producer,
read it all back with its consumer and print a summary."""

from __future__ import annotations

import os
import sys
import time

import pyarrow as pa

import pystream

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
        bodies = pa.array([b"hello from the pystream demo %07d " % i
                           for i in range(COUNT)], pa.binary())
        started = time.perf_counter()
        with client.producer(STREAM) as producer:
            for start in range(0, COUNT, 50_000):
                producer.send_batch(bodies.slice(start, 50_000))
            producer.flush(120)
        elapsed = time.perf_counter() - started
        print(f"published {COUNT:,} messages with confirms in {elapsed:.2f} s: "
              f"{COUNT / elapsed / 1e6:.2f} M msg/s")

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
