"""Producer against a real MariaDB: types, basic event types, checks, faults."""
from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid
from pathlib import Path

import pytest

from cynomys.core.config import Config, load_config
from cynomys.core.errors import PositionLostError, SourceConfigError, UnsupportedEventError
from cynomys.core.model import Op, RawTemporal
from cynomys.producer import Producer
from tests.helpers import ListSink, source_rows, wait_for, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

ALL_TYPES = [
    ("id", "int NOT NULL PRIMARY KEY"),
    ("ti", "tinyint"), ("tiu", "tinyint unsigned"), ("si", "smallint"), ("siu", "smallint unsigned"),
    ("mi", "mediumint"), ("miu", "mediumint unsigned"), ("i", "int"), ("iu", "int unsigned"),
    ("bi", "bigint"), ("biu", "bigint unsigned"), ("d65", "decimal(65,30)"), ("d10", "decimal(10,2)"),
    ("d0", "decimal(20,0) unsigned"), ("f", "float"), ("db", "double"), ("b1", "bit(1)"), ("b64", "bit(64)"),
    ("dt", "date"), ("dtm", "datetime"), ("dtm6", "datetime(6)"), ("ts6", "timestamp(6) NULL"),
    ("tm6", "time(6)"), ("tm", "time"), ("tm2", "time(2)"), ("yr", "year"), ("c", "char(10)"),
    ("vc", "varchar(255)"), ("tx", "text"), ("mtx", "mediumtext"), ("bn", "binary(4)"), ("vb", "varbinary(10)"),
    ("bl", "blob"), ("lbl", "longblob"), ("en", "enum('a','b','c d')"), ("st", "set('x','y','z')"),
    ("js", "json"), ("lat", "varchar(20) CHARACTER SET latin1"),
]

ROWS = [
    # minimums / negatives
    "(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, "
    "'-99999999999999999999999999999999999.999999999999999999999999999999', '-12345678.99', 0, "
    "-3.40282e38, -1.7976931348623157e308, b'0', b'0', '1000-01-01', '1000-01-01 00:00:00', "
    "'1000-01-01 00:00:00.000000', '1970-01-01 00:00:01.000000', '-838:59:59.000000', '-838:59:59', '-00:00:01.50', "
    "1901, '', '', '', '', X'00000000', X'', X'', X'', 'a', '', '[]', 'caf\u00e9')",
    # maximums, unicode, bytes
    "(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807, "
    "18446744073709551615, '99999999999999999999999999999999999.999999999999999999999999999999', '12345678.99', "
    "99999999999999999999, 3.14159, 2.718281828459045, b'1', b'1111111111111111111111111111111111111111111111111111111111111111', "
    "'9999-12-31', '9999-12-31 23:59:59', '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999999', "
    "'838:59:59.000000', '838:59:59', '12:34:56.78', 2155, 'abc', 'h\U0001F600 \\\\ \\' \\n \\t', "
    "REPEAT('t', 1000), REPEAT('\U0001F600', 1000), X'41000000', X'00FF00', X'DEADBEEF00', REPEAT(X'00FF', 5000), "
    "'c d', 'x,y,z', '{\"a\": [1, 2.5, \"s\"], \"b\": null}', 'caf\u00e9')",
    # zero dates, YEAR 0000, empty set vs NULL, fractional seconds
    "(3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '0.000000000000000000000000000001', '0.00', 0, 0, 0, b'0', b'101', "
    "'0000-00-00', '0000-00-00 00:00:00', '2020-00-10 10:00:00.000001', '0000-00-00 00:00:00', '00:00:00.000001', "
    "'00:00:00', '00:00:00', 0, 'x', 'y', 'z', 'w', X'00', X'00', X'00', X'00', 'b', '', 'null', '')",
    # NULLs everywhere
    "(4" + ", NULL" * (len(ALL_TYPES) - 1) + ")",
]


def _start(server: MariaDBServer) -> str:
    f, p = server.execute("SHOW MASTER STATUS")[0][:2]
    return f"{f}:{p}"


def _config(tmp_path: Path, server: MariaDBServer, db: str, **extra: dict) -> Config:
    sections = {"source": {"start": _start(server), "include_tables": [f"{db}.*"]}}
    for k, v in extra.items():
        sections.setdefault(k, {}).update(v)
    return load_config(write_config(tmp_path / "c.toml", server, **sections), env={})


def _run(cfg: Config) -> ListSink:
    sink = ListSink()
    Producer(cfg, sink, blocking=False).run()
    return sink


def test_every_mysql_type_round_trips_exactly(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "types_" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, mariadb, db)
    cols = ", ".join(f"`{n}` {t}" for n, t in ALL_TYPES)
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t ({cols}) DEFAULT CHARSET=utf8mb4")
    mariadb.execute("SET SESSION sql_mode=''", "SET SESSION time_zone='+00:00'",
                    *[f"INSERT INTO {db}.t VALUES {r}" for r in ROWS])
    sink = _run(cfg)
    inserts = [c for c in sink.changes() if c.op is Op.INSERT]
    assert len(inserts) == len(ROWS)
    schema = inserts[0].schema
    assert schema is not None and schema.key == ("id",)
    assert [c.name for c in schema.columns] == [n for n, _ in ALL_TYPES]
    types = dict(zip((c.name for c in schema.columns), (c.type for c in schema.columns)))
    assert types["biu"] == "bigint unsigned" and types["d65"] == "decimal(65,30)" and types["dtm6"] == "datetime(6)"
    assert types["en"] == "enum('a','b','c d')" and types["bn"] == "binary(4)" and types["vc"] == "varchar(255)"
    want = source_rows(mariadb, db, "t", schema.columns, "id")
    got = sorted((c.after for c in inserts), key=lambda r: r[0])  # type: ignore[index]
    for w, g in zip(want, got):
        for col, wv, gv in zip(schema.columns, w, g):
            assert (type(gv), gv) == (type(wv), wv), f"column {col.name} ({col.type})"
    row2 = dict(zip((c.name for c in schema.columns), got[1]))
    assert row2["biu"] == 18446744073709551615 and row2["bn"] == b"A\x00\x00\x00"
    assert row2["d65"] == decimal.Decimal("99999999999999999999999999999999999.999999999999999999999999999999")
    assert row2["ts6"] == dt.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=dt.timezone.utc)
    row3 = dict(zip((c.name for c in schema.columns), got[2]))
    assert row3["dt"] == RawTemporal("0000-00-00") and row3["yr"] == 0 and row3["st"] == ""
    assert row3["dtm6"] == RawTemporal("2020-00-10 10:00:00.000001")
    row1 = dict(zip((c.name for c in schema.columns), got[0]))
    assert row1["tm6"] == -dt.timedelta(hours=838, minutes=59, seconds=59) and row1["lat"] == "café"
    assert row1["tm2"] == -dt.timedelta(seconds=1, microseconds=500000)
    assert all(v is None for v in got[3][1:])


def test_basic_types_fold_and_checkpoint(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "basic_" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, mariadb, db, producer={"batch_max_events": 1000, "batch_max_delay_ms": 60000})
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id int primary key, v varchar(10))",
                    f"CREATE TABLE {db}.n (a int, b int)")
    mariadb.execute(f"INSERT INTO {db}.t VALUES (1,'a'),(2,'b'),(3,'c')", f"UPDATE {db}.t SET v='z' WHERE id=1",
                    f"DELETE FROM {db}.t WHERE id=2", f"UPDATE {db}.t SET id=30 WHERE id=3",
                    f"INSERT INTO {db}.n VALUES (1,1),(1,1)", f"DELETE FROM {db}.n LIMIT 1",
                    f"ALTER TABLE {db}.t ADD COLUMN w int", f"UPDATE {db}.t SET w=7")
    sink = _run(cfg)
    ops = [(c.op, c.table, c.before, c.after) for c in sink.changes()]
    assert (Op.DDL, "", None, None) in [(o, t, b, a) for o, t, b, a in ops if o is Op.DDL]
    rows = [(o, t, b, a) for o, t, b, a in ops if o is not Op.DDL]
    # Net changes of the first batch (each statement its own transaction, so
    # the producer's fold stays exact for an applier holding a prefix of them:
    # reducer/fold.py PRODUCER_RULES): 1 inserted then updated (an update of the
    # inserted image), 2 inserted then deleted (a delete), 3 inserted then moved
    # to 30 (a delete of 3, an insert of 30); keyless rows in order.
    assert (Op.UPDATE, "t", (1, "a"), (1, "z")) in rows and (Op.INSERT, "t", None, (30, "c")) in rows
    assert (Op.DELETE, "t", (2, "b"), None) in rows and (Op.DELETE, "t", (3, "c"), None) in rows
    assert not any(r[3] and r[3][0] == 2 for r in rows if r[1] == "t")
    assert [r[0] for r in rows if r[1] == "n"] == [Op.INSERT, Op.INSERT, Op.DELETE]
    assert (Op.UPDATE, "t", (1, "z", None), (1, "z", 7)) in rows
    ddl = [c.sql for c in sink.changes() if c.op is Op.DDL]
    assert ddl == [f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id int primary key, v varchar(10))",
                   f"CREATE TABLE {db}.n (a int, b int)", f"ALTER TABLE {db}.t ADD COLUMN w int"]
    last = sink.batches[-1][1]
    assert last.complete
    assert mariadb.execute("SHOW MASTER STATUS")[0][1] == last.end.pos
    p = Producer(cfg, ListSink(), blocking=False)
    assert p.state.checkpoint == last.end  # resumes exactly after the last shipped transaction


def test_restart_resumes_without_loss_or_duplicates(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "resume_" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, mariadb, db)
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id int primary key)")
    mariadb.execute(*[f"INSERT INTO {db}.t VALUES ({i})" for i in range(50)])
    first = _run(cfg)
    mariadb.execute(*[f"INSERT INTO {db}.t VALUES ({i})" for i in range(50, 80)])
    second = ListSink()
    second.batches = [(s, b) for s, b in first.batches]  # the transport remembers what it accepted
    n_before = len(second.batches)
    Producer(cfg, second, blocking=False).run()
    new = [c.after[0] for _, b in second.batches[n_before:] for c in b.changes if c.after]  # type: ignore[index]
    old = [c.after[0] for _, b in first.batches for c in b.changes if c.after]  # type: ignore[index]
    assert sorted(old) == list(range(50)) and sorted(new) == list(range(50, 80))
    assert [s for s, _ in second.batches] == list(range(1, len(second.batches) + 1))  # sequence continues


def test_table_filters(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "filt_" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, mariadb, db, source={"exclude_tables": [f"{db}.secret*"]})
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.keep (id int primary key)",
                    f"CREATE TABLE {db}.secret_1 (id int primary key)", "CREATE DATABASE IF NOT EXISTS other_db",
                    "CREATE TABLE IF NOT EXISTS other_db.t (id int primary key)")
    mariadb.execute(f"INSERT INTO {db}.keep VALUES (1)", f"INSERT INTO {db}.secret_1 VALUES (1)",
                    "REPLACE INTO other_db.t VALUES (1)")
    tables = {c.table for c in _run(cfg).changes() if c.op is not Op.DDL}
    assert tables == {"keep"}


def test_statement_format_dml_stops_the_producer(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "stmt_" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, mariadb, db)
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id int primary key)")
    mariadb.execute("SET SESSION binlog_format=STATEMENT", f"INSERT INTO {db}.t VALUES (1)")
    with pytest.raises(UnsupportedEventError, match="binlog_format=ROW") as err:
        _run(cfg)
    assert f"INSERT INTO {db}.t" in str(err.value)


def test_source_settings_are_checked(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    fresh_mariadb.execute("SET GLOBAL binlog_row_metadata=MINIMAL", "SET GLOBAL binlog_row_image=MINIMAL")
    cfg = _config(tmp_path, fresh_mariadb, "x")
    with pytest.raises(SourceConfigError) as err:
        _run(cfg)
    msg = str(err.value)
    assert "binlog_row_metadata=MINIMAL (need FULL)" in msg and "SET GLOBAL binlog_row_image=FULL" in msg


def test_purged_binlog_is_a_terminal_error_never_a_skip(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    srv = fresh_mariadb
    srv.execute("CREATE DATABASE p", "CREATE TABLE p.t (id int primary key)", "INSERT INTO p.t VALUES (1)")
    cfg = _config(tmp_path, srv, "p")
    _run(cfg)  # checkpoint in mysql-bin.000001
    srv.execute("FLUSH BINARY LOGS", "INSERT INTO p.t VALUES (2)", "FLUSH BINARY LOGS")
    last = srv.execute("SHOW MASTER STATUS")[0][0]
    # MariaDB keeps a binlog until its binlog checkpoint is written (crash
    # recovery needs it), so PURGE may leave it there for a moment.
    wait_for(lambda: srv.execute(f"PURGE BINARY LOGS TO '{last}'", "SHOW BINARY LOGS")[0][0] == last,
             timeout=30, what="the purge of the old binlogs")
    with pytest.raises(PositionLostError) as err:
        _run(cfg)
    msg = str(err.value)
    assert "mysql-bin.000001" in msg and "re-snapshot" in msg


def test_gtid_is_carried(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "gtid_" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, mariadb, db)
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id int primary key)", f"INSERT INTO {db}.t VALUES (1)")
    gtid = mariadb.execute("SELECT @@gtid_binlog_pos")[0][0]
    sink = _run(cfg)
    ins = [c for c in sink.changes() if c.op is Op.INSERT][0]
    assert ins.tid == gtid and sink.batches[-1][1].end.pos > ins.txn.pos
    assert dataclasses.asdict(ins.txn)["file"].startswith("mysql-bin.")


def test_resume_by_mariadb_gtid(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "bygtid_" + uuid.uuid4().hex[:8]
    cfg = _config(tmp_path, mariadb, db, source={"use_gtid": True, "start": "current"})
    _run(cfg)  # takes the current GTID position as its checkpoint
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id int primary key)",
                    *[f"INSERT INTO {db}.t VALUES ({i})" for i in range(5)])
    first = _run(cfg)
    state = Producer(cfg, ListSink(), blocking=False).state
    assert state.checkpoint is not None and state.checkpoint.gtid == mariadb.execute("SELECT @@gtid_binlog_pos")[0][0]
    # Resume by GTID alone: a file name from "another server" must not matter.
    from cynomys.core.checkpoint import read_json, write_json_atomic
    path = tmp_path / "producer-state" / "producer.json"
    data = read_json(path)
    assert data is not None
    data["checkpoint"]["file"] = "other-bin.000042"
    write_json_atomic(path, data)
    mariadb.execute(*[f"INSERT INTO {db}.t VALUES ({i})" for i in range(5, 9)])
    second = ListSink()
    second.batches = list(first.batches)
    Producer(cfg, second, blocking=False).run()
    new = [c.after[0] for _, b in second.batches[len(first.batches):] for c in b.changes if c.op is Op.INSERT]  # type: ignore[index]
    assert sorted(new) == [5, 6, 7, 8]
