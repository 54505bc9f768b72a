"""Run neutral DDL operations (reducer.ddl) on a MonetDB target.

MonetDB DDL is transactional: every operation of one source statement runs
in the transaction that also records the applier state, so a statement is
applied completely or not at all.  Each operation still checks the catalog
first and does nothing when its effect is there (table created, column
added, rename done), so applying a statement twice changes nothing.  An
ALTER of a table the target does not have is skipped with a warning: the
next flush of that table creates it from the source's current schema.

MonetDB 11.33 has no IF [NOT] EXISTS on several statements and no table
RENAME across schemas, so existence comes from the catalog, and a move to
another database is ``SET SCHEMA`` plus ``RENAME TO``.  MonetDB refuses to
rename or retype a column its primary key uses, and 11.53.15 mishandles a
table renamed with its key in place (see ``_rename_table``), so those steps
drop the key and add it back, inside the same transaction.
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from cynomys.applier.targets.monetdb.types import (
    CASTABLE,
    Codec,
    Unstorable,
    qualified,
    quote_ident,
)
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import ColumnDef, TableSchema
from cynomys.reducer import ddl

if TYPE_CHECKING:
    from cynomys.applier.targets.monetdb.target import MonetDBTarget, TargetColumn

log = logging.getLogger(__name__)

_TMP_SUFFIX = "__cynomys_tmp"


@dataclass
class Run:
    """One DDL statement being applied: the target, its open transaction's
    cursor, and the source text."""

    target: MonetDBTarget
    cur: Any
    sql: str
    commit_ts: int = 0  # source time of the statement (for DEFAULT CURRENT_TIMESTAMP fills)

    def what(self, action: str) -> str:
        text = " ".join(self.sql.split())
        return f"DDL {text[:200]!r}: {action}"

    def step(self, action: str, statement: str) -> None:
        log.info("DDL step on %s: %s", self.target.where, statement)
        self.target.ddl_step(self.cur, f"{self.what(action)} ({statement})", statement,
                             hint="fix the target by hand, or " + ddl.SKIP_HINT)

    def columns(self, database: str, table: str) -> dict[str, TargetColumn]:
        """lower-case name -> column; {} when the table is missing."""
        return {c.name.lower(): c for c in self.target.target_columns(self.cur, database, table)}

    def exists(self, database: str, table: str) -> bool:
        return self.target.table_id(self.cur, database, table) is not None

    def evolve(self, database: str, table: str, fn: Callable[[TableSchema], TableSchema | None]) -> None:
        """Keep the remembered source schema (column order for fetch_rows) in step."""
        known = self.target.schemas.get((database, table))
        if known is not None:
            new = fn(known)
            if new is None:
                self.target.schemas.pop((database, table), None)
            else:
                self.target.schemas[(database, table)] = new

    def reject(self, action: str, reason: str, hint: str) -> TargetRejectedError:
        return TargetRejectedError(f"{self.what(action)} cannot be applied to {self.target.where}: {reason}",
                                   hint=hint)


def _tbl(database: str, table: str) -> str:
    return qualified(database, table)


def _skip_missing(r: Run, database: str, table: str, action: str) -> None:
    log.warning("%s: table %s.%s is not on the target; skipped (its next flush creates it from the source schema)",
                r.what(action), database, table)


def _drop_pk(r: Run, database: str, table: str) -> tuple[str, ...]:
    """Drop the table's primary key; returns its columns (to add it back)."""
    pk = r.target.primary_key(r.cur, database, table)
    if pk is None:
        return ()
    r.step("drop primary key", f"ALTER TABLE {_tbl(database, table)} DROP CONSTRAINT {quote_ident(pk[0])}")
    return pk[1]


def _add_pk(r: Run, database: str, table: str, columns: tuple[str, ...]) -> None:
    if columns:
        cols = ", ".join(quote_ident(c) for c in columns)
        r.step("add primary key", f"ALTER TABLE {_tbl(database, table)} ADD PRIMARY KEY ({cols})")


# --------------------------------------------------------------------------
# One function per operation
# --------------------------------------------------------------------------
def _create_database(r: Run, op: ddl.CreateDatabase) -> None:
    r.target.ensure_schema(r.cur, op.database)


def _drop_database(r: Run, op: ddl.DropDatabase) -> None:
    r.target.check_database(r.cur, op.database)
    if r.target.schema_info(r.cur, op.database) is not None:
        r.step("drop database", f"DROP SCHEMA {quote_ident(op.database)} CASCADE")
    for ident in [k for k in r.target.schemas if k[0] == op.database]:
        r.target.schemas.pop(ident)


def _create_table(r: Run, op: ddl.CreateTable) -> None:
    r.target.ensure_schema(r.cur, op.database)
    if r.exists(op.database, op.table):
        log.info("%s: %s.%s exists already", r.what("create table"), op.database, op.table)
    else:
        r.target.create_table(r.cur, op.database, op.table, op.columns, op.key)
    r.target.schemas[(op.database, op.table)] = TableSchema(op.database, op.table, op.columns, op.key)


def _create_table_like(r: Run, op: ddl.CreateTableLike) -> None:
    like = r.columns(op.like_database, op.like_table)
    if not like:
        _skip_missing(r, op.like_database, op.like_table, "create table like")
        return
    r.target.ensure_schema(r.cur, op.database)
    pk = r.target.primary_key(r.cur, op.like_database, op.like_table)
    key = pk[1] if pk else ()
    known = r.target.schemas.get((op.like_database, op.like_table))
    if known is not None and sorted(c.lower() for c in known.column_names) == sorted(like):
        columns = known.columns
    else:
        columns = tuple(ColumnDef(c.name, c.source_type, c.nullable) for c in like.values())
    if not r.exists(op.database, op.table):
        r.target.create_table(r.cur, op.database, op.table, columns, key)
    r.target.schemas[(op.database, op.table)] = TableSchema(op.database, op.table, tuple(columns), tuple(key))


def _drop_table(r: Run, op: ddl.DropTable) -> None:
    for db, t in op.tables:
        r.target.check_database(r.cur, db)
        if r.exists(db, t):
            r.step("drop table", f"DROP TABLE {_tbl(db, t)}")
        r.target.schemas.pop((db, t), None)


def _rename_table(r: Run, op: ddl.RenameTable) -> None:
    for (odb, old), (ndb, new) in op.pairs:
        r.target.check_database(r.cur, ndb)
        old_there, new_there = r.exists(odb, old), r.exists(ndb, new)
        if not old_there:
            if new_there:
                log.info("%s: already renamed to %s.%s", r.what("rename table"), ndb, new)
            else:
                _skip_missing(r, odb, old, "rename table")
            continue
        if new_there:
            raise r.reject("rename table", f"both {odb}.{old} and {ndb}.{new} exist",
                           "drop the stale one on the target, or " + ddl.SKIP_HINT)
        # MonetDB 11.53.15 (seen on the build tested here) breaks a table
        # renamed with its primary key in place: DROP TABLE then fails with
        # "HY013 Could not allocate space" and ALTER TABLE ... DROP
        # CONSTRAINT crashes the server.  The key is dropped before the
        # rename and added back after it, in the same transaction.
        key = _drop_pk(r, odb, old)
        if odb == ndb:
            r.step("rename table", f"ALTER TABLE {_tbl(odb, old)} RENAME TO {quote_ident(new)}")
        else:
            # MonetDB renames within a schema and moves between schemas in
            # separate statements; a unique interim name avoids clashes in
            # either schema.
            r.target.ensure_schema(r.cur, ndb)
            interim = f"{new}__cynomys_move"
            r.step("rename table", f"ALTER TABLE {_tbl(odb, old)} RENAME TO {quote_ident(interim)}")
            r.step("move table", f"ALTER TABLE {_tbl(odb, interim)} SET SCHEMA {quote_ident(ndb)}")
            r.step("rename table", f"ALTER TABLE {_tbl(ndb, interim)} RENAME TO {quote_ident(new)}")
        _add_pk(r, ndb, new, key)
        known = r.target.schemas.pop((odb, old), None)
        if known is not None:
            r.target.schemas[(ndb, new)] = replace(known, database=ndb, table=new)


def _truncate(r: Run, op: ddl.Truncate) -> None:
    if r.exists(op.database, op.table):
        r.step("truncate", f"TRUNCATE TABLE {_tbl(op.database, op.table)}")


def _add_column(r: Run, op: ddl.AddColumn) -> None:
    cols = r.columns(op.database, op.table)
    if not cols:
        _skip_missing(r, op.database, op.table, "add column")
    elif op.column.name.lower() not in cols:
        try:
            c = r.target.codec(op.column)
        except TypeError as exc:
            raise r.reject("add column", str(exc), ddl.SKIP_HINT + ", then re-snapshot the table") from exc
        r.target.add_column(r.cur, op.database, op.table, op.column)
        # Existing rows get what the source gave them (no row events carry it).
        fill = op.fill
        if op.fill_now:
            fill = datetime.datetime.fromtimestamp(r.commit_ts, datetime.timezone.utc)
            if op.column.base_type != "timestamp":
                log.warning("%s: DEFAULT CURRENT_TIMESTAMP on a %s column filled with the statement time in UTC; "
                            "the source used its session time zone", r.what("add column"), op.column.type)
        if fill is not None:
            tbl = _tbl(op.database, op.table)
            r.cur.execute(f"SELECT COUNT(*) FROM {tbl}")
            if int(r.cur.fetchone()[0]):
                try:
                    value = c.literal(c.coerce(fill))
                except Unstorable as exc:
                    raise r.reject("add column", f"the value {fill!r} the source gave existing rows of "
                                   f"{op.database}.{op.table}.{op.column.name}: {exc.reason}", exc.hint) from exc
                r.step("fill column", f"UPDATE {tbl} SET {quote_ident(op.column.name)} = {value}")
    r.evolve(op.database, op.table, lambda s: replace(
        s, columns=s.columns + (op.column,)) if op.column.name.lower() not in {c.lower() for c in s.column_names} else s)


def _drop_column(r: Run, op: ddl.DropColumn) -> None:
    cols = r.columns(op.database, op.table)
    name = op.column.lower()
    if not cols:
        _skip_missing(r, op.database, op.table, "drop column")
    elif name in cols:
        target_name = cols[name].name
        pk = r.target.primary_key(r.cur, op.database, op.table)
        in_key = pk is not None and name in {k.lower() for k in pk[1]}
        if in_key:  # MySQL shrinks the key; MonetDB refuses to drop a key column
            _drop_pk(r, op.database, op.table)
        r.step("drop column", f"ALTER TABLE {_tbl(op.database, op.table)} DROP COLUMN {quote_ident(target_name)}")
        if in_key and pk is not None:
            _add_pk(r, op.database, op.table, tuple(k for k in pk[1] if k.lower() != name))
    r.evolve(op.database, op.table, lambda s: replace(
        s, columns=tuple(c for c in s.columns if c.name.lower() != name),
        key=tuple(k for k in s.key if k.lower() != name)))


def _modify_column(r: Run, op: ddl.ModifyColumn) -> None:
    db, t, col = op.database, op.table, op.column
    cols = r.columns(db, t)
    if not cols:
        _skip_missing(r, db, t, "modify column")
        return
    current = cols.get(col.name.lower())
    if current is None:
        log.warning("%s: column %s is not on the target; skipped", r.what("modify column"), col.name)
        return
    r.evolve(db, t, lambda s: replace(s, columns=tuple(col if c.name.lower() == col.name.lower() else c
                                                       for c in s.columns)))
    features = r.target.features
    try:
        new: Codec = r.target.codec(replace(col, name=current.name))
        old: Codec = r.target.codec(ColumnDef(current.name, current.source_type))
    except TypeError as exc:
        raise r.reject("modify column", str(exc), ddl.SKIP_HINT + ", then re-snapshot the table") from exc
    tbl, ident = _tbl(db, t), quote_ident(current.name)
    if old.sql_type != new.sql_type:
        if (old.family, new.family) not in CASTABLE:
            raise r.reject("modify column", f"{db}.{t}.{current.name} changes from {old.source.type} "
                           f"({old.sql_type}) to {col.type} ({new.sql_type}); MonetDB cannot convert the stored "
                           "values the way the source did",
                           ddl.SKIP_HINT + ", then re-snapshot the table")
        # MonetDB refuses to change the type of a key column in place.
        pk = r.target.primary_key(r.cur, db, t)
        in_key = pk is not None and current.name.lower() in {k.lower() for k in pk[1]}
        key = _drop_pk(r, db, t) if in_key else ()
        if features.alter_column_type:
            r.step("modify column", f"ALTER TABLE {tbl} ALTER COLUMN {ident} {new.sql_type}")
        else:
            # No in-place type change on this release: copy through a new column.
            tmp = quote_ident(current.name + _TMP_SUFFIX)
            if (current.name + _TMP_SUFFIX).lower() in cols:  # left by hand after an earlier failure
                r.step("drop leftover column", f"ALTER TABLE {tbl} DROP COLUMN {tmp}")
            r.step("add column", f"ALTER TABLE {tbl} ADD COLUMN {tmp} {new.sql_type}")
            r.step("copy column", f"UPDATE {tbl} SET {tmp} = CAST({ident} AS {new.sql_type})")
            r.step("drop column", f"ALTER TABLE {tbl} DROP COLUMN {ident}")
            r.step("rename column", f"ALTER TABLE {tbl} RENAME COLUMN {tmp} TO {ident}")
        _add_pk(r, db, t, key)
    r.step("record source type", r.target.comment_sql(db, t, replace(col, name=current.name)))


def _rename_column(r: Run, op: ddl.RenameColumn) -> None:
    db, t = op.database, op.table
    cols = r.columns(db, t)
    if not cols:
        _skip_missing(r, db, t, "rename column")
        return
    old, new = op.old.lower(), op.new.lower()
    if old not in cols:
        log.info("%s: no column %s on the target (already renamed?)", r.what("rename column"), op.old)
        return
    if new in cols and new != old:
        raise r.reject("rename column", f"both {op.old} and {op.new} exist in {db}.{t}",
                       "drop the stale column on the target, or " + ddl.SKIP_HINT)
    if cols[old].name != op.new:
        # MonetDB refuses to rename a column its primary key depends on:
        # drop the key, rename, add the key back with the new name.
        pk = r.target.primary_key(r.cur, db, t)
        in_key = pk is not None and old in {k.lower() for k in pk[1]}
        key = _drop_pk(r, db, t) if in_key else ()
        r.step("rename column", f"ALTER TABLE {_tbl(db, t)} RENAME COLUMN {quote_ident(cols[old].name)} "
                                f"TO {quote_ident(op.new)}")
        _add_pk(r, db, t, tuple(op.new if k.lower() == old else k for k in key))
    r.evolve(db, t, lambda s: replace(
        s, columns=tuple(replace(c, name=op.new) if c.name.lower() == old else c for c in s.columns),
        key=tuple(op.new if k.lower() == old else k for k in s.key)))


def _add_primary_key(r: Run, op: ddl.AddPrimaryKey) -> None:
    r.evolve(op.database, op.table, lambda s: replace(s, key=op.columns))
    cols = r.columns(op.database, op.table)
    if not cols:
        _skip_missing(r, op.database, op.table, "add primary key")
        return
    pk = r.target.primary_key(r.cur, op.database, op.table)
    if pk is not None and [c.lower() for c in pk[1]] == [c.lower() for c in op.columns]:
        return
    missing = [c for c in op.columns if c.lower() not in cols]
    if missing:
        raise r.reject("add primary key", f"columns {missing} are not in {op.database}.{op.table}",
                       "fix the target table by hand, or " + ddl.SKIP_HINT)
    _drop_pk(r, op.database, op.table)
    _add_pk(r, op.database, op.table, tuple(cols[c.lower()].name for c in op.columns))


def _drop_primary_key(r: Run, op: ddl.DropPrimaryKey) -> None:
    r.evolve(op.database, op.table, lambda s: replace(s, key=()))
    if r.exists(op.database, op.table):
        _drop_pk(r, op.database, op.table)


def _noop(r: Run, op: ddl.NoOp) -> None:
    log.debug("%s: nothing to do on the target (%s)", r.what("no-op"), op.reason)


#: Operation type -> what runs it.
HANDLERS: dict[type[ddl.DdlOp], Callable[[Run, Any], None]] = {
    ddl.CreateDatabase: _create_database,
    ddl.DropDatabase: _drop_database,
    ddl.CreateTable: _create_table,
    ddl.CreateTableLike: _create_table_like,
    ddl.DropTable: _drop_table,
    ddl.RenameTable: _rename_table,
    ddl.Truncate: _truncate,
    ddl.AddColumn: _add_column,
    ddl.DropColumn: _drop_column,
    ddl.ModifyColumn: _modify_column,
    ddl.RenameColumn: _rename_column,
    ddl.AddPrimaryKey: _add_primary_key,
    ddl.DropPrimaryKey: _drop_primary_key,
    ddl.NoOp: _noop,
}


def run(target: MonetDBTarget, cur: Any, op: ddl.DdlOp, sql: str, commit_ts: int = 0) -> None:
    """Apply one operation of the DDL statement ``sql`` inside the open transaction of ``cur``."""
    HANDLERS[type(op)](Run(target, cur, sql, commit_ts), op)
