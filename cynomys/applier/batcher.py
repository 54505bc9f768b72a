"""Delay commit: buffer net changes across envelopes, flush in large batches.

Column stores pay dearly per statement (a DELETE or INSERT touches whole
column extents), so the paper's applier buffers changes and commits them in
bulk.  Changes to one (table, key) fold across envelopes with the producer's
rules table (reducer.fold), so a row updated 100 times between flushes is
written once.

A flush must end on a source transaction boundary (Databus's consistency
window): the buffer only reports itself flushable when the last envelope
it took was ``complete``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from cynomys.core.columnar import row_count
from cynomys.core.model import Batch, Change, Position
from cynomys.reducer.fold import Folder

# A place in the source's change stream: a transaction's start position and
# how many of its changes come before that place (0 = the whole transaction).
Mark = tuple[tuple[int, str, int], int]


@dataclass(frozen=True)
class Span:
    """The stretch of the source one envelope covers, from its ``meta``
    (written by the producer): ``start`` where its first change is, ``stop``
    where the next envelope's first change will be at the earliest."""

    start: Mark
    stop: Mark

    @classmethod
    def of(cls, batch: Batch) -> Span | None:
        m = batch.meta
        if "from" not in m:
            return None  # an older producer's envelope
        start = (Position.parse(m["from"]).sort_key(), int(m.get("from_n", "0")))
        if batch.complete:
            stop = (batch.end.sort_key(), 0)
        else:
            stop = (Position.parse(m["to"]).sort_key(), int(m["to_n"]))
        return cls(start, stop)

    def describe_start(self) -> str:
        return self.describe(self.start)

    @staticmethod
    def describe(mark: Mark) -> str:
        (_, file, pos), n = mark
        return f"{file}:{pos}" + (f" (after {n} changes of that transaction)" if n else "")


@dataclass
class DelayBuffer:
    """Net changes buffered since the last flush.

    Two parts: ``sealed`` holds whole transactions; ``folder`` the stretch
    taken since, which may end inside a transaction cut into fragments.
    When a fragmented transaction starts, what precedes it is sealed, so if
    the producer ever sends that transaction again its earlier attempt can
    be dropped alone (``discard``) without flushing first."""

    buffer_rows: int
    max_delay_s: float
    # How long envelopes that brought no changes (a partition's envelopes
    # holding only other partitions' tables) may wait before their progress
    # is committed alone; None: max_delay_s, like any other.
    progress_delay_s: float | None = None
    folder: Folder = field(default_factory=Folder)
    sealed: Folder | None = None
    raw_rows: int = 0
    sealed_rows: int = 0
    envelopes: int = 0                    # envelopes taken since the last flush (even empty ones)
    oldest: float = 0.0                   # monotonic time of the oldest envelope taken
    complete: bool = True                 # the last batch taken ends a source transaction
    end: Position | None = None           # position after the last complete batch taken
    last_commit_ts: int = 0
    base: Mark | None = None              # where the open part (``folder``) starts
    covered: Mark | None = None           # where the last envelope taken stops
    sealed_stop: Mark | None = None       # where the sealed part stops
    # What the buffered changes cost in memory, estimated (applier/spill.py),
    # and the sealed part's share of it.
    cost: int = 0
    sealed_cost: int = 0

    def __len__(self) -> int:
        return self.raw_rows

    def held(self) -> int:
        """Net changes held after folding (what the buffer costs in memory and
        what the flush writes); at most ``len(self)``, the raw changes taken.
        Updates of a few hot keys fold into few net changes."""
        return self.folder.net_count() + (self.sealed.net_count() if self.sealed is not None else 0)

    def add(self, changes: list[Change] | tuple[Change, ...]) -> None:
        self.folder.extend(changes)
        self.raw_rows += row_count(changes)  # an InsertRun is many rows

    def charge(self, cost: int) -> None:
        """Add the estimated memory of the changes just added (applier/spill.py)."""
        self.cost += cost

    def seal(self) -> None:
        """What is buffered is whole transactions: keep it apart from what comes next."""
        if self.sealed is None:
            self.sealed = self.folder
        else:
            self.sealed.extend(self.folder.changes())
        self.folder = Folder()
        self.sealed_rows = self.raw_rows
        self.sealed_cost = self.cost
        self.sealed_stop = self.covered
        self.base = None

    def take_sealed(self) -> list[Change]:
        """The whole transactions set apart by ``seal``, to be committed
        before the open part is applied in parts (applier/spill.py)."""
        changes = self.sealed.changes() if self.sealed is not None else []
        self.sealed = None
        self.raw_rows -= self.sealed_rows
        self.cost -= self.sealed_cost
        self.sealed_rows = self.sealed_cost = 0
        self.sealed_stop = None
        return changes

    def take_open(self) -> list[Change]:
        """The open part (nothing sealed may be left: ``take_sealed``
        first), applied as one part of its transaction.  The buffer still
        counts its envelopes and knows where the transaction started
        (``base``): a flush must wait for the transaction's end, and a
        producer sending it again from its start is recognised."""
        assert self.sealed is None, "commit the sealed part first"
        changes = self.folder.changes()
        self.folder = Folder()
        self.raw_rows = self.cost = 0
        return changes

    def mark(self, end: Position, complete: bool, last_commit_ts: int) -> None:
        """Record where the envelope just taken ends.  An envelope with no
        changes still moves the state, which must be committed too."""
        if not self.envelopes:
            self.oldest = time.monotonic()
        self.envelopes += 1
        self.complete = complete
        if complete:
            self.end = end
            self.last_commit_ts = max(self.last_commit_ts, last_commit_ts)

    def cover(self, span: Span) -> None:
        if self.base is None:
            self.base = span.start
        self.covered = span.stop

    def age(self) -> float:
        return time.monotonic() - self.oldest if self.envelopes else 0.0

    def due(self) -> bool:
        """Time to flush: full or old enough, and on a transaction boundary."""
        if not self.envelopes or not self.complete:
            return False
        return self.raw_rows >= self.buffer_rows or self.age() >= self.delay_s()

    def delay_s(self) -> float:
        """The age at which the buffer is due: longer when it holds only progress."""
        if self.raw_rows == 0 and self.progress_delay_s is not None:
            return max(self.max_delay_s, self.progress_delay_s)
        return self.max_delay_s

    def wait_s(self) -> float:
        """How long the loop may block before the buffer is due by age."""
        if not self.envelopes or not self.complete:
            return 0.5
        return max(0.0, min(0.5, self.delay_s() - self.age()))

    def discard(self) -> None:
        """Drop the open part (an obsolete attempt of a large transaction)."""
        self.folder = Folder()
        self.raw_rows = self.sealed_rows
        self.cost = self.sealed_cost
        self.complete = True
        self.base = None
        self.covered = self.sealed_stop

    def take(self) -> list[Change]:
        if self.sealed is not None:
            self.sealed.extend(self.folder.changes())
            self.folder = self.sealed
        changes = self.folder.changes()
        self.folder = Folder()
        self.sealed = None
        self.raw_rows = self.sealed_rows = 0
        self.cost = self.sealed_cost = 0
        self.envelopes = 0
        self.base = self.sealed_stop = None
        return changes
