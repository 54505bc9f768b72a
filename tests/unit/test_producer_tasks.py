"""The producer's plugged tasks (producer/tasks.py): one protocol, one order.

The order is a rule, not a comment: a task that drops the watermark
table's events must come after every task that reads its windows from
them.  Here through the real coordinators (no server: a window in flight is
put in place, as in the verify and snapshot logic tests)."""
from __future__ import annotations

import threading
from pathlib import Path

from cynomys.core.config import Config, ProducerConfig
from cynomys.core.model import Change, ColumnDef, Op, Position, TableSchema
from cynomys.parser.stream import TableFilter
from cynomys.producer.tasks import ProducerTask, observe_in_order, plugged, widen_filter
from cynomys.snapshot.columns import TableInfo
from cynomys.snapshot.window import Phase, Window
from cynomys.verify.checksum import KeyRange
from cynomys.verify.coordinator import VerifyCoordinator, _Active
from cynomys.verify.state import RUNNING, VerifyJob, VerifyTask

POS = Position("b.000001", 4)
SCHEMA = TableSchema("app", "t", (ColumnDef("id", "int"), ColumnDef("v", "int")), ("id",))
WM = TableSchema("cynomys_meta", "watermark", (ColumnDef("producer_id", "varchar(64)"), ColumnDef("uuid", "char(36)"),
                                               ColumnDef("kind", "varchar(4)")), ("producer_id",))


def _tasks(tmp_path: Path) -> tuple[ProducerTask, ...]:
    cfg = Config(producer=ProducerConfig(state_dir=str(tmp_path)))
    return plugged(cfg, start=POS, first_start=False, enabled=True, stop=threading.Event())


def _mark(uuid: str) -> Change:
    return Change(Op.UPDATE, "cynomys_meta", "watermark", "0-1-2", POS, 0, WM, ("p1", "x", "low"), ("p1", uuid, "low"))


def test_tasks_that_read_watermarks_come_before_the_one_that_drops_them(tmp_path: Path) -> None:
    drops = [bool(getattr(t, "drops_watermarks", False)) for t in _tasks(tmp_path)]
    assert drops == sorted(drops) and drops[-1], drops


def test_verify_sees_the_watermarks_the_snapshot_task_drops(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path)
    verify = next(t for t in tasks if isinstance(t, VerifyCoordinator))
    verify.jobs = [VerifyJob("j", RUNNING, (VerifyTask("app.t"),), chunk_size=5)]
    a = _Active("j", 0, TableInfo(SCHEMA, "InnoDB", 1), KeyRange(), Window(Phase.WAIT_LOW, "L", "H"), {(1,): (1, 1)})
    verify._reading = a
    assert observe_in_order(tasks, _mark("L")) is None   # dropped: never shipped
    assert a.window.phase is Phase.OPEN                   # but verify saw it first
    change = Change(Op.UPDATE, "app", "t", "0-1-3", POS, 0, SCHEMA, (1, 1), (1, 2))
    assert observe_in_order(tasks, change) is change      # a row change passes every task
    assert a.rows == {(1,): (1, 2)}
    assert observe_in_order(tasks, _mark("H")) is None and a.window.closing
    assert [type(x).__name__ for x in verify.poll(at_boundary=True)] == ["Change", "Commit"]


def test_the_reader_filter_lets_the_watermark_table_through_once(tmp_path: Path) -> None:
    f = widen_filter(_tasks(tmp_path), TableFilter(["app.*"], []))
    assert f("cynomys_meta", "watermark") and f("app", "t") and not f("other", "t")
    assert type(f).__mro__[1] is TableFilter  # one wrapper, not one per task
