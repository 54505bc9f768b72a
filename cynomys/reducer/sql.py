"""Render net changes back into minimal SQL, per dialect.

Consecutive INSERTs of one table become one multi-row INSERT; consecutive
DELETEs one ``DELETE ... WHERE key IN (...)``; an UPDATE sets only the
columns that changed.  Rows of keyless tables are matched on every column
with the NULL-safe comparison and ``LIMIT 1``, since identical rows cannot be
told apart.  Statements (DDL) keep their source text.

Dialects differ as data (quoting, literal forms), not branches: the
``Dialect`` values of ``cynomys.core.dialect``.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import groupby
from typing import Iterable, Sequence

from cynomys.core.dialect import MARIADB, Dialect
from cynomys.core.model import Change, Op, TableSchema, Value


def _where_row(d: Dialect, schema: TableSchema, row: Sequence[Value]) -> str:
    return " AND ".join(f"{d.ident(c.name)} {d.null_safe_eq} {d.literal(v)}" for c, v in zip(schema.columns, row))


def _where_key(d: Dialect, schema: TableSchema, row: Sequence[Value]) -> str:
    idx = schema.key_indexes()
    return " AND ".join(f"{d.ident(schema.key[i])} = {d.literal(row[j])}" for i, j in enumerate(idx))


def _insert(d: Dialect, cs: list[Change], keyword: str = "INSERT") -> str:
    schema = cs[0].schema
    assert schema is not None
    cols = ", ".join(d.ident(c) for c in schema.column_names)
    values = ",\n  ".join("(" + ", ".join(d.literal(v) for v in c.after or ()) + ")" for c in cs)
    return f"{keyword} INTO {d.table(cs[0].database, cs[0].table)} ({cols}) VALUES\n  {values}"


def _delete(d: Dialect, cs: list[Change]) -> list[str]:
    schema = cs[0].schema
    assert schema is not None
    tbl = d.table(cs[0].database, cs[0].table)
    if not schema.key:
        limit = " LIMIT 1" if d.supports_limit_in_dml else ""
        return [f"DELETE FROM {tbl} WHERE {_where_row(d, schema, c.before or ())}{limit}" for c in cs]
    idx = schema.key_indexes()
    keys = [[(c.before or ())[i] for i in idx] for c in cs]
    return [f"DELETE FROM {tbl} WHERE {d.keys_in(schema.key, keys)}"]


def _update(d: Dialect, c: Change) -> str:
    schema = c.schema
    assert schema is not None and c.before is not None and c.after is not None
    sets = ", ".join(f"{d.ident(col.name)} = {d.literal(new)}"
                     for col, old, new in zip(schema.columns, c.before, c.after) if old != new or type(old) is not type(new))
    tbl = d.table(c.database, c.table)
    if not sets:
        sets = f"{d.ident(schema.columns[0].name)} = {d.ident(schema.columns[0].name)}"
    if schema.key:
        return f"UPDATE {tbl} SET {sets} WHERE {_where_key(d, schema, c.before)}"
    limit = " LIMIT 1" if d.supports_limit_in_dml else ""
    return f"UPDATE {tbl} SET {sets} WHERE {_where_row(d, schema, c.before)}{limit}"


def render(changes: Iterable[Change], dialect: Dialect = MARIADB) -> list[str]:
    """Minimal SQL statements for net changes, in order."""
    out: list[str] = []
    for (op, db, tbl), group in groupby(changes, key=lambda c: (c.op, c.database, c.table)):
        cs = list(group)
        if op is Op.DDL:
            out.extend(c.sql or "" for c in cs)
        elif op in (Op.CHECKSUM, Op.PURGE):
            # Verification records (`cynomys verify`) change nothing by themselves: shown, not run.
            out.extend(f"/* {op.value} {db}.{tbl} {(c.sql or '').replace('*/', '* /')} */" for c in cs)
        elif op is Op.INSERT:
            out.append(_insert(dialect, cs))
        elif op is Op.READ:
            if dialect.upsert_keyword:
                out.append(_insert(dialect, cs, dialect.upsert_keyword))
            else:
                # No upsert statement: delete the keys, then insert the images.
                keyed = cs[0].schema is not None and bool(cs[0].schema.key)
                out.extend(_delete(dialect, [replace(c, before=c.after) for c in cs]) if keyed else [])
                out.append(_insert(dialect, cs))
        elif op is Op.DELETE:
            out.extend(_delete(dialect, cs))
        else:
            out.extend(_update(dialect, c) for c in cs)
    return out


def render_one(change: Change, dialect: Dialect = MARIADB) -> str:
    return ";\n".join(render([change], dialect))
