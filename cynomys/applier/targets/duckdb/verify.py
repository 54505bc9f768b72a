"""`cynomys verify` on the DuckDB target.

The checksum of a key range (verify/checksum.py) is computed by DuckDB in
one aggregate query when every column's type has an exact SQL rendering of
the canonical text here (``_SQL_TEXT``: not FLOAT/DOUBLE, whose canonical
text is Python's repr); otherwise the range is read in SQL, values decoded
to the model's domain as ``fetch_rows`` does, and hashed in Python.  The SQL
builds each row's bytes as the hash does (``len:text`` per value, the byte
0xFF for NULL) as a BLOB, takes its MD5 and the first 16 hex digits as an
unsigned 64-bit integer, and sums them (a HUGEINT: no overflow) mod 2^64.

The range is compared in byte order ("Key order" in verify/checksum.py).
DuckDB compares VARCHARs by their UTF-8 bytes unless a collation is
declared; the tables Cynomys creates declare none, and ``COLLATE "binary"``
on text key columns keeps the comparison bytewise on a table made with one
(``VARCHAR COLLATE NOCASE``).  It costs nothing: the filter is still pushed
down to the scan."""
from __future__ import annotations

from typing import TYPE_CHECKING

from cynomys.applier.targets.duckdb.types import DuckType, duck_type
from cynomys.core.model import ColumnDef, Row, TableSchema
from cynomys.verify.checksum import MASK, Checksum, KeyRange, key_predicate

if TYPE_CHECKING:
    from cynomys.applier.targets.duckdb.target import DuckDBTarget


def range_rows(target: DuckDBTarget, schema: TableSchema, rng: KeyRange) -> list[Row] | None:
    """The range's rows in ``schema``'s column order; None when the target
    table's columns are not ``schema``'s (the caller falls back)."""
    db, t = schema.database, schema.table
    with target.transaction(f"reading {db}.{t} for verify") as cur:
        columns = {c.name.lower(): c for c in target.columns(cur, db, t)}
        if not columns:
            return []
        if sorted(columns) != sorted(c.lower() for c in schema.column_names):
            return None
        # The target's own column definitions (their source types as the
        # table records them), in the schema's order.
        cols = [columns[n.lower()] for n in schema.column_names]
        types = [duck_type(c) for c in cols]
        exprs = [ty.select.format(c=target.ident(c.name)) for ty, c in zip(types, cols)]
        text = {c.name.lower() for c, ty in zip(cols, types) if ty.family == "text"}
        where, params = key_predicate(schema.key, rng, target.ident, lambda i: "?",
                                      expr=lambda n, q: f'{q} COLLATE "binary"' if n.lower() in text else q)
        sql = f"SELECT {', '.join(exprs)} FROM {target.table_name(db, t)}" + (f" WHERE {where}" if where else "")
        rows = cur.execute(sql, params).fetchall()
    decoders = [ty.decode for ty in types]
    return [tuple(None if v is None else d(v) for d, v in zip(decoders, row)) for row in rows]


# DuckDB type family (types.py) -> SQL giving the canonical text of a
# non-NULL value ({c}: the column).  DECIMAL(p,s) prints its s digits; wider
# DECIMALs are stored as their exact text; TIME as microseconds (BIGINT);
# TIMESTAMP (TIMESTAMPTZ) through its epoch microseconds, in UTC without a
# time zone database.
_DATETIME = "strftime({c}, '%Y-%m-%d %H:%M:%S.%f')"
_SQL_TEXT: dict[str, str] = {
    "integer": "CAST({c} AS VARCHAR)",
    "decimal": "CAST({c} AS VARCHAR)",
    "date": "CAST({c} AS VARCHAR)",
    "datetime": _DATETIME,
    "timestamp": _DATETIME.format(c="make_timestamp(epoch_us({c}))"),
    "time": "CAST({c} AS VARCHAR)",
    "text": "{c}",
    "binary": "lower(hex({c}))",
}


def _part(ty: DuckType, quoted: str) -> str | None:
    template = _SQL_TEXT.get(ty.family)
    if template is None:
        return None
    text = template.format(c=quoted)
    return f"CASE WHEN {quoted} IS NULL THEN '\\xFF'::BLOB ELSE encode(CAST(strlen({text}) AS VARCHAR) || ':' || {text}) END"


def checksum_sql(target: DuckDBTarget, cols: list[ColumnDef], table: str) -> str | None:
    """``SELECT count(*), sum of the row hashes mod 2^64`` over ``table``
    (the target's own column definitions ``cols``, in the schema's order),
    or None when a column type has no exact SQL text here."""
    parts = []
    for c in cols:
        part = _part(duck_type(c), target.ident(c.name))
        if part is None:
            return None
        parts.append(part)
    row = " || ".join(parts) if parts else "''::BLOB"
    row_hash = f"CAST('0x' || left(md5({row}), 16) AS UBIGINT)"
    return f"SELECT count(*), CAST(coalesce(sum({row_hash}), 0) % 18446744073709551616 AS HUGEINT) FROM {table}"


def checksum_range(target: DuckDBTarget, schema: TableSchema, rng: KeyRange) -> Checksum | None:
    """The range's checksum computed by DuckDB; None when it cannot (a
    column type without an exact SQL text, or other target columns)."""
    db, t = schema.database, schema.table
    with target.transaction(f"checksumming {db}.{t} for verify") as cur:
        columns = {c.name.lower(): c for c in target.columns(cur, db, t)}
        if not columns:
            return Checksum()
        if sorted(columns) != sorted(c.lower() for c in schema.column_names):
            return None
        cols = [columns[n.lower()] for n in schema.column_names]
        types = [duck_type(c) for c in cols]
        sql = checksum_sql(target, cols, target.table_name(db, t))
        if sql is None:
            return None
        text = {c.name.lower() for c, ty in zip(cols, types) if ty.family == "text"}
        where, params = key_predicate(schema.key, rng, target.ident, lambda i: "?",
                                      expr=lambda n, q: f'{q} COLLATE "binary"' if n.lower() in text else q)
        count, total = cur.execute(sql + (f" WHERE {where}" if where else ""), params).fetchone()
    return Checksum(int(count), int(total or 0) & MASK)
