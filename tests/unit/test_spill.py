"""A source transaction applied in parts (applier/spill.py), on the fakes.

The applier's buffer budget is set so low that every fragment of a large
transaction is applied into the open target transaction as soon as it is
taken (several parts per transaction); the whole transactions buffered
before it are committed first.  The guarantee is checked at every commit of
the target, as in test_exactly_once.py: the target holds exactly the
source as of the position it records, never part of a transaction.  Here
the faults are those of the open transaction: a death inside it (before
each part, before each commit), deliveries lost with the process, a
producer sending the large transaction again from its first fragment (the
parts applied of the earlier attempt are rolled back), a DDL right after it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cynomys.core.model import ColumnDef, TableSchema
from tests.fakes import (
    KEYED,
    KEYLESS,
    Crash,
    FakeProducer,
    FakeSource,
    FakeStore,
    FakeStream,
    FakeTarget,
    ProducerState,
    Wire,
    assert_target_at,
    checked_store,
    cutter,
    fake_config,
    make_applier,
    publish,
    random_workload,
    run_until_settled,
)

SEEDS = range(6)
TINY = 1  # bytes: every envelope of an open transaction is a part


def _settle(tmp_path: Path, store: FakeStore, stream: FakeStream, wire: Wire, *, per_read: int | None = None,
            budget: int | None = TINY, max_restarts: int = 200) -> int:
    """Applier processes until the stream is settled; returns the deaths."""
    return run_until_settled(fake_config(tmp_path), store, stream, wire, per_read=per_read, budget=budget,
                             max_restarts=max_restarts)


def _big_source(seed: int) -> FakeSource:
    return random_workload(FakeSource(), seed, txns=30, big=15, big_every=4)


@pytest.mark.parametrize("seed", SEEDS)
def test_large_transactions_land_in_parts_exactly(tmp_path: Path, seed: int) -> None:
    source = _big_source(seed)
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, FakeProducer(source, max_events=4, cut=cutter(seed, 0.3)).run())
    _settle(tmp_path, store, stream, wire, per_read=3)
    assert store.parts >= 2 * 7, "every large transaction is applied in several parts"
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_same_stream_lands_alike_with_and_without_parts(tmp_path: Path, seed: int) -> None:
    """Parts change how the target gets there, never where it ends: every
    commit records the same states with a large budget as with a tiny one
    (the sealed whole transactions before a large one commit on their own)."""
    source = _big_source(seed)
    sent = FakeProducer(source, max_events=4, cut=cutter(seed, 0.3)).run()
    whole, parts, wire = checked_store(source), checked_store(source), Wire()
    for store, budget in ((whole, None), (parts, TINY)):
        stream = FakeStream()
        publish(stream, wire, sent)
        _settle(tmp_path / str(budget), store, stream, wire, per_read=2, budget=budget)
    assert whole.parts == 0 and parts.parts > 0
    assert whole.tables == parts.tables and whole.states == parts.states


@pytest.mark.parametrize("seed", [1, 2, 5])  # a run per part and per commit: the fast lane keeps three seeds
def test_the_applier_dies_inside_the_open_transaction_at_every_point(tmp_path: Path, seed: int) -> None:
    """A death before each part and before each commit, one per run: the
    open transaction is lost with the process (nothing of it was
    visible), its envelopes come again and land once."""
    source = _big_source(seed)
    sent = FakeProducer(source, max_events=4, cut=cutter(seed, 0.3)).run()
    wire = Wire()
    clean, stream = FakeStore(), FakeStream()
    publish(stream, wire, sent)
    _settle(tmp_path, clean, stream, wire, per_read=2)
    points = [("part", k) for k in range(1, clean.parts + 1)] + [("commit", k) for k in range(1, clean.commits + 1)]
    for kind, k in points:
        store, stream = checked_store(source), FakeStream()
        if kind == "part":
            store.crash_at_part = k
        else:
            store.crash_at = k
        publish(stream, wire, sent)
        assert _settle(tmp_path / f"{kind}{k}", store, stream, wire, per_read=2) == 1
        assert store.states["p"].position == source.end, f"death at {kind} {k}"
        assert_target_at(store, source)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_applier_dies_between_deliveries_with_parts_open(tmp_path: Path, seed: int) -> None:
    source = _big_source(seed)
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, FakeProducer(source, max_events=3, cut=cutter(seed, 0.2)).run())
    cfg = fake_config(tmp_path)
    for read in (3, 6, 10, 15, 21, 28):
        stream.crash_at_read = read if stream.reads < read else None
        try:
            make_applier(cfg, FakeTarget(cfg, store), stream, wire, per_read=1, budget=TINY).run(until_idle_s=1e-6)
        except Crash:
            pass
    _settle(tmp_path, store, stream, wire, per_read=1)
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_producer_restarting_a_large_transaction_from_its_start_rolls_the_parts_back(
        tmp_path: Path, seed: int) -> None:
    """The producer dies inside a large transaction without keeping its
    open state, and sends it again from its first fragment under the next
    numbers: the parts of the earlier attempt already applied in the open
    target transaction are rolled back, the new attempt lands once."""
    source = _big_source(seed)
    # Batches end at every commit here, so a large transaction starts an
    # envelope of its own: one that also carries the transactions before
    # it cannot be told apart from them when sent again (_check_overlap).
    first = FakeProducer(source, max_events=4, cut=lambda: True).run()
    # Cut the stream inside a large transaction, after its third fragment.
    frag = next(i for i, s in enumerate(first) if s.batch.meta.get("frag") == "2" and not s.batch.complete)
    shipped = first[:frag + 1]
    resume = shipped[-1].state
    again = FakeProducer(source, ProducerState(seq=resume.seq, checkpoint=resume.checkpoint, open=None,
                                               incarnation=resume.incarnation),
                         max_events=4, cut=cutter(seed + 50, 0.3)).run()
    assert again[0].batch.meta.get("frag") == "0", "the transaction is sent again from its start"
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, shipped + again)
    _settle(tmp_path, store, stream, wire, per_read=2)
    assert store.rollbacks >= 1, "the parts of the earlier attempt were applied, then rolled back"
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


WIDE = TableSchema("d", "t", (*KEYED.columns, ColumnDef("w", "int(11)")), ("id",))


@pytest.mark.parametrize("per_read", [1, 2, 5])
def test_a_ddl_right_after_a_large_transaction(tmp_path: Path, per_read: int) -> None:
    """The DDL commits the open transaction first (at its own start), then
    runs alone; the rows after it have the new column."""
    source = FakeSource()
    with source.txn() as t:
        for k in range(1, 11):
            t.insert(KEYED, (k, f"a{k}"))
        t.insert(KEYLESS, (1, "x"))
    with source.txn() as t:  # the large one: every row changed, some twice, keyless ones too
        for k in range(1, 11):
            t.update(KEYED, (k, f"a{k}"), (k, f"b{k}"))
        for k in range(1, 11, 3):
            t.update(KEYED, (k, f"b{k}"), (k, f"c{k}"))
        t.delete(KEYED, (5, "b5"))
        t.insert(KEYED, (5, "again"))
        t.update(KEYLESS, (1, "x"), (2, "y"))
        t.insert(KEYLESS, (2, "y"))
        t.delete(KEYLESS, (2, "y"))
    with source.txn() as t:
        t.ddl(WIDE, "ALTER TABLE d.t ADD COLUMN w int(11)")
    with source.txn() as t:
        t.insert(WIDE, (11, "wide", 7))
        t.update(WIDE, (1, "c1", None), (1, "d1", 8))
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, FakeProducer(source, max_events=4).run())
    _settle(tmp_path, store, stream, wire, per_read=per_read)
    assert store.parts >= 3
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


def test_column_wise_runs_are_costed_at_their_own_expansion() -> None:
    """An envelope of runs only (a snapshot chunk) keeps its values in Arrow
    arrays: x RUN_EXPANSION of its payload, not EXPANSION (which ended Spark
    flushes of an initial load at a third of the rows memory allowed)."""
    from cynomys.applier import spill
    from cynomys.core.columnar import InsertRun
    from cynomys.core.model import Change, Op, Position

    schema = TableSchema("d", "t", (ColumnDef("id", "int"),), ("id",))
    run = InsertRun(Op.READ, "d", "t", "tid", Position("f", 4), 0, schema, count=5000)
    row = Change(Op.INSERT, "d", "t", "tid", Position("f", 4), 0, schema, None, (1,))
    assert spill.cost(1000, [run, run]) == 1000 * spill.RUN_EXPANSION
    assert spill.cost(1000, [run, row]) == spill.cost(1000, [row]) == spill.cost(1000) == 1000 * spill.EXPANSION
    assert spill.RUN_EXPANSION < spill.EXPANSION


def test_a_transport_read_brings_in_a_bounded_share_of_the_memory(tmp_path: Path) -> None:
    """A read asks for READ_COUNT envelopes, fewer when they are large (a
    read of 200 snapshot envelopes took the applier 90 MB above its level):
    at most READ_SHARE of max_memory_mb, judged by the largest recent size;
    the first read, before any size is known, asks for FIRST_READ_COUNT."""
    from cynomys.applier import loop, spill

    assert spill.read_count(500, 0, 200) == 200
    assert spill.read_count(500, 2_000, 200) == 200  # OLTP envelopes: the whole count
    assert spill.read_count(500, 200_000, 200) == int(500 * 1024 * 1024 * spill.READ_SHARE / 200_000) < 200
    assert spill.read_count(500, 1 << 30, 200) == 1
    source = random_workload(FakeSource(), 1, txns=300, big=15, big_every=4)
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, FakeProducer(source, max_events=4).run())
    largest = max(len(e) for _, e in stream.entries)
    mb = 1  # the smallest bound: ~45 of the fakes' envelopes (<1 KB) a read
    per_read = spill.read_count(mb, largest, loop.READ_COUNT)
    assert 1 < per_read < len(stream.entries) // 3, "the stream must take several reads for this test to say anything"
    run_until_settled(fake_config(tmp_path, max_memory_mb=mb), store, stream, wire)
    assert stream.counts[0] == loop.FIRST_READ_COUNT
    assert max(stream.counts[1:]) <= spill.read_count(mb, min(len(e) for _, e in stream.entries), loop.READ_COUNT)
    assert min(stream.counts[1:]) >= per_read
    assert store.states["p"].position == source.end
    assert_target_at(store, source)
