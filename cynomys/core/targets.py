"""The target registry: ``[target] kind`` -> the class that implements it.

The one list of target kinds.  Config validation, ``open_target``, the
benchmarks and the docs read it; adding a target is one line here plus its
folder under ``cynomys/applier/targets/`` (see the README, "Adding a
target").  Classes are named by import path so heavy drivers (PySpark,
pymonetdb, duckdb) load only for the target in use.
"""
from __future__ import annotations

TARGETS: dict[str, str] = {
    "columnstore": "cynomys.applier.targets.columnstore.target:ColumnStoreTarget",
    "duckdb": "cynomys.applier.targets.duckdb.target:DuckDBTarget",
    "monetdb": "cynomys.applier.targets.monetdb.target:MonetDBTarget",
    "spark": "cynomys.applier.targets.spark.target:SparkTarget",
}

TARGET_KINDS: tuple[str, ...] = tuple(TARGETS)
