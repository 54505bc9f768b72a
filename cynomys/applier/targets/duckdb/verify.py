"""`cynomys verify` on the DuckDB target: the key range read in SQL, values
decoded to the model's domain as ``fetch_rows`` does, hashed in Python
(verify/checksum.py).

The range is compared in byte order ("Key order" in verify/checksum.py).
DuckDB compares VARCHARs by their UTF-8 bytes unless a collation is
declared; the tables Cynomys creates declare none, and ``COLLATE "binary"``
on text key columns keeps the comparison bytewise on a table made with one
(``VARCHAR COLLATE NOCASE``).  It costs nothing: the filter is still pushed
down to the scan."""
from __future__ import annotations

from typing import TYPE_CHECKING

from cynomys.applier.targets.duckdb.types import duck_type
from cynomys.core.model import Row, TableSchema
from cynomys.verify.checksum import KeyRange, key_predicate

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
