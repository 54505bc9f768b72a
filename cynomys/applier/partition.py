"""Partitioned appliers: N appliers share the work of one producer by table.

A table belongs to partition ``crc32("db.table") mod N`` (Databus's mod
partitioning; crc32, never Python's ``hash()``, which changes per process).
Partition ``i``:

* reads the whole stream through a consumer group of its own
  (``<consumer_group>.p<i>``) and opens every envelope (decryption cannot be
  split: an envelope holds the changes of many tables under one data key);
* keeps only its tables' changes (``Partitioning.select``), so its flushes,
  still cut at source transaction boundaries, hold its part of each source
  transaction: atomic per partition, not across partitions;
* keeps its own applied state on the target under the key
  ``<producer>#p<i>`` (``PartitionTarget`` translates, so the targets and
  the applier loop are unchanged), beside a layout record
  ``<producer>#partitions`` whose ``seq`` is N.  With N = 1 the state key
  is the producer id, as before partitioning existed.

Envelopes holding none of a partition's tables still advance its sequence
and position bookkeeping; their progress is committed with its next flush of
data, or after ``[applier] progress_interval_ms`` (see ``DelayBuffer``).

DDL goes to the partition of the table it names.  A statement naming no
table (CREATE DATABASE, and statements that change nothing a column store
holds) goes to every partition: each runs it idempotently (CREATE DATABASE
IF NOT EXISTS).  DROP TABLE of tables of several partitions is split: each
partition drops its own.  A statement Cynomys cannot parse goes to every
partition (each stops on it, as a single applier would, until
``[applier] skip_ddl`` names it).  DROP DATABASE, and RENAME TABLE / CREATE TABLE ...
LIKE between tables of two partitions, cannot be ordered against the other
partitions' changes and stop the partitions involved, saying how to go on.
"""
from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, replace
from typing import Any, Mapping

from cynomys.applier.targets.base import Flush, Target
from cynomys.core.config import Config
from cynomys.core.dialect import MARIADB
from cynomys.core.errors import TerminalError
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, Op, Position, Row, TableSchema
from cynomys.parser.ddl import (
    CreateTableLike,
    DdlOp,
    DropDatabase,
    DropTable,
    RenameTable,
    TableRef,
    UnsupportedDdl,
    parse_ddl,
)
from cynomys.verify.checksum import Checksum, KeyRange

log = logging.getLogger(__name__)

LAYOUT_SUFFIX = "#partitions"
# The layout record is an AppliedState whose seq is N; its position means nothing.
_LAYOUT_POSITION = Position("partitions", 0)


def table_partition(database: str, table: str, partitions: int) -> int:
    """The partition of ``database.table``: stable across processes, hosts and versions."""
    return zlib.crc32(f"{database}.{table}".encode("utf-8")) % partitions


class CrossPartitionDdl(TerminalError):
    """A DDL statement whose tables belong to different partitions."""


@dataclass(frozen=True)
class Partitioning:
    """Which tables this applier owns, and the names it keeps apart from its siblings."""

    partitions: int = 1
    partition: int = 0
    skip_ddl: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: Config) -> Partitioning:
        return cls(cfg.applier.partitions, cfg.applier.partition, tuple(cfg.applier.skip_ddl))

    @property
    def active(self) -> bool:
        return self.partitions > 1

    def owns(self, database: str, table: str) -> bool:
        return table_partition(database, table, self.partitions) == self.partition

    # -- names -------------------------------------------------------------
    def state_key(self, producer_id: str) -> str:
        return f"{producer_id}#p{self.partition}" if self.active else producer_id

    def partition_key(self, producer_id: str, i: int) -> str:
        return f"{producer_id}#p{i}" if self.active else producer_id

    def group(self, base: str, i: int | None = None) -> str:
        """The consumer group of partition ``i`` (default: this one)."""
        return f"{base}.p{self.partition if i is None else i}" if self.active else base

    def groups(self, base: str) -> list[str]:
        return [self.group(base, i) for i in range(self.partitions)]

    def consumer(self, name: str) -> str:
        # Distinct per partition: the file transport keeps one offset file per consumer name.
        return f"{name}.p{self.partition}" if self.active else name

    def file_name(self, stem: str, suffix: str = ".json") -> str:
        """``applier.json`` -> ``applier.p0.json``: partitions may share a state_dir."""
        return f"{stem}.p{self.partition}{suffix}" if self.active else f"{stem}{suffix}"

    def labels(self) -> dict[str, str]:
        """Labels every metric of this applier carries."""
        return {"partition": str(self.partition)} if self.active else {}

    # -- what this partition takes ---------------------------------------------
    def select(self, batch: Batch) -> Batch:
        """``batch`` with only this partition's changes (the batch itself when
        unpartitioned).  Positions, span and ``complete`` stay: the envelope
        still moves this partition's bookkeeping."""
        if not self.active:
            return batch
        kept: list[Change] = []
        for c in batch.changes:
            if c.op is not Op.DDL:
                if self.owns(c.database, c.table):
                    kept.append(c)
                continue
            ddl = self._ddl(c)
            if ddl is not None:
                kept.append(ddl)
        if len(kept) == len(batch.changes) and all(a is b for a, b in zip(kept, batch.changes)):
            return batch
        return replace(batch, changes=tuple(kept))

    def _ddl(self, c: Change) -> Change | None:
        """The DDL as this partition runs it, or None when it is not its own."""
        sql = c.sql or ""
        norm = " ".join(sql.split())
        position = f"{c.txn.file}:{c.txn.pos}"
        if any(s == position or " ".join(s.split()) == norm for s in self.skip_ddl):
            return c  # skipped on purpose by every partition's target: each moves its state past it
        try:
            ops = parse_ddl(sql, c.database)
        except UnsupportedDdl:
            # Its tables are unknown, so every partition takes it: each
            # target stops on it with the skip_ddl hint, as one applier would.
            return c
        refs: list[TableRef] = []
        for op in ops:
            refs.extend(self._refs(op, c, position))
        owners = {table_partition(db, t, self.partitions) for db, t in refs}
        if not owners:
            return c  # names no table (CREATE DATABASE, no-ops): every partition runs it
        if self.partition not in owners:
            return None
        if len(owners) == 1:
            return c
        if len(ops) == 1 and isinstance(ops[0], DropTable):
            # Dropping tables is independent per table: drop this partition's own.
            mine = [ref for ref in ops[0].tables if self.owns(*ref)]
            head = "DROP TABLE IF EXISTS " if ops[0].if_exists else "DROP TABLE "
            return replace(c, sql=head + ", ".join(MARIADB.table(db, t) for db, t in mine))
        names = ", ".join(f"{db}.{t} (partition {table_partition(db, t, self.partitions)})" for db, t in refs)
        raise CrossPartitionDdl(
            f"DDL at {position} names tables of several partitions: {names}: {' '.join(sql.split())[:200]!r}; "
            "a partitioned applier cannot order it against the other partitions' changes",
            hint=f"stop all partitions, apply the statement to the target by hand, add \"{position}\" to "
                 "[applier] skip_ddl of every partition and restart them (or run with [applier] partitions = 1)")

    def _refs(self, op: DdlOp, c: Change, position: str) -> list[TableRef]:
        if isinstance(op, DropDatabase):
            raise CrossPartitionDdl(
                f"DDL at {position} drops database {op.database}, whose tables belong to several partitions; "
                "a partitioned applier cannot order it against the other partitions' changes",
                hint=f"stop all partitions, drop the database on the target by hand, add \"{position}\" to "
                     "[applier] skip_ddl of every partition and restart them")
        if isinstance(op, RenameTable):
            return [ref for pair in op.pairs for ref in pair]
        if isinstance(op, DropTable):
            return list(op.tables)
        if isinstance(op, CreateTableLike):
            return [(op.database, op.table), (op.like_database, op.like_table)]
        database, table = getattr(op, "database", None), getattr(op, "table", None)
        if isinstance(database, str) and isinstance(table, str):
            return [(database, table)]
        return []  # CreateDatabase, NoOp


class PartitionTarget(Target):
    """A target whose applied state is this partition's: the applier loop
    keeps speaking of producer ids, the target stores ``Partitioning.state_key``.

    The applier always wraps its target in one (partitions = 1 too), so
    every method of the Target interface is forwarded to the wrapped target,
    never left to the base class: a base-class default here would hide the
    target's own (verify's SQL range paths once fell back to reading the
    whole table per chunk that way).  tests/unit/test_partition.py checks
    that each public method of Target is defined here."""

    def __init__(self, inner: Target, part: Partitioning) -> None:
        super().__init__(inner.cfg)
        self.inner = inner
        self.part = part
        # The wrapped target's class data (capabilities) is this one's.
        setattr(self, "capabilities", inner.capabilities)

    def __getattr__(self, name: str) -> Any:  # target-specific attributes (tests, tools)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _out(self, state: AppliedState) -> AppliedState:
        return replace(state, producer_id=self.part.state_key(state.producer_id))

    def connect(self) -> None:
        self.inner.connect()
        check_layout(self.inner, self.part, self.cfg.producer.id)
        if self.part.active:
            log.info("partition %d of %d: applying the tables with crc32(\"db.table\") mod %d = %d; state key %s",
                     self.part.partition, self.part.partitions, self.part.partitions, self.part.partition,
                     self.part.state_key(self.cfg.producer.id))

    def close(self) -> None:
        self.inner.close()

    def applied(self, producer_id: str) -> AppliedState | None:
        st = self.inner.applied(self.part.state_key(producer_id))
        return None if st is None else replace(st, producer_id=producer_id)

    def recover(self, producer_id: str) -> None:
        self.inner.recover(self.part.state_key(producer_id))

    def apply(self, flush: Flush) -> None:
        self.inner.apply(Flush(flush.tables, self._out(flush.state)))

    def apply_ddl(self, change: Change, state: AppliedState) -> None:
        self.inner.apply_ddl(change, self._out(state))

    def apply_part(self, part: Flush) -> None:
        self.inner.apply_part(Flush(part.tables, self._out(part.state)))

    def commit_parts(self, flush: Flush) -> None:
        self.inner.commit_parts(Flush(flush.tables, self._out(flush.state)))

    def rollback_parts(self) -> None:
        self.inner.rollback_parts()

    @property
    def parts_open(self) -> bool:
        return self.inner.parts_open

    @property
    def commits_parts_alone(self) -> bool:
        return self.inner.commits_parts_alone

    def ping(self) -> None:
        self.inner.ping()

    @property
    def where(self) -> str:
        return self.inner.where

    def table_exists(self, database: str, table: str) -> bool:
        return self.inner.table_exists(database, table)

    def table_columns(self, database: str, table: str) -> tuple[ColumnDef, ...] | None:
        return self.inner.table_columns(database, table)

    def housekeeping(self) -> dict[str, Any]:
        return self.inner.housekeeping()

    def visible_at(self) -> Mapping[str, float]:
        return self.inner.visible_at()

    def after_commit(self) -> None:
        self.inner.after_commit()

    def idle(self) -> None:
        self.inner.idle()

    def fetch_rows(self, database: str, table: str) -> list[Row]:
        return self.inner.fetch_rows(database, table)

    def ddl_ops(self, change: Change) -> list[DdlOp] | None:
        return self.inner.ddl_ops(change)

    # -- `cynomys verify`: the target's own range paths (SQL where it has them)
    def range_rows(self, schema: TableSchema, rng: KeyRange) -> list[Row]:
        return self.inner.range_rows(schema, rng)

    def checksum_range(self, schema: TableSchema, rng: KeyRange) -> Checksum:
        return self.inner.checksum_range(schema, rng)

    def purge_into(self, flush: Flush, schema: TableSchema, rng: KeyRange) -> int:
        return self.inner.purge_into(flush, schema, rng)


def check_layout(target: Target, part: Partitioning, producer_id: str) -> None:
    """Refuse a partition count other than the one the target's state was
    written with; move from another count when that is safe.

    The target holds ``<producer>#partitions`` (seq = N) once partitioned
    appliers ran.  Moving from M to N partitions is safe when every one of
    the M states is at the same envelope (the appliers drained the stream
    and were stopped; see the README): each new partition starts from that
    state.  From a single applier (no layout record) that always holds."""
    layout_key = producer_id + LAYOUT_SUFFIX
    layout = target.applied(layout_key)
    was = layout.seq if layout is not None else 1
    if was == part.partitions:
        return
    old = Partitioning(was, 0)
    states = [target.applied(old.partition_key(producer_id, i)) for i in range(was)]
    present = [s for s in states if s is not None]
    if present and (len(present) < was or len({(s.seq, s.position) for s in present}) > 1):
        seqs = ", ".join(f"p{i}: {s.seq if s is not None else 'none'}" for i, s in enumerate(states))
        raise TerminalError(
            f"the target holds the state of {was} partition(s) of producer {producer_id!r} at different envelopes "
            f"({seqs}); this applier runs with [applier] partitions = {part.partitions}",
            hint=f"run with partitions = {was}; to change the count, stop the producer, let all {was} partitions "
                 "apply everything (`cynomys status`: same sequence for each), stop them, then start the new ones")
    if present:
        common = present[0]
        for i in range(part.partitions):
            key = part.partition_key(producer_id, i)
            st = target.applied(key)
            # A state behind is left from an earlier layout; one ahead is a
            # partition started alongside this one that already moved on.
            if st is None or st.seq < common.seq:
                target.apply(Flush([], replace(common, producer_id=key)))
        log.warning("moved the applier state of producer %s from %d to %d partition(s), all at envelope %d (%s)",
                    producer_id, was, part.partitions, common.seq, common.position)
    # Written after the partitions' states: a crash in between redoes the move.
    target.apply(Flush([], AppliedState(layout_key, part.partitions, _LAYOUT_POSITION)))
