"""The neutral DDL operations a source statement becomes (cynomys.parser.ddl
parses them), apart from the parser: what reads or writes them (the shaping
stage, the DDL renderer, every target's handlers) needs no SQL parser, so
a producer without DDL to parse never imports sqlglot (about a fifth of its
start-up).  ``cynomys.parser.ddl`` re-exports every name here."""
from __future__ import annotations

import datetime
import decimal
import re
from dataclasses import dataclass

from cynomys.core.errors import TerminalError
from cynomys.core.model import ColumnDef, RawTemporal, Value
from cynomys.core.sourcetypes import BINARY_TYPES, TEXT_TYPES

TableRef = tuple[str, str]  # (database, table)

SKIP_HINT = ("add the statement text (or its binlog position 'file:pos') to [applier] skip_ddl "
             "to skip it on purpose")


class UnsupportedDdl(TerminalError):
    """A DDL statement that cannot be parsed or translated for a target."""

    def __init__(self, sql: str, reason: str) -> None:
        self.sql = sql
        self.reason = reason
        super().__init__(f"cannot translate DDL statement {_shorten(sql)!r}: {reason}", hint=SKIP_HINT)


def _shorten(sql: str, limit: int = 300) -> str:
    one_line = " ".join(sql.split())
    return one_line if len(one_line) <= limit else one_line[:limit] + "..."


# --------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class DdlOp:
    """Base of every operation."""


@dataclass(frozen=True)
class NoOp(DdlOp):
    """Changes nothing a column store holds (index, FK, comment, engine...)."""

    reason: str


@dataclass(frozen=True)
class CreateDatabase(DdlOp):
    database: str
    if_not_exists: bool = False


@dataclass(frozen=True)
class DropDatabase(DdlOp):
    database: str
    if_exists: bool = False


@dataclass(frozen=True)
class CreateTable(DdlOp):
    database: str
    table: str
    columns: tuple[ColumnDef, ...]
    key: tuple[str, ...] = ()  # the primary key; () = none
    if_not_exists: bool = False
    #: Without a key: its UNIQUE and plain indexes on whole columns, unique
    #: first (``TableSchema.indexes``: a target that can index makes them).
    indexes: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class CreateTableLike(DdlOp):
    """CREATE TABLE t LIKE s: the target copies its own table s."""

    database: str
    table: str
    like_database: str
    like_table: str
    if_not_exists: bool = False


@dataclass(frozen=True)
class DropTable(DdlOp):
    tables: tuple[TableRef, ...]
    if_exists: bool = False


@dataclass(frozen=True)
class RenameTable(DdlOp):
    pairs: tuple[tuple[TableRef, TableRef], ...]  # ((db, old), (db, new)), applied in order


@dataclass(frozen=True)
class Truncate(DdlOp):
    database: str
    table: str


@dataclass(frozen=True)
class AddColumn(DdlOp):
    """``fill`` is the value the source gave every existing row (its DEFAULT,
    or the type's zero for NOT NULL without one) -- the binlog carries no
    row events for that, so the target must fill them the same way.
    ``fill_now``: the default is CURRENT_TIMESTAMP, i.e. the statement's time."""

    database: str
    table: str
    column: ColumnDef
    if_not_exists: bool = False
    fill: Value = None
    fill_now: bool = False


@dataclass(frozen=True)
class DropColumn(DdlOp):
    database: str
    table: str
    column: str
    if_exists: bool = False


@dataclass(frozen=True)
class ModifyColumn(DdlOp):
    """A column keeps its name and gets a new type (MODIFY, or CHANGE a a ...)."""

    database: str
    table: str
    column: ColumnDef


@dataclass(frozen=True)
class RenameColumn(DdlOp):
    database: str
    table: str
    old: str
    new: str


@dataclass(frozen=True)
class AddPrimaryKey(DdlOp):
    database: str
    table: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class DropPrimaryKey(DdlOp):
    database: str
    table: str


@dataclass(frozen=True)
class AddIndex(DdlOp):
    """``CREATE [UNIQUE] INDEX`` / ``ALTER TABLE ... ADD KEY|INDEX|UNIQUE`` on
    whole columns: changes no rows, but a keyless table's index lets a
    target that can index find its changed rows (``TableSchema.indexes``);
    every other table and target leaves it alone."""

    database: str
    table: str
    columns: tuple[str, ...]


#: Every operation a statement can become; each target's DDL handler table
#: covers all of them (tests/unit/test_ddl_handlers.py checks it).
ALL_OPS: tuple[type[DdlOp], ...] = (
    NoOp, CreateDatabase, DropDatabase, CreateTable, CreateTableLike, DropTable, RenameTable, Truncate,
    AddColumn, DropColumn, ModifyColumn, RenameColumn, AddPrimaryKey, DropPrimaryKey, AddIndex,
)


#: What MariaDB puts into existing rows for a NOT NULL column added without a
#: DEFAULT: the type's implicit default.
_IMPLICIT_ZERO: dict[str, Value] = {
    "date": RawTemporal("0000-00-00"), "datetime": RawTemporal("0000-00-00 00:00:00"),
    "timestamp": RawTemporal("0000-00-00 00:00:00"), "time": datetime.timedelta(0), "year": 0,
    **dict.fromkeys(TEXT_TYPES + ("json", "set"), ""), **dict.fromkeys(BINARY_TYPES, b""),
    "decimal": decimal.Decimal(0), "float": 0.0, "double": 0.0,
}


def implicit_fill(col: ColumnDef) -> Value:
    """What an added column without a DEFAULT gives the rows already there:
    NULL when nullable, else the type's implicit default."""
    if col.nullable:
        return None
    base = col.base_type
    if base == "enum":
        first = re.match(r"enum\('((?:[^']|'')*)'", col.type)
        return first.group(1).replace("''", "'") if first else ""
    if base == "bit":
        return 0
    return _IMPLICIT_ZERO.get(base, 0)
