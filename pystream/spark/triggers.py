"""How much a streaming micro-batch admits: ``maxOffsetsPerTrigger`` (the
JVM connector's ``maxRecordsPerTrigger``), ``maxBytesPerTrigger``, and
``minOffsetsPerTrigger`` with ``maxTriggerDelay``, as Spark's Kafka source
and the JVM connector read them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pyarrow.compute as pc

from ..client import Client
from ..credit import Credit
from .options import int_option

#: Kafka's default for maxTriggerDelay.
DEFAULT_DELAY = 15 * 60.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class TriggerLimits:
    max_offsets: int | None = None
    max_bytes: int | None = None
    min_offsets: int | None = None
    max_delay: float = DEFAULT_DELAY

    @classmethod
    def parse(cls, opts: dict[str, str]) -> TriggerLimits:
        return cls(max_offsets=int_option(opts, "maxoffsetspertrigger", 1),
                   max_bytes=int_option(opts, "maxbytespertrigger", 1),
                   min_offsets=int_option(opts, "minoffsetspertrigger", 1),
                   max_delay=duration(opts.get("maxtriggerdelay"), DEFAULT_DELAY))

    def admit(self, client: Client, starts: dict[str, int], ends: dict[str, int],
              since_last: float, available_now: bool) -> dict[str, int]:
        """The ends of the next micro-batch: ``starts`` (no batch) while
        fewer than ``min_offsets`` wait and ``max_delay`` has not passed
        since the last one (not under Trigger.AvailableNow, which would
        wait forever); else cut to ``max_offsets`` and ``max_bytes``."""
        waiting = sum(ends[s] - starts[s] for s in ends)
        if (self.min_offsets and not available_now and waiting < self.min_offsets
                and since_last < self.max_delay):
            return dict(starts)
        if self.max_offsets:
            ends = share(starts, ends, self.max_offsets)
        if self.max_bytes and waiting:
            sizes = {s: entry_size(client, s, starts[s])
                     for s in ends if ends[s] > starts[s]}
            weighted = sum(sizes[s] * (ends[s] - starts[s]) for s in sizes)
            mean = weighted / max(1, sum(ends[s] - starts[s] for s in sizes))
            ends = share(starts, ends, max(1, int(self.max_bytes // max(mean, 1.0))))
        return ends


def share(starts: dict[str, int], ends: dict[str, int], budget: int) -> dict[str, int]:
    """Cut each stream's waiting offsets so the total is at most ``budget``,
    in proportion to what each has waiting (at least one offset for the
    stream with the most, so a batch always makes progress)."""
    waiting = {s: ends[s] - starts[s] for s in ends}
    total = sum(waiting.values())
    if total <= budget:
        return ends
    admitted = {s: starts[s] + math.floor(budget * n / total) for s, n in waiting.items()}
    if admitted == starts:
        busiest = max(waiting, key=waiting.__getitem__)
        admitted[busiest] += 1
    return admitted


def entry_size(client: Client, stream: str, offset: int) -> float:
    """Mean bytes per record of the chunk holding ``offset`` (the next one
    to read): the estimate behind ``maxBytesPerTrigger``."""
    with client.consumer(stream, offset=offset, amqp=False, body="binary",
                         credit=Credit.adaptive(max_outstanding=1)) as consumer:
        for batch in consumer.batches(timeout=1.0):
            # pyarrow-stubs type binary_length for the concrete array classes only
            lengths = pc.binary_length(batch.column("body"))  # type: ignore[call-overload]
            total: int = pc.sum(lengths).as_py()
            return total / batch.num_rows
    return 1.0


def duration(text: str | None, default: float) -> float:
    """Seconds in ``text``: ``30``, ``500ms``, ``30s``, ``15m``, ``1h``, ``1d``."""
    if text is None:
        return default
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in ("", *_UNITS):
        raise ValueError(f"option maxTriggerDelay is a duration like 30s, 15m or "
                         f"1h, not {text!r}")
    return float(match.group(1)) * _UNITS.get(match.group(2), 1.0)
