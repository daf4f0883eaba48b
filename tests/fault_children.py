"""The child processes' side of the fault matrix: started by
``fault_run.spawn`` as ``python -m tests.faults --child JSON``, a consumer
or a producer under a name, killed or sent SIGINT by its cell, appending
what it read (or had confirmed) to a file of (key, value) pairs."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import pystream

from .fault_run import (
    AFTER_FAULT,
    OVERLAP,
    PARTITIONS,
    SECOND_HALF,
    SENTINEL,
    URI,
    N,
    _Recoveries,
    client_options,
    pairs,
    red,
)
from .fault_writers import publish_from, route, sink_batches, sink_config
from .soak import as_binary, bodies, rows_of


def child_main(spec: dict[str, Any]) -> int:
    out = os.open(spec["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(keys: Any, values: Any) -> None:
        data = np.stack([np.asarray(keys, np.int64), np.asarray(values, np.int64)], axis=1)
        os.write(out, data.tobytes())

    role = spec["role"]
    with pystream.connect(URI, **client_options(spec["fault"])) as client:
        if role in ("consume", "super"):
            return _child_consume(client, spec, write)
        if role == "interrupted":
            return _child_interrupted(client, spec, write)
        if role == "producer":
            return _child_produce(client, spec, write)
        if role == "interrupted-producer" and spec.get("super_stream"):
            return _child_interrupted_super_produce(client, spec, write)
        if role == "interrupted-producer":
            return _child_interrupted_produce(client, spec, write)
        if role == "super-producer":
            return _child_super_produce(client, spec, write)
        if role == "sink":
            return _child_sink(spec, write)
    raise ValueError(role)


def seqs_of(batch: Any) -> np.ndarray:
    return rows_of(batch.column("body"))[:, :8].copy().view(np.uint64).ravel().astype(np.int64)


def _child_consume(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    options: dict[str, Any] = {"name": spec["tag"]}
    if spec["super"]:
        options["super_stream"] = spec["tag"]
        stream = None
        ends_wanted = PARTITIONS
    else:
        stream = spec["streams"][0]
        options["single_active"] = spec["single_active"]
        ends_wanted = 1
    ends = 0
    with client.consumer(stream, offset="first", **options) as consumer:
        while ends < ends_wanted:
            for batch in consumer.batches(timeout=1.0):
                part = (batch.schema.metadata or {}).get(b"stream", b"-0").decode()
                seqs = seqs_of(batch)
                write(np.full(len(seqs), int(part.rsplit("-", 1)[1])), seqs)
                ends += int((seqs == SENTINEL).sum())
                if spec.get("paced"):
                    time.sleep(len(seqs) / N)  # a second for all
                if ends >= ends_wanted:
                    break
    print(json.dumps({"done": True}))
    return 0


def _child_interrupted(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    """Reads as docs/consuming.md says an application that is interrupted
    should: keep the result of a read before anything else, catch the
    KeyboardInterrupt, read on. A SIGINT interrupts the reads only (while
    the records are written, processed, it is counted and dropped)."""
    reading = [False]
    dropped = [0]

    def on_sigint(signum: int, frame: Any) -> None:
        if reading[0]:
            raise KeyboardInterrupt
        dropped[0] += 1

    signal.signal(signal.SIGINT, on_sigint)
    options: dict[str, Any] = {}
    if spec["filtered"]:
        options.update(columns=["application_properties"],
                       filter=pystream.Filter(["red"], post_filter=red))
    if spec["super"]:
        consumer = client.consumer(super_stream=spec["tag"], offset="first", **options)
    else:
        consumer = client.consumer(spec["streams"][0], offset="first", **options)
    interrupts = ends = 0
    write(np.zeros(1), np.array([-1]))  # started: the signals may come
    with consumer:
        while ends < spec["partitions"]:
            parts: list[Any] = []
            try:
                reading[0] = True
                if spec["super"]:
                    # A for loop binds the batch with no call in between;
                    # next(), a C call, could lose it to an interrupt.
                    for batch in consumer.batches(0.5):
                        parts.append(batch)
                        break
                else:
                    parts.append(consumer.read(500, timeout=0.5))
                reading[0] = False
            except KeyboardInterrupt:
                reading[0] = False
                interrupts += 1
            for part in parts:
                if part is None or not part.num_rows:
                    continue
                key = 0
                if spec["super"]:
                    key = int(part.schema.metadata[b"stream"].decode().rsplit("-", 1)[1])
                seqs = seqs_of(part)
                write(np.full(len(seqs), key), seqs)
                ends += int((seqs == SENTINEL).sum())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # through the exit too
    print(json.dumps({"done": True, "interrupts": interrupts, "sentinels": ends,
                      "outside_reads": dropped[0]}))
    return 0


def _child_produce(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    with client.producer(spec["streams"][0], name=spec["tag"]) as producer:
        last = producer.last_publishing_id
        seq = max(0, last - OVERLAP) if last else 0  # some again: the broker drops them
        publish_from(producer, seq, lambda s, n: write([s], [n]), ids=True)
    print(json.dumps({"done": True}))
    return 0


INTERRUPTED_BATCH = 50  # records per batch of the interrupted producer: more calls


class ProducerInterrupts:
    """An interrupted producer child's SIGINTs: each raises
    ``KeyboardInterrupt`` while ``armed`` (in the producer's calls), one
    at a time as the promise says; one that comes before the last was
    handled (while it goes up through the producer) is counted and
    dropped. Also what the child had confirmed, and pystream's recovery
    warnings."""

    def __init__(self, write: Any) -> None:
        self.write = write
        self.armed = False
        self.caught = 0
        self.dropped = 0
        self.recoveries = _Recoveries()
        logging.getLogger("pystream").addHandler(self.recoveries)
        signal.signal(signal.SIGINT, self._on_sigint)
        write([-1], [0])  # started: the signals may come

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        self.dropped += 1

    def confirmed(self, future: Any, first: int, n: int) -> None:
        if future.exception() is None:
            self.write([first], [n])

    def report(self, *, done: bool) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # through the exit too
        print(json.dumps({"done": done, "interrupts": self.caught,
                          "outside_calls": self.dropped,
                          "recoveries": len(self.recoveries.messages)}))


def _child_interrupted_produce(client: pystream.Client, spec: dict[str, Any],
                               write: Any) -> int:
    """Sends as docs/producing.md says an interrupted application should:
    catch the KeyboardInterrupt, flush, and send again from what
    ``last_publishing_id`` has not reached. A SIGINT interrupts the
    producer's calls only (``send_batch``, ``flush``), one at a time as the
    promise says (``ProducerInterrupts``). Each batch is flushed before
    the next, so that most signals land in a call."""
    sig = ProducerInterrupts(write)
    with client.producer(spec["streams"][0], name=spec["tag"]) as producer:
        seq, resync = 0, False
        while True:
            try:
                sig.armed = True
                if resync:
                    producer.flush(AFTER_FAULT)
                    seq, resync = producer.last_publishing_id, False
                if seq >= N:
                    producer.flush(AFTER_FAULT)
                    sig.armed = False
                    break
                n = min(INTERRUPTED_BATCH, N - seq)
                future = producer.send_batch(as_binary(bodies(seq, n)),
                                             publishing_id=seq + 1)
                seq += n
                future.add_done_callback(functools.partial(sig.confirmed, first=seq - n, n=n))
                producer.flush(AFTER_FAULT)
                sig.armed = False
                if seq >= N // 2:  # the second half over SECOND_HALF: a fault strikes
                    time.sleep(SECOND_HALF / (N / 2 / INTERRUPTED_BATCH))
            except KeyboardInterrupt:
                sig.armed = False
                sig.caught += 1
                resync = True
        # Every message the producer took is confirmed (flush returned),
        # those of futures an interrupt kept from the callbacks too.
        write([0], [producer.last_publishing_id])
    sig.report(done=producer.last_publishing_id == N)
    return 0


def _child_interrupted_super_produce(client: pystream.Client, spec: dict[str, Any],
                                     write: Any) -> int:
    """A super stream producer's side of ``_child_interrupted_produce``, as
    docs/producing.md says (#dedup-producer-interrupt): the ids each
    partition gives a batch's share are taken before the first attempt;
    after an interrupt, flush, then send the same batch with the same ids,
    the partitions that stored their share dropping it. A batch counts as
    confirmed only through the done-callback of an attempt that returned,
    which flush waited for: nothing is assumed."""
    sig = ProducerInterrupts(write)
    with client.producer(super_stream=spec["super_stream"], route=route,
                         name=spec["tag"]) as producer:
        seq = 0
        while seq < N:
            n = min(INTERRUPTED_BATCH, N - seq)
            batch = as_binary(bodies(seq, n))
            ids: dict[str, int] | None = None
            again = False
            while True:
                try:
                    sig.armed = True
                    if again:
                        producer.flush(AFTER_FAULT)
                    if ids is None:  # nothing of this batch sent yet
                        ids = {p: producer.last_publishing_id(p) + 1
                               for p in producer.partitions}
                    future = producer.send_batch(batch, publishing_ids=ids)
                    future.add_done_callback(functools.partial(sig.confirmed, first=seq, n=n))
                    producer.flush(AFTER_FAULT)
                    sig.armed = False
                    break
                except KeyboardInterrupt:
                    sig.armed = False
                    sig.caught += 1
                    again = True
            seq += n
            if seq >= N // 2:  # the second half over SECOND_HALF
                time.sleep(SECOND_HALF / (N / 2 / INTERRUPTED_BATCH))
    sig.report(done=True)
    return 0


def _child_super_produce(client: pystream.Client, spec: dict[str, Any], write: Any) -> int:
    confirmed = np.zeros(N, bool)
    if spec.get("confirmed_file"):
        for first, n in pairs(Path(spec["confirmed_file"])):
            confirmed[first:first + n] = True
    with client.producer(super_stream=spec["super_stream"], route=route,
                         name=spec["tag"]) as producer:
        seq = int(np.argmin(confirmed)) if not confirmed.all() else N
        publish_from(producer, seq, lambda s, n: write([s], [n]), ids=False)
    print(json.dumps({"done": True}))
    return 0


def _child_sink(spec: dict[str, Any], write: Any) -> int:
    from pystream.spark.sink import ID_BITS, _Task, _write

    config = sink_config(spec["streams"][0], spec["codec"], spec["tag"],
                         client_options(spec["fault"]))
    task = _Task(config, f"{spec['tag']}-0", 1 << ID_BITS, config.streams)
    commit = _write(task, _paced(sink_batches(None, 0, None, lambda s, n: write([s], [n]))))
    print(json.dumps({"done": True, "counts": commit.counts, "skipped": commit.skipped}))
    return 0


def _paced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in batches:
        yield b
        time.sleep(0.02)
