"""The Spark target's pure parts: type mapping, value codecs, session
settings, flush markers and statement text (no JVM)."""
from __future__ import annotations

import datetime
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from cynomys.applier.targets.base import TableFlush  # noqa: E402
from cynomys.applier.targets.spark import direct  # noqa: E402
from cynomys.applier.targets.spark import session as spark_session  # noqa: E402
from cynomys.applier.targets.spark import types as st  # noqa: E402
from cynomys.applier.targets.spark.config import SparkConfig  # noqa: E402
from cynomys.applier.targets.spark.merge import (  # noqa: E402
    PART_MARK,
    key_prune,
    key_range,
    key_spans,
    keyed_merge,
    keyed_rows,
    keyless_merge,
    keyless_rows,
    lit,
    marker,
    marker_of,
    order,
    part_marker,
    part_state,
)
from cynomys.core.config import Config, TargetConfig  # noqa: E402
from cynomys.core.errors import ConfigError  # noqa: E402
from cynomys.core.model import AppliedState, ColumnDef, Position, RawTemporal, TableSchema  # noqa: E402

UTC = datetime.timezone.utc


def sql_type(type_text: str) -> str:
    return st.mapping(ColumnDef("c", type_text)).sql


@pytest.mark.parametrize("mysql, iceberg", [
    ("tinyint", "int"), ("tinyint unsigned", "int"), ("smallint unsigned", "int"), ("mediumint unsigned", "int"),
    ("int", "int"), ("int unsigned", "bigint"), ("bigint", "bigint"), ("bigint unsigned", "decimal(20,0)"),
    ("bit(1)", "bigint"), ("bit(63)", "bigint"), ("bit(64)", "decimal(20,0)"), ("year", "int"),
    ("decimal(10,2)", "decimal(10,2)"), ("decimal(38,0)", "decimal(38,0)"), ("decimal(39,2)", "string"),
    ("decimal(65,30)", "string"), ("decimal", "decimal(10,0)"), ("decimal(12)", "decimal(12,0)"),
    ("float", "float"), ("double", "double"), ("date", "date"), ("datetime(6)", "timestamp_ntz"),
    ("timestamp(6)", "timestamp"), ("time(6)", "bigint"), ("char(3)", "string"), ("longtext", "string"),
    ("enum('a','b')", "string"), ("set('x')", "string"), ("json", "string"), ("binary(4)", "binary"),
    ("blob", "binary"), ("geometry", "binary"),
])
def test_mapping_table(mysql: str, iceberg: str) -> None:
    assert sql_type(mysql) == iceberg


def test_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError, match="no lossless Iceberg mapping"):
        st.mapping(ColumnDef("u", "uuid"))


def encode(type_text: str, *values: object) -> list[object]:
    array, raw = st.encode_column(st.mapping(ColumnDef("c", type_text)), list(values))  # type: ignore[arg-type]
    assert raw is None
    return array.to_pylist()


def test_integer_ranges_are_the_mysql_types() -> None:
    assert encode("tinyint unsigned", 0, 255, None) == [0, 255, None]
    for type_text, bad in (("tinyint unsigned", 256), ("tinyint", -129), ("int unsigned", -1),
                           ("bigint unsigned", 2**64), ("bit(3)", 8), ("year", 2156)):
        with pytest.raises(st.ValueRejected, match="outside the type's range"):
            encode(type_text, bad)
    assert encode("bigint unsigned", 2**64 - 1) == [Decimal(2**64 - 1)]
    with pytest.raises(st.ValueRejected, match="expected an integer"):
        encode("int", "1")


def test_decimals_are_exact() -> None:
    assert encode("decimal(5,2)", Decimal("1.5"), Decimal("-999.99")) == [Decimal("1.50"), Decimal("-999.99")]
    with pytest.raises(st.ValueRejected, match="fraction digits"):
        encode("decimal(5,2)", Decimal("1.005"))
    with pytest.raises(st.ValueRejected, match="integer digits"):
        encode("decimal(5,2)", Decimal("1000"))
    wide = Decimal("12345678901234567890123456789012345.123456789012345678901234567890")
    assert encode("decimal(65,30)", wide, Decimal("0E-30"), Decimal("1E+3")) == [
        str(wide), "0." + "0" * 30, "1000." + "0" * 30]


def test_widest_decimals_do_not_round_in_the_default_context() -> None:
    """abs() and friends round to the thread's context (28 digits); the
    widest MySQL decimals have 65 (issue #11: the applier halted on these)."""
    nines = Decimal("9" * 35 + "." + "9" * 30)
    negative = nines.copy_negate()  # not -nines: unary minus rounds too
    assert encode("decimal(65,30)", nines, negative) == [str(nines), str(negative)]
    assert encode("decimal(38,10)", Decimal("9" * 28 + "." + "9" * 10)) == [Decimal("9" * 28 + "." + "9" * 10)]
    assert encode("decimal(65,0)", Decimal("9" * 65)) == ["9" * 65]
    with pytest.raises(st.ValueRejected, match="integer digits"):
        encode("decimal(65,30)", Decimal("1" + "0" * 35))
    with pytest.raises(st.ValueRejected, match="fraction digits"):
        encode("decimal(65,30)", Decimal("1E-31"))


def test_float_must_be_single_precision() -> None:
    assert encode("float", 0.5) == [0.5]
    with pytest.raises(st.ValueRejected, match="not a single-precision value"):
        encode("float", 0.1)
    with pytest.raises(st.ValueRejected, match="does not fit"):
        encode("float", 1e300)


def test_temporal_values() -> None:
    ts = datetime.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC)
    assert encode("timestamp(6)", ts) == [ts]
    with pytest.raises(st.ValueRejected, match="UTC-aware"):
        encode("timestamp(6)", ts.replace(tzinfo=None))
    with pytest.raises(st.ValueRejected, match="naive"):
        encode("datetime", ts)
    with pytest.raises(st.ValueRejected, match="expected a date"):
        encode("date", datetime.datetime(2020, 1, 1))
    assert encode("time(6)", -datetime.timedelta(hours=838, microseconds=1)) == [-(838 * 3600 * 10**6 + 1)]


def test_zero_dates_go_to_the_companion() -> None:
    m = st.mapping(ColumnDef("d", "date"))
    array, raw = st.encode_column(m, [RawTemporal("0000-00-00"), datetime.date(2020, 2, 29), None])
    assert array.to_pylist() == [None, datetime.date(2020, 2, 29), None]
    assert raw == ["0000-00-00", None, None]
    with pytest.raises(st.ValueRejected, match="not temporal"):
        st.encode_column(st.mapping(ColumnDef("t", "time")), [RawTemporal("00:00:00")])


def test_comment_keeps_the_source_type() -> None:
    col = ColumnDef("e", "enum('a','it''s')")
    text = st.comment(col, st.mapping(col))
    assert st.source_type(text) == "enum('a','it''s')"
    col = ColumnDef("t", "time(6)")
    assert st.comment(col, st.mapping(col)) == "signed microseconds; mysql:time(6)"
    from pyspark.sql import types as T
    assert st.column_for("x", T.LongType(), None).type == "bigint"  # a column we did not create


@pytest.mark.parametrize("old, new, how", [
    ("int", "bigint", "promote"), ("tinyint", "int", "same"), ("varchar(5)", "text", "same"),
    ("float", "double", "promote"), ("decimal(10,2)", "decimal(12,2)", "promote"),
    ("decimal(10,2)", "decimal(12,3)", "rewrite"), ("bigint", "int", "rewrite"),
    ("int", "bigint unsigned", "rewrite"), ("double", "float", "refuse"), ("int", "varchar(10)", "refuse"),
    ("datetime", "timestamp", "refuse"), ("text", "blob", "refuse"), ("decimal(10,2)", "decimal(40,2)", "refuse"),
])
def test_conversions(old: str, new: str, how: str) -> None:
    got = st.conversion(st.mapping(ColumnDef("c", old)), st.mapping(ColumnDef("c", new)))
    assert got.split(":")[0] == how


# --------------------------------------------------------------------------
# Session settings
# --------------------------------------------------------------------------
def config(tmp_path: Path, **spark: object) -> Config:
    return Config(target=TargetConfig(kind="spark", options=(SparkConfig(**spark),)),  # type: ignore[arg-type]
                  path=str(tmp_path / "cynomys.toml"))


def test_hadoop_warehouse_is_relative_to_the_config_file(tmp_path: Path) -> None:
    conf = spark_session.session_conf(config(tmp_path, warehouse="wh", conf={"spark.sql.shuffle.partitions": "3"}))
    assert conf["spark.sql.catalog.cynomys.warehouse"] == str(tmp_path / "wh")
    assert conf["spark.sql.catalog.cynomys"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.extensions"].endswith("IcebergSparkSessionExtensions")
    assert "iceberg-spark-runtime-3.5_2.12-" in conf["spark.jars"]
    assert conf["spark.sql.shuffle.partitions"] == "3" and conf["spark.master"] == "local[*]"
    assert spark_session.session_conf(config(tmp_path, warehouse="s3a://b/wh"))[
        "spark.sql.catalog.cynomys.warehouse"] == "s3a://b/wh"


def test_catalog_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="catalog_uri"):
        spark_session.session_conf(config(tmp_path, catalog_type="hive"))
    with pytest.raises(ConfigError, match="does not use one"):
        spark_session.session_conf(config(tmp_path, catalog_uri="http://x"))
    with pytest.raises(ConfigError, match="plain SQL name"):
        spark_session.session_conf(config(tmp_path, catalog="my-cat"))
    rest = spark_session.session_conf(config(tmp_path, catalog_type="rest", catalog_uri="http://rest:8181"))
    assert rest["spark.sql.catalog.cynomys.uri"] == "http://rest:8181"
    assert "spark.sql.catalog.cynomys.warehouse" not in rest


def test_missing_iceberg_jar_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_session, "bundled_iceberg_jar", lambda: None)
    with pytest.raises(ConfigError) as info:
        spark_session.session_conf(config(tmp_path))
    text = str(info.value)
    assert "pip install 'snowpark-connect-deps-iceberg==1.0.2'" in text
    assert "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2" in text
    online = spark_session.session_conf(config(
        tmp_path, packages=["org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2"]))
    assert "spark.jars" not in online and online["spark.jars.packages"].startswith("org.apache.iceberg")


# --------------------------------------------------------------------------
# Markers, rows and statements
# --------------------------------------------------------------------------
def test_marker_round_trip_and_order() -> None:
    s = AppliedState("p", 7, Position("mysql-bin.000010", 4, "0-1-9"), 123)
    assert marker_of(marker(s), "p") == s and marker_of(marker(s), "other") is None
    ddl_after = AppliedState("p", 7, Position("mysql-bin.000010", 900))
    assert order(s) < order(ddl_after) < order(AppliedState("p", 8, Position("mysql-bin.000002", 4)))


def test_literals_escape_with_backslashes() -> None:
    assert lit("it's a \\ path") == "'it\\'s a \\\\ path'"


def test_keyed_rows_one_per_key() -> None:
    schema = TableSchema("d", "t", (ColumnDef("id", "int"), ColumnDef("v", "int")), ("id",))
    tf = TableFlush(schema, delete_keys=[(1,), (2,), (2,)], inserts=[(1, 10), (3, 30), (3, 31)])
    rows, ops, _ = keyed_rows(tf)
    assert list(zip(rows, ops, strict=True)) == [((1, 10), "U"), ((3, 31), "U"), ((2, None), "D")]


def test_keyless_rows_and_statement() -> None:
    schema = TableSchema("d", "t", (ColumnDef("a", "int"),), ())
    tf = TableFlush(schema, delete_rows=Counter({(1,): 2}), inserts=[(2,)])
    assert keyless_rows(tf) == ([(1,), (2,)], ["D", "I"], [2, None])
    sql = keyless_merge("`c`.`d`.`t`", ["a"])
    assert "WHEN NOT MATCHED AND s.`__cynomys_op` = 'I'" in sql and "t.`a` <=> s.`a`" in sql


def test_keyed_merge_matches_keys_with_equality() -> None:
    """Keys are never NULL: '=' (a hash-join key Iceberg can filter files
    on); '<=>' only where a zero-date key is NULL and its companion is not."""
    sql = keyed_merge("`c`.`d`.`t`", ["id", "d", "d__raw", "v"], ["id", "d", "d__raw"],
                      null_safe=frozenset({"d", "d__raw"}), prune="t.`id` BETWEEN 1 AND 9")
    assert "ON t.`id` = s.`id` AND t.`d` <=> s.`d` AND t.`d__raw` <=> s.`d__raw` AND t.`id` BETWEEN 1 AND 9\n" in sql
    assert "UPDATE SET t.`v` = s.`v`\n" in sql


def test_key_range_of_the_source_keys() -> None:
    assert key_range("id", pa.array([5, -3, 12], pa.int64())) == "t.`id` BETWEEN -3 AND 12"
    assert key_range("k", pa.array(["b", "it's", "a"])) == "t.`k` BETWEEN 'a' AND 'it\\'s'"
    # No exact literal here, or a NULL key: no range (the MERGE is still right).
    assert key_range("id", pa.array([1, None], pa.int64())) == ""
    assert key_range("p", pa.array([Decimal("1.5")], pa.decimal128(5, 2))) == ""


def _covered(spans: tuple[list[tuple[int, int]], list[int]], v: int) -> bool:
    ranges, singles = spans
    return v in singles or any(lo <= v <= hi for lo, hi in ranges)


def test_key_spans_keep_a_dense_stretch_whole_and_scattered_keys_alone() -> None:
    """An initial-load flush: a chunk of dense keys (TPC-H order keys: runs
    of 8 with gaps of 25) and a few updates spread over the table."""
    import numpy as np

    chunk = [k for base in range(500_000, 700_000, 32) for k in range(base, base + 8)]
    scattered = [7, 90_000, 333_333, 999_999]
    spans = key_spans(np.unique(np.array(chunk + scattered)), 1000)
    assert spans == ([(500_000, chunk[-1])], scattered)


def test_key_spans_cover_every_key() -> None:
    import random

    import numpy as np

    rnd = random.Random(5)
    for _ in range(300):
        keys = set()
        for _ in range(rnd.randrange(1, 6)):  # a few dense stretches and scattered keys
            lo = rnd.randrange(-10**6, 10**6)
            keys.update(range(lo, lo + rnd.randrange(1, 300), rnd.choice((1, 1, 3, 70))))
        keys.update(rnd.randrange(-10**9, 10**9) for _ in range(rnd.randrange(0, 40)))
        values = np.unique(np.array(sorted(keys)))
        limit = rnd.choice((5, 50, 5000))
        spans = key_spans(values, limit)
        if spans is None:  # more singles than the limit: the caller falls back to the whole range
            assert len(values) > limit
            continue
        ranges, singles = spans
        assert len(ranges) <= 16 and len(singles) <= limit
        assert all(_covered(spans, int(v)) for v in values)


def test_key_prune_text() -> None:
    # Dense keys: the plain range; a scattered key besides them: range OR list.
    assert key_prune("id", pa.array(list(range(10, 30)), pa.int64()), 100) == "t.`id` BETWEEN 10 AND 29"
    assert key_prune("id", pa.array([*range(10, 30), 5000], pa.int64()), 100) == \
        "(t.`id` BETWEEN 10 AND 29 OR t.`id` IN (5000))"
    assert key_prune("id", pa.array([3, 900, 70_000], pa.int64()), 100) == "t.`id` IN (3, 900, 70000)"
    # Too many single keys: the whole range, as before.
    assert key_prune("id", pa.array([3, 900, 70_000], pa.int64()), 2) == "t.`id` BETWEEN 3 AND 70000"
    # BIGINT UNSIGNED beyond int64, strings, NULLs.
    big = 2**64 - 1
    assert key_prune("u", pa.array([1, big], pa.uint64()), 10) == f"t.`u` IN (1, {big})"
    assert key_prune("k", pa.array(["b", "a"]), 10) == "t.`k` BETWEEN 'a' AND 'b'"
    assert key_prune("id", pa.array([1, None], pa.int64()), 10) == ""


def test_maintenance_settings(tmp_path: Path) -> None:
    from cynomys.core.config import load_config

    p = tmp_path / "c.toml"
    p.write_text("[target.spark]\nmaintenance = false\nmaintenance_commits = 7\nsnapshots_kept = 2\n")
    sc = load_config(p).target.of(SparkConfig)
    assert (sc.maintenance, sc.maintenance_commits, sc.snapshots_kept, sc.snapshot_retention_s) == (False, 7, 2, 3600)
    assert load_config(None).target.of(SparkConfig).maintenance  # on by default
    p.write_text("[target.spark]\nmaintenance_commits = 0\n")
    with pytest.raises(ConfigError, match="maintenance_commits"):
        load_config(p)
    p.write_text("[target.spark]\nmaintenance_every = 3\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(p)


def test_a_part_names_its_flush_without_being_taken_for_it() -> None:
    """A directly appended part (direct.py) carries its flush under other
    keys: marker_of must not see the flush in it (the replay would skip the
    MERGE that never came), part_state must."""
    s = AppliedState("p", 7, Position("mysql-bin.000010", 4, "0-1-9"), 123)
    summary = part_marker(s)
    assert summary[PART_MARK] == "p"
    assert marker_of(summary, "p") is None
    assert part_state(summary) == s
    assert part_state({PART_MARK: "p"}) is None  # a staged transaction's part says only its producer
    assert part_state(marker(s)) is None


def test_direct_append_takes_flat_iceberg_types_and_local_files_only() -> None:
    assert direct.arrow_type("long") == pa.int64() and direct.arrow_type("timestamptz") == pa.timestamp("us", "UTC")
    assert direct.arrow_type("decimal(38, 10)") == pa.decimal128(38, 10)
    assert direct.arrow_type("fixed[16]") == pa.binary(16)
    for refused in ("uuid", "time", "timestamp_ns", "variant", {"type": "struct", "fields": []}):
        assert direct.arrow_type(refused) is None
    assert direct.local_path("file:/w/db/t/data/x.parquet") == "/w/db/t/data/x.parquet"
    assert direct.local_path("file:///w/x.parquet") == "/w/x.parquet"
    assert direct.local_path("/w/x.parquet") == "/w/x.parquet"
    assert direct.local_path("s3://bucket/w/x.parquet") is None and direct.local_path("hdfs://nn/w") is None
