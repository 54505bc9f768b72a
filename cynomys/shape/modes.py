"""Applier modes per target table: the changes a table needs, from the changes the source made.

The applier rewrites each admitted change of a table whose mode is not
``upsert`` before it is buffered (cynomys/applier/shaping.py), so every
target gets the modes with no code of its own, and exactly-once follows
from the admit stage, which decides by transaction before any rewrite.

``soft_delete`` -- rows stay.  Two columns follow the source's:
``[shape] deleted_column`` (0, or 1 once the source row is deleted) and
``commit_time_column`` (the source commit time, UTC, of the row's last
change).  Every change becomes an upsert: an INSERT or a snapshot READ is
a READ (the key may be there, flagged, from an earlier delete), an UPDATE
stays an update, a DELETE becomes an update of the before image flagged
deleted, and an UPDATE that moves the key flags the old key and upserts
the new one.  The buffer folds these with the usual rules.  Needs a
primary key (a keyless row has no identity to flag).  The producer ships
such tables unfolded, so every row written stays, also one inserted and
deleted inside one transaction (flagged), whatever the batches are.

``history`` -- an append-only changelog.  Each change is an INSERT of one
row: ``op_column`` (INSERT, UPDATE, DELETE, READ), ``commit_time_column``,
``txn_column`` (the source transaction: its GTID, or the binlog position
of its start), ``file_column``/``pos_column`` (that start), ``seq_column``
(the change's number within its transaction and table, from 0), then the
row image (the after image; a DELETE's before image) in the source's
column names and the before image of an UPDATE or DELETE in
``before_prefix`` + name.  The key is (txn, seq): a change replayed gets
the same key.  The producer ships such tables' changes unfolded
(cynomys/shape/stage.py ``Shaper.unfolded``), so the changelog holds
every change the binlog held; replayed in (file, pos, seq) order it
rebuilds the table.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, replace

from cynomys.core.config import ShapeConfig
from cynomys.core.errors import TerminalError
from cynomys.core.model import Change, ColumnDef, Op, Row, TableSchema, Value

#: Column types of the modes' own columns (source type names: every target maps them).
FLAG_TYPE = "tinyint"
TIME_TYPE = "timestamp(6)"
OP_TYPE = "varchar(8)"
TXN_TYPE = "varchar(255)"
FILE_TYPE = "varchar(255)"
POS_TYPE = "bigint unsigned"
SEQ_TYPE = "int unsigned"


class ModeError(TerminalError):
    """A table cannot be written in its mode."""


def commit_time(commit_ts: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(commit_ts, datetime.timezone.utc)


@dataclass(frozen=True)
class SoftDelete:
    cfg: ShapeConfig

    def schema(self, source: TableSchema) -> TableSchema:
        if not source.key:
            raise ModeError(f"table {source.name} has no primary key: mode soft_delete flags rows by their key",
                            hint="give the source table a primary key, or write it in mode upsert or history")
        extra = (ColumnDef(self.cfg.deleted_column, FLAG_TYPE, False), ColumnDef(self.cfg.commit_time_column, TIME_TYPE))
        clash = {c.name.lower() for c in source.columns} & {c.name.lower() for c in extra}
        if clash:
            raise ModeError(f"table {source.name} has a column {sorted(clash)[0]!r}, a name mode soft_delete uses",
                            hint="set [shape] deleted_column / commit_time_column to other names")
        return replace(source, columns=source.columns + extra)

    def rewrite(self, c: Change, schema: TableSchema) -> list[Change]:
        ts = commit_time(c.commit_ts)
        live: tuple[Value, ...] = (0, ts)
        gone: tuple[Value, ...] = (1, ts)

        def mk(op: Op, before: Row | None, after: Row | None) -> Change:
            return Change(op, c.database, c.table, c.tid, c.txn, c.commit_ts, schema, before, after, c.sql)

        if c.op is Op.DELETE:
            assert c.before is not None
            return [mk(Op.UPDATE, c.before + live, c.before + gone)]
        if c.op is Op.UPDATE:
            assert c.before is not None and c.after is not None
            if c.key(c.before) != c.key(c.after):  # the key moved: the old row stays, flagged
                return [mk(Op.UPDATE, c.before + live, c.before + gone), mk(Op.READ, None, c.after + live)]
            return [mk(Op.UPDATE, c.before + live, c.after + live)]
        assert c.after is not None  # INSERT, READ: an upsert (a flagged row of the key may be there)
        return [mk(Op.READ, None, c.after + live)]


@dataclass(frozen=True)
class History:
    cfg: ShapeConfig

    def meta(self) -> tuple[ColumnDef, ...]:
        s = self.cfg
        return (ColumnDef(s.op_column, OP_TYPE, False), ColumnDef(s.commit_time_column, TIME_TYPE),
                ColumnDef(s.txn_column, TXN_TYPE, False), ColumnDef(s.file_column, FILE_TYPE),
                ColumnDef(s.pos_column, POS_TYPE), ColumnDef(s.seq_column, SEQ_TYPE, False))

    def columns(self, columns: tuple[ColumnDef, ...]) -> tuple[ColumnDef, ...]:
        """The row image's columns, then the before image's (all nullable)."""
        after = tuple(replace(c, nullable=True) for c in columns)
        return after + tuple(replace(c, name=self.cfg.before_prefix + c.name) for c in after)

    def schema(self, source: TableSchema) -> TableSchema:
        meta = self.meta()
        cols = self.columns(source.columns)
        clash = {c.name.lower() for c in meta} & {c.name.lower() for c in cols}
        if clash:
            raise ModeError(f"table {source.name} has a column {sorted(clash)[0]!r}, a name mode history uses",
                            hint="set the [shape] history column names (op_column, txn_column, ... before_prefix) "
                                 "to others")
        return TableSchema(source.database, source.table, meta + cols, (self.cfg.txn_column, self.cfg.seq_column))

    def rewrite(self, c: Change, schema: TableSchema, seq: int) -> Change:
        width = (len(schema.columns) - 6) // 2
        image = c.before if c.op is Op.DELETE else c.after
        assert image is not None
        before = c.before if c.op in (Op.UPDATE, Op.DELETE) and c.before is not None else (None,) * width
        row = (c.op.value, commit_time(c.commit_ts), c.tid, c.txn.file, c.txn.pos, seq) + image + before
        return Change(Op.INSERT, c.database, c.table, c.tid, c.txn, c.commit_ts, schema, None, row, c.sql)
