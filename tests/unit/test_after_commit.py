"""The target's after-commit work (Spark: maintenance of an overdue table)
runs after the flush is counted readable, never inside it: the freshness
metric and the flush time are the moment rows became readable, not that
moment plus a compaction (base.Target.after_commit)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cynomys.applier.loop import Applier
from cynomys.applier.targets.base import Flush
from tests.fakes import (
    PRODUCER,
    FakeProducer,
    FakeSource,
    FakeStore,
    FakeStream,
    FakeTarget,
    Wire,
    assert_target_at,
    checked_store,
    cutter,
    fake_config,
    make_applier,
    publish,
    random_workload,
)


class _Recording(FakeTarget):
    def __init__(self, *args: Any, calls: list[str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.calls = calls

    def apply(self, flush: Flush) -> None:
        self.calls.append("apply")
        super().apply(flush)

    def after_commit(self) -> None:
        self.calls.append("after_commit")


@pytest.mark.parametrize("overlap", [False, True])
def test_after_commit_follows_each_flush_once_it_was_counted(tmp_path: Path, overlap: bool) -> None:
    source = random_workload(FakeSource(), 3, txns=20, big=3, big_every=50)
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, FakeProducer(source, max_events=4, cut=cutter(3, 0.5)).run())
    cfg = fake_config(tmp_path, overlap_commits=overlap)  # on: committed on the worker (applier/committer.py)
    calls: list[str] = []
    app = make_applier(cfg, _Recording(cfg, store, calls=calls), stream, wire, per_read=2)
    counted = app.monitor.flushed

    def flushed(*args: Any, **kw: Any) -> None:
        calls.append("counted")
        counted(*args, **kw)

    app.monitor.flushed = flushed  # type: ignore[method-assign]
    app.run(until_idle_s=1e-6)
    assert_target_at(store, source)
    flushes = calls.count("apply")
    assert flushes >= 2, calls
    # Every flush: applied, counted readable, then the after-commit work.
    assert calls == ["apply", "counted", "after_commit"] * flushes, calls


class _Slow(FakeTarget):
    def apply(self, flush: Flush) -> None:
        time.sleep(0.01)  # the loop takes the next envelopes meanwhile (overlap on)
        super().apply(flush)


def _slow_applier(tmp_path: Path, seed: int, overlap: bool) -> tuple[Applier, FakeStore, FakeSource]:
    """An applier over 80 transactions, one envelope a read, its commits slowed."""
    source = random_workload(FakeSource(), seed, txns=80, big=3, big_every=50)
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, FakeProducer(source, max_events=4, cut=cutter(seed, 0.3)).run())
    cfg = fake_config(tmp_path, overlap_commits=overlap)
    return make_applier(cfg, _Slow(cfg, store), stream, wire, per_read=1), store, source


def _counts(tmp_path: Path, overlap: bool) -> list[tuple[int, int]]:
    """(transactions counted readable so far, transactions the target
    holds) at each flush's count."""
    app, store, source = _slow_applier(tmp_path, 5, overlap)
    counted, seen = app.monitor.flushed, []

    def flushed(*args: Any, **kw: Any) -> None:
        counted(*args, **kw)
        held = app.inner.applied(PRODUCER)
        assert held is not None
        seen.append((app.monitor.freshness.summary()["transactions"], source.index_at(held.position)))

    app.monitor.flushed = flushed  # type: ignore[method-assign]
    app.run(until_idle_s=1e-6)
    assert_target_at(store, source)
    return seen


def test_a_flush_counts_readable_only_the_transactions_it_committed(tmp_path: Path) -> None:
    """Freshness counts a transaction readable at the commit of the flush
    that holds it: with commits on the worker, what the loop takes while a
    flush commits is the next flush's, not counted at this one's commit.
    At every count, the transactions counted so far are at most those the
    target holds; in the end, as many as with commits in the loop."""
    in_loop, overlapped = _counts(tmp_path / "loop", False), _counts(tmp_path / "worker", True)
    for seen in (in_loop, overlapped):
        assert len(seen) >= 3, seen
        assert all(readable <= held for readable, held in seen), seen
    assert overlapped[-1][0] == in_loop[-1][0] > 0, (overlapped[-1], in_loop[-1])


def test_the_applied_position_shown_is_one_the_target_holds(tmp_path: Path) -> None:
    """The loop's turn reports what the target holds (metrics, health):
    with a flush committing on the worker, the position before it, not
    the one the admit stage already counts."""
    app, store, source = _slow_applier(tmp_path, 7, True)
    turn, shown = app.monitor.turn, []

    def watched(t: Any) -> None:
        held = app.inner.applied(PRODUCER)  # only moves forward: read after the turn was made
        shown.append((t.applied_position, held.position if held else None))
        turn(t)

    app.monitor.turn = watched  # type: ignore[method-assign]
    app.run(until_idle_s=1e-6)
    assert_target_at(store, source)
    positions = [(p, h) for p, h in shown if p is not None]
    assert len({p for p, _ in positions}) >= 3, shown
    assert all(h is not None and p.sort_key() <= h.sort_key() for p, h in positions), shown
