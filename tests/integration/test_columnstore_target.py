"""ColumnStoreTarget against a real MariaDB server: what only ColumnStore has.

The ColumnStore engine cannot be installed here, so the target runs with
``engine = 'InnoDB'``; ``EmulatedColumnStore`` swaps in the ColumnStore
*profile* on InnoDB tables (target_setups/columnstore.py).  The contract
every target passes runs, on both and on the INSERT path, in
test_target_contract.py.
"""
from __future__ import annotations

import dataclasses
import itertools
from decimal import Decimal
from typing import Any, Iterator

import pytest

from cynomys.applier.targets.base import Flush, build_flush, open_target
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.applier.targets.columnstore.types import COLUMNSTORE, INNODB
from cynomys.core.config import RouteRule, ShapeConfig, TableRule
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError
from cynomys.core.model import ColumnDef, Op, TableSchema
from tests.integration import target_contract as contract
from tests.integration.target_setups.columnstore import EmulatedColumnStore, columnstore_rows, make_config
from tests.servers.mariadb import MariaDBServer, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[MariaDBServer]:
    srv = MariaDBServer(server_id=7).start()
    yield srv
    srv.destroy()


_names = itertools.count(1)


@pytest.fixture
def db() -> str:
    return f"cs_test_{next(_names)}"


# --------------------------------------------------------------------------
# ColumnStore-specific behaviour
# --------------------------------------------------------------------------
def test_registry_opens_it(server: MariaDBServer) -> None:
    assert isinstance(open_target(make_config(server.url)), ColumnStoreTarget)


def test_profiles_are_data() -> None:
    def t(type_text: str) -> str:
        return COLUMNSTORE.target_type(ColumnDef("c", type_text))

    assert t("bit(64)") == "decimal(20,0)" and t("bit(7)") == "bigint unsigned"
    assert t("year") == "smallint" and t("json") == "longtext" and t("time(6)") == "time(6)"
    assert t("enum('a','bcd','it''s')") == "varchar(4)" and t("set('x','yy')") == "varchar(4)"
    assert t("binary(4)") == "varbinary(4)" and t("decimal(65,30)") == "decimal(38,3)"
    assert t("decimal(20,5)") == "decimal(20,5)" and t("varchar(5000)") == "text"
    assert t("bigint unsigned") == "bigint unsigned"
    assert INNODB.target_type(ColumnDef("c", "bit(64)")) == "bit(64)"
    assert not COLUMNSTORE.declare_keys and INNODB.declare_keys


def test_tables_and_keys_per_profile(server: MariaDBServer) -> None:
    schema = TableSchema("cs_keys", "t", (ColumnDef("id", "int"), ColumnDef("y", "year"),
                                          ColumnDef("e", "enum('a','bb')")), ("id",))
    for cls, table, has_pk, types in ((ColumnStoreTarget, "innodb_t", True, ["int(11)", "year(4)", "enum('a','bb')"]),
                                      (EmulatedColumnStore, "cs_t", False, ["int(11)", "smallint(6)", "varchar(2)"])):
        target = cls(make_config(server.url))
        target.connect()
        s = dataclasses.replace(schema, table=table)
        target.apply(contract.flush([contract.change(Op.INSERT, s, after=(1, 2000, "bb"))]))
        rows = server.execute(f"SELECT COLUMN_TYPE, COLUMN_KEY FROM information_schema.COLUMNS WHERE "
                              f"TABLE_SCHEMA='cs_keys' AND TABLE_NAME='{table}' ORDER BY ORDINAL_POSITION")
        assert [r[0] for r in rows] == types
        assert (rows[0][1] == "PRI") is has_pk
        assert target.fetch_rows("cs_keys", table) == [(1, 2000, "bb")]
        target.close()


def test_columnstore_profile_rejects_a_decimal_it_cannot_hold(server: MariaDBServer, db: str) -> None:
    target = EmulatedColumnStore(make_config(server.url))
    target.connect()
    schema = TableSchema(db, "wide", (ColumnDef("id", "int"), ColumnDef("dec", "decimal(65,30)")), ("id",))
    with pytest.raises(TargetRejectedError) as info:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, Decimal("1.0001")))]))
    assert f"{db}.wide" in str(info.value) and "decimal(38,3)" in str(info.value)
    assert target.fetch_rows(db, "wide") == []
    target.close()


def test_columnstore_profile_replay_is_idempotent(server: MariaDBServer, db: str) -> None:
    """Where data and state may commit apart, applying a flush twice ends the same."""
    target = EmulatedColumnStore(make_config(server.url))
    target.connect()
    schema = TableSchema(db, "t", (ColumnDef("id", "int"), ColumnDef("v", "int")), ("id",))
    fl = contract.flush([contract.change(Op.INSERT, schema, after=(i, i)) for i in range(5)])
    target.apply(fl)
    target.apply(fl)
    contract.assert_rows(target, schema, [(i, i) for i in range(5)])
    target.close()


def test_state_table_is_innodb(server: MariaDBServer) -> None:
    EmulatedColumnStore(make_config(server.url)).connect()
    rows = server.execute("SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA='cynomys_state' "
                          "AND TABLE_NAME='applied'")
    assert rows == [("InnoDB",)]


class RaisingTarget(ColumnStoreTarget):
    """Fails between the data and the state write of a flush."""

    def _write_state(self, cur: Any, state: Any) -> None:
        raise RuntimeError("boom between data and state")


class KilledTarget(ColumnStoreTarget):
    """Its connection is killed between the data and the state write (once)."""

    admin: MariaDBServer
    kills = 1

    def _write_state(self, cur: Any, state: Any) -> None:
        assert self._conn is not None
        if self.kills:
            self.kills -= 1
            self.admin.execute(f"KILL CONNECTION {self._conn.thread_id()}")
        super()._write_state(cur, state)


@pytest.mark.parametrize("cls", [RaisingTarget, KilledTarget])
def test_failure_mid_flush_applies_nothing(server: MariaDBServer, db: str, cls: type[ColumnStoreTarget]) -> None:
    good = ColumnStoreTarget(make_config(server.url))
    good.connect()
    producer = f"mid-{db}"
    schema = TableSchema(db, "t", (ColumnDef("id", "int"), ColumnDef("v", "varchar(5)")), ("id",))
    st1 = contract.state(seq=1, producer=producer)
    good.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, "a"))], st1))

    bad = cls(make_config(server.url))
    if isinstance(bad, KilledTarget):
        bad.admin = server
    bad.connect()
    fl = contract.flush([contract.change(Op.UPDATE, schema, before=(1, "a"), after=(1, "b")),
                         contract.change(Op.INSERT, schema, after=(2, "c"))], contract.state(seq=2, producer=producer))
    expected: type[BaseException] = RuntimeError if cls is RaisingTarget else TargetUnavailableError
    with pytest.raises(expected):
        bad.apply(fl)
    contract.assert_rows(good, schema, [(1, "a")])
    assert good.applied(producer) == st1
    # The same target recovers (a new connection) and applies the flush once.
    if isinstance(bad, KilledTarget):
        bad.apply(fl)
        contract.assert_rows(good, schema, [(1, "b"), (2, "c")])
        assert good.applied(producer) == fl.state
    bad.close()
    good.close()


def test_target_down_is_transient() -> None:
    target = ColumnStoreTarget(make_config(f"mysql://root:x@127.0.0.1:{free_port()}/"))
    with pytest.raises(TargetUnavailableError) as info:
        target.connect()
    assert "127.0.0.1" in str(info.value)


def test_server_restart_is_transient_then_recovers(db: str) -> None:
    srv = MariaDBServer(server_id=8).start()
    try:
        target = ColumnStoreTarget(make_config(srv.url))
        target.connect()
        schema = TableSchema(db, "t", (ColumnDef("id", "int"),), ("id",))
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1,))]))
        srv.kill()
        with pytest.raises(TargetUnavailableError):
            target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(2,))]))
        srv.start()
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(2,))]))
        contract.assert_rows(target, schema, [(1,), (2,)])
        target.close()
    finally:
        srv.destroy()


def test_bad_credentials_are_terminal(server: MariaDBServer) -> None:
    with pytest.raises(TargetRejectedError):
        ColumnStoreTarget(make_config(f"mysql://root:wrong@127.0.0.1:{server.port}/")).connect()


def test_server_refusing_local_infile_falls_back_to_insert(server: MariaDBServer, db: str) -> None:
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    assert target.use_load_data
    server.execute("SET GLOBAL local_infile = 0")
    try:
        contract.check_all_types_round_trip(lambda **kw: target, db)
    finally:
        server.execute("SET GLOBAL local_infile = 1")
    assert not target.use_load_data
    target.close()


def test_source_database_named_like_the_state_database_is_rejected(server: MariaDBServer) -> None:
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    schema = TableSchema("cynomys_state", "x", (ColumnDef("id", "int"),), ("id",))
    with pytest.raises(TargetRejectedError, match="state database"):
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1,))]))
    target.close()


def test_alter_of_a_missing_table_is_skipped(server: MariaDBServer, db: str) -> None:
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    st = contract.state()
    target.apply_ddl(contract.ddl(db, "ALTER TABLE nowhere ADD COLUMN x INT, MODIFY y BIGINT"), st)
    assert target.applied(contract.PRODUCER) == st
    assert not target.table_exists(db, "nowhere")
    target.close()


def test_primary_key_ddl(server: MariaDBServer, db: str) -> None:
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    for sql in (f"CREATE TABLE `{db}`.k (a INT, b INT)", f"ALTER TABLE `{db}`.k ADD PRIMARY KEY (a, b)",
                f"ALTER TABLE `{db}`.k DROP PRIMARY KEY, ADD PRIMARY KEY (b)"):
        target.apply_ddl(contract.ddl("", sql), contract.state())
    rows = server.execute(f"SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA='{db}' "
                          "AND TABLE_NAME='k' AND INDEX_NAME='PRIMARY'")
    assert rows == [("b",)]
    target.apply_ddl(contract.ddl("", f"ALTER TABLE `{db}`.k DROP PRIMARY KEY"), contract.state())
    assert server.execute(f"SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA='{db}' "
                          "AND TABLE_NAME='k'") == [(0,)]
    target.close()


def test_a_replicated_keyless_table_gets_its_whole_column_indexes(server: MariaDBServer, db: str) -> None:
    # A keyless table's updated rows are found by their values: the indexes
    # its CREATE TABLE declares on whole columns are made on the target (a
    # prefix one is not); a table with a key gets only its key.
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    try:
        for sql in (f"CREATE TABLE `{db}`.bag (a INT, b VARCHAR(10), c VARCHAR(30), KEY (a), UNIQUE KEY (b), "
                    "KEY pre (c(3)))",
                    f"CREATE TABLE `{db}`.keyed (a INT PRIMARY KEY, b INT, KEY (b))"):
            target.apply_ddl(contract.ddl("", sql), contract.state())
        rows = server.execute(f"SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
                              f"WHERE TABLE_SCHEMA='{db}' ORDER BY 1, 2")
        assert rows == [("bag", "cynomys_a", "a"), ("bag", "cynomys_b", "b"), ("keyed", "PRIMARY", "a")]
        # An index the source adds later: made on the keyless table (rows
        # and all, as the source built it), not on the keyed one; one on
        # columns the target already indexes is not made twice.
        server.execute(f"INSERT INTO `{db}`.bag VALUES (1, 'x', 'y'), (2, 'z', NULL)")
        # With the options online schema changes are written with (which
        # sqlglot cannot read: the applier stopped on them as unparsable);
        # each is MariaDB's own syntax, as the server running it shows (MySQL
        # also takes ALGORITHM/LOCK after DROP INDEX: tests/unit/test_ddl.py).
        later = ("CREATE INDEX by_c USING BTREE ON {t}bag (c) WAIT 5 ALGORITHM=INPLACE LOCK=NONE",
                 "ALTER TABLE {t}keyed ADD INDEX IF NOT EXISTS (b) IGNORED, ALGORITHM=INPLACE, LOCK=NONE",
                 "ALTER TABLE {t}bag ADD KEY (a) USING HASH", "DROP INDEX by_b ON {t}bag WAIT 3")
        server.execute(f"CREATE DATABASE `{db}_syntax`", f"CREATE TABLE `{db}_syntax`.bag (a INT, c INT, KEY by_b (a))",
                       f"CREATE TABLE `{db}_syntax`.keyed (a INT PRIMARY KEY, b INT)",
                       *(sql.format(t=f"`{db}_syntax`.") for sql in later), f"DROP DATABASE `{db}_syntax`")
        for sql in later:
            target.apply_ddl(contract.ddl("", sql.format(t=f"`{db}`.")), contract.state())
        rows = server.execute(f"SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
                              f"WHERE TABLE_SCHEMA='{db}' ORDER BY 1, 2")
        assert rows == [("bag", "cynomys_a", "a"), ("bag", "cynomys_b", "b"), ("bag", "cynomys_c", "c"),
                        ("keyed", "PRIMARY", "a")]
    finally:
        target.close()


def test_a_shaped_keyless_table_keeps_the_indexes_its_shape_can_hold(server: MariaDBServer, db: str) -> None:
    # Routed to another name, a column renamed, one masked, one left out:
    # the snapshot's indexes and a later CREATE INDEX are made by the target
    # names; one led by the left-out column is not.  Then updates and deletes
    # of the masked rows find them.
    from tests.integration.shape_contract import Source, _shape, land

    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    try:
        shaper, stage = _shape(target, ShapeConfig(
            route=[RouteRule(f"{db}_src.log", f"{db}.events")],
            tables={f"{db}_src.log": TableRule(exclude=["note"], rename={"who": "actor"}, mask={"ip": "hash"})}))
        cols = (ColumnDef("who", "int"), ColumnDef("ip", "varchar(40)"), ColumnDef("note", "text"),
                ColumnDef("n", "int"))
        log = TableSchema(f"{db}_src", "log", cols, (), (("who", "n"), ("note",), ("ip",)))
        rows = [(i % 50, f"10.0.0.{i % 7}", "x", i) for i in range(300)]
        src = Source()
        land(target, shaper, stage, src.txn(*((Op.READ, log, None, r) for r in rows)))
        land(target, shaper, stage, src.ddl(f"{db}_src", "CREATE INDEX by_n ON log (n)"),
             src.ddl(f"{db}_src", "CREATE INDEX by_note ON log (note, n)"))
        got = server.execute(f"SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM "
                             f"information_schema.STATISTICS WHERE TABLE_SCHEMA='{db}' AND TABLE_NAME='events' "
                             "GROUP BY INDEX_NAME ORDER BY 1")
        assert got == [("cynomys_actor_n", "actor,n"), ("cynomys_ip", "ip"), ("cynomys_n", "n")]
        plain = TableSchema(f"{db}_src", "log", cols, ())
        land(target, shaper, stage, src.txn((Op.UPDATE, plain, rows[3], (3, "10.0.0.3", "x", 1000)),
                                            (Op.DELETE, plain, rows[4], None)))
        left = server.execute(f"SELECT actor, n FROM `{db}`.events WHERE n IN (3, 4, 1000) ORDER BY n")
        assert left == [(3, 1000)]
        assert server.execute(f"SELECT COUNT(*) FROM `{db}`.events") == [(299,)]
    finally:
        target.close()


def test_modify_by_copy_keeps_values(server: MariaDBServer, db: str) -> None:
    target = EmulatedColumnStore(make_config(server.url))
    target.connect()
    schema = TableSchema(db, "m", (ColumnDef("id", "int"), ColumnDef("v", "int")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(i, i * 10)) for i in range(3)]))
    target.apply_ddl(contract.ddl(db, "ALTER TABLE m MODIFY v VARCHAR(10)"), contract.state())
    contract.assert_rows(target, TableSchema(db, "m", (ColumnDef("id", "int"), ColumnDef("v", "varchar(10)")),
                                             ("id",)), [(i, str(i * 10)) for i in range(3)])
    target.close()


def test_url_is_validated() -> None:
    from cynomys.core.errors import ConfigError
    for url in ("", "postgres://x@h/", "mysql://u:p@h:1/somedb", "mysql://u:p@h:1/?bogus=1"):
        with pytest.raises(ConfigError):
            ColumnStoreTarget(make_config(url))
    with pytest.raises(ConfigError):
        ColumnStoreTarget(make_config("mysql://u:p@h:1/", engine="InnoDB; DROP"))
    t = ColumnStoreTarget(make_config("mysql://us%40er:p%3Ass@db.example:3307/?local_infile=0"))
    assert (t._dsn["user"], t._dsn["password"], t._dsn["port"], t.use_load_data) == ("us@er", "p:ss", 3307, False)


def test_flush_with_no_tables_moves_only_the_state(server: MariaDBServer) -> None:
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    st = contract.state(producer="only-state")
    target.apply(Flush([], st))
    assert target.applied("only-state") == st
    target.close()



def test_a_replayed_column_wise_flush_changes_nothing(server: MariaDBServer, db: str) -> None:
    """The contract's ``all_types_column_wise`` input applied twice: the
    ColumnStore profile deletes the InsertRuns' keys first."""
    target = EmulatedColumnStore(make_config(server.url))
    target.connect()
    with contract.compiled_path():
        schema = contract.all_types_schema(db)
        rows = columnstore_rows()
        changes = contract.column_wise([contract.change(Op.INSERT, schema, after=r) for r in rows])
        for _ in range(2):
            target.apply(build_flush(changes, contract.state(), target.capabilities.columnar_inserts))
            contract.assert_rows(target, schema, rows)
    target.close()


def test_one_key_of_a_composite_key_is_deleted_through_the_key(server: MariaDBServer, db: str) -> None:
    """An update or delete of one row of a two-column key reaches MariaDB as
    ``a = .. AND b = ..``: its ``(a, b) IN ((..))`` was a full table scan per
    statement (the initial load's writers made the 10M-row load quadratic)."""
    schema = TableSchema(db, "t", (ColumnDef("a", "bigint"), ColumnDef("b", "int"), ColumnDef("c", "varchar(20)")),
                         ("a", "b"))
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(0, 1, "first"))]))
    server.execute(f"INSERT INTO {db}.t SELECT seq, 1, 'x' FROM {db}.seq_1_to_20000")

    def scanned(changes: list[Any]) -> int:
        before = int(server.execute("SHOW GLOBAL STATUS LIKE 'Handler_read_rnd_next'")[0][1])
        target.apply(contract.flush(changes))
        return int(server.execute("SHOW GLOBAL STATUS LIKE 'Handler_read_rnd_next'")[0][1]) - before

    one_update = [contract.change(Op.UPDATE, schema, before=(7, 1, "x"), after=(7, 1, "y"))]
    one_delete = [contract.change(Op.DELETE, schema, before=(9, 1, "x"))]
    three_deletes = [contract.change(Op.DELETE, schema, before=(k, 1, "x")) for k in (11, 12, 13)]
    assert [scanned(c) < 1000 for c in (one_update, one_delete, three_deletes)] == [True, True, True]
    assert server.execute(f"SELECT COUNT(*), SUM(c = 'y') FROM {db}.t")[0] == (20001 - 4, 1)
    target.close()


@pytest.mark.parametrize("local_infile", [True, False], ids=["load_data", "refused"])
def test_updates_keeping_their_key_replace_the_row_without_a_delete(
        server: MariaDBServer, db: str, local_infile: bool) -> None:
    """A flush's updates that keep their key load with ``LOAD DATA ...
    REPLACE`` (an update in place) instead of a DELETE of each key first.
    Deletes, a key changed by an update and inserts are applied as before;
    a server that refuses LOAD DATA LOCAL gets the DELETEs and INSERTs."""
    schema = TableSchema(db, "t", (ColumnDef("a", "bigint"), ColumnDef("b", "int"), ColumnDef("c", "varchar(20)")),
                         ("a", "b"))
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    rows = {(k, 1): "x" for k in range(1000)}
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(a, b, c)) for (a, b), c in rows.items()]))
    changes = [contract.change(Op.UPDATE, schema, before=(k, 1, "x"), after=(k, 1, f"y{k}")) for k in range(0, 500)]
    changes += [contract.change(Op.UPDATE, schema, before=(600, 1, "x"), after=(5000, 1, "moved")),
                contract.change(Op.DELETE, schema, before=(700, 1, "x")),
                contract.change(Op.DELETE, schema, before=(701, 1, "x")),
                contract.change(Op.INSERT, schema, after=(6000, 2, "new"))]
    want = {**rows, **{(k, 1): f"y{k}" for k in range(500)}, (5000, 1): "moved", (6000, 2): "new"}
    for gone in ((600, 1), (700, 1), (701, 1)):
        del want[gone]

    def handler(name: str) -> int:
        return int(server.execute(f"SHOW GLOBAL STATUS LIKE '{name}'")[0][1])

    if not local_infile:
        server.execute("SET GLOBAL local_infile = 0")
    try:
        deleted = handler("Handler_delete")
        target.apply(contract.flush(changes))
        deleted = handler("Handler_delete") - deleted
    finally:
        server.execute("SET GLOBAL local_infile = 1")
    got = {(a, b): c for a, b, c in server.execute(f"SELECT a, b, c FROM {db}.t")}
    assert got == want
    assert target.use_load_data is local_infile
    # Rows deleted by the server: the key moved and the two deletes; with
    # LOAD DATA refused, every updated key too.
    assert deleted == (3 if local_infile else 503), deleted
    target.close()


def test_the_load_file_is_streamed_and_a_failure_while_writing_it_loads_nothing(
        server: MariaDBServer, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LOAD DATA file is written into the upload piece by piece (nothing
    on disk); when writing it fails after the server already took pieces, the
    statement fails, the flush's transaction leaves the table as it was, and
    the connection carries on with the next flush."""
    from cynomys.core import columnar

    monkeypatch.setattr(columnar, "PIECE_ROWS", 100)
    schema = TableSchema(db, "t", (ColumnDef("id", "int"), ColumnDef("v", "varchar(20)")), ("id",))
    target = ColumnStoreTarget(make_config(server.url))
    target.connect()
    try:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(0, "first"))], contract.state(1)))
        rows = [contract.change(Op.INSERT, schema, after=(i, f"v{i}")) for i in range(1, 1001)]
        real, sent = ColumnStoreTarget.write_load_data, []

        def failing(out: Any, schema: TableSchema, rows: list[Any], runs: Any = None) -> None:
            class Half:
                def write(self, data: bytes) -> int:
                    sent.append(len(data))
                    if len(sent) == 5:
                        raise ValueError("a value the writer cannot write")
                    return int(out.write(data))
            real(Half(), schema, rows, runs)

        monkeypatch.setattr(ColumnStoreTarget, "write_load_data", staticmethod(failing))
        with pytest.raises(ValueError, match="cannot write"):
            target.apply(contract.flush(rows, contract.state(2)))
        assert len(sent) == 5  # four pieces went to the server before the failure
        assert target.fetch_rows(db, "t") == [(0, "first")]
        assert (st := target.applied(contract.PRODUCER)) is not None and st.seq == 1
        monkeypatch.setattr(ColumnStoreTarget, "write_load_data", staticmethod(real))
        target.apply(contract.flush(rows, contract.state(2)))
        assert sorted(target.fetch_rows(db, "t")) == [(0, "first")] + [(i, f"v{i}") for i in range(1, 1001)]
    finally:
        target.close()
