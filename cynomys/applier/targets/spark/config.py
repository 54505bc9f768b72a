"""``[target.spark]``: the Spark target's own settings.

Registered in ``cynomys.core.targets.TARGET_CONFIGS`` and read by the
configuration loader like every other section (unknown keys refused, each
key overridable as ``CYNOMYS_TARGET_SPARK_<KEY>``, documented in
docs/reference/configuration.md); the target reads them with
``cfg.target.of(SparkConfig)``.  This module imports nothing but
``cynomys.core``: the loader imports it even where Spark is not installed.
The layout keys (``partition_by``...) are parsed and checked by
``layout.py`` when the target is built (``cynomys config check`` builds it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from cynomys.core.config import NON_NEGATIVE, POSITIVE, SECRET, TargetOptions, checked, one_of


@dataclass(frozen=True)
class SparkConfig(TargetOptions):
    """The Spark/Iceberg target (`[target] kind = "spark"`, the default)."""

    section: ClassVar[str] = "spark"

    # The Spark master: `local[*]` (in the applier's process), or
    # `spark://host:7077` for a standalone cluster (the warehouse must then
    # be on storage every worker reaches).
    master: str = "local[*]"
    # The Iceberg warehouse; a path is taken relative to the config file.
    warehouse: str = "./warehouse"
    # The catalog's name in SQL: tables are `<catalog>.<db>.<table>`.
    catalog: str = "cynomys"
    # The Iceberg catalog: `hadoop` (a warehouse directory), `jdbc` (table
    # pointers in PostgreSQL or MariaDB/MySQL: a catalog other engines share;
    # data files in `warehouse`), `hive` or `rest` (all three need
    # `catalog_uri`).  See docs/guides/spark-iceberg.md#catalogs.
    catalog_type: str = field(default="hadoop", metadata=one_of("hadoop", "jdbc", "hive", "rest"))
    # The catalog's address: `jdbc:postgresql://host:5432/db` or
    # `jdbc:mariadb://host:3306/db` (jdbc), `thrift://...` (hive), `http://...`
    # (rest); refused with `catalog_type = "hadoop"`.
    catalog_uri: str = ""
    # The JDBC catalog's database user (`catalog_type = "jdbc"`).
    catalog_user: str = ""
    # The JDBC catalog's password; better from the environment
    # (CYNOMYS_TARGET_SPARK_CATALOG_PASSWORD).
    catalog_password: str = field(default="", repr=False, metadata=SECRET)
    # Any Spark setting; it wins over Cynomys's own.
    conf: dict[str, str] = field(default_factory=dict)
    # Jars for the Spark session (relative paths taken from the config file).
    # The Iceberg runtime jar comes from the PyPI package
    # `snowpark-connect-deps-iceberg` unless a jar or package here provides it.
    jars: list[str] = field(default_factory=list)
    # Maven coordinates Spark downloads, e.g.
    # `["org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2"]` when online.
    packages: list[str] = field(default_factory=list)
    # Table maintenance between flushes (cynomys/applier/targets/spark/maintenance.py):
    # every flush adds data and delete files that later flushes and readers
    # read, so a table is compacted after `maintenance_commits` Cynomys
    # commits and snapshots older than `snapshot_retention_s` expire
    # (keeping at least `snapshots_kept`).
    maintenance: bool = True
    # Maintain a table after this many Cynomys commits on it (see `maintenance`).
    maintenance_commits: int = field(default=40, metadata=POSITIVE)
    # Maintenance expires snapshots older than this, in seconds (see `maintenance`).
    snapshot_retention_s: int = field(default=3600, metadata=NON_NEGATIVE)
    # Maintenance keeps at least this many snapshots (see `maintenance`).
    snapshots_kept: int = field(default=5, metadata=POSITIVE)
    # The tables of one flush are committed from this many threads at once
    # (each table is its own Iceberg commit; a small MERGE is mostly driver
    # work, so they overlap); 1 = one table after another.
    commit_threads: int = field(default=4, metadata=POSITIVE)
    # At connect, a small append/MERGE/DELETE on a scratch table warms the
    # JVM's write paths in a thread (spark/warmup.py): a cold JVM's first
    # flushes took 3-5x a warm one's time.
    warm_up: bool = True
    # The Iceberg format version of new tables (3: deletion vectors, one per
    # data file; 2: position-delete files, for readers older than Iceberg
    # 1.8); existing tables keep theirs.  A table's own `format-version` in
    # `table_properties` wins, and holds existing tables to it too (see
    # `layout_changes`).  The default is 3 by bench/results/spark_format_versions.json:
    # flushes and a reader's query were faster on v3 at every checkpoint.
    format_version: int = field(default=3, metadata=checked(lambda v: v in (2, 3), "2 or 3"))
    # Partition spec per table: `"<db>.<table or pattern>" = ["bucket(16, id)",
    # "days(created_at)"]` (identity `col`, `bucket(N, col)`, `truncate(W, col)`,
    # `years`/`months`/`days`/`hours(col)`).  An exact name wins, else the
    # first pattern written that matches.
    partition_by: dict[str, list[str]] = field(default_factory=dict)
    # Sort order per table (the order of the rows in each data file written):
    # `"shop.orders" = ["customer_id", "id DESC"]`; matched as `partition_by`.
    sort_by: dict[str, list[str]] = field(default_factory=dict)
    # Iceberg table properties per table or pattern, e.g. `"*.*" =
    # {"write.parquet.compression-codec" = "zstd", "write.target-file-size-bytes"
    # = "134217728"}`; every match applies (patterns in the order written,
    # then the exact name).  `format-version` here wins over `format_version`.
    table_properties: dict[str, dict[str, str]] = field(default_factory=dict)
    # What to do with an existing table whose layout differs from the above:
    # `refuse` (stop with a message naming the table and the difference) or
    # `evolve` (change it in place: partition evolution, write order,
    # properties, format upgrade; files already written keep their layout
    # until compaction rewrites them).
    layout_changes: str = field(default="refuse", metadata=one_of("refuse", "evolve"))
