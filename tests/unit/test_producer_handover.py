"""A task's chunk is confirmed only once its own rows are shipped.

A snapshot chunk starts an envelope of its own: the batching ships the log
changes waiting before it, which moves the checkpoint to the very position
the chunk was handed over at while the chunk's rows are still unshipped.
Reported to the task then, the chunk was recorded done and a SIGKILL before
its envelope lost it (test_snapshot.py's SIGKILL runs missed one chunk now
and then).  The real Producer and Batching, a recording sink, one fake task."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

from cynomys.core.columnar import ManyRows
from cynomys.core.config import Config, ProducerConfig
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.parser.stream import TableFilter
from cynomys.parser.txn import Assembler, Commit, Item
from cynomys.producer.batching import Batching
from cynomys.producer.loop import Producer
from cynomys.snapshot.keyless import KeylessRead

T = TableSchema("d", "t", (ColumnDef("id", "int(11)", False), ColumnDef("v", "int(11)")), ("id",))
P = Position("bin.000001", 400, "0-1-7")


class RecordingSink:
    def __init__(self) -> None:
        self.sent: list[Batch] = []

    def last_sequence(self) -> int:
        return len(self.sent)

    @property
    def bytes_sent(self) -> int:
        return 0

    @property
    def fence_token(self) -> int:
        return 0

    @property
    def fence_term(self) -> str:
        return ""

    def fence_holds(self) -> bool:
        return True

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        self.sent.append(batch)

    def describe(self) -> str:
        return "a recording sink"

    def reads_shipped(self) -> int:
        return sum(len(c.images) for b in self.sent for c in b.changes if type(c) is ManyRows)


class ChunkTask:
    """Hands one chunk of 3 rows over at P, and records, for every
    checkpoint reported at or past P, whether the chunk was shipped then."""

    flush_after = True

    def __init__(self, sink: RecordingSink) -> None:
        self.sink = sink
        self.handed = False
        self.reports: list[tuple[Position, int]] = []

    def table_filter(self, base: TableFilter) -> TableFilter:
        return base

    def watches_rows(self) -> bool:
        return False

    def observe(self, item: Item) -> Item | None:
        return item

    def poll(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        if self.handed or not at_boundary:
            return []
        self.handed = True
        rows = ManyRows(Op.READ, "d", "t", "snap-1", P, 1, T, images=((1, 10), (2, 20), (3, 30)))
        return [rows, Commit(P, P, 1, "")]

    def wait_s(self) -> float:
        return 0.0

    def checkpointed(self, pos: Position) -> None:
        if self.handed and P <= pos:
            self.reports.append((pos, self.sink.reads_shipped()))

    def close(self) -> None: ...


def test_a_chunk_is_confirmed_only_after_its_own_envelope(tmp_path: Path) -> None:
    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path), batch_max_events=1000, batch_max_delay_ms=60_000))
    sink = RecordingSink()
    p = Producer(cfg, sink)
    task = ChunkTask(sink)
    p.tasks = (task,)
    start = Position("bin.000001", 4, "0-1-6")
    run = Batching(p, start)
    asm = Assembler(start.gtid)
    # A log transaction waiting in the batch (not shipped: the batch is not full).
    run.handle(_change(), asm)
    run.handle(Commit(Position("bin.000001", 200, "0-1-7"), P, 1, "0-1-7"), asm)
    assert not sink.sent
    p._poll_tasks(run, asm)
    # Both envelopes went: the log's, then the chunk's (flush_after).
    assert [len(b.changes) for b in sink.sent] == [1, 1] and sink.reads_shipped() == 3
    assert task.reports, "the checkpoint past the chunk was never reported"
    early = [pos for pos, shipped in task.reports if shipped < 3]
    assert not early, f"checkpoint {early[0]} reported to the task before the chunk it handed over at P was shipped"


def _change() -> Change:
    return Change(Op.INSERT, "d", "t", "0-1-7", Position("bin.000001", 200, "0-1-7"), 1, T, None, (9, 90))
