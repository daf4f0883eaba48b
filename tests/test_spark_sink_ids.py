"""The sink's publishing-id scheme against a model of the broker, no broker
needed: the sink's own ``Calls`` cut the rows, the real C encoder makes the
sub-batches (codecs, sub-batch sizes, frames), and a model broker keeps,
per stream, the sub-batches sent until the task is killed, dropping ids at
or below the last it holds, as RabbitMQ's deduplication does. An attempt
may also be handed only the first rows of its input and end as if that
were all (a Python worker whose JVM died sees its Arrow stream end).
Whatever the Arrow batch sizes of each attempt and wherever attempts are
cut off or killed, the last attempt leaves every row once, in order, in
its partition, or the sink refused sub-batches a frame could cut; a super
stream whose partitions changed between attempts routes the replay as the
first attempt did, or is refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pystream import ExactlyOnceError
from pystream._core import encode_publish
from pystream.spark.sink import (
    ID_BITS,
    Calls,
    call_rows,
    partitions_fingerprint,
    replay_partitions,
    resume_call,
)
from pystream.super_stream import hash_route

CODECS = [None, "none", "gzip", "snappy", "lz4", "zstd"]
BATCH = 7  # the micro-batch every attempt writes


class Killed(Exception):
    """The model's SIGKILL: the task stops between two sub-batches."""


class Stream:
    """One stream's deduplication state and the rows it stored."""

    def __init__(self) -> None:
        self.held = 0
        self.rows: list[bytes] = []


class Attempt:
    """One attempt of a task: sends sub-batches until ``budget`` is spent."""

    def __init__(self, codec: str | None, sub: int, frame: int, budget: int | None) -> None:
        self.codec, self.sub, self.frame, self.budget = codec, sub, frame, budget
        self.last_sent: dict[int, int] = {}

    def send(self, stream: Stream, rows: pa.RecordBatch, first: int) -> None:
        # The producer's own rule: each call's ids follow those it sent.
        assert first > self.last_sent.get(id(stream), 0)
        bodies = rows.column("body")
        _, counts = encode_publish(0, first, bodies, compression=self.codec,
                                   sub_batch_size=self.sub, max_frame_size=self.frame)
        if self.codec is not None:  # whole sub-batches: no frame cut one short
            assert len(counts) == -(-rows.num_rows // self.sub)
        at = 0
        for i, n in enumerate(counts.tolist()):
            if self.budget is not None:
                if self.budget == 0:
                    raise Killed
                self.budget -= 1
            if first + i > stream.held:
                stream.rows.extend(bodies.slice(at, n).to_pylist())
                stream.held = first + i
            at += n
        self.last_sent[id(stream)] = first + len(counts) - 1


def bodies(n: int, size: int) -> pa.Array:
    return pa.array([f"{i}:".encode() + b"x" * (i * 37 % size) for i in range(n)], pa.binary())


def in_batches(table: pa.Table, sizes: list[int]) -> list[pa.RecordBatch]:
    """``table`` as record batches of the sizes drawn (cycled)."""
    out, at, k = [], 0, 0
    while at < table.num_rows:
        n = sizes[k % len(sizes)]
        out.append(table.slice(at, n).combine_chunks().to_batches()[0])
        at, k = at + n, k + 1
    return out


def run_attempt(streams: dict[str, Stream], routing: tuple[str, ...], rows: pa.Table,
                sizes: list[int], attempt: Attempt, target: int) -> None:
    """One attempt of the task over ``rows``, routed by hash over ``routing``
    as the sink's task does, one ``Calls`` per target stream."""
    base = BATCH << ID_BITS
    per_call = call_rows(attempt.codec, attempt.sub, target)
    unit = 1 if attempt.codec is None else attempt.sub
    calls: dict[str, Calls] = {}
    for batch in in_batches(rows, sizes):
        parts = hash_route(batch.column("key"), len(routing))
        for i, name in enumerate(routing):
            taken = batch.take(np.nonzero(parts == i)[0]).select(["body"])
            if not taken.num_rows:
                continue
            if name not in calls:
                stream = streams.setdefault(name, Stream())
                calls[name] = Calls(
                    lambda r, first, s=stream: attempt.send(s, r, first),
                    base, stream.held, per_call, unit, attempt.frame)
            calls[name].add(taken)
    for c in calls.values():
        c.finish()


def expected(rows: pa.Table, routing: tuple[str, ...]) -> dict[str, list[bytes]]:
    parts = hash_route(rows.column("key"), len(routing))
    body = rows.column("body").to_pylist()
    return {name: [b for b, p in zip(body, parts, strict=True) if p == i]
            for i, name in enumerate(routing)}


sizes = st.lists(st.integers(1, 600), min_size=1, max_size=4)
# Arrow batch sizes, the share of the rows handed over, sub-batches sent
# before the kill (None: not killed).
attempts = st.lists(st.tuples(sizes, st.floats(0, 1), st.one_of(st.none(), st.integers(0, 60))),
                    min_size=1, max_size=3)


@settings(max_examples=500, deadline=None)
@given(codec=st.sampled_from(CODECS), sub=st.integers(1, 300),
       n=st.integers(0, 2500), size=st.integers(1, 200),
       frame=st.sampled_from([1 << 20, 1 << 20, 1 << 20, 8192]), target=st.integers(1, 900),
       plan=attempts, partitions=st.integers(1, 4))
def test_every_row_once_whatever_the_batches_codec_and_kill_point(
        codec, sub, n, size, frame, target, plan, partitions):
    rows = pa.table({"body": bodies(n, size),
                     "key": pa.array([f"k{i % 97}" for i in range(n)])})
    routing = tuple(f"p{i}" for i in range(partitions))
    streams: dict[str, Stream] = {}
    # Attempts cut off or killed, then one that runs to its end (Spark
    # retries until then).
    for arrow_sizes, share, budget in [*plan, (plan[-1][0][::-1], 1.0, None)]:
        try:
            run_attempt(streams, routing, rows.slice(0, round(share * n)), arrow_sizes,
                        Attempt(codec, sub, frame, budget), target)
        except Killed:
            pass
        except ExactlyOnceError:
            # Refused, never wrong: only where a frame could cut a sub-batch.
            assert codec is not None and frame < 1 << 20
            return
    want = expected(rows, routing)
    for name in routing:
        assert streams.get(name, Stream()).rows == want[name], name


def test_a_call_is_skipped_only_when_the_broker_holds_ids_past_it():
    base = BATCH << ID_BITS
    assert resume_call(0, base, 100) == 0
    assert resume_call(base - 1, base, 100) == 0      # the batch before
    assert resume_call(base + 1, base, 100) == 0      # call 0 partly held
    assert resume_call(base + 100, base, 100) == 0    # call 0's last possible id
    assert resume_call(base + 101, base, 100) == 1
    assert resume_call((BATCH + 1) << ID_BITS, base, 100) > ID_BITS ** 3  # a later batch
    assert call_rows(None, 300) == 10_000             # one id per message
    assert call_rows("zstd", 300) == 10_200           # whole sub-batches
    assert call_rows("zstd", 65_535) == 65_535


def test_ids_past_a_batch_refuse_the_call():
    sent: list[int] = []
    calls = Calls(lambda rows, first: sent.append(first), BATCH << ID_BITS, 0, 1 << 30, 1,
                  1 << 20)
    calls.add(pa.record_batch({"body": pa.array([b"x"])}))
    calls.calls = 1  # a second call would run past 2**32 ids
    with pytest.raises(ExactlyOnceError, match="more than"):
        calls.finish()
    assert sent == []


names = st.lists(st.sampled_from([f"s-{i}" for i in range(6)]), min_size=1, max_size=5,
                 unique=True)


@settings(max_examples=300, deadline=None)
@given(first=names, now=names, batch=st.integers(0, 1000))
def test_a_replay_routes_as_its_first_attempt_or_is_refused(first, now, batch):
    recorded = [batch << ID_BITS | partitions_fingerprint(first)]
    if now[:len(first)] == first:     # partitions added since: route as before
        assert replay_partitions(now, recorded, batch) == tuple(first)
    else:
        with pytest.raises(ExactlyOnceError, match="other partitions"):
            replay_partitions(now, recorded, batch)
    # What an earlier batch recorded leaves the current list to this one.
    assert replay_partitions(now, [(batch - 1) << ID_BITS | 5], batch) is None


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 1500), sub=st.integers(1, 50), codec=st.sampled_from(CODECS),
       budget=st.integers(0, 40), first=st.integers(1, 3), added=st.integers(1, 2),
       size=sizes)
def test_partitions_added_before_a_replay(n, sub, codec, budget, first, added, size):
    rows = pa.table({"body": bodies(n, 50),
                     "key": pa.array([f"k{i}" for i in range(n)])})
    old = tuple(f"p{i}" for i in range(first))
    new = tuple(f"p{i}" for i in range(first + added))
    streams: dict[str, Stream] = {}
    try:
        run_attempt(streams, old, rows, size, Attempt(codec, sub, 1 << 20, budget), 64)
    except Killed:
        pass
    recorded = [BATCH << ID_BITS | partitions_fingerprint(old)]
    routing = replay_partitions(new, recorded, BATCH)
    assert routing == old
    run_attempt(streams, routing, rows, size[::-1], Attempt(codec, sub, 1 << 20, None), 64)
    want = expected(rows, old)
    for name in new:
        assert streams.get(name, Stream()).rows == want.get(name, []), name


def test_sub_batches_a_frame_could_cut_are_refused_before_any_is_sent():
    sent: list[int] = []
    big = pa.record_batch({"body": pa.array([b"x" * 15_000] * 300)})
    calls = Calls(lambda rows, first: sent.append(first), BATCH << ID_BITS, 0, 10_000, 100,
                  1 << 20)
    calls.add(big)
    with pytest.raises(ExactlyOnceError, match="lower subEntrySize"):
        calls.finish()  # 100 messages of 15 000 bytes: more than 1 MiB
    assert sent == []
    fine = Calls(lambda rows, first: sent.append(first), BATCH << ID_BITS, 0, 10_000, 20,
                 1 << 20)
    fine.add(big)
    fine.finish()
    assert sent == [(BATCH << ID_BITS) + 1]
