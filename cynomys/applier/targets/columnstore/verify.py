"""`cynomys verify` on the ColumnStore / MariaDB target.

The checksum of a key range (snapshot/checksum.py) is computed by the
server in one aggregate query when every column's type has an exact SQL
rendering of the canonical text (``checksum_sql``); otherwise the range's
rows are read (one range scan of the primary key on InnoDB), converted to
the model's domain as ``fetch_rows`` does, and hashed in Python."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from cynomys.applier.targets.columnstore.types import fetch_plan
from cynomys.core.model import Row, TableSchema
from cynomys.reducer.sql import MARIADB
from cynomys.snapshot.checksum import MASK, Checksum, KeyRange, key_predicate

if TYPE_CHECKING:
    from cynomys.applier.targets.columnstore.target import ColumnStoreTarget


def range_rows(target: ColumnStoreTarget, schema: TableSchema, rng: KeyRange) -> list[Row] | None:
    """The range's rows in ``schema``'s column order; None when the target
    table's columns are not ``schema``'s (the caller falls back)."""
    db, t = schema.database, schema.table
    with target._transaction(f"reading {db}.{t} for verify") as cur:
        have = target.target_columns(cur, db, t)
        if not have:
            return []
        if sorted(n.lower() for n, _, _ in have) != sorted(c.lower() for c in schema.column_names):
            return None
        exprs, convs = fetch_plan(list(schema.columns))
        where, params = key_predicate(schema.key, rng, MARIADB.ident, lambda i: "%s")
        sql = f"SELECT {', '.join(exprs)} FROM {MARIADB.table(db, t)}"
        if where:
            # pymysql formats the statement with % when it has parameters
            sql = sql.replace("%", "%%") + " WHERE " + where
        cur.execute(sql, params or None)
        return [tuple(conv(v) for conv, v in zip(convs, row)) for row in cur.fetchall()]


# Source base type -> SQL giving the canonical text of snapshot/checksum.py
# for a non-NULL value.  FLOAT and DOUBLE are missing on purpose: their
# canonical text is Python's shortest round-trip repr(), which MariaDB's
# number-to-text conversion does not reproduce ('1e16' vs '1e+16'), so a
# table with such a column is read back and hashed in Python instead.
_SCALE = re.compile(r"\(\s*\d+\s*,\s*(\d+)\s*\)")
_INT = "CAST({c} AS CHAR)"
_SQL_TEXT: dict[str, str] = {
    **{t: _INT for t in ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bool", "boolean")},
    "bit": "CAST(CAST({c} AS UNSIGNED) AS CHAR)",
    "year": "CAST({c} + 0 AS CHAR)",
    # {s}: the source scale (a target column may keep fewer digits: ColumnStore's DECIMAL(38, 3))
    "decimal": "CAST(CAST({c} AS DECIMAL(65, {s})) AS CHAR)", "numeric": "CAST(CAST({c} AS DECIMAL(65, {s})) AS CHAR)",
    "date": "CAST({c} AS CHAR)",
    "datetime": "DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')",
    "timestamp": "DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')",   # the session runs in UTC
    "time": "CAST(ROUND(TIME_TO_SEC({c}) * 1000000) AS CHAR)",
    **{t: "LOWER(HEX({c}))" for t in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")},
    **{t: "CONVERT({c} USING utf8mb4)" for t in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                                                 "enum", "set", "json")},
}


def checksum_sql(schema: TableSchema) -> str | None:
    """``SELECT COUNT(*), SUM(row hash)`` of the canonical checksum, or None
    when a column's type has no exact SQL rendering here."""
    parts = []
    for col in schema.columns:
        template = _SQL_TEXT.get(col.base_type)
        if template is None:
            return None
        m = _SCALE.search(col.type)
        text = "CAST(" + template.format(c=MARIADB.ident(col.name), s=int(m.group(1)) if m else 0) + " AS BINARY)"
        # CONCAT is NULL when the value is: NULL hashes as the byte 0xFF.
        parts.append(f"IFNULL(CONCAT(LENGTH({text}), ':', {text}), X'FF')")
    row_hash = f"CAST(CONV(LEFT(MD5(CONCAT({', '.join(parts)})), 16), 16, 10) AS UNSIGNED)"
    return f"SELECT COUNT(*), SUM({row_hash}) FROM {MARIADB.table(schema.database, schema.table)}"


def checksum_range(target: ColumnStoreTarget, schema: TableSchema, rng: KeyRange) -> Checksum | None:
    """The range's checksum computed by the server; None when it cannot
    (a column type without an SQL rendering, or other target columns)."""
    sql = checksum_sql(schema)
    if sql is None:
        return None
    db, t = schema.database, schema.table
    with target._transaction(f"checksumming {db}.{t} for verify") as cur:
        have = target.target_columns(cur, db, t)
        if not have:
            return Checksum()
        if sorted(n.lower() for n, _, _ in have) != sorted(c.lower() for c in schema.column_names):
            return None
        where, params = key_predicate(schema.key, rng, MARIADB.ident, lambda i: "%s")
        if where:
            sql = sql.replace("%", "%%") + " WHERE " + where
        cur.execute(sql, params or None)
        count, total = cur.fetchone()
    return Checksum(int(count), int(total or 0) & MASK)
