"""``cynomys sql`` on the Iceberg replica: read-only consoles.

- ``spark`` (the default): Spark SQL in a session of its own with the
  applier's catalog settings, the catalog as the default one.  Nothing is
  written: no state table, no warm-up (the applier's write warm-up cost ~7 s
  of a ~14 s query), no Spark UI.  What is left is the JVM and Spark's own
  start, seconds on a small machine: ``--engine duckdb`` has neither.
- ``duckdb``: DuckDB with the iceberg extension over each table's current
  metadata file (``readers.py``): no JVM, DuckDB's SQL dialect.

Both read each table's current snapshot when the query starts.
"""
from __future__ import annotations

import logging
import re
import sys
from typing import Any

from cynomys.applier.targets.spark import readers
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, CynomysError, TargetRejectedError

log = logging.getLogger(__name__)

ENGINES = ("spark", "duckdb")

#: What a read-only session adds to the applier's settings (conf wins over them).
CONSOLE_CONF: dict[str, str] = {
    "spark.app.name": "cynomys-sql",
    "spark.ui.enabled": "false",
}


class SparkConsole:
    """Spark SQL, read-only, on the target's catalog."""

    def __init__(self, cfg: Config) -> None:
        from cynomys.applier.targets.spark import session as spark_session

        self._session = spark_session
        conf = spark_session.session_conf(cfg)
        self.catalog = conf_catalog(conf)
        self.conf = {**conf, **CONSOLE_CONF, **_user_conf(cfg)}
        self._spark: Any = None
        self._generation = 0

    def show_sql(self, statement: str, limit: int) -> None:
        from cynomys.applier.targets.spark.merge import q

        what = "running `cynomys sql` on Spark"
        try:
            if self._spark is None:
                self._spark, self._generation = self._session.acquire(self.conf)
            self._spark.sql(f"USE {q(self.catalog)}")
            self._spark.sql(statement).show(limit, truncate=False)
        except CynomysError:
            raise
        except Exception as exc:
            if not self._session.is_spark_error(exc):
                raise
            raise self._session.translate(exc, what) from exc

    def close(self) -> None:
        if self._spark is not None:
            self._spark = None
            self._session.release(self._generation)


def conf_catalog(conf: dict[str, str]) -> str:
    """The catalog name of a session's settings."""
    for key, value in conf.items():
        m = re.match(r"^spark\.sql\.catalog\.([^.]+)$", key)
        if m and value == "org.apache.iceberg.spark.SparkCatalog":
            return m.group(1)
    raise ConfigError("no Iceberg catalog in the Spark settings")


def _user_conf(cfg: Config) -> dict[str, str]:
    from cynomys.applier.targets.spark.config import SparkConfig

    return dict(cfg.target.of(SparkConfig).conf)  # the user's own settings still win


class DuckDBConsole:
    """DuckDB's SQL over the replica's current snapshots, no JVM."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._con: Any = None

    def show_sql(self, statement: str, limit: int) -> None:
        import duckdb

        if self._con is None:
            self._con = readers.duckdb_connection(self.cfg)
        try:
            rel = self._con.sql(statement)
            if rel is not None:
                rel.show(max_rows=limit, max_width=sys.maxsize)
        except duckdb.Error as exc:
            raise TargetRejectedError(f"`cynomys sql --engine duckdb`: {str(exc).splitlines()[0]}",
                                      hint="tables are <db>.<table> views; the SQL is DuckDB's") from None

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


def open_console(cfg: Config, engine: str) -> SparkConsole | DuckDBConsole:
    if engine == "duckdb":
        return DuckDBConsole(cfg)
    if engine == "spark":
        return SparkConsole(cfg)
    raise ConfigError(f"unknown engine {engine!r} for `cynomys sql`", hint="use --engine " + " or ".join(ENGINES))
