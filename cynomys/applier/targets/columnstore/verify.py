"""`cynomys verify` on the ColumnStore / MariaDB target: the key range read
in SQL (one range scan of the primary key on InnoDB), values converted to
the model's domain as ``fetch_rows`` does, hashed in Python
(snapshot/checksum.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from cynomys.applier.targets.columnstore.types import fetch_plan
from cynomys.core.model import Row, TableSchema
from cynomys.reducer.sql import MARIADB
from cynomys.snapshot.checksum import KeyRange, key_predicate

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
