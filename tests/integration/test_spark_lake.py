"""The Iceberg replica in a shared catalog, with the layout the config asks
for (issue #27), against real Spark (local mode):

- the JDBC catalog on a PostgreSQL server the test starts, written by the
  Spark target and read back by pyiceberg's SQL catalog and DuckDB from the
  same PostgreSQL database;
- a bucket partition spec and a sort order from [target.spark]: DESCRIBE and
  pyiceberg show them, a MERGE flush reads only the partitions of its keys;
- a layout change on an existing table: refused with a one-line message, or
  evolved in place with ``layout_changes = "evolve"``.

The module's first target is the JDBC one: the JDBC driver is a jar of the
session, and a running session cannot take a new jar.
"""
from __future__ import annotations

import datetime
import itertools
from decimal import Decimal
from pathlib import Path
from typing import Iterator

import pytest

from cynomys.applier.targets.spark import readers
from cynomys.applier.targets.spark import session as spark_session
from cynomys.applier.targets.spark.target import SparkTarget
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import ColumnDef, Op, TableSchema
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory
from tests.integration.target_setups import spark as spark_setup
from tests.lake import duckdb_rows, pyiceberg_rows
from tests.servers.mariadb import ROOT_PASSWORD, MariaDBServer
from tests.servers.postgres import PASSWORD, USER, PostgresServer

pytestmark = [pytest.mark.spark, pytest.mark.integration]
pytest.importorskip("pyiceberg", reason="pip install 'cynomys[lake]'")

_names = itertools.count(1)


@pytest.fixture(scope="module")
def jdbc_url(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database(f"iceberg_{next(_names)}_{id(postgres_server) % 1000}")


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory, jdbc_url: str) -> Iterator[Factory]:
    warehouse = tmp_path_factory.mktemp("lake")
    jdbc = {"catalog_type": "jdbc", "catalog_uri": jdbc_url, "catalog_user": USER, "catalog_password": PASSWORD}

    def make(**overrides: object) -> SparkTarget:
        spark = dict(overrides.pop("spark", {}))  # type: ignore[call-overload]
        catalog = spark.pop("catalog", "pg")
        where = spark.pop("warehouse", warehouse / catalog)
        kw = jdbc if spark.pop("jdbc", True) else {}
        return SparkTarget(spark_setup.make_config(where, catalog=catalog, **{**kw, **spark}))

    f = Factory(make)
    # The session starts with both JDBC drivers (PostgreSQL's added by the
    # catalog settings, MariaDB's named) for the catalogs of this module.
    f(spark={"jars": [spark_session.JDBC_DRIVERS["mariadb"].jar]})
    yield f
    f.close()


@pytest.fixture
def db() -> str:
    return f"lake_{next(_names)}"


ORDERS = ("id", "customer", "amount", "at", "ts")


def _orders(db: str) -> TableSchema:
    return TableSchema(db, "orders", (ColumnDef("id", "int"), ColumnDef("customer", "varchar(20)"),
                                      ColumnDef("amount", "decimal(10,2)"), ColumnDef("at", "datetime(6)"),
                                      ColumnDef("ts", "timestamp(6)")), ("id",))


def _row(i: int, amount: str = "1.50") -> tuple[object, ...]:
    return (i, f"c{i % 7}", Decimal(amount), datetime.datetime(2024, 1, 1 + i % 28, 12, 0, i % 60),
            datetime.datetime(2024, 2, 1, 0, 0, i % 60, tzinfo=datetime.timezone.utc))


def _fill(target: SparkTarget, schema: TableSchema, n: int) -> list[tuple[object, ...]]:
    rows = [_row(i) for i in range(1, n + 1)]
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
    return rows


# --------------------------------------------------------------------------
# The JDBC catalog, read by pyiceberg and DuckDB through the same database
# --------------------------------------------------------------------------
def test_jdbc_catalog_written_by_spark_read_by_pyiceberg_and_duckdb(factory: Factory, db: str) -> None:
    target = factory()
    schema = _orders(db)
    log = TableSchema(db, "log", (ColumnDef("who", "int"), ColumnDef("what", "varchar(10)")), ())
    rows = _fill(target, schema, 50)
    # Updates, deletes, a key change, a keyless table with duplicates.
    changes = [contract.change(Op.UPDATE, schema, before=rows[0], after=_row(1, "9.99")),
               contract.change(Op.DELETE, schema, before=rows[1]),
               contract.change(Op.UPDATE, schema, before=rows[2], after=(1003, *rows[2][1:])),
               contract.change(Op.INSERT, log, after=(1, "x")), contract.change(Op.INSERT, log, after=(1, "x")),
               contract.change(Op.INSERT, log, after=(2, "y"))]
    target.apply(contract.flush(changes))
    last = contract.state()
    target.apply(contract.flush([contract.change(Op.DELETE, log, before=(1, "x"))], last))
    want = sorted([_row(1, "9.99"), (1003, *rows[2][1:]), *rows[3:]], key=repr)
    assert sorted(target.fetch_rows(db, "orders"), key=repr) == want
    cfg = target.cfg
    assert sorted(pyiceberg_rows(cfg, db, "orders"), key=repr) == want
    assert sorted(duckdb_rows(cfg, db, "orders"), key=repr) == want
    assert sorted(pyiceberg_rows(cfg, db, "log")) == [(1, "x"), (2, "y")]
    assert sorted(duckdb_rows(cfg, db, "log")) == [(1, "x"), (2, "y")]
    # The catalog's rows are in PostgreSQL, under Spark's catalog name.
    names = {(r.database, r.table) for r in readers.tables(cfg)}
    assert {(db, "orders"), (db, "log")} <= names
    # A new target (a restarted applier) finds the state in the same catalog.
    fresh = factory()
    assert fresh.applied(contract.PRODUCER) == last


def test_jdbc_catalog_on_mariadb(factory: Factory, mariadb: MariaDBServer, db: str) -> None:
    """The same catalog in MariaDB (Connector/J from libmariadb-java), read
    back by pyiceberg's SQL catalog through pymysql."""
    name = f"iceberg_{db}"
    mariadb.execute(f"CREATE DATABASE {name}")
    target = factory(spark={"catalog": "my", "catalog_uri": f"jdbc:mariadb://127.0.0.1:{mariadb.port}/{name}",
                            "catalog_user": "root", "catalog_password": ROOT_PASSWORD})
    rows = _fill(target, _orders(db), 10)
    assert sorted(pyiceberg_rows(target.cfg, db, "orders"), key=repr) == sorted(rows, key=repr)
    assert mariadb.execute(f"SELECT table_namespace, table_name FROM {name}.iceberg_tables "
                           f"WHERE catalog_name = 'my' AND table_name = 'orders'") == [(db, "orders")]


# --------------------------------------------------------------------------
# Layout from the config
# --------------------------------------------------------------------------
def _spark_layout(db: str, **extra: object) -> dict[str, object]:
    return {"jdbc": False, "catalog": "hd", "partition_by": {f"{db}.orders": ["bucket(16, id)"], f"{db}.*": ["days(at)"]},
            "sort_by": {f"{db}.orders": ["id"]}, **extra}


def test_bucket_spec_and_sort_order_from_config(factory: Factory, db: str) -> None:
    target = factory(spark=_spark_layout(db, format_version=3))
    schema = _orders(db)
    rows = _fill(target, schema, 2000)
    name = target.qualified(db, "orders")
    described = [(r.col_name, r.data_type) for r in target.spark.sql(f"DESCRIBE TABLE {name}").collect()]
    assert ("Part 0", "bucket(16, id)") in described
    props = {r.key: r.value for r in target.spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
    assert props["sort-order"] == "id ASC NULLS FIRST" and props["format-version"] == "3"
    assert props["write.distribution-mode"] == "none"  # appends add no shuffle
    t = readers.pyiceberg_table(target.cfg, db, "orders")
    assert [(f.name, str(f.transform)) for f in t.spec().fields] == [("id_bucket", "bucket[16]")]
    assert [str(f.transform) for f in t.sort_order().fields] == ["identity"]
    assert t.format_version == 3
    # Each data file holds one bucket, its rows in key order.
    files = target.spark.sql(f"SELECT partition.id_bucket AS b, count(*) AS n FROM {name}.files "
                             "WHERE content = 0 GROUP BY 1").collect()
    assert len(files) == 16
    # A MERGE of 3 keys: the statement names them, the scan reads only their buckets.
    update = [contract.change(Op.UPDATE, schema, before=rows[i], after=_row(i + 1, "7.00")) for i in (4, 500, 1500)]
    tf = contract.flush(update).tables[0]
    plan = target._plan(tf)
    assert plan is not None and "t.`id` IN (5, 501, 1501)" in plan.sql
    target.iceberg.dataframe(plan.data, plan.spark_schema).createOrReplaceTempView("lake_src")
    explained = target.spark.sql("EXPLAIN " + plan.sql.replace("{src}", "lake_src")).collect()[0][0]
    # The target scan gets the keys as a filter (Spark's dynamic pruning
    # does not reach it: RuntimeFilters stays empty)...
    scan = next(line for line in explained.splitlines() if "BatchScan" in line and "lake_" in line)
    assert "id IN (5, 501, 1501)" in scan.split("filters=")[1], explained
    # ... which Iceberg projects through the bucket transform: 3 of the 16 files.
    from pyiceberg.expressions import In

    assert len(list(t.scan(row_filter=In("id", {5, 501, 1501})).plan_files())) == 3
    target.apply(contract.flush(update))
    summary = target.iceberg.current(db, "orders")
    assert summary is not None and int(summary.summary["changed-partition-count"]) <= 3
    assert int(summary.summary["added-dvs"]) == 3  # format v3: deletion vectors
    assert int(summary.summary.get("added-position-delete-files", "0")) + int(summary.summary.get("added-dvs", "0")) <= 3
    got = {r[0]: r for r in target.fetch_rows(db, "orders")}
    assert got[501][2] == Decimal("7.00") and len(got) == 2000
    # Another table of the database takes the pattern's spec.
    other = TableSchema(db, "items", (ColumnDef("id", "int"), ColumnDef("at", "datetime")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, other, after=(1, datetime.datetime(2024, 5, 1)))]))
    assert [str(f.transform) for f in readers.pyiceberg_table(target.cfg, db, "items").spec().fields] == ["day"]


def test_layout_change_refused_then_evolved(factory: Factory, db: str) -> None:
    first = factory(spark=_spark_layout(db, format_version=2))
    schema = _orders(db)
    _fill(first, schema, 20)
    changed = _spark_layout(db, partition_by={f"{db}.orders": ["bucket(8, id)"]}, sort_by={},
                            table_properties={"*.*": {"write.target-file-size-bytes": "67108864"}})
    refused = factory(spark=changed)
    with pytest.raises(TargetRejectedError) as info:
        refused.apply(contract.flush([contract.change(Op.INSERT, schema, after=_row(21))]))
    text = str(info.value)
    assert f"table {db}.orders: its layout differs" in text and "bucket[16](id)] -> [bucket[8](id)]" in text
    assert len(text.splitlines()) == 2 and "layout_changes = 'evolve'" in (info.value.hint or "")  # one line + fix
    # The default format version is for new tables; one set for the table
    # upgrades it (evolve), and never goes down.
    default3 = factory(spark=_spark_layout(db, format_version=3))
    default3.apply(contract.flush([contract.change(Op.INSERT, schema, after=_row(21))]))
    assert readers.pyiceberg_table(default3.cfg, db, "orders").format_version == 2
    pinned = {"table_properties": {f"{db}.orders": {"format-version": "3"}}}
    v3 = factory(spark=_spark_layout(db, **pinned, layout_changes="evolve"))
    v3.apply(contract.flush([contract.change(Op.INSERT, schema, after=_row(22))]))
    assert readers.pyiceberg_table(v3.cfg, db, "orders").format_version == 3
    down = factory(spark=_spark_layout(db, table_properties={f"{db}.orders": {"format-version": "2"}},
                                       layout_changes="evolve"))
    with pytest.raises(TargetRejectedError, match="cannot go down"):
        down.apply(contract.flush([contract.change(Op.INSERT, schema, after=_row(23))]))
    evolve = factory(spark={**changed, "layout_changes": "evolve"})
    evolve.apply(contract.flush([contract.change(Op.INSERT, schema, after=_row(23))]))
    t = readers.pyiceberg_table(evolve.cfg, db, "orders")
    assert [str(f.transform) for f in t.spec().fields] == ["bucket[8]"] and not t.sort_order().fields
    assert t.properties["write.target-file-size-bytes"] == "67108864"
    assert len(evolve.fetch_rows(db, "orders")) == 23


# --------------------------------------------------------------------------
# cynomys sql: read-only consoles (Spark, DuckDB)
# --------------------------------------------------------------------------
def _files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


def test_cynomys_sql_reads_without_writing(factory: Factory, db: str, tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    target = factory(spark={"jdbc": False, "catalog": "sq"})
    _fill(target, _orders(db), 30)
    warehouse = Path(target.settings.warehouse)
    conf = ", ".join(f'"{k}" = "{v}"' for k, v in spark_setup.TEST_CONF.items())
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[target]\nkind = "spark"\n[target.spark]\nmaster = "local[1]"\nwarehouse = "{warehouse}"\n'
                   f'catalog = "sq"\nconf = {{ {conf} }}\n')
    before = _files(warehouse)
    query = f"SELECT customer, count(*) AS n FROM {db}.orders GROUP BY customer ORDER BY customer"
    took = {}
    for engine in ("spark", "duckdb"):
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "cynomys.cli", "sql", "-c", str(cfg), "--engine", engine, query],
                             capture_output=True, text=True, timeout=300)
        took[engine] = round(time.monotonic() - t0, 1)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "c0" in out.stdout and "c6" in out.stdout, out.stdout
        assert "warm-up" not in out.stderr
    assert _files(warehouse) == before  # no state table, no warm-up table, no commit
    print(f"cynomys sql took {took} (2-core box, shared)")
    bad = subprocess.run([sys.executable, "-m", "cynomys.cli", "sql", "-c", str(cfg), "--engine", "duckdb",
                          "SELECT * FROM nowhere.nothing"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "nowhere" in bad.stderr and "Traceback" not in bad.stderr
