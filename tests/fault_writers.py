"""The fault matrix's writing cells (tests/faults.py): a named
``Producer``, a ``SuperStreamProducer`` and the Spark sink's task in this
process, and in child processes, killed or sent SIGINT (their side:
tests/fault_children.py, which sends with ``publish_from`` and ``route``
and writes with the sink's options as these cells do)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import pystream

from .fault_run import (
    AFTER_FAULT,
    BATCH,
    MIDWAY_WAIT,
    OVERLAP,
    PARTITIONS,
    PASSWORD,
    PAUSE,
    SECOND_HALF,
    SENTINEL,
    URI_NO_PASSWORD,
    USER,
    AppError,
    N,
    Run,
    describe,
    pairs,
    reap,
    spawn,
    wait_for,
)
from .soak import as_binary, bodies, bodies_of, rows_of

# --- reading back what was written --------------------------------------------------


def read_back(run: Run, client: pystream.Client, super_stream: str | None = None) -> None:
    """After a writer cell: a sentinel after its records, and everything up
    to it read into the run's checker (per partition for a super stream)."""
    streams = client.partitions(super_stream) if super_stream else run.streams
    for s in streams:
        with client.producer(s) as p:
            p.send_batch(as_binary(bodies_of(np.array([SENTINEL])))).result(AFTER_FAULT)
    run.sentinels_wanted = len(streams)
    deadline = time.monotonic() + 60
    with client.consumer(None if super_stream else streams[0], offset="first",
                         super_stream=super_stream) as consumer:
        while len(run.sentinels) < len(streams) and time.monotonic() < deadline:
            for batch in consumer.batches(timeout=0.5):
                key = (batch.schema.metadata or {}).get(b"stream", b"").decode()
                run.take(batch.column("body"), None if super_stream else
                         batch.column("offset").to_numpy(), key)
                if len(run.sentinels) >= len(streams):
                    break


# --- the writing cells (in this process) --------------------------------------------


def cell_producer(run: Run) -> None:
    with run.connect() as client:
        stream = run.stream(client)
        confirmed = np.zeros(N, bool)
        seq = 0
        while seq < N and not run.late():
            try:
                with client.producer(stream, name=run.tag) as producer:
                    # Resuming: some records again, which the broker drops.
                    last = producer.last_publishing_id
                    seq = max(0, last - OVERLAP) if last else 0
                    seq = publish_from(producer, seq, marker(confirmed), ids=True, run=run)
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (producer closed, opened again)")
        finish_writer(run, client, confirmed)


def publish_from(producer: Any, seq: int, confirmed: Callable[[int, int], Any], *,
                 ids: bool, run: Run | None = None) -> int:
    """Send ``seq``..N-1 (with publishing ids ``seq + 1``.. if ``ids``),
    ``confirmed(first, count)`` as confirms come, then wait for them all;
    returns N. A cell's (``run``) paces itself and fails half-way under the
    exception fault; a child's sends a batch every 10 ms. A cell's events
    name the first batches that failed, and how."""
    failed = itertools.count(1)

    def done(future: Any, first: int, n: int) -> None:
        exc = future.exception()
        if exc is None:
            confirmed(first, n)
        elif run is not None and next(failed) <= 3:
            run.cell.events.append(f"batch from {first} failed: {type(exc).__name__}: {exc}")

    if run is not None and seq:
        run.cell.events.append(f"publishing again from {seq}")
    while seq < N:
        if run is not None and run.strikes(seq >= N // 2):
            raise AppError("the application failed")
        n = min(BATCH, N - seq)
        batch = as_binary(bodies(seq, n))
        future = (producer.send_batch(batch, publishing_id=seq + 1) if ids
                  else producer.send_batch(batch))
        future.add_done_callback(functools.partial(done, first=seq, n=n))
        seq += n
        if run is not None:
            pace(run, seq)
        else:
            time.sleep(0.01)
    producer.flush(timeout=AFTER_FAULT)
    return seq


def marker(confirmed: np.ndarray) -> Callable[[int, int], None]:
    def mark(first: int, n: int) -> None:
        confirmed[first:first + n] = True
    return mark


def pace(run: Run, seq: int) -> None:
    """Writers: half at once, the fault, the rest over SECOND_HALF seconds."""
    if seq >= N // 2:
        run.midway()
        time.sleep(SECOND_HALF / (N / 2 / BATCH))


def finish_writer(run: Run, client: pystream.Client, confirmed: np.ndarray,
                  super_stream: str | None = None) -> None:
    run.expected = confirmed
    if not confirmed.all():
        run.verdict_hint = run.verdict_hint or f"{int((~confirmed).sum())} records never confirmed"
    run.checker(contiguous=super_stream is None)
    read_back(run, client, super_stream)


def cell_super_producer(run: Run) -> None:
    with run.connect() as client:
        run.super_stream(client)
        confirmed = np.zeros(N, bool)
        while not confirmed.all() and not run.late():
            try:
                with client.producer(super_stream=run.tag, route=route,
                                     name=run.tag) as producer:
                    # From the first record not confirmed: after a close
                    # (which flushed) nothing is sent twice.
                    publish_from(producer, int(np.argmin(confirmed)), marker(confirmed),
                                 ids=False, run=run)
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (producer closed, opened again)")
        finish_writer(run, client, confirmed, super_stream=run.tag)


def route(batch: pa.RecordBatch) -> np.ndarray:
    """Partition ``seq % PARTITIONS`` of each body."""
    seqs = rows_of(batch.column("body"))[:, :8].copy().view(np.uint64).ravel()
    return (seqs % PARTITIONS).astype(np.int64)


def sink_config(stream: str, codec: str, producer_name: str,
                client_options: dict[str, Any]) -> Any:
    """The sink's options as a Spark job would give them, parsed as it does.
    The task's client (``ranges.client_for``: one per broker in a Spark
    Python worker) is made first, with the cells' heartbeat, so that the
    pause outlasts it as it does the other cells'. A cell's own (its own
    ``passwordEnv``, unused beside the file): one Python worker per task."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from pystream import ranges
    from pystream.spark.options import broker_ref, normalize
    from pystream.spark.sink import SinkConfig

    options = {"uri": URI_NO_PASSWORD, "passwordFile": str(password_file()),
               "passwordEnv": f"PYSTREAM_FAULTS_{producer_name.replace('-', '_')}",
               "stream": stream, "producerName": producer_name}
    if codec != "none":
        options["compression"] = codec
    broker = broker_ref(normalize(options))
    with ranges._clients_lock:
        ranges._clients[(broker, ())] = pystream.Client(broker.address(), **client_options)
    return SinkConfig.parse(options, StructType([StructField("body", BinaryType())]),
                            False)


def password_file() -> Path:
    path = Path(tempfile.gettempdir()) / f"{USER}.password"
    if not path.exists():
        # Whole or absent: the sink cells of a round make it at once, and a
        # cell that found it created but not yet written read an empty
        # password (an AuthenticationFailure before anything was written).
        part = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
        part.write_text(PASSWORD)
        os.replace(part, path)
    return path


def sink_batches(run: Run | None, first: int, fail_at: int | None,
                 progress: Callable[[int, int], None] | None = None,
                 ) -> Iterator[pa.RecordBatch]:
    """A task's rows, 500 at a time; the second half paced (after the fault)."""
    for seq in range(first, N, 500):
        if fail_at is not None and seq >= fail_at:
            raise AppError("the rows' upstream failed")
        n = min(500, N - seq)
        if progress is not None:
            progress(seq, n)
        yield pa.RecordBatch.from_arrays([as_binary(bodies(seq, n))], names=["body"])
        if seq + n >= N // 2:
            if run is not None:
                run.midway()
            time.sleep(SECOND_HALF / (N / 2 / 500))


def cell_sink(run: Run) -> None:
    from pystream.spark.sink import ID_BITS, _Task, _write

    codec = run.path.removeprefix("sink-")
    with run.connect() as client:
        stream = run.stream(client)
        config = sink_config(stream, codec, run.tag, run.options)
        fail_at = N // 2 if run.fault == "exception" else None
        done = False
        error = ""
        for _attempt in range(4):  # Spark's task attempts
            try:
                task = _Task(config, f"{run.tag}-0", 1 << ID_BITS, config.streams)
                commit = _write(task, sink_batches(run, 0, fail_at))
                run.cell.events.append(f"the task committed {commit.counts}, "
                                       f"{commit.skipped} rows skipped")
                done = True
                break
            except (AppError, pystream.StreamError) as exc:
                error = describe(exc)
                run.cell.events.append(f"{error} (the task retried)")
                fail_at = None
        if not done:
            run.verdict_hint = f"every attempt of the task failed, the last with {error}"
        # A task that returned had every confirm.
        finish_writer(run, client, np.full(N, done))


# --- the writing cells in child processes: kill and SIGINT --------------------------


def cell_kill_writer(run: Run) -> None:
    """A named producer (a super stream's, a sink task) in a child process,
    killed half-way and started again."""
    with run.connect() as client:
        super_stream = None
        if run.path == "super-producer":
            run.super_stream(client)
            super_stream = run.tag
        else:
            run.stream(client)
        role = "sink" if run.path.startswith("sink-") else run.path
        out = [run.workdir / f"{run.tag}-{i}.bin" for i in range(2)]
        codec = run.path.removeprefix("sink-")
        child = spawn(run, role, out[0], codec=codec, super_stream=super_stream)
        sent = lambda: int(pairs(out[0])[:, 1].sum())  # noqa: E731
        wait_for(lambda: sent() >= N // 2 or child.poll() is not None, 60)
        run.halfway.set()
        if child.poll() is not None:
            run.verdict_hint = "the writer had finished before the kill: not tested"
        child.kill()
        reap(run, child, 30)
        child = spawn(run, role, out[1], codec=codec, super_stream=super_stream,
                      confirmed_file=str(out[0]))
        result = reap(run, child, 120)
        confirmed = np.zeros(N, bool)
        for path in out:
            for first, n in pairs(path):
                confirmed[first:first + n] = True
        if not result.get("done"):
            run.verdict_hint = run.verdict_hint or "the restarted writer did not finish"
        if run.path.startswith("sink-"):
            confirmed[:] = bool(result.get("done"))  # the retried task confirmed all
        finish_writer(run, client, confirmed, super_stream)


def cell_interrupted_producer(run: Run) -> None:
    """A named producer in a child process, sent SIGINT again and again
    while it sends; it catches each KeyboardInterrupt and goes on as
    docs/producing.md says. A broker fault strikes once it is half-way."""
    super_stream = run.tag if run.path.startswith("super-producer") else None
    with run.connect() as client:
        if super_stream is None:
            run.stream(client)
        else:
            run.super_stream(client)
        out = run.workdir / f"{run.tag}.bin"
        child = spawn(run, "interrupted-producer", out, super_stream=super_stream)
        wait_for(lambda: len(pairs(out)) > 0 or child.poll() is not None, 60)
        confirmed = lambda: int(pairs(out)[:, 1].sum())  # noqa: E731
        sent = 0
        deadline = time.monotonic() + MIDWAY_WAIT + PAUSE + AFTER_FAULT
        while child.poll() is None and time.monotonic() < deadline:
            if not run.halfway.is_set() and confirmed() >= N // 2:
                run.halfway.set()
            time.sleep(random.uniform(0.001, 0.01))
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGINT)
                sent += 1
        run.halfway.set()
        result = reap(run, child, AFTER_FAULT)
        run.cell.events.append(f"{sent} SIGINT sent, {result.get('interrupts', '?')} "
                               f"KeyboardInterrupt caught in the producer's calls, "
                               f"{result.get('recoveries', '?')} recoveries")
        if not result.get("interrupts"):
            run.verdict_hint = run.verdict_hint or "no interrupt landed: not tested"
        confirmed = np.zeros(N, bool)
        for first, n in pairs(out):
            if first >= 0:
                confirmed[first:first + n] = True
        if not result.get("done"):
            run.verdict_hint = run.verdict_hint or "the producer did not finish"
        finish_writer(run, client, confirmed, super_stream)
