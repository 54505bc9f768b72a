"""`cynomys verify`, pure parts: the canonical checksum, key ranges, the
CHECKSUM/PURGE records on the wire (schema v2) and in the fold."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import random

import pytest

from cynomys import compiled
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.reducer.fold import fold
from cynomys.schemas import codec
from cynomys.snapshot.checksum import MASK, Checksum, KeyRange, RowHasher, range_checksum

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
    from cynomys.snapshot.checksum import key_predicate

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
    from cynomys.snapshot.verify import RUNNING, VerifyCoordinator, VerifyJob, VerifyTask, _Active
    from cynomys.snapshot.window import Phase

    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)))
    co = VerifyCoordinator(cfg, start=POS)
    co.jobs = [VerifyJob("j", RUNNING, (VerifyTask("app.t"),), chunk_size=5)]
    a = _Active("j", 0, TableInfo(SCHEMA, "InnoDB", len(rows)), rng, Phase.WAIT_LOW, low_uuid="L", high_uuid="H")
    a.rows = {(r[0],): r for r in rows}
    co._active = a
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
    assert a.phase is Phase.OPEN
    changed = _row(11)[:7] + ("changed",)
    co.observe(ch(Op.UPDATE, _row(11), changed))       # in the window: its image wins
    co.observe(ch(Op.DELETE, _row(12), None))
    co.observe(ch(Op.INSERT, None, _row(13)))          # already selected: the same row again
    co.observe(ch(Op.UPDATE, _row(14), (20,) + _row(14)[1:]))   # key moves out of the range
    co.observe(ch(Op.INSERT, None, _row(99)))          # outside the range: not this chunk's
    co.observe(_wm("H"))
    assert a.phase is Phase.CLOSING
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
