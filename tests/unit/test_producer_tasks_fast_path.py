"""Row changes skip the tasks while none watches (producer/tasks.py
``watches_rows``), and the tasks still know where the log is before they
next poll: the real Producer loop, scripted binlog events, a recording task."""
from __future__ import annotations

import queue
from pathlib import Path
from typing import Any, Sequence

import pytest

from cynomys.core.config import Config, ProducerConfig
from cynomys.core.model import Change, ColumnDef, Position, TableSchema
from cynomys.parser.kinds import Basic
from cynomys.parser.stream import SourceEvent, TableFilter
from cynomys.parser.txn import Commit, Item
from cynomys.producer import loop as producer_loop
from cynomys.producer.loop import Producer
from cynomys.snapshot.keyless import KeylessRead
from tests.unit.test_producer_handover import RecordingSink

T = TableSchema("d", "t", (ColumnDef("id", "int(11)", False), ColumnDef("v", "int(11)")), ("id",))
FILE = "bin.000001"


def _txn(n: int) -> list[SourceEvent]:
    """Transaction ``n``: GTID, one row insert, XID (positions 100 apart)."""
    at, gtid = 1000 + 100 * n, f"0-1-{n}"
    p = [Position(FILE, at + 30 * i) for i in range(4)]
    return [SourceEvent(Basic.BEGIN, "GTID_EVENT", p[0], p[1], n, gtid=gtid),
            SourceEvent(Basic.INSERT, "WRITE_ROWS_EVENT", p[1], p[2], n, database="d", table="t", schema=T,
                        rows=[((n, n * 10), None)]),
            SourceEvent(Basic.COMMIT, "XID_EVENT", p[2], p[3], n)]


class Turns:
    """The loop's event queue: one list of events per turn, then the end."""

    def __init__(self, turns: list[list[SourceEvent]]) -> None:
        self.items: list[Any] = [*turns, producer_loop._EOF]

    def get(self, timeout: float | None = None) -> Any:
        return self.items.pop(0)

    def get_nowait(self) -> Any:
        raise queue.Empty  # one list per turn, so the task polls between them


class Watcher:
    """Watches rows or not (``watching``); records what it observes and,
    at each poll, the last transaction end it has seen."""

    flush_after = False

    def __init__(self, watching: bool) -> None:
        self.watching = watching
        self.observed: list[Item] = []
        self.last_end: Position | None = None
        self.at_polls: list[Position | None] = []

    def table_filter(self, base: TableFilter) -> TableFilter:
        return base

    def watches_rows(self) -> bool:
        return self.watching

    def observe(self, item: Item) -> Item | None:
        self.observed.append(item)
        if isinstance(item, Commit):
            self.last_end = item.end
        return item

    def poll(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        self.at_polls.append(self.last_end)
        return []

    def wait_s(self) -> float:
        return 0.0

    def checkpointed(self, pos: Position) -> None: ...

    def close(self) -> None: ...


@pytest.mark.parametrize("watching", [False, True])
def test_tasks_see_rows_only_while_watching_and_always_where_the_log_is(tmp_path: Path, watching: bool) -> None:
    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path), batch_max_events=1000, batch_max_delay_ms=0))
    sink = RecordingSink()
    p = Producer(cfg, sink)
    task = Watcher(watching)
    p.tasks = (task,)
    turns = [_txn(1) + _txn(2), _txn(3), _txn(4) + _txn(5)]
    p._loop(Turns(turns), Position(FILE, 4, "0-1-0"))  # type: ignore[arg-type]
    shipped = [c.after for b in sink.sent for c in b.changes]
    assert shipped == [(n, n * 10) for n in range(1, 6)]  # every change went on, either way
    rows = [i for i in task.observed if isinstance(i, Change)]
    commits = [i for i in task.observed if isinstance(i, Commit)]
    ends = [_txn(n)[-1].end.pos for n in range(1, 6)]
    if watching:
        assert [r.after for r in rows] == shipped and [c.end.pos for c in commits] == ends
    else:
        # No row change reached the task; of the transaction ends, the last
        # one before each poll did (the loop polls before each turn, the end
        # of the run included).
        assert rows == [] and [c.end.pos for c in commits] == [ends[1], ends[2], ends[4]]
    # Either way the task knew, at each poll, the end of the last transaction read.
    assert [e.pos if e else None for e in task.at_polls] == [None, ends[1], ends[2], ends[4]]
    assert all(e is None or e.gtid for e in task.at_polls)  # with the GTID position reached
