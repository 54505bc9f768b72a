"""Run neutral DDL operations (reducer.ddl) on a MariaDB-family target.

MariaDB DDL commits on its own, so the applier state is written after the
operations, not with them.  Every operation therefore first checks what the
target already holds and does nothing when its effect is there (table
created, column added, rename done): replaying a DDL after a crash between
the DDL and the state write is harmless.  An ALTER of a table the target
does not have is skipped with a warning: the next flush of that table
creates it from the source's current schema.
"""
from __future__ import annotations

import datetime

import logging
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from pymysql.cursors import Cursor

from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import TableSchema
from cynomys.reducer import ddl
from cynomys.reducer.sql import MARIADB

if TYPE_CHECKING:
    from cynomys.applier.targets.columnstore.target import ColumnStoreTarget

log = logging.getLogger(__name__)

_TMP_SUFFIX = "__cynomys_tmp"


@dataclass
class Run:
    """One DDL statement being applied: the target and the source text."""

    target: ColumnStoreTarget
    sql: str
    commit_ts: int = 0  # source time of the statement (for DEFAULT CURRENT_TIMESTAMP fills)

    def what(self, action: str) -> str:
        text = " ".join(self.sql.split())
        return f"DDL {text[:200]!r}: {action}"

    def step(self, action: str, statement: str) -> None:
        log.info("DDL step on %s: %s", self.target.where, statement)
        self.target.ddl_step(self.what(action), statement,
                             hint="fix the target by hand, or " + ddl.SKIP_HINT)

    def columns(self, database: str, table: str) -> dict[str, tuple[str, str, bool]]:
        """lower-case name -> (name, COLUMN_TYPE, nullable); {} when the table is missing."""
        rows = self.target.query(lambda cur: self.target.target_columns(cur, database, table),
                                 self.what(f"reading columns of {database}.{table}"))
        return {n.lower(): (n, t, nullable) for n, t, nullable in rows}

    def exists(self, database: str, table: str) -> bool:
        return bool(self.target.query(lambda cur: self.target.exists(cur, database, table),
                                      self.what(f"looking up {database}.{table}")))

    def primary_key(self, database: str, table: str) -> tuple[str, ...]:
        def read(cur: Cursor) -> tuple[str, ...]:
            cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s"
                        " AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (database, table))
            return tuple(str(r[0]) for r in cur.fetchall())
        return tuple(self.target.query(read, self.what(f"reading the primary key of {database}.{table}")))

    def evolve(self, database: str, table: str, fn: Callable[[TableSchema], TableSchema | None]) -> None:
        """Keep the remembered source schema (for fetch_rows) in step."""
        known = self.target.schemas.get((database, table))
        if known is not None:
            new = fn(known)
            if new is None:
                self.target.schemas.pop((database, table), None)
            else:
                self.target.schemas[(database, table)] = new


def _tbl(database: str, table: str) -> str:
    return MARIADB.table(database, table)


def _skip_missing(r: Run, database: str, table: str, action: str) -> None:
    log.warning("%s: table %s.%s is not on the target; skipped (its next flush creates it from the source schema)",
                r.what(action), database, table)


def _norm_type(text: str) -> str:
    # information_schema shows 'int(11)' for 'int': display widths mean nothing.
    return re.sub(r"^(tinyint|smallint|mediumint|int|bigint)\(\d+\)", r"\1", text.lower().strip())


# --------------------------------------------------------------------------
# One function per operation
# --------------------------------------------------------------------------
def _create_database(r: Run, op: ddl.CreateDatabase) -> None:
    r.target.check_database(op.database)
    r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(op.database)}")


def _drop_database(r: Run, op: ddl.DropDatabase) -> None:
    r.target.check_database(op.database)
    r.step("drop database", f"DROP DATABASE IF EXISTS {MARIADB.ident(op.database)}")
    for ident in [k for k in r.target.schemas if k[0] == op.database]:
        r.target.schemas.pop(ident)


def _create_table(r: Run, op: ddl.CreateTable) -> None:
    r.target.check_database(op.database)
    r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(op.database)}")
    r.step("create table", r.target.create_table_sql(op.database, op.table, op.columns, op.key))
    r.target.schemas[(op.database, op.table)] = TableSchema(op.database, op.table, op.columns, op.key)


def _create_table_like(r: Run, op: ddl.CreateTableLike) -> None:
    r.target.check_database(op.database)
    if not r.exists(op.like_database, op.like_table):
        _skip_missing(r, op.like_database, op.like_table, "create table like")
        return
    r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(op.database)}")
    r.step("create table like", f"CREATE TABLE IF NOT EXISTS {_tbl(op.database, op.table)} "
                                f"LIKE {_tbl(op.like_database, op.like_table)}")
    like = r.target.schemas.get((op.like_database, op.like_table))
    if like is not None:
        r.target.schemas[(op.database, op.table)] = replace(like, database=op.database, table=op.table)


def _drop_table(r: Run, op: ddl.DropTable) -> None:
    for db, t in op.tables:
        r.target.check_database(db)
        r.step("drop table", f"DROP TABLE IF EXISTS {_tbl(db, t)}")
        r.target.schemas.pop((db, t), None)


def _rename_table(r: Run, op: ddl.RenameTable) -> None:
    for (odb, old), (ndb, new) in op.pairs:
        r.target.check_database(ndb)
        old_there, new_there = r.exists(odb, old), r.exists(ndb, new)
        if not old_there:
            if new_there:
                log.info("%s: already renamed to %s.%s", r.what("rename table"), ndb, new)
            else:
                _skip_missing(r, odb, old, "rename table")
            continue
        if new_there:
            raise TargetRejectedError(f"{r.what('rename table')}: both {odb}.{old} and {ndb}.{new} exist on "
                                      f"{r.target.where}", hint="drop the stale one on the target, or " + ddl.SKIP_HINT)
        r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(ndb)}")
        r.step("rename table", f"RENAME TABLE {_tbl(odb, old)} TO {_tbl(ndb, new)}")
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
        # Existing rows get what the source gave them (no row events carry it).
        fill = op.fill
        if op.fill_now:
            fill = datetime.datetime.fromtimestamp(r.commit_ts, datetime.timezone.utc)
            if op.column.base_type != "timestamp":
                log.warning("%s: DEFAULT CURRENT_TIMESTAMP on a %s column filled with the statement time in UTC; "
                            "the source used its session time zone", r.what("add column"), op.column.type)
        default = "" if fill is None else f" DEFAULT {MARIADB.literal(fill)}"
        r.step("add column", f"ALTER TABLE {_tbl(op.database, op.table)} ADD COLUMN {r.target.column_sql(op.column)}{default}")
    r.evolve(op.database, op.table, lambda s: replace(
        s, columns=s.columns + (op.column,)) if op.column.name.lower() not in {c.lower() for c in s.column_names} else s)


def _drop_column(r: Run, op: ddl.DropColumn) -> None:
    cols = r.columns(op.database, op.table)
    if not cols:
        _skip_missing(r, op.database, op.table, "drop column")
    elif op.column.lower() in cols:
        r.step("drop column", f"ALTER TABLE {_tbl(op.database, op.table)} DROP COLUMN {MARIADB.ident(op.column)}")
    name = op.column.lower()
    r.evolve(op.database, op.table, lambda s: replace(
        s, columns=tuple(c for c in s.columns if c.name.lower() != name),
        key=tuple(k for k in s.key if k.lower() != name)))


def _modify_column(r: Run, op: ddl.ModifyColumn) -> None:
    db, t, col = op.database, op.table, op.column
    cols = r.columns(db, t)
    if not cols:
        _skip_missing(r, db, t, "modify column")
        return
    if col.name.lower() not in cols:
        log.warning("%s: column %s is not on the target; skipped", r.what("modify column"), col.name)
        return
    key = r.primary_key(db, t)
    name, current, _ = cols[col.name.lower()]
    r.evolve(db, t, lambda s: replace(s, columns=tuple(col if c.name.lower() == col.name.lower() else c
                                                       for c in s.columns)))
    if _norm_type(current) == _norm_type(r.target.profile.target_type(col)):
        return  # already this type (or a replay)
    tbl = _tbl(db, t)
    if r.target.profile.modify_in_place:
        r.step("modify column", f"ALTER TABLE {tbl} MODIFY COLUMN {r.target.column_sql(col, key)}")
        return
    # No in-place type change (ColumnStore): copy through a new column.
    tmp = replace(col, name=name + _TMP_SUFFIX)
    if tmp.name.lower() in cols:  # left by an interrupted earlier attempt
        r.step("drop leftover column", f"ALTER TABLE {tbl} DROP COLUMN {MARIADB.ident(tmp.name)}")
    r.step("add column", f"ALTER TABLE {tbl} ADD COLUMN {r.target.column_sql(tmp)}")
    r.step("copy column", f"UPDATE {tbl} SET {MARIADB.ident(tmp.name)} = {MARIADB.ident(name)}")
    r.step("drop column", f"ALTER TABLE {tbl} DROP COLUMN {MARIADB.ident(name)}")
    r.step("rename column", f"ALTER TABLE {tbl} CHANGE COLUMN {MARIADB.ident(tmp.name)} {r.target.column_sql(col)}")


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
        raise TargetRejectedError(f"{r.what('rename column')}: both {op.old} and {op.new} exist in {db}.{t}",
                                  hint="drop the stale column on the target, or " + ddl.SKIP_HINT)
    name, type_text, nullable = cols[old]
    # CHANGE COLUMN restates the target's own type: ColumnStore has no RENAME COLUMN.
    r.step("rename column", f"ALTER TABLE {_tbl(db, t)} CHANGE COLUMN {MARIADB.ident(name)} "
                            f"{MARIADB.ident(op.new)} {type_text} {'NULL' if nullable else 'NOT NULL'}")
    r.evolve(db, t, lambda s: replace(
        s, columns=tuple(replace(c, name=op.new) if c.name.lower() == old else c for c in s.columns),
        key=tuple(op.new if k.lower() == old else k for k in s.key)))


def _add_primary_key(r: Run, op: ddl.AddPrimaryKey) -> None:
    r.evolve(op.database, op.table, lambda s: replace(s, key=op.columns))
    if not r.target.profile.declare_keys:
        return
    if not r.exists(op.database, op.table):
        _skip_missing(r, op.database, op.table, "add primary key")
        return
    current = r.primary_key(op.database, op.table)
    if [c.lower() for c in current] == [c.lower() for c in op.columns]:
        return
    cols = ", ".join(MARIADB.ident(c) for c in op.columns)
    drop = "DROP PRIMARY KEY, " if current else ""
    r.step("add primary key", f"ALTER TABLE {_tbl(op.database, op.table)} {drop}ADD PRIMARY KEY ({cols})")


def _drop_primary_key(r: Run, op: ddl.DropPrimaryKey) -> None:
    r.evolve(op.database, op.table, lambda s: replace(s, key=()))
    if r.target.profile.declare_keys and r.exists(op.database, op.table) and r.primary_key(op.database, op.table):
        r.step("drop primary key", f"ALTER TABLE {_tbl(op.database, op.table)} DROP PRIMARY KEY")


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


def run(target: ColumnStoreTarget, op: ddl.DdlOp, sql: str, commit_ts: int = 0) -> None:
    """Apply one operation of the DDL statement ``sql`` to ``target``."""
    HANDLERS[type(op)](Run(target, sql, commit_ts), op)


