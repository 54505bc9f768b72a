"""DDL handlers for MonetDB (run by targets/ddl_runner.py).

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

import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

import pymonetdb

from cynomys.applier.targets.ddl_runner import TMP_SUFFIX, DdlRun, handler_table
from cynomys.applier.targets.monetdb.types import (
    CASTABLE,
    Codec,
    ServerFeatures,
    Unstorable,
    native_source_type,
    qualified,
    quote_ident,
)
from cynomys.applier.targets.source_types import source_type_from_comment
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import ColumnDef, TableSchema
from cynomys.parser import ddl

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetColumn:
    """A column as the MonetDB catalog has it."""

    name: str
    type: str            # sys.columns.type: 'int', 'varchar', 'decimal', 'timestamptz', ...
    digits: int
    scale: int
    nullable: bool
    remark: str | None   # its comment

    @property
    def source_type(self) -> str:
        """The source type recorded in the comment, else one that decodes it."""
        return source_type_from_comment(self.remark) or native_source_type(self.type, self.digits, self.scale)


class MonetDBCatalog(Protocol):
    """What the handlers use of the target (kept apart from target.py, which
    imports this module: no cycle)."""

    features: ServerFeatures

    def is_transient(self, exc: BaseException) -> bool: ...
    def describe(self, exc: BaseException) -> str: ...
    def codec(self, col: ColumnDef) -> Codec: ...
    def schema_info(self, cur: Any, schema: str) -> tuple[int, bool] | None: ...
    def table_id(self, cur: Any, schema: str, table: str) -> int | None: ...
    def target_columns(self, cur: Any, schema: str, table: str) -> list[TargetColumn]: ...
    def primary_key(self, cur: Any, schema: str, table: str) -> tuple[str, tuple[str, ...]] | None: ...
    def check_schema(self, cur: Any, database: str) -> None: ...
    def ensure_schema(self, cur: Any, database: str) -> None: ...
    def create_table(self, cur: Any, database: str, table: str, columns: Sequence[ColumnDef],
                     key: Sequence[str]) -> None: ...
    def add_column(self, cur: Any, database: str, table: str, col: ColumnDef) -> None: ...
    def comment_sql(self, database: str, table: str, col: ColumnDef) -> str: ...


@dataclass
class Run(DdlRun[MonetDBCatalog]):
    """One statement on MonetDB, inside the transaction that also records
    the applier state (``cur``)."""

    cur: Any = None

    def step(self, action: str, statement: str) -> None:
        log.info("DDL step on %s: %s", self.where, statement)
        try:
            self.cur.execute(statement)
        except Exception as exc:
            if self.target.is_transient(exc) or not isinstance(exc, pymonetdb.Error):
                raise
            raise TargetRejectedError(f"{self.what(action)} ({statement}) on {self.where}: target refused it "
                                      f"({self.target.describe(exc)})",
                                      hint="fix the target by hand, or " + ddl.SKIP_HINT) from exc

    def check_database(self, database: str) -> None:
        self.target.check_schema(self.cur, database)

    def drop_table(self, database: str, table: str) -> None:
        if self.exists(database, table):  # no IF EXISTS on 11.33
            self.step("drop table", f"DROP TABLE {_tbl(database, table)}")

    def columns(self, database: str, table: str) -> dict[str, TargetColumn]:
        """lower-case name -> column; {} when the table is missing."""
        return {c.name.lower(): c for c in self.target.target_columns(self.cur, database, table)}

    def exists(self, database: str, table: str) -> bool:
        return self.target.table_id(self.cur, database, table) is not None


def _tbl(database: str, table: str) -> str:
    return qualified(database, table)


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
    r.target.check_schema(r.cur, op.database)
    if r.target.schema_info(r.cur, op.database) is not None:
        r.step("drop database", f"DROP SCHEMA {quote_ident(op.database)} CASCADE")


def _create_table(r: Run, op: ddl.CreateTable) -> None:
    r.target.ensure_schema(r.cur, op.database)
    if r.exists(op.database, op.table):
        log.info("%s: %s.%s exists already", r.what("create table"), op.database, op.table)
    else:
        r.target.create_table(r.cur, op.database, op.table, op.columns, op.key)


def _create_table_like(r: Run, op: ddl.CreateTableLike) -> None:
    like = r.columns(op.like_database, op.like_table)
    if not like:
        r.skip_missing(op.like_database, op.like_table, "create table like")
        return
    r.target.ensure_schema(r.cur, op.database)
    pk = r.target.primary_key(r.cur, op.like_database, op.like_table)
    key = pk[1] if pk else ()
    known = r.schemas.get((op.like_database, op.like_table))
    if known is not None and sorted(c.lower() for c in known.column_names) == sorted(like):
        columns = known.columns
    else:
        columns = tuple(ColumnDef(c.name, c.source_type, c.nullable) for c in like.values())
    if not r.exists(op.database, op.table):
        r.target.create_table(r.cur, op.database, op.table, columns, key)
    r.schemas[(op.database, op.table)] = TableSchema(op.database, op.table, tuple(columns), tuple(key))


def _rename_table(r: Run, op: ddl.RenameTable) -> None:
    for (odb, old), (ndb, new) in op.pairs:
        r.target.check_schema(r.cur, ndb)
        if not r.rename_table_wanted((odb, old), (ndb, new), r.exists(odb, old), r.exists(ndb, new)):
            continue
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


def _truncate(r: Run, op: ddl.Truncate) -> None:
    if r.exists(op.database, op.table):
        r.step("truncate", f"TRUNCATE TABLE {_tbl(op.database, op.table)}")


def _add_column(r: Run, op: ddl.AddColumn) -> None:
    if r.add_column_wanted(op.database, op.table, r.columns(op.database, op.table), op.column.name):
        try:
            c = r.target.codec(op.column)
        except TypeError as exc:
            raise r.reject("add column", str(exc), ddl.SKIP_HINT + ", then re-snapshot the table") from exc
        r.target.add_column(r.cur, op.database, op.table, op.column)
        # Existing rows get what the source gave them (no row events carry it).
        fill = r.fill_value(op)
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


def _drop_column(r: Run, op: ddl.DropColumn) -> None:
    cols = r.columns(op.database, op.table)
    name = op.column.lower()
    if r.column_there(op.database, op.table, cols, op.column, "drop column"):
        target_name = cols[name].name
        pk = r.target.primary_key(r.cur, op.database, op.table)
        in_key = pk is not None and name in {k.lower() for k in pk[1]}
        if in_key:  # MySQL shrinks the key; MonetDB refuses to drop a key column
            _drop_pk(r, op.database, op.table)
        r.step("drop column", f"ALTER TABLE {_tbl(op.database, op.table)} DROP COLUMN {quote_ident(target_name)}")
        if in_key and pk is not None:
            _add_pk(r, op.database, op.table, tuple(k for k in pk[1] if k.lower() != name))


def _modify_column(r: Run, op: ddl.ModifyColumn) -> None:
    db, t, col = op.database, op.table, op.column
    cols = r.columns(db, t)
    current: TargetColumn | None = r.column_to_modify(db, t, cols, col.name)
    if current is None:
        return
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
            tmp = quote_ident(current.name + TMP_SUFFIX)
            if (current.name + TMP_SUFFIX).lower() in cols:  # left by hand after an earlier failure
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
    old = op.old.lower()
    if not r.rename_column_wanted(db, t, cols, op.old, op.new):
        return
    if cols[old].name != op.new:
        # MonetDB refuses to rename a column its primary key depends on:
        # drop the key, rename, add the key back with the new name.
        pk = r.target.primary_key(r.cur, db, t)
        in_key = pk is not None and old in {k.lower() for k in pk[1]}
        key = _drop_pk(r, db, t) if in_key else ()
        r.step("rename column", f"ALTER TABLE {_tbl(db, t)} RENAME COLUMN {quote_ident(cols[old].name)} "
                                f"TO {quote_ident(op.new)}")
        _add_pk(r, db, t, tuple(op.new if k.lower() == old else k for k in key))


def _add_primary_key(r: Run, op: ddl.AddPrimaryKey) -> None:
    cols = r.columns(op.database, op.table)
    if not cols:
        r.skip_missing(op.database, op.table, "add primary key")
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
    if r.exists(op.database, op.table):
        _drop_pk(r, op.database, op.table)


#: Operation type -> what runs it (the functions above, by name).
HANDLERS = handler_table(globals())

