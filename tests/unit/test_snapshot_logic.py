"""Snapshot logic without a server: chunk queries, key persistence, type
normalisation, value conversion, GTID sets, window key tracking, job state."""
from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import replace
from pathlib import Path

import pytest

from cynomys.core.columnar import ManyRows
from cynomys.core.gtid import GtidError, GtidSet
from cynomys.core.model import Change, ColumnDef, Op, Position, RawTemporal, TableSchema
from cynomys.snapshot.chunker import build_chunk_query, decode_key, encode_key, key_condition
from cynomys.snapshot.columns import normalize_type, row_converter, table_info, whole_column_indexes
from cynomys.snapshot.state import DONE, FAILED, FINISHED, QUEUED, SnapshotJob, SnapshotStore, TableProgress
from cynomys.snapshot.watermark import read_watermark, same_statement, watermark_ddl
from cynomys.snapshot.window import ChunkWindow, GtidMarks, python_ordered

COLS = (ColumnDef("a", "int"), ColumnDef("b", "varchar(10)"), ColumnDef("v", "float"))


# -- chunk queries -------------------------------------------------------------
def test_first_chunk_has_no_key_condition() -> None:
    q = build_chunk_query("db", "t", COLS, ("a",), None, 1000)
    assert q.sql == "SELECT `a`, `b`, CAST(`v` AS DOUBLE) FROM `db`.`t` ORDER BY `a` LIMIT 1000"
    assert q.params == ()


def test_single_column_key_is_a_plain_range() -> None:
    q = build_chunk_query("db", "t", COLS, ("a",), (41,), 500)
    assert q.sql.endswith("FROM `db`.`t` WHERE `a` > %s ORDER BY `a` LIMIT 500")
    assert q.params == (41,)


def test_composite_key_row_constructor_plus_range_disjunction() -> None:
    cond, params = key_condition(("a", "b", "c"), (1, "x", 9))
    assert cond == ("(`a`, `b`, `c`) > (%s, %s, %s) AND "
                    "(`a` > %s OR (`a` = %s AND `b` > %s) OR (`a` = %s AND `b` = %s AND `c` > %s))")
    assert params == (1, "x", 9, 1, 1, "x", 1, "x", 9)
    assert cond.count("%s") == len(params)


def test_where_clause_and_odd_names_are_escaped_for_the_driver() -> None:
    q = build_chunk_query("my%db", "t`x", COLS, ("a", "b"), (1, "q"), 10, where="b LIKE 'a%'")
    assert "FROM `my%%db`.`t``x`" in q.sql
    assert "AND (b LIKE 'a%%')" in q.sql
    assert q.sql.endswith("ORDER BY `a`, `b` LIMIT 10")
    # What the driver sends after formatting: percent signs single again.
    assert (q.sql % tuple("?" * len(q.params))).count("'a%'") == 1


def test_keyless_table_is_read_whole() -> None:
    q = build_chunk_query("db", "t", COLS, (), None, None, where="a < 3")
    assert q.sql == "SELECT `a`, `b`, CAST(`v` AS DOUBLE) FROM `db`.`t` WHERE (a < 3)"
    with pytest.raises(ValueError):
        build_chunk_query("db", "t", COLS, (), None, 100)


def test_last_keys_survive_json_exactly() -> None:
    key = (2**64 - 1, -5, "x\u00e9", b"\x00\xff", decimal.Decimal("1.500"), dt.datetime(2020, 1, 2, 3, 4, 5, 6),
           dt.date(1000, 1, 1), -dt.timedelta(hours=838, microseconds=1), 0.1, "0000-00-00")
    back = decode_key(encode_key(key))
    assert back == key
    assert [type(v) for v in back] == [type(v) for v in key]  # type: ignore[union-attr]
    assert str(back[4]) == "1.500"  # type: ignore[index]
    assert decode_key(None) is None


# -- schema and values -----------------------------------------------------------
@pytest.mark.parametrize("column_type, want", [
    ("int(11)", "int"), ("bigint(20) unsigned", "bigint unsigned"), ("int(5) unsigned zerofill", "int unsigned"),
    ("tinyint(1)", "tinyint"), ("decimal(10,2) unsigned zerofill", "decimal(10,2) unsigned"),
    ("decimal(65,30)", "decimal(65,30)"), ("float(7,3)", "float"), ("double", "double"), ("year(4)", "year"),
    ("datetime(6)", "datetime(6)"), ("timestamp", "timestamp"), ("bit(64)", "bit(64)"), ("char(10)", "char(10)"),
    ("varbinary(10)", "varbinary(10)"), ("longtext", "longtext"), ("point", "geometry"),
    ("enum('a','B','c d')", "enum('a','B','c d')"), ("set('X','y')", "set('X','y')"),
])
def test_type_text_matches_the_row_decoder(column_type: str, want: str) -> None:
    assert normalize_type(column_type) == want


def test_table_info_keeps_order_and_key() -> None:
    info = table_info("d", "t", [("id", "int(11)"), ("k", "varchar(5)"), ("x", "double")], ["k", "id"], "InnoDB", 7)
    assert info.schema == TableSchema("d", "t", (ColumnDef("id", "int"), ColumnDef("k", "varchar(5)"),
                                                 ColumnDef("x", "double")), ("k", "id"))


def test_only_whole_column_btree_indexes_are_kept_for_a_target() -> None:
    # information_schema.STATISTICS rows: (INDEX_NAME, COLUMN_NAME, has a SUB_PART, INDEX_TYPE)
    rows = [("u_ab", "a", False, "BTREE"), ("u_ab", "b", False, "BTREE"),
            ("by_c", "c", False, "BTREE"),
            ("pre", "c", False, "BTREE"), ("pre", "d", True, "BTREE"),       # a prefix part
            ("expr", None, False, "BTREE"),                                  # MySQL 8 functional
            ("ft", "d", False, "FULLTEXT"), ("geo", "g", False, "SPATIAL"),
            ("again", "c", False, "BTREE"), ("h", "e", False, "HASH")]
    assert whole_column_indexes(rows) == (("a", "b"), ("c",), ("e",))
    info = table_info("d", "t", [("c", "int(11)")], [], "InnoDB", 7, indexes=(("c",),))
    assert info.schema.indexes == (("c",),)
    assert info.schema == TableSchema("d", "t", (ColumnDef("c", "int"),), ())  # a hint, not the shape


def test_types_that_travel_as_their_binlog_bytes() -> None:
    """MariaDB's INET4/INET6/UUID (TABLE_MAP: BINARY(4)/BINARY(16)) and MySQL
    9's VECTOR(n): the type and value the binlog decoder gives, from the
    text a SELECT returns."""
    import uuid

    cols = [("a4", "inet4"), ("a6", "inet6"), ("u", "uuid"), ("v", "vector(3)")]
    info = table_info("d", "t", cols, [], "InnoDB", 0)
    assert [c.type for c in info.schema.columns] == ["binary(4)", "binary(16)", "binary(16)", "varbinary(12)"]
    row = row_converter(info.schema.columns)(("192.0.2.1", "2001:db8::ff00:42:8329",
                                              "123e4567-e89b-12d3-a456-426614174000", b"\x00\x00\x80?" * 3))
    assert row == (bytes([192, 0, 2, 1]), bytes.fromhex("20010db8000000000000ff0000428329"),
                   uuid.UUID("123e4567-e89b-12d3-a456-426614174000").bytes, b"\x00\x00\x80?" * 3)
    assert row_converter(info.schema.columns)(("0.0.0.0", "::ffff:192.0.2.1", "00000000-0000-0000-0000-000000000000",
                                               None))[:2] == (bytes(4), bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 1]))


def test_driver_values_are_converted_to_the_model_domain() -> None:
    cols = (ColumnDef("ts", "timestamp(6)"), ColumnDef("d", "date"), ColumnDef("b", "bit(5)"),
            ColumnDef("f", "float"), ColumnDef("bn", "binary(2)"), ColumnDef("n", "int"), ColumnDef("z", "datetime"))
    conv = row_converter(cols)
    row = conv((dt.datetime(2020, 1, 1, 12), "0000-00-00", b"\x05", 0.10000000149011612, "ab", 3, None))
    assert row == (dt.datetime(2020, 1, 1, 12, tzinfo=dt.timezone.utc), RawTemporal("0000-00-00"), 5,
                   0.10000000149011612, b"ab", 3, None)
    assert type(row[1]) is RawTemporal
    assert row_converter((ColumnDef("n", "int"),))([4]) == (4,)


# -- GTID sets -----------------------------------------------------------------------
def test_mariadb_gtid_positions() -> None:
    s = GtidSet.parse_mariadb("0-1-100,2-7-5")
    assert s.contains("0-1-100") and s.contains("0-9-3") and s.contains("2-1-5")
    assert not s.contains("0-1-101") and not s.contains("1-1-1") and not s.contains("mysql-bin.000001:4")
    assert not GtidSet.parse_mariadb("").contains("0-1-1")
    with pytest.raises(GtidError):
        GtidSet.parse_mariadb("0-1")


def test_mysql_gtid_sets_with_intervals_and_tags() -> None:
    u1, u2 = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "2174b383-5441-11e8-b90a-c80aa9429562"
    s = GtidSet.parse_mysql(f"{u1.upper()}:1-5:11-18,\n{u2}:1-3:tg:7-9")
    assert s.contains(f"{u1}:1") and s.contains(f"{u1}:5") and s.contains(f"{u1}:11")
    assert not s.contains(f"{u1}:6") and not s.contains(f"{u1}:19")
    assert s.contains(f"{u2}:3") and not s.contains(f"{u2}:7")
    assert s.contains(f"{u2}:tg:8") and not s.contains(f"{u2}:tg:3")


def test_gtid_watermarks_classify_transactions() -> None:
    marks = GtidMarks(GtidSet.parse_mariadb("0-1-10"), GtidSet.parse_mariadb("0-1-14"),
                      high_end=Position("b.000001", 900), snapshot_pos=Position("b.000001", 500))
    assert marks.before_window("0-1-9", Position("b.000001", 400))
    # In the low set but after the select's snapshot: not visible to it, so in the window.
    assert not marks.before_window("0-1-10", Position("b.000001", 500))
    assert not marks.before_window("0-1-12", Position("b.000001", 600))
    assert not marks.past_high("0-1-14") and marks.past_high("0-1-15") and not marks.past_high("")
    assert marks.reached(Position("b.000001", 900)) and marks.reached(Position("b.000002", 4))
    assert not marks.reached(Position("b.000001", 899))
    mysql = GtidMarks(GtidSet.parse_mysql("u:1-10"), GtidSet.parse_mysql("u:1-12"), Position("b.1", 4))
    assert mysql.before_window("u:10", Position("b.9", 4)) and not mysql.before_window("u:11", Position("b.1", 4))


# -- the window ---------------------------------------------------------------------
SCHEMA = TableSchema("d", "t", (ColumnDef("id", "int"), ColumnDef("v", "int")), ("id",))
P = Position("b.000001", 4)


def _change(op: Op, before: tuple[int, int] | None, after: tuple[int, int] | None) -> Change:
    return Change(op, "d", "t", "0-1-1", P, 0, SCHEMA, before, after)


def test_window_drops_every_key_the_log_changes_in_it() -> None:
    w = ChunkWindow.of("d", "t", (0,), [(1, 10), (2, 20), (3, 30), (4, 40), (5, 50)])
    w.on_change(_change(Op.UPDATE, (2, 20), (2, 21)), in_window=True)
    w.on_change(_change(Op.DELETE, (3, 30), None), in_window=True)
    w.on_change(_change(Op.UPDATE, (4, 40), (9, 40)), in_window=True)   # key moved: both keys out
    w.on_change(_change(Op.INSERT, None, (7, 70)), in_window=True)      # not in the chunk: nothing to drop
    w.on_change(_change(Op.UPDATE, (5, 50), (5, 51)), in_window=False)  # before the window: kept
    assert w.remaining() == [(1, 10), (5, 50)]
    assert (w.selected, w.dropped) == (5, 3)


@pytest.mark.parametrize("ordered", [False, True])
def test_window_drops_the_same_keys_with_or_without_its_bounds(ordered: bool) -> None:
    """With numeric keys the first and last key of the chunk turn away the
    log's keys outside them without building the index; the rows that
    remain are the same either way (a composite key, changes on both sides,
    at both ends and inside)."""
    rows = [(k, n) for k in (10, 11, 12) for n in (1, 2, 3)]
    w = ChunkWindow.of("d", "t", (0, 1), rows, ordered=ordered)
    for key in [(9, 9), (13, 0), (10, 0), (12, 4), (-5, 1), (2**70, 1)]:  # outside, or between rows
        w.drop_key(key)
    assert (w._index is None) is ordered and w.dropped == 0
    for key in [(10, 1), (11, 2), (12, 3), (12, 4)]:
        w.drop_key(key)
    assert w.remaining() == [r for r in rows if r not in {(10, 1), (11, 2), (12, 3)}] and w.dropped == 3


def test_only_numeric_keys_are_ordered_as_python_orders_them() -> None:
    def schema(*types: str) -> TableSchema:
        return TableSchema("d", "t", tuple(ColumnDef(f"c{i}", t) for i, t in enumerate(types)),
                           tuple(f"c{i}" for i in range(len(types))))

    assert python_ordered(schema("bigint unsigned", "int(11)")) and python_ordered(schema("decimal(10,2)"))
    assert not python_ordered(schema("int", "varchar(10)"))  # collation order is not Python's
    assert not python_ordered(schema("date"))  # zero dates come as text
    assert not python_ordered(TableSchema("d", "t", (ColumnDef("a", "int"),), ()))


def test_keyless_window_is_dirty_on_any_change() -> None:
    w = ChunkWindow.of("d", "t", (), [(1, 1), (1, 1)])
    w.on_change(_change(Op.INSERT, None, (2, 2)), in_window=False)
    assert not w.dirty and w.remaining() == [(1, 1), (1, 1)]
    w.on_change(_change(Op.INSERT, None, (2, 2)), in_window=True)
    assert w.dirty


# -- watermark table and job state ----------------------------------------------------
def test_watermark_rows_and_ddl_are_recognised() -> None:
    schema = TableSchema("cynomys_meta", "watermark", (ColumnDef("producer_id", "varchar(64)"),
                         ColumnDef("uuid", "char(36)"), ColumnDef("kind", "varchar(4)"), ColumnDef("written", "datetime(6)")),
                         ("producer_id",))
    c = Change(Op.UPDATE, "cynomys_meta", "watermark", "0-1-3", P, 0, schema, ("p1", "u0", "low", None),
               ("p1", "u1", "high", None))
    wm = read_watermark(c)
    assert wm is not None and (wm.uuid, wm.kind, wm.producer_id) == ("u1", "high", "p1")
    create_db, create_table = watermark_ddl("cynomys_meta")
    assert create_db == "CREATE DATABASE IF NOT EXISTS `cynomys_meta`"
    assert same_statement(" ".join(create_table.split(" ")).replace(", ", ",\n  "), create_table)


def test_jobs_round_trip_and_settle(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    job = SnapshotJob("j1", "request", QUEUED, (TableProgress("d.a"), TableProgress("d.b", estimate=3)), "id < 5")
    store.save([job], live={"table": "d.a"})
    assert store.load() == [job] and store.load_live() == {"table": "d.a"}
    job = job.with_table(TableProgress("d.a", status=DONE, last_key=encode_key((5,)), rows=5))
    assert job.settle() is job  # d.b still pending
    job = job.with_table(TableProgress("d.b", status=FAILED, error="gone")).settle()
    assert job.status == FAILED and "d.b: gone" in job.error
    ok = SnapshotJob("j2", "request", QUEUED, (TableProgress("d.a", status=DONE),)).settle()
    assert ok.status == FINISHED
    r = store.submit({"action": "cancel", "id": "j1"})
    assert [(p, d["action"]) for p, d in store.pending_requests()] == [(r, "cancel")]



def test_status_counts_the_rows_of_a_keyless_read_still_streaming(tmp_path: Path) -> None:
    """A keyless table is read whole: its part counts rows only when the
    read ends, so `cynomys status` adds the live read's rows so far."""
    import time

    from cynomys.snapshot.state import KEYLESS_PHASE, RUNNING, status_report

    store = SnapshotStore(tmp_path)
    job = SnapshotJob("initial", "initial", RUNNING, (TableProgress("d.keyed", status=DONE, scanned=1000),
                                                      TableProgress("d.bag", estimate=9000)),
                      started=time.time() - 10)
    store.save([job], live={"job": "initial", "table": "d.bag", "phase": KEYLESS_PHASE, "selected": 4000})
    got = status_report(tmp_path)["jobs"]["initial"]
    assert got["rows_read"] == 5000 and got["rows_estimate"] == 10000 and got["progress"] == "50.0%"
    assert got["current_table"] == "d.bag" and 400 < got["rows_per_s"] < 600 and 8 < got["eta_s"] < 12
    # Once over, the part counts its rows itself: the live record is not added again.
    done = SnapshotJob("initial", "initial", FINISHED, (TableProgress("d.keyed", status=DONE, scanned=1000),
                                                        TableProgress("d.bag", status=DONE, scanned=9000)),
                       started=time.time() - 20, finished=time.time())
    store.save([done], live={"job": "initial", "table": "d.bag", "phase": KEYLESS_PHASE, "selected": 9000})
    assert status_report(tmp_path)["jobs"]["initial"]["rows_read"] == 10000


# -- the coordinator's lifecycle (no server: the chunk in flight is put in place) -----
WM_SCHEMA = TableSchema("cynomys_meta", "watermark", (ColumnDef("producer_id", "varchar(64)"),
                        ColumnDef("uuid", "char(36)"), ColumnDef("kind", "varchar(4)")), ("producer_id",))


def _mark(uuid: str) -> Change:
    return Change(Op.UPDATE, "cynomys_meta", "watermark", "0-1-2", P, 0, WM_SCHEMA, ("p1", "x", "low"),
                  ("p1", uuid, "low"))


class _Readers:
    """Stands for the reader threads (snapshot/readers.py): answers are put
    in by the test."""

    def __init__(self) -> None:
        self.answers: list[object] = []
        self.busy = 0
        self.requests: list[object] = []

    def submit(self, req: object) -> None:
        self.busy += 1
        self.requests.append(req)

    def collect(self) -> list[object]:
        out, self.answers = self.answers, []
        self.busy -= len(out)
        return out

    @property
    def results(self) -> object:
        import queue
        return queue.Queue()

    def close(self) -> None:
        pass


def test_a_chunk_leaves_at_a_boundary_and_is_recorded_once_the_checkpoint_passes(tmp_path: Path) -> None:
    """DBLog through the shared lifecycle (snapshot/task.py), a chunk read by
    a reader thread (snapshot/readers.py): its window is watched before the
    read is queued, so a key changed inside it before the rows come is
    dropped from them when they come; watermark events open and close the
    window (and are never shipped); the rows leave only at a transaction
    boundary, as one ManyRows and a Commit at that boundary; the table
    records the chunk only when a checkpoint at or past it is reported."""
    from cynomys.core.config import Config, ProducerConfig, SnapshotConfig
    from cynomys.parser.txn import Commit
    from cynomys.snapshot.coordinator import SnapshotCoordinator
    from cynomys.snapshot.readers import ReadResult
    from cynomys.snapshot.state import RUNNING

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)), snapshot=SnapshotConfig(chunk_size=3))
    co = SnapshotCoordinator(cfg, start=P, first_start=False)
    co.jobs = [SnapshotJob("j", "request", RUNNING, (TableProgress("d.t"),))]
    readers = _Readers()
    co._pool = readers  # type: ignore[assignment]
    info = table_info("d", "t", [("id", "int"), ("v", "int")], ["id"], "InnoDB", 3)
    co._describe = lambda *a: info  # type: ignore[method-assign]
    co._connection = lambda: type("C", (), {"describe": lambda self, d, t: info})()  # type: ignore[method-assign, assignment]
    assert co.poll(at_boundary=True) == [] and len(readers.requests) == 2  # two readers: two chunks queued
    first, second = readers.requests
    low, high = first.low, first.high  # type: ignore[attr-defined]
    before = _change(Op.UPDATE, (1, 10), (1, 11))
    assert co.observe(before) is before                  # before the low watermark: the select saw it
    assert co.observe(_mark(low)) is None                # a watermark: never shipped
    co.observe(_change(Op.DELETE, (2, 20), None))        # inside the window, before the rows came: dropped
    readers.answers.append(ReadResult(first.flight, 0, None, ((1, 10), (2, 20), (3, 30)), (3,), False))  # type: ignore[attr-defined]
    readers.answers.append(ReadResult(second.flight))    # type: ignore[attr-defined]  # nothing left after it
    assert co.poll(at_boundary=True) == [] and co.wait_s() > 0
    co.observe(_mark(high))
    q = Position("b.000001", 900)
    co.observe(Commit(P, q, 7, "0-1-5"))
    assert co.wait_s() == 0.0 and co.poll(at_boundary=False) == []  # inside a transaction: wait
    out = co.poll(at_boundary=True)
    # One ManyRows for the chunk (core/columnar.py), a READ record per row on the wire.
    assert [(c.op, c.images) for c in out if isinstance(c, ManyRows)] == [(Op.READ, ((1, 10), (3, 30)))]
    assert out[-1] == Commit(q, q, 7, "")
    co.checkpointed(P)                                   # before the rows: not theirs
    assert co.jobs[0].tables[0].chunks == 0
    co.checkpointed(q)
    t = SnapshotStore(tmp_path).load()[0].tables[0]
    assert (t.status, t.last_key, t.chunks, t.rows, t.scanned, t.dropped) == ("pending", encode_key((3,)), 1, 2, 3, 1)
    # Not the table's last chunk: the next ones are queued (the readers' plan goes on after key 3).
    assert co.poll(at_boundary=True) == [] and len(readers.requests) == 4


def test_a_table_renamed_in_waits_for_its_rename_then_is_cleared_before_its_first_chunk(tmp_path: Path) -> None:
    """A snapshot asked for by a RENAME (origin 'rename') does not start
    before the log is past the statement (a producer killed after asking
    resumes before it: rows read at once went into the target's table of the
    old name, which the RENAME then moved away); then, at a boundary and
    before any chunk is queued, its target table is cleared (a keyed table
    renamed out and back kept the rows deleted meanwhile)."""
    from cynomys.core.config import Config, ProducerConfig, SnapshotConfig
    from cynomys.parser.txn import Commit
    from cynomys.snapshot.coordinator import SnapshotCoordinator
    from cynomys.snapshot.state import QUEUED

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)), snapshot=SnapshotConfig(chunk_size=3))
    co = SnapshotCoordinator(cfg, start=P, first_start=False)
    co.jobs = [SnapshotJob("rename-0-1-9", "rename", QUEUED, (TableProgress("d.t"),), not_before="b.000001:500")]
    readers = _Readers()
    co._pool = readers  # type: ignore[assignment]
    info = table_info("d", "t", [("id", "int"), ("v", "int")], ["id"], "InnoDB", 3)
    co._connection = lambda: type("C", (), {"describe": lambda self, d, t: info})()  # type: ignore[method-assign, assignment]
    assert co.poll(at_boundary=True) == [] and readers.requests == []     # the log is before the RENAME
    co.observe(Commit(P, Position("b.000001", 500), 7, "0-1-8"))
    assert co.poll(at_boundary=True) == [] and readers.requests == []     # at its start: not past it yet
    q = Position("b.000001", 640)
    co.observe(Commit(Position("b.000001", 500), q, 8, "0-1-9"))         # the RENAME
    assert co.poll(at_boundary=False) == [] and readers.requests == []    # not at a boundary: nothing yet
    out = co.poll(at_boundary=True)
    assert [(type(c).__name__, getattr(c, "sql", None)) for c in out] == [
        ("Change", "TRUNCATE TABLE `d`.`t`"), ("Commit", None)]
    assert out[-1] == Commit(q, q, 8, "") and readers.requests == []
    assert co.poll(at_boundary=True) == [] and len(readers.requests) == 2  # now the chunks
    # A log of another server (after a failover) cannot be compared: not held.
    other = SnapshotCoordinator(cfg, start=Position("other-bin.000003", 4), first_start=False)
    job = SnapshotJob("r", "rename", QUEUED, (TableProgress("d.t"),), not_before="b.000001:500")
    assert other._past_its_statement(job) and not co._past_its_statement(replace(job, not_before="b.000002:4"))


def test_a_rename_job_with_a_mariadb_gtid_waits_for_that_gtid_whatever_the_files(tmp_path: Path) -> None:
    """With its statement's MariaDB GTID, a rename's job is held until the
    log has passed that GTID (a failover keeps GTIDs, not file names): not
    held when the producer starts past it, held on another server's files
    until the GTID comes."""
    from cynomys.core.config import Config, ProducerConfig
    from cynomys.parser.txn import Commit
    from cynomys.snapshot.coordinator import SnapshotCoordinator
    from cynomys.snapshot.state import QUEUED

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)))
    job = SnapshotJob("r", "rename", QUEUED, (TableProgress("d.t"),), not_before="b.000007:500",
                      not_before_gtid="0-1-9")
    past = SnapshotCoordinator(cfg, start=Position("b.000001", 4, "0-2-12,1-1-3"), first_start=False)
    assert past._past_its_statement(job)                  # started past 0-?-9 in domain 0
    co = SnapshotCoordinator(cfg, start=Position("other-bin.000002", 4, "0-1-7"), first_start=False)
    assert not co._past_its_statement(job)
    co.observe(Commit(Position("other-bin.000002", 4), Position("other-bin.000002", 90), 1, "0-1-8"))
    co.observe(Commit(Position("other-bin.000002", 90), Position("other-bin.000002", 190), 1, "1-1-40"))
    assert not co._past_its_statement(job)                # another domain's GTID says nothing
    co.observe(Commit(Position("other-bin.000002", 190), Position("other-bin.000002", 290), 1, "0-2-9"))
    assert co._past_its_statement(job)                    # after a failover the server id differs, the seq goes on


def test_the_watermark_table_reaches_the_tasks_whatever_the_filter_says(tmp_path: Path) -> None:
    from cynomys.core.config import Config, ProducerConfig, SnapshotConfig
    from cynomys.parser.stream import TableFilter
    from cynomys.snapshot.coordinator import SnapshotCoordinator

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)))
    co = SnapshotCoordinator(cfg, start=P, first_start=False)
    f = co.table_filter(TableFilter(["app.*"], []))
    assert f("cynomys_meta", "watermark") and f("app", "t") and not f("other", "t")
    assert co.table_filter(f) is f  # a second task does not wrap it again
    read_only = Config(producer=ProducerConfig(state_dir=str(tmp_path)), snapshot=SnapshotConfig(read_only=True))
    base = TableFilter(["app.*"], [])
    assert SnapshotCoordinator(read_only, start=P, first_start=False).table_filter(base) is base


def test_progress_has_a_rate_and_an_eta_from_the_first_chunk() -> None:
    from cynomys.snapshot.state import RUNNING

    job = SnapshotJob("j", "request", RUNNING, (TableProgress("d.a", scanned=3000, estimate=10_000),
                                                 TableProgress("d.b", scanned=0, estimate=2_000)), started=100.0)
    p = job.progress(now=110.0)
    assert (p.done, p.total, p.rows_per_s, p.eta_s) == (3000, 12_000, 300.0, 30.0)
    assert "3000/12000 rows (25.0%), 300 rows/s, ETA 0m30s" == p.describe()
    # An estimate below what was read: the total follows the rows read.
    low = SnapshotJob("j", "request", RUNNING, (TableProgress("d.a", scanned=500, estimate=100),), started=100.0)
    assert low.progress(now=101.0).total == 500
    # Not started yet: no rate, no ETA; over: no ETA.
    assert SnapshotJob("j", "request", QUEUED, (TableProgress("d.a", estimate=9),)).progress(now=5.0).eta_s is None
    done = SnapshotJob("j", "request", FINISHED, (TableProgress("d.a", scanned=9, estimate=9),), started=1.0,
                       finished=4.0)
    assert (done.progress(now=50.0).rows_per_s, done.progress(now=50.0).eta_s) == (3.0, None)


def test_a_chunked_task_does_not_wait_for_the_log_when_its_next_chunk_is_due(tmp_path: Path) -> None:
    # Nothing in flight and a chunk to read: the producer must not block on
    # a quiet log for half a second before starting it (verify ran at 8.5k
    # rows/s through the daemons for that); with nothing to read it may.
    from cynomys.core.config import Config, ProducerConfig
    from cynomys.snapshot.coordinator import SnapshotCoordinator
    from cynomys.snapshot.state import RUNNING
    from cynomys.snapshot.task import POLL_S
    from cynomys.verify.coordinator import VerifyCoordinator
    from cynomys.verify.state import VerifyJob, VerifyTask

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)))
    ver = VerifyCoordinator(cfg, start=P)
    assert ver.wait_s() == POLL_S
    ver._set_jobs([VerifyJob("v", RUNNING, (VerifyTask("d.t"),))])
    assert ver.wait_s() == 0.0
    snap = SnapshotCoordinator(cfg, start=P, first_start=False)
    assert snap.wait_s() == POLL_S
    snap._set_jobs([SnapshotJob("j", "request", RUNNING, (TableProgress("d.t"),))])
    assert snap.wait_s() == 0.0
