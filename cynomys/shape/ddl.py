"""Source DDL on shaped tables: each operation as it applies to the target table.

What a statement does to a shaped table, operation by operation (the
stage writes the result back as SQL; parser/ddl_render.py):

* the table's name is the route's target; a CREATE TABLE gets the shaped
  columns, the shard columns of a merging route and its key, and for a
  merging route IF NOT EXISTS (every shard creates the one table);
* a column left out (include/exclude) is not added, modified nor dropped
  (a NoOp); a renamed column is called by its target name; a masked
  column gets its mask's type, and the value ADD COLUMN fills existing
  rows with is masked too (a CURRENT_TIMESTAMP default is taken at the
  statement's time first);
* a primary key gets the shard columns of a merging route in front.
* a keyless table's index (its CREATE TABLE's KEYs, CREATE INDEX, ADD KEY)
  keeps its leading columns the rules keep, by their target names; one
  led by a column left out is a NoOp (``shaped_indexes``).

Refused (a ``ShapeError``: the producer stops, naming the statement and how
to go on -- change the rules, or name the statement in ``[shape] skip_ddl``):

* DROP TABLE or TRUNCATE of one source of a merging route: the merged table
  holds the other sources' rows too.  The decision is the operator's: to
  keep the shard's rows, skip the statement; to remove them, delete them
  on the target by hand (``WHERE source_db = ... AND source_table = ...``)
  and skip it;
* RENAME TABLE and CREATE TABLE ... LIKE touching a shaped table (the
  other name may be shaped differently, or not at all: online schema
  change tools copy a table under a temporary name);
* RENAME COLUMN of a column a table rule names (include, exclude, rename,
  mask, filter) or of a table with an include list: rules name source
  columns, and the renamed column would change what they do;
* DROP COLUMN of a column the row filter reads, a primary key over a
  column left out or masked to non-unique values, DROP PRIMARY KEY of a
  merged table (it needs its key).
"""
from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Any, Iterable, Sequence

from cynomys.core.model import Change, ColumnDef, TableSchema, Value
from cynomys.parser import ddl_ops as ddl
from cynomys.parser.ddl_ops import DdlOp
from cynomys.shape.rules import PLAIN, ShapeRules
from cynomys.shape.tables import ShapeError, column_out, shape_schema, shaped_indexes


def _refs(op: DdlOp) -> list[tuple[str, str]]:
    if isinstance(op, ddl.DropTable):
        return list(op.tables)
    if isinstance(op, ddl.RenameTable):
        return [ref for pair in op.pairs for ref in pair]
    if isinstance(op, ddl.CreateTableLike):
        return [(op.database, op.table), (op.like_database, op.like_table)]
    db, t = getattr(op, "database", None), getattr(op, "table", None)
    return [(db, t)] if isinstance(db, str) and isinstance(t, str) else []


def touches(rules: ShapeRules, ops: Iterable[DdlOp]) -> bool:
    """Whether a statement names a shaped table."""
    return any(rules.shaped(db, t) for op in ops for db, t in _refs(op))


def _fill(value: Value, fill_now: bool, col: ColumnDef, commit_ts: int) -> Value:
    """The value ADD COLUMN gives existing rows, taken now (to be masked)."""
    if not fill_now:
        return value
    at = datetime.datetime.fromtimestamp(commit_ts, datetime.timezone.utc)
    return at if col.base_type == "timestamp" else at.replace(tzinfo=None)


class _Ops:
    """One statement's operations being shaped (``refuse`` names it)."""

    def __init__(self, rules: ShapeRules, change: Change, position: str) -> None:
        self.rules, self.change, self.position = rules, change, position

    def refuse(self, why: str) -> ShapeError:
        sql = " ".join((self.change.sql or "").split())[:200]
        return ShapeError(
            f"DDL at {self.position} cannot be applied to the shaped target: {why}: {sql!r}",
            hint=f"change the rules in [shape], or add \"{self.position}\" to [shape] skip_ddl to drop the "
                 "statement on purpose (the target never sees it; fix the target by hand if it must change)")

    def merged(self, db: str, t: str) -> bool:
        r = self.rules.route(db, t)
        return r is not None and r.merge

    def column(self, db: str, t: str, col: ColumnDef) -> tuple[ColumnDef, Any] | None:
        try:
            return column_out(self.rules.table(db, t), col, self.rules.mask_key)
        except ValueError as exc:
            raise self.refuse(f"column {col.name} of {db}.{t}: {exc}") from None

    def name(self, db: str, t: str, column: str) -> str | None:
        """A column's name on the target, or None when it is left out."""
        ts = self.rules.table(db, t)
        return ts.rename.get(column.lower(), column) if ts.keeps(column) else None

    def key(self, db: str, t: str, columns: Sequence[str]) -> tuple[str, ...]:
        ts = self.rules.table(db, t)
        out = []
        for c in columns:
            name = self.name(db, t, c)
            mask = ts.masks.get(c.lower())
            if name is None or (mask is not None and not mask.key_safe):
                raise self.refuse(f"the primary key of {db}.{t} would hold column {c}, which {ts.where} leaves "
                                  "out or masks to equal values")
            out.append(name)
        r = self.rules.route(db, t)
        return (r.shard_columns if r is not None else ()) + tuple(out)

    def shape(self, op: DdlOp) -> list[DdlOp]:
        if not any(self.rules.shaped(db, t) for db, t in _refs(op)):
            return [op]
        rules = self.rules
        if isinstance(op, (ddl.RenameTable, ddl.CreateTableLike)):
            names = ", ".join(f"{db}.{t}" for db, t in _refs(op) if rules.shaped(db, t))
            raise self.refuse(f"it renames or copies the shaped table(s) {names}, whose other name need not be shaped "
                              "alike")
        if isinstance(op, ddl.DropTable):
            for db, t in op.tables:
                if self.merged(db, t):
                    raise self.refuse(self._merged_loss("DROP TABLE", db, t))
            return [replace(op, tables=tuple(rules.target_of(db, t) for db, t in op.tables))]
        db, t = op.database, op.table  # type: ignore[attr-defined]
        tdb, tt = rules.target_of(db, t)
        ts = rules.table(db, t)
        if isinstance(op, ddl.AddIndex):
            cols = shaped_indexes((op.columns,), lambda c: self.name(db, t, c))
            if not cols:
                return [ddl.NoOp(f"the index's first column {op.columns[0]} is left out by {ts.where}")]
            return [ddl.AddIndex(tdb, tt, cols[0])]
        if isinstance(op, ddl.Truncate):
            if self.merged(db, t):
                raise self.refuse(self._merged_loss("TRUNCATE", db, t))
            return [ddl.Truncate(tdb, tt)]
        if isinstance(op, ddl.CreateTable):
            shaped = shape_schema(rules, TableSchema(db, t, op.columns, op.key, op.indexes))
            s = shaped.schema
            return [ddl.CreateTable(s.database, s.table, s.columns, s.key, op.if_not_exists or shaped.merged,
                                    s.indexes)]
        if isinstance(op, ddl.AddColumn):
            out = self.column(db, t, op.column)
            if out is None:
                return [ddl.NoOp(f"column {op.column.name} is left out by {ts.where}")]
            col, masker = out
            r = rules.route(db, t)
            if r is not None and col.name.lower() in {c.lower() for c in r.shard_columns}:
                raise self.refuse(f"column {col.name} has the name {r.where} gives the source's database or table")
            fill, now = op.fill, op.fill_now
            if masker is not None:
                fill, now = masker(_fill(fill, now, op.column, self.change.commit_ts)), False
            return [ddl.AddColumn(tdb, tt, col, op.if_not_exists or self.merged(db, t), fill, now)]
        if isinstance(op, ddl.DropColumn):
            if ts.filter is not None and op.column.lower() in ts.filter.columns:
                raise self.refuse(f"the row filter of {ts.where} reads column {op.column}")
            name = self.name(db, t, op.column)
            if name is None:
                return [ddl.NoOp(f"column {op.column} is left out by {ts.where}")]
            return [ddl.DropColumn(tdb, tt, name, op.if_exists)]
        if isinstance(op, ddl.ModifyColumn):
            out = self.column(db, t, op.column)
            if out is None:
                return [ddl.NoOp(f"column {op.column.name} is left out by {ts.where}")]
            return [ddl.ModifyColumn(tdb, tt, out[0])]
        if isinstance(op, ddl.RenameColumn):
            if ts is not PLAIN and (ts.include or {op.old.lower(), op.new.lower()} & ts.names()):
                raise self.refuse(f"{ts.where} names source columns, and renaming {op.old} to {op.new} would change "
                                  "what it does (update the rule to the new name, and skip or re-snapshot)")
            return [ddl.RenameColumn(tdb, tt, op.old, op.new)]
        if isinstance(op, ddl.AddPrimaryKey):
            return [ddl.AddPrimaryKey(tdb, tt, self.key(db, t, op.columns))]
        if isinstance(op, ddl.DropPrimaryKey):
            if self.merged(db, t):
                raise self.refuse(f"{db}.{t} is merged with other tables, which needs its primary key")
            return [ddl.DropPrimaryKey(tdb, tt)]
        return [op]

    def _merged_loss(self, what: str, db: str, t: str) -> str:
        r = self.rules.route(db, t)
        assert r is not None
        tdb, tt = self.rules.target_of(db, t)
        cols = dict(zip((r.rule.database_column, r.rule.table_column), (db, t)))
        where = " AND ".join(f"{c} = '{v}'" for c, v in cols.items() if c)
        return (f"{what} of {db}.{t}, one of the tables {r.where} merges into {tdb}.{tt}: the merged table holds "
                f"the other sources' rows too (to remove this source's rows, DELETE FROM {tdb}.{tt} WHERE {where} "
                "on the target)")


def shape_ops(rules: ShapeRules, ops: Sequence[DdlOp], change: Change, position: str) -> list[DdlOp]:
    """A statement's operations as they apply to the target (ShapeError when they cannot)."""
    shaper = _Ops(rules, change, position)
    out: list[DdlOp] = []
    for op in ops:
        out.extend(shaper.shape(op))
    return out
