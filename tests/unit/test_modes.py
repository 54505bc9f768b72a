"""Applier modes (cynomys/shape/modes.py, cynomys/applier/shaping.py) with
exactly-once, as pure logic: the real applier and envelopes between the
fakes of tests/fakes.py, with the faults of test_exactly_once.py (deaths
before each commit, redelivery, a producer re-sending fragments).  At every
commit the target must hold what the mode makes of the source up to the
position it records:

* ``history``: one changelog row per source change -- none lost, none
  twice -- numbered within its transaction, and replayed in order it
  rebuilds the source table;
* ``soft_delete``: every row the source ever committed, with its last
  image, flagged once deleted, and the commit time of its last change.

Plus the rewrites themselves and the schema-change policy on DDL."""
from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cynomys.core.config import Config, ShapeConfig, TargetRule
from cynomys.core.errors import TerminalError
from cynomys.core.model import Change, ColumnDef, Op, Position, Row, TableSchema
from cynomys.parser import ddl
from cynomys.shape import compile_rules
from cynomys.shape.modes import History, SoftDelete
from cynomys.shape.policy import policy_ops
from tests.fakes import (
    KEYED,
    KEYLESS,
    FakeProducer,
    FakeSource,
    FakeStore,
    FakeStream,
    Wire,
    cutter,
    fake_config,
    publish,
    random_workload,
    run_until_settled,
)

UTC = datetime.timezone.utc
SHAPE = ShapeConfig()
HISTORY = ShapeConfig(targets={"d.*": TargetRule(mode="history")})
SOFT = ShapeConfig(targets={"d.t": TargetRule(mode="soft_delete")})


def _ts(n: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(n, UTC)


# --------------------------------------------------------------------------
# Oracles: what the target must hold at a position
# --------------------------------------------------------------------------
def expected_history(source: FakeSource, at: Position, table: TableSchema) -> list[Row]:
    rows = []
    for t in source.txns:
        if t.end.sort_key() > at.sort_key():
            break
        seq = 0
        for c in t.changes:
            if c.schema is None or (c.database, c.table) != (table.database, table.table):
                continue
            image = c.before if c.op is Op.DELETE else c.after
            before = c.before if c.op in (Op.UPDATE, Op.DELETE) else (None,) * len(table.columns)
            assert image is not None and before is not None
            rows.append((c.op.value, _ts(c.commit_ts), c.tid, c.txn.file, c.txn.pos, seq) + image + before)
            seq += 1
    return rows


def expected_soft(source: FakeSource, at: Position) -> list[Row]:
    """Every row ever committed or written inside a transaction (the
    producer ships soft_delete tables unfolded, so batching never decides
    which stay): its last image, or the image its DELETE removed, flagged;
    an UPDATE moving the key flags the old one."""
    rows: dict[Any, Row] = {}
    for t in source.txns:
        if t.end.sort_key() > at.sort_key():
            break
        for c in t.changes:
            if c.schema is not KEYED:
                continue
            ts = _ts(c.commit_ts)
            if c.before is not None and (c.after is None or c.after[0] != c.before[0]):
                rows[c.before[0]] = c.before + (1, ts)
            if c.after is not None:
                rows[c.after[0]] = c.after + (0, ts)
    return list(rows.values())


def check(store: FakeStore, source: FakeSource, mode: str) -> None:
    state = store.states.get("p")
    at = state.position if state is not None else source.start
    if mode == "history":
        for table in (KEYED, KEYLESS):
            got, want = Counter(store.rows(table.database, table.table)), Counter(expected_history(source, at, table))
            assert got == want, f"{table.name} at {at}: extra {list((got - want).elements())[:3]}, " \
                                f"missing {list((want - got).elements())[:3]}"
    else:
        got, want = Counter(store.rows("d", "t")), Counter(expected_soft(source, at))
        assert got == want, f"at {at}: extra {list((got - want).elements())[:3]}, missing {list((want - got).elements())[:3]}"


def _config(tmp_path: Path, shape: ShapeConfig) -> Config:
    return dataclasses.replace(fake_config(tmp_path), shape=shape)


def _settle(cfg: Config, store: FakeStore, stream: FakeStream, wire: Wire, per_read: int) -> int:
    return run_until_settled(cfg, store, stream, wire, per_read=per_read, max_restarts=None)


def _producer(source: FakeSource, shape: ShapeConfig, seed: int, **kw: Any) -> FakeProducer:
    rules = compile_rules(shape)
    return FakeProducer(source, max_events=4, cut=cutter(seed, 0.3),
                        unfolded=lambda db, t: rules.target(db, t).mode != "upsert", **kw)


# --------------------------------------------------------------------------
# Exactly-once in each mode, through deaths and redelivery
# --------------------------------------------------------------------------
@pytest.mark.parametrize("mode,shape", [("history", HISTORY), ("soft_delete", SOFT)])
@pytest.mark.parametrize("seed", range(4))
def test_each_mode_lands_exactly_through_a_death_before_each_commit(tmp_path: Path, mode: str, shape: ShapeConfig,
                                                                      seed: int) -> None:
    source = random_workload(FakeSource(), seed, txns=25, big=9, big_every=6)
    sent = _producer(source, shape, seed).run()
    assert any(not s.batch.complete for s in sent), "no fragment in this workload"
    wire = Wire()
    clean, stream = FakeStore(), FakeStream()
    publish(stream, wire, sent)
    _settle(_config(tmp_path, shape), clean, stream, wire, per_read=2)
    check(clean, source, mode)
    assert clean.states["p"].position == source.end
    for k in range(1, clean.commits + 1):
        store = FakeStore(on_commit=lambda st: check(st, source, mode))
        store.crash_at, stream = k, FakeStream()
        publish(stream, wire, sent)
        assert _settle(_config(tmp_path / str(k), shape), store, stream, wire, per_read=2) == 1
        assert store.states["p"].position == source.end
        check(store, source, mode)


@pytest.mark.parametrize("mode,shape", [("history", HISTORY), ("soft_delete", SOFT)])
def test_envelopes_again_and_fragments_sent_again_change_nothing(tmp_path: Path, mode: str, shape: ShapeConfig) -> None:
    source = random_workload(FakeSource(), 7, txns=30, big=12, big_every=4)
    first = _producer(source, shape, 7).run()
    store, stream, wire = FakeStore(on_commit=lambda st: check(st, source, mode)), FakeStream(), Wire()
    cfg = _config(tmp_path, shape)
    upto = next(i for i in range(3 * len(first) // 4, len(first)) if first[i].batch.complete) + 1
    publish(stream, wire, first[:upto])
    _settle(cfg, store, stream, wire, per_read=2)
    publish(stream, wire, first[upto // 2:upto])  # delivered again
    # A producer rolled back into a transaction cut in fragments sends it again, batched otherwise.
    opens = [s for s in first[:upto] if s.state.open is not None]
    assert opens
    again = _producer(source, shape, 107, state=dataclasses.replace(opens[len(opens) // 2].state)).run()
    publish(stream, wire, again)
    _settle(cfg, store, stream, wire, per_read=3)
    assert store.states["p"].position == source.end
    check(store, source, mode)


def test_history_replayed_in_order_rebuilds_the_source_table(tmp_path: Path) -> None:
    source = random_workload(FakeSource(), 3, txns=40)
    wire, store, stream = Wire(), FakeStore(), FakeStream()
    publish(stream, wire, _producer(source, HISTORY, 3).run())
    _settle(_config(tmp_path, HISTORY), store, stream, wire, per_read=3)
    for table in (KEYED, KEYLESS):
        n = len(table.columns)
        log = sorted(store.rows(table.database, table.table), key=lambda r: (r[3], r[4], r[5]))
        rebuilt: Counter[Row] = Counter()
        for r in log:
            op, image, before = r[0], r[6:6 + n], r[6 + n:]
            if op in ("UPDATE", "DELETE"):
                rebuilt[before] -= 1
            if op != "DELETE":
                rebuilt[image] += 1
        assert +rebuilt == Counter(source.rows(table.database, table.table))


# --------------------------------------------------------------------------
# The rewrites and the policy, change by change
# --------------------------------------------------------------------------
def _c(op: Op, before: Row | None, after: Row | None, tid: str = "0-1-9") -> Change:
    return Change(op, "d", "t", tid, Position("b.000002", 300), 1_700_000_000, KEYED, before, after)


def test_soft_delete_rewrites() -> None:
    sd = SoftDelete(SHAPE)
    s = sd.schema(KEYED)
    at = _ts(1_700_000_000)
    assert s.column_names == ("id", "v", "_cdc_deleted", "_cdc_commit_time") and s.key == ("id",)
    assert [(c.op, c.after) for c in sd.rewrite(_c(Op.INSERT, None, (1, "a")), s)] == [(Op.READ, (1, "a", 0, at))]
    assert [(c.op, c.after) for c in sd.rewrite(_c(Op.DELETE, (1, "a"), None), s)] == [(Op.UPDATE, (1, "a", 1, at))]
    moved = sd.rewrite(_c(Op.UPDATE, (1, "a"), (2, "a")), s)
    assert [(c.op, c.after) for c in moved] == [(Op.UPDATE, (1, "a", 1, at)), (Op.READ, (2, "a", 0, at))]
    with pytest.raises(TerminalError, match="no primary key"):
        sd.schema(KEYLESS)


def test_history_rows() -> None:
    h = History(SHAPE)
    s = h.schema(KEYED)
    assert s.key == ("_cdc_txn", "_cdc_seq")
    assert s.column_names == ("_cdc_op", "_cdc_commit_time", "_cdc_txn", "_cdc_binlog_file", "_cdc_binlog_pos", "_cdc_seq", "id", "v",
                              "_cdc_before_id", "_cdc_before_v")
    row = h.rewrite(_c(Op.UPDATE, (1, "a"), (1, "b")), s, 3)
    assert row.op is Op.INSERT and row.after == ("UPDATE", _ts(1_700_000_000), "0-1-9", "b.000002", 300, 3, 1, "b", 1, "a")
    assert h.rewrite(_c(Op.DELETE, (1, "a"), None), s, 0).after[6:] == (1, "a", 1, "a")  # type: ignore[index]
    assert h.rewrite(_c(Op.INSERT, None, (1, "a")), s, 0).after[6:] == (1, "a", None, None)  # type: ignore[index]


def _policy(shape: ShapeConfig, sql: str, db: str = "d") -> list[ddl.DdlOp]:
    ops = ddl.parse_ddl(sql, db)
    return [op for op in policy_ops(compile_rules(shape), ops, sql, "b.000002:400") if not isinstance(op, ddl.NoOp)]


def test_schema_change_policies() -> None:
    alter = "ALTER TABLE t ADD COLUMN x INT, DROP COLUMN v"
    assert len(_policy(ShapeConfig(), alter)) == 2
    assert _policy(ShapeConfig(schema_changes="ignore_drops"), alter) == [ddl.AddColumn("d", "t", ColumnDef("x", "int"))]
    assert _policy(ShapeConfig(schema_changes="freeze"), alter) == []
    assert _policy(ShapeConfig(schema_changes="freeze"), "TRUNCATE t") == [ddl.Truncate("d", "t")]
    with pytest.raises(TerminalError, match="(?s)'stop'.*skip_ddl") as info:
        _policy(ShapeConfig(targets={"d.t": TargetRule(schema_changes="stop")}), alter)
    assert "b.000002:400" in str(info.value)
    assert _policy(ShapeConfig(targets={"d.t": TargetRule(schema_changes="stop")}), "CREATE TABLE u (a INT)")
    # ignore_drops: a rename keeps the old column, and CHANGE adds the new one with its type
    assert _policy(ShapeConfig(schema_changes="ignore_drops"), "ALTER TABLE t CHANGE v w BIGINT") == [
        ddl.AddColumn("d", "t", ColumnDef("w", "bigint"), if_not_exists=True)]
    assert _policy(ShapeConfig(schema_changes="ignore_drops"), "ALTER TABLE t RENAME COLUMN v TO w") == []


def test_ddl_on_history_and_soft_delete_tables() -> None:
    (create,) = _policy(HISTORY, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT)")
    assert isinstance(create, ddl.CreateTable) and create.key == ("_cdc_txn", "_cdc_seq") and len(create.columns) == 10
    assert _policy(HISTORY, "ALTER TABLE t ADD COLUMN x INT NOT NULL DEFAULT 5") == [
        ddl.AddColumn("d", "t", ColumnDef("x", "int")), ddl.AddColumn("d", "t", ColumnDef("_cdc_before_x", "int"))]
    assert _policy(HISTORY, "ALTER TABLE t DROP COLUMN v") == []
    for shape in (HISTORY, SOFT):
        for sql in ("TRUNCATE t", "DROP TABLE t"):
            with pytest.raises(TerminalError, match="skip_ddl"):
                _policy(shape, sql)
    # A keyless table's snapshot read starts with its own TRUNCATE: the changelog keeps its rows.
    assert policy_ops(compile_rules(HISTORY), ddl.parse_ddl("TRUNCATE TABLE t", "d"), "TRUNCATE TABLE t", "x:1",
                      snapshot=True) == [ddl.NoOp("a snapshot's rows are appended to the changelog as READ changes")]
    (soft,) = _policy(SOFT, "CREATE TABLE t (id INT PRIMARY KEY, v TEXT)")
    assert isinstance(soft, ddl.CreateTable) and soft.columns[-2:] == (
        ColumnDef("_cdc_deleted", "tinyint", False), ColumnDef("_cdc_commit_time", "timestamp(6)"))
