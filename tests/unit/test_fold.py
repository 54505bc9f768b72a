"""The fold rules table, one case each, plus key changes and keyless tables."""
from __future__ import annotations

import pytest

from cynomys.core.model import Change, ColumnDef, Op, Position, TableSchema
from cynomys.reducer.fold import FOLD_RULES, fold

KEYED = TableSchema("d", "t", (ColumnDef("id", "int"), ColumnDef("v", "text")), ("id",))
KEYLESS = TableSchema("d", "n", (ColumnDef("a", "int"), ColumnDef("b", "int")), ())
I, U, D, R = Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ


def ch(op: Op, before: tuple | None, after: tuple | None, schema: TableSchema = KEYED, n: int = 0) -> Change:
    return Change(op, schema.database, schema.table, f"t{n}", Position("b.000001", 100 + n), n, schema, before, after)


@pytest.mark.parametrize("first,second,expect", [
    (ch(I, None, (1, "a")), ch(U, (1, "a"), (1, "b"), n=1), (I, None, (1, "b"))),
    (ch(I, None, (1, "a")), ch(D, (1, "a"), None, n=1), None),
    (ch(U, (1, "a"), (1, "b")), ch(U, (1, "b"), (1, "c"), n=1), (U, (1, "a"), (1, "c"))),
    # the image deleted: the same key as the first one, and what a soft_delete table keeps
    (ch(U, (1, "a"), (1, "b")), ch(D, (1, "b"), None, n=1), (D, (1, "b"), None)),
    (ch(D, (1, "a"), None), ch(I, None, (1, "z"), n=1), (U, (1, "a"), (1, "z"))),
    (ch(R, None, (1, "a")), ch(U, (1, "a"), (1, "b"), n=1), (R, None, (1, "b"))),
    (ch(R, None, (1, "a")), ch(D, (1, "a"), None, n=1), (D, (1, "a"), None)),
    (ch(I, None, (1, "a")), ch(R, None, (1, "a"), n=1), (I, None, (1, "a"))),
    (ch(U, (1, "a"), (1, "b")), ch(R, None, (1, "b"), n=1), (U, (1, "a"), (1, "b"))),
    (ch(D, (1, "a"), None), ch(R, None, (1, "r"), n=1), (U, (1, "a"), (1, "r"))),
    (ch(R, None, (1, "a")), ch(R, None, (1, "b"), n=1), (R, None, (1, "b"))),
], ids=lambda v: v.op.value if isinstance(v, Change) else str(v))
def test_each_rule(first: Change, second: Change, expect: tuple | None) -> None:
    out = fold([first, second])
    if expect is None:
        assert out == []
    else:
        assert [(c.op, c.before, c.after) for c in out] == [expect]
        assert out[0].txn == second.txn  # the net change belongs to the latest transaction


def test_rules_table_covers_every_sane_pair() -> None:
    assert set(FOLD_RULES) == {(I, U), (I, D), (I, R), (U, U), (U, D), (U, R), (D, I), (D, R), (D, D), (D, U), (R, U), (R, D),
                               (R, R)}


def test_key_changing_update_is_delete_plus_insert() -> None:
    out = fold([ch(U, (1, "a"), (2, "a"))])
    assert [(c.op, c.before, c.after) for c in out] == [(D, (1, "a"), None), (I, None, (2, "a"))]


def test_key_change_then_changes_on_both_keys() -> None:
    out = fold([ch(I, None, (1, "a")), ch(U, (1, "a"), (2, "a"), n=1), ch(U, (2, "a"), (2, "b"), n=2),
                ch(I, None, (1, "new"), n=3)])
    assert [(c.op, c.before, c.after) for c in out] == [(I, None, (1, "new")), (I, None, (2, "b"))]


def test_keyless_changes_keep_order_and_are_not_folded() -> None:
    seq = [ch(I, None, (1, 1), KEYLESS), ch(I, None, (1, 1), KEYLESS, 1), ch(D, (1, 1), None, KEYLESS, 2)]
    assert fold(seq) == seq


def test_unexpected_pair_keeps_both(caplog: pytest.LogCaptureFixture) -> None:
    seq = [ch(I, None, (1, "a")), ch(I, None, (1, "b"), n=1)]
    assert [(c.op, c.after) for c in fold(seq)] == [(I, (1, "a")), (I, (1, "b"))]
    assert "no fold rule" in caplog.text


def test_ddl_is_a_barrier() -> None:
    ddl = Change(Op.DDL, "d", "", "t1", Position("b.000001", 150), 1, sql="ALTER TABLE t ADD w int")
    out = fold([ch(I, None, (1, "a")), ddl, ch(U, (1, "a"), (1, "b"), n=2)])
    assert [c.op for c in out] == [I, Op.DDL, U]


def test_many_updates_of_one_row_collapse() -> None:
    seq = [ch(I, None, (7, "0"))] + [ch(U, (7, str(i)), (7, str(i + 1)), n=i + 1) for i in range(100)]
    out = fold(seq)
    assert [(c.op, c.after) for c in out] == [(I, (7, "100"))]


def test_net_count_is_the_number_of_net_changes() -> None:
    # The applier's backlog cap reads it (DelayBuffer.held): changes that
    # cancelled out (insert + delete, a key moved away and back) are not
    # net changes and must not fill the cap.
    import random

    from cynomys.reducer.fold import Folder

    rnd = random.Random(11)
    f = Folder()
    live: dict[int, str] = {}
    for n in range(3000):
        k = rnd.randrange(40)
        if k in live and rnd.random() < 0.5:
            change = ch(D, (k, live.pop(k)), None, n=n)
        elif k in live:
            new = rnd.randrange(40, 80) if rnd.random() < 0.2 else k  # sometimes a key change
            if new != k and new in live:
                new = k
            change = ch(U, (k, live.pop(k)), (new, f"v{n}"), n=n)
            live[new] = f"v{n}"
        else:
            change = ch(I, None, (k, f"v{n}"), n=n)
            live[k] = f"v{n}"
        f.add(change)
        if rnd.random() < 0.05:
            f.add(ch(I, None, (n, n), KEYLESS, n=n))
        assert f.net_count() == len(f.changes()), f"after change {n}"


def test_a_snapshot_chunk_is_one_slot_nothing_folds_across() -> None:
    # ManyRows (a chunk, core/columnar.py): the changes before and after it
    # keep their places; a change after it never folds into one before it
    # (that would move its effect before the chunk's rows).
    from cynomys.core.columnar import ManyRows, row_count
    from cynomys.reducer.fold import Folder

    chunk = ManyRows(R, "d", "t", "snap", Position("b.000001", 150), 1, KEYED, images=((1, "r"), (2, "r")))
    f = Folder()
    for c in [ch(U, (1, "a"), (1, "b")), chunk, ch(D, (1, "r"), None, n=2), ch(I, None, (3, "x"), n=3),
              ch(U, (3, "x"), (3, "y"), n=3)]:
        f.add(c)
    out = f.changes()
    assert [(c.op, c.before, c.after) for c in out[:1]] == [(U, (1, "a"), (1, "b"))]
    assert out[1] is chunk
    assert [(c.op, c.before, c.after) for c in out[2:]] == [(D, (1, "r"), None), (I, None, (3, "y"))]
    assert f.net_count() == row_count(out) == 5


def test_a_bulk_insert_is_one_slot_a_barrier_for_its_table_only() -> None:
    # A binlog INSERT event of many rows (core.columnar.ManyRows): nothing
    # of its table folds across it (an update of an inserted row stays
    # after it; the applier folds the rows), another table's changes fold
    # across it as across any insert.
    from cynomys.core.columnar import ManyRows, row_count
    from cynomys.reducer.fold import Folder

    other = TableSchema("d", "o", (ColumnDef("id", "int"), ColumnDef("v", "text")), ("id",))
    bulk = ManyRows(I, "d", "t", "t1", Position("b.000001", 101), 1, KEYED, images=((5, "i"), (6, "i")))
    f = Folder()
    for c in [ch(U, (1, "a"), (1, "b")), ch(U, (7, "a"), (7, "b"), other), bulk, ch(U, (1, "b"), (1, "c"), n=2),
              ch(U, (5, "i"), (5, "j"), n=2), ch(U, (7, "b"), (7, "c"), other, n=2)]:
        f.add(c)
    out = f.changes()
    assert [(c.table, c.op, c.before, c.after) for c in out[:2]] == [("t", U, (1, "a"), (1, "b")),
                                                                    ("o", U, (7, "a"), (7, "c"))]
    assert out[2] is bulk
    assert [(c.op, c.before, c.after) for c in out[3:]] == [(U, (1, "b"), (1, "c")), (U, (5, "i"), (5, "j"))]
    assert f.net_count() == row_count(out) == 6
