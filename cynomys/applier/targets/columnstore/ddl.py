"""DDL handlers for a MariaDB-family target (run by targets/ddl_runner.py).

MariaDB DDL commits on its own, so the applier state is written after the
operations, not with them.  Every operation therefore first checks what the
target already holds and does nothing when its effect is there (table
created, column added, rename done): replaying a DDL after a crash between
the DDL and the state write is harmless.  An ALTER of a table the target
does not have is skipped with a warning: the next flush of that table
creates it from the source's current schema.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, Sequence

from cynomys.applier.targets.columnstore.types import EngineProfile
from cynomys.applier.targets.ddl_runner import TMP_SUFFIX, DdlRun, handler_table
from cynomys.core.dialect import MARIADB
from cynomys.core.model import ColumnDef, TableSchema
from cynomys.core.sourcetypes import INT_FAMILIES
from cynomys.parser import ddl

log = logging.getLogger(__name__)


class MariaDbTarget(Protocol):
    """What the handlers use of the target (kept apart from target.py, which
    imports this module: no cycle)."""

    profile: EngineProfile

    def query(self, fn: Callable[[Any], Any], what: str, hint: str | None = None) -> Any: ...
    def check_database(self, database: str) -> None: ...
    def column_sql(self, col: ColumnDef, key: Sequence[str] = ()) -> str: ...
    def create_table_sql(self, database: str, table: str, columns: Sequence[ColumnDef],
                         key: Sequence[str]) -> str: ...
    def index_keyless(self, cur: Any, schema: TableSchema) -> None: ...
    @property
    def declares_keys(self) -> bool: ...


@dataclass
class Run(DdlRun[MariaDbTarget]):
    """One statement on a MariaDB-family target: each step commits on its own."""

    def step(self, action: str, statement: str) -> None:
        log.info("DDL step on %s: %s", self.where, statement)
        self.target.query(lambda cur: cur.execute(statement), self.what(action),
                          hint="fix the target by hand, or " + ddl.SKIP_HINT)

    def check_database(self, database: str) -> None:
        self.target.check_database(database)

    def drop_table(self, database: str, table: str) -> None:
        self.step("drop table", f"DROP TABLE IF EXISTS {_tbl(database, table)}")

    def columns(self, database: str, table: str) -> dict[str, tuple[str, str, bool]]:
        """lower-case name -> (name, COLUMN_TYPE, nullable); {} when the table is missing."""
        def read(cur: Any) -> list[tuple[str, str, bool]]:
            cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS"
                        " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (database, table))
            return [(str(n), str(t), v == "YES") for n, t, v in cur.fetchall()]
        rows = self.target.query(read, self.what(f"reading columns of {database}.{table}"))
        return {n.lower(): (n, t, nullable) for n, t, nullable in rows}

    def exists(self, database: str, table: str) -> bool:
        def read(cur: Any) -> bool:
            cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                        (database, table))
            return cur.fetchone() is not None
        return bool(self.target.query(read, self.what(f"looking up {database}.{table}")))

    def primary_key(self, database: str, table: str) -> tuple[str, ...]:
        def read(cur: Any) -> tuple[str, ...]:
            cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s"
                        " AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (database, table))
            return tuple(str(r[0]) for r in cur.fetchall())
        return tuple(self.target.query(read, self.what(f"reading the primary key of {database}.{table}")))


def _tbl(database: str, table: str) -> str:
    return MARIADB.table(database, table)


def _norm_type(text: str) -> str:
    # information_schema shows 'int(11)' for 'int': display widths mean nothing.
    return re.sub(rf"^({'|'.join(INT_FAMILIES)})\(\d+\)", r"\1", text.lower().strip())


# --------------------------------------------------------------------------
# One function per operation
# --------------------------------------------------------------------------
def _create_database(r: Run, op: ddl.CreateDatabase) -> None:
    r.target.check_database(op.database)
    r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(op.database)}")


def _drop_database(r: Run, op: ddl.DropDatabase) -> None:
    r.target.check_database(op.database)
    r.step("drop database", f"DROP DATABASE IF EXISTS {MARIADB.ident(op.database)}")


def _create_table(r: Run, op: ddl.CreateTable) -> None:
    r.target.check_database(op.database)
    r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(op.database)}")
    r.step("create table", r.target.create_table_sql(op.database, op.table, op.columns, op.key))
    if op.indexes:
        schema = TableSchema(op.database, op.table, op.columns, op.key, op.indexes)
        r.target.query(lambda cur: r.target.index_keyless(cur, schema), r.what("index keyless table"))


def _create_table_like(r: Run, op: ddl.CreateTableLike) -> None:
    r.target.check_database(op.database)
    if not r.exists(op.like_database, op.like_table):
        r.skip_missing(op.like_database, op.like_table, "create table like")
        return
    r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(op.database)}")
    r.step("create table like", f"CREATE TABLE IF NOT EXISTS {_tbl(op.database, op.table)} "
                                f"LIKE {_tbl(op.like_database, op.like_table)}")


def _rename_table(r: Run, op: ddl.RenameTable) -> None:
    for (odb, old), (ndb, new) in op.pairs:
        r.target.check_database(ndb)
        if not r.rename_table_wanted((odb, old), (ndb, new), r.exists(odb, old), r.exists(ndb, new)):
            continue
        r.step("create database", f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(ndb)}")
        r.step("rename table", f"RENAME TABLE {_tbl(odb, old)} TO {_tbl(ndb, new)}")


def _truncate(r: Run, op: ddl.Truncate) -> None:
    if r.exists(op.database, op.table):
        r.step("truncate", f"TRUNCATE TABLE {_tbl(op.database, op.table)}")


def _add_column(r: Run, op: ddl.AddColumn) -> None:
    if r.add_column_wanted(op.database, op.table, r.columns(op.database, op.table), op.column.name):
        # Existing rows get what the source gave them (no row events carry it).
        fill = r.fill_value(op)
        default = "" if fill is None else f" DEFAULT {MARIADB.literal(fill)}"
        r.step("add column", f"ALTER TABLE {_tbl(op.database, op.table)} ADD COLUMN {r.target.column_sql(op.column)}{default}")


def _drop_column(r: Run, op: ddl.DropColumn) -> None:
    if r.column_there(op.database, op.table, r.columns(op.database, op.table), op.column, "drop column"):
        r.step("drop column", f"ALTER TABLE {_tbl(op.database, op.table)} DROP COLUMN {MARIADB.ident(op.column)}")


def _modify_column(r: Run, op: ddl.ModifyColumn) -> None:
    db, t, col = op.database, op.table, op.column
    cols = r.columns(db, t)
    if r.column_to_modify(db, t, cols, col.name) is None:
        return
    key = r.primary_key(db, t)
    name, current, _ = cols[col.name.lower()]
    if _norm_type(current) == _norm_type(r.target.profile.target_type(col)):
        return  # already this type (or a replay)
    tbl = _tbl(db, t)
    if r.target.profile.modify_in_place:
        r.step("modify column", f"ALTER TABLE {tbl} MODIFY COLUMN {r.target.column_sql(col, key)}")
        return
    # No in-place type change (ColumnStore): copy through a new column.
    tmp = replace(col, name=name + TMP_SUFFIX)
    if tmp.name.lower() in cols:  # left by an interrupted earlier attempt
        r.step("drop leftover column", f"ALTER TABLE {tbl} DROP COLUMN {MARIADB.ident(tmp.name)}")
    r.step("add column", f"ALTER TABLE {tbl} ADD COLUMN {r.target.column_sql(tmp)}")
    r.step("copy column", f"UPDATE {tbl} SET {MARIADB.ident(tmp.name)} = {MARIADB.ident(name)}")
    r.step("drop column", f"ALTER TABLE {tbl} DROP COLUMN {MARIADB.ident(name)}")
    r.step("rename column", f"ALTER TABLE {tbl} CHANGE COLUMN {MARIADB.ident(tmp.name)} {r.target.column_sql(col)}")


def _rename_column(r: Run, op: ddl.RenameColumn) -> None:
    db, t = op.database, op.table
    cols = r.columns(db, t)
    if not r.rename_column_wanted(db, t, cols, op.old, op.new):
        return
    name, type_text, nullable = cols[op.old.lower()]
    # CHANGE COLUMN restates the target's own type: ColumnStore has no RENAME COLUMN.
    r.step("rename column", f"ALTER TABLE {_tbl(db, t)} CHANGE COLUMN {MARIADB.ident(name)} "
                            f"{MARIADB.ident(op.new)} {type_text} {'NULL' if nullable else 'NOT NULL'}")


def _add_primary_key(r: Run, op: ddl.AddPrimaryKey) -> None:
    if not r.target.declares_keys:
        return
    if not r.exists(op.database, op.table):
        r.skip_missing(op.database, op.table, "add primary key")
        return
    current = r.primary_key(op.database, op.table)
    if [c.lower() for c in current] == [c.lower() for c in op.columns]:
        return
    cols = ", ".join(MARIADB.ident(c) for c in op.columns)
    drop = "DROP PRIMARY KEY, " if current else ""
    r.step("add primary key", f"ALTER TABLE {_tbl(op.database, op.table)} {drop}ADD PRIMARY KEY ({cols})")


def _drop_primary_key(r: Run, op: ddl.DropPrimaryKey) -> None:
    if r.target.declares_keys and r.exists(op.database, op.table) and r.primary_key(op.database, op.table):
        r.step("drop primary key", f"ALTER TABLE {_tbl(op.database, op.table)} DROP PRIMARY KEY")


def _add_index(r: Run, op: ddl.AddIndex) -> None:
    """The source's new index of a keyless table, on an engine with indexes
    (``ColumnStoreTarget.index_keyless``): its changed rows are then found
    by it.  The table is built as on the source, rows and all."""
    if not r.target.declares_keys or not r.exists(op.database, op.table) or r.primary_key(op.database, op.table):
        return
    cols = tuple(ColumnDef(n, t, nullable) for n, t, nullable in r.columns(op.database, op.table).values())
    schema = TableSchema(op.database, op.table, cols, (), (op.columns,))
    r.target.query(lambda cur: r.target.index_keyless(cur, schema), r.what("add index"))


#: Operation type -> what runs it (the functions above, by name).
HANDLERS = handler_table(globals())

