"""Snapshot rows loaded beside a flush, on a second connection.

An initial load ends with the target server loading alone: the source has
been read, the producer and the applier wait, and one ``LOAD DATA`` uses
one of the target's cores (a 10M-row load on a 2-core box: 55 s of one
core after the snapshot read).  InnoDB loads two statements on two
connections at once at about 1.7x the rate of one (measured here: 2M
lineitem rows, 17 s on one connection, 10 s on two).  So a flush holding
many snapshot rows (READ runs) gives about half of them to a second
connection, which loads them with ``LOAD DATA ... REPLACE`` in a
transaction of its own while the flush's transaction does the rest.

Why it is exact:

- The side transaction commits before the flush's (the flush waits for it
  before it writes the applied state): whenever the state says a flush is
  applied, its side rows are too.  A crash after the side commit and before
  the flush's replays the flush: snapshot rows replace by primary key, so
  loading them twice ends the same (only READ runs of tables whose target
  primary key is the source's go beside; nothing that adds or deletes
  rows).  A snapshot row is not part of a source transaction: seeing it
  before the flush commits shows no source transaction in part.
- Nothing of the flush's own work touches a key the side loads: per table,
  the side takes a *prefix* of the READ runs' rows (a run cut in two where
  the prefix ends: later rows of the same key win, and they stay in the
  flush, loaded after the side committed), and
  only while the first key column of the runs' rows shares no value with
  what else the flush does to that table (its deletes, inserts and insert
  runs).  Only integer first key columns are compared (an integer equal
  on the server is equal in Python; a string under a case-insensitive
  collation may not be).
- Locks: both sessions run READ COMMITTED, so a DELETE of a key the target
  lacks takes no gap lock a side insert would wait for.  The side commits as
  soon as it has loaded (it never holds locks while waiting), so the flush
  waiting on a side lock ends when the side commits; the side waiting on a
  lock of the flush's (which waits for the side) gives up after
  ``LOCK_WAIT_S`` and the flush loads those rows itself.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from cynomys.applier.targets.base import TableFlush
from cynomys.core.columnar import InsertRun
from cynomys.core.model import Op, Value

log = logging.getLogger(__name__)

#: The side's lock wait, in seconds: a side load waiting this long on a lock
#: the flush holds gives its rows back to the flush (which waits for it).
LOCK_WAIT_S = 5
#: Session settings of both connections while side loads are on.
ISOLATION_SQL = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
SIDE_SESSION_SQL = (ISOLATION_SQL, f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}")
#: First key column types compared for the side's choice (see the module docstring).
INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})


@dataclass
class Split:
    """A flush's tables as its own transaction applies them (``kept``), and
    the READ runs the side loads (``side``, per table, in flush order)."""

    kept: list[TableFlush]
    side: list[TableFlush]

    @property
    def side_rows(self) -> int:
        return sum(tf.rows for tf in self.side)


def reads(tables: Sequence[TableFlush]) -> int:
    """Snapshot rows (READ runs) of a flush."""
    return sum(r.rows for tf in tables for r in tf.runs if r.op is Op.READ)


def split(tables: list[TableFlush], replaces: Callable[[TableFlush], bool], min_rows: int) -> Split:
    """Give the side about half of the flush's rows, when it holds at least
    ``min_rows`` snapshot rows: per table (``replaces``: its target primary
    key is the source's), a prefix of its READ runs whose first key column
    shares no value with the table's other changes in the flush."""
    if min_rows <= 0 or reads(tables) < min_rows:
        return Split(tables, [])
    want = sum(tf.rows for tf in tables) // 2
    taken = 0
    kept: list[TableFlush] = []
    side: list[TableFlush] = []
    for tf in tables:
        if taken >= want or not _comparable(tf) or not any(r.op is Op.READ for r in tf.runs) or not replaces(tf):
            kept.append(tf)
            continue
        away, stay = prefix(tf.runs, want - taken, _busy(tf))
        taken += sum(r.rows for r in away)
        if away:
            side.append(TableFlush(tf.schema, runs=away))
            kept.append(replace(tf, runs=stay))
        else:
            kept.append(tf)
    return Split(kept, side)


def prefix(runs: list[InsertRun], rows: int, busy: set[Value]) -> tuple[list[InsertRun], list[InsertRun]]:
    """A table's READ runs from the start, up to ``rows`` rows (a run cut
    where they end) and while their first key column shares no value with
    ``busy`` (empty: nothing to compare), and the runs that stay (its other
    runs among them): (away, stay)."""
    away: list[InsertRun] = []
    stay: list[InsertRun] = []
    taken = 0
    open_ = True  # a later READ run of a key must load after an earlier one: the side's end where one stays
    for run in runs:
        if run.op is not Op.READ:
            stay.append(run)
            continue
        if open_ and taken < rows:
            head, tail = cut(run, rows - taken)  # a flush is often one chunk: it is shared, not given
            if not busy or busy.isdisjoint(_live_first_keys(head)):
                away.append(head)
                taken += head.rows
                if tail is None:
                    continue
                run = tail
        open_ = False
        stay.append(run)
    return away, stay


def cut(run: InsertRun, rows: int) -> tuple[InsertRun, InsertRun | None]:
    """The run's first ``rows`` rows (its excluded ones counted too) and the
    rest, as two runs of the same block (None: nothing is left)."""
    if rows >= run.count:
        return run, None
    head = replace(run, count=rows, excluded=frozenset(i for i in run.excluded if i < rows))
    tail = replace(run, start=run.start + rows, count=run.count - rows,
                   excluded=frozenset(i - rows for i in run.excluded if i >= rows))
    return head, tail


def _comparable(tf: TableFlush) -> bool:
    schema = tf.schema
    if not schema.key:
        return False
    first = schema.key_indexes()[0]
    return schema.columns[first].base_type in INTEGER_TYPES


def _busy(tf: TableFlush) -> set[Value]:
    """First key column values of everything the flush does to ``tf`` but its READ runs."""
    first = tf.schema.key_indexes()[0]
    busy: set[Value] = {k[0] for k in tf.delete_keys}
    busy.update(row[first] for row in tf.inserts)
    for run in tf.runs:
        if run.op is not Op.READ:
            busy.update(_live_first_keys(run))
    return busy


def _live_first_keys(run: InsertRun) -> list[Value]:
    """The first key column of the run's rows, without its excluded rows."""
    block = run.block
    assert block is not None, "an InsertRun always has its block"
    values = block.values(block.schema.key_indexes()[0], run.start, run.count)  # (not the other key columns)
    if run.excluded:
        return [v for i, v in enumerate(values) if i not in run.excluded]
    return values


class SideLoader:
    """A second connection and the thread that loads on it.

    ``connect`` opens a set-up connection (autocommit off); ``load(cursor,
    table)`` loads one table's READ runs with REPLACE.  ``start`` begins a
    load and returns at once; ``finish`` waits for it to have committed,
    and returns its error, if any (the connection is then dropped).
    sidexa.py's ``XaSide`` is the same with an XA transaction kept open."""

    thread_name = "cynomys-side-load"
    #: ROLLBACK before closing a dropped connection (an XA one refuses it).
    rollback_on_drop = True

    def __init__(self, connect: Callable[[], Any], load: Callable[[Any, TableFlush], None]) -> None:
        self._connect = connect
        self._load = load
        self._conn: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._running: Future[None] | None = None
        self.rows = 0  # loaded beside, in all (committed)

    def start(self, tables: list[TableFlush]) -> None:
        assert self._running is None, "one side load at a time"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self.thread_name)
        self._running = self._pool.submit(self._run, tables)

    def _run(self, tables: list[TableFlush]) -> None:
        fresh = self._conn is None
        if fresh:
            self._conn = self._connect()
        conn = self._conn
        try:
            with conn.cursor() as cur:
                for sql in SIDE_SESSION_SQL if fresh else ():
                    cur.execute(sql)
                self._begin(conn, cur)
                for tf in tables:
                    self._load(cur, tf)
            self._end(conn)
        except BaseException:
            self._drop()
            raise
        self.rows += sum(tf.rows for tf in tables)

    def _begin(self, conn: Any, cur: Any) -> None:
        """Before a load's statements (a transaction begins by itself)."""

    def _end(self, conn: Any) -> None:
        """After a load's statements: it commits."""
        conn.commit()

    def finish(self) -> BaseException | None:
        """Wait for the running load; its error, or None once it is done."""
        running, self._running = self._running, None
        return None if running is None else running.exception()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.rollback_on_drop:
            try:
                conn.rollback()
            except Exception as exc:  # the server rolls back when the connection goes
                log.debug("rolling back a side load: %s", exc)
        try:
            conn.close()
        except Exception as exc:  # already gone: the server rolled back what was active
            log.debug("closing the side load's connection: %s", exc)

    def close(self) -> None:
        self.finish()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._drop()
