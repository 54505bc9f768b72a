"""The readers contract (issue #27): after the random end-to-end workload
(4 writers: multi-row inserts, range updates, deletes, key changes, a keyless
table, an ALTER half way) with the producer and the applier SIGKILLed while
they write, every replica table read by *other engines* -- pyiceberg and
DuckDB's iceberg extension, through the catalog the applier wrote -- equals
the source row by row, as it does through Spark.

For each catalog (a Hadoop warehouse folder; the JDBC catalog on a
PostgreSQL server the test starts, read by pyiceberg's SQL catalog from the
same database) and each format version (2: position-delete files; 3:
deletion vectors), set per table (VERSIONS): two runs instead of four.  The tables have a layout from [target.spark]: acct is
bucketed by its key and sorted, log (keyless) partitioned by a column.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cynomys.applier.targets.spark import readers
from cynomys.core.config import load_config
from tests.helpers import sorted_source_rows
from tests.integration.test_e2e_columnstore import TABLES, _run, _writer
from tests.integration.test_e2e_spark import SparkSide
from tests.lake import duckdb_rows, pyiceberg_rows
from tests.servers.mariadb import MariaDBServer
from tests.servers.postgres import PASSWORD, USER, PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

pytest.importorskip("pyspark", reason="the Spark target needs pyspark (pip install 'cynomys[spark]')")
pytest.importorskip("pyiceberg", reason="the readers need pyiceberg (pip install 'cynomys[lake]')")

LAYOUT: dict[str, Any] = {
    "partition_by": {"app.acct": ["bucket(4, id)"], "app.log": ["who"]},
    "sort_by": {"app.acct": ["id"]},
}


class ReadersSide(SparkSide):
    """The Spark side, and once Spark reads every table equal to the source,
    pyiceberg and DuckDB must read the same rows."""

    def __init__(self, src: MariaDBServer, cfg: Path, spark: dict[str, Any]) -> None:
        super().__init__(src, cfg)
        self.extra["target__spark"].update(spark)
        self.readers_checked: dict[str, Any] = {}

    def diff(self, cfg: Path) -> dict[str, Any]:
        out = super().diff(cfg)
        if any(out.values()):
            return out
        c = load_config(cfg, env={})
        con = readers.duckdb_connection(c)
        try:
            for t in TABLES:
                want = sorted_source_rows(self.src, "app", t)
                for name, read in (("pyiceberg", lambda: pyiceberg_rows(c, "app", t)),
                                   ("duckdb", lambda: duckdb_rows(c, "app", t, con))):
                    got = sorted(read(), key=repr)
                    self.readers_checked[f"{name}:{t}"] = len(got)
                    if got != want:
                        out[t] = {"reader": name, "source_rows": len(want), "reader_rows": len(got),
                                  "only_source": [r for r in want if r not in got][:2],
                                  "only_reader": [r for r in got if r not in want][:2]}
        finally:
            con.close()
        return out


#: Format version per table, swapped between the two catalogs' runs: every
#: catalog has tables of both versions, and every kind of table (keyed with
#: key changes, composite key, keyless) is read in both versions.
VERSIONS = {"hadoop": {"acct": "2", "pair": "3", "log": "2"}, "jdbc": {"acct": "3", "pair": "2", "log": "3"}}


@pytest.mark.parametrize("catalog", ["hadoop", "jdbc"])
def test_readers_contract_after_the_random_workload_with_kills(
        tmp_path: Path, redis_url: str, postgres_server: PostgresServer, catalog: str) -> None:
    versions = VERSIONS[catalog]
    spark: dict[str, Any] = {**LAYOUT, "table_properties": {f"app.{t}": {"format-version": v}
                                                            for t, v in versions.items()}}
    if catalog == "jdbc":
        spark.update(catalog_type="jdbc", catalog_uri=postgres_server.create_database(
            f"readers_{tmp_path.name[-12:].replace('-', '_').lower()}"), catalog_user=USER, catalog_password=PASSWORD)
    sides: list[ReadersSide] = []

    def side(src: MariaDBServer) -> ReadersSide:
        sides.append(ReadersSide(src, tmp_path / "c.toml", spark))
        return sides[0]

    _run(tmp_path, redis_url, writer=_writer, batch_max_events=500, kills=["producer", "applier"] * 2,
         alter_at=2, target=side, write_s=40, catch_up_s=300, applier={"buffer_rows": 2000, "max_delay_ms": 300})
    checked = sides[0].readers_checked
    # Every table was read by both readers (the run ends only when they agree).
    assert set(checked) == {f"{r}:{t}" for r in ("pyiceberg", "duckdb") for t in TABLES}, checked
    assert all(n > 0 for n in checked.values()), checked
    cfg = load_config(tmp_path / "c.toml", env={})
    got = {t: str(readers.pyiceberg_table(cfg, "app", t).format_version) for t in TABLES}
    assert got == versions
    print(f"readers on {catalog}, format versions {got}: {checked}")
