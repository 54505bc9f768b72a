"""The tasks plugged into the producer between assemble and fold/batch.

Each is a ``ProducerTask`` (snapshot/task.py has the chunk/watermark
lifecycle both implement).  The producer holds them in one tuple, in the
order ``plugged`` declares, and does the same to each in that order:

- its table filter wraps the reader's (``table_filter``);
- every assembled item passes through each task in turn (``observe``), and
  an item a task drops (None) goes no further: not to the next task, not
  into a batch;
- once per loop turn each task may hand over items (``poll``), processed as
  any other transaction; a task with ``flush_after`` ends the batch after
  its items;
- the producer blocks on the log no longer than the shortest ``wait_s``;
- each checkpoint the producer moves is reported to every task
  (``checkpointed``); ``close`` at the end of a run.
"""
from __future__ import annotations

import threading
from typing import Protocol, Sequence

from cynomys.core.config import Config
from cynomys.core.model import Position
from cynomys.parser.stream import TableFilter
from cynomys.parser.txn import Item
from cynomys.snapshot.coordinator import SnapshotCoordinator
from cynomys.snapshot.keyless import KeylessRead
from cynomys.verify.coordinator import VerifyCoordinator


class ProducerTask(Protocol):
    @property
    def flush_after(self) -> bool:
        """End the batch after this task's items: they should not wait in a
        batch for more changes."""

    def table_filter(self, base: TableFilter) -> TableFilter:
        """The reader's table filter, widened to what the task must see."""

    def observe(self, item: Item) -> Item | None:
        """See one assembled item, in log order; the item to go on with, or
        None: drop it."""

    def watches_rows(self) -> bool:
        """Whether ``observe`` must see the row changes of ordinary tables
        now (a job, a read in flight, changes to drop).  While no task does,
        the producer hands them on without calling ``observe`` (DDL, the
        watermark table's rows and transaction ends still go through it);
        asked again after every item that went through ``observe`` while none
        watched and after every ``poll``, the only places a task starts to
        watch (a task that stops watching is asked again next turn)."""

    def poll(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        """The task's items for this turn, in order (only ``at_boundary``,
        between source transactions, may they be a transaction of their
        own); a ``KeylessRead`` is iterated at once, cut into fragments."""

    def wait_s(self) -> float:
        """How long the producer may block on the log before ``poll`` has
        something to do."""

    def checkpointed(self, pos: Position) -> None:
        """The producer's checkpoint moved to ``pos``: items handed over
        before this call are shipped."""

    def close(self) -> None: ...


def plugged(cfg: Config, *, start: Position, first_start: bool, enabled: bool,
            stop: threading.Event) -> tuple[ProducerTask, ...]:
    """The producer's tasks, in the order they see items and are polled.

    Verify comes first: the snapshot task drops the watermark table's
    events (nothing a target needs; ``drops_watermarks``) and a keyless
    table's changes already in its consistent read, and verify's windows
    must see every event of the log, the watermarks included.

    ``enabled`` False (a non-blocking ``--once`` run): the tasks only
    record requests, since a chunk needs the log to go on past its high
    watermark."""
    return (VerifyCoordinator(cfg, start=start, enabled=enabled),
            SnapshotCoordinator(cfg, start=start, first_start=first_start, enabled=enabled, stop=stop))


def observe_in_order(tasks: Sequence[ProducerTask], item: Item) -> Item | None:
    """``item`` through every task in order; None once one drops it."""
    for task in tasks:
        seen = task.observe(item)
        if seen is None:
            return None
        item = seen
    return item


def watching(tasks: Sequence[ProducerTask]) -> bool:
    """Whether any task must see ordinary row changes (``watches_rows``)."""
    return any(task.watches_rows() for task in tasks)


def widen_filter(tasks: Sequence[ProducerTask], base: TableFilter) -> TableFilter:
    """The reader's table filter, widened by every task."""
    for task in tasks:
        base = task.table_filter(base)
    return base
