"""`cynomys verify`, pure parts: the canonical checksum, key ranges (in byte
order, whatever a collation says), the CHECKSUM/PURGE records on the wire
(schema v2) and in the fold, the coordinator's windows and streams (a fake
cursor), repairs that must fit an envelope, and refused repairs."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import random

import pytest

from cynomys.core import compiled
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.reducer.fold import fold
from cynomys.schemas import codec
from cynomys.verify.checksum import MASK, Checksum, KeyRange, RowHasher, range_checksum

COLS = (ColumnDef("id", "int(11)"), ColumnDef("f", "float"), ColumnDef("d", "double"),
        ColumnDef("m", "decimal(10,2)"), ColumnDef("ts", "timestamp(6)"), ColumnDef("y", "year(4)"),
        ColumnDef("b", "varbinary(8)"), ColumnDef("s", "varchar(10)"))
SCHEMA = TableSchema("app", "t", COLS, ("id",))
POS = Position("mysql-bin.000001", 500)


def _row(i: int) -> tuple:
    return (i, 1.100000023841858, 0.1, decimal.Decimal("3.50"),
            dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc), 2026, b"\x00a", f"s{i}")


def test_checksum_is_order_independent_and_counts_rows() -> None:
    rows = [_row(i) for i in range(50)]
    h = RowHasher(COLS)
    a = h.rows(rows)
    random.Random(1).shuffle(rows)
    assert h.rows(rows) == a and a.count == 50
    assert a.hash == sum(h.row(r) for r in rows) & MASK
    assert h.rows(rows[:-1]) != a
    assert h.rows(rows[:-1]) + Checksum(1, h.row(rows[-1])) == a


def test_values_render_by_source_type_not_driver_type() -> None:
    """What another target may return for the same stored values hashes the same."""
    h = RowHasher(COLS)
    other = (7, 1.1, 0.1, decimal.Decimal("3.5"), dt.datetime(2026, 1, 2, 3, 4, 5, 6), 2026, bytearray(b"\x00a"), "s7")
    assert h.row(_row(7)) == h.row(other)
    assert h.row(_row(7)) != h.row((7, 1.1, 0.1, decimal.Decimal("3.51"), *_row(7)[4:]))
    # NULL is not the empty string, nor the text of a value
    assert h.row((None,) * 8) != h.row((0, 0.0, 0.0, 0, _row(1)[4], 0, b"", ""))
    assert RowHasher((ColumnDef("s", "text"),)).row(("",)) != RowHasher((ColumnDef("s", "text"),)).row((None,))
    # value boundaries cannot shift between columns
    two = RowHasher((ColumnDef("a", "text"), ColumnDef("b", "text")))
    assert two.row(("ab", "c")) != two.row(("a", "bc"))


def test_key_ranges() -> None:
    r = KeyRange((10,), (20,))
    assert [k for k in range(25) if r.contains((k,))] == list(range(11, 21))
    assert KeyRange(None, (3,)).contains((-5,)) and not KeyRange((3,), None).contains((3,))
    assert KeyRange.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    comp = KeyRange((1, "b"), (2, "a"))
    assert comp.contains((1, "c")) and comp.contains((2, "a")) and not comp.contains((1, "b"))
    assert r.describe(("id",)) == "10 < (id) <= 20" and KeyRange().describe() == "whole table"
    ts = KeyRange((dt.datetime(2026, 1, 1),), None)  # naive UTC (a driver) vs aware (the model)
    assert ts.contains((dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc),))
    rows = [_row(i) for i in range(30)]
    assert range_checksum(SCHEMA, r, rows) == RowHasher(COLS).rows(rows[11:21])


def _verify_batch() -> Batch:
    payload = json.dumps({"chunk": "j/app.t/0", "range": KeyRange((1,), (9,)).to_dict(), "count": 2, "hash": "00ff"})
    changes = (
        Change(Op.INSERT, "app", "t", "0-1-1", POS, 1, SCHEMA, None, _row(1)),
        Change(Op.PURGE, "app", "t", "verify:x", POS, 2, SCHEMA, sql=payload),
        Change(Op.READ, "app", "t", "verify:x", POS, 2, SCHEMA, None, _row(2)),
        Change(Op.CHECKSUM, "app", "t", "verify:x", POS, 2, SCHEMA, sql=payload),
    )
    return Batch("p1", changes, POS, True, POS, 1, 2, {})


@pytest.mark.parametrize("path", ["pure", "compiled"])
def test_verification_records_travel_in_schema_v2(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "compiled" and not compiled.available():
        pytest.skip("cynomys._speedups is not built (copy it from /work/main or build it in place)")
    encode = codec.encode_pure if path == "pure" else codec.encode
    b = _verify_batch()
    data = encode(b)
    assert data[:4] == b"CYB\x02"
    assert codec.decode(data) == b
    # A batch without them stays v1: appliers that predate v2 still read it.
    plain = Batch("p1", b.changes[:1], POS, True, POS, 1, 2, {})
    assert encode(plain)[:4] == b"CYB\x01" and codec.decode(encode(plain)) == plain
    if path == "compiled":
        assert encode(b) == codec.encode_pure(b)


def test_checksum_and_purge_are_fold_barriers() -> None:
    """A key changed before and after a verification record keeps both
    changes on their side of it (folding would move one across)."""
    b = _verify_batch()
    after = Change(Op.UPDATE, "app", "t", "0-1-2", POS, 3, SCHEMA, _row(2), _row(2)[:7] + ("new",))
    out = fold([*b.changes, after])
    assert [c.op for c in out] == [Op.INSERT, Op.PURGE, Op.READ, Op.CHECKSUM, Op.UPDATE]


def test_key_predicate_selects_what_contains_selects() -> None:
    """The SQL a target runs and the Python filter agree, composite keys and
    open ends included (evaluated by sqlite3, which takes the same SQL)."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a INT, b TEXT, PRIMARY KEY (a, b))")
    keys = [(a, b) for a in range(6) for b in ("x", "y", "z")]
    db.executemany("INSERT INTO t VALUES (?, ?)", keys)
    from cynomys.verify.checksum import key_predicate

    for rng in (KeyRange((1, "y"), (4, "x")), KeyRange(None, (2, "z")), KeyRange((3, "x"), None), KeyRange()):
        where, params = key_predicate(("a", "b"), rng, lambda n: f'"{n}"', lambda i: "?")
        got = db.execute("SELECT a, b FROM t" + (f" WHERE {where}" if where else ""), params).fetchall()
        assert sorted(got) == [k for k in keys if rng.contains(k)], (rng, where)


def test_tail_shows_verification_records_as_comments() -> None:
    from cynomys.reducer.sql import render

    out = render(list(_verify_batch().changes))
    assert out[1].startswith("/* PURGE app.t {") and out[-1].startswith("/* CHECKSUM app.t {")
    assert out[2].startswith("REPLACE INTO")  # the READ row between them (an upsert)


def _window(tmp_path, rows: list[tuple], rng: KeyRange):  # type: ignore[no-untyped-def]
    from cynomys.core.config import Config, ProducerConfig
    from cynomys.snapshot.columns import TableInfo
    from cynomys.snapshot.window import Phase, Window
    from cynomys.verify.coordinator import VerifyCoordinator, _Active
    from cynomys.verify.state import RUNNING, VerifyJob, VerifyTask

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)))
    co = VerifyCoordinator(cfg, start=POS)
    co.jobs = [VerifyJob("j", RUNNING, (VerifyTask("app.t"),), chunk_size=5)]
    a = _Active("j", 0, TableInfo(SCHEMA, "InnoDB", len(rows)), rng, Window(Phase.WAIT_LOW, "L", "H"))
    a.rows = {(r[0],): r for r in rows}
    co._reading = a
    return co, a


def _wm(uuid: str) -> Change:
    wm = TableSchema("cynomys_meta", "watermark", (ColumnDef("producer_id", "varchar(64)"),
                                                   ColumnDef("uuid", "char(36)"), ColumnDef("kind", "varchar(8)")),
                     ("producer_id",))
    return Change(Op.UPDATE, "cynomys_meta", "watermark", "t", POS, 1, wm, ("p", "x", "low"), ("p", uuid, "low"))


def test_window_brings_the_chunk_to_the_stream_position(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Changes before the low watermark were seen by the select (ignored);
    inside the window and after the high one they are applied to the chunk,
    inside its key range only: the same whether the select saw them or not."""
    from cynomys.snapshot.window import Phase

    rows = [_row(i) for i in range(10, 15)]  # the select's rows: keys 10..14 of the range 9 < id <= 14
    co, a = _window(tmp_path, rows, KeyRange((9,), (14,)))

    def ch(op: Op, before: tuple | None, after: tuple | None) -> Change:
        return Change(op, "app", "t", "0-1-9", POS, 1, SCHEMA, before, after)

    co.observe(ch(Op.DELETE, _row(10), None))          # before the low watermark: the select saw it
    assert (10,) in a.rows
    co.observe(_wm("L"))
    assert a.window.phase is Phase.OPEN
    changed = _row(11)[:7] + ("changed",)
    co.observe(ch(Op.UPDATE, _row(11), changed))       # in the window: its image wins
    co.observe(ch(Op.DELETE, _row(12), None))
    co.observe(ch(Op.INSERT, None, _row(13)))          # already selected: the same row again
    co.observe(ch(Op.UPDATE, _row(14), (20,) + _row(14)[1:]))   # key moves out of the range
    co.observe(ch(Op.INSERT, None, _row(99)))          # outside the range: not this chunk's
    co.observe(_wm("H"))
    assert a.window.phase is Phase.CLOSING
    co.observe(ch(Op.INSERT, None, (9,) + _row(9)[1:]))  # lo is exclusive
    co.observe(ch(Op.UPDATE, (20,) + _row(14)[1:], _row(14)))  # after the high watermark: moved back
    assert sorted(a.rows) == [(10,), (11,), (13,), (14,)]
    assert a.rows[(11,)] == changed
    out = co.poll(at_boundary=True)
    assert [type(x).__name__ for x in out] == ["Change", "Commit"] and out[0].op is Op.CHECKSUM
    payload = json.loads(out[0].sql or "")
    assert Checksum.from_dict(payload) == RowHasher(COLS).rows([_row(10), changed, _row(13), _row(14)])
    assert KeyRange.from_dict(payload["range"]) == KeyRange((9,), (14,))
    # Recorded as done only once the producer's checkpoint passes it.
    assert co.jobs[0].chunks == ()
    co.checkpointed(POS)
    assert [c["id"] for c in co.jobs[0].chunks] == ["j/app.t/0"] and co.jobs[0].tasks[0].lo == [["int", "14"]]


# -- key order: one order (bytes) on both sides ---------------------------------------
def test_key_ranges_compare_in_byte_order_not_a_collation() -> None:
    """utf8mb4_general_ci says 'a' < 'B', 'a' = 'a ', 'e' = 'é'; a range
    means the same keys on both sides only in one order: the UTF-8 bytes."""
    assert sorted(["a", "B", "c", "D", "é", "f", "b\t", "b", "x "]) == ["B", "D", "a", "b", "b\t", "c", "f", "x ", "é"]
    r = KeyRange(("B",), ("c",))
    assert [k for k in ["a", "B", "c", "D", "é", "b\t"] if r.contains((k,))] == ["a", "c", "D", "b\t"]
    assert not r.contains(("é",)) and not r.contains(("B",)) and r.contains(("a ",))
    assert KeyRange(("a",), None).contains(("a ",)) and not KeyRange(None, ("a",)).contains(("a ",))


def test_which_source_columns_compare_in_byte_order() -> None:
    from cynomys.snapshot.chunker import byte_ordered, unordered_columns

    assert byte_ordered("int", None, None) and byte_ordered("varbinary", None, None)
    assert byte_ordered("varchar", "utf8mb4", "utf8mb4_nopad_bin")
    assert byte_ordered("varchar", "utf8mb4", "utf8mb4_0900_bin")  # MySQL 8: NO PAD
    for coll in ("utf8mb4_general_ci", "utf8mb4_unicode_ci", "utf8mb4_bin"):  # utf8mb4_bin pads: 'a' = 'a '
        assert not byte_ordered("varchar", "utf8mb4", coll), coll
    assert not byte_ordered("varchar", "latin1", "latin1_nopad_bin")  # cp1252 bytes are not code point order
    assert not byte_ordered("enum", "utf8mb4", "utf8mb4_nopad_bin")   # sorted by member number
    info = [("id", "int", None, None), ("K", "varchar", "utf8mb4", "utf8mb4_general_ci"),
            ("e", "enum", "utf8mb4", "utf8mb4_nopad_bin"), ("b", "varchar", "utf8mb4", "utf8mb4_nopad_bin")]
    assert unordered_columns(info, ("id", "k", "e", "b")) == {
        "k": "collation utf8mb4_general_ci", "e": "ENUM (sorted by member number)"}


def test_key_predicate_in_byte_order_selects_what_contains_selects() -> None:
    """With ``expr``/``param`` (a text column compared as bytes) the SQL
    range is the Python range, on data whose collation order differs
    (sqlite3 compares BLOBs bytewise, TEXT in NOCASE here)."""
    import sqlite3

    from cynomys.verify.checksum import key_predicate

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (s TEXT COLLATE NOCASE, n INT, PRIMARY KEY (s, n))")
    keys = [(s, n) for s in ("a", "B", "c", "D", "é", "f", "b\t", "x ") for n in (1, 2)]
    db.executemany("INSERT INTO t VALUES (?, ?)", keys)
    for rng in (KeyRange(("B", 2), ("c", 1)), KeyRange(None, ("a", 1)), KeyRange(("c", 2), None),
                KeyRange(("D", 1), ("é", 2))):
        plain, _ = key_predicate(("s", "n"), rng, lambda n: f'"{n}"', lambda i: "?")
        where, params = key_predicate(("s", "n"), rng, lambda n: f'"{n}"', lambda i: "?",
                                      expr=lambda n, q: f"CAST({q} AS BLOB)" if n == "s" else q,
                                      param=lambda n, v: v.encode() if isinstance(v, str) else v)
        assert "CAST(\"s\" AS BLOB) > ?" in where and plain != where
        got = db.execute(f"SELECT s, n FROM t WHERE {where}", params).fetchall()
        assert sorted(got) == sorted(k for k in keys if rng.contains(k)), (rng, where)


def test_stream_select_of_a_collated_key_is_in_byte_order() -> None:
    from cynomys.snapshot.columns import TableInfo
    from cynomys.verify.coordinator import range_sql, stream_sql

    schema = TableSchema("app", "t%", (ColumnDef("s", "varchar(10)"), ColumnDef("n", "int")), ("s", "n"))
    sql, params = stream_sql(TableInfo(schema, "InnoDB", 0), {"s": "collation utf8mb4_general_ci"},
                             KeyRange(("é", 1), ("f", 2)))
    b = "CAST(CONVERT(`s` USING utf8mb4) AS BINARY)"
    assert sql.startswith("SELECT `s`, `n` FROM `app`.`t%%` WHERE ((" + b + " > %s) OR (" + b + " = %s AND `n` > %s))")
    assert sql.endswith(f"ORDER BY {b}, `n`")
    assert params == ("é".encode(), "é".encode(), 1, b"f", b"f", 2)
    keyless = TableSchema("app", "log", (ColumnDef("s", "varchar(10)"),), ())
    assert stream_sql(TableInfo(keyless, "InnoDB", 0), {}, KeyRange()) == ("SELECT `s` FROM `app`.`log`", ())
    # a key MariaDB compares in byte order keeps the indexed condition
    assert range_sql(("n",), KeyRange((1,), (5,))) == ("`n` > %s AND NOT (`n` > %s)", (1, 5))


# -- the coordinator's stream (no server: a fake cursor) ------------------------------
S_COLS = (ColumnDef("k", "varchar(20)"), ColumnDef("v", "text"))
S_SCHEMA = TableSchema("app", "t", S_COLS, ("k",))


class _Cursor:
    """A server-side cursor's fetchmany over rows already in select order."""

    def __init__(self, rows: list[tuple]) -> None:
        self.rows = list(rows)
        self.fetched = 0

    def fetchmany(self, n: int) -> list[tuple]:
        out, self.rows = self.rows[:n], self.rows[n:]
        self.fetched += len(out)
        return out


def _stream(tmp_path, rows: list[tuple], *, schema: TableSchema = S_SCHEMA, chunk: int = 3,  # type: ignore[no-untyped-def]
            repair: bool = False, max_envelope: int = 64 << 20, phase=None):
    from cynomys.core.config import Config, ProducerConfig, TransportConfig
    from cynomys.snapshot.columns import TableInfo
    from cynomys.snapshot.window import Phase, Window
    from cynomys.verify.coordinator import VerifyCoordinator, _Stream
    from cynomys.verify.state import RUNNING, VerifyJob, VerifyTask

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)),
                 transport=TransportConfig(max_envelope_bytes=max_envelope))
    co = VerifyCoordinator(cfg, start=POS)
    co.jobs = [VerifyJob("j", RUNNING, (VerifyTask("app.t", repair=repair),), chunk_size=chunk)]
    cur = _Cursor(rows)
    s = _Stream("j", 0, TableInfo(schema, "InnoDB", len(rows)), None, cur, Window(phase or Phase.WAIT_LOW, "L", "H"))
    co._reading = s
    return co, s, cur


def _sch(op: Op, before: tuple | None, after: tuple | None, schema: TableSchema = S_SCHEMA) -> Change:
    return Change(op, "app", "t", "0-1-9", POS, 1, schema, before, after)


def _emitted(out: list) -> tuple[KeyRange, Checksum, list[tuple], bool]:  # type: ignore[type-arg]
    """(range, checksum, READ rows, has PURGE) of one emitted chunk."""
    check = [c for c in out if isinstance(c, Change) and c.op is Op.CHECKSUM]
    assert len(check) == 1, out
    payload = json.loads(check[0].sql or "")
    reads = [c.after for c in out if isinstance(c, Change) and c.op is Op.READ]
    purge = any(isinstance(c, Change) and c.op is Op.PURGE for c in out)
    return KeyRange.from_dict(payload["range"]), Checksum.from_dict(payload), reads, purge


def test_a_collated_key_is_streamed_in_byte_order_and_the_window_stays_open(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Chunks are cut from one select in byte order; every change after the
    low watermark to a key not emitted yet is applied to the chunk holding
    it, when that chunk leaves (a range 'B' < k <= 'a' holds 'Ab' and 'D',
    which a collation puts elsewhere)."""
    from cynomys.snapshot.window import Phase

    keys = sorted(["a", "B", "c", "D", "é", "f", "b\t", "x "])
    rows = [(k, f"v{k}") for k in keys]
    co, s, _ = _stream(tmp_path, rows)
    h = RowHasher(S_COLS)
    co.observe(_sch(Op.DELETE, ("a", "va"), None))        # before the low watermark: the read saw it
    co.observe(_wm("L"))
    assert s.window.phase is Phase.OPEN
    co.observe(_sch(Op.UPDATE, ("c", "vc"), ("c", "changed")))
    co.observe(_sch(Op.INSERT, None, ("Ab", "new")))      # 'Ab' < 'B' < 'a' in bytes
    co.observe(_sch(Op.DELETE, ("f", "vf"), None))
    assert co.poll(at_boundary=True) == []                # the high watermark is not in the log yet
    co.observe(_wm("H"))
    rng, cs, _, purge = _emitted(co.poll(at_boundary=True))
    assert rng == KeyRange(None, ("a",)) and not purge
    assert cs == h.rows([("Ab", "new"), ("B", "vB"), ("D", "vD"), ("a", "va")])
    co.observe(_sch(Op.INSERT, None, ("e", "ins")))       # after the window closed: still applied
    co.observe(_sch(Op.UPDATE, ("B", "vB"), ("B", "x")))  # already emitted: the stream carries it after
    assert ("B",) not in s.pending
    rng, cs, _, _ = _emitted(co.poll(at_boundary=True))
    assert rng == KeyRange(("a",), ("f",))
    assert cs == h.rows([("b\t", "vb\t"), ("c", "changed"), ("e", "ins")])
    assert co._reading is s and s.pending == {}
    rng, cs, _, _ = _emitted(co.poll(at_boundary=True))
    assert rng == KeyRange(("f",), None) and cs == h.rows([("x ", "vx "), ("é", "vé")])
    assert co._reading is None and co.poll(at_boundary=True) == []
    co.checkpointed(POS)
    job = co.jobs[0]
    assert job.status == "done" and [c["id"] for c in job.chunks] == ["j/app.t/0", "j/app.t/1", "j/app.t/2"]
    assert job.tasks[0].rows == 9


def test_repair_chunks_are_cut_to_fit_one_envelope(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A repair ships its rows: each chunk's records stay under half of
    max_envelope_bytes (the producer stops on a larger envelope); the
    ranges still cover the whole range, each row once."""
    from cynomys.schemas import codec
    from cynomys.snapshot.window import Phase

    rows = [(f"k{i:03d}", "x" * 2000) for i in range(40)]
    co, s, _ = _stream(tmp_path, rows, chunk=25, repair=True, max_envelope=24_000, phase=Phase.CLOSING)
    got: list[tuple] = []
    ranges: list[KeyRange] = []
    for _ in range(40):
        out = co.poll(at_boundary=True)
        if not out:
            break
        rng, cs, reads, purge = _emitted(out)
        assert purge and cs == RowHasher(S_COLS).rows(reads) and 0 < len(reads) < 25
        changes = tuple(c for c in out if isinstance(c, Change))
        assert len(codec.encode(Batch("p1", changes, POS, True, POS, 1, 1, {}))) <= 12_000
        got += reads
        ranges.append(rng)
        co.checkpointed(POS)
    assert got == rows and ranges[0].lo is None and ranges[-1].hi is None
    assert all(a.hi == b.lo for a, b in zip(ranges, ranges[1:]))
    job = co.jobs[0]
    assert job.status == "done" and job.tasks[0].attempts == 0


def test_a_keyless_table_is_hashed_while_read_and_read_again_when_changed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cynomys.snapshot.window import Phase

    keyless = TableSchema("app", "t", S_COLS, ())
    rows = [(f"r{i % 7}", "v") for i in range(2500)]
    co, s, cur = _stream(tmp_path, rows, schema=keyless, phase=Phase.CLOSING)
    out: list = []  # type: ignore[type-arg]
    for _ in range(50):
        out = co.poll(at_boundary=True)
        if out:
            break
    rng, cs, reads, purge = _emitted(out)
    assert rng == KeyRange() and cs == RowHasher(S_COLS).rows(rows) and reads == [] and not purge
    assert s.rows == []  # a verify keeps no rows: only the running checksum
    co2, s2, _ = _stream(tmp_path / "b", rows, schema=keyless, phase=Phase.OPEN)
    co2.observe(_sch(Op.INSERT, None, ("new", "v"), keyless))
    assert s2.dirty and co2.poll(at_boundary=True) == [] and co2._reading is None
    assert co2._keyless_attempts == {("j", 0): 1}


def test_a_keyless_repair_too_large_for_an_envelope_fails_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """It would be one transaction of every row: past the envelope limit the
    producer would stop on it at every start.  The task fails instead, with
    the reason and the fix; nothing is emitted."""
    from cynomys.snapshot.window import Phase
    from cynomys.verify.state import FAILED, store_for

    keyless = TableSchema("app", "t", S_COLS, ())
    rows = [(f"r{i}", "y" * 500) for i in range(400)]
    co, s, _ = _stream(tmp_path, rows, schema=keyless, repair=True, max_envelope=64_000, phase=Phase.CLOSING)
    for _ in range(20):
        assert co.poll(at_boundary=True) == []
    job = co.jobs[0]
    assert job.status == FAILED and co._reading is None
    assert "no primary key" in job.error and "cynomys snapshot --tables app.t" in job.error
    assert store_for(co.cfg).load()[0].status == FAILED  # durable: a restart does not try again


def test_a_repair_the_producer_keeps_stopping_on_is_given_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each repair chunk is counted (durably) before it is shipped and
    uncounted when the checkpoint passes it; a count that reaches
    _SHIP_ATTEMPTS means the producer stopped on it every time: the task
    fails alone rather than stop replication at every restart."""
    from cynomys.snapshot.window import Phase
    from cynomys.verify.coordinator import VerifyCoordinator
    from cynomys.verify.state import FAILED, store_for

    rows = [(f"k{i}", "v") for i in range(2)]
    co, s, _ = _stream(tmp_path, rows, chunk=5, repair=True, phase=Phase.CLOSING)
    assert co.poll(at_boundary=True)
    assert store_for(co.cfg).load()[0].tasks[0].attempts == 1  # before the producer ships it
    co.checkpointed(POS)
    assert co.jobs[0].tasks[0].attempts == 0
    # three starts that each stopped while shipping (the request never got past it)
    from dataclasses import replace

    job = co.jobs[0]
    co.store.save([replace(job, status="running", tasks=(replace(job.tasks[0], done=False, attempts=3),))])
    again = VerifyCoordinator(co.cfg, start=POS)  # no source: it must not need one to give up
    assert again.poll(at_boundary=True) == []
    job = again.jobs[0]
    assert job.status == FAILED and "stopped 3 times while shipping a repair chunk" in job.error


class _MemTarget:
    """Just enough of a target for the Verifier: purge refused."""

    def __init__(self) -> None:
        from cynomys.verify.errors import RepairRefused

        self.exc = RepairRefused("repair of app.t refused: key column k has collation utf8mb4_general_ci",
                                 hint="ALTER TABLE ...")

    def purge_into(self, flush, schema, rng):  # type: ignore[no-untyped-def]
        raise self.exc

    def checksum_range(self, schema, rng):  # type: ignore[no-untyped-def]
        return Checksum(1, 5)


def test_a_refused_repair_leaves_the_range_and_says_why(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cynomys.applier.targets.base import Flush, TableFlush
    from cynomys.core.config import ApplierConfig, Config
    from cynomys.core.model import AppliedState
    from cynomys.verify.applier import Verifier, read_results

    cfg = Config(applier=ApplierConfig(state_dir=str(tmp_path)))
    v = Verifier(cfg, _MemTarget())  # type: ignore[arg-type]
    b = _verify_batch()
    purge, read, check = b.changes[1], b.changes[2], b.changes[3]
    v.purge_later(purge)
    flush = Flush([TableFlush(SCHEMA, delete_keys=[(2,)], inserts=[read.after])], AppliedState("p1", 1, POS))
    v.amend(flush)
    assert flush.tables == []  # the READ rows do not go in without their range's deletion
    v.check(check)
    r = read_results(tmp_path / "verify-results.jsonl")["j/app.t/0"]
    assert not r["match"] and r["error"] == ("repair of app.t refused: key column k has collation "
                                             "utf8mb4_general_ci (fix: ALTER TABLE ...)")


def test_base_purge_runs_the_targets_purge_check(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cynomys.applier.targets import base
    from cynomys.applier.targets.base import Flush, Target
    from cynomys.core.config import Config, TargetConfig
    from cynomys.core.model import AppliedState
    from cynomys.verify.errors import RepairRefused

    class Mem(Target):
        def connect(self) -> None: ...
        def close(self) -> None: ...
        def applied(self, producer_id):  # type: ignore[no-untyped-def]
            return None
        def apply(self, flush): ...  # type: ignore[no-untyped-def]
        def apply_ddl(self, change, state): ...  # type: ignore[no-untyped-def]
        def table_exists(self, database, table):  # type: ignore[no-untyped-def]
            return True
        def fetch_rows(self, database, table):  # type: ignore[no-untyped-def]
            return [_row(i) for i in range(10)]

    def check(target, schema):  # type: ignore[no-untyped-def]
        raise RepairRefused(f"no repair of {schema.name}")

    t = Mem(Config(target=TargetConfig(kind="monetdb")))
    flush = Flush([], AppliedState("p1", 1, POS))
    assert t.purge_into(flush, SCHEMA, KeyRange((2,), (5,))) == 3 and flush.tables[0].delete_keys == [(3,), (4,), (5,)]
    base.register_purge_check("monetdb", check)
    try:
        with pytest.raises(RepairRefused, match="no repair of app.t"):
            t.purge_into(Flush([], AppliedState("p1", 1, POS)), SCHEMA, KeyRange((2,), (5,)))
    finally:
        base._PURGE_CHECKS.pop("monetdb")
