"""Exactly-once delivery as pure logic: the real applier (admit, buffer,
flush, acknowledgement) and the real envelopes (Avro, AES-GCM, RSA-OAEP,
Ed25519) between in-memory fakes of the source, the producer's batching,
the transport and the target (tests/fakes.py).

Every test checks the guarantee the daemons give, at every commit of the
target, not only at the end: the target holds exactly the source's tables as
of the position it records -- every transaction up to it once, nothing after
it, never part of a transaction.  The faults are the ones that break it on
real processes (tests/integration/test_applier_resend.py, test_redis_faults.py,
test_producer_crash.py run them there): an applier dying between any two
commits or deliveries, envelopes delivered again, a producer whose state
rolled back re-sending under old numbers with other batch boundaries,
fragments of large transactions.  Seeds vary the workload and the cuts.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cynomys.core.errors import SequenceGapError, TerminalError
from cynomys.core.model import Position
from tests.fakes import (
    Crash,
    FakeProducer,
    FakeSource,
    FakeStore,
    FakeStream,
    FakeTarget,
    ProducerState,
    Sent,
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
MANY_SEEDS = range(24)  # the rollback cases: a mutation of the admit stage fails only a few seeds


def _run_until_settled(tmp_path: Path, store: FakeStore, stream: FakeStream, wire: Wire, *,
                       per_read: int | None = None, max_restarts: int = 200) -> int:
    return run_until_settled(fake_config(tmp_path), store, stream, wire, per_read=per_read, max_restarts=max_restarts)


def _source(seed: int, **kw: int) -> FakeSource:
    return random_workload(FakeSource(), seed, **kw)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_whole_stream_lands_exactly(tmp_path: Path, seed: int) -> None:
    source = _source(seed)
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    sent = FakeProducer(source, max_events=4, cut=cutter(seed, 0.3)).run()
    publish(stream, wire, sent)
    _run_until_settled(tmp_path, store, stream, wire, per_read=3)
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_applier_dies_before_each_commit_in_turn(tmp_path: Path, seed: int) -> None:
    """A death inside every target transaction of the run, one per restart:
    what the dying transaction held comes again (unacknowledged) and lands
    once."""
    source = _source(seed)
    sent = FakeProducer(source, max_events=4, cut=cutter(seed, 0.3)).run()
    clean = FakeStore()
    stream, wire = FakeStream(), Wire()
    publish(stream, wire, sent)
    _run_until_settled(tmp_path, clean, stream, wire, per_read=2)
    for k in range(1, clean.commits + 1):
        store, stream = checked_store(source), FakeStream()
        store.crash_at = k
        publish(stream, wire, sent)
        assert _run_until_settled(tmp_path / str(k), store, stream, wire, per_read=2) == 1
        assert store.states["p"].position == source.end, f"crash at commit {k}"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_applier_dies_in_each_commit_on_the_worker_in_turn(tmp_path: Path, seed: int) -> None:
    """The same deaths with commits on the worker (applier/committer.py,
    ``overlap_commits``): the death comes back to the loop, nothing of the
    dying flush is acknowledged, and the restart lands it once.  Where a
    flush ends follows thread timing here, so a death at the k-th commit
    may not come (the run had fewer): at most one death, and exact."""
    source = _source(seed)
    sent = FakeProducer(source, max_events=4, cut=cutter(seed, 0.3)).run()
    wire = Wire()
    deaths = 0
    for k in range(1, 12):
        store, stream = checked_store(source), FakeStream()
        store.crash_at = k
        publish(stream, wire, sent)
        cfg = fake_config(tmp_path / str(k), overlap_commits=True)
        died = run_until_settled(cfg, store, stream, wire, per_read=2)
        assert died <= 1
        deaths += died
        assert store.states["p"].position == source.end, f"crash at commit {k}"
        assert_target_at(store, source)
    assert deaths >= 3, "the deaths did not come"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_applier_dies_between_deliveries(tmp_path: Path, seed: int) -> None:
    """Deaths at reads (whatever the buffer holds, fragments included, is
    lost with the process and delivered again)."""
    source = _source(seed, txns=40)
    sent = FakeProducer(source, max_events=3, cut=cutter(seed, 0.2)).run()
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, sent)
    for read in (2, 5, 9, 14, 20, 27, 35):
        stream.crash_at_read = read if stream.reads < read else None
        try:
            make_applier(fake_config(tmp_path), FakeTarget(fake_config(tmp_path), store), stream, wire,
                         per_read=1).run(until_idle_s=1e-6)
        except Crash:
            pass
    _run_until_settled(tmp_path, store, stream, wire, per_read=1)
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


@pytest.mark.parametrize("seed", SEEDS)
def test_envelopes_delivered_twice_are_applied_once(tmp_path: Path, seed: int) -> None:
    source = _source(seed)
    sent = FakeProducer(source, max_events=4, cut=cutter(seed, 0.5)).run()
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, sent)
    _run_until_settled(tmp_path, store, stream, wire, per_read=4)
    publish(stream, wire, sent[len(sent) // 2:])  # the transport delivers a tail again
    _run_until_settled(tmp_path, store, stream, wire, per_read=4)
    assert_target_at(store, source)
    assert store.states["p"].position == source.end


@pytest.mark.parametrize("seed", MANY_SEEDS)
def test_a_producer_rolled_back_resends_under_old_numbers_batched_otherwise(tmp_path: Path, seed: int) -> None:
    """The HA state in Redis lost its last second: the producer resumes
    from an older state and re-sends numbers the target already took, with
    other batch boundaries (another delay timer).  Admission by content
    applies exactly what the target lacks."""
    source = _source(seed, txns=40)
    first = FakeProducer(source, max_events=4, cut=cutter(seed, 0.4)).run()
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    # The applier takes everything up to three quarters of the stream (to
    # the end of a whole transaction: it waits for the rest of one cut short).
    upto = next(i for i in range(3 * len(first) // 4, len(first)) if first[i].batch.complete) + 1
    publish(stream, wire, first[:upto])
    _run_until_settled(tmp_path, store, stream, wire, per_read=2)
    # The producer's state rolls back to half way; only complete envelopes
    # leave a state to resume from without an open transaction.
    back = next(s for s in reversed(first[:len(first) // 2]) if s.state.open is None)
    again = FakeProducer(source, dataclasses.replace(back.state), max_events=4, cut=cutter(seed + 100, 0.7)).run()
    publish(stream, wire, again)
    _run_until_settled(tmp_path, store, stream, wire, per_read=3)
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


@pytest.mark.parametrize("seed", MANY_SEEDS)
def test_a_producer_rolled_back_into_a_transaction_cut_in_fragments(tmp_path: Path, seed: int) -> None:
    """As above, but the state it resumes from has a transaction open (its
    first fragments shipped): it re-sends from inside that transaction."""
    source = _source(seed, txns=40, big=12, big_every=4)
    first = FakeProducer(source, max_events=4, cut=cutter(seed, 0.4)).run()
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    upto = next(i for i in range(3 * len(first) // 4, len(first)) if first[i].batch.complete) + 1
    publish(stream, wire, first[:upto])
    _run_until_settled(tmp_path, store, stream, wire, per_read=2)
    opens = [s for s in first[:upto] if s.state.open is not None]
    assert opens, "no fragment in this workload"
    again = FakeProducer(source, dataclasses.replace(opens[len(opens) // 2].state), max_events=4,
                         cut=cutter(seed + 100, 0.7)).run()
    publish(stream, wire, again)
    _run_until_settled(tmp_path, store, stream, wire, per_read=3)
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_producer_restarting_inside_a_large_transaction_resumes_its_fragments(tmp_path: Path, seed: int) -> None:
    """The producer stops after each envelope and resumes from its state
    (open transaction included): the fragments continue where they were,
    and the target never holds part of a transaction."""
    source = _source(seed, txns=30, big=15, big_every=5)
    sent: list[Sent] = []
    state = ProducerState()
    while True:
        out = FakeProducer(source, state, max_events=4, cut=cutter(seed, 0.3)).run()
        if not out:
            break
        sent.append(out[0])  # only the first envelope got out before the stop
        state = out[0].state
    assert any(s.state.open is not None for s in sent), "no fragment in this workload"
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, sent)
    _run_until_settled(tmp_path, store, stream, wire, per_read=1)
    assert store.states["p"].position == source.end
    assert_target_at(store, source)


def test_a_gap_in_the_numbers_stops_the_applier(tmp_path: Path) -> None:
    source = _source(1)
    sent = FakeProducer(source, max_events=4, cut=cutter(1, 0.5)).run()
    assert len(sent) > 3
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, sent[:2] + sent[3:])  # envelope 3 was lost
    cfg = fake_config(tmp_path)
    with pytest.raises(SequenceGapError):
        make_applier(cfg, FakeTarget(cfg, store), stream, wire).run(until_idle_s=1e-6)
    held = store.states.get("p")
    assert held is None or held.seq <= 2  # nothing past the gap was applied
    assert_target_at(store, source)


def test_a_new_incarnation_past_what_the_target_holds_stops(tmp_path: Path) -> None:
    """A producer that lost its state starts anew at the source's end,
    while the target holds only the start: changes in between would be lost
    silently; the applier stops naming both places."""
    source = _source(2)
    sent = FakeProducer(source, max_events=4).run()
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    publish(stream, wire, sent[:1])
    _run_until_settled(tmp_path, store, stream, wire)
    with source.txn() as t:
        from tests.fakes import KEYED
        t.insert(KEYED, (10_000, "late"))
    fresh = FakeProducer(source, ProducerState(seq=sent[0].seq, incarnation="i2"),
                         start=source.txns[-1].begin).run()
    publish(stream, wire, fresh)
    cfg = fake_config(tmp_path)
    with pytest.raises(TerminalError, match="past what the target holds"):
        make_applier(cfg, FakeTarget(cfg, store), stream, wire).run(until_idle_s=1e-6)
    assert_target_at(store, source)


def test_a_new_incarnation_resuming_inside_what_the_target_holds_lands(tmp_path: Path) -> None:
    """The same producer after `--fresh-start` at the target's position
    (the operator's way out of the stop above): nothing lost, nothing twice."""
    source = _source(3)
    sent = FakeProducer(source, max_events=4, cut=cutter(3, 0.5)).run()
    store, stream, wire = checked_store(source), FakeStream(), Wire()
    half = next(i for i in range(len(sent) // 2, len(sent)) if sent[i].batch.complete) + 1
    publish(stream, wire, sent[:half])
    _run_until_settled(tmp_path, store, stream, wire)
    held: Position = store.states["p"].position
    fresh = FakeProducer(source, ProducerState(seq=sent[half - 1].seq, incarnation="i2"),
                         start=held, max_events=4).run()
    publish(stream, wire, fresh)
    _run_until_settled(tmp_path, store, stream, wire)
    assert store.states["p"].position == source.end and store.states["p"].incarnation == "i2"
    assert_target_at(store, source)
