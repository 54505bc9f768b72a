"""Reading the replica without Spark: where each table's current Iceberg
metadata file is, pyiceberg tables, and a DuckDB connection with a view per
table (``cynomys sql --engine duckdb``; tests/integration/test_spark_readers.py
reads every table this way and compares it with the source).

No JVM and no pyspark import here.  By catalog type:

- ``hadoop``: the catalog *is* the warehouse folder; each table's
  ``metadata/version-hint.text`` names its current ``v<N>.metadata.json``
  (pyiceberg has no Hadoop catalog: its ``StaticTable`` opens that file).
- ``jdbc``: Iceberg's JdbcCatalog tables in PostgreSQL or MariaDB/MySQL,
  read by pyiceberg's ``SqlCatalog`` (SQLAlchemy with psycopg2 or pymysql)
  under the same catalog name as Spark's.
- ``rest`` and ``hive``: pyiceberg's own catalogs (not tested here).

Every read takes the table's current snapshot at that moment: a reader that
reopens the table sees the applier's newest commit (unlike a Spark session
with the catalog cache on: docs/guides/spark-iceberg.md#read-the-replica-from-other-engines).
"""
from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, TargetUnavailableError

log = logging.getLogger(__name__)

#: Namespaces of Cynomys's own tables (applier state, warm-up): not replicas.
OWN_NAMESPACES = frozenset({"cynomys_state"})

#: JDBC URL scheme -> SQLAlchemy driver (pyiceberg's SqlCatalog).
SQLALCHEMY_DRIVERS = {"postgresql": "postgresql+psycopg2", "mariadb": "mysql+pymysql", "mysql": "mysql+pymysql"}


@dataclass(frozen=True)
class TableRef:
    database: str
    table: str
    metadata: str  # the current metadata file (a path or URI)


def _settings(cfg: Config) -> SparkConfig:
    return cfg.target.of(SparkConfig)


def warehouse_path(cfg: Config) -> str:
    sc = _settings(cfg)
    if re.match(r"^[A-Za-z][\w+.-]*:", sc.warehouse) and not re.match(r"^[A-Za-z]:[\\/]", sc.warehouse):
        return sc.warehouse
    return str(cfg.resolve(sc.warehouse).absolute())


def sqlalchemy_url(cfg: Config) -> str:
    """The JDBC catalog's database as a SQLAlchemy URL (credentials from [target.spark])."""
    sc = _settings(cfg)
    m = re.match(r"^jdbc:([a-z0-9]+):(//.*)$", sc.catalog_uri)
    if not m or m.group(1) not in SQLALCHEMY_DRIVERS:
        raise ConfigError(f"[target.spark] catalog_uri = {sc.catalog_uri!r} is not a JDBC URL pyiceberg can read",
                          hint="use jdbc:postgresql://host:5432/db or jdbc:mariadb://host:3306/db")
    parts = urlsplit(m.group(2))
    auth = ""
    if sc.catalog_user:
        auth = quote(sc.catalog_user, safe="") + (":" + quote(sc.catalog_password, safe="")
                                                  if sc.catalog_password else "") + "@"
    return f"{SQLALCHEMY_DRIVERS[m.group(1)]}://{auth}{parts.netloc}{parts.path}"


def pyiceberg_catalog(cfg: Config) -> Any:
    """The target's catalog through pyiceberg (None for a Hadoop catalog)."""
    sc = _settings(cfg)
    if sc.catalog_type == "hadoop":
        return None
    try:
        from pyiceberg.catalog import load_catalog
    except ImportError:
        raise ConfigError("reading the replica without Spark needs pyiceberg",
                          hint="pip install 'cynomys[lake]'") from None
    props: dict[str, str] = {"warehouse": warehouse_path(cfg)}
    if sc.catalog_type == "jdbc":
        props.update(type="sql", uri=sqlalchemy_url(cfg))
    else:
        props.update(type=sc.catalog_type, uri=sc.catalog_uri)
    return load_catalog(sc.catalog, **props)


_METADATA_FILE = re.compile(r"^v(\d+)\.metadata\.json$")


def _hadoop_version(meta: Path) -> int | None:
    """A Hadoop-catalog table's current metadata version, as Iceberg's
    HadoopTableOperations finds it: the version hint, then on past every
    newer ``v<N>.metadata.json`` (the hint is written after the metadata
    file, so it may lag); without a readable hint naming a file that is
    there (the writer replaces the hint by a delete and a rename, and a
    reader can fall in between), the highest version present.  None: no
    metadata file."""
    try:
        version: int | None = int((meta / "version-hint.text").read_text().strip())
    except (OSError, ValueError):
        version = None
    if version is None or not (meta / f"v{version}.metadata.json").exists():
        found = [int(m.group(1)) for m in map(_METADATA_FILE.match, os.listdir(meta)) if m] \
            if meta.is_dir() else []
        if not found:
            return None
        version = max(found)
    while (meta / f"v{version + 1}.metadata.json").exists():
        version += 1
    return version


def _hadoop_tables(root: str) -> list[TableRef]:
    out = []
    for folder in sorted(glob.glob(os.path.join(root, "*", "*", "metadata"))):
        meta = Path(folder)
        version = _hadoop_version(meta)
        if version is not None:
            out.append(TableRef(meta.parent.parent.name, meta.parent.name, str(meta / f"v{version}.metadata.json")))
    return out


def tables(cfg: Config, include_own: bool = False) -> list[TableRef]:
    """Every table of the target's catalog and its current metadata file."""
    sc = _settings(cfg)
    if sc.catalog_type == "hadoop":
        root = warehouse_path(cfg)
        if root.startswith("file:"):
            root = urlsplit(root).path
        elif "://" in root:
            raise ConfigError(f"[target.spark] warehouse = {sc.warehouse!r}: only a local Hadoop warehouse can be "
                              "read without Spark", hint="use cynomys sql with the Spark engine")
        found = _hadoop_tables(root)
    else:
        catalog = pyiceberg_catalog(cfg)
        found = []
        try:
            for ns in catalog.list_namespaces():
                for ident in catalog.list_tables(ns):
                    t = catalog.load_table(ident)
                    found.append(TableRef(ident[0], ident[-1], str(t.metadata_location)))
        except Exception as exc:  # the catalog's database is down, refuses us...
            raise TargetUnavailableError(f"cannot list the tables of the {sc.catalog_type} catalog "
                                         f"{sc.catalog!r}: {str(exc).splitlines()[0][:300]}",
                                         hint="check [target.spark] catalog_uri and its credentials") from exc
    return [t for t in found if include_own or t.database not in OWN_NAMESPACES]


def pyiceberg_table(cfg: Config, database: str, table: str) -> Any:
    """The table's current state through pyiceberg (``.scan().to_arrow()``, ``.spec()``...)."""
    catalog = pyiceberg_catalog(cfg)
    if catalog is not None:
        return catalog.load_table((database, table))
    from pyiceberg.table import StaticTable

    for ref in tables(cfg, include_own=True):
        if (ref.database, ref.table) == (database, table):
            return StaticTable.from_metadata(ref.metadata)
    raise ConfigError(f"table {database}.{table} is not in the warehouse {warehouse_path(cfg)}")


# --------------------------------------------------------------------------
# DuckDB
# --------------------------------------------------------------------------
def _extension(package: str, name: str) -> str:
    try:
        mod = __import__(package)
    except ImportError:
        raise ConfigError(f"DuckDB's {name} extension is not installed",
                          hint=f"pip install '{package.replace('_', '-')}' (or 'cynomys[lake]')") from None
    found = glob.glob(os.path.join(os.path.dirname(mod.__file__ or ""), "extensions", "*", f"{name}.duckdb_extension"))
    if not found:
        raise ConfigError(f"{name}.duckdb_extension not found in {package}",
                          hint=f"pip install --force-reinstall '{package.replace('_', '-')}'")
    return found[0]


def duckdb_connection(cfg: Config) -> Any:
    """An in-memory DuckDB with a view ``<db>.<table>`` over each replica
    table's current snapshot (the iceberg extension, loaded from the wheels
    of PyPI ``duckdb-extension-iceberg`` and ``-avro``: no download)."""
    import duckdb

    con = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false"})
    con.execute(f"LOAD '{_extension('duckdb_extension_avro', 'avro')}'")  # iceberg reads manifests with it
    con.execute(f"LOAD '{_extension('duckdb_extension_iceberg', 'iceberg')}'")
    con.execute("SET TimeZone = 'UTC'")  # as the Spark session: TIMESTAMP values shown in UTC
    for ref in tables(cfg):
        db, t = (x.replace('"', '""') for x in (ref.database, ref.table))
        con.execute(f'CREATE SCHEMA IF NOT EXISTS "{db}"')
        con.execute(f"CREATE OR REPLACE VIEW \"{db}\".\"{t}\" AS SELECT * FROM iceberg_scan('"
                    + ref.metadata.replace("'", "''") + "')")
    return con
