"""`cynomys verify` on the ColumnStore / MariaDB target.

The checksum of a key range (verify/checksum.py) is computed by the
server in one aggregate query when every column's type has an exact SQL
rendering of the canonical text (verify/sqlhash.py ``checksum_sql``, the
expression the producer selects its chunks' row hashes with); otherwise the range's
rows are read (one range scan of the primary key on InnoDB), converted to
the model's domain as ``fetch_rows`` does, and hashed in Python.

Key order.  The range is compared in byte order ("Key order" in
verify/checksum.py).  Cynomys creates target tables in
``utf8mb4_nopad_bin``, which compares that way, so the predicate is the
plain (indexed) one.  A key column in another collation (a table made by
hand, or before Cynomys created it) is compared as its bytes,
``CAST(CONVERT(col USING utf8mb4) AS BINARY)``: exact, but no index serves
it, so each chunk scans the table (ColumnStore scans anyway: it has no
indexes).  Such a table is not repaired (``purge_check``): deleting its
keys would delete every key its collation calls equal, outside the range
too, and inserting the source's rows could collide with them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from cynomys.applier.targets.base import Target, register_purge_check
from cynomys.applier.targets.columnstore.types import fetch_plan
from cynomys.core.dialect import MARIADB
from cynomys.core.model import Row, TableSchema, Value
from cynomys.snapshot.chunker import COLUMN_ORDER_SQL, byte_key_param, byte_key_sql, byte_ordered, unordered_columns
from cynomys.verify.checksum import MASK, Checksum, KeyRange, key_predicate
from cynomys.verify.errors import RepairRefused
from cynomys.verify.sqlhash import checksum_sql

if TYPE_CHECKING:
    from pymysql.cursors import Cursor

    from cynomys.applier.targets.columnstore.target import ColumnStoreTarget


def _ident(name: str) -> str:
    # pymysql formats a statement with parameters with %: a literal % doubled.
    return MARIADB.ident(name).replace("%", "%%")


def _columns(cur: Cursor, schema: TableSchema) -> list[tuple[Any, ...]]:
    """The target table's (name, data type, charset, collation) rows; [] if
    missing.  One information_schema query per chunk, as reading the column
    names alone was: the collations come with them."""
    cur.execute(COLUMN_ORDER_SQL, (schema.database, schema.table))
    return list(cur.fetchall())


def _same_columns(have: list[tuple[Any, ...]], schema: TableSchema) -> bool:
    return sorted(str(r[0]).lower() for r in have) == sorted(c.lower() for c in schema.column_names)


def range_predicate(have: list[tuple[Any, ...]], schema: TableSchema, rng: KeyRange) -> tuple[str, list[Any]]:
    """``lo < key <= hi`` in byte order for the target table as it is
    (``have``: its ``_columns``, whose collations decide)."""
    if not schema.key or (rng.lo is None and rng.hi is None):
        return "", []
    unordered = unordered_columns(have, schema.key)

    def expr(name: str, quoted: str) -> str:
        return byte_key_sql(quoted) if name in unordered else quoted

    def param(name: str, v: Value) -> Any:
        return byte_key_param(v) if name in unordered else v

    return key_predicate(schema.key, rng, _ident, lambda i: "%s", expr=expr, param=param)


def range_rows(target: ColumnStoreTarget, schema: TableSchema, rng: KeyRange) -> list[Row] | None:
    """The range's rows in ``schema``'s column order; None when the target
    table's columns are not ``schema``'s (the caller falls back)."""
    db, t = schema.database, schema.table
    with target.transaction(f"reading {db}.{t} for verify") as cur:
        have = _columns(cur, schema)
        if not have:
            return []
        if not _same_columns(have, schema):
            return None
        exprs, convs = fetch_plan(list(schema.columns))
        where, params = range_predicate(have, schema, rng)
        sql = f"SELECT {', '.join(exprs)} FROM {MARIADB.table(db, t)}"
        if where:
            # pymysql formats the statement with % when it has parameters
            sql = sql.replace("%", "%%") + " WHERE " + where
        cur.execute(sql, params or None)
        return [tuple(conv(v) for conv, v in zip(convs, row)) for row in cur.fetchall()]


def purge_check(target: Target, schema: TableSchema) -> None:
    """Refuse the repair of a table whose target key columns are not in a
    byte-order collation (see the module doc)."""
    cs = cast("ColumnStoreTarget", target)
    db, t = schema.database, schema.table
    with cs.transaction(f"reading the key collations of {db}.{t}") as cur:
        cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME, IS_NULLABLE "
                    "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (db, t))
        rows = cur.fetchall()
    key = {k.lower() for k in schema.key}
    for name, ctype, charset, collation, nullable in rows:
        # Deleting by key compares with '=': only the collation matters here
        # (an ENUM's member order does not).
        if str(name).lower() not in key or not collation or byte_ordered("varchar", charset, collation):
            continue
        fix = (f"ALTER TABLE {MARIADB.table(db, t)} MODIFY {MARIADB.ident(str(name))} {ctype} CHARACTER SET utf8mb4 "
               f"COLLATE utf8mb4_nopad_bin{' NOT NULL' if nullable == 'NO' else ''} on the target, then repair again")
        raise RepairRefused(
            f"repair of {db}.{t} refused: its key column {name} on {target.where} has collation {collation}, in "
            "which deleting a key also deletes the keys it calls equal ('a' and 'A', 'a' and 'a ') outside the "
            "range", hint=fix)


register_purge_check("columnstore", purge_check)


def checksum_range(target: ColumnStoreTarget, schema: TableSchema, rng: KeyRange) -> Checksum | None:
    """The range's checksum computed by the server; None when it cannot
    (a column type without an SQL rendering, or other target columns)."""
    sql = checksum_sql(schema)
    if sql is None:
        return None
    db, t = schema.database, schema.table
    with target.transaction(f"checksumming {db}.{t} for verify") as cur:
        have = _columns(cur, schema)
        if not have:
            return Checksum()
        if not _same_columns(have, schema):
            return None
        where, params = range_predicate(have, schema, rng)
        if where:
            sql = sql.replace("%", "%%") + " WHERE " + where
        cur.execute(sql, params or None)
        count, total = cur.fetchone()
    return Checksum(int(count), int(total or 0) & MASK)
