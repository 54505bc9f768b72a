"""Per-producer sequence numbers: ordering, duplicate and gap detection.

Every producer numbers its envelopes 1, 2, 3, ... without holes.  The applier
keeps, per producer, the high-water mark (HWM): the highest sequence number
whose effect is in the target.  Then for an incoming envelope ``seq``:

* ``seq <= HWM``      duplicate: already applied (stream redelivery after a
                      crash, a replayed envelope); acknowledge and skip it.
* ``seq == HWM + 1``  new: apply it, then ``advance``.
* ``seq >  HWM + 1``  envelopes HWM+1 .. seq-1 never arrived (pub/sub loss,
                      a trimmed stream): SequenceGapError, never a silent skip.
* no HWM yet          first contact with this producer: accept any ``seq``.

With delay-commit batching the applier ``advance``s as it buffers each
envelope, writes ``snapshot()`` into the same target transaction as the
data, and ``restore``s the last committed snapshot if a flush fails — so the
HWMs always describe exactly what the target holds.
"""
from __future__ import annotations

import logging
from typing import Literal, Mapping

from cynomys.core.errors import SequenceGapError, TerminalError

log = logging.getLogger(__name__)

Verdict = Literal["new", "duplicate"]


def _missing(producer_id: str, first: int, last: int) -> str:
    if first == last:
        return f"envelope {first} from {producer_id} is missing"
    return f"envelopes {first}..{last} from {producer_id} are missing"


class SequenceTracker:
    """High-water marks of applied sequence numbers, per producer.  Not thread-safe:
    one applier loop owns it."""

    def __init__(self, hwms: Mapping[str, int] | None = None) -> None:
        self._hwm: dict[str, int] = {}
        if hwms is not None:
            self.restore(hwms)

    def hwm(self, producer_id: str) -> int | None:
        """The highest applied sequence of ``producer_id``; None before first contact."""
        return self._hwm.get(producer_id)

    def classify(self, producer_id: str, seq: int) -> Verdict:
        """"new" or "duplicate"; raises SequenceGapError when envelopes are missing."""
        if seq < 1:
            raise ValueError(f"sequence number {seq} from {producer_id} is below 1")
        hwm = self._hwm.get(producer_id)
        if hwm is None:
            return "new"
        if seq <= hwm:
            return "duplicate"
        if seq == hwm + 1:
            return "new"
        raise SequenceGapError(
            _missing(producer_id, hwm + 1, seq - 1) + f" (applied up to {hwm}, received {seq})",
            hint="with pub/sub transport, messages sent while the applier was down are lost: "
                 "re-snapshot the affected tables (`cynomys snapshot`) or switch [transport] mode to \"stream\"",
        )

    def advance(self, producer_id: str, seq: int) -> None:
        """Record that envelope ``seq`` of ``producer_id`` has been applied.

        Only the next sequence (or anything, at first contact) is accepted:
        advancing backwards or across a hole would corrupt the HWM, so it is
        a caller bug and raises."""
        hwm = self._hwm.get(producer_id)
        if hwm is not None and seq != hwm + 1:
            if seq <= hwm:
                raise ValueError(f"advance({producer_id!r}, {seq}) at or below the high-water mark {hwm}: "
                                 "a duplicate was applied")
            raise SequenceGapError(_missing(producer_id, hwm + 1, seq - 1) + f" (advance to {seq} refused)")
        if seq < 1:
            raise ValueError(f"sequence number {seq} from {producer_id} is below 1")
        self._hwm[producer_id] = seq

    def snapshot(self) -> dict[str, int]:
        """A copy of all HWMs, to persist with the target transaction."""
        return dict(self._hwm)

    def restore(self, hwms: Mapping[str, int]) -> None:
        """Replace all HWMs by a persisted snapshot."""
        fresh: dict[str, int] = {}
        for producer_id, seq in hwms.items():
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
                raise TerminalError(
                    f"saved high-water mark {seq!r} of producer {producer_id!r} is not a positive integer",
                    hint="the applier checkpoint is damaged; restore it or re-snapshot the target")
            fresh[str(producer_id)] = seq
        self._hwm = fresh
