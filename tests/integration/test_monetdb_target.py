"""MonetDBTarget against a real MonetDB server: what only MonetDB has.

No MonetDB server package is installable here, so the tests that need a
server run where ``CYNOMYS_TEST_MONETDB`` names a reachable one as a
pymonetdb URL, e.g. ``monetdb://monetdb:monetdb@127.0.0.1:50000/demo``, and
skip elsewhere.  The contract every target passes runs, on the COPY and
the INSERT bulk paths, in test_target_contract.py (target_setups/monetdb.py).
Every test works in databases (schemas) of its own, so a shared server is fine.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import uuid
from decimal import Decimal
from typing import Any, Iterator

import pytest

from cynomys.applier.targets.base import Flush, open_target
from cynomys.applier.targets.monetdb.target import MonetDBTarget, is_transient
from cynomys.applier.targets.monetdb.types import ServerFeatures, codec
from cynomys.core.config import ConfigError
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError
from cynomys.core.model import ColumnDef, Op, RawTemporal, TableSchema
from tests.integration import target_contract as contract
from tests.integration.target_setups import monetdb as monetdb_setup
from tests.integration.target_setups.monetdb import URL, make_config, monetdb_rows, with_query
from tests.servers.mariadb import free_port

pytestmark = pytest.mark.integration

UTC = datetime.timezone.utc


@pytest.fixture(scope="module")
def url() -> str:
    if not URL:
        pytest.skip("CYNOMYS_TEST_MONETDB is not set: no MonetDB server here; see docs/targets/monetdb.md")
    return URL


_run = uuid.uuid4().hex[:6]
_names = itertools.count(1)


@pytest.fixture
def db() -> str:
    return f"mdb_{_run}_{next(_names)}"


class CopyingTarget(MonetDBTarget):
    """Changes column types by copying through a new column, as on releases
    without ALTER COLUMN <type>."""

    def _open(self) -> Any:
        conn = super()._open()
        self.features = dataclasses.replace(self.features, alter_column_type=False)
        return conn


@pytest.fixture
def target(url: str) -> Iterator[MonetDBTarget]:
    t = MonetDBTarget(make_config(url))
    t.connect()
    yield t
    t.close()


@pytest.mark.parametrize("body", ["ddl", "ddl_replay_is_harmless", "all_types_round_trip"])
def test_contract_with_type_changes_by_copy(body: str, url: str, db: str) -> None:
    """Contract bodies on the path of releases without ALTER COLUMN <type>."""
    f = monetdb_setup.factory(url, CopyingTarget)
    try:
        contract.CONTRACT[body](f, db)
    finally:
        f.close()


# --------------------------------------------------------------------------
# The mapping, as data (no server needed)
# --------------------------------------------------------------------------
def test_types_are_data() -> None:
    def t(type_text: str, **features: Any) -> str:
        return codec(ColumnDef("c", type_text), ServerFeatures(**features)).sql_type

    assert [t(x) for x in ("tinyint", "tinyint unsigned", "smallint unsigned", "mediumint", "int", "int unsigned",
                           "bigint", "bigint unsigned")] == \
        ["SMALLINT", "SMALLINT", "INT", "INT", "BIGINT", "BIGINT", "HUGEINT", "HUGEINT"]
    assert t("bigint unsigned", hugeint=False) == "VARCHAR(21)" and t("bit(64)", hugeint=False) == "VARCHAR(21)"
    assert t("bit(1)") == "BIGINT" and t("bit(63)") == "BIGINT" and t("bit(64)") == "HUGEINT"
    assert t("decimal(38,10)") == "DECIMAL(38,10)" and t("decimal(65,30)") == "VARCHAR(67)"
    assert t("decimal(20,2)", hugeint=False) == "VARCHAR(22)" and t("decimal(18,2)", hugeint=False) == "DECIMAL(18,2)"
    assert t("decimal") == "DECIMAL(10,0)" and t("decimal(5)") == "DECIMAL(5,0)"
    assert t("float") == "REAL" and t("double") == "DOUBLE" and t("year") == "SMALLINT"
    assert t("datetime(6)") == "TIMESTAMP(6)" and t("datetime") == "TIMESTAMP(0)"
    assert t("timestamp(3)") == "TIMESTAMP(3) WITH TIME ZONE" and t("time(6)") == "BIGINT" and t("date") == "DATE"
    assert t("char(10)") == "VARCHAR(10)" and t("longtext") == "CLOB" and t("tinytext") == "CLOB"
    assert t("enum('a','bcd','it''s')") == "VARCHAR(4)" and t("set('x','yy')") == "VARCHAR(4)"
    assert t("json") == "CLOB" and t("json", json_keeps_text=True) == "JSON"
    assert {t(x) for x in ("binary(4)", "varbinary(9)", "blob", "longblob", "geometry")} == {"BLOB"}


def test_values_the_source_cannot_have_are_refused_before_sending() -> None:
    from cynomys.applier.targets.monetdb.types import Unstorable

    def field(type_text: str, v: Any, **features: Any) -> str:
        return codec(ColumnDef("c", type_text), ServerFeatures(**features)).field(v)

    assert field("tinyint", -128) == "-128" and field("tinyint unsigned", 255) == "255"
    assert field("time(6)", -datetime.timedelta(hours=838, minutes=59, seconds=59)) == str(-(838 * 3600 + 59 * 60 + 59)
                                                                                          * 1_000_000)
    assert field("varchar(6)", 'a|"\\\n\t') == '"a\\|\\"\\\\\\n\\t"'
    for type_text, v, features in (("tinyint unsigned", 256, {}), ("tinyint", -129, {}), ("year", 2156, {}),
                                   ("bit(3)", 8, {}), ("varchar(2)", "abc", {}), ("text", "a\x00b", {}),
                                   ("date", RawTemporal("0000-00-00"), {}), ("decimal(4,2)", Decimal("123.4"), {}),
                                   ("decimal(4,2)", Decimal("1.234"), {}),
                                   ("datetime(6)", datetime.datetime(2020, 1, 1, 0, 0, 0, 1),
                                    {"timestamp_micro": False}),
                                   ("double", -1.7976931348623157e308, {"float_min_is_null": True})):
        with pytest.raises(Unstorable):
            field(type_text, v, **features)


def test_url_is_validated() -> None:
    for bad in ("", "mysql://u:p@h:1/db", "monetdb://u:p@h:1/", "monetdb://u:p@h:1/db?bogus=1",
                "monetdb://u:p@h:1/db?bulk=fast", "monetdb://u:p@h:x/db"):
        with pytest.raises(ConfigError):
            MonetDBTarget(make_config(bad))
    t = MonetDBTarget(make_config("monetdb://us%40er:p%3Ass@db.example:50001/demo?bulk=insert"))
    assert (t._dsn["username"], t._dsn["password"], t._dsn["port"], t._dsn["database"], t.use_copy) == \
        ("us@er", "p:ss", 50001, "demo", False)


def test_errors_are_sorted_transient_or_terminal() -> None:
    import pymonetdb

    assert is_transient(ConnectionRefusedError()) and is_transient(BrokenPipeError("Server closed connection"))
    assert is_transient(pymonetdb.OperationalError("42000!Update failed due to conflict with another transaction"))
    assert is_transient(pymonetdb.IntegrityError(
        "40000!COMMIT: transaction is aborted because of concurrency conflicts, will ROLLBACK instead"))
    assert not is_transient(pymonetdb.OperationalError("42000!syntax error, unexpected IDENT"))
    assert not is_transient(pymonetdb.IntegrityError("40002!INSERT INTO: PRIMARY KEY constraint 't.t_id_pkey' violated"))
    assert not is_transient(pymonetdb.DatabaseError(
        "InvalidCredentialsException:checkCredentials:invalid credentials for user 'monetdb'"))


def test_registry_opens_it() -> None:
    assert isinstance(open_target(make_config("monetdb://monetdb:monetdb@127.0.0.1:1/demo")), MonetDBTarget)


def test_target_down_is_transient() -> None:
    target = MonetDBTarget(make_config(f"monetdb://monetdb:monetdb@127.0.0.1:{free_port()}/demo"))
    with pytest.raises(TargetUnavailableError) as info:
        target.connect()
    assert "127.0.0.1" in str(info.value)


# --------------------------------------------------------------------------
# MonetDB-specific behaviour (a server needed)
# --------------------------------------------------------------------------
def test_server_features_are_probed(target: MonetDBTarget) -> None:
    f = target.features
    assert f.version != "unknown"
    # 11.53 (the release these tests were written against) has all of these.
    major, minor = (int(x) for x in f.version.split(".")[:2])
    if (major, minor) >= (11, 49):
        assert f.timestamp_micro and not f.float_min_is_null and not f.json_keeps_text
    if (major, minor) >= (11, 41):
        assert f.copy_on_client


def test_catalog_types_keys_and_comments(target: MonetDBTarget, db: str) -> None:
    schema = contract.all_types_schema(db)
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=monetdb_rows()[2])]))

    def read(cur: Any) -> Any:
        return target.target_columns(cur, db, "all_types"), target.primary_key(cur, db, "all_types")

    columns, pk = target.query(read, "reading the catalog")
    assert pk is not None and pk[1] == ("id",)
    by_name = {c.name: c for c in columns}
    assert [c.name for c in columns] == [n for n, _ in contract.ALL_TYPES]
    assert by_name["ti"].type == "smallint" and by_name["bi_u"].type == "hugeint" and by_name["tm"].type == "bigint"
    assert by_name["ts"].type == "timestamptz" and by_name["dtt"].type == "timestamp" and by_name["bl"].type == "blob"
    assert all(c.source_type == t for c, (_, t) in zip(columns, contract.ALL_TYPES))
    assert not by_name["id"].nullable and by_name["s"].nullable


def test_a_fresh_process_reads_values_back_exactly(url: str, target: MonetDBTarget, db: str) -> None:
    """The source types live in column comments, not in the process."""
    schema = contract.all_types_schema(db)
    rows = monetdb_rows()
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
    fresh = MonetDBTarget(make_config(url))
    fresh.connect()
    contract.assert_rows(fresh, schema, rows)
    fresh.close()


def test_many_rows_read_back_exactly(target: MonetDBTarget, db: str) -> None:
    """More rows than one reply holds (10000), so pymonetdb decodes the rest
    from binary result blocks; values must keep their exact form (a
    DECIMAL's scale included, which typed equality would not notice)."""
    base_schema = contract.all_types_schema(db)
    schema = dataclasses.replace(base_schema, columns=base_schema.columns + (
        ColumnDef("d2", "decimal(15,2)"), ColumnDef("d38", "decimal(38,10)")))
    extra = [(Decimal("25.00"), Decimal("1234567890123456789012345678.0000000001")),
             (Decimal("-0.50"), Decimal("0E-10")), (Decimal("0.00"), Decimal("9" * 28 + "." + "9" * 10)), (None, None)]
    base = [r + e for r, e in zip(monetdb_rows(), extra)]
    rows = [(i * 10 + j,) + r[1:] for i in range(3000) for j, r in enumerate(base)]
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
    got = {r[0]: repr(r) for r in target.fetch_rows(db, "all_types")}
    want = {r[0]: repr(r) for r in rows}
    assert len(got) == len(want) and all(got[k] == want[k] for k in want), \
        next(f"{got.get(k)} != {want[k]}" for k in want if got.get(k) != want[k])


def test_zero_dates_are_rejected(target: MonetDBTarget, db: str) -> None:
    schema = TableSchema(db, "z", (ColumnDef("id", "int"), ColumnDef("d", "date")), ("id",))
    producer = f"zero-{db}"
    st = contract.state(seq=1, producer=producer)
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, datetime.date(2020, 1, 1)))], st))
    for bulk in ("", "bulk=insert"):
        # show_keys: the refused row's key is named (never without it: keys reach logs).
        t = MonetDBTarget(make_config(with_query(target.cfg.target.url, bulk), show_keys=True))
        t.connect()
        with pytest.raises(TargetRejectedError) as info:
            t.apply(contract.flush([contract.change(Op.INSERT, schema, after=(2, RawTemporal("0000-00-00")))],
                                   contract.state(seq=2, producer=producer)))
        text = str(info.value)
        assert f"{db}.z" in text and "column d" in text and "0000-00-00" in text and "NO_ZERO_DATE" in text
        assert "with key (2,)" in text
        t.close()
    contract.assert_rows(target, schema, [(1, datetime.date(2020, 1, 1))])
    assert target.applied(producer) == st


def test_text_with_nul_is_rejected(target: MonetDBTarget, db: str) -> None:
    schema = TableSchema(db, "nul", (ColumnDef("id", "int"), ColumnDef("s", "varchar(10)")), ("id",))
    with pytest.raises(TargetRejectedError, match="NUL"):
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, "a\x00b"))]))


def test_ddl_and_state_commit_together(target: MonetDBTarget, db: str) -> None:
    """A statement whose second operation is refused leaves nothing of the first."""
    producer = f"ddl-{db}"
    st = contract.state(producer=producer)
    target.apply_ddl(contract.ddl("", f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, s VARCHAR(10))"), st)
    schema = TableSchema(db, "t", (ColumnDef("id", "int"), ColumnDef("s", "varchar(10)")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, "12:00:00"))], contract.state(
        producer=producer)))
    st2 = target.applied(producer)
    with pytest.raises(TargetRejectedError) as info:
        target.apply_ddl(contract.ddl(db, "ALTER TABLE t ADD COLUMN x INT, MODIFY s TIME"),
                         contract.state(producer=producer))
    assert "MODIFY s TIME" in str(info.value) and "skip_ddl" in str(info.value)
    assert target.applied(producer) == st2
    cols = target.query(lambda cur: target.target_columns(cur, db, "t"), "columns")
    assert [c.name for c in cols] == ["id", "s"]


def test_add_column_fills_existing_rows(target: MonetDBTarget, db: str) -> None:
    schema = TableSchema(db, "f", (ColumnDef("id", "int"),), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(i,)) for i in (1, 2)]))
    ts = 1_700_000_000
    for sql in ("ALTER TABLE f ADD COLUMN n INT NOT NULL DEFAULT 7",
                "ALTER TABLE f ADD COLUMN s VARCHAR(5) NOT NULL",
                "ALTER TABLE f ADD COLUMN d DECIMAL(6,2) DEFAULT '1.5'",
                "ALTER TABLE f ADD COLUMN t TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP",
                "ALTER TABLE f ADD COLUMN tm TIME DEFAULT '-01:02:03'",
                "ALTER TABLE f ADD COLUMN e ENUM('x','y') NOT NULL",
                "ALTER TABLE f ADD COLUMN z INT"):
        change = dataclasses.replace(contract.ddl(db, sql), commit_ts=ts)
        target.apply_ddl(change, contract.state())
    when = datetime.datetime.fromtimestamp(ts, UTC)
    expected = [(i, 7, "", Decimal("1.50"), when, -datetime.timedelta(hours=1, minutes=2, seconds=3), "x", None)
                for i in (1, 2)]
    assert sorted(target.fetch_rows(db, "f")) == expected
    # A zero date for existing rows cannot be stored; on an empty table there is nothing to fill.
    with pytest.raises(TargetRejectedError, match="zero or partial date"):
        target.apply_ddl(contract.ddl(db, "ALTER TABLE f ADD COLUMN zd DATE NOT NULL"), contract.state())
    target.apply_ddl(contract.ddl(db, "CREATE TABLE g (id INT PRIMARY KEY)"), contract.state())
    target.apply_ddl(contract.ddl(db, "ALTER TABLE g ADD COLUMN zd DATE NOT NULL"), contract.state())
    assert target.fetch_rows(db, "g") == []


def test_rename_table_across_databases(target: MonetDBTarget, db: str) -> None:
    other = db + "_b"
    target.apply_ddl(contract.ddl("", f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v BIGINT UNSIGNED)"),
                     contract.state())
    schema = TableSchema(db, "t", (ColumnDef("id", "int"), ColumnDef("v", "bigint unsigned")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, 2**64 - 1))]))
    target.apply_ddl(contract.ddl(db, f"RENAME TABLE t TO `{other}`.u"), contract.state())
    assert not target.table_exists(db, "t") and target.table_exists(other, "u")
    assert target.fetch_rows(other, "u") == [(1, 2**64 - 1)]
    target.apply_ddl(contract.ddl(db, f"DROP DATABASE `{other}`"), contract.state())
    assert not target.table_exists(other, "u")


def test_primary_key_ddl(target: MonetDBTarget, db: str) -> None:
    for sql in (f"CREATE TABLE `{db}`.k (a INT NOT NULL, b INT NOT NULL, c INT)",
                f"ALTER TABLE `{db}`.k ADD PRIMARY KEY (a, b)",
                f"ALTER TABLE `{db}`.k DROP PRIMARY KEY, ADD PRIMARY KEY (b)"):
        target.apply_ddl(contract.ddl("", sql), contract.state())
    pk = target.query(lambda cur: target.primary_key(cur, db, "k"), "pk")
    assert pk is not None and pk[1] == ("b",)
    target.apply_ddl(contract.ddl("", f"ALTER TABLE `{db}`.k MODIFY b BIGINT NOT NULL"), contract.state())
    pk = target.query(lambda cur: target.primary_key(cur, db, "k"), "pk")
    assert pk is not None and pk[1] == ("b",)
    target.apply_ddl(contract.ddl("", f"ALTER TABLE `{db}`.k DROP COLUMN b"), contract.state())
    assert target.query(lambda cur: target.primary_key(cur, db, "k"), "pk") is None
    target.apply_ddl(contract.ddl("", f"ALTER TABLE `{db}`.k ADD PRIMARY KEY (a)"), contract.state())
    target.apply_ddl(contract.ddl("", f"ALTER TABLE `{db}`.k DROP PRIMARY KEY"), contract.state())
    assert target.query(lambda cur: target.primary_key(cur, db, "k"), "pk") is None


def test_type_change_that_cannot_be_cast_is_refused(target: MonetDBTarget, db: str) -> None:
    target.apply_ddl(contract.ddl("", f"CREATE TABLE `{db}`.m (id INT PRIMARY KEY, t TIME(6))"), contract.state())
    with pytest.raises(TargetRejectedError) as info:
        target.apply_ddl(contract.ddl(db, "ALTER TABLE m MODIFY t VARCHAR(20)"), contract.state())
    assert "re-snapshot" in str(info.value)
    # Same MonetDB type: only the recorded source type changes.
    target.apply_ddl(contract.ddl(db, "ALTER TABLE m MODIFY t TIME(3)"), contract.state())
    cols = target.query(lambda cur: target.target_columns(cur, db, "m"), "columns")
    assert cols[1].source_type == "time(3)"


def test_source_database_named_like_a_monetdb_schema_is_rejected(target: MonetDBTarget) -> None:
    for name in ("cynomys_state", "sys", "tmp"):
        schema = TableSchema(name, "x", (ColumnDef("id", "int"),), ("id",))
        with pytest.raises(TargetRejectedError, match="schema"):
            target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1,))]))


def test_reserved_words_and_odd_names(target: MonetDBTarget, db: str) -> None:
    name = db + '-"odd" name'
    schema = TableSchema(name, "order", (ColumnDef("select", "int"), ColumnDef("from", "varchar(5)"),
                                         ColumnDef('we"ird', "date"), ColumnDef("group", "int")), ("select", "from"))
    rows = [(1, "a", datetime.date(2020, 1, 1), 1), (2, "b", None, None)]
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
    target.apply(contract.flush([contract.change(Op.DELETE, schema, before=rows[0])]))
    contract.assert_rows(target, schema, rows[1:])
    target.apply_ddl(contract.ddl(name, "ALTER TABLE `order` RENAME COLUMN `from` TO `to`, ADD COLUMN `user` INT"),
                     contract.state())
    assert target.fetch_rows(name, "order") == [(2, "b", None, None, None)]
    target.apply_ddl(contract.ddl(name, f"DROP DATABASE `{name}`"), contract.state())
    assert not target.table_exists(name, "order")


def test_alter_of_a_missing_table_is_skipped(target: MonetDBTarget, db: str) -> None:
    st = contract.state(producer=f"missing-{db}")
    target.apply_ddl(contract.ddl(db, "ALTER TABLE nowhere ADD COLUMN x INT, MODIFY y BIGINT"), st)
    assert target.applied(st.producer_id) == st
    assert not target.table_exists(db, "nowhere")


def test_flush_with_no_tables_moves_only_the_state(target: MonetDBTarget) -> None:
    st = contract.state(producer=f"only-state-{_run}")
    target.apply(Flush([], st))
    assert target.applied(st.producer_id) == st


class RaisingTarget(MonetDBTarget):
    """Fails between the data and the state write of a flush."""

    def _write_state(self, cur: Any, state: Any) -> None:
        raise RuntimeError("boom between data and state")


def test_failure_mid_flush_applies_nothing(url: str, target: MonetDBTarget, db: str) -> None:
    producer = f"mid-{db}"
    schema = TableSchema(db, "t", (ColumnDef("id", "int"), ColumnDef("v", "varchar(5)")), ("id",))
    st1 = contract.state(seq=1, producer=producer)
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, "a"))], st1))
    bad = RaisingTarget(make_config(url))
    bad.connect()
    new_table = TableSchema(db, "new", (ColumnDef("id", "int"),), ("id",))
    with pytest.raises(RuntimeError):
        bad.apply(contract.flush([contract.change(Op.UPDATE, schema, before=(1, "a"), after=(1, "b")),
                                  contract.change(Op.INSERT, new_table, after=(1,))],
                                 contract.state(seq=2, producer=producer)))
    contract.assert_rows(target, schema, [(1, "a")])
    assert target.applied(producer) == st1
    assert target.fetch_rows(db, "new") == []  # created before the flush, which was rolled back
    bad.close()


def test_failure_after_runs_applies_nothing(url: str, target: MonetDBTarget, db: str) -> None:
    """Runs loaded by COPY (ON CLIENT where the server has it) are part of
    the flush's transaction: a failure before the state leaves none of them,
    nor the READ runs' deletions."""
    from cynomys.applier.targets.base import build_flush

    producer = f"midruns-{db}"
    schema = TableSchema(db, "t", (ColumnDef("id", "int"), ColumnDef("v", "varchar(5)")), ("id",))
    st1 = contract.state(seq=1, producer=producer)
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, "a"))], st1))
    bad = RaisingTarget(make_config(url))
    bad.connect()
    with contract.compiled_path():
        changes = contract.column_wise([contract.change(Op.READ, schema, after=(1, "b")),
                                        contract.change(Op.INSERT, schema, after=(2, "c"))])
        flush = build_flush(changes, contract.state(seq=2, producer=producer), bad.capabilities.columnar_inserts)
    assert [len(tf.runs) for tf in flush.tables] == [2]
    with pytest.raises(RuntimeError):
        bad.apply(flush)
    contract.assert_rows(target, schema, [(1, "a")])
    assert target.applied(producer) == st1
    bad.close()


def test_bad_credentials_are_terminal(url: str) -> None:
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    wrong = url.replace(f"{parts.username}:{parts.password}@", f"{parts.username}:wrong-password@", 1)
    with pytest.raises(TargetRejectedError):
        MonetDBTarget(make_config(wrong)).connect()


def test_concurrency_conflict_is_transient(url: str, target: MonetDBTarget) -> None:
    """MonetDB's optimistic concurrency control fails one of two writers of
    one row at COMMIT; that must be retried, not stop the applier."""
    other = MonetDBTarget(make_config(url))
    other.connect()
    producer = f"conflict-{_run}"
    target.apply(Flush([], contract.state(seq=1, producer=producer)))
    conn_a, conn_b = target._open(), other._open()
    tbl = '"cynomys_state"."applied"'
    a, b = conn_a.cursor(), conn_b.cursor()
    a.execute(f"UPDATE {tbl} SET seq = 2 WHERE producer_id = '{producer}'")
    with pytest.raises(Exception) as info:  # at the statement (11.41+) or at COMMIT (older)
        b.execute(f"UPDATE {tbl} SET seq = 3 WHERE producer_id = '{producer}'")
        conn_a.commit()
        conn_b.commit()
    assert is_transient(info.value), info.value
    conn_a.rollback()
    conn_b.rollback()
    other.close()


class StdinTarget(MonetDBTarget):
    """Sends COPY records in the request (FROM STDIN), as on releases
    without COPY ... ON CLIENT."""

    def _open(self) -> Any:
        conn = super()._open()
        self.features = dataclasses.replace(self.features, copy_on_client=False)
        return conn


@pytest.mark.parametrize("kind", [MonetDBTarget, StdinTarget], ids=["on_client", "stdin"])
def test_runs_load_what_rows_load(url: str, kind: type[MonetDBTarget], db: str) -> None:
    """InsertRuns (column-wise, monetdb/runs.py) and row images (the
    reference) of the same rows make the same table, value for value (a
    DECIMAL's scale and a TIMESTAMP's microseconds included): inserts, then
    snapshot reads (READ runs) over keys the table holds."""
    target = kind(make_config(url))
    target.connect()
    assert kind is MonetDBTarget or not target.features.copy_on_client
    from cynomys.applier.targets.base import build_flush
    from cynomys.core.model import Batch, Change, Position
    from cynomys.schemas import codec as wire

    def column_wise(changes: list[Change]) -> list[Change]:
        # One envelope, a source transaction per 300 rows: runs of many rows.
        txns = [dataclasses.replace(c, txn=Position("b.000001", 100 + i // 300)) for i, c in enumerate(changes)]
        return list(wire.decode_columnar(wire.encode(Batch("p", tuple(txns), Position("b.000001", 10**6)))).changes)

    texts = ["", 'q"uote', "it's", "new\nline", "cr\rlf", "tab\there", "back\\slash", "\\N", "bar|bar", "null",
             "caf\u00e9 \U0001F600", ' "|\\\n ', "x" * 100]
    base = contract.all_types_schema(db, "rows")
    extra = (ColumnDef("d2", "decimal(15,2)"), ColumnDef("d38", "decimal(38,10)"), ColumnDef("ts3", "timestamp(3)"))
    schemas = {how: dataclasses.replace(base, table=how, columns=base.columns + extra) for how in ("rows", "runs")}
    decimals = [(Decimal("25.00"), Decimal("1234567890123456789012345678.0000000001")), (Decimal("-0.50"), Decimal("0E-10")),
                (Decimal("-0.00"), Decimal("-12.5000000000")), (None, None)]
    rows = []
    for i in range(2000):
        r = list(monetdb_rows()[i % 4])
        r[0] = i
        if r[25] is not None:
            r[25] = texts[i % len(texts)]
            r[33] = texts[(i + 3) % len(texts)] * (i % 3)
        ts = datetime.datetime(2020, 1, 1, 0, 0, i % 60, (i % 1000) * 1000, tzinfo=UTC) if i % 5 else None
        rows.append(tuple(r) + decimals[i % 4] + (ts,))
    reread = [(r[0],) + rows[(r[0] + 1) % len(rows)][1:] for r in rows[::3]]  # new values for held keys
    with contract.compiled_path():
        for how, schema in schemas.items():
            inserts = [contract.change(Op.INSERT, schema, after=r) for r in rows]
            reads = [contract.change(Op.READ, schema, after=r) for r in reread]
            for step in (inserts, reads):
                changes = column_wise(step) if how == "runs" else step
                flush = build_flush(changes, contract.state(), target.capabilities.columnar_inserts)
                if how == "runs":
                    assert sum(len(tf.runs) for tf in flush.tables) and not any(tf.inserts for tf in flush.tables)
                target.apply(flush)
    got = {how: sorted(map(repr, target.fetch_rows(db, how))) for how in schemas}
    assert len(got["runs"]) == len(rows)
    assert got["runs"] == got["rows"]
    target.close()


def test_a_flush_of_many_keyless_deletes_goes_together(target: MonetDBTarget, db: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """300 keyless deletes and updates in one flush: a few statements, not
    two a row (each a scan of the table), and the multiset exact after --
    a row the table holds twice loses one copy, and a row holding NULL is
    still deleted alone."""
    schema = TableSchema(db, "bag", (ColumnDef("a", "int"), ColumnDef("s", "varchar(20)"),
                                     ColumnDef("d", "decimal(10,2)"), ColumnDef("t", "datetime(6)")), ())
    at = datetime.datetime(2026, 12, 1, 12, 0, 0, 500)
    rows = [(i, f"r{i}", (Decimal(i) / 4).quantize(Decimal("0.01")), at + datetime.timedelta(seconds=i)) for i in range(3000)]
    twice, null_row = rows[:3], (7, None, Decimal("1.25"), None)  # rows 0 and 1 change below, row 2 does not
    held = collections.Counter(rows + twice + [null_row])
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in held.elements()]))
    gone, updated = rows[::20], rows[1::20]  # 150 rows each
    changes = [contract.change(Op.DELETE, schema, before=r) for r in gone + [null_row]]
    changes += [contract.change(Op.UPDATE, schema, before=r, after=(r[0] + 10_000,) + r[1:]) for r in updated]
    statements = []
    execute = type(target)._execute

    def counted(self: MonetDBTarget, cur: Any, sql: str, schema: TableSchema) -> None:
        statements.append(sql)
        execute(self, cur, sql, schema)

    monkeypatch.setattr(type(target), "_execute", counted)
    target.apply(contract.flush(changes))
    held.subtract(gone + [null_row] + updated)
    held.update((r[0] + 10_000,) + r[1:] for r in updated)
    contract.assert_rows(target, schema, held.elements())
    deletes = [s for s in statements if s.startswith("DELETE")]
    assert len(deletes) <= 2, f"{len(deletes)} DELETE statements for 301 keyless rows"
