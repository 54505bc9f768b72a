"""`cynomys verify` on the Spark/Iceberg target: the key range read with
one Spark SQL query (named parameters; Iceberg prunes data files by the key
bounds), decoded to the model's domain as ``fetch_rows`` does, hashed in
Python (verify/checksum.py) on the driver.

The range is compared in byte order ("Key order" in verify/checksum.py),
as Spark compares strings (UTF8String: unsigned bytes; Spark 3 has no
collations) and as Iceberg prunes files by string bounds."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cynomys.applier.targets.spark.merge import q
from cynomys.core.model import Row, TableSchema
from cynomys.verify.checksum import KeyRange, key_predicate

if TYPE_CHECKING:
    from cynomys.applier.targets.spark.target import SparkTarget


def range_rows(target: SparkTarget, schema: TableSchema, rng: KeyRange) -> list[Row]:
    db, t = schema.database, schema.table
    if not target.table_exists(db, t):
        return []
    where, params = key_predicate(schema.key, rng, q, lambda i: f":p{i}")
    args: dict[str, Any] = {f"p{i}": v for i, v in enumerate(params)}
    rows = target.fetch_rows(db, t, where, args)
    # fetch_rows gives the target's column order; the checksum takes the schema's.
    layout = target.layout(db, t)
    assert layout is not None
    names = [col.name.lower() for _, col in target.source_columns(layout)]
    order = [names.index(n.lower()) for n in schema.column_names] if sorted(names) == sorted(
        n.lower() for n in schema.column_names) else list(range(len(names)))
    return [tuple(r[i] for i in order) for r in rows]
