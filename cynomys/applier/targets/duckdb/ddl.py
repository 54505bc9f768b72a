"""DDL handlers for DuckDB (run by targets/ddl_runner.py).

DuckDB DDL is transactional: every operation of a statement runs in the
transaction that also records the applier state.  Each handler still checks
the catalog first, so applying a statement twice changes nothing.  DuckDB
renames a table only within its schema; a move to another database is a
copy (CREATE TABLE AS SELECT) and a drop, atomic inside the transaction.
No primary keys are declared here, so key changes only update what the
target remembers of the source schema.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

import pyarrow as pa

from cynomys.applier.targets.ddl_runner import DdlRun, handler_table
from cynomys.applier.targets.duckdb.types import DuckType, Unstorable, arrow_column, duck_type, literal
from cynomys.core.model import ColumnDef
from cynomys.parser import ddl

log = logging.getLogger(__name__)


class DuckCatalog(Protocol):
    """What the handlers use of the target (kept apart from target.py, which
    imports this module: no cycle)."""

    def ident(self, name: str) -> str: ...
    def table_name(self, database: str, table: str) -> str: ...
    def check_database(self, database: str) -> None: ...
    def columns(self, cur: Any, database: str, table: str) -> list[ColumnDef]: ...
    def comment_sql(self, database: str, table: str, col: ColumnDef) -> str: ...
    def create_table(self, cur: Any, database: str, table: str, columns: list[ColumnDef]) -> None: ...


@dataclass
class Run(DdlRun[DuckCatalog]):
    """One statement inside the open transaction ``cur``."""

    cur: Any = None

    def drop_table(self, database: str, table: str) -> None:
        self.step(f"DROP TABLE IF EXISTS {self.target.table_name(database, table)}")

    def check_database(self, database: str) -> None:
        self.target.check_database(database)

    def step(self, statement: str) -> None:
        log.info("DDL step on %s: %s", self.where, statement)
        self.cur.execute(statement)

    def columns(self, database: str, table: str) -> dict[str, ColumnDef]:
        """lower-case name -> column with its source type; {} when missing."""
        return {c.name.lower(): c for c in self.target.columns(self.cur, database, table)}

    def duck(self, col: ColumnDef) -> DuckType:
        try:
            return duck_type(col)
        except TypeError as exc:
            raise self.reject("column type", str(exc), ddl.SKIP_HINT + ", then re-snapshot the table") from exc


def _create_database(r: Run, op: ddl.CreateDatabase) -> None:
    r.target.check_database(op.database)
    r.step(f"CREATE SCHEMA IF NOT EXISTS {r.target.ident(op.database)}")


def _drop_database(r: Run, op: ddl.DropDatabase) -> None:
    r.target.check_database(op.database)
    r.step(f"DROP SCHEMA IF EXISTS {r.target.ident(op.database)} CASCADE")


def _create(r: Run, database: str, table: str, columns: list[ColumnDef]) -> None:
    if not r.columns(database, table):
        r.target.create_table(r.cur, database, table, columns)


def _create_table(r: Run, op: ddl.CreateTable) -> None:
    _create(r, op.database, op.table, list(op.columns))


def _create_table_like(r: Run, op: ddl.CreateTableLike) -> None:
    like = r.columns(op.like_database, op.like_table)
    if not like:
        r.skip_missing(op.like_database, op.like_table, "create table like")
        return
    _create(r, op.database, op.table, list(like.values()))


def _rename_table(r: Run, op: ddl.RenameTable) -> None:
    for (odb, old), (ndb, new) in op.pairs:
        r.target.check_database(ndb)
        old_cols = r.columns(odb, old)
        if not r.rename_table_wanted((odb, old), (ndb, new), bool(old_cols), bool(r.columns(ndb, new))):
            continue
        src = r.target.table_name(odb, old)
        if odb == ndb:
            r.step(f"ALTER TABLE {src} RENAME TO {r.target.ident(new)}")
        else:
            r.step(f"CREATE SCHEMA IF NOT EXISTS {r.target.ident(ndb)}")
            r.step(f"CREATE TABLE {r.target.table_name(ndb, new)} AS SELECT * FROM {src}")
            for col in old_cols.values():  # CREATE TABLE AS does not copy comments
                r.step(r.target.comment_sql(ndb, new, col))
            r.step(f"DROP TABLE {src}")


def _truncate(r: Run, op: ddl.Truncate) -> None:
    if r.columns(op.database, op.table):
        r.step(f"DELETE FROM {r.target.table_name(op.database, op.table)}")


def _add_column(r: Run, op: ddl.AddColumn) -> None:
    if r.add_column_wanted(op.database, op.table, r.columns(op.database, op.table), op.column.name):
        t = r.duck(op.column)
        fill = r.fill_value(op)
        try:
            arrow_column(t, [fill])  # refuses what the column cannot hold, naming why
        except (Unstorable, ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
            raise r.reject("add column", f"the value the source gave existing rows of {op.database}."
                           f"{op.table}.{op.column.name} does not fit: {exc}", ddl.SKIP_HINT) from exc
        tbl, name = r.target.table_name(op.database, op.table), r.target.ident(op.column.name)
        # Existing rows get the fill through a DEFAULT: DuckDB cannot commit
        # an UPDATE of a table altered in the same transaction (nor, seen
        # with 1.5, a DROP DEFAULT followed by another ADD COLUMN).  The
        # default stays: every row Cynomys inserts names all its columns.
        r.step(f"ALTER TABLE {tbl} ADD COLUMN {name} {t.sql}" + ("" if fill is None else
                                                                f" DEFAULT {literal(t, fill)}"))
        r.step(r.target.comment_sql(op.database, op.table, op.column))


def _drop_column(r: Run, op: ddl.DropColumn) -> None:
    cols = r.columns(op.database, op.table)
    if r.column_there(op.database, op.table, cols, op.column, "drop column"):
        r.step(f"ALTER TABLE {r.target.table_name(op.database, op.table)} DROP COLUMN "
               f"{r.target.ident(cols[op.column.lower()].name)}")


def _modify_column(r: Run, op: ddl.ModifyColumn) -> None:
    db, t = op.database, op.table
    current: ColumnDef | None = r.column_to_modify(db, t, r.columns(db, t), op.column.name)
    if current is None:
        return
    col = replace(op.column, name=current.name)
    old, new = r.duck(current), r.duck(col)
    if old.sql != new.sql:
        if old.family != new.family:
            raise r.reject("modify column", f"{db}.{t}.{col.name} changes from {current.type} to {col.type}; DuckDB "
                           "cannot convert the stored values the way the source did",
                           ddl.SKIP_HINT + ", then re-snapshot the table")
        r.step(f"ALTER TABLE {r.target.table_name(db, t)} ALTER {r.target.ident(col.name)} TYPE {new.sql}")
    r.step(r.target.comment_sql(db, t, col))


def _rename_column(r: Run, op: ddl.RenameColumn) -> None:
    db, t = op.database, op.table
    cols = r.columns(db, t)
    old = op.old.lower()
    if r.rename_column_wanted(db, t, cols, op.old, op.new) and cols[old].name != op.new:
        r.step(f"ALTER TABLE {r.target.table_name(db, t)} RENAME COLUMN {r.target.ident(cols[old].name)} "
               f"TO {r.target.ident(op.new)}")


def _add_primary_key(r: Run, op: ddl.AddPrimaryKey) -> None:
    """No keys are declared on DuckDB; the runner remembers the new key."""


def _drop_primary_key(r: Run, op: ddl.DropPrimaryKey) -> None:
    """No keys are declared on DuckDB; the runner forgets the key."""


#: Operation type -> what runs it (the functions above, by name).
HANDLERS = handler_table(globals())
