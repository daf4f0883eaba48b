"""The fault matrix's reading cells (tests/faults.py): each reading path
in this process, fed by a ``Feeder`` or prefilled, and the blocking
readers in child processes, killed or sent SIGINT (their side:
tests/fault_children.py)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import pystream
from pystream import aio

from .fault_run import (
    AFTER_FAULT,
    BATCH,
    CANCELS,
    HOLD,
    MIDWAY_WAIT,
    PARTITIONS,
    PAUSE,
    SECOND_HALF,
    SENTINEL,
    URI,
    AppError,
    N,
    Run,
    describe,
    filter_batch,
    pairs,
    reap,
    red,
    spawn,
    wait_for,
)
from .soak import as_binary, bodies_of

# --- publishing what the readers read -----------------------------------------------


class Feeder:
    """Publishes 0..N-1 to a cell's stream(s) with named producers (partition
    ``seq % PARTITIONS`` for several), half at once and half from the
    fault on, then a sentinel to each; ``confirmed`` tracks the confirms."""

    def __init__(self, run: Run, streams: list[str], *, filtered: bool = False,
                 paced: bool = True) -> None:
        self.run, self.streams, self.filtered, self.paced = run, streams, filtered, paced
        self.confirmed = np.zeros(N, bool)
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._feed, daemon=True,
                                       name=f"feeder-{run.tag}")

    def start(self) -> Feeder:
        self.thread.start()
        return self

    def _feed(self) -> None:
        try:
            with self.run.connect() as client:
                producers = self._producers(client)
                try:
                    self._publish(producers, 0, N // 2, pace=0.0)
                    self.run.round.began.wait(MIDWAY_WAIT + 5)
                    self._publish(producers, N // 2, N,
                                  pace=SECOND_HALF / (N / 2 / BATCH) if self.paced else 0.0)
                    for p in producers:
                        p.flush(timeout=AFTER_FAULT)
                    end = np.array([SENTINEL])
                    for p in producers:
                        p.send_batch(filter_batch(end) if self.filtered
                                     else as_binary(bodies_of(end)))
                        p.flush(timeout=AFTER_FAULT)
                finally:
                    for p in producers:
                        with contextlib.suppress(pystream.StreamError):
                            p.close(timeout=5)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _producers(self, client: pystream.Client) -> list[Any]:
        """The feeder's producers; made again if the connection went while
        they were declared (another fault test on the shared broker): the
        feeder is no cell, it must not fail one."""
        options: dict[str, Any] = {"filter_value": "color"} if self.filtered else {}
        for attempt in range(5):
            producers = []
            try:
                for s in self.streams:
                    producers.append(client.producer(s, name=f"{s}-feeder", **options))
                return producers
            except (pystream.ConnectionLost, pystream.ConnectionClosed):
                for p in producers:
                    with contextlib.suppress(pystream.StreamError):
                        p.close(timeout=5)
                if attempt == 4:
                    raise
                time.sleep(1)
        raise AssertionError("unreachable")

    def _publish(self, producers: list[Any], lo: int, hi: int, pace: float) -> None:
        for first in range(lo, hi, BATCH):
            seqs = np.arange(first, min(first + BATCH, hi))
            parts = seqs % len(producers)
            for i, p in enumerate(producers):
                mine = seqs[parts == i]
                if len(mine):
                    batch = filter_batch(mine) if self.filtered else as_binary(bodies_of(mine))
                    p.send_batch(batch).add_done_callback(
                        lambda f, mine=mine: self._confirm(f, mine))
            if pace:
                time.sleep(pace)

    def _confirm(self, future: Any, seqs: np.ndarray) -> None:
        if future.exception() is None:
            self.confirmed[seqs] = True


def prefill(client: pystream.Client, stream: str, *, filtered: bool,
            sentinel: bool) -> np.ndarray:
    """N records in chunks of about 100 (each batch confirmed before the
    next), so that a range read needs many chunks; the confirmed mask."""
    confirmed = np.zeros(N, bool)
    options: dict[str, Any] = {"filter_value": "color"} if filtered else {}
    with client.producer(stream, **options) as p:
        for first in range(0, N, 100):
            seqs = np.arange(first, min(first + 100, N))
            p.send_batch(filter_batch(seqs) if filtered
                         else as_binary(bodies_of(seqs))).result(30)
            confirmed[seqs] = True
        if sentinel:
            end = np.array([SENTINEL])
            p.send_batch(filter_batch(end) if filtered else as_binary(bodies_of(end))).result(30)
    return confirmed


# --- the reading cells (in this process) --------------------------------------------


def cell_consumer(run: Run) -> None:
    stream, feeder = fed_stream(run, contiguous=True)
    with run.connect() as client:
        while not run.finished():
            try:
                with client.consumer(stream, offset="first", name=run.tag) as consumer:
                    while not run.finished():
                        table = consumer.read(1000, timeout=0.5)
                        run.process(table.column("body"), table.column("offset").to_numpy())
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")
        feeder_result(run, feeder)


def fed_stream(run: Run, contiguous: bool) -> tuple[str, Feeder]:
    """A stream of the cell's own, its feeder started, the checker ready."""
    with run.connect() as client:
        stream = run.stream(client)
    feeder = Feeder(run, [stream]).start()
    run.checker(contiguous=contiguous)
    run.expected = feeder.confirmed  # filled as confirms come
    return stream, feeder


def feeder_result(run: Run, feeder: Feeder) -> None:
    """Once the feeder is done: what the reader must have read."""
    feeder.done.wait(AFTER_FAULT)
    run.expected = feeder.confirmed & ~run.excluded
    if feeder.error is not None:
        run.verdict_hint = f"the feeding producer failed: {describe(feeder.error)}"


def cell_aio(run: Run) -> None:
    stream, feeder = fed_stream(run, contiguous=True)
    asyncio.run(_aio(run, stream))
    feeder_result(run, feeder)


async def _aio(run: Run, stream: str) -> None:
    client = await aio.connect(URI, **run.options)
    try:
        while not run.finished():
            consumer = await client.consumer(stream, offset="first", name=run.tag)
            try:
                # async with, as the docs say: leaving it with an exception
                # stores only what was processed (a close() in a finally
                # cannot see the exception).
                async with consumer:
                    if run.fault == "cancel":
                        await _cancelled_reads(run, consumer)
                        return
                    while not run.finished():
                        table = await consumer.read(1000, timeout=0.5)
                        run.process(table.column("body"), table.column("offset").to_numpy())
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")
    finally:
        await client.close()


async def _cancelled_reads(run: Run, consumer: aio.AsyncConsumer) -> None:
    """Each read in a task of its own, cancelled if it has not returned
    within 20-300 ms; a cancelled read must raise CancelledError and lose
    nothing (the next read gets its records)."""
    async def one_read() -> None:
        table = await consumer.read(1000, timeout=0.5)
        run.take(table.column("body"), table.column("offset").to_numpy())

    cancels = swallowed = 0
    while not run.finished() and cancels + swallowed < CANCELS:
        task = asyncio.ensure_future(one_read())
        done, _ = await asyncio.wait([task], timeout=random.uniform(0.02, 0.3))
        if task in done:
            task.result()
            continue
        task.cancel()
        try:
            await task
            swallowed += 1  # the read returned as if never cancelled
        except asyncio.CancelledError:
            cancels += 1
    idle_since = time.monotonic()
    while not run.finished() and time.monotonic() - idle_since < 5:
        table = await consumer.read(1000, timeout=0.5)
        run.take(table.column("body"), table.column("offset").to_numpy())
        if table.num_rows:
            idle_since = time.monotonic()
    run.cell.events.append(f"{cancels} reads cancelled")
    if swallowed:
        run.verdict_hint = (f"{swallowed} of {cancels + swallowed} cancellations "
                            f"were swallowed: the read returned instead of raising "
                            f"CancelledError")


def cell_range(run: Run) -> None:
    from pystream.ranges import plan_ranges, read_range
    from pystream.spark.datasource import BATCH_ROWS

    filtered = run.path == "range-filtered"
    with run.connect() as client:
        stream = run.stream(client)
        confirmed = prefill(client, stream, filtered=filtered, sentinel=False)
    if filtered:
        run.excluded, run.half = np.arange(N) % 2 == 1, N // 4
    run.expected = confirmed & ~run.excluded
    (r,) = plan_ranges(URI, [stream], connection_options=run.options)
    # Spark's options, but a credit budget of 256 KiB (not 64 MiB): the read
    # holds a few thousand records ahead, as a range many times the budget
    # would, so the rest must come from the broker after the fault.
    options: dict[str, Any] = dict(
        body="binary", amqp=True, max_batch_rows=BATCH_ROWS,
        credit=pystream.Credit.adaptive(max_buffered_bytes=256 << 10, until=r.end))
    if filtered:
        options.update(columns=["application_properties"],
                       filter=pystream.Filter(["red"], post_filter=red))
    held = False
    for _attempt in range(4):  # Spark's task attempts
        check = run.checker(contiguous=not filtered)
        batches = iter(read_range(URI, stream, r.start, r.end,
                                  connection_options=run.options, **options))
        try:
            for batch in batches:
                run.process(batch.column("body"), batch.column("offset").to_numpy())
                if run.past_half() and not held:
                    # Half the range is still to come, more than the
                    # credit lets the broker send ahead: held until the
                    # fault is in effect, the read then needs the broker
                    # while it is away (or just back).
                    held = True
                    run.midway()
                    # In effect, not just begun: the command that pauses
                    # the broker can take longer than HOLD on a busy machine.
                    run.round.struck.wait(MIDWAY_WAIT)
                    run.round.ended.wait(HOLD)
            got = check.consumed
            if got < run.expected.sum():
                run.verdict_hint = (f"short read without an error: {got} rows of "
                                    f"{int(run.expected.sum())} (range {r.start}-{r.end})")
            return
        except (AppError, pystream.StreamError) as exc:
            run.cell.events.append(f"{describe(exc)} (the range read again)")
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    run.verdict_hint = (f"the read raised on each of Spark's 4 task attempts, the "
                        f"first: {run.cell.events[0]}")


def cell_sac(run: Run) -> None:
    stream, feeder = fed_stream(run, contiguous=False)
    threads = [threading.Thread(target=_sac_member, args=(run, stream, who),
                                daemon=True) for who in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(MIDWAY_WAIT + PAUSE + 3 * AFTER_FAULT)
    feeder_result(run, feeder)


def _sac_member(run: Run, stream: str, who: str) -> None:
    with run.connect() as client:
        while not run.finished():
            try:
                with client.consumer(stream, offset="first", name=run.tag,
                                     single_active=True) as consumer:
                    while not run.finished():
                        table = consumer.read(1000, timeout=0.5)
                        run.process(table.column("body"), key=who)
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")


def cell_super(run: Run) -> None:
    with run.connect() as client:
        partitions = run.super_stream(client)
        feeder = Feeder(run, partitions).start()
        run.checker(contiguous=False)
        run.expected = feeder.confirmed
        run.sentinels_wanted = len(partitions)
        while not run.finished():
            try:
                with client.consumer(super_stream=run.tag, offset="first",
                                     name=run.tag) as consumer:
                    while not run.finished():
                        for batch in consumer.batches(timeout=0.5):
                            run.process(batch.column("body"),
                                        key=batch.schema.metadata[b"stream"].decode())
                            if run.finished():
                                break
            except AppError as exc:
                run.cell.events.append(f"AppError: {exc} (consumer closed, opened again)")
        feeder_result(run, feeder)


def cell_filtered(run: Run) -> None:
    def post_filter(batch: pa.RecordBatch) -> Any:
        if run.strikes(run.past_half()):
            raise AppError("the post filter failed")
        return red(batch)

    with run.connect() as client:
        stream = run.stream(client)
        run.excluded = np.arange(N) % 2 == 1
        run.half = N // 4
        feeder = Feeder(run, [stream], filtered=True).start()
        run.checker(contiguous=False)
        run.expected = feeder.confirmed & ~run.excluded
        with client.consumer(stream, offset="first", columns=["application_properties"],
                             filter=pystream.Filter(["red"], post_filter=post_filter),
                             ) as consumer:
            while not run.finished():
                try:
                    table = consumer.read(1000, timeout=0.5)
                except AppError as exc:
                    # The rows of a read that raised go back (docs/consuming.md).
                    run.cell.events.append(f"AppError: {exc} (read on)")
                    continue
                run.take(table.column("body"), table.column("offset").to_numpy())
        feeder_result(run, feeder)


# --- the reading cells in child processes: kill and SIGINT --------------------------


def take_pairs(run: Run, files: list[Path], keyed: bool) -> None:
    """A killed or interrupted reader's records, in the order it wrote them."""
    for path in files:
        got = pairs(path)
        for key in np.unique(got[:, 0]) if keyed else [None]:
            seqs = got[:, 1] if key is None else got[got[:, 0] == key][:, 1]
            seqs = seqs[seqs != -1]  # the mark of a reader that started
            name = path.name if key is None else f"{path.name}-{key}"
            run.take(as_binary(bodies_of(seqs.astype(np.uint64))), key=name)


def cell_kill_reader(run: Run) -> None:
    """A named consumer (or two single active ones, or a super stream's) in
    a child process, killed half-way and started again."""
    role = {"consumer": "consume", "super": "super", "sac": "consume"}[run.path]
    with run.connect() as client:
        if run.path == "super":
            _fill_partitions(client, run.super_stream(client))
            run.expected = np.ones(N, bool)
        else:
            stream = run.stream(client)
            run.expected = prefill(client, stream, filtered=False, sentinel=True)
    run.checker(contiguous=False)
    out = [run.workdir / f"{run.tag}-{i}.bin" for i in range(3)]
    spec: dict[str, Any] = {"single_active": run.path == "sac", "super": run.path == "super"}
    children = [spawn(run, role, out[0], paced=True, **spec)]
    if run.path == "sac":
        children.append(spawn(run, role, out[1], paced=True, **spec))
    read = lambda: sum(len(pairs(p)) for p in out)  # noqa: E731
    wait_for(lambda: read() >= N // 2 or all(c.poll() is not None for c in children), 60)
    run.halfway.set()
    # The one reading (of two single active consumers: the last to write).
    victim = max(range(len(children)), key=lambda i: (len(pairs(out[i])), -i))
    if run.path == "sac":
        sizes = [len(pairs(p)) for p in out[:2]]
        time.sleep(0.05)
        grew = [len(pairs(p)) - s for p, s in zip(out[:2], sizes, strict=True)]
        victim = int(np.argmax(grew)) if max(grew) > 0 else victim
    if children[victim].poll() is not None:
        run.verdict_hint = "the reader had finished before the kill: not tested"
    children[victim].kill()
    reap(run, children[victim], 30)
    children[victim] = spawn(run, role, out[2], paced=False, **spec)
    if run.path == "sac":
        # The inactive one never sees the end: stop both once one did.
        wait_for(lambda: any((pairs(p)[:, 1] == SENTINEL).any() for p in out), 120, 0.1)
        for c in children:
            c.terminate()
    for c in children:
        reap(run, c, 120)
    take_pairs(run, out, keyed=run.path == "super")
    run.sentinels_wanted = len(run.sentinels)  # counted in take; judged by losses


def _fill_partitions(client: pystream.Client, partitions: list[str]) -> None:
    """Partition i gets the numbers ``seq % PARTITIONS == i``, then a sentinel."""
    for i, s in enumerate(partitions):
        with client.producer(s) as p:
            seqs = np.arange(i, N, PARTITIONS)
            for first in range(0, len(seqs), 100):
                p.send_batch(as_binary(bodies_of(seqs[first:first + 100]))).result(30)
            p.send_batch(as_binary(bodies_of(np.array([SENTINEL])))).result(30)


def cell_interrupted(run: Run) -> None:
    """A blocking reader in a child process, sent SIGINT again and again
    while the records come; it catches KeyboardInterrupt and reads on."""
    with run.connect() as client:
        if run.path == "super":
            streams = run.super_stream(client)
            run.sentinels_wanted = len(streams)
        else:
            streams = [run.stream(client)]
    filtered = run.path == "filtered"
    if filtered:
        run.excluded = np.arange(N) % 2 == 1
    out = run.workdir / f"{run.tag}.bin"
    child = spawn(run, "interrupted", out, super=run.path == "super", filtered=filtered,
                  partitions=len(streams))
    wait_for(lambda: len(pairs(out)) > 0 or child.poll() is not None, 60)
    feeder = Feeder(run, streams, filtered=filtered).start()
    sent = 0
    def reading() -> bool:
        return (not feeder.done.is_set() and child.poll() is None
                and (pairs(out)[:, 1] == SENTINEL).sum() < len(streams))

    # Looked at again right before each signal: one sent once the child has
    # read to the end would find it exiting, past the handler it reads
    # with (the interpreter's end restores SIGINT's default: death).
    while reading():
        time.sleep(random.uniform(0.05, 0.25))
        if not reading():
            break
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGINT)
            sent += 1
    result = reap(run, child, AFTER_FAULT)
    run.cell.events.append(f"{sent} SIGINT sent, {result.get('interrupts', '?')} "
                           f"KeyboardInterrupt caught")
    run.halfway.set()
    run.checker(contiguous=not filtered and run.path != "super")
    take_pairs(run, [out], keyed=run.path == "super")
    run.sentinels_wanted = len(run.sentinels)
    feeder_result(run, feeder)
    if result.get("sentinels", 0) < len(streams):
        run.verdict_hint = run.verdict_hint or "the reader never reached the end"
