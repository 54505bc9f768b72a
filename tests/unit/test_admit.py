"""The admit stage (cynomys/applier/admit.py) as pure logic: which changes
of an envelope the target needs, and when the applier must stop instead."""
from __future__ import annotations

import pytest

from cynomys.applier.admit import Admission, BufferView, Verdict
from cynomys.core.errors import SequenceGapError, TerminalError
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, EnvelopeMeta, Op, Position, TableSchema
from cynomys.reducer.fold import FOLD_RULES, PRODUCER_RULES, Folder

A, B = "server_id=1", "server_id=2"
FA, FB = "binlog.000004", "binlog.000001"  # the new primary numbers its files below the old one's
SCHEMA = TableSchema("d", "t", (ColumnDef("id", "int(11)", False), ColumnDef("v", "int(11)")), ("id",))
EMPTY = BufferView(0, True)


def txn(file: str, at: int, key: int, gtid: str = "") -> Change:
    return Change(Op.INSERT, "d", "t", gtid or f"{file}:{at}", Position(file, at), 1, SCHEMA, None, (key, at))


def batch(changes: list[Change], end: Position, *, server: str = A, after: Position | None = None,
          incarnation: str = "i1", **meta: object) -> Batch:
    first = changes[0].txn if changes else end
    m = EnvelopeMeta(start=first, server=server, after=after, incarnation=incarnation, **meta)  # type: ignore[arg-type]
    return Batch("p", tuple(changes), end, True, None, 0, 1, m.to_dict())


def held(seq: int, at: Position, server: str = A, incarnation: str = "i1", fence: int = 0) -> Admission:
    adm = Admission()
    adm.restore(AppliedState("p", seq, at, 1, server=server, incarnation=incarnation, fence=fence))
    return adm


def keys(decision_batch: Batch | None) -> list[int]:
    assert decision_batch is not None
    return [c.after[0] for c in decision_batch.changes if c.after is not None]


def test_a_resent_number_batched_differently_applies_what_the_target_lacks() -> None:
    """Redis lost its last second: the producer's state went back to after
    envelope 1, while the target took envelopes 2 and 3 (rows 1..3).  It
    re-reads and re-sends number 2 covering rows 2..6: skipping it whole
    (by number) lost rows 4 and 5."""
    adm = held(3, Position(FA, 300))
    d = adm.judge("p", 2, 0, batch([txn(FA, 200, 2), txn(FA, 250, 3), txn(FA, 400, 4), txn(FA, 500, 5)],
                                   Position(FA, 550), after=Position(FA, 150)), EMPTY)
    assert d.verdict is Verdict.TAKE and keys(d.batch) == [4, 5]


def test_a_resent_number_the_target_holds_whole_is_a_duplicate() -> None:
    adm = held(3, Position(FA, 300))
    d = adm.judge("p", 2, 0, batch([txn(FA, 200, 2)], Position(FA, 250), after=Position(FA, 150)), EMPTY)
    assert d.verdict is Verdict.DUPLICATE


def test_a_resent_number_resuming_past_the_target_stops() -> None:
    adm = held(3, Position(FA, 300))
    with pytest.raises(TerminalError, match="resumes at binlog.000004:350, past what the target holds"):
        adm.judge("p", 2, 0, batch([txn(FA, 400, 4)], Position(FA, 450), after=Position(FA, 350)), EMPTY)


def test_a_resent_number_without_a_resume_point_stops() -> None:
    adm = held(3, Position(FA, 300))
    with pytest.raises(TerminalError, match="does not say where its producer resumed"):
        adm.judge("p", 2, 0, batch([txn(FA, 400, 4)], Position(FA, 450)), EMPTY)


def test_a_resent_number_while_the_buffer_holds_envelopes_flushes_first() -> None:
    adm = held(3, Position(FA, 300))
    b = batch([txn(FA, 400, 4)], Position(FA, 450), after=Position(FA, 150))
    assert adm.judge("p", 2, 0, b, BufferView(2, True)).verdict is Verdict.FLUSH_FIRST
    with pytest.raises(TerminalError, match="cannot be told apart"):
        adm.judge("p", 2, 0, b, BufferView(2, False))


def test_the_next_envelope_drops_only_what_the_target_holds() -> None:
    adm = held(3, Position(FA, 300))
    d = adm.judge("p", 4, 0, batch([txn(FA, 250, 3), txn(FA, 400, 4)], Position(FA, 450)), EMPTY)
    assert d.verdict is Verdict.TAKE and keys(d.batch) == [4]


def test_a_gap_stops() -> None:
    with pytest.raises(SequenceGapError, match="envelope 4 from p is missing"):
        held(3, Position(FA, 300)).judge("p", 5, 0, batch([txn(FA, 400, 4)], Position(FA, 450)), EMPTY)


def test_another_server_is_ordered_by_gtid_never_by_file_number() -> None:
    """The failover: the target holds the old primary up to GTID 0-1-100 at
    binlog.000004; the new primary's changes sit in binlog.000001.  By file
    number all of them sorted below the applied position and were dropped."""
    adm = held(7, Position(FA, 9000, "0-1-100"))
    b = batch([txn(FB, 500, 1, "0-1-99"), txn(FB, 600, 2, "0-1-100"), txn(FB, 700, 3, "0-2-101"),
               txn(FB, 800, 4, "0-2-102")], Position(FB, 900, "0-2-102"), server=B)
    d = adm.judge("p", 8, 0, b, EMPTY)
    assert d.verdict is Verdict.TAKE and keys(d.batch) == [3, 4]


def test_another_server_without_gtids_stops() -> None:
    adm = held(7, Position(FA, 9000))
    with pytest.raises(TerminalError, match="without GTIDs positions of two servers cannot be ordered"):
        adm.judge("p", 8, 0, batch([txn(FB, 500, 1)], Position(FB, 900), server=B), EMPTY)


def test_a_new_incarnation_resuming_where_the_target_is_is_admitted_past_it_stops() -> None:
    at = Position(FA, 300)
    ok = held(3, at).judge("p", 1, 0, batch([txn(FA, 400, 4)], Position(FA, 450), after=at, incarnation="i2"),
                           EMPTY)
    assert ok.verdict is Verdict.TAKE and keys(ok.batch) == [4]
    # Numbering on from the transport (HA state deleted): still a new life.
    with pytest.raises(TerminalError, match="started anew .* past what the target holds"):
        held(3, at).judge("p", 4, 0, batch([txn(FA, 900, 9)], Position(FA, 950), after=Position(FA, 800),
                                           incarnation="i2"), EMPTY)


def test_a_new_incarnation_on_another_server_compares_gtid_sets() -> None:
    adm = held(3, Position(FA, 300, "0-1-50"))
    ok = adm.judge("p", 4, 0, batch([txn(FB, 10, 1, "0-2-51")], Position(FB, 20, "0-2-51"), server=B,
                                    after=Position("", 0, "0-1-50"), incarnation="i2"), EMPTY)
    assert ok.verdict is Verdict.TAKE
    with pytest.raises(TerminalError, match="past what the target holds"):
        held(3, Position(FA, 300, "0-1-50")).judge(
            "p", 4, 0, batch([txn(FB, 10, 1, "0-2-61")], Position(FB, 20, "0-2-61"), server=B,
                             after=Position(FB, 5, "0-2-60"), incarnation="i2"), EMPTY)


def test_an_older_fence_at_the_next_number_stops_at_an_old_number_is_dead_lettered() -> None:
    adm = held(3, Position(FA, 300), fence=7)
    with pytest.raises(TerminalError, match="fencing counter went backwards"):
        adm.judge("p", 4, 1, batch([txn(FA, 400, 4)], Position(FA, 450)), EMPTY)
    assert adm.judge("p", 3, 1, batch([txn(FA, 250, 3)], Position(FA, 300)), EMPTY).verdict is Verdict.DEAD
    # An old number carrying changes the target lacks is no stale copy: stop, never drop them.
    with pytest.raises(TerminalError, match="carrying changes the target lacks"):
        adm.judge("p", 3, 1, batch([txn(FA, 250, 3), txn(FA, 400, 4)], Position(FA, 450), after=Position(FA, 150)),
                  EMPTY)


def test_the_recorded_number_never_moves_back() -> None:
    adm = held(3, Position(FA, 300))
    adm.advance("p", 2)  # a re-sent number was taken: the chain is at 2 ...
    assert adm.state("p", 2, Position(FA, 550), 1).seq == 3  # ... the target keeps 3


def test_insert_then_delete_in_later_transaction_leaves_a_delete_for_the_producer() -> None:
    ins, dele = txn(FA, 100, 1), Change(Op.DELETE, "d", "t", f"{FA}:200", Position(FA, 200), 1, SCHEMA, (1, 100), None)
    same = Change(Op.DELETE, "d", "t", f"{FA}:100", Position(FA, 100), 1, SCHEMA, (1, 100), None)
    for rules, want in ((PRODUCER_RULES, [(Op.DELETE, Position(FA, 200))]), (FOLD_RULES, [])):
        f = Folder(rules)
        f.extend([ins, dele])
        assert [(c.op, c.txn) for c in f.changes()] == want
    f = Folder(PRODUCER_RULES)
    f.extend([ins, same])  # one transaction: held whole or not at all
    assert f.changes() == []


def test_insert_then_update_in_later_transaction_ships_an_update_of_the_inserted_image() -> None:
    """An applier holding the insert's transaction has the row: a plain
    insert of the final image collided with it (duplicate key)."""
    ins = txn(FA, 100, 1)
    upd = Change(Op.UPDATE, "d", "t", f"{FA}:200", Position(FA, 200), 1, SCHEMA, (1, 100), (1, 200))
    f = Folder(PRODUCER_RULES)
    f.extend([ins, upd])
    assert [(c.op, c.before, c.after, c.txn) for c in f.changes()] == [(Op.UPDATE, (1, 100), (1, 200), Position(FA, 200))]
    same = Change(Op.UPDATE, "d", "t", f"{FA}:100", Position(FA, 100), 1, SCHEMA, (1, 100), (1, 200))
    f = Folder(PRODUCER_RULES)
    f.extend([ins, same])  # one transaction: held whole or not at all
    assert [(c.op, c.after) for c in f.changes()] == [(Op.INSERT, (1, 200))]
