"""The watermark window of one chunk: where its read stands against the log
(``Window``, shared by every chunked task) and, for a snapshot chunk, which
selected rows may still be emitted (``ChunkWindow``).

DBLog's rule: the chunk was selected between a low and a high watermark.  A
row whose key a binlog event changed *inside* the window may be older than
what that event already delivered (or newer than what comes before it), so
it is dropped from the chunk: the log carries that key's state, and full row
images make every event a complete image of the row.  What is left is
emitted, as READ changes, once the log is past the high watermark; every
later event then comes after it in the stream, as it did on the source.

Dropping is always safe (a dropped key is delivered by its event), so the
window may be held open longer than needed, never shorter: it opens no later
than the low watermark and closes no earlier than the high one.

Phases:
  WAIT_LOW  selected; the low watermark is not yet in the processed log.
            Events here are before the select: the chunk includes them.
  OPEN      inside the window: changed keys are dropped.
  CLOSING   past the high watermark; still dropping until the rows are
            emitted at the next transaction boundary of the stream.

Verify keeps the same windows with its own rule for a change inside one:
it applies the change to the chunk instead of dropping the key
(verify/coordinator.py).

This module is pure (no I/O); the coordinators feed it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

from cynomys.core.gtid import GtidSet
from cynomys.core.model import Change, Position, Row, TableSchema, Value


class Phase(str, Enum):
    WAIT_LOW = "wait_low"
    OPEN = "open"
    CLOSING = "closing"


@dataclass(frozen=True)
class GtidMarks:
    """Read-only watermarks (Debezium): executed GTID sets before and after
    the select, made exact with the binlog position of the select's
    consistent snapshot where the server reports one (MariaDB).

    MariaDB adds a transaction to ``@@gtid_binlog_pos`` when it is written to
    the binlog, a moment *before* InnoDB makes it visible; a transaction in
    the low set may thus be invisible to the select.  Taken alone the low set
    would call it "before the window" and let the chunk's older row overwrite
    it.  ``snapshot_pos`` (``Binlog_snapshot_position`` of START TRANSACTION
    WITH CONSISTENT SNAPSHOT) is exactly where the select's view ends, so
    a transaction is before the window only if it is in the low set *and*
    begins before that position.  MySQL updates ``@@gtid_executed`` after the
    engine commit, so there the low set alone is safe (``snapshot_pos`` None).

    ``high_end`` is the binlog end read after the high set: once the log is
    processed up to it (a commit or a heartbeat at or past it) every
    transaction of the high set has been seen, even when the source is idle.
    """

    low: GtidSet
    high: GtidSet
    high_end: Position
    snapshot_pos: Position | None = None

    def before_window(self, gtid: str, begin: Position) -> bool:
        if not self.low.contains(gtid):
            return False
        return self.snapshot_pos is None or begin < self.snapshot_pos

    def past_high(self, gtid: str) -> bool:
        """A transaction not in the high set was written after it: every
        transaction of the high set precedes it in the binlog."""
        return bool(gtid) and not self.high.contains(gtid)

    def reached(self, end: Position) -> bool:
        return self.high_end <= end

    def to_dict(self) -> dict[str, str]:
        return {"low": str(self.low), "high": str(self.high), "high_end": str(self.high_end),
                "snapshot_pos": str(self.snapshot_pos) if self.snapshot_pos else ""}


@dataclass
class Window:
    """Where one chunk's read stands against the processed log: its phase,
    and the watermarks that move it (DBLog: the UUIDs written before and
    after the read; read-only: the GTID sets around it).  Every chunked task
    (snapshot, verify) keeps one per read in flight; what a change *inside*
    the window does to the chunk is the task's own business."""

    phase: Phase
    low_uuid: str = ""
    high_uuid: str = ""
    marks: GtidMarks | None = None
    opened: float = field(default_factory=time.monotonic)   # when the read ran (monotonic)
    warned: bool = False                                     # the "not seen in the log" warning was logged

    @classmethod
    def of_gtid(cls, marks: GtidMarks, processed: Position) -> Window:
        """A read-only window, seen from ``processed`` (the end of the log the
        producer has handled): closed at once when the log is already past
        the high set (an idle source), open otherwise."""
        return cls(Phase.CLOSING if marks.reached(processed) else Phase.OPEN, marks=marks)

    @property
    def closing(self) -> bool:
        return self.phase is Phase.CLOSING

    def on_watermark(self, uuid: str) -> None:
        """A row of the watermark table came by in the log."""
        if uuid == self.low_uuid and self.phase is Phase.WAIT_LOW:
            self.phase = Phase.OPEN
        elif uuid == self.high_uuid:
            self.phase = Phase.CLOSING

    def on_commit(self, gtid: str, end: Position) -> None:
        """The log was processed up to ``end`` (a commit of ``gtid``, or a
        heartbeat with ``gtid`` empty): read-only windows close past the high set."""
        if self.marks is None or self.phase is not Phase.OPEN:
            return
        if self.marks.past_high(gtid) or self.marks.reached(end):
            self.phase = Phase.CLOSING

    def sees(self, change: Change) -> bool:
        """Is ``change`` inside the window (or after it)?  Before the low
        watermark the read saw it; so it did a transaction of the low GTID
        set that its view holds."""
        if self.phase is Phase.WAIT_LOW:
            return False
        if self.marks is not None and self.phase is Phase.OPEN and self.marks.before_window(change.tid, change.txn):
            return False
        return True


class ChunkWindow:
    """The rows of one snapshot chunk while its window is open (the window
    itself: ``Window``).

    The rows are kept as read (key order); the key -> row index is built
    only when the log first changes the table inside the window (a few
    microseconds a row that a quiet table never pays).  A keyless table
    (read whole) is *dirty* as soon as any event touches the table in the
    window: it cannot tell rows apart, so the read is thrown away and done
    again."""

    __slots__ = ("database", "table", "key_indexes", "_rows", "_index", "_bounds", "selected", "dropped", "dirty")

    def __init__(self, database: str, table: str, key_indexes: Sequence[int], rows: Sequence[Row] = (),
                 ordered: bool = False) -> None:
        self.database = database
        self.table = table
        self.key_indexes = tuple(key_indexes)
        self._rows: list[Row] = list(rows)
        self._index: dict[tuple[Value, ...], Row] | None = None
        # (first key, last key) when Python orders the keys as the server's
        # ORDER BY did (``ordered``: numbers): a change outside them leaves
        # the index unbuilt.  With writers going, nearly every window sees
        # some change of a big table, almost never one of its own rows: the
        # index was 9% of the producer's CPU in a 2M-row initial load.
        self._bounds: tuple[tuple[Value, ...], tuple[Value, ...]] | None = None
        if ordered and self._rows and self.key_indexes:
            idx = self.key_indexes
            self._bounds = (tuple(self._rows[0][i] for i in idx), tuple(self._rows[-1][i] for i in idx))
        self.selected = len(self._rows)
        self.dropped = 0
        self.dirty = False

    @classmethod
    def of(cls, database: str, table: str, key_indexes: Sequence[int], rows: Sequence[Row],
           ordered: bool = False) -> ChunkWindow:
        """``ordered``: the rows are in key order and Python compares the key
        columns' values as the server does (``python_ordered``)."""
        return cls(database, table, key_indexes, rows, ordered)

    @property
    def rows(self) -> dict[tuple[Value, ...], Row]:
        """primary key -> row (model values, key order kept)."""
        if self._index is None:
            idx = self.key_indexes
            self._index = {tuple(r[i] for i in idx): r for r in self._rows}
        return self._index

    def drop_key(self, key: tuple[Value, ...]) -> None:
        """The log carries this key's state: its row leaves the chunk."""
        if self._index is None and self._bounds is not None:
            lo, hi = self._bounds
            try:
                if key < lo or key > hi:
                    return
            except TypeError:  # a value of another type: the index decides
                pass
        if self.rows.pop(key, None) is not None:
            self.dropped += 1

    def _drop(self, image: Row | None) -> None:
        if image is None:
            return
        self.drop_key(tuple(image[i] for i in self.key_indexes))

    def on_change(self, change: Change, in_window: bool) -> None:
        """A row change of this chunk's table, ``in_window`` as the
        watermarks classify it."""
        if not in_window:
            return
        if not self.key_indexes:
            self.dirty = True
            return
        # Both images: an UPDATE that moves a row to another key changes both.
        self._drop(change.before)
        self._drop(change.after)

    def remaining(self) -> list[Row]:
        if not self.key_indexes or self._index is None:
            return list(self._rows)
        return list(self._index.values())


#: Key column types whose values Python orders as the server does (numbers:
#: no collation, no zero dates held as text).
_PYTHON_ORDERED = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint",
                             "decimal", "numeric", "dec", "fixed"})


def python_ordered(schema: TableSchema) -> bool:
    """Whether every key column of ``schema`` is of a ``_PYTHON_ORDERED`` type."""
    return bool(schema.key) and all(schema.columns[i].base_type in _PYTHON_ORDERED for i in schema.key_indexes())
