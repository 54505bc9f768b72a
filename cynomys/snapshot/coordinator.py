"""SnapshotCoordinator: full-state capture inside the producer's loop.

A chunked task (snapshot/task.py: the lifecycle, the producer's protocol,
the resume invariant): DBLog chunks between low and high watermarks,
interleaved with the log, without locks.  What is the snapshot's own:

1. A chunk is the next ``chunk_size`` rows in key order after the last key
   (snapshot/chunker.py), selected between the watermarks in one go.
2. A row change of the chunk's table inside the window *drops* its key from
   the chunk (snapshot/window.py): the log carries that key's state.  A DDL
   inside the window throws the chunk away (it is read again).  The
   watermark table's events are dropped here, never shipped.
3. Past the high watermark, the rest of the chunk leaves at the next
   transaction boundary as READ changes followed by a ``Commit`` at that
   same boundary.
4. Confirming a chunk (the checkpoint passed it) persists its last key in
   snapshot.json: a producer restarted after a crash resumes after it, so a
   chunk is either finished or read again (READ rows are upserts).

Tables without a primary key are not chunked: they are read whole in one
consistent read streamed at a boundary (snapshot/keyless.py); ``poll``
returns that read as a ``KeylessRead`` the producer iterates.  Changes of
such a table in transactions beginning before the read's position are in
its rows and are dropped from the log (``DropRules``).

The initial snapshot: on the producer's first start at the source's
current end (``[snapshot] initial``), every replicated table.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Sequence

from cynomys.core.columnar import ReadRows
from cynomys.core.config import Config
from cynomys.core.model import Change, Op, Position
from cynomys.parser.txn import Commit, Item
from cynomys.snapshot.chunker import build_chunk_query, decode_key, encode_key
from cynomys.snapshot.columns import TableInfo, row_converter
from cynomys.snapshot.errors import SnapshotError, SnapshotRequestError
from cynomys.snapshot.keyless import SNAPSHOT_TID_PREFIX, ConsistentRead, DropRules, KeylessRead, check_keyless
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
from cynomys.snapshot.task import POLL_S, ChunkedTask, Cursor, Emitted
from cynomys.snapshot.window import ChunkWindow, Window

log = logging.getLogger(__name__)

INITIAL_JOB_ID = "initial"


@dataclass
class _Active:
    """The chunk between its watermarks."""

    job_id: str
    part: int
    info: TableInfo
    window: Window
    chunk: ChunkWindow
    after: list[Any] | None     # where the next chunk starts: the last key selected (encoded), else this one's start
    exhausted: bool             # fewer rows than a chunk: the table ends here


@dataclass(frozen=True)
class _Emitted(Emitted):
    """A chunk handed over, and what its table records once it is confirmed."""

    scanned: int
    dropped: int


@dataclass(frozen=True)
class _KeylessNext:
    """A keyless table whose read starts at the next transaction boundary."""

    job_id: str
    part: int
    info: TableInfo
    where: str


class SnapshotCoordinator(ChunkedTask[SnapshotJob, _Active, _Emitted]):
    kind = "snapshot"
    # The last task to see the watermark table's events (producer/tasks.py).
    drops_watermarks = True
    # Chunk selects with the faster driver where installed (snapshot/source.py).
    driver = "chunks"

    def __init__(self, cfg: Config, *, start: Position, first_start: bool, enabled: bool = True,
                 stop: threading.Event | None = None) -> None:
        super().__init__(cfg, SnapshotStore(cfg.resolve(cfg.producer.state_dir)), start=start, enabled=enabled)
        # The initial snapshot: only when the producer starts with no
        # checkpoint at the source's current end, i.e. without the history
        # the binlog may hold; with start = earliest or file:pos the binlog
        # is the history that was asked for.
        self._want_initial = (first_start and self.scfg.initial and cfg.source.start == "current"
                              and not any(j.id == INITIAL_JOB_ID for j in self.jobs))
        self._stop = stop
        self._keyless: _KeylessNext | None = None
        # Keyless tables read (or being read): their changes before the read's position are in it.
        self._drop_rules = DropRules()
        for j in self.jobs:
            for t in j.tables:
                if t.read_at:
                    self._drop_rules.set(t.database, t.table, Position.from_dict(t.read_at))
        self._dropping = self._drop_rules.drops  # a keyless table's change inside its consistent read
        self._throttle_s = self.scfg.throttle_ms / 1000.0
        self.stats.update(dropped=0, aborted=0)

    def wait_s(self) -> float:
        """How long the producer may block waiting for events before ``poll``
        has something to do."""
        if not self.enabled:
            return POLL_S
        if self._keyless is not None:
            return 0.0
        a = self._reading
        if a is not None:
            return 0.0 if a.window.closing else POLL_S
        return self._next_chunk_due_s()

    # ------------------------------------------------------------------
    # The log
    # ------------------------------------------------------------------
    def _idle(self) -> bool:
        return self._reading is None and self._keyless is None

    def _on_change(self, f: _Active, change: Change) -> None:
        f.chunk.on_change(change, True)

    def _on_ddl(self, change: Change) -> None:
        # A chunk whose window a DDL falls in is read again.
        if self._reading is not None:
            log.info("snapshot: DDL inside the window of a chunk of %s (%s): reading that chunk again",
                     self._reading.info.name, " ".join((change.sql or "").split())[:120])
            self._abort("DDL in window")

    def _abort(self, why: str) -> None:
        self._reading = None
        self.stats["aborted"] += 1
        log.debug("snapshot chunk aborted: %s", why)

    def _drop_work(self, job_id: str | None, part: int | None = None) -> None:
        if self._concerns(self._reading, job_id, part):
            self._reading = None
        if self._concerns(self._keyless, job_id, part):
            self._keyless = None

    # ------------------------------------------------------------------
    # Chunks
    # ------------------------------------------------------------------
    def _prepare(self) -> None:
        if self._want_initial:
            self._create_initial_job()

    def _check_table(self, info: TableInfo, *, initial: bool, where: str) -> None:
        db, t = info.schema.database, info.schema.table
        if not self.filter(db, t):
            raise SnapshotRequestError(
                f"table {db}.{t} is not replicated ([source] include_tables/exclude_tables leave it out): its binlog "
                "events would not be seen, so a snapshot of it cannot be kept consistent",
                hint=f"add {db}.{t} to [source] include_tables, or leave it out of the snapshot")
        if not info.schema.key:
            check_keyless(info, initial=initial, where=where, allowed=self.scfg.allow_no_primary_key)

    def _start(self, job: SnapshotJob, i: int) -> bool:
        if job.status == QUEUED:
            now = time.time()
            self._replace(replace(job, status=RUNNING, updated=now, started=job.started or now))
            self._save()
        tp = job.tables[i]
        conn = self._connection()
        info = conn.describe(tp.database, tp.table)
        self._check_table(info, initial=job.origin == "initial", where=job.where)
        if info.engine and info.engine.lower() != "innodb":
            log.warning("snapshot of %s: engine %s has no consistent reads; the watermark guarantee holds for "
                        "InnoDB tables only", tp.name, info.engine)
        key = info.schema.key
        if not key:
            self._keyless = _KeylessNext(job.id, i, info, job.where)
            return True
        after = self._cursor(job.id, i, tp).after
        query = build_chunk_query(tp.database, tp.table, info.schema.columns, key, decode_key(after),
                                  self.scfg.chunk_size, job.where)
        raw, window = self._watermarks().select(query, self._last_end)
        convert = row_converter(info.schema.columns)
        idx = info.schema.key_indexes()
        chunk = ChunkWindow.of(tp.database, tp.table, idx, [convert(r) for r in raw])
        if raw:
            after = encode_key(tuple(raw[-1][k] for k in idx))  # driver values, as the next select takes them
        self._reading = _Active(job.id, i, info, window, chunk, after, len(raw) < self.scfg.chunk_size)
        self._save()
        return True

    def _work(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        if self._keyless is not None:
            return self._keyless_read() if at_boundary else []
        a = self._reading
        assert a is not None
        return self._emit(a) if a.window.closing and at_boundary else []

    def _keyless_read(self) -> Sequence[Item] | KeylessRead:
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
            self._conn_reset()
            self._fail(k.job_id, k.part, exc.one_line())
            return []
        db, t = k.info.schema.database, k.info.schema.table
        at, ts = self._emission()
        # Durable before any row is handed over: a log re-read after a crash
        # must drop the same changes (module docstring of keyless.py).
        self._drop_rules.set(db, t, read.position)
        self._replace(job.with_table(replace(job.tables[k.part], read_at=read.position.to_dict())).settle())
        self._cursors[(k.job_id, k.part)] = Cursor(None, True)
        self._save()
        log.info("snapshot %s: reading %s (no primary key) whole at %s, consistent with binlog %s",
                 k.job_id, k.info.name, at, read.position)

        def done(rows: int) -> None:
            self._hand_over(_Emitted(k.job_id, k.part, at, None, True, rows, rows, 0))

        tid = f"{SNAPSHOT_TID_PREFIX}{k.job_id}:{uuid.uuid4().hex[:12]}"
        return KeylessRead(read, self._schema_for(k.info), row_converter(k.info.schema.columns), at, ts, tid, done,
                           self._stop)

    def _emit(self, a: _Active) -> list[Item]:
        c = a.chunk
        rows = c.remaining()
        schema = self._schema_for(a.info)
        at, ts = self._emission()
        tid = f"{SNAPSHOT_TID_PREFIX}{a.job_id}:{uuid.uuid4().hex[:12]}"
        # One ReadRows for the chunk, not a Change per row (core/columnar.py):
        # the wire carries a READ record per row all the same.
        out: list[Item] = [ReadRows(Op.READ, c.database, c.table, tid, at, ts, schema, reads=tuple(rows))] if rows else []
        # The rows form a transaction of their own at the boundary ``at``:
        # begin == end, a valid resume point (nothing of the source lies in it).
        out.append(Commit(at, at, ts, ""))
        self._reading = None
        self._hand_over(_Emitted(a.job_id, a.part, at, a.after, a.exhausted, len(rows), c.selected, c.dropped))
        self.stats["dropped"] += c.dropped
        log.debug("snapshot %s: chunk of %s: %d rows selected, %d dropped (changed in the window), emitted at %s",
                  a.job_id, a.info.name, c.selected, c.dropped, at)
        return out

    def _confirmed(self, job: SnapshotJob, e: _Emitted) -> SnapshotJob:
        tp = job.tables[e.part]
        tp = replace(tp, last_key=e.after if e.after is not None else tp.last_key,
                     chunks=tp.chunks + 1, rows=tp.rows + e.rows, scanned=tp.scanned + e.scanned,
                     dropped=tp.dropped + e.dropped, status=DONE if e.exhausted else tp.status)
        job = job.with_table(tp)
        if e.exhausted:
            log.info("snapshot %s: table %s done (%d rows in %d chunks, %d left to the log)", job.id, tp.name,
                     tp.rows, tp.chunks, tp.dropped)
        settled = job.settle()
        if settled is not job and settled.status in JOB_OVER:
            log.info("snapshot %s %s", job.id, "finished" if settled.status == DONE else f"ended: {settled.error}")
        return settled

    # ------------------------------------------------------------------
    # Jobs and requests
    # ------------------------------------------------------------------
    def _live(self) -> dict[str, Any] | None:
        a = self._reading
        return None if a is None else {"job": a.job_id, "table": a.info.name, "phase": a.window.phase.value,
                                       "selected": a.chunk.selected, "dropped": a.chunk.dropped,
                                       "age_s": round(time.monotonic() - a.window.opened, 3)}

    def _create_initial_job(self) -> None:
        self._want_initial = False
        conn = self._connection()
        tables = [f"{d}.{t}" for d, t in conn.base_tables() if d != self.wm_schema and self.filter(d, t)]
        job = self._new_job(INITIAL_JOB_ID, "initial", tables, "", strict=False)
        log.info("first start at the source's current position: initial snapshot of %d tables (%s)",
                 len(job.tables), ", ".join(t.name for t in job.tables[:10]) + (" ..." if len(job.tables) > 10 else ""))
        self._set_jobs([*self.jobs, job])
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
                if strict:
                    progress.append(TableProgress(name, status=FAILED, error=exc.one_line()))
                else:
                    log.warning("initial snapshot skips %s: %s", name, exc.one_line())
                    progress.append(TableProgress(name, status=SKIPPED, error=exc.one_line()))
        now = time.time()
        return SnapshotJob(job_id, origin, QUEUED, tuple(progress), where, now, now).settle()

    def _refused(self, req: dict[str, Any], reason: str) -> SnapshotJob | None:
        if req.get("action") != "start":
            return None
        now = time.time()
        return SnapshotJob(str(req["id"]), "request", FAILED, (), str(req.get("where") or ""), now, now, now, reason)

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
            self._set_jobs([*self.jobs, job])
        elif action in ("pause", "resume", "cancel"):
            for job in self._matching(ident):
                if action == "pause" and job.status in JOB_ACTIVE:
                    job = replace(job, status=PAUSED, updated=time.time())
                elif action == "resume" and job.status == PAUSED:
                    job = replace(job, status=QUEUED, updated=time.time())
                elif action == "cancel" and job.status in (*JOB_ACTIVE, PAUSED):
                    job = replace(job, status=CANCELLED, updated=time.time(), finished=time.time())
                    if self._reading is not None and self._reading.job_id == job.id:
                        self._abort("cancelled")
                else:
                    continue
                log.info("snapshot %s: %s", job.id, job.status)
                self._replace(job)
        else:
            log.warning("ignoring an unknown snapshot request: %r", req)
