"""Render net changes back into minimal SQL, per dialect.

Consecutive INSERTs of one table become one multi-row INSERT; consecutive
DELETEs one ``DELETE ... WHERE key IN (...)``; an UPDATE sets only the
columns that changed.  Rows of keyless tables are matched on every column
with the NULL-safe comparison and ``LIMIT 1``, since identical rows cannot be
told apart.  Statements (DDL) keep their source text.

Dialects differ as data (quoting, literal forms), not branches.
"""
from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Callable, Iterable, Sequence

from cynomys.core.model import Change, Op, RawTemporal, TableSchema, Value


def _td_text(td: datetime.timedelta) -> str:
    total = td.days * 86400_000000 + td.seconds * 1000000 + td.microseconds
    sign = "-" if total < 0 else ""
    total = abs(total)
    secs, micro = divmod(total, 1000000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{micro:06d}" if micro else "")


def _dt_text(v: datetime.datetime) -> str:
    if v.tzinfo is not None:  # TIMESTAMP: rendered in UTC; sessions run with time_zone '+00:00'
        v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return v.isoformat(sep=" ", timespec="microseconds" if v.microsecond else "seconds")


@dataclass(frozen=True)
class Dialect:
    """How one SQL dialect spells identifiers and literals."""

    name: str
    ident_quote: str
    # String literal escaping: MariaDB also treats backslash as an escape.
    backslash_escapes: bool
    bytes_literal: Callable[[bytes], str]
    null_safe_eq: str  # operator for NULL-safe equality
    supports_limit_in_dml: bool
    upsert_keyword: str  # how a READ (upsert of a full row) is written
    # Spark SQL reads 'it''s' as 'its': quotes must be backslash-escaped there.
    doubled_quotes: bool = True

    def ident(self, name: str) -> str:
        q = self.ident_quote
        return q + name.replace(q, q + q) + q

    def table(self, database: str, table: str) -> str:
        return f"{self.ident(database)}.{self.ident(table)}"

    def string(self, s: str) -> str:
        if self.backslash_escapes:
            s = s.replace("\\", "\\\\").replace("\0", "\\0")
        if self.doubled_quotes:
            return "'" + s.replace("'", "''") + "'"
        return "'" + s.replace("'", "\\'") + "'"

    def literal(self, v: Value) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "1" if v else "0"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, decimal.Decimal):
            # Positional notation: str() gives '1.23E-7' for small values,
            # which servers read as an (inexact) DOUBLE.
            return format(v, "f")
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, bytes):
            return self.bytes_literal(v)
        if isinstance(v, datetime.datetime):
            return self.string(_dt_text(v))
        if isinstance(v, datetime.date):
            return self.string(v.isoformat())
        if isinstance(v, datetime.timedelta):
            return self.string(_td_text(v))
        if isinstance(v, (str, RawTemporal)):
            return self.string(str(v))
        raise TypeError(f"cannot render {type(v).__name__} as SQL")


MARIADB = Dialect("mariadb", "`", True, lambda b: "X'" + b.hex() + "'" if b else "''", "<=>", True, "REPLACE")
# MonetDB reads backslash escapes in '...' literals unless started with raw_strings.
MONETDB = Dialect("monetdb", '"', True, lambda b: "BLOB '" + b.hex() + "'", "IS NOT DISTINCT FROM", False, "")
SPARK = Dialect("spark", "`", True, lambda b: "X'" + b.hex() + "'", "<=>", False, "", doubled_quotes=False)
DIALECTS = {d.name: d for d in (MARIADB, MONETDB, SPARK)}


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
    if len(idx) == 1:
        keys = ", ".join(d.literal((c.before or ())[idx[0]]) for c in cs)
        return [f"DELETE FROM {tbl} WHERE {d.ident(schema.key[0])} IN ({keys})"]
    cols = ", ".join(d.ident(k) for k in schema.key)
    keys = ", ".join("(" + ", ".join(d.literal((c.before or ())[i]) for i in idx) + ")" for c in cs)
    return [f"DELETE FROM {tbl} WHERE ({cols}) IN ({keys})"]


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
