"""What a source DDL may do to a target table: the schema-change policy and the modes.

Applied by the applier to a DDL statement's operations before the target
runs them (cynomys/applier/shaping.py), per target table
(``[shape.targets."<pattern>"] schema_changes``, else ``[shape]
schema_changes``; a statement naming no table takes the latter):

``evolve``        every operation runs (the default).
``ignore_drops``  DROP COLUMN does not run: the column stays, holding its
                  values; rows written afterwards leave it NULL.  RENAME
                  COLUMN keeps the old column as it is and adds the new one
                  (``CHANGE a b <type>`` adds it with that type at once; a
                  bare RENAME COLUMN lets the first rows carrying it add it).
``freeze``        nothing changes a table's columns, key or name (ADD, DROP,
                  MODIFY, RENAME COLUMN, primary keys, RENAME and DROP
                  TABLE do not run); rows keep only the columns the target
                  table has (cynomys/applier/shaping.py reads them from the
                  target).  New tables are still created, TRUNCATE still
                  empties one.
``stop``          the applier stops on any statement that would change an
                  existing table (CREATE TABLE and TRUNCATE run), naming it
                  and the fix: apply it by hand, then list its position in
                  ``[applier] skip_ddl`` -- or choose another policy.

Then the table's mode: a ``history`` table is its changelog (shape/modes.py):
CREATE TABLE creates the changelog's columns and key, ADD/MODIFY COLUMN
change a column and its ``before_`` twin, DROP and RENAME COLUMN and key
changes do not run (the changelog keeps what it recorded), TRUNCATE and DROP
TABLE stop the applier (they would erase history; skip them on purpose with
``[applier] skip_ddl``) -- but not the TRUNCATE a keyless table's snapshot
read starts with: its rows are appended as READ changes.  A ``soft_delete`` table gets its two columns in
CREATE TABLE; TRUNCATE, DROP TABLE and DROP PRIMARY KEY stop it (rows are
kept, by their key).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from cynomys.core.errors import TerminalError
from cynomys.core.model import TableSchema
from cynomys.parser import ddl_ops as ddl
from cynomys.parser.ddl_ops import DdlOp
from cynomys.shape.modes import History, SoftDelete
from cynomys.shape.rules import ShapeRules, TargetShape


class SchemaPolicyError(TerminalError):
    """A DDL statement the schema-change policy or a mode does not allow."""


#: Operations that change an existing table's columns, key or name.
_CHANGES_TABLE = (ddl.AddColumn, ddl.DropColumn, ddl.ModifyColumn, ddl.RenameColumn, ddl.AddPrimaryKey,
                  ddl.DropPrimaryKey, ddl.RenameTable, ddl.DropTable, ddl.DropDatabase)


def _table(op: DdlOp) -> tuple[str, str] | None:
    """The target table an operation is about (its first), or None."""
    if isinstance(op, ddl.DropTable):
        return op.tables[0] if op.tables else None
    if isinstance(op, ddl.RenameTable):
        return op.pairs[0][0] if op.pairs else None
    db, t = getattr(op, "database", None), getattr(op, "table", None)
    return (db, t) if isinstance(db, str) and isinstance(t, str) else None


class PolicyRun:
    """One statement's operations through the policy and the modes."""

    def __init__(self, rules: ShapeRules, sql: str, position: str, snapshot: bool = False) -> None:
        self.rules, self.sql, self.position = rules, sql, position
        # A keyless table's snapshot read starts with a TRUNCATE of its own
        # (snapshot/keyless.py), not a source statement.
        self.snapshot = snapshot
        self.history, self.soft = History(rules.cfg), SoftDelete(rules.cfg)

    def refuse(self, why: str, fix: str) -> SchemaPolicyError:
        text = " ".join(self.sql.split())[:200]
        return SchemaPolicyError(f"DDL at {self.position}: {why}: {text!r}",
                                 hint=f"{fix}, or apply it to the target by hand and add \"{self.position}\" to "
                                      "[applier] skip_ddl")

    def shape_of(self, op: DdlOp) -> TargetShape:
        ref = _table(op)
        return self.rules.target(*ref) if ref is not None else self.rules.target("", "")

    def run(self, ops: Sequence[DdlOp]) -> list[DdlOp]:
        out: list[DdlOp] = []
        i = 0
        while i < len(ops):
            op, nxt = ops[i], ops[i + 1] if i + 1 < len(ops) else None
            done = self._policy(op, nxt)
            if done and isinstance(done[0], ddl.AddColumn) and isinstance(op, ddl.RenameColumn):
                i += 1  # CHANGE a b <type> under ignore_drops: its MODIFY became the ADD
            for p in done:
                out.extend(self._mode(p))
            i += 1
        return out

    # -- the schema-change policy ------------------------------------------------
    def _policy(self, op: DdlOp, nxt: DdlOp | None) -> list[DdlOp]:
        shape = self.shape_of(op)
        policy = shape.schema_changes
        if policy == "evolve" or isinstance(op, ddl.NoOp):
            return [op]
        if policy == "stop":
            if isinstance(op, _CHANGES_TABLE):
                ref = _table(op)
                raise self.refuse(f"it would change {'.'.join(ref) if ref else 'the target'}, whose schema_changes is "
                                  f"'stop' ({shape.where})", "change the policy")
            return [op]
        if policy == "freeze":
            if isinstance(op, _CHANGES_TABLE):
                return [ddl.NoOp(f"schema_changes = 'freeze' ({shape.where})")]
            return [op]
        # ignore_drops
        if isinstance(op, ddl.DropColumn):
            return [ddl.NoOp(f"schema_changes = 'ignore_drops' keeps column {op.column} ({shape.where})")]
        if isinstance(op, ddl.RenameColumn):
            if isinstance(nxt, ddl.ModifyColumn) and nxt.column.name.lower() == op.new.lower():
                return [ddl.AddColumn(op.database, op.table, replace(nxt.column, nullable=True), if_not_exists=True)]
            return [ddl.NoOp(f"schema_changes = 'ignore_drops' keeps column {op.old} ({shape.where})")]
        return [op]

    # -- the modes ---------------------------------------------------------------
    def _mode(self, op: DdlOp) -> list[DdlOp]:
        shape = self.shape_of(op)
        if shape.mode == "upsert" or isinstance(op, ddl.NoOp):
            return [op]
        ref = _table(op)
        name = ".".join(ref) if ref else ""
        keeps = "every change" if shape.mode == "history" else "deleted rows"
        if isinstance(op, ddl.Truncate) and self.snapshot and shape.mode == "history":
            return [ddl.NoOp("a snapshot's rows are appended to the changelog as READ changes")]
        if isinstance(op, (ddl.Truncate, ddl.DropTable)):
            raise self.refuse(f"it would remove the rows of {name}, written in mode {shape.mode!r} ({shape.where}), "
                              f"which keeps {keeps}", "drop or empty the table on the target by hand if it must go")
        if isinstance(op, (ddl.RenameTable, ddl.CreateTableLike)):
            refs = [b for _, b in op.pairs] if isinstance(op, ddl.RenameTable) else [(op.like_database, op.like_table)]
            if any(self.rules.target(*r).mode != shape.mode for r in refs):
                raise self.refuse(f"it renames or copies {name}, written in mode {shape.mode!r}, to or from a table "
                                  "of another mode", "give both names the same mode")
            return [op]
        if isinstance(op, ddl.CreateTable):
            source = TableSchema(op.database, op.table, op.columns, op.key)
            made = self.history.schema(source) if shape.mode == "history" else self.soft.schema(source)
            return [ddl.CreateTable(op.database, op.table, made.columns, made.key, op.if_not_exists)]
        if shape.mode == "soft_delete":
            if isinstance(op, ddl.DropPrimaryKey):
                raise self.refuse(f"{name} is written in mode 'soft_delete' ({shape.where}), which needs its primary "
                                  "key", "write it in another mode")
            return [op]
        # history
        if isinstance(op, ddl.AddColumn):
            col = replace(op.column, nullable=True)
            twin = replace(col, name=self.rules.cfg.before_prefix + col.name)
            return [replace(op, column=col, fill=None, fill_now=False),
                    ddl.AddColumn(op.database, op.table, twin, op.if_not_exists)]
        if isinstance(op, ddl.ModifyColumn):
            col = replace(op.column, nullable=True)
            return [replace(op, column=col),
                    ddl.ModifyColumn(op.database, op.table, replace(col, name=self.rules.cfg.before_prefix + col.name))]
        if isinstance(op, (ddl.DropColumn, ddl.RenameColumn, ddl.AddPrimaryKey, ddl.DropPrimaryKey)):
            return [ddl.NoOp(f"the changelog of {name} keeps its columns and key ({shape.where})")]
        return [op]


def policy_ops(rules: ShapeRules, ops: Sequence[DdlOp], sql: str, position: str,
               snapshot: bool = False) -> list[DdlOp]:
    """A statement's operations as the policies and modes let them run
    (SchemaPolicyError for what they refuse).  ``snapshot``: the statement
    opens a keyless table's snapshot read."""
    return PolicyRun(rules, sql, position, snapshot).run(ops)


def names_tables(ops: Sequence[DdlOp]) -> list[tuple[str, str]]:
    """Every table the operations name (their caches are stale afterwards)."""
    out: list[tuple[str, str]] = []
    for op in ops:
        if isinstance(op, ddl.DropTable):
            out.extend(op.tables)
        elif isinstance(op, ddl.RenameTable):
            out.extend(r for pair in op.pairs for r in pair)
        else:
            ref = _table(op)
            if ref is not None:
                out.append(ref)
    return out
