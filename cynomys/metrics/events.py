"""What the daemons' loops tell their monitors once per turn: plain data,
so metrics never reach into a loop's internals (and import no loop)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from cynomys.core.model import Position


@dataclass(frozen=True)
class ProducerTurn:
    run: int                          # one per Producer object: its counters restart with it
    start: Position                   # where this run began reading
    counters: Mapping[str, int]       # batches, transactions, changes, bytes (sent)
    read: Position | None             # last position read
    checkpoint: Position | None
    last_event_ts: int                # source time of the last event read


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class ApplierTurn:
    run: int                          # one per Applier object: its counters restart with it
    delivered: int                    # envelopes the last transport read returned
    counters: Mapping[str, int]       # envelopes, duplicates, flushes, ddl
    rejected: Mapping[str, int]       # dead-lettered envelopes by reason
    buffered_rows: int
    buffered_envelopes: int
    applied_position: Position | None  # what the target holds for this applier's producer
    applied_commit_ts: int
    ping: Callable[[], None] = field(default=_nothing)  # the target check, run in the loop's thread
