"""The pure parts of keyless snapshots (snapshot/keyless.py): when a keyless
table may be read, which log changes its read covers, the abandon span, and
that a read attempt's items reach the target as TRUNCATE + inserts."""
from __future__ import annotations

import pytest

from cynomys.applier.batcher import Span
from cynomys.applier.targets.base import build_flush
from cynomys.core.model import AppliedState, Batch, Change, Op, Position
from cynomys.snapshot.columns import table_info
from cynomys.snapshot.errors import SnapshotRequestError
from cynomys.snapshot.keyless import DropRules, abandon_meta, check_keyless, is_snapshot_tid, truncate_sql

INFO = table_info("d", "ev", [("who", "int(11)"), ("what", "varchar(5)")], [], "InnoDB", 3)


def _change(db: str, table: str, at: Position) -> Change:
    return Change(Op.INSERT, db, table, "0-1-9", at, 0, INFO.schema, None, (1, "x"))


def test_initial_snapshot_reads_keyless_tables_requests_must_ask() -> None:
    check_keyless(INFO, initial=True, where="", allowed=False)          # the initial snapshot: by default
    check_keyless(INFO, initial=False, where="", allowed=True)          # a request with the option
    with pytest.raises(SnapshotRequestError, match="allow_no_primary_key = true") as exc:
        check_keyless(INFO, initial=False, where="", allowed=False)
    assert "d.ev has no primary key" in exc.value.message
    # Read whole and replacing the target table: a WHERE would lose the rest.
    with pytest.raises(SnapshotRequestError, match="cannot be read with --where"):
        check_keyless(INFO, initial=False, where="who = 1", allowed=True)


def test_drop_rules_cover_transactions_beginning_before_the_read() -> None:
    rules = DropRules()
    assert not rules.drops(_change("d", "ev", Position("mysql-bin.000001", 10)))
    rules.set("d", "ev", Position("mysql-bin.000002", 500))
    assert rules.drops(_change("d", "ev", Position("mysql-bin.000001", 99_999)))   # an earlier file
    assert rules.drops(_change("d", "ev", Position("mysql-bin.000002", 499)))
    assert not rules.drops(_change("d", "ev", Position("mysql-bin.000002", 500)))  # begins at P: after the read
    assert not rules.drops(_change("d", "other", Position("mysql-bin.000001", 4)))
    assert not rules.drops(_change("x", "ev", Position("mysql-bin.000001", 4)))
    # A later read moves the rule forward; an older one (from another job) never back.
    rules.set("d", "ev", Position("mysql-bin.000003", 4))
    rules.set("d", "ev", Position("mysql-bin.000002", 900))
    assert rules.before[("d", "ev")] == Position("mysql-bin.000003", 4)


def test_abandon_envelope_starts_where_the_attempt_started() -> None:
    q = Position("mysql-bin.000002", 1234, "0-1-77")
    opened = {"tid": "snapshot:initial:abc", "begin": q.to_dict(), "shipped": 600, "frag": 2}
    begin, meta = abandon_meta(opened)
    assert begin == q and is_snapshot_tid(opened["tid"]) and not is_snapshot_tid("0-1-77")
    # The attempt's fragments cover up to (Q, 600); the abandon envelope
    # starts at (Q, 0): the applier sees it sent again and drops them.
    abandon = Span.of(Batch("p1", (), q, True, None, 0, 0, meta))
    fragment = Span.of(Batch("p1", (), q, False, None, 0, 0,
                             {"from": f"{q.file}:{q.pos}", "from_n": "300", "to": f"{q.file}:{q.pos}", "to_n": "600"}))
    assert abandon is not None and fragment is not None
    assert abandon.start < fragment.stop and abandon.start == ((2, q.file, q.pos), 0)


def test_keyless_read_rows_are_inserts_of_every_copy() -> None:
    q = Position("mysql-bin.000002", 1234)
    rows = [(1, "a"), (1, "a"), (2, None)]
    reads = [Change(Op.READ, "d", "ev", "snapshot:x", q, 0, INFO.schema, None, r) for r in rows]
    flush = build_flush(reads, AppliedState("p1", 3, q))
    (tf,) = flush.tables
    assert sorted(tf.inserts, key=repr) == sorted(rows, key=repr) and not tf.delete_rows
    assert truncate_sql("d", "e`v") == "TRUNCATE TABLE `d`.`e``v`"


@pytest.mark.parametrize("in_batch, rows", [(0, 1000), (299, 1000), (300, 1000), (100, 150), (0, 300), (250, 40)])
def test_a_keyless_reads_blocks_are_cut_where_fragments_end(in_batch: int, rows: int) -> None:
    """A block of the read (one ManyRows) is cut so that no fragment passes
    the read's fragment size (300 here: ``Batching.stream`` passes the larger
    of batch_max_events and a chunk's rows): the first piece fills the
    fragment open now."""
    from types import SimpleNamespace

    from cynomys.core.columnar import ManyRows
    from cynomys.producer.batching import Batching

    block = ManyRows(Op.READ, "d", "ev", "snapshot:x", Position("b.000001", 4), 0, INFO.schema,
                     images=tuple((i, "x") for i in range(rows)))
    fake = SimpleNamespace(txn_in_batch=in_batch)
    pieces = Batching._cut(fake, block, 300)  # type: ignore[arg-type]
    room = 300 - in_batch
    first = [] if rows <= room else [room] if room > 0 else []
    rest = rows if rows <= room else rows - sum(first)
    want = [rows] if rows <= room else first + [min(300, rest - at) for at in range(0, rest, 300)]
    assert [len(p.images) for p in pieces] == want
    assert [r for p in pieces for r in p.images] == list(block.images)
