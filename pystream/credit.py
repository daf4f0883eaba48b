"""Credit flow: how many chunks a subscription lets the broker send ahead.

The broker sends one chunk per credit. Too little credit leaves the socket
idle while the application works; too much fills memory when the
application is slower than the stream. This module is the only place that
decides: a :class:`Credit` policy says what to aim for, and a
:class:`CreditController` per subscription applies it to what it sees
(chunks granted, arrived, queued and handed to the application).

Policies:

``Credit.adaptive(max_buffered_bytes=64 MiB, max_outstanding=64)`` (default)
    Keeps ``outstanding × chunk size + queued bytes <= max_buffered_bytes``
    and at most ``max_outstanding`` chunks in flight. An application that
    keeps up has an empty queue, so the whole budget (up to
    ``max_outstanding`` chunks, far more than the bandwidth-delay product of
    a LAN) is in flight and the socket stays full; a slow one fills the
    queue, and granting stops until it drains. Memory stays under
    ``max_buffered_bytes`` plus one chunk, however long the stream. The chunk
    size is estimated by a slowly decaying maximum of recent chunks (it
    starts at the frame size limit), so a burst of large chunks cannot
    overshoot by much. At least one credit is kept while the queue is empty,
    so a budget smaller than a chunk still makes progress. With ``until``
    (an offset), no more is granted than the chunks still needed to reach
    it, judged by the records of recent chunks, and none once a chunk
    reaching it arrived: a reader of a range fetches few chunks past its
    end (without it, up to ``max_outstanding``: twice the chunks of a range
    of 500 000 records of 100 B).
``Credit.on_arrival(initial=10)``
    Grants one credit per chunk as it arrives (the Java client's default).
    Decoded chunks stay within ``max_buffered_bytes`` as with every policy,
    but chunks waiting undecoded are not bounded: use it only if the
    application is faster than the stream.
``Credit.on_consumed(initial=10, ratio=0.5)``
    Grants one credit once ``ratio`` of a chunk's records were handed to the
    application (the Go client's and the Java client's alternative).
``Credit.manual(initial=1)``
    Grants only what ``Consumer.grant_credit(n)`` asks for.

Sizes are counted in decoded bytes, known from a chunk's headers before
anything is inflated or allocated (``Chunk.decoded_size``: the Deliver
frame, which views of the decoded batch point into, the uncompressed size
each compressed sub-batch declares, and 32 bytes a record for the offset,
timestamp and body view columns). Every policy admits a chunk before it is
decoded (``admit``): it decodes at once if it fits the budget
(``max_buffered_bytes``, 64 MiB by default) beside what is queued, or if
nothing is queued; otherwise it waits undecoded, counted at its frame's
size, and decodes when it reaches the head of the queue. So decoded
chunks queued never pass the budget, plus the one chunk at the head
(itself bounded by ``max_chunk_size``), whatever the compression ratio.
A chunk the broker sends beyond the credit granted is counted against the
budget too, and one that does not fit is a ``ProtocolError``: nothing
arrives unaccounted. The adaptive policy starts with two chunks in flight
and sizes its window once chunks arrive, so the bound holds for chunks
much larger than the frame size limit (the broker sends a chunk whole;
8 MB chunks are common).

The broker takes the credit of the Subscribe command as its reference: while
a subscription's credit is at or below half of it, further Credit commands
do not restart delivery (measured on RabbitMQ 4.0). Hence ``subscribe_credit``:
subscribe with one credit and send the rest in a Credit command at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import ProtocolError

Mode = Literal["adaptive", "on_arrival", "on_consumed", "manual"]

MAX_CREDIT = 0xFFFF  # the Credit and Subscribe fields are u16
SLOW_START = 2       # adaptive: chunks in flight before a chunk size is known


def subscribe_credit(credits: int) -> tuple[int, int]:
    """Split ``credits`` into (in the Subscribe command, in a Credit command
    right after it); see the module documentation."""
    first = min(credits, 1)
    return first, credits - first


@dataclass(frozen=True)
class Credit:
    """A credit policy; build one with the class methods."""

    mode: Mode = "adaptive"
    initial: int = 0
    max_buffered_bytes: int = 64 << 20
    max_outstanding: int = 64
    ratio: float = 0.5
    until: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("adaptive", "on_arrival", "on_consumed", "manual"):
            raise ValueError(f"unknown credit mode {self.mode!r}")
        if self.mode == "adaptive":
            if self.max_buffered_bytes < 1 or not 1 <= self.max_outstanding <= MAX_CREDIT:
                raise ValueError("max_buffered_bytes must be positive and "
                                 "max_outstanding in [1, 65535]")
        elif not 0 <= self.initial <= MAX_CREDIT:
            raise ValueError("initial credit must be in [0, 65535]")
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError("ratio must be in (0, 1]")

    @classmethod
    def adaptive(cls, max_buffered_bytes: int = 64 << 20,
                 max_outstanding: int = 64, until: int | None = None) -> Credit:
        """The default: up to ``max_outstanding`` chunks in flight while the
        application keeps up, and no more credit once queued plus in-flight
        chunks would pass ``max_buffered_bytes`` (decoded bytes). With
        ``until``, no more than the chunks that offset still needs, as
        their record counts so far tell (``read_range`` sets it to the
        range's end)."""
        return cls("adaptive", max_buffered_bytes=max_buffered_bytes,
                   max_outstanding=max_outstanding, until=until)

    @classmethod
    def on_arrival(cls, initial: int = 10) -> Credit:
        """One credit per chunk received, ``initial`` at first (the Java
        client's default); unbounded if the application is slower than the
        stream."""
        return cls("on_arrival", initial=initial)

    @classmethod
    def on_consumed(cls, initial: int = 10, ratio: float = 0.5) -> Credit:
        """One credit once ``ratio`` of a chunk's records were handed to the
        application, ``initial`` at first."""
        return cls("on_consumed", initial=initial, ratio=ratio)

    @classmethod
    def manual(cls, initial: int = 1) -> Credit:
        """``initial`` credits, then only what ``Consumer.grant_credit(n)``
        grants."""
        return cls("manual", initial=initial)


class CreditController:
    """One subscription's credit state. Not thread-safe: the consumer calls
    it under its lock. Each method returns the credits to send now (0 for
    none)."""

    def __init__(self, policy: Credit, chunk_size_hint: int) -> None:
        self.policy = policy
        self.chunk_estimate = max(1, chunk_size_hint)
        self.sized = False      # a chunk arrived: the estimate is measured
        self.outstanding = 0    # granted, chunk not yet arrived
        self.queued_bytes = 0   # admitted, not yet handed to the application
        self.generation = 0     # counts emptied(): admissions before it are void
        self.unsent = 0         # granted here, not yet claimed for a Credit command
        self.received: int | None = None  # offset after the last chunk arrived
        self.chunk_records = 1  # records of a chunk (decaying maximum)

    def start(self) -> int:
        """Credits for the Subscribe command (a new or resumed subscription;
        whatever was granted before is gone with the old subscription)."""
        p = self.policy
        if p.mode == "adaptive":
            self.outstanding = 0
            credits = self._adaptive_grant(threshold=False)
            if not self.sized:
                credits = self.outstanding = min(credits, SLOW_START)
        else:
            credits = self.outstanding = p.initial
        self.unsent = 0  # the Subscribe carries these; earlier grants are void
        return credits

    def claim(self, n: int) -> int:
        """Of ``n`` credits a method returned, how many to send now: none
        granted before the last ``start`` (a send that lost a race with a
        resubscription would give the new subscription more than counted)."""
        n = min(n, self.unsent)
        self.unsent -= n
        return n

    def admit(self, size: int, decoded_size: int) -> bool:
        """A chunk of ``size`` wire bytes arrived, to hold ``decoded_size``
        bytes decoded: whether to decode it now (it fits the budget beside
        what is queued, or nothing is queued), else it is counted at
        ``size`` until ``inflated``. Raises ``ProtocolError`` for a chunk
        beyond the credit granted that does not fit."""
        beyond = self.outstanding == 0
        if not beyond:
            self.outstanding -= 1
        # Decaying maximum: follows smaller chunks slowly, larger ones at once.
        est = self.chunk_estimate
        if decoded_size < est:
            est -= (est - decoded_size) // 16
        self.chunk_estimate = est if est > decoded_size else decoded_size
        self.sized = True
        budget = self.policy.max_buffered_bytes
        fits = (self.queued_bytes == 0
                or self.queued_bytes + decoded_size <= budget)
        if beyond and not fits:
            raise ProtocolError(
                f"the broker sent a chunk without credit, and its "
                f"{decoded_size} bytes decoded pass the consumer's "
                f"max_buffered_bytes ({budget}) with {self.queued_bytes} queued")
        self.queued_bytes += decoded_size if fits else size
        return fits

    def arrived(self, size: int, next_offset: int | None = None,
                records: int = 1) -> int:
        """``admit`` and ``queued`` at once, for a chunk that decodes to
        ``size`` bytes."""
        self.admit(size, size)
        return self.queued(next_offset, records)

    def queued(self, next_offset: int | None = None, records: int = 1) -> int:
        """An admitted chunk of ``records`` records, ending before
        ``next_offset``, was queued."""
        if next_offset is not None and (self.received is None
                                        or next_offset > self.received):
            self.received = next_offset
        n = self.chunk_records
        if records < n:
            records = n - (n - records) // 16
        self.chunk_records = records if records > 1 else 1
        mode = self.policy.mode
        if mode == "on_arrival":
            return self._grant(1)
        if mode == "adaptive":
            return self._adaptive_grant(threshold=True)
        return 0

    def dropped(self, cost: int, generation: int) -> None:
        """A chunk admitted at ``generation`` and counted at ``cost`` was
        dropped before it was queued."""
        if generation == self.generation:
            self.queued_bytes = max(0, self.queued_bytes - cost)

    def inflated(self, size: int, decoded_size: int) -> None:
        """A chunk counted at its wire ``size`` was decoded at the head of
        the queue."""
        self.queued_bytes += decoded_size - size

    def emptied(self) -> None:
        """Everything queued was dropped without reaching the application,
        to be read again from an earlier offset."""
        self.queued_bytes = 0
        self.generation += 1
        self.received = None

    def handed(self, size: int, fraction_before: float,
               fraction_after: float) -> int:
        """Records of a queued chunk went to the application: the share of
        the chunk handed so far moved from ``fraction_before`` to
        ``fraction_after``; ``size`` (what it was counted at) is released
        when it reaches 1."""
        if fraction_after >= 1.0:
            left = self.queued_bytes - size
            self.queued_bytes = left if left > 0 else 0
        mode = self.policy.mode
        if mode == "adaptive":
            return self._adaptive_grant(threshold=True)
        if mode == "on_consumed":
            r = self.policy.ratio
            if fraction_before < r <= fraction_after:
                return self._grant(1)
        return 0

    def manual(self, n: int) -> int:
        if n < 0:
            raise ValueError("credit must be >= 0")
        return self._grant(n)

    def _adaptive_grant(self, *, threshold: bool) -> int:
        p = self.policy
        budget = p.max_buffered_bytes - self.queued_bytes
        target = budget // self.chunk_estimate if budget > 0 else 0
        if target > p.max_outstanding:
            target = p.max_outstanding
        if target == 0 and self.queued_bytes == 0:
            target = 1  # a budget below one chunk must still make progress
        if p.until is not None and self.received is not None:
            left = p.until - self.received
            target = min(target, max(0, -(-left // self.chunk_records)))
        missing = target - self.outstanding
        # Top up in steps of a quarter of the target, not one frame a chunk.
        if missing <= 0 or (threshold and missing < target // 4):
            return 0
        return self._grant(missing)

    def _grant(self, n: int) -> int:
        n = min(n, MAX_CREDIT)
        self.outstanding += n
        self.unsent += n
        return n
