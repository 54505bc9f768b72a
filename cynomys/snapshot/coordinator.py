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

import itertools
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from cynomys.core.columnar import ManyRows
from cynomys.core.config import Config
from cynomys.core.gtid import GtidSet, flavor_of, mariadb_seq
from cynomys.core.model import Change, Op, Position, Value
from cynomys.parser.txn import Commit, Item
from cynomys.snapshot.chunker import decode_key, encode_key
from cynomys.snapshot.columns import TableInfo, row_converter
from cynomys.snapshot.errors import SnapshotError, SnapshotRequestError
from cynomys.snapshot.keyless import (
    SNAPSHOT_TID_PREFIX,
    ConsistentRead,
    DropRules,
    KeylessRead,
    check_keyless,
    truncate_sql,
)
from cynomys.snapshot.readers import ChunkReaders, Plan, ReadRequest, ReadResult
from cynomys.snapshot.source import MODEL_TYPES, chunk_driver
from cynomys.snapshot.state import (
    CANCELLED,
    DONE,
    FAILED,
    JOB_ACTIVE,
    JOB_OVER,
    KEYLESS_PHASE,
    PAUSED,
    QUEUED,
    RUNNING,
    SKIPPED,
    SnapshotJob,
    SnapshotStore,
    TableProgress,
)
from cynomys.snapshot.task import POLL_S, ChunkedTask, Cursor, Emitted
from cynomys.snapshot.window import ChunkWindow, Phase, Window, python_ordered

log = logging.getLogger(__name__)

#: Statements that may rename a table (RENAME TABLE[S], ALTER TABLE ... RENAME
#: [TO|AS]); only these are parsed by the rename check.
_RENAMES = re.compile(r"\bRENAME\b", re.IGNORECASE)
#: Job origins whose keyless tables are cleared and read again without
#: ``allow_no_primary_key`` (check_keyless): the target's copy is new (the
#: initial snapshot) or a shadow table's empty copy (a table renamed in).
_NEW_ON_TARGET = ("initial", "rename")

INITIAL_JOB_ID = "initial"
#: How often a keyless read's rows so far are written to the state file.
PROGRESS_SAVE_S = 2.0
#: How soon the producer looks again for a reader thread's answer.
_RESULT_POLL_S = 0.005
#: Rows per chunk when ``chunk_size`` is 0: ``chunk_bytes`` of the table's
#: average row, within these bounds (a table the statistics call empty
#: gets chunks of _DEFAULT_ROW_BYTES rows' worth).
_MIN_CHUNK_ROWS, _MAX_CHUNK_ROWS, _DEFAULT_ROW_BYTES = 1000, 200_000, 200


@dataclass
class _Active:
    """A chunk between its watermarks (a flight): its window is watched from
    before the read is queued; its rows come from a reader thread
    (snapshot/readers.py).  Keys the log changes in the window before they
    come are kept (``changed``) and dropped from them then."""

    job_id: str
    part: int
    info: TableInfo
    window: Window
    flight: int
    chunk: ChunkWindow | None = None     # the rows, once read
    seq: int = -1                        # its place in its table's chunks (from the plan), once read
    after: list[Any] | None = None       # encoded key the table's next chunk starts after, once read
    exhausted: bool = False              # the table's last chunk
    changed: set[tuple[Value, ...]] = field(default_factory=set)
    # Read-only windows before their GTID marks came: (key, gtid, begin) of
    # each change, placed against the marks when they come.
    seen: list[tuple[tuple[Value, ...], str, Position]] | None = None

    @property
    def ready(self) -> bool:
        """Read, and the log is past its high watermark."""
        return self.chunk is not None and self.window.closing


@dataclass
class _Part:
    """A table of a job being read in chunks: its plan (shared with the
    readers), the next chunk to hand over, its rows per chunk."""

    plan: Plan
    info: TableInfo
    rows: int
    next_seq: int = 0
    # Its target table to be cleared before the first chunk's window opens
    # (``_clears``): a table renamed in from one nobody replicates.
    clear: bool = False


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
    # Chunks go in envelopes of their own (producer/batching.py starts one
    # before them): READ-only envelopes decode column-wise on the applier.
    flush_after = True
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
        # The keyless read being streamed (job, table, read), for progress.
        self._streaming: tuple[str, str, KeylessRead] | None = None
        self._progress_saved = 0.0
        # Keyless tables read (or being read): their changes before the read's position are in it.
        self._drop_rules = DropRules()
        for j in self.jobs:
            for t in j.tables:
                if t.read_at:
                    self._drop_rules.set(t.database, t.table, Position.from_dict(t.read_at))
        self._dropping = self._drop_rules.drops  # a keyless table's change inside its consistent read
        self._throttle_s = self.scfg.throttle_ms / 1000.0
        self.stats.update(dropped=0, aborted=0, replica_lags=0)
        self._lag_warned_at = -1e9
        self._pool: ChunkReaders | None = None
        self._parts: dict[tuple[str, int], _Part] = {}
        self._by_flight: dict[int, _Active] = {}
        self._flights = itertools.count(1)
        # MariaDB GTIDs the log has passed, domain -> highest seq (from the
        # start's and every commit's): where a rename's job may start.
        self._gtid_seqs = dict(GtidSet.parse_mariadb(start.gtid).seqs) if flavor_of(start.gtid) == "mariadb" else {}

    def wait_s(self) -> float:
        """How long the producer may block waiting for events before ``poll``
        has something to do."""
        if not self.enabled:
            return POLL_S
        if self._keyless is not None or any(f.ready for f in self._inflight):
            return 0.0
        if self._pool is not None and (self._pool.busy or not self._pool.results.empty()):
            return _RESULT_POLL_S  # a reader thread will answer: look again soon
        if self._room() and self._next_part() is not None:
            return max(0.0, min(POLL_S, self._next_chunk_at - time.monotonic()))
        return POLL_S

    # ------------------------------------------------------------------
    # The log
    # ------------------------------------------------------------------
    def _idle(self) -> bool:
        return not self._inflight and self._keyless is None

    def _on_change(self, f: _Active, change: Change) -> None:
        if f.chunk is not None:
            f.chunk.on_change(change, True)
            return
        # Not read yet: remember the keys (both images: an UPDATE may move a row).
        idx = f.info.schema.key_indexes()
        for image in (change.before, change.after):
            if image is not None:
                k = tuple(image[i] for i in idx)
                if f.seen is not None:
                    f.seen.append((k, change.tid, change.txn))
                else:
                    f.changed.add(k)

    def _drops_some(self) -> bool:
        return bool(self._drop_rules.before)  # ``_dropping`` is always set; it drops only these tables' changes

    def _on_ddl(self, change: Change) -> None:
        # Chunks whose windows a DDL falls in are read again.
        if self._inflight:
            log.info("snapshot: DDL inside the window of %d chunk(s) (%s): reading them again",
                     len(self._inflight), " ".join((change.sql or "").split())[:120])
            self._abort("DDL in window")
        self._snapshot_renamed_in(change)

    def _snapshot_renamed_in(self, change: Change) -> None:
        """A table renamed from a name the producer does not replicate to
        one it does brings rows whose events it never read: an online schema
        change (gh-ost, pt-online-schema-change) copies the rows into a
        shadow table, then swaps it in -- with include_tables naming only
        the table, the target was left with the shadow's empty copy; a table
        renamed out, changed and renamed back kept on the target the rows
        deleted meanwhile.  Such a table is cleared on the target and read
        whole (``_clears``), by a request written before the producer's
        checkpoint can pass the statement (a crash reads it again and asks
        again under the same id: taken once)."""
        if not change.sql or not _RENAMES.search(change.sql):
            return
        from cynomys.parser.ddl import RenameTable, UnsupportedDdl, parse_ddl  # sqlglot: only on a rename

        try:
            ops = parse_ddl(change.sql, change.database)
        except UnsupportedDdl:
            return  # the applier stops on it, naming the statement
        came_in = [f"{new[0]}.{new[1]}" for op in ops if isinstance(op, RenameTable)
                   for old, new in op.pairs if not self.filter(*old) and self.filter(*new)]
        if not came_in:
            return
        ident = "rename-" + "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in change.tid)
        log.warning("%s renamed into the replicated tables from a table that is not replicated: its rows were "
                    "never read from the log; snapshot %s reads them", ", ".join(came_in), ident)
        self.store.submit({"action": "start", "id": ident, "tables": came_in, "where": "", "origin": "rename",
                           "not_before": f"{change.txn.file}:{change.txn.pos}", "not_before_gtid": change.tid})

    def _abort(self, why: str) -> None:
        self._drop_work(None)
        self.stats["aborted"] += 1
        log.debug("snapshot chunks aborted: %s", why)

    def _drop_work(self, job_id: str | None, part: int | None = None) -> None:
        """Forget the chunks in flight (and the plans) of ``job_id``/``part``:
        their parts start again after the last chunk handed over; a reader's
        late answer about one is ignored."""
        gone = [f for f in self._inflight if self._concerns(f, job_id, part)]
        if gone:
            self._inflight = tuple(f for f in self._inflight if not self._concerns(f, job_id, part))
            for f in gone:
                self._by_flight.pop(f.flight, None)
        for k in [k for k in self._parts if job_id in (None, k[0]) and part in (None, k[1])]:
            del self._parts[k]
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

    def poll(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        """This turn's work: requests; the readers' answers; more chunks to
        read; at a transaction boundary, the chunks that are ready (or a
        keyless table's read)."""
        now = self._begin_turn()
        if now is None:
            return []
        self._collect()
        if self._keyless is None:
            self._fill(now)
        if not at_boundary:
            return []
        cleared = self._clears()
        if cleared:
            return cleared
        out = self._emit_ready()
        if not out and self._keyless is not None and not self._inflight:
            # A keyless table's read, once every chunk before it is handed over.
            return self._keyless_read()
        self._warn_if_stuck(now)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        super().close()

    def _readers(self) -> ChunkReaders:
        if self._pool is None:
            self._pool = ChunkReaders(self.cfg, self.scfg.max_connections)
        return self._pool

    def _room(self) -> bool:
        """May another chunk be queued?  At most ``max_connections`` reads at
        once and twice as many chunks held (memory)."""
        size = self.scfg.max_connections
        busy = self._pool.busy if self._pool is not None else 0
        return self._keyless is None and busy < size and len(self._inflight) < 2 * size

    def _next_part(self) -> tuple[SnapshotJob, int] | None:
        """The oldest active job's first table with a chunk left to queue."""
        if not self._maybe_work:
            return None
        held = False
        for job in self.jobs:
            if not job.active:
                continue
            if not self._past_its_statement(job):
                held = True
                continue
            for i, tp in enumerate(job.tables):
                if tp.over or self._cursor(job.id, i, tp).exhausted:
                    continue
                p = self._parts.get((job.id, i))
                if p is None or not p.plan.done:
                    return job, i
        if not self._inflight and not held:
            self._maybe_work = False
        return None

    def _passed(self, gtid: str, end: Position) -> None:
        super()._passed(gtid, end)
        ds = mariadb_seq(gtid)
        if ds is not None:
            self._gtid_seqs[ds[0]] = max(ds[1], self._gtid_seqs.get(ds[0], 0))

    def _past_its_statement(self, job: SnapshotJob) -> bool:
        """Has the log gone past the statement that asked for ``job``?  A
        producer killed after asking resumes before the RENAME: read at once,
        the table's rows went into the target's table of the old name, which
        the RENAME, applied after them, then moved away.  By its MariaDB GTID
        (which holds across a failover, gtid_strict_mode); else by binlog
        position, where the log is of the same server's files (another's
        cannot be compared: not held)."""
        ds = mariadb_seq(job.not_before_gtid)
        if ds is not None:
            return self._gtid_seqs.get(ds[0], -1) >= ds[1]
        if not job.not_before:
            return True
        mark, end = Position.parse(job.not_before), self._last_end
        if not end.file or end.file.rpartition(".")[0] != mark.file.rpartition(".")[0]:
            return True
        return mark < end

    def _part(self, job: SnapshotJob, i: int) -> _Part | None:
        """The table's plan, made at its first chunk (None: a keyless table,
        now pending)."""
        p = self._parts.get((job.id, i))
        if p is not None:
            return p
        tp = job.tables[i]
        info = self._connection().describe(tp.database, tp.table)
        self._check_table(info, initial=job.origin in _NEW_ON_TARGET, where=job.where)
        if info.engine and info.engine.lower() != "innodb":
            log.warning("snapshot of %s: engine %s has no consistent reads; the watermark guarantee holds for "
                        "InnoDB tables only", tp.name, info.engine)
        if not info.schema.key:
            self._keyless = _KeylessNext(job.id, i, info, job.where)
            return None
        cur = self._cursor(job.id, i, tp)
        rows = self._chunk_rows(info)
        # A keyed table renamed in holds on the target what it held when it
        # went out (or a shadow's empty copy): the chunks only upsert, so the
        # rows deleted meanwhile would stay.  Cleared first, unless a chunk
        # of it went out already (the clear went before it).
        clear = job.origin == "rename" and cur.after is None
        p = self._parts[(job.id, i)] = _Part(Plan(decode_key(cur.after)), info, rows, clear=clear)
        log.info("snapshot %s: %s in chunks of %d rows (%d readers)", job.id, tp.name, rows,
                 self.scfg.max_connections)
        return p

    def _chunk_rows(self, info: TableInfo) -> int:
        """Rows per chunk: ``chunk_size`` when set, else about ``chunk_bytes``
        of the table's average row (information_schema), within bounds."""
        if self.scfg.chunk_size:
            return self.scfg.chunk_size
        width = max(1, info.avg_row_bytes or _DEFAULT_ROW_BYTES)
        return max(_MIN_CHUNK_ROWS, min(_MAX_CHUNK_ROWS, self.scfg.chunk_bytes // width))

    def _fill(self, now: float) -> None:
        """Queue chunks to the readers while there is room."""
        while self._room() and now >= self._next_chunk_at:
            work = self._next_part()
            if work is None:
                return
            job, i = work
            try:
                if job.status == QUEUED:
                    t = time.time()
                    self._replace(replace(job, status=RUNNING, updated=t, started=job.started or t))
                    self._save()
                    job = self._job(job.id) or job
                p = self._part(job, i)
            except SnapshotError as exc:
                self._conn_reset()
                self._fail(job.id, i, exc.one_line())
                continue
            if p is None or p.clear:
                # A keyless table: read once the chunks in flight are handed
                # over; a table to clear: at the next boundary.
                return
            self._queue(job, i, p)

    def _queue(self, job: SnapshotJob, i: int, p: _Part,
               fixed: tuple[int, tuple[Any, ...] | None, tuple[Any, ...]] | None = None) -> None:
        flight = next(self._flights)
        if self.scfg.read_only:
            # Its GTID marks come with its rows; until then the changes are kept (seen).
            f = _Active(job.id, i, p.info, Window(Phase.OPEN), flight, seen=[])
            low = high = ""
        else:
            low, high = str(uuid.uuid4()), str(uuid.uuid4())
            f = _Active(job.id, i, p.info, Window(Phase.WAIT_LOW, low, high), flight)
        self._inflight = (*self._inflight, f)
        self._by_flight[flight] = f
        self._readers().submit(ReadRequest(flight, p.plan, p.info, job.where, p.rows, low, high, fixed))

    def _collect(self) -> None:
        """Take the readers' answers: rows into their chunks (a reader's
        error is raised here, or fails its table)."""
        if self._pool is None:
            return
        for res in self._pool.collect():
            f = self._by_flight.get(res.flight)
            if f is None:
                continue  # dropped meanwhile (DDL, cancel): its rows go
            if res.lagging is not None:
                self._replica_lags(f, res)
                continue
            if res.error is not None:
                if isinstance(res.error, SnapshotError):
                    self._fail(f.job_id, f.part, res.error.one_line())
                    continue
                raise res.error
            if res.seq < 0:  # nothing was left to read: the table's last chunk was planned by another
                self._forget(f)
                continue
            if f.seen is not None:
                assert res.marks is not None
                f.window.marks = res.marks
                f.window.phase = Phase.CLOSING if res.marks.reached(self._last_end) else Phase.OPEN
                f.changed.update(k for k, gtid, begin in f.seen if not res.marks.before_window(gtid, begin))
                f.seen = None
            schema = f.info.schema
            chunk = ChunkWindow.of(schema.database, schema.table, schema.key_indexes(), res.rows,
                                   ordered=python_ordered(schema))
            for k in f.changed:
                chunk.drop_key(k)
            f.changed = set()
            f.chunk, f.seq, f.exhausted = chunk, res.seq, res.exhausted
            f.after = encode_key(res.end if res.end is not None else res.start)

    def _forget(self, f: _Active) -> None:
        """A flight that brought no rows: out of the chunks in flight."""
        self._inflight = tuple(x for x in self._inflight if x is not f)
        del self._by_flight[f.flight]

    def _replica_lags(self, f: _Active, res: ReadResult) -> None:
        """The replica had not applied the chunk's low watermark within
        ``replica_wait_s``: its window goes (a window keeps every key the log
        changes in it, so none stays open for as long as a replica may lag)
        and the chunk is asked for again with new watermarks -- a planned
        range as it was, else the table's next chunk from its plan.  Warned
        once per wait: the snapshot stands still, the log goes on."""
        self._forget(f)
        self.stats["replica_lags"] += 1
        now = time.monotonic()
        if now - self._lag_warned_at >= self.scfg.replica_wait_s:
            self._lag_warned_at = now
            log.warning("%s; the snapshot of %s.%s waits for it, the log goes on", res.lagging,
                        f.info.schema.database, f.info.schema.table)
        job, p = self._job(f.job_id), self._parts.get((f.job_id, f.part))
        if res.seq >= 0 and res.end is not None and job is not None and p is not None:
            self._queue(job, f.part, p, (res.seq, res.start, res.end))

    def _clears(self) -> list[Item]:
        """The TRUNCATEs of the tables to clear, as one transaction at this
        boundary, before any chunk of them is queued: every chunk's window
        opens after it, so a change the log brings meanwhile is applied after
        it or read by a chunk.  A producer stopped before it is shipped clears
        again when it reads the table from its first chunk again."""
        todo = [(key, p) for key, p in self._parts.items() if p.clear]
        if not todo:
            return []
        at, ts = self._emission()
        out: list[Item] = []
        # One transaction: one id for its statements (as _emit_ready's chunks).
        tid = f"{SNAPSHOT_TID_PREFIX}{todo[0][0][0]}:{uuid.uuid4().hex[:12]}"
        for (job_id, _), p in todo:
            db, t = p.info.schema.database, p.info.schema.table
            out.append(Change(Op.DDL, db, t, tid, at, ts, sql=truncate_sql(db, t)))
            p.clear = False
            log.info("snapshot %s: clearing %s on the target before reading it whole (renamed in)", job_id,
                     p.info.name)
        out.append(Commit(at, at, ts, ""))
        return out

    def _emit_ready(self) -> list[Item]:
        """The chunks ready, each table's in order, as one transaction at
        this boundary."""
        if not any(f.ready for f in self._inflight):
            return []
        at, ts = self._emission()
        out: list[Item] = []
        emitted: list[_Active] = []
        tid = ""
        for key, p in list(self._parts.items()):
            mine = {f.seq: f for f in self._inflight if (f.job_id, f.part) == key and f.chunk is not None}
            while p.next_seq in mine and mine[p.next_seq].ready:
                f = mine.pop(p.next_seq)
                p.next_seq += 1
                # One transaction: one id for its chunks.
                tid = tid or f"{SNAPSHOT_TID_PREFIX}{f.job_id}:{uuid.uuid4().hex[:12]}"
                out.extend(self._emit(f, at, ts, tid))
                emitted.append(f)
                if f.exhausted:
                    del self._parts[key]
                    break
        if not emitted:
            return []
        self._inflight = tuple(f for f in self._inflight if f not in emitted)
        for f in emitted:
            self._by_flight.pop(f.flight, None)
        # The rows form a transaction of their own at the boundary ``at``:
        # begin == end, a valid resume point (nothing of the source lies in it).
        out.append(Commit(at, at, ts, ""))
        return out

    def _keyless_read(self) -> Sequence[Item] | KeylessRead:
        """Open the consistent read of the pending keyless table at this
        boundary; its items, streamed (snapshot/keyless.py)."""
        k, self._keyless = self._keyless, None
        assert k is not None
        job = self._job(k.job_id)
        if job is None or job.status not in JOB_ACTIVE:
            return []  # paused or cancelled meanwhile
        try:
            read = ConsistentRead(self.cfg.source, k.info, k.where, chunk_driver(self.cfg.source, self.scfg.driver))
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
            self._streaming = None
            self._hand_over(_Emitted(k.job_id, k.part, at, None, True, rows, rows, 0))

        tid = f"{SNAPSHOT_TID_PREFIX}{k.job_id}:{uuid.uuid4().hex[:12]}"
        convert = row_converter(k.info.schema.columns, MODEL_TYPES[read.driver])
        stream = KeylessRead(read, self._schema_for(k.info), convert, at, ts, tid, done,
                             self._stop, self._keyless_progress, self._chunk_rows(k.info))
        self._streaming = (k.job_id, k.info.name, stream)
        self._progress_saved = time.monotonic()
        return stream

    def _keyless_progress(self, rows: int) -> None:
        """A keyless read streams for minutes without a chunk finishing: its
        rows so far go to the state file every PROGRESS_SAVE_S (`cynomys
        status`: rows read, rate, ETA)."""
        if time.monotonic() - self._progress_saved >= PROGRESS_SAVE_S:
            self._progress_saved = time.monotonic()
            self._save()

    def _emit(self, a: _Active, at: Position, ts: int, tid: str) -> list[Item]:
        c = a.chunk
        assert c is not None
        rows = c.remaining()
        schema = self._schema_for(a.info)
        self._hand_over(_Emitted(a.job_id, a.part, at, a.after, a.exhausted, len(rows), c.selected, c.dropped))
        self.stats["dropped"] += c.dropped
        log.debug("snapshot %s: chunk %d of %s: %d rows selected, %d dropped (changed in the window), emitted at %s",
                  a.job_id, a.seq, a.info.name, c.selected, c.dropped, at)
        # One ManyRows for the chunk, not a Change per row (core/columnar.py):
        # the wire carries a READ record per row all the same.
        return [ManyRows(Op.READ, c.database, c.table, tid, at, ts, schema, images=tuple(rows))] if rows else []

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
        if self._streaming is not None and self._streaming[2].reading:
            job_id, name, stream = self._streaming
            return {"job": job_id, "table": name, "phase": KEYLESS_PHASE, "chunks_in_flight": 1, "reading": 1,
                    "selected": stream.rows}
        if not self._inflight:
            return None
        a = self._inflight[0]
        return {"job": a.job_id, "table": a.info.name, "phase": a.window.phase.value,
                "chunks_in_flight": len(self._inflight), "reading": sum(f.chunk is None for f in self._inflight),
                "selected": sum(f.chunk.selected for f in self._inflight if f.chunk is not None),
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
                self._check_table(info, initial=origin in _NEW_ON_TARGET, where=where)
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
            origin = "rename" if req.get("origin") == "rename" else "request"
            job = self._new_job(ident, origin, tables, str(req.get("where") or ""), strict=True)
            if origin == "rename":
                job = replace(job, not_before=str(req.get("not_before") or ""),
                              not_before_gtid=str(req.get("not_before_gtid") or ""))
            log.info("snapshot %s requested: %s%s", job.id, ", ".join(t.name for t in job.tables),
                     f" where {job.where}" if job.where else "")
            self._set_jobs([*self.jobs, job])
        elif action in ("pause", "resume", "cancel"):
            for job in self._matching(ident):
                if action == "pause" and job.status in JOB_ACTIVE:
                    job = replace(job, status=PAUSED, updated=time.time())
                    self._drop_work(job.id)  # its chunks in flight are read again on resume
                elif action == "resume" and job.status == PAUSED:
                    job = replace(job, status=QUEUED, updated=time.time())
                elif action == "cancel" and job.status in (*JOB_ACTIVE, PAUSED):
                    job = replace(job, status=CANCELLED, updated=time.time(), finished=time.time())
                    self._drop_work(job.id)
                else:
                    continue
                log.info("snapshot %s: %s", job.id, job.status)
                self._replace(job)
        else:
            log.warning("ignoring an unknown snapshot request: %r", req)
