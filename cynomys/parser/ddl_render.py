"""Neutral DDL operations (cynomys.parser.ddl) written back as MariaDB SQL.

The producer's shaping stage (cynomys/shape) rewrites a source statement
that touches shaped tables -- a routed table's name, a column left out or
renamed, a masked column's type -- as operations, and ships them as SQL
text: the wire carries a DDL record's statement, and the applier parses it
with ``parse_ddl`` like any other.  So this module's one rule is the round
trip: ``parse_ddl(render(ops), db) == ops`` for every operation it writes
(tests/unit/test_ddl_render.py checks each kind and value).

Values an ``ADD COLUMN`` gives the rows already there are written so that
they come back as the same Python value: the type's implicit default is
left implicit (no DEFAULT on a NOT NULL column), text as a string literal,
bytes as a hex literal (they need not be UTF-8), numbers as their digits.
A ``NoOp`` has no statement: callers drop them (a statement left with
none is not shipped at all).  ``RenameTable`` is written alone: MariaDB's
RENAME TABLE is its own statement.
"""
from __future__ import annotations

import datetime
import decimal
from typing import Any, Callable, Sequence

from cynomys.core.dialect import MARIADB
from cynomys.core.model import ColumnDef, Value
from cynomys.parser import ddl_ops as ddl


def _table(database: str, table: str) -> str:
    return MARIADB.table(database, table)


def _column(col: ColumnDef) -> str:
    return f"{MARIADB.ident(col.name)} {col.type}{'' if col.nullable else ' NOT NULL'}"


def literal(value: Value) -> str:
    """A DEFAULT value as the source's SQL spells it (``parse_ddl`` reads it back)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return f"X'{value.hex()}'" if value else "''"
    if isinstance(value, (datetime.date, datetime.timedelta)):
        raise ValueError(f"a {type(value).__name__} default has no literal here (the parser gives text)")
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"


def _default(op: ddl.AddColumn) -> str:
    if op.fill_now:
        return " DEFAULT CURRENT_TIMESTAMP"
    implicit = ddl.implicit_fill(op.column)
    if op.fill == implicit and type(op.fill) is type(implicit):
        return ""  # left implicit: parse_ddl fills the same value
    return " DEFAULT " + literal(op.fill)


def _create_table(op: ddl.CreateTable) -> str:
    parts = [_column(c) for c in op.columns]
    if op.key:
        parts.append("PRIMARY KEY (" + ", ".join(MARIADB.ident(k) for k in op.key) + ")")
    parts += ["KEY (" + ", ".join(MARIADB.ident(c) for c in index) + ")" for index in op.indexes]
    exists = "IF NOT EXISTS " if op.if_not_exists else ""
    return f"CREATE TABLE {exists}{_table(op.database, op.table)} ({', '.join(parts)})"


def _alter(database: str, table: str, action: str) -> str:
    return f"ALTER TABLE {_table(database, table)} {action}"


def _if(flag: bool, words: str) -> str:
    return words + " " if flag else ""


def _create_database(op: ddl.CreateDatabase) -> str:
    return f"CREATE DATABASE {_if(op.if_not_exists, 'IF NOT EXISTS')}{MARIADB.ident(op.database)}"


def _drop_database(op: ddl.DropDatabase) -> str:
    return f"DROP DATABASE {_if(op.if_exists, 'IF EXISTS')}{MARIADB.ident(op.database)}"


def _create_table_like(op: ddl.CreateTableLike) -> str:
    return (f"CREATE TABLE {_if(op.if_not_exists, 'IF NOT EXISTS')}{_table(op.database, op.table)} "
            f"LIKE {_table(op.like_database, op.like_table)}")


def _drop_table(op: ddl.DropTable) -> str:
    return f"DROP TABLE {_if(op.if_exists, 'IF EXISTS')}" + ", ".join(_table(d, t) for d, t in op.tables)


def _rename_table(op: ddl.RenameTable) -> str:
    return "RENAME TABLE " + ", ".join(f"{_table(*a)} TO {_table(*b)}" for a, b in op.pairs)


def _truncate(op: ddl.Truncate) -> str:
    return f"TRUNCATE TABLE {_table(op.database, op.table)}"


def _add_column(op: ddl.AddColumn) -> str:
    return _alter(op.database, op.table,
                  f"ADD COLUMN {_if(op.if_not_exists, 'IF NOT EXISTS')}{_column(op.column)}{_default(op)}")


def _drop_column(op: ddl.DropColumn) -> str:
    return _alter(op.database, op.table, f"DROP COLUMN {_if(op.if_exists, 'IF EXISTS')}{MARIADB.ident(op.column)}")


def _modify_column(op: ddl.ModifyColumn) -> str:
    return _alter(op.database, op.table, "MODIFY COLUMN " + _column(op.column))


def _rename_column(op: ddl.RenameColumn) -> str:
    return _alter(op.database, op.table, f"RENAME COLUMN {MARIADB.ident(op.old)} TO {MARIADB.ident(op.new)}")


def _add_primary_key(op: ddl.AddPrimaryKey) -> str:
    return _alter(op.database, op.table, "ADD PRIMARY KEY (" + ", ".join(MARIADB.ident(c) for c in op.columns) + ")")


def _drop_primary_key(op: ddl.DropPrimaryKey) -> str:
    return _alter(op.database, op.table, "DROP PRIMARY KEY")


def _add_index(op: ddl.AddIndex) -> str:
    return _alter(op.database, op.table, "ADD INDEX (" + ", ".join(MARIADB.ident(c) for c in op.columns) + ")")


#: Operation type -> its statement (every type of ddl.ALL_OPS but NoOp).
_RENDER: dict[type[ddl.DdlOp], Callable[[Any], str]] = {
    ddl.CreateDatabase: _create_database, ddl.DropDatabase: _drop_database, ddl.CreateTable: _create_table,
    ddl.CreateTableLike: _create_table_like, ddl.DropTable: _drop_table, ddl.RenameTable: _rename_table,
    ddl.Truncate: _truncate, ddl.AddColumn: _add_column, ddl.DropColumn: _drop_column,
    ddl.ModifyColumn: _modify_column, ddl.RenameColumn: _rename_column, ddl.AddPrimaryKey: _add_primary_key,
    ddl.DropPrimaryKey: _drop_primary_key, ddl.AddIndex: _add_index,
}


def render(ops: Sequence[ddl.DdlOp]) -> str:
    """``ops`` (no NoOp among them) as one SQL text: statements joined by
    '; ', which ``parse_ddl`` reads back as the same operations."""
    if not ops:
        raise ValueError("nothing to render")
    if any(isinstance(op, ddl.RenameTable) for op in ops) and len(ops) > 1:
        raise ValueError("RENAME TABLE is rendered alone")
    out = []
    for op in ops:
        fn = _RENDER.get(type(op))
        if fn is None:
            raise ValueError(f"{type(op).__name__} has no statement")
        out.append(fn(op))
    return "; ".join(out)
