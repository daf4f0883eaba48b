"""The fault x feature matrix: each way of reading and writing a stream, run
against the modern broker while one fault strikes mid-way, judged by the
soak's checker (tests/soak.py: every body byte for byte, order, duplicates,
losses).

Reading paths: ``Consumer`` (blocking ``read``, named), ``AsyncConsumer``,
``read_range`` (what a Spark batch partition calls; plain and with a pushed
filter), single active consumers, a super stream consumer and a filtered
consumer. Writing paths: a named ``Producer``, a named
``SuperStreamProducer``, and the Spark sink's task function
(``pystream.spark.sink._write``, no JVM needed) with each codec.

Faults:
  close      the broker closes the cells' connections (their own user's,
             ``rabbitmqctl close_all_user_connections``)
  pause      the node is stopped (SIGSTOP) for PAUSE seconds: past the
             clients' 1 s heartbeat (lost after 2 s) and every idle
             threshold in pystream (``ranges.FILTERED_QUIET`` 2 s,
             ``ranges.CHECK_EVERY`` and ``subscription.IDLE_SECONDS`` 1 s)
  restart    the node is stopped and started again
  exception  the application raises mid-way (its processing of a batch,
             a post filter, the rows handed to the sink) and carries on as
             its documentation says: a consumer is closed and opened
             again under its name, a range read or a sink task is retried
  cancel     asyncio: the reading task is cancelled again and again; the
             blocking reads: SIGINT to a child process that catches the
             KeyboardInterrupt and reads on (docs/consuming.md)
  kill       SIGKILL to a child process consuming or producing under a
             name, mid-way; it is started again and carries on

A broker fault strikes once per round, every cell of the round running
at once (each on its own streams), when all of them are half-way; the
records (sequence numbers in 64-byte bodies) are written half before it
and half during and after it. A cell passes when every confirmed record
was read (written) exactly once, in order where promised, or at least
once where that is the promise (single active consumers; a consumer
closed after a failure or killed resumes from its stored offset), and
no read came back short without an error. A range read that raises is
retried, as Spark retries the task.

This module runs the matrix; the cells are in tests/fault_readers.py and
tests/fault_writers.py, their child processes' side in
tests/fault_children.py, what they share in tests/fault_run.py.

    .venv/bin/python -m tests.faults                  # the whole matrix
    .venv/bin/python -m tests.faults --faults close,exception --paths consumer
    .venv/bin/python -m tests.faults --json bench/results/faults.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import pystream
from tools import results

from .conftest import MODERN_URI, registered_session, run_broker
from .fault_children import child_main  # the --child entry (fault_run.spawn)
from .fault_readers import (
    cell_aio,
    cell_consumer,
    cell_filtered,
    cell_interrupted,
    cell_kill_reader,
    cell_range,
    cell_sac,
    cell_super,
)
from .fault_run import (
    AFTER_FAULT,
    BROKER_FAULTS,
    FAULTS,
    HEARTBEAT,
    MIDWAY_WAIT,
    NOT_APPLICABLE,
    PASSWORD,
    PATHS,
    PAUSE,
    SINKS,
    URI,
    USER,
    WRITERS,
    Cell,
    N,
    Round,
    Run,
    _Recoveries,
    client_options,
    describe,
)
from .fault_run import red as red  # re-exported for tests/test_interrupt_points.py
from .fault_writers import (
    cell_interrupted_producer,
    cell_kill_writer,
    cell_producer,
    cell_sink,
    cell_super_producer,
)

log = logging.getLogger("tests.faults")


# --- the matrix ---------------------------------------------------------------------


READERS_IN_PROCESS: dict[str, Callable[[Run], None]] = {
    "consumer": cell_consumer, "aio": cell_aio, "range": cell_range,
    "range-filtered": cell_range, "sac": cell_sac, "super": cell_super,
    "filtered": cell_filtered, "producer": cell_producer,
    "super-producer": cell_super_producer, **dict.fromkeys(SINKS, cell_sink),
}


def runner(path: str, fault: str) -> Callable[[Run], None]:
    if fault == "kill":
        return cell_kill_writer if path in WRITERS else cell_kill_reader
    if path.endswith("-interrupted") or (fault == "cancel"
                                         and path in ("producer", "super-producer")):
        return cell_interrupted_producer
    if fault == "cancel" and path != "aio":
        return cell_interrupted
    return READERS_IN_PROCESS[path]


def ensure_user() -> None:
    try:
        run_broker("ctl", "modern", "add_user", USER, PASSWORD, timeout=120)
    except subprocess.CalledProcessError as exc:
        if "already exists" not in exc.stderr:
            raise
    run_broker("ctl", "modern", "set_permissions", "-p", "/", USER, ".*", ".*", ".*",
               timeout=120)


def run_round(fault: str, paths: list[str], workdir: Path) -> list[Cell]:
    if any(p in SINKS for p in paths):
        import pystream.spark.sink  # noqa: F401  # once, before the cells' threads
    round_ = Round(fault)
    cells: list[Cell] = []
    threads = []
    for path in paths:
        if (path, fault) in NOT_APPLICABLE:
            cells.append(Cell(path, fault, reason=NOT_APPLICABLE[(path, fault)]))
            continue
        run = Run(round_, path, fault, workdir)
        round_.runs.append(run)
        cells.append(run.cell)
        threads.append(threading.Thread(target=_guard, args=(run, runner(path, fault)),
                                        daemon=True, name=run.tag))
    recoveries = _Recoveries()
    logging.getLogger("pystream").addHandler(recoveries)
    started = time.monotonic()
    try:
        for t in threads:
            t.start()
        if fault in BROKER_FAULTS and round_.runs:
            round_.inject()
        round_.end()
        limit = started + MIDWAY_WAIT + PAUSE + 3 * AFTER_FAULT
        for t in threads:
            t.join(max(0.0, limit - time.monotonic()))
    finally:
        logging.getLogger("pystream").removeHandler(recoveries)
    for run, t in zip(round_.runs, threads, strict=True):
        run.cell.recoveries = sum(run.tag in m for m in recoveries.messages)
        if t.is_alive():
            run.verdict_hint = run.verdict_hint or "hung: still running at the round's end"
        judge(run, round_)
    _clean(round_)
    return cells


def _guard(run: Run, target: Callable[[Run], None]) -> None:
    try:
        target(run)
    except BaseException as exc:
        run.verdict_hint = run.verdict_hint or f"raised {describe(exc)}"
        log.debug("cell %s/%s:\n%s", run.path, run.fault, traceback.format_exc())
    finally:
        run.halfway.set()
        run.cell.seconds = round(time.monotonic() - run.started, 1)


def judge(run: Run, round_: Round) -> None:
    c = run.cell
    check = run.check
    c.expected = int(run.expected.sum())
    if round_.fault not in BROKER_FAULTS:
        # The application's faults strike past half-way by construction.
        c.faulted_midway = check is not None
    if check is not None:
        c.read = check.consumed
        c.lost = check.lost(run.expected)
        c.duplicates = check.duplicates()
        c.out_of_order = check.out_of_order
        c.body_mismatches = check.body_mismatches
        c.unexpected = check.foreign + int((check.seen[:N][run.excluded] > 0).sum())
    reasons = []
    if round_.fault_error:
        reasons.append(round_.fault_error)
    if run.verdict_hint:
        reasons.append(run.verdict_hint)
    if check is None:
        reasons.append("nothing was read")
    else:
        if c.lost:
            first = int(np.nonzero(run.expected & (check.seen[:N] == 0))[0][0])
            reasons.append(f"{c.lost} of {c.expected} confirmed records never read "
                           f"(the first: {first})")
        if c.duplicates and c.promise == "exactly-once":
            reasons.append(f"{c.duplicates} records read twice")
        if c.out_of_order and c.promise == "exactly-once":
            reasons.append(f"{c.out_of_order} records out of order")
        if c.body_mismatches:
            reasons.append(f"{c.body_mismatches} bodies altered")
        if c.unexpected:
            reasons.append(f"{c.unexpected} records that were not to be read")
        if c.expected == 0:
            reasons.append("no record was confirmed")
    if round_.fault in BROKER_FAULTS and not reasons:
        if not c.faulted_midway:
            reasons.append("the fault struck before the cell was half-way")
        if not c.recoveries and not c.events:
            reasons.append("no recovery was logged: the fault missed the cell")
    c.verdict = "fail" if reasons else "pass"
    c.reason = "; ".join(reasons)


def _clean(round_: Round) -> None:
    try:
        with pystream.connect(URI, **client_options(round_.fault)) as admin:
            for run in round_.runs:
                for s in run.super_streams:
                    with contextlib.suppress(pystream.StreamError):
                        admin.delete_super_stream(s, missing_ok=True)
                for s in run.streams:
                    with contextlib.suppress(pystream.StreamError):
                        admin.delete_stream(s, missing_ok=True)
    except pystream.StreamError as exc:
        log.warning("could not delete the round's streams: %s", exc)


@dataclass
class Matrix:
    cells: list[Cell]
    seconds: float
    rounds: dict[str, float]

    def cell(self, path: str, fault: str) -> Cell | None:
        """The cell, if it was run."""
        return next((c for c in self.cells if (c.path, c.fault) == (path, fault)), None)

    def failing(self) -> list[Cell]:
        return [c for c in self.cells if c.verdict == "fail"]

    def summary(self) -> str:
        lines = [f"fault matrix: {len(PATHS)} paths x {len(FAULTS)} faults in "
                 f"{self.seconds:.0f} s"]
        for c in self.cells:
            if (c.path, c.fault) in NOT_APPLICABLE:
                continue
            lines.append(f"  {c.path:15} {c.fault:9} {c.verdict:4} {c.promise:13} "
                         f"read {c.read}/{c.expected} lost {c.lost} dup {c.duplicates} "
                         f"recoveries {c.recoveries} {c.seconds:5.1f} s"
                         + (f"  {c.reason}" if c.reason else ""))
        return "\n".join(lines)


def run_matrix(paths: list[str] | None = None, faults: list[str] | None = None) -> Matrix:
    """Every cell, a round per fault; the modern broker is up at the end."""
    paths = paths or list(PATHS)
    ensure_user()
    cells: list[Cell] = []
    rounds: dict[str, float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pystream-faults-") as tmp:
        for fault in faults or FAULTS:
            began = time.monotonic()
            cells += run_round(fault, paths, Path(tmp))
            rounds[fault] = round(time.monotonic() - began, 1)
            log.info("round %s: %.0f s", fault, rounds[fault])
    return Matrix(cells, round(time.monotonic() - started, 1), rounds)


def store(matrix: Matrix, path: str) -> None:
    """The cells, with commit, versions and machine (tools/results.py)."""
    info = results.machine(MODERN_URI)
    results.write_results(path, info, {
        "records_per_cell": N, "heartbeat": HEARTBEAT, "pause": PAUSE,
        "paths": PATHS, "faults": list(FAULTS), "seconds": matrix.seconds,
        "rounds": matrix.rounds, "cells": [asdict(c) for c in matrix.cells]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", help="comma-separated (default: all)")
    parser.add_argument("--faults", help="comma-separated (default: all)")
    parser.add_argument("--json", help="write the results there")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pystream").setLevel(logging.WARNING)
    with registered_session():
        matrix = run_matrix(args.paths.split(",") if args.paths else None,
                            args.faults.split(",") if args.faults else None)
    print(matrix.summary())
    if args.json:
        store(matrix, args.json)
    return 1 if matrix.failing() else 0


if __name__ == "__main__":
    sys.exit(main())
