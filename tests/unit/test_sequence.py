from __future__ import annotations

import pytest

from cynomys.core.errors import SequenceGapError, TerminalError
from cynomys.transport.sequence import SequenceTracker


def test_first_contact_accepts_anything() -> None:
    t = SequenceTracker()
    assert t.hwm("p1") is None
    assert t.classify("p1", 41) == "new"
    t.advance("p1", 41)
    assert t.hwm("p1") == 41


def test_next_duplicate_and_gap() -> None:
    t = SequenceTracker({"producer-1": 40})
    assert t.classify("producer-1", 41) == "new"
    assert t.classify("producer-1", 40) == "duplicate"
    assert t.classify("producer-1", 1) == "duplicate"
    with pytest.raises(SequenceGapError) as ei:
        t.classify("producer-1", 58)
    assert "envelopes 41..57 from producer-1 are missing" in str(ei.value)
    assert not ei.value.transient
    with pytest.raises(SequenceGapError, match="envelope 41 from producer-1 is missing"):
        t.classify("producer-1", 42)


def test_producers_are_independent() -> None:
    t = SequenceTracker()
    t.advance("a", 1)
    t.advance("b", 100)
    assert t.classify("a", 2) == "new"
    assert t.classify("b", 2) == "duplicate"
    assert t.classify("c", 7) == "new"


def test_advance_is_strict() -> None:
    t = SequenceTracker({"p": 5})
    with pytest.raises(ValueError, match="duplicate"):
        t.advance("p", 5)
    with pytest.raises(SequenceGapError, match="envelopes 6..7 from p are missing"):
        t.advance("p", 8)
    t.advance("p", 6)
    assert t.hwm("p") == 6


def test_snapshot_restore_round_trip() -> None:
    t = SequenceTracker()
    for seq in range(1, 11):
        assert t.classify("p", seq) == "new"
        t.advance("p", seq)
    snap = t.snapshot()
    assert snap == {"p": 10}
    snap["p"] = 999  # a copy, not a view
    assert t.hwm("p") == 10
    # A failed flush: roll back to the last committed snapshot.
    committed = t.snapshot()
    t.advance("p", 11)
    t.restore(committed)
    assert t.classify("p", 11) == "new"
    fresh = SequenceTracker()
    fresh.restore(t.snapshot())
    assert fresh.classify("p", 10) == "duplicate"


def test_restore_rejects_damaged_state() -> None:
    t = SequenceTracker()
    for bad in ({"p": 0}, {"p": "5"}, {"p": -1}, {"p": True}):
        with pytest.raises(TerminalError, match="producer 'p'"):
            t.restore(bad)  # type: ignore[arg-type]


def test_big_sequence_numbers() -> None:
    t = SequenceTracker({"p": 2**63})
    assert t.classify("p", 2**63 + 1) == "new"
    assert t.classify("p", 2**63) == "duplicate"


def test_bad_sequence() -> None:
    with pytest.raises(ValueError):
        SequenceTracker().classify("p", 0)
