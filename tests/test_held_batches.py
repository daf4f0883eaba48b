"""Batches an application keeps read the same after the connection that
brought them is gone: the connections closed or the broker restarted
while they were held, the consumer's reader and its receive blocks
replaced, the records after the fault read on a new connection. Plain
and compressed sub-entries alike: every record once, in order, and every
body the one published."""

from __future__ import annotations

import gc
import time

import numpy as np
import pyarrow as pa
import pytest

import pystream

from .conftest import MODERN_URI, broker_ctl, run_broker

pytestmark = pytest.mark.broker

N = 40_000  # half before the fault, half after
SIZE = 48   # the record's offset (u64), then a pattern that follows from it
BATCH = 5_000


def bodies(lo: int, hi: int) -> pa.Array:
    seq = np.arange(lo, hi, dtype=np.uint64)
    rows = np.empty((hi - lo, SIZE // 8), np.uint64)
    rows[:, 0] = seq
    rows[:, 1:] = seq[:, None] * np.uint64(0x9E3779B97F4A7C15) + np.arange(
        1, SIZE // 8, dtype=np.uint64)
    offsets = np.arange(0, (hi - lo + 1) * SIZE, SIZE, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), hi - lo, [
        None, pa.py_buffer(offsets), pa.py_buffer(rows.astype("<u8").tobytes())])


def publish(stream: str, lo: int, hi: int, compression: str | None) -> None:
    """Records ``lo:hi``, as a named producer with their ids: a try the
    fault cut short is sent again and stores nothing twice (a restarted
    node refuses publishers for a moment)."""
    for _ in range(60):
        try:
            with pystream.connect(MODERN_URI) as client, \
                    client.producer(stream, name=f"held-{stream}", compression=compression,
                                    sub_batch_size=500) as producer:
                for a in range(lo, hi, BATCH):
                    producer.send_batch(bodies(a, a + BATCH), publishing_id=a + 1)
                producer.flush(timeout=30)
            return
        except pystream.StreamError:
            time.sleep(0.5)
    raise AssertionError(f"could not publish {lo}:{hi} to {stream} in 30 s")


def read(consumer: pystream.Consumer, upto: int, held: list[pa.RecordBatch]) -> None:
    """Keep every batch until ``upto`` records were handed."""
    rows = sum(b.num_rows for b in held)
    for batch in consumer.batches(timeout=60):
        held.append(batch)
        rows += batch.num_rows
        if rows >= upto:
            return
    raise AssertionError(f"{rows} records handed of {upto}")


@pytest.mark.parametrize("fault", ["close", pytest.param("restart", marks=pytest.mark.slow)])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_batches_held_across_a_fault_keep_their_records(stream_name, fault, compression):
    with pystream.connect(MODERN_URI) as admin:
        admin.create_stream(stream_name)
    held: list[pa.RecordBatch] = []
    try:
        publish(stream_name, 0, N // 2, compression)
        with pystream.connect(MODERN_URI) as client, \
                client.consumer(stream_name, offset="first", recovery_timeout=120,
                                max_batch_rows=2_000) as consumer:
            read(consumer, N // 2, held)
            first = consumer._subs[stream_name].connection
            if fault == "close":
                broker_ctl("modern", "close_all_connections", "test")
            else:
                run_broker("restart", "modern")
            publish(stream_name, N // 2, N, compression)
            read(consumer, N, held)
            more = consumer.read(1, timeout=1)
            assert consumer._subs[stream_name].connection is not first
            del first
    finally:
        with pystream.connect(MODERN_URI) as admin:
            admin.delete_stream(stream_name, missing_ok=True)
    assert more.num_rows == 0
    # The consumer, its connections and receive blocks are gone: what the
    # batches hold must not have been freed or written over since.
    gc.collect()
    churn = [bytearray(b"\xa5" * (1 << 20)) for _ in range(64)]
    del churn
    assert all(b.schema.field("body").type == pa.binary_view() for b in held)
    offsets = np.concatenate([b.column("offset").to_numpy() for b in held])
    assert len(offsets) == N
    assert (offsets == np.arange(N)).all()
    got = pa.concat_arrays([b.column("body").cast(pa.binary()) for b in held])
    assert got.equals(bodies(0, N))
