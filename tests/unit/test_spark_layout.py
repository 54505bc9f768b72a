"""[target.spark] layout keys (cynomys/applier/targets/spark/layout.py) and
the JDBC catalog settings: parsing, matching by pattern, comparing with an
existing table, and the errors a bad config gets."""
from __future__ import annotations

from pathlib import Path

import pytest

from cynomys.applier.targets.spark import layout as L
from cynomys.applier.targets.spark import session as spark_session
from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.core.config import Config, TargetConfig, load_config
from cynomys.core.errors import ConfigError


@pytest.mark.parametrize("text, sql, iceberg", [
    ("id", "`id`", "identity(id)"),
    ("bucket(16, id)", "bucket(16, `id`)", "bucket[16](id)"),
    ("truncate(4,name)", "truncate(4, `name`)", "truncate[4](name)"),
    ("days(created_at)", "days(`created_at`)", "day(created_at)"),
    ("year(ts)", "years(`ts`)", "year(ts)"),
    ("hours(`odd name`)", "hours(`odd name`)", "hour(odd name)"),
])
def test_partition_transforms(text: str, sql: str, iceberg: str) -> None:
    f = L.PartitionField.parse(text)
    assert (f.sql, f.iceberg) == (sql, iceberg)
    assert L.PartitionField.of_iceberg(f.iceberg).iceberg == iceberg  # what evolve drops


@pytest.mark.parametrize("text", ["bucket(id)", "days(3, ts)", "zorder(a)", "bucket(0, id)", "a + b"])
def test_bad_partition_transforms(text: str) -> None:
    with pytest.raises(ValueError):
        L.PartitionField.parse(text)


def test_sort_fields() -> None:
    assert L.SortField.parse("id").iceberg == "id ASC NULLS_FIRST"
    assert L.SortField.parse("at desc").iceberg == "at DESC NULLS_LAST"
    assert L.SortField.parse("v ASC NULLS LAST").sql == "`v` ASC NULLS LAST"
    with pytest.raises(ValueError):
        L.SortField.parse("id sideways")


def test_exact_name_wins_then_first_pattern_properties_merge() -> None:
    parts = {"shop.*": ["days(at)"], "*.orders": ["bucket(8, id)"], "shop.orders": ["bucket(16, id)"]}
    sort = {"*.*": ["id"]}
    props = {"*.*": {"write.parquet.compression-codec": "zstd", "format-version": "3"},
             "shop.orders": {"format-version": "2", "write.target-file-size-bytes": "1000"}}
    orders = L.layout_for("shop.orders", parts, sort, props, 2)
    assert [p.iceberg for p in orders.partition] == ["bucket[16](id)"]
    assert orders.format_version == 2
    assert dict(orders.properties) == {"write.parquet.compression-codec": "zstd", "write.target-file-size-bytes": "1000"}
    items = L.layout_for("shop.items", parts, sort, props, 2)
    assert [p.iceberg for p in items.partition] == ["day(at)"] and items.format_version == 3
    other = L.layout_for("crm.orders", parts, {}, {}, 2)
    assert [p.iceberg for p in other.partition] == ["bucket[8](id)"] and other.sort == ()
    assert L.layout_for("crm.people", parts, {}, {}, 3) == L.TableLayout(format_version=3)


def test_differences_in_words() -> None:
    want = L.layout_for("d.t", {"d.t": ["bucket(16, id)"]}, {"d.t": ["id"]}, {"d.t": {"a": "1", "format-version": "3"}}, 2)
    same = L.Existing(("bucket[16](id)",), ("id ASC NULLS_FIRST",), 3, {"a": "1", "other": "x"})
    assert L.differences(want, same) == []
    old = L.Existing(("bucket[8](id)",), (), 2, {})
    assert L.differences(want, old) == [
        "partition spec [bucket[8](id)] -> [bucket[16](id)]", "sort order [] -> [id ASC NULLS_FIRST]",
        "format version 2 -> 3", "properties a=None->'1'"]
    # The default format version is for new tables: existing ones keep theirs.
    assert L.differences(L.layout_for("d.t", {}, {}, {}, 3), L.Existing((), (), 2, {})) == []


def _toml(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text("[target]\nkind = 'spark'\n[target.spark]\n" + body)
    return p


def test_config_file_layout_keys(tmp_path: Path) -> None:
    cfg = load_config(_toml(tmp_path, """format_version = 3
layout_changes = "evolve"
[target.spark.partition_by]
"shop.orders" = ["bucket(16, id)", "days(created_at)"]
[target.spark.sort_by]
"shop.*" = ["id DESC"]
[target.spark.table_properties]
"*.*" = { "write.parquet.compression-codec" = "snappy" }
"""), env={})
    sc = cfg.target.of(SparkConfig)
    got = L.of(sc, "shop", "orders")
    assert [p.sql for p in got.partition] == ["bucket(16, `id`)", "days(`created_at`)"]
    assert got.sort_sql() == "WRITE LOCALLY ORDERED BY `id` DESC NULLS LAST"
    assert got.format_version == 3 and sc.layout_changes == "evolve"
    assert got.partition_sql() == " PARTITIONED BY (bucket(16, `id`), days(`created_at`))"


@pytest.mark.parametrize("body, says", [
    ('[target.spark.partition_by]\n"a.b" = ["bucket(x)"]\n', "partition_by['a.b']"),
    ('[target.spark.sort_by]\n"a.b" = ["id up"]\n', "sort_by['a.b']"),
    ('[target.spark.table_properties]\n"a.*" = { "write.merge.mode" = "copy-on-write" }\n', "Cynomys manages"),
    ('[target.spark.table_properties]\n"a.*" = { "format-version" = "1" }\n', "format-version '1'"),
])
def test_bad_layout_config_is_refused_before_spark_starts(tmp_path: Path, body: str, says: str) -> None:
    """Checked when the target is built (``cynomys config check`` builds it)."""
    cfg = load_config(_toml(tmp_path, body), env={})
    with pytest.raises(ConfigError) as info:
        spark_session.session_conf(cfg)
    assert says in str(info.value) and "[target.spark]" in str(info.value)


@pytest.mark.parametrize("body, says", [("format_version = 4\n", "2 or 3"), ('layout_changes = "maybe"\n', "layout_changes")])
def test_bad_layout_keys_are_refused_when_loaded(tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_toml(tmp_path, body), env={})
    assert says in str(info.value)


# --------------------------------------------------------------------------
# The JDBC catalog's settings
# --------------------------------------------------------------------------
def _cfg(tmp_path: Path, **spark: object) -> Config:
    return Config(target=TargetConfig(kind="spark", options=(SparkConfig(**spark),)),  # type: ignore[arg-type]
                  path=str(tmp_path / "cynomys.toml"))


def test_jdbc_catalog_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = tmp_path / "postgresql.jar"
    jar.write_bytes(b"")
    monkeypatch.setitem(spark_session.JDBC_DRIVERS, "postgresql",
                        spark_session.JdbcDriver(str(jar), "libpostgresql-jdbc-java", "postgresql"))
    conf = spark_session.session_conf(_cfg(tmp_path, catalog_type="jdbc", catalog_uri="jdbc:postgresql://db:5432/ice",
                                           catalog_user="u", catalog_password="pw", warehouse="wh"))
    p = "spark.sql.catalog.cynomys"
    assert (conf[p + ".type"], conf[p + ".uri"], conf[p + ".jdbc.user"], conf[p + ".jdbc.password"]) == (
        "jdbc", "jdbc:postgresql://db:5432/ice", "u", "pw")
    assert conf[p + ".warehouse"] == str(tmp_path / "wh")  # data files: a path, relative to the config file
    assert str(jar) in conf["spark.jars"].split(",")
    # A driver named in jars is not added twice.
    own = spark_session.session_conf(_cfg(tmp_path, catalog_type="jdbc", catalog_uri="jdbc:postgresql://db/ice",
                                          jars=["/opt/postgresql-42.7.jar"]))
    assert str(jar) not in own["spark.jars"]
    assert "pw" not in repr(SparkConfig(catalog_password="pw"))


def test_jdbc_catalog_errors_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="not a JDBC URL"):
        spark_session.session_conf(_cfg(tmp_path, catalog_type="jdbc", catalog_uri="postgres://db/ice"))
    monkeypatch.setitem(spark_session.JDBC_DRIVERS, "postgresql",
                        spark_session.JdbcDriver(str(tmp_path / "none.jar"), "libpostgresql-jdbc-java", "postgresql"))
    with pytest.raises(ConfigError) as info:
        spark_session.session_conf(_cfg(tmp_path, catalog_type="jdbc", catalog_uri="jdbc:postgresql://db/ice"))
    assert "apt-get install libpostgresql-jdbc-java" in str(info.value)
    with pytest.raises(ConfigError, match="catalog_user/catalog_password are for"):
        spark_session.session_conf(_cfg(tmp_path, catalog_user="u"))
