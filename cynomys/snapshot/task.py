"""ChunkedTask: the chunk/watermark lifecycle the producer's tasks share.

Snapshots (snapshot/coordinator.py) and verify (verify/coordinator.py) both
work through jobs -- each a list of parts (a table, or a key range of one)
-- by reading chunks between watermarks, interleaved with the log and
without locks: Netflix DBLog's algorithm, or Debezium's read-only variant
with executed-GTID watermarks (snapshot/watermark.py).  The producer drives
a task through one protocol (producer/tasks.py):

``observe``       every assembled item, in log order.  The watermark table's
                  rows move the windows in flight (snapshot/window.py); a row
                  change of a table in flight, inside its window, goes to the
                  task's own rule (``_on_change``: the snapshot drops the key,
                  verify applies the image); a commit or a heartbeat may close
                  a read-only window.
``poll``          once per loop turn: pick up request files; when nothing is
                  in flight (one read at a time), start the next chunk of the
                  oldest active job (``_start``: low watermark, select, high
                  watermark -- the only time the log waits, the reader thread
                  keeps filling its queue meanwhile); once the log is past
                  a chunk's high watermark, hand its items over at the next
                  transaction boundary of the stream (``_work``, only
                  ``at_boundary``): a transaction of their own, ending in a
                  ``Commit`` at that boundary's position, so the producer's
                  batching, checkpoint and fragment rules apply unchanged.
``checkpointed``  the producer's checkpoint moved (confirms chunks, below).
``wait_s``        how long the producer may block on the log before ``poll``
                  has something to do; ``close``.

Resume invariant (confirm after checkpoint).  A chunk is recorded in its
job (the part's next start persisted, ``_confirmed``) only when the
producer's checkpoint moves to or past the position ``P`` its items were
handed over at, on a checkpoint reported *after* the hand-over, never on
one reported earlier.  The producer moves its checkpoint only to the end of
a batch the transport accepted, or without a batch when it holds no changes
at all; either way items handed over before are shipped.  A crash before
that loses nothing: the chunk is read again after the restart (READ rows
are upserts; a checksum is sent again).

The in-memory cursor (``Cursor``) runs ahead of the persisted one, so the
next chunk starts as soon as one is handed over.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Generic, Protocol, Sequence, TypeVar

from cynomys.core.columnar import ManyRows
from cynomys.core.config import Config
from cynomys.core.model import Change, Op, Position, TableSchema
from cynomys.parser.stream import TableFilter
from cynomys.parser.txn import Commit, Item, Progress
from cynomys.snapshot.columns import TableInfo
from cynomys.snapshot.errors import SnapshotError
from cynomys.snapshot.keyless import KeylessRead
from cynomys.snapshot.replica import replica_opener
from cynomys.snapshot.source import SnapshotConnection, chunk_driver
from cynomys.snapshot.state import JobStore, Part, TaskJob
from cynomys.snapshot.watermark import WATERMARK_TABLE, WindowOpener, read_watermark, same_statement, watermark_ddl
from cynomys.snapshot.window import Phase, Window

log = logging.getLogger(__name__)

#: How often request files are looked for; how long the producer may block
#: on the log when a task has nothing due.
POLL_S = 0.5
_STUCK_WARN_S = 120.0


class WatermarkAwareFilter(TableFilter):
    """The producer's table filter, plus the watermark table: its row events
    must reach the tasks (which read their windows from them) even when
    include_tables does not name it or exclude_tables does."""

    def __init__(self, base: TableFilter, schema: str) -> None:
        super().__init__(base.include, base.exclude)
        self.watermark = (schema, WATERMARK_TABLE)

    def __call__(self, database: str, table: str) -> bool:
        return (database, table) == self.watermark or super().__call__(database, table)


@dataclass
class Cursor:
    """Where a part's next chunk starts, in memory (ahead of the persisted
    ``Part.after``: see the module doc)."""

    after: list[Any] | None      # chunker.encode_key of the last key handed over; None: the start
    exhausted: bool = False      # its last chunk was handed over


@dataclass(frozen=True)
class Emitted:
    """A chunk handed to the producer at ``at``, waiting for the checkpoint
    to pass it (tasks add what confirming it records)."""

    job_id: str
    part: int
    at: Position
    after: list[Any] | None      # where the part's next chunk starts (encoded key)
    exhausted: bool              # the part's last chunk
    rows: int


class Work(Protocol):
    """Something a task has under way for one part of one job."""

    @property
    def job_id(self) -> str: ...

    @property
    def part(self) -> int: ...


class InFlight(Work, Protocol):
    """A read whose window is open: a chunk, or a stream of chunks."""

    @property
    def info(self) -> TableInfo: ...

    @property
    def window(self) -> Window: ...


J = TypeVar("J", bound=TaskJob)
F = TypeVar("F", bound=InFlight)
E = TypeVar("E", bound=Emitted)


class ChunkedTask(Generic[J, F, E]):
    """The lifecycle (module doc); subclasses keep only what differs, in
    the hooks below ``# -- hooks``."""

    #: Names the task in logs and refusals ("snapshot", "verify").
    kind: ClassVar[str]
    #: Whether the producer ends the batch after this task's items (instead
    #: of letting them wait in it for more changes).
    flush_after: ClassVar[bool] = False
    #: Whether ``observe`` drops the watermark table's row events and DDL
    #: (nothing a target needs).  The last task to see them drops them; a
    #: task that passes them on must come before it (producer/tasks.py).
    drops_watermarks: ClassVar[bool] = False

    def __init__(self, cfg: Config, store: JobStore[J], *, start: Position, enabled: bool) -> None:
        self.cfg = cfg
        self.scfg = cfg.snapshot
        self.enabled = enabled
        self.store = store
        self.jobs: list[J] = store.load()
        self.filter = TableFilter(cfg.source.include_tables, cfg.source.exclude_tables)
        self.wm_schema = self.scfg.watermark_schema
        self._wm_ddl = watermark_ddl(self.wm_schema)
        self._cursors: dict[tuple[str, int], Cursor] = {}
        self._emitted: list[E] = []
        self._schemas: dict[tuple[str, str], TableSchema] = {}
        self._last_end = start              # end of the last item the producer handled
        self._last_ts = 0
        self._next_request_check = 0.0
        self._next_chunk_at = 0.0
        self._throttle_s = 0.0              # pause after each chunk handed over
        # The reads whose windows are open (verify: one at a time; the
        # snapshot: several, snapshot/readers.py).  An attribute, not a
        # method: ``observe`` reads it for every item of the log.
        self._inflight: tuple[F, ...] = ()
        self._conn: SnapshotConnection | None = None
        self._opener: WindowOpener | None = None
        # Row changes the task drops from the stream (None: none; checked
        # for every change, so data rather than a method call).
        self._dropping: Callable[[Change], bool] | None = None
        # False once no job has a chunk to read (saves scanning the jobs on
        # every turn); set again whenever the jobs change.
        self._maybe_work = True
        self.stats = {"chunks": 0, "rows": 0}

    @property
    def _reading(self) -> F | None:
        """The read in flight, for a task that has one at a time."""
        return self._inflight[0] if self._inflight else None

    @_reading.setter
    def _reading(self, f: F | None) -> None:
        self._inflight = () if f is None else (f,)

    # ------------------------------------------------------------------
    # The producer's protocol (producer/tasks.py)
    # ------------------------------------------------------------------
    def table_filter(self, base: TableFilter) -> TableFilter:
        """``base``, letting the watermark table's events through (DBLog)."""
        if self.scfg.read_only or isinstance(base, WatermarkAwareFilter):
            return base
        return WatermarkAwareFilter(base, self.wm_schema)

    def watches_rows(self) -> bool:
        """A read in flight, changes to drop, or a chunk left to read in
        this run (whose table's shape the log may show, ``_schema_for``):
        see producer/tasks.py.  Finished jobs stay in ``jobs`` (for
        `cynomys status`), and a disabled task (``produce --once``) reads
        nothing: neither watches."""
        return bool(self._inflight) or self._drops_some() or (self.enabled and self._next_work() is not None)

    def _drops_some(self) -> bool:
        """Whether ``_dropping`` may drop anything now."""
        return self._dropping is not None

    def observe(self, item: Item) -> Item | None:
        """Watch one assembled item; returns it, or None: drop it."""
        if isinstance(item, Change):
            if item.op is Op.DDL:
                if item.sql and any(same_statement(item.sql, s) for s in self._wm_ddl):
                    return None if self.drops_watermarks else item  # creates our watermark table
                # A DDL may change what a row looks like: forget the shapes
                # the log showed; the task decides about its reads.
                self._schemas.clear()
                self._on_ddl(item)
                return item
            if item.table == WATERMARK_TABLE and item.database == self.wm_schema:
                wm = read_watermark(item)
                if wm is not None:
                    for f in self._inflight:
                        f.window.on_watermark(wm.uuid)
                return None if self.drops_watermarks else item
            if self._dropping is not None and self._dropping(item):
                return None
            if item.schema is not None:
                self._schemas[(item.database, item.table)] = item.schema
            for f in self._inflight:
                s = f.info.schema
                if item.table == s.table and item.database == s.database and f.window.sees(item):
                    # A bulk insert's rows (core.columnar.ManyRows) one by one.
                    for one in item.as_changes() if type(item) is ManyRows else (item,):
                        self._on_change(f, one)
            return item
        if isinstance(item, Commit):
            self._last_end, self._last_ts = item.end, item.commit_ts
            self._passed(item.gtid, item.end)
        elif isinstance(item, Progress):
            self._last_end = item.end
            self._passed("", item.end)
        return item

    def _begin_turn(self) -> float | None:
        """The start of every turn of ``poll``: the source session ready, new
        requests taken (every POLL_S); the turn's time, or None when the task
        is disabled (nothing to do this turn)."""
        now = time.monotonic()
        self._prepare()
        if now >= self._next_request_check:
            self._next_request_check = now + POLL_S
            self._take_requests()
        return now if self.enabled else None

    def poll(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        """This turn's work: requests, starting a chunk, or a chunk's items
        (only ``at_boundary``: between source transactions), in order."""
        now = self._begin_turn()
        if now is None:
            return []
        if self._idle() and (now < self._next_chunk_at or not self._start_next_chunk()):
            return []
        out = self._work(at_boundary)
        self._warn_if_stuck(now)
        return out

    def wait_s(self) -> float:
        raise NotImplementedError

    def _next_chunk_due_s(self) -> float:
        """With nothing in flight: how long until the next chunk may start
        (0: now; POLL_S: no chunk to read).  Waiting POLL_S for the log
        when a chunk is ready cost a quiet source half a second per chunk
        (verify ran at 8.5k rows/s through the daemons for that alone)."""
        if self._maybe_work and self._next_work() is not None:
            return max(0.0, min(POLL_S, self._next_chunk_at - time.monotonic()))
        return POLL_S

    def checkpointed(self, pos: Position) -> None:
        """The producer's checkpoint moved to ``pos``: chunks handed over at
        or before it are shipped (module doc)."""
        if not self._emitted:
            return
        done = [e for e in self._emitted if e.at <= pos]
        if not done:
            return
        self._emitted = [e for e in self._emitted if not e.at <= pos]
        for e in done:
            job = self._job(e.job_id)
            if job is not None:
                self._replace(self._confirmed(job, e))
        self._save()

    def close(self) -> None:
        self._drop_work(None)
        self._conn_reset()
        if self.jobs:
            self._save()

    # ------------------------------------------------------------------
    # Windows
    # ------------------------------------------------------------------
    def _passed(self, gtid: str, end: Position) -> None:
        for f in self._inflight:
            f.window.on_commit(gtid, end)

    def _warn_if_stuck(self, now: float) -> None:
        for f in self._inflight:
            self._warn_if_stuck_one(f, now)

    def _warn_if_stuck_one(self, f: F, now: float) -> None:
        # A chunk read on a replica holds its window while it waits for it (its own warning).
        stuck_s = _STUCK_WARN_S + (self.scfg.replica_wait_s if self.scfg.read_from else 0.0)
        if f.window.warned or f.window.closing or now - f.window.opened <= stuck_s:
            return
        w = f.window
        w.warned = True
        log.warning("%s chunk of %s: the %s has not been seen in the binlog for %.0fs; the producer is far "
                    "behind the source, or the source does not log %s", self.kind, f.info.name,
                    "high watermark" if w.phase is Phase.OPEN else "low watermark", now - w.opened,
                    self.wm_schema if not self.scfg.read_only else "new transactions (no heartbeat?)")

    # ------------------------------------------------------------------
    # Chunks
    # ------------------------------------------------------------------
    #: The driver of this task's connection (snapshot/source.py): "chunks"
    #: reads with ``[snapshot] driver``; "pymysql" always.
    driver: ClassVar[str] = "pymysql"

    def _connection(self) -> SnapshotConnection:
        if self._conn is None:
            driver = self.driver if self.driver != "chunks" else chunk_driver(self.cfg.source, self.scfg.driver)
            self._conn = SnapshotConnection(self.cfg.source, driver)
        return self._conn

    def _watermarks(self) -> WindowOpener:
        """Opens windows on the task's connection, in the configured flavour."""
        if self._opener is None:
            conn = self._connection()
            self._opener = WindowOpener(conn, read_only=self.scfg.read_only, schema=self.wm_schema,
                                        producer_id=self.cfg.producer.id, replica=replica_opener(self.cfg, conn.driver))
        return self._opener

    def _conn_reset(self) -> None:
        # After an error the session may be inside a transaction: start afresh.
        if self._opener is not None:
            self._opener.close()  # the connection below, and the replica's if it opened one
        elif self._conn is not None:
            self._conn.close()
        self._conn = None
        self._opener = None

    def _cursor(self, job_id: str, i: int, part: Part) -> Cursor:
        cur = self._cursors.get((job_id, i))
        return cur if cur is not None else Cursor(part.after)

    def _next_work(self) -> tuple[J, int] | None:
        """The oldest active job's first part with a chunk left to read."""
        if not self._maybe_work:
            return None
        for job in self.jobs:
            if not job.active:
                continue
            for i, part in enumerate(job.parts):
                if not part.over and not self._cursor(job.id, i, part).exhausted:
                    return job, i
        self._maybe_work = False
        return None

    def _start_next_chunk(self) -> bool:
        work = self._next_work()
        if work is None:
            return False
        job, i = work
        try:
            return self._start(job, i)
        except SnapshotError as exc:
            self._conn_reset()
            self._fail(job.id, i, exc.one_line())
            return False

    def _emission(self) -> tuple[Position, int]:
        """Where items handed over now stand: the transaction boundary the
        producer is at, and the last commit's time."""
        return self._last_end, self._last_ts or int(time.time())

    def _hand_over(self, e: E) -> None:
        """A chunk's items go to the producer now, at ``e.at``: its part's
        next chunk starts after it at once; the job records it when the
        checkpoint passes ``e.at``."""
        self._cursors[(e.job_id, e.part)] = Cursor(e.after, e.exhausted)
        self._emitted.append(e)
        self.stats["chunks"] += 1
        self.stats["rows"] += e.rows
        self._next_chunk_at = time.monotonic() + self._throttle_s

    def _schema_for(self, info: TableInfo) -> TableSchema:
        """The binlog's own shape of the table when the log has shown it
        since the last DDL (the applier needs one shape per table and
        flush), else the one built from information_schema (equal to it
        for every type the row decoder knows), with the source's indexes
        of a keyless table (the binlog does not carry them)."""
        seen = self._schemas.get((info.schema.database, info.schema.table))
        if seen is not None and seen.column_names == info.schema.column_names and seen.key == info.schema.key:
            return replace(seen, indexes=info.schema.indexes) if info.schema.indexes != seen.indexes else seen
        return info.schema

    # ------------------------------------------------------------------
    # Jobs and requests
    # ------------------------------------------------------------------
    @staticmethod
    def _concerns(work: Work | None, job_id: str | None, part: int | None) -> bool:
        """Is ``work`` of job ``job_id`` (None: any), part ``part`` (None: any)?"""
        return work is not None and job_id in (None, work.job_id) and part in (None, work.part)

    def _job(self, job_id: str) -> J | None:
        return next((j for j in self.jobs if j.id == job_id), None)

    def _set_jobs(self, jobs: list[J]) -> None:
        self.jobs = jobs
        self._maybe_work = True

    def _replace(self, job: J) -> None:
        self._set_jobs([job if j.id == job.id else j for j in self.jobs])

    def _fail(self, job_id: str, i: int, reason: str) -> None:
        """Part ``i`` cannot be done: it fails alone (its job ends failed
        with the reason once its other parts are over); replication goes on."""
        job = self._job(job_id)
        if job is None:
            return
        log.error("%s %s: %s failed: %s", self.kind, job_id, job.parts[i].name, reason)
        self._drop_work(job_id, i)
        self._replace(job.failing(i, reason))
        self._save()

    def _save(self) -> None:
        self.store.save(self.jobs, self._live())

    def _take_requests(self) -> None:
        for path, req in self.store.pending_requests():
            try:
                self._apply_request(req)
            except SnapshotError as exc:
                log.error("%s request %s refused: %s", self.kind, path.name, exc)
                ident = str(req.get("id") or "")
                refused = self._refused(req, exc.one_line()) if ident and self._job(ident) is None else None
                if refused is not None:
                    # Recorded, so the command waiting for it sees why.
                    self._set_jobs([*self.jobs, refused])
            self._save()  # the result is durable before the request goes away
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------
    # -- hooks: what differs between the tasks
    # ------------------------------------------------------------------
    def _prepare(self) -> None:
        """First thing of every poll (the snapshot: its initial job)."""

    def _idle(self) -> bool:
        """Nothing in flight: the next chunk may start."""
        return self._reading is None

    def _on_ddl(self, change: Change) -> None:
        """A DDL in the log (not the watermark table's)."""
        raise NotImplementedError

    def _on_change(self, f: F, change: Change) -> None:
        """A row change of ``f``'s table inside its window."""
        raise NotImplementedError

    def _start(self, job: J, i: int) -> bool:
        """Start reading part ``i`` of ``job`` (False: it was not started);
        a SnapshotError fails the part."""
        raise NotImplementedError

    def _work(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        """With something in flight: the items to hand over now, if any."""
        raise NotImplementedError

    def _confirmed(self, job: J, e: E) -> J:
        """The checkpoint passed chunk ``e``: ``job`` with it recorded, settled."""
        raise NotImplementedError

    def _drop_work(self, job_id: str | None, part: int | None = None) -> None:
        """Forget what is in flight for ``job_id`` (None: every job), part
        ``part`` (None: every part)."""
        raise NotImplementedError

    def _live(self) -> dict[str, Any] | None:
        """The read in flight, for `cynomys status` (not needed to resume)."""
        raise NotImplementedError

    def _apply_request(self, req: dict[str, Any]) -> None:
        raise NotImplementedError

    def _refused(self, req: dict[str, Any], reason: str) -> J | None:
        """The failed job recording a refused request, if any."""
        raise NotImplementedError
