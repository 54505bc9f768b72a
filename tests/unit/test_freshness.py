"""Freshness (cynomys/metrics/freshness.py): commit-time estimates from the
binlog's whole seconds and the envelopes' seal times, clock offsets,
per-transaction weighting, the exported histogram and its quantiles."""
from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cynomys.cli.status import freshness_text
from cynomys.core.config import load_config
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.metrics import ApplierMonitor, ProducerMonitor
from cynomys.metrics.clock import RETRY_S, ApplierClock, Offset, ProducerClock, ProducerClocks, measure, skew_of
from cynomys.metrics.freshness import (
    FRESHNESS_BUCKETS,
    CommitEstimator,
    Freshness,
    Skew,
    WeightedHistogram,
    bucket_quantile,
    weighted_quantiles,
)

SCHEMA = TableSchema("d", "t", (ColumnDef("id", "int", False),), ("id",))
T0 = 1_800_000_000  # a source second


def _change(tid: int, second: int, op: Op = Op.INSERT, key: int | None = None) -> Change:
    txn = Position("bin.000001", 1000 + tid)
    return Change(op, "d", "t", f"gtid-{tid}", txn, second, SCHEMA, None, (key if key is not None else tid,))


def _batch(changes: list[Change], sealed: float, *, complete: bool = True, producer: str = "p1") -> Batch:
    return Batch(producer, tuple(changes), Position("bin.000001", 9999), complete, None, int(sealed * 1e6),
                 max(c.commit_ts for c in changes) if changes else 0)


def _times(est: CommitEstimator, batch: Batch, skew: Skew) -> list[tuple[float, int]]:
    """The estimates without their tables (these tests' changes are all on d.t)."""
    got = est.estimate(batch, skew)
    assert all(where == frozenset({"d.t"}) for _, _, where in got), got
    return [(t, n) for t, n, _ in got]


def test_estimate_is_the_middle_of_what_the_second_and_the_seals_leave() -> None:
    est = CommitEstimator()
    # Sealed 0.3 s into the commit second: the commit lies in [T0, T0 + 0.3].
    assert _times(est, _batch([_change(1, T0)], T0 + 0.3), Skew()) == [(pytest.approx(T0 + 0.15), 1)]
    # The next envelope, sealed at +0.5: its transactions committed after the previous seal.
    assert _times(est, _batch([_change(2, T0), _change(3, T0)], T0 + 0.5), Skew()) == \
        [(pytest.approx(T0 + 0.4), 2)]
    # Sealed long after its second (the producer was behind): the second alone.
    got = _times(est, _batch([_change(4, T0 + 1), _change(5, T0 + 2)], T0 + 9.0), Skew())
    assert sorted(got) == [(pytest.approx(T0 + 1.5), 1), (pytest.approx(T0 + 2.5), 1)]


def test_estimate_per_producer_and_offsets() -> None:
    est = CommitEstimator()
    # The source clock 2 s ahead of the applier, the producer host 0.5 s behind it.
    skew = Skew(source_s=2.0, producer_s=-0.5, measured_at=1.0)
    # Source second T0 is applier time T0 - 2; sealed at producer time T0 - 2.3, applier time T0 - 1.8.
    assert _times(est, _batch([_change(1, T0)], T0 - 2.3), skew) == [(pytest.approx(T0 - 1.9), 1)]
    # Another producer's envelopes do not bound this one's.
    _times(est, _batch([_change(2, T0 + 1)], T0 + 1.9, producer="p2"), Skew())
    assert _times(est, _batch([_change(3, T0 + 1)], T0 + 1.2), Skew()) == [(pytest.approx(T0 + 1.1), 1)]


def test_bounds_that_disagree_fall_back_to_the_second() -> None:
    # Sealed "before" its commit second: a clock stepped since it was measured.
    assert _times(CommitEstimator(), _batch([_change(1, T0)], T0 - 3.0), Skew()) == [(pytest.approx(T0 + 0.5), 1)]


def test_transactions_counted_once_and_only_live_changes() -> None:
    est = CommitEstimator()
    # Two changes of one transaction, a snapshot read and a DDL: one transaction.
    changes = [_change(1, T0, key=1), _change(1, T0, key=2), _change(7, T0, Op.READ), _change(8, T0, Op.DDL)]
    assert _times(est, _batch(changes, T0 + 0.5), Skew()) == [(pytest.approx(T0 + 0.25), 1)]
    # An envelope ending inside transaction 3 (fragments): 2 counts here, 3 where it ends.
    first = _times(est, _batch([_change(2, T0 + 1), _change(3, T0 + 1, key=30)], T0 + 1.4, complete=False), Skew())
    assert [n for _, n in first] == [1]
    rest = _times(est, _batch([_change(3, T0 + 1, key=31), _change(3, T0 + 1, key=32)], T0 + 1.6), Skew())
    assert [n for _, n in rest] == [1]


def test_flush_observes_each_transaction_with_its_commit() -> None:
    reg = CollectorRegistry()
    f = Freshness(reg)
    f.taken(_batch([_change(i, T0) for i in range(900)], T0 + 0.2))     # 900 small transactions
    big = [_change(1000, T0, key=k) for k in range(1000, 51_000)]       # one of 50,000 rows
    f.taken(_batch(big, T0 + 0.6))
    f.flushed(T0 + 1.6)
    fam = {s.name: s.value for m in text_string_to_metric_families(generate_latest(reg).decode())
           for s in m.samples if not s.labels.get("le")}
    assert fam["cynomys_applier_freshness_seconds_count"] == 901  # per transaction, not per row
    assert fam["cynomys_applier_freshness_seconds_sum"] == pytest.approx(900 * 1.5 + 1.2)
    assert fam["cynomys_applier_freshness_last_flush_seconds"] == pytest.approx(1.2)
    s = f.summary()
    assert s["transactions"] == 901 and s["p50_s"] == pytest.approx(1.5) and s["max_s"] == pytest.approx(1.5)
    # Nothing taken since: the next flush observes nothing.
    f.flushed(T0 + 5)
    assert f.summary()["transactions"] == 901


def test_tables_readable_one_by_one_count_each_transaction_at_its_last_table() -> None:
    """Spark/Iceberg commits table by table: a transaction is readable when
    the last of its tables is; a table the target did not name is readable
    at the flush's end."""
    other = TableSchema("d", "u", (ColumnDef("id", "int", False),), ("id",))

    def on(table: str, tid: int) -> Change:
        c = _change(tid, T0)
        return c if table == "t" else Change(c.op, "d", table, c.tid, c.txn, c.commit_ts, other, None, c.after)

    f = Freshness(CollectorRegistry())
    # Sealed at T0 + 0.2: every transaction committed at T0 + 0.1 (estimate).
    f.taken(_batch([on("t", 1), on("t", 2), on("u", 3), on("t", 4), on("u", 4), on("v", 5)], T0 + 0.2))
    f.flushed(T0 + 3.0, {"d.t": T0 + 1.0, "d.u": T0 + 2.0})
    ages = sorted((round(age, 3), n) for _, age, n in f._recent)
    # t alone (1, 2) at 1.0; u alone (3) and t+u (4) at 2.0; v, unnamed, at the flush's end 3.0.
    assert ages == [(0.9, 2), (1.9, 1), (1.9, 1), (2.9, 1)]
    f.taken(_batch([on("t", 6)], T0 + 0.2))
    f.flushed(T0 + 3.0)  # no per-table moments: the flush's end for all
    assert [round(age, 3) for _, age, _ in f._recent][-1] == 2.9


def test_a_flush_counts_what_was_handed_to_it_not_what_came_after() -> None:
    """``detach`` at the hand-over: transactions taken while the flush
    commits wait for the next flush; a part (``pending=[]``) counts none."""
    f = Freshness(CollectorRegistry())
    f.taken(_batch([_change(1, T0), _change(2, T0)], T0 + 0.2))
    handed = f.detach()
    f.taken(_batch([_change(3, T0 + 1)], T0 + 1.2))
    f.flushed(T0 + 2.0, pending=[])
    assert f.summary()["transactions"] == 0
    f.flushed(T0 + 2.0, pending=handed)
    assert f.summary()["transactions"] == 2
    f.flushed(T0 + 3.0)
    assert f.summary()["transactions"] == 3
    assert [(round(age, 3), n) for _, age, n in f._recent] == [(1.9, 2), (1.9, 1)]


def test_a_failed_loop_forgets_what_it_took() -> None:
    f = Freshness(CollectorRegistry())
    f.taken(_batch([_change(1, T0)], T0 + 0.2))
    f.dropped()
    f.flushed(T0 + 3)
    assert f.summary()["transactions"] == 0


def test_histogram_buckets_and_quantiles_follow_prometheus() -> None:
    reg = CollectorRegistry()
    h = WeightedHistogram("x_seconds", "test", (1.0, 2.0, 4.0), reg)
    for v, w in ((0.5, 2), (1.0, 1), (1.5, 3), (3.0, 4), (9.0, 10)):
        h.observe(v, w)
    assert h.cumulative() == [(1.0, 3), (2.0, 6), (4.0, 10), (math.inf, 20)]
    buckets = {s.labels["le"]: s.value for m in text_string_to_metric_families(generate_latest(reg).decode())
               for s in m.samples if s.name == "x_seconds_bucket"}
    assert buckets == {"1.0": 3, "2.0": 6, "4.0": 10, "+Inf": 20}
    # histogram_quantile: rank 0.25 * 20 = 5 lies in (1, 2], 2 of its 3: 1 + 2/3.
    assert bucket_quantile(0.25, h.cumulative()) == pytest.approx(1 + 2 / 3)
    assert bucket_quantile(0.99, h.cumulative()) == 4.0  # in +Inf: the highest bound
    assert bucket_quantile(0.5, [(1.0, 0), (math.inf, 0)]) is None


def test_bucket_quantiles_agree_with_exact_ones_within_a_few_percent() -> None:
    """The buckets are fine enough where freshness lives (0.3-8 s) for the
    Prometheus quantile to be within 5% of the exact one."""
    rnd = random.Random(7)
    for centre in (0.6, 1.1, 1.7, 4.3, 7.4):
        h = WeightedHistogram("f", "test", FRESHNESS_BUCKETS, CollectorRegistry())
        values = [max(0.01, rnd.gauss(centre, centre / 4)) for _ in range(5000)]
        for v in values:
            h.observe(v)
        exact = weighted_quantiles([(v, 1) for v in values], (0.5, 0.99))
        for q, want in zip((0.5, 0.99), exact):
            got = bucket_quantile(q, h.cumulative())
            assert want is not None and got is not None
            assert abs(got - want) / want < 0.05, (centre, q, got, want)


def test_weighted_quantiles() -> None:
    assert weighted_quantiles([(3.0, 1), (1.0, 98), (2.0, 1)], (0.5, 0.99, 1.0)) == [1.0, 2.0, 3.0]
    assert weighted_quantiles([(3.0, 1), (1.0, 98), (2.0, 1)], (0.995,)) == [3.0]
    assert weighted_quantiles([], (0.5,)) == [None]


def test_partitioned_applier_labels_freshness(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(f'[applier]\nstate_dir = "{tmp_path}"\npartitions = 2\npartition = 1\n')
    mon = ApplierMonitor(load_config(cfg_file, env={}))
    mon.taken(_batch([_change(1, T0)], T0 + 0.2))
    mon.flushed([], 0.01)
    samples = [s for m in text_string_to_metric_families(generate_latest(mon.registry).decode())
               for s in m.samples if s.name == "cynomys_applier_freshness_seconds_count"]
    assert [(s.labels, s.value) for s in samples] == [({"partition": "1"}, 1.0)]


def test_clock_measure_takes_the_shortest_round_trip() -> None:
    # The remote clock is 3 s ahead; round trips of 40, 2 and 20 ms, the
    # remote reading taken at different points inside each.
    local = iter([0.0, 0.04, 1.0, 1.002, 2.0, 2.02])
    remote = iter([3.035, 4.0012, 5.001])
    off = measure(lambda: next(remote), lambda: next(local), rounds=3)
    assert off.seconds == pytest.approx(3.0002) and off.uncertainty_s == pytest.approx(0.001)


def test_skew_from_the_producers_record() -> None:
    # Reference (Redis) 10 s ahead of the applier; the source 1.5 s behind the
    # reference, the producer host 0.25 s ahead of it.
    clocks = ProducerClocks(source_minus_ref=-1.5, producer_minus_ref=0.25, uncertainty_s=0.002, measured_at=990.0)
    skew = skew_of(clocks, Offset(10.0, 0.001), reference_now=1010.0, now=1000.0)
    assert skew.source_s == pytest.approx(8.5) and skew.producer_s == pytest.approx(10.25)
    assert skew.uncertainty_s == pytest.approx(0.003)
    assert skew.source_measured_at == pytest.approx(980.0)
    assert ProducerClocks.from_json(clocks.to_json()) == clocks


def test_status_line() -> None:
    f = Freshness(CollectorRegistry())
    f.set_skew(Skew(source_s=0.25, producer_s=-0.004, uncertainty_s=0.001, measured_at=1.0))
    f.taken(_batch([_change(1, T0)], T0 + 0.2))
    f.flushed(T0 + 1.0)
    line = freshness_text(f.summary())
    assert line.startswith("p50 "), line
    assert "(1 transactions); last flush " in line and "source +0.250s, producer -0.004s" in line, line
    assert "no transaction applied" in freshness_text(Freshness(CollectorRegistry()).summary())


class MemoryBoard:
    """The reference clock ``ahead_s`` ahead of this host's, and the record, in memory."""

    def __init__(self, ahead_s: float) -> None:
        self.ahead_s = ahead_s
        self.record: ProducerClocks | None = None
        self.published = 0

    def reference_now(self) -> float:
        return time.time() + self.ahead_s

    def publish(self, clocks: ProducerClocks) -> None:
        self.record = clocks
        self.published += 1

    def read(self) -> ProducerClocks | None:
        return self.record

    def close(self) -> None:
        return None


def test_producer_clock_publishes_only_while_leading_and_the_applier_combines(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(f'[producer]\nstate_dir = "{tmp_path}"\nha = true\n[applier]\nstate_dir = "{tmp_path}"\n')
    cfg = load_config(cfg_file, env={})
    board = MemoryBoard(ahead_s=5.0)
    pmon = ProducerMonitor(cfg)
    # The source 2 s ahead of this host, Redis 5 s ahead.
    clock = ProducerClock(cfg, pmon, board, source_now=lambda: time.time() + 2.0)
    assert clock.step() == RETRY_S and board.record is None  # an HA standby: measures, publishes nothing
    gauges = {s.labels["clock"]: s.value for m in text_string_to_metric_families(generate_latest(pmon.registry).decode())
              for s in m.samples if s.name == "cynomys_producer_clock_skew_seconds"}
    assert gauges == {"source": pytest.approx(2.0, abs=0.01), "reference": pytest.approx(5.0, abs=0.01)}
    pmon.leading(7)
    assert clock.step() > 60 and board.published == 1  # takes over: publishes at once, then every few minutes
    assert board.record is not None
    assert board.record.source_minus_ref == pytest.approx(-3.0, abs=0.01)
    assert board.record.producer_minus_ref == pytest.approx(-5.0, abs=0.01)
    clock.step()
    assert board.published == 1  # nothing new measured: nothing published again
    amon = ApplierMonitor(cfg)
    ApplierClock(cfg, amon, board).step()
    skew = amon.freshness.skew
    assert skew.source_s == pytest.approx(2.0, abs=0.01) and skew.producer_s == pytest.approx(0.0, abs=0.01)
    assert skew.measured_at > 0


def test_applier_clock_waits_for_the_producers_record(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(f'[applier]\nstate_dir = "{tmp_path}"\n')
    amon = ApplierMonitor(load_config(cfg_file, env={}))
    assert ApplierClock(amon.cfg, amon, MemoryBoard(0.0)).step() == RETRY_S
    assert amon.freshness.skew.measured_at == 0.0  # clocks taken as equal until measured


def test_lag_is_compared_on_the_source_clock(tmp_path: Path) -> None:
    from cynomys.metrics.events import ApplierTurn

    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(f'[applier]\nstate_dir = "{tmp_path}"\n')
    mon = ApplierMonitor(load_config(cfg_file, env={}))

    def lag(applied_commit_ts: int) -> float:
        mon.turn(ApplierTurn(1, 5, {}, {}, 10, 1, Position("bin.000001", 4), applied_commit_ts))
        return next(s.value for m in text_string_to_metric_families(generate_latest(mon.registry).decode())
                    for s in m.samples if s.name == "cynomys_applier_lag_seconds")

    # The source's clock runs 30 s ahead; its last applied commit was 5 s ago by that clock.
    commit = int(time.time()) + 30 - 5
    assert lag(commit) == 0.0  # unmeasured clocks: taken as equal, the commit looks to be in the future
    mon.clock(Skew(source_s=30.0, measured_at=time.time()))
    assert lag(commit) == pytest.approx(5.0, abs=1.1)
