"""bench_otel.py's paired windows: the metrics switched on and off within
one process, window after window.

Runs in separate processes (bench_otel.py's ``consume`` and ``publish``
rows) differ by more than the SDK's cost: their rates spread by up to a
third of a median here, and pairing neighbouring runs leaves a 95 %
interval some 9 points wide. Within one process, consuming or publishing
without a pause, consecutive windows of about a second share the
process's memory layout, threads, connections and the broker's state, so
pairs of neighbouring windows differ by little more than the mode.

Each group of windows takes every mode once, in a random order:

* ``off``: no instruments (as with OpenTelemetry absent: every hook tests
  one global and returns);
* ``sdk``: the SDK's instruments, and one collection of every instrument
  by a thread of its own at a random moment of the window, as a periodic
  reader collecting every second would (the window waits for it to end);
* ``sdk+chunk_size`` (consume): the same with ``rabbitmq.stream.chunk_size``
  recorded (``metrics.record_chunk_sizes``), one histogram value a chunk;
  the values still held when the window ends are recorded within it.

A consume window reads ``passes`` times the whole stream (a new consumer
from its first offset each time, so every window reads the same chunks); a
publish window sends batches of 10 000 for ``seconds`` (the producer waits
for confirms when its window is full, so what it sends is what the broker
takes). Each mode is compared with the ``off`` window of its group: the
median of those paired changes and its bootstrap 95 % interval.
"""

from __future__ import annotations

import random
import threading
import time

from bench import harness
from bench.harness import PROGRESS, make_body

MODES = {"consume": ("off", "sdk", "sdk+chunk_size"), "publish": ("off", "sdk")}
GROUPS = {"consume": 150, "publish": 100}


class Collector:
    """Collects every instrument once when asked, on its own thread (as a
    periodic reader does), timing its CPU."""

    def __init__(self, reader) -> None:
        self.reader = reader
        self.asked, self.done = threading.Event(), threading.Event()
        self.cpu = 0.0
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self) -> None:
        while True:
            self.asked.wait()
            self.asked.clear()
            t0 = time.thread_time()
            self.reader.get_metrics_data()
            self.cpu += time.thread_time() - t0
            self.done.set()


class Modes:
    """Switches pystream's instruments on and off between windows."""

    def __init__(self) -> None:
        from opentelemetry import metrics as otel
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from pystream import metrics
        self.metrics = metrics
        reader = InMemoryMetricReader()
        otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
        self.instruments = metrics.instruments()
        self.collector = Collector(reader)

    def set(self, mode: str) -> None:
        # The module's own switch: None is what OpenTelemetry absent leaves.
        self.metrics._instruments = None if mode == "off" else self.instruments
        self.metrics.record_chunk_sizes(mode == "sdk+chunk_size")


class ModeWindow:
    """One window: wall and process CPU time, the collection's CPU, and
    a collection at a random moment when the mode has instruments."""

    def __init__(self, modes: Modes, mode: str) -> None:
        self.modes, self.mode = modes, mode
        modes.set(mode)
        self.fire = (time.perf_counter() + random.uniform(0.1, 0.5)
                     if mode != "off" else None)
        self.cpu0, self.t0 = time.process_time(), time.perf_counter()
        self.collector_cpu0 = modes.collector.cpu

    def tick(self) -> None:
        if self.fire is not None and time.perf_counter() >= self.fire:
            self.fire = None
            self.modes.collector.asked.set()

    def stop(self, messages: int) -> dict:
        collector = self.modes.collector
        flushed = 0.0
        if self.mode != "off":
            if self.fire is not None:   # a window shorter than its moment
                collector.asked.set()
            collector.done.wait()
            collector.done.clear()
        if self.mode == "sdk+chunk_size":
            # The values held since the collection are this window's: the
            # next collection would record them, in another mode's window.
            metrics = self.modes.metrics
            metrics.record_chunk_sizes(False)
            t0 = time.thread_time()
            metrics.flush_chunk_sizes()
            flushed = time.thread_time() - t0
        return {"mode": self.mode, "messages": messages,
                "seconds": time.perf_counter() - self.t0,
                "cpu": time.process_time() - self.cpu0,
                "sdk_cpu": collector.cpu - self.collector_cpu0 + flushed}


def consume_window(client, modes: Modes, mode: str, stream: str, end: int,
                   passes: int) -> dict:
    window = ModeWindow(modes, mode)
    n = 0
    for _ in range(passes):
        with client.consumer(stream, offset="first") as consumer:
            for batch in consumer:
                n += batch.num_rows
                PROGRESS[0] += batch.num_rows
                window.tick()
                if consumer.position >= end:
                    break
    return window.stop(n)


def publish_window(producer, batch, modes: Modes, mode: str, seconds: float) -> dict:
    window = ModeWindow(modes, mode)
    n = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        producer.send_batch(batch)
        n += len(batch)
        PROGRESS[0] += len(batch)
        window.tick()
    return window.stop(n)


def groups_of(one, names: tuple[str, ...], groups: int) -> list[dict]:
    """A window of each mode to warm up (not kept), then ``groups`` groups,
    each taking the modes in a random order."""
    for mode in names:
        one(mode)
    return [{"group": g, **one(mode)} for g in range(groups)
            for mode in random.sample(names, len(names))]


def run(uri: str, kind: str, stream: str, end: int, groups: int,
        passes: int, seconds: float, body: int) -> dict:
    """Every group's windows, in the child (the SDK imported here)."""
    import pyarrow as pa

    import pystream
    modes = Modes()
    names = MODES[kind]
    with pystream.connect(uri) as client:
        if kind == "consume":
            return {"windows": groups_of(lambda mode: consume_window(
                client, modes, mode, stream, end, passes), names, groups)}
        batch = pa.array([make_body(body)] * 10_000, pa.binary())
        with client.producer(stream) as producer:
            windows = groups_of(lambda mode: publish_window(
                producer, batch, modes, mode, seconds), names, groups)
            producer.flush(300)
        return {"windows": windows}


def summarize(kind: str, windows: list[dict], body: int) -> dict:
    """Each mode's medians (``harness.summarize``), and its paired changes
    against the off window of the same group (``harness.paired_changes``)
    with the collections' share of its CPU."""
    by_group: dict[int, dict[str, dict]] = {}
    for w in windows:
        by_group.setdefault(w["group"], {})[w["mode"]] = w
    out: dict = {"groups": len(by_group), "modes": {}}
    for mode in MODES[kind]:
        entry = harness.summarize([w for w in windows if w["mode"] == mode], body)
        if mode != "off":
            pairs = [(g[mode], g["off"]) for g in by_group.values()
                     if mode in g and "off" in g]
            entry.update(harness.paired_changes(pairs),
                         sdk_cpu_share=harness.quartiles(
                             [x["sdk_cpu"] / x["cpu"] for x, _ in pairs]))
        out["modes"][mode] = entry
    return out
