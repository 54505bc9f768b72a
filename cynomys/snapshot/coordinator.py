"""SnapshotCoordinator: full-state capture inside the producer's loop.

The producer hands it every assembled item (``observe``) and asks it, once
per loop turn, for work (``poll``).  Between them the DBLog algorithm runs
interleaved with the log, without locks:

1. ``poll`` picks the next chunk of the oldest active job and, in one go,
   writes the low watermark, selects the chunk (the next ``chunk_size``
   rows in key order after the last key), writes the high watermark.  This
   is the only time the log waits: one chunk select (the reader thread keeps
   filling its queue meanwhile).
2. ``observe`` sees the log go on: row changes of the chunk's table inside
   the window drop their keys from the chunk; the watermark table's own
   events are swallowed (never shipped); a DDL inside the window throws the
   chunk away (it is read again).
3. Past the high watermark, ``poll`` emits the rest of the chunk at the
   next transaction boundary of the stream as READ changes followed by a
   ``Commit`` at that same boundary: a transaction of their own, so the
   producer's batching, checkpoint and fragment rules apply unchanged.

Resume invariant: a chunk is *finished* (its last key persisted) only when
the producer's checkpoint moves after its READ rows were handed over.  The
producer moves its checkpoint only to the end of a batch the transport
accepted, or without a batch when it holds no changes at all; either way
READ rows handed over before are shipped.  The rows go out at a position
``P`` (the boundary) and the coordinator confirms on the first checkpoint
``>= P`` reported *after* it handed them over, never on one reported
earlier.  A crash before that loses no row: the chunk is read again.

The in-memory cursor runs ahead of the persisted one, so the next chunk
starts as soon as the previous one is emitted.

Tables without a primary key are not chunked: they are read whole in one
consistent read streamed at a boundary (snapshot/keyless.py); ``poll``
returns that read as a ``KeylessRead`` the producer iterates.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from cynomys.core.config import Config
from cynomys.core.model import Change, Op, Position, TableSchema, Value
from cynomys.parser.stream import TableFilter
from cynomys.parser.txn import Commit, Item, Progress
from cynomys.snapshot.chunker import build_chunk_query, decode_key, encode_key
from cynomys.snapshot.columns import TableInfo, row_converter
from cynomys.snapshot.errors import SnapshotError, SnapshotRequestError
from cynomys.snapshot.keyless import SNAPSHOT_TID_PREFIX, ConsistentRead, DropRules, KeylessRead, check_keyless
from cynomys.snapshot.source import SnapshotConnection
from cynomys.snapshot.state import (
    CANCELLED,
    DONE,
    FAILED,
    JOB_ACTIVE,
    JOB_OVER,
    PAUSED,
    QUEUED,
    RUNNING,
    SKIPPED,
    SnapshotJob,
    SnapshotStore,
    TableProgress,
)
from cynomys.snapshot.watermark import (
    WATERMARK_TABLE,
    GtidWatermarker,
    WatermarkTable,
    read_watermark,
    same_statement,
    watermark_ddl,
)
from cynomys.snapshot.window import ChunkWindow, Phase

log = logging.getLogger(__name__)

INITIAL_JOB_ID = "initial"
_REQUEST_POLL_S = 0.5
_STUCK_WARN_S = 120.0


class WatermarkAwareFilter(TableFilter):
    """The producer's table filter, plus the watermark table: its row events
    must reach the coordinator (which swallows them) even when
    include_tables does not name it or exclude_tables does."""

    def __init__(self, base: TableFilter, schema: str) -> None:
        super().__init__(base.include, base.exclude)
        self.watermark = (schema, WATERMARK_TABLE)

    def __call__(self, database: str, table: str) -> bool:
        return (database, table) == self.watermark or super().__call__(database, table)


@dataclass
class _Cursor:
    """Where the next chunk of a table starts (driver values), in memory."""

    last_key: tuple[Value, ...] | None
    exhausted: bool = False


@dataclass
class _Active:
    """The chunk between its watermarks."""

    job_id: str
    table: str
    info: TableInfo
    window: ChunkWindow
    last_key: tuple[Value, ...] | None     # last key selected (driver values), None: nothing selected
    exhausted: bool                        # fewer rows than a chunk: the table ends here
    started: float
    warned: bool = False


@dataclass(frozen=True)
class _Emitted:
    """A chunk handed to the producer, waiting for the checkpoint to pass it."""

    job_id: str
    table: str
    at: Position
    last_key: tuple[Value, ...] | None
    exhausted: bool
    rows: int
    scanned: int
    dropped: int


@dataclass(frozen=True)
class _KeylessNext:
    """A keyless table whose read starts at the next transaction boundary."""

    job_id: str
    tp: TableProgress
    info: TableInfo
    where: str


class SnapshotCoordinator:
    def __init__(self, cfg: Config, *, start: Position, first_start: bool, enabled: bool = True,
                 stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.scfg = cfg.snapshot
        self.enabled = enabled
        self.store = SnapshotStore(cfg.resolve(cfg.producer.state_dir))
        self.jobs: list[SnapshotJob] = self.store.load()
        self.filter = TableFilter(cfg.source.include_tables, cfg.source.exclude_tables)
        self.wm_schema = self.scfg.watermark_schema
        self._wm_ddl = watermark_ddl(self.wm_schema)
        # The initial snapshot: only when the producer starts with no
        # checkpoint at the source's current end, i.e. without the history
        # the binlog may hold; with start = earliest or file:pos the binlog
        # is the history that was asked for.
        self._want_initial = (first_start and self.scfg.initial and cfg.source.start == "current"
                              and not any(j.id == INITIAL_JOB_ID for j in self.jobs))
        self._cursors: dict[tuple[str, str], _Cursor] = {}
        for j in self.jobs:
            for t in j.tables:
                self._cursors[(j.id, t.name)] = _Cursor(decode_key(t.last_key), t.over)
        self._active: _Active | None = None
        self._emitted: list[_Emitted] = []
        self._schemas: dict[tuple[str, str], TableSchema] = {}
        self._stop = stop
        self._keyless: _KeylessNext | None = None
        # Keyless tables read (or being read): their changes before the read's position are in it.
        self._drops = DropRules()
        for j in self.jobs:
            for t in j.tables:
                if t.read_at:
                    self._drops.set(t.database, t.table, Position.from_dict(t.read_at))
        self._last_end = start              # end of the last item the producer handled
        self._last_ts = 0
        self._next_chunk_at = 0.0
        self._next_request_check = 0.0
        self._conn: SnapshotConnection | None = None
        self._watermarks: WatermarkTable | None = None
        self._gtid: GtidWatermarker | None = None
        # False once no job has a chunk to read (saves the per-event scan of
        # the jobs); set again whenever jobs change.
        self._maybe_work = True
        self.stats = {"chunks": 0, "rows": 0, "dropped": 0, "aborted": 0}

    # ------------------------------------------------------------------
    # Producer hooks
    # ------------------------------------------------------------------
    def table_filter(self, base: TableFilter) -> TableFilter:
        return base if self.scfg.read_only else WatermarkAwareFilter(base, self.wm_schema)

    def observe(self, item: Item) -> Item | None:
        """Watch one assembled item; None means: drop it (watermark table)."""
        if isinstance(item, Change):
            if item.op is Op.DDL:
                return self._on_ddl(item)
            if item.table == WATERMARK_TABLE and item.database == self.wm_schema:
                self._on_watermark(item)
                return None
            if self._drops.drops(item):
                return None  # a keyless table's change inside its consistent read
            if item.schema is not None:
                self._schemas[(item.database, item.table)] = item.schema
            a = self._active
            if a is not None and item.table == a.window.table and item.database == a.window.database:
                a.window.on_change(item, self._in_window(a, item))
            return item
        if isinstance(item, Commit):
            self._last_end, self._last_ts = item.end, item.commit_ts
            self._check_high(item.gtid, item.end)
        elif isinstance(item, Progress):
            self._last_end = item.end
            self._check_high("", item.end)
        return item

    def poll(self, at_boundary: bool) -> Iterable[Item]:
        """Snapshot work for this loop turn: pick up requests, start a chunk,
        or emit a closed window's rows (only ``at_boundary``: between source
        transactions).  Returns the items to process, in order: a list, or
        a ``KeylessRead`` streaming a keyless table (to be iterated at once,
        cut into fragments)."""
        now = time.monotonic()
        if self._want_initial:
            self._create_initial_job()
        if now >= self._next_request_check:
            self._next_request_check = now + _REQUEST_POLL_S
            self._take_requests()
        if not self.enabled:
            return []
        a = self._active
        if a is None and self._keyless is None:
            if now < self._next_chunk_at or not self._start_next_chunk():
                return []
        if self._keyless is not None:
            return self._keyless_read() if at_boundary else []
        a = self._active
        assert a is not None
        if a.window.phase is Phase.CLOSING:
            return self._emit(a) if at_boundary else []
        if not a.warned and now - a.started > _STUCK_WARN_S:
            a.warned = True
            log.warning("snapshot chunk of %s: the %s has not been seen in the binlog for %.0fs; the producer is far "
                        "behind the source, or the source does not log %s", a.table,
                        "high watermark" if a.window.phase is Phase.OPEN else "low watermark", now - a.started,
                        self.wm_schema if not self.scfg.read_only else "new transactions (no heartbeat?)")
        return []

    def wait_s(self) -> float:
        """How long the producer may block waiting for events before ``poll``
        has something to do."""
        if not self.enabled:
            return _REQUEST_POLL_S
        if self._keyless is not None:
            return 0.0
        a = self._active
        if a is not None:
            return 0.0 if a.window.phase is Phase.CLOSING else _REQUEST_POLL_S
        if self._maybe_work and self._next_work() is not None:
            return max(0.0, min(_REQUEST_POLL_S, self._next_chunk_at - time.monotonic()))
        return _REQUEST_POLL_S

    def checkpointed(self, pos: Position) -> None:
        """The producer's checkpoint moved to ``pos`` (see the module
        docstring: rows handed over before this call are shipped)."""
        if not self._emitted:
            return
        done = [e for e in self._emitted if e.at <= pos]
        if not done:
            return
        self._emitted = [e for e in self._emitted if not e.at <= pos]
        for e in done:
            self._finish_chunk(e)
        self._save()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._active = None
        if self.jobs:
            self._save()

    # ------------------------------------------------------------------
    # Observing the log
    # ------------------------------------------------------------------
    def _in_window(self, a: _Active, change: Change) -> bool:
        w = a.window
        if w.phase is Phase.WAIT_LOW:
            return False  # before the low watermark: the select saw it
        if w.marks is not None and w.phase is Phase.OPEN and w.marks.before_window(change.tid, change.txn):
            return False
        return True

    def _check_high(self, gtid: str, end: Position) -> None:
        a = self._active
        if a is None or a.window.marks is None or a.window.phase is not Phase.OPEN:
            return
        if a.window.marks.past_high(gtid) or a.window.marks.reached(end):
            a.window.phase = Phase.CLOSING

    def _on_ddl(self, change: Change) -> Change | None:
        if change.sql and any(same_statement(change.sql, s) for s in self._wm_ddl):
            return None  # our watermark table: nothing a target needs
        # A DDL may change what a row looks like: forget the cached shapes,
        # and read a chunk whose window it falls in again.
        self._schemas.clear()
        if self._active is not None:
            log.info("snapshot: DDL inside the window of a chunk of %s (%s): reading that chunk again",
                     self._active.table, " ".join((change.sql or "").split())[:120])
            self._abort("DDL in window")
        return change

    def _on_watermark(self, change: Change) -> None:
        wm = read_watermark(change)
        a = self._active
        if wm is None or a is None:
            return
        if wm.uuid == a.window.low_uuid and a.window.phase is Phase.WAIT_LOW:
            a.window.phase = Phase.OPEN
        elif wm.uuid == a.window.high_uuid:
            a.window.phase = Phase.CLOSING

    def _abort(self, why: str) -> None:
        self._active = None
        self.stats["aborted"] += 1
        log.debug("snapshot chunk aborted: %s", why)

    # ------------------------------------------------------------------
    # Chunks
    # ------------------------------------------------------------------
    def _connection(self) -> SnapshotConnection:
        if self._conn is None:
            self._conn = SnapshotConnection(self.cfg.source)
        return self._conn

    def _next_work(self) -> tuple[SnapshotJob, TableProgress] | None:
        if not self._maybe_work:
            return None
        for job in self.jobs:
            if job.status not in JOB_ACTIVE:
                continue
            for t in job.tables:
                if t.over:
                    continue
                cur = self._cursors.get((job.id, t.name))
                if cur is None or not cur.exhausted:
                    return job, t
        self._maybe_work = False
        return None

    def _start_next_chunk(self) -> bool:
        work = self._next_work()
        if work is None:
            return False
        job, tp = work
        if job.status == QUEUED:
            self._replace_job(replace(job, status=RUNNING, updated=time.time()))
            self._save()
        try:
            self._start_chunk(job.id, tp, job.where)
        except SnapshotError as exc:
            self._table_failed(job.id, tp, exc)
            return False
        return True

    def _table_failed(self, job_id: str, tp: TableProgress, exc: SnapshotError) -> None:
        log.error("snapshot %s: table %s failed: %s", job_id, tp.name, exc)
        self._conn_reset()
        self._set_table(job_id, replace(tp, status=FAILED, error=exc.message + (f" (fix: {exc.hint})" if exc.hint else "")))
        self._save()

    def _conn_reset(self) -> None:
        # After an error the session may be inside a transaction: start afresh.
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._watermarks = None
        self._gtid = None

    def _check_table(self, info: TableInfo, *, initial: bool, where: str) -> None:
        db, t = info.schema.database, info.schema.table
        if not self.filter(db, t):
            raise SnapshotRequestError(
                f"table {db}.{t} is not replicated ([source] include_tables/exclude_tables leave it out): its binlog "
                "events would not be seen, so a snapshot of it cannot be kept consistent",
                hint=f"add {db}.{t} to [source] include_tables, or leave it out of the snapshot")
        if not info.schema.key:
            check_keyless(info, initial=initial, where=where, allowed=self.scfg.allow_no_primary_key)

    def _start_chunk(self, job_id: str, tp: TableProgress, where: str) -> None:
        conn = self._connection()
        info = conn.describe(tp.database, tp.table)
        job = self._job(job_id)
        self._check_table(info, initial=job is not None and job.origin == "initial", where=where)
        if info.engine and info.engine.lower() != "innodb":
            log.warning("snapshot of %s: engine %s has no consistent reads; the watermark guarantee holds for "
                        "InnoDB tables only", tp.name, info.engine)
        key = info.schema.key
        if not key:
            self._keyless = _KeylessNext(job_id, tp, info, where)
            return
        cur = self._cursors.setdefault((job_id, tp.name), _Cursor(None))
        query = build_chunk_query(tp.database, tp.table, info.schema.columns, key,
                                  cur.last_key if key else None, self.scfg.chunk_size if key else None, where)
        extra: dict[str, Any] = {}
        if self.scfg.read_only:
            if self._gtid is None:
                self._gtid = GtidWatermarker(conn)
            raw, marks = self._gtid.select(query)
            phase = Phase.CLOSING if marks.reached(self._last_end) else Phase.OPEN
            extra["marks"] = marks
        else:
            if self._watermarks is None:
                self._watermarks = WatermarkTable(conn, self.wm_schema, self.cfg.producer.id)
            self._watermarks.ensure()
            extra["low_uuid"] = self._watermarks.write("low")
            raw = conn.query(query.sql, query.params)
            extra["high_uuid"] = self._watermarks.write("high")
            phase = Phase.WAIT_LOW
        convert = row_converter(info.schema.columns)
        idx = info.schema.key_indexes()
        window = ChunkWindow.of(tp.database, tp.table, idx, [convert(r) for r in raw], phase, **extra)
        last_key = tuple(raw[-1][i] for i in idx) if raw and key else None
        exhausted = not key or len(raw) < self.scfg.chunk_size
        self._active = _Active(job_id, tp.name, info, window, last_key, exhausted, time.monotonic())
        self._save()

    def _schema_for(self, info: TableInfo) -> TableSchema:
        """The binlog's own shape of the table when the log has shown it
        since the last DDL (the applier needs one shape per table and
        flush), else the one built from information_schema (equal to it
        for every type the row decoder knows)."""
        seen = self._schemas.get((info.schema.database, info.schema.table))
        if seen is not None and seen.column_names == info.schema.column_names and seen.key == info.schema.key:
            return seen
        return info.schema

    def _keyless_read(self) -> Iterable[Item]:
        """Open the consistent read of the pending keyless table at this
        boundary; its items, streamed (snapshot/keyless.py)."""
        k, self._keyless = self._keyless, None
        assert k is not None
        job = self._job(k.job_id)
        if job is None or job.status not in JOB_ACTIVE:
            return []  # paused or cancelled meanwhile
        try:
            read = ConsistentRead(self.cfg.source, k.info, k.where)
        except SnapshotError as exc:
            self._table_failed(k.job_id, k.tp, exc)
            return []
        db, t = k.info.schema.database, k.info.schema.table
        at, ts = self._last_end, self._last_ts or int(time.time())
        # Durable before any row is handed over: a log re-read after a crash
        # must drop the same changes (module docstring of keyless.py).
        self._drops.set(db, t, read.position)
        self._set_table(k.job_id, replace(job.table(k.tp.name), read_at=read.position.to_dict()))
        self._cursors[(k.job_id, k.tp.name)] = _Cursor(None, True)
        self._save()
        log.info("snapshot %s: reading %s (no primary key) whole at %s, consistent with binlog %s",
                 k.job_id, k.tp.name, at, read.position)

        def done(rows: int) -> None:
            self._emitted.append(_Emitted(k.job_id, k.tp.name, at, None, True, rows, rows, 0))
            self.stats["chunks"] += 1
            self.stats["rows"] += rows
            self._next_chunk_at = time.monotonic() + self.scfg.throttle_ms / 1000.0

        tid = f"{SNAPSHOT_TID_PREFIX}{k.job_id}:{uuid.uuid4().hex[:12]}"
        return KeylessRead(read, self._schema_for(k.info), row_converter(k.info.schema.columns), at, ts, tid, done,
                           self._stop)

    def _emit(self, a: _Active) -> list[Item]:
        w = a.window
        rows = w.remaining()
        schema = self._schema_for(a.info)
        at, ts = self._last_end, self._last_ts or int(time.time())
        tid = f"{SNAPSHOT_TID_PREFIX}{a.job_id}:{uuid.uuid4().hex[:12]}"
        out: list[Item] = [Change(Op.READ, w.database, w.table, tid, at, ts, schema, None, r) for r in rows]
        # The rows form a transaction of their own at the boundary ``at``:
        # begin == end, a valid resume point (nothing of the source lies in it).
        out.append(Commit(at, at, ts, ""))
        cur = self._cursors[(a.job_id, a.table)]
        self._cursors[(a.job_id, a.table)] = _Cursor(a.last_key if a.last_key is not None else cur.last_key,
                                                      a.exhausted)
        self._emitted.append(_Emitted(a.job_id, a.table, at, self._cursors[(a.job_id, a.table)].last_key,
                                      a.exhausted, len(rows), w.selected, w.dropped))
        self.stats["chunks"] += 1
        self.stats["rows"] += len(rows)
        self.stats["dropped"] += w.dropped
        self._active = None
        self._next_chunk_at = time.monotonic() + self.scfg.throttle_ms / 1000.0
        log.debug("snapshot %s: chunk of %s: %d rows selected, %d dropped (changed in the window), emitted at %s",
                  a.job_id, a.table, w.selected, w.dropped, at)
        return out

    def _finish_chunk(self, e: _Emitted) -> None:
        job = self._job(e.job_id)
        if job is None:
            return
        tp = job.table(e.table)
        tp = replace(tp, last_key=encode_key(e.last_key) if e.last_key is not None else tp.last_key,
                     chunks=tp.chunks + 1, rows=tp.rows + e.rows, scanned=tp.scanned + e.scanned,
                     dropped=tp.dropped + e.dropped, status=DONE if e.exhausted else tp.status)
        job = job.with_table(tp)
        if e.exhausted:
            log.info("snapshot %s: table %s done (%d rows in %d chunks, %d left to the log)", job.id, tp.name,
                     tp.rows, tp.chunks, tp.dropped)
        settled = job.settle()
        if settled is not job and settled.status in JOB_OVER:
            log.info("snapshot %s %s", job.id, "finished" if settled.status == DONE else f"ended: {settled.error}")
        self._replace_job(settled)

    # ------------------------------------------------------------------
    # Jobs and requests
    # ------------------------------------------------------------------
    def _job(self, job_id: str) -> SnapshotJob | None:
        return next((j for j in self.jobs if j.id == job_id), None)

    def _replace_job(self, job: SnapshotJob) -> None:
        self.jobs = [job if j.id == job.id else j for j in self.jobs]
        self._maybe_work = True

    def _set_table(self, job_id: str, tp: TableProgress) -> None:
        job = self._job(job_id)
        if job is not None:
            self._replace_job(job.with_table(tp).settle())

    def _save(self) -> None:
        a = self._active
        live = None if a is None else {"job": a.job_id, "table": a.table, "phase": a.window.phase.value,
                                       "selected": a.window.selected, "dropped": a.window.dropped,
                                       "age_s": round(time.monotonic() - a.started, 3)}
        self.store.save(self.jobs, live)

    def _create_initial_job(self) -> None:
        self._want_initial = False
        conn = self._connection()
        tables = [f"{d}.{t}" for d, t in conn.base_tables() if d != self.wm_schema and self.filter(d, t)]
        job = self._new_job(INITIAL_JOB_ID, "initial", tables, "", strict=False)
        log.info("first start at the source's current position: initial snapshot of %d tables (%s)",
                 len(job.tables), ", ".join(t.name for t in job.tables[:10]) + (" ..." if len(job.tables) > 10 else ""))
        self.jobs.append(job)
        self._maybe_work = True
        self._save()

    def _new_job(self, job_id: str, origin: str, tables: Sequence[str], where: str, *, strict: bool) -> SnapshotJob:
        """A job over ``tables``; each is checked now.  ``strict`` (explicit
        requests): a table that cannot be snapshotted fails; otherwise
        (initial snapshot) it is skipped with a warning."""
        conn = self._connection()
        progress = []
        for name in tables:
            db, _, t = name.partition(".")
            try:
                if not t:
                    raise SnapshotRequestError(f"{name!r} is not a table name 'db.table'")
                info = conn.describe(db, t)
                self._check_table(info, initial=origin == "initial", where=where)
                progress.append(TableProgress(name, estimate=info.rows_estimate))
            except SnapshotError as exc:
                msg = exc.message + (f" (fix: {exc.hint})" if exc.hint else "")
                if strict:
                    progress.append(TableProgress(name, status=FAILED, error=msg))
                else:
                    log.warning("initial snapshot skips %s: %s", name, msg)
                    progress.append(TableProgress(name, status=SKIPPED, error=msg))
        now = time.time()
        job = SnapshotJob(job_id, origin, QUEUED, tuple(progress), where, now, now)
        for tp in job.tables:
            self._cursors[(job.id, tp.name)] = _Cursor(None, tp.over)
        return job.settle()

    def _take_requests(self) -> None:
        for path, req in self.store.pending_requests():
            try:
                self._apply_request(req)
            except SnapshotError as exc:
                log.error("snapshot request %s refused: %s", path.name, exc)
                if req.get("action") == "start" and req.get("id") and self._job(str(req["id"])) is None:
                    # Recorded, so `cynomys snapshot` waiting for it sees why.
                    now = time.time()
                    self.jobs.append(SnapshotJob(str(req["id"]), "request", FAILED, (), str(req.get("where") or ""),
                                                 now, now, now, exc.message + (f" (fix: {exc.hint})" if exc.hint else "")))
            self._save()  # the result is durable before the request goes away
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def _matching(self, ident: str) -> list[SnapshotJob]:
        return [j for j in self.jobs if ident in ("*", "", j.id)]

    def _apply_request(self, req: dict[str, Any]) -> None:
        action = req.get("action")
        ident = str(req.get("id") or "")
        if action == "start":
            if self._job(ident) is not None:
                return  # applied before a crash; the request file outlived it
            tables = list(req.get("tables") or [])
            if not tables:
                conn = self._connection()
                tables = [f"{d}.{t}" for d, t in conn.base_tables() if d != self.wm_schema and self.filter(d, t)]
            job = self._new_job(ident, "request", tables, str(req.get("where") or ""), strict=True)
            log.info("snapshot %s requested: %s%s", job.id, ", ".join(t.name for t in job.tables),
                     f" where {job.where}" if job.where else "")
            self.jobs.append(job)
            self._maybe_work = True
        elif action in ("pause", "resume", "cancel"):
            for job in self._matching(ident):
                if action == "pause" and job.status in JOB_ACTIVE:
                    job = replace(job, status=PAUSED, updated=time.time())
                elif action == "resume" and job.status == PAUSED:
                    job = replace(job, status=QUEUED, updated=time.time())
                elif action == "cancel" and job.status in (*JOB_ACTIVE, PAUSED):
                    job = replace(job, status=CANCELLED, updated=time.time(), finished=time.time())
                    if self._active is not None and self._active.job_id == job.id:
                        self._abort("cancelled")
                else:
                    continue
                log.info("snapshot %s: %s", job.id, job.status)
                self._replace_job(job)
        else:
            log.warning("ignoring an unknown snapshot request: %r", req)
