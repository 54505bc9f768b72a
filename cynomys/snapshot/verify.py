"""VerifyCoordinator: in-stream checksums of key-range chunks (`cynomys verify`).

It runs inside the producer's loop next to the SnapshotCoordinator and uses
the same DBLog windows, so it never locks the source and works while writes
go on:

1. ``poll`` writes a low watermark, selects the next chunk (``chunk_size``
   rows in key order after the last chunk's end), writes a high watermark.
   The chunk covers the key range ``lo < key <= hi`` (hi: its last key; the
   last chunk of a table runs to the end).
2. ``observe`` sees the log go on.  A row change of the chunk's table inside
   the window may or may not be in the select, so it is *applied* to the
   chunk instead: a before image in the range removes its key, an after
   image in the range sets the row (full row images make each one the row's
   whole state).  That is the same whether the select saw the change or not,
   so once the log is past the high watermark the chunk holds the range
   exactly as the source had it at the stream's current position.
3. At the next transaction boundary the chunk leaves as one CHECKSUM record
   (row count + canonical multiset hash, snapshot/checksum.py) in a
   transaction of its own; the producer ships it at once, and the applier
   computes the same checksum over the same range on the target once
   everything before it is committed.

A table without a primary key is one chunk (the whole table); a change to
it inside the window cannot be placed (rows have no identity), so the read
is done again, as the snapshot does.

Repair (``cynomys verify --repair``) reads a mismatching range the same way
and emits, at one boundary: PURGE (delete the range on the target), the
range's rows as READ changes, and a CHECKSUM of them, so the repaired range
is verified again in the same go.

State: ``<producer state_dir>/verify.json`` (jobs, and per table the end of
the last chunk the checkpoint has passed: a producer restarted after a crash
reads a chunk again rather than lose it); requests in
``<producer state_dir>/verify-requests/`` (written by `cynomys verify`).
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cynomys.core.checkpoint import read_json, write_json_atomic
from cynomys.core.config import Config
from cynomys.core.model import Change, Op, Position, Row, TableSchema, Value
from cynomys.parser.stream import TableFilter
from cynomys.parser.txn import Commit, Item, Progress
from cynomys.snapshot.checksum import KeyRange, RowHasher
from cynomys.snapshot.chunker import decode_key, encode_key, key_condition, quote_ident, select_list
from cynomys.snapshot.columns import TableInfo, row_converter
from cynomys.snapshot.errors import SnapshotError
from cynomys.snapshot.source import SnapshotConnection
from cynomys.snapshot.state import SnapshotStore
from cynomys.snapshot.watermark import WATERMARK_TABLE, GtidWatermarker, WatermarkTable, read_watermark
from cynomys.snapshot.window import GtidMarks, Phase

log = logging.getLogger(__name__)

STATE_FILE = "verify.json"
REQUEST_DIR = "verify-requests"
RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"
_REQUEST_POLL_S = 0.5
_KEYLESS_ATTEMPTS = 20
_KEEP_FINISHED = 20


@dataclass(frozen=True)
class VerifyTask:
    """One table of a verify job, or one range of a repair job."""

    name: str                          # 'db.table'
    repair: bool = False
    lo: list[Any] | None = None        # encoded key: the next chunk starts after it
    hi: list[Any] | None = None        # repair: where the range ends (None: the table's end)
    chunks: int = 0
    rows: int = 0
    done: bool = False
    error: str = ""
    estimate: int = 0

    @property
    def database(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def over(self) -> bool:
        return self.done or bool(self.error)


@dataclass(frozen=True)
class VerifyJob:
    id: str
    status: str
    tasks: tuple[VerifyTask, ...] = ()
    chunk_size: int = 0
    # Every chunk the checkpoint has passed: {"id", "table", "range"}; the
    # applier's results name them, so `cynomys verify` knows what to wait for.
    chunks: tuple[dict[str, Any], ...] = ()
    repair_of: str = ""
    created: float = 0.0
    finished: float = 0.0
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VerifyJob:
        return cls(**{**d, "tasks": tuple(VerifyTask(**t) for t in d.get("tasks", ())),
                      "chunks": tuple(d.get("chunks", ()))})

    def settle(self) -> VerifyJob:
        if self.status == RUNNING and all(t.over for t in self.tasks):
            failed = [t for t in self.tasks if t.error]
            return replace(self, status=FAILED if failed else DONE, finished=time.time(),
                           error="; ".join(f"{t.name}: {t.error}" for t in failed))
        return self


class VerifyStore(SnapshotStore):
    """verify.json and verify-requests/ (the snapshot store's request files)."""

    def __post_init__(self) -> None:
        self.path = self.state_dir / STATE_FILE
        self.requests = self.state_dir / REQUEST_DIR

    def load_jobs(self) -> list[VerifyJob]:
        d = read_json(self.path)
        return [] if d is None else [VerifyJob.from_dict(j) for j in d.get("jobs", [])]

    def save_jobs(self, jobs: list[VerifyJob], live: dict[str, Any] | None = None) -> None:
        write_json_atomic(self.path, {"jobs": [j.to_dict() for j in jobs], "live": live, "updated": time.time()})


def store_for(cfg: Config) -> VerifyStore:
    return VerifyStore(cfg.resolve(cfg.producer.state_dir))


@dataclass
class _Active:
    job_id: str
    task: int
    info: TableInfo
    rng: KeyRange
    phase: Phase
    rows: dict[tuple[Value, ...], Row] = field(default_factory=dict)
    keyless: list[Row] = field(default_factory=list)
    dirty: bool = False
    exhausted: bool = True
    low_uuid: str = ""
    high_uuid: str = ""
    marks: GtidMarks | None = None
    started: float = 0.0


@dataclass(frozen=True)
class _Emitted:
    job_id: str
    task: int
    at: Position
    chunk: dict[str, Any]
    next_lo: list[Any] | None
    exhausted: bool
    rows: int


def chunk_id(job_id: str, task: VerifyTask, n: int) -> str:
    return f"{job_id}/{task.name}/{n}"


def range_sql(key: tuple[str, ...], rng: KeyRange) -> tuple[str, tuple[Any, ...]]:
    """``lo < key <= hi`` as MariaDB SQL (``%s`` parameters), '' when whole."""
    conds: list[str] = []
    params: list[Any] = []
    if rng.lo is not None:
        c, p = key_condition(key, [sql_param(v) for v in rng.lo])
        conds.append(c)
        params.extend(p)
    if rng.hi is not None:
        c, p = key_condition(key, [sql_param(v) for v in rng.hi])
        conds.append(f"NOT ({c})")
        params.extend(p)
    return " AND ".join(conds), tuple(params)


def sql_param(v: Value) -> Any:
    """A model key value as a driver parameter (TIMESTAMP keys: naive UTC,
    as the session (time_zone +00:00) compares them)."""
    import datetime

    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return v


class VerifyCoordinator:
    def __init__(self, cfg: Config, *, start: Position, enabled: bool = True) -> None:
        self.cfg = cfg
        self.scfg = cfg.snapshot
        self.enabled = enabled
        self.store = store_for(cfg)
        self.jobs = self.store.load_jobs()
        self.filter = TableFilter(cfg.source.include_tables, cfg.source.exclude_tables)
        self.wm_schema = self.scfg.watermark_schema
        # In memory the next chunk starts as soon as one is emitted; the
        # persisted ``lo`` moves only when the checkpoint passes a chunk.
        self._lo: dict[tuple[str, int], list[Any] | None] = {}
        self._exhausted: set[tuple[str, int]] = set()
        self._active: _Active | None = None
        self._emitted: list[_Emitted] = []
        self._schemas: dict[tuple[str, str], TableSchema] = {}
        self._keyless_attempts: dict[tuple[str, int], int] = {}
        self._last_end = start
        self._last_ts = 0
        self._next_request_check = 0.0
        self._conn: SnapshotConnection | None = None
        self._watermarks: WatermarkTable | None = None
        self._gtid: GtidWatermarker | None = None
        self.stats = {"chunks": 0, "rows": 0}

    # -- producer hooks ----------------------------------------------------------
    def observe(self, item: Item) -> None:
        """See one assembled item (before the snapshot coordinator, which
        swallows the watermark table's events)."""
        if isinstance(item, Change):
            a = self._active
            if item.op is Op.DDL:
                if a is not None and item.database == a.info.schema.database:
                    log.info("verify: DDL inside the window of a chunk of %s: reading that chunk again", a.info.name)
                    self._active = None
                self._schemas.clear()
                return
            if item.table == WATERMARK_TABLE and item.database == self.wm_schema:
                self._on_watermark(item)
                return
            if item.schema is not None:
                self._schemas[(item.database, item.table)] = item.schema
            if a is not None and item.table == a.info.schema.table and item.database == a.info.schema.database:
                self._on_change(a, item)
        elif isinstance(item, Commit):
            self._last_end, self._last_ts = item.end, item.commit_ts
            self._check_high(item.gtid, item.end)
        elif isinstance(item, Progress):
            self._last_end = item.end
            self._check_high("", item.end)

    def poll(self, at_boundary: bool) -> list[Item]:
        now = time.monotonic()
        if now >= self._next_request_check:
            self._next_request_check = now + _REQUEST_POLL_S
            self._take_requests()
        if not self.enabled:
            return []
        if self._active is None:
            if not self._start_next_chunk():
                return []
        a = self._active
        if a is not None and a.phase is Phase.CLOSING and at_boundary:
            return self._emit(a)
        return []

    def wait_s(self) -> float:
        a = self._active
        if a is not None and a.phase is Phase.CLOSING:
            return 0.0
        return _REQUEST_POLL_S

    def checkpointed(self, pos: Position) -> None:
        done = [e for e in self._emitted if e.at <= pos]
        if not done:
            return
        self._emitted = [e for e in self._emitted if not e.at <= pos]
        for e in done:
            job = self._job(e.job_id)
            if job is None:
                continue
            t = job.tasks[e.task]
            t = replace(t, lo=e.next_lo, chunks=t.chunks + 1, rows=t.rows + e.rows, done=e.exhausted)
            tasks = list(job.tasks)
            tasks[e.task] = t
            job = replace(job, tasks=tuple(tasks), chunks=job.chunks + (e.chunk,)).settle()
            if job.status != RUNNING:
                log.info("verify %s: every chunk emitted (%d)", job.id, len(job.chunks))
            self._replace(job)
        self._save()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._active = None

    # -- the window --------------------------------------------------------------
    def _on_watermark(self, change: Change) -> None:
        wm = read_watermark(change)
        a = self._active
        if wm is None or a is None:
            return
        if wm.uuid == a.low_uuid and a.phase is Phase.WAIT_LOW:
            a.phase = Phase.OPEN
        elif wm.uuid == a.high_uuid:
            a.phase = Phase.CLOSING

    def _check_high(self, gtid: str, end: Position) -> None:
        a = self._active
        if a is None or a.marks is None or a.phase is not Phase.OPEN:
            return
        if a.marks.past_high(gtid) or a.marks.reached(end):
            a.phase = Phase.CLOSING

    def _on_change(self, a: _Active, change: Change) -> None:
        if a.phase is Phase.WAIT_LOW:
            return  # before the low watermark: the select saw it
        if a.marks is not None and a.phase is Phase.OPEN and a.marks.before_window(change.tid, change.txn):
            return
        schema = change.schema
        if schema is None:
            return
        idx = schema.key_indexes()
        if not idx:
            a.dirty = True
            return
        if change.before is not None:
            k = tuple(change.before[i] for i in idx)
            if a.rng.contains(k):
                a.rows.pop(k, None)
        if change.after is not None:
            k = tuple(change.after[i] for i in idx)
            if a.rng.contains(k):
                a.rows[k] = change.after

    # -- chunks ------------------------------------------------------------------
    def _connection(self) -> SnapshotConnection:
        if self._conn is None:
            self._conn = SnapshotConnection(self.cfg.source)
        return self._conn

    def _next_work(self) -> tuple[VerifyJob, int] | None:
        for job in self.jobs:
            if job.status != RUNNING:
                continue
            for i, t in enumerate(job.tasks):
                if not t.over and (job.id, i) not in self._exhausted:
                    return job, i
        return None

    def _start_next_chunk(self) -> bool:
        work = self._next_work()
        if work is None:
            return False
        job, i = work
        try:
            self._start_chunk(job, i)
        except SnapshotError as exc:
            log.error("verify %s: %s failed: %s", job.id, job.tasks[i].name, exc)
            self._conn_reset()
            self._set_task(job.id, i, replace(job.tasks[i], error=exc.message))
            self._save()
            return False
        return True

    def _conn_reset(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._watermarks = None
        self._gtid = None

    def _start_chunk(self, job: VerifyJob, i: int) -> None:
        t = job.tasks[i]
        conn = self._connection()
        info = conn.describe(t.database, t.table)
        key = info.schema.key
        lo = decode_key(self._lo.get((job.id, i), t.lo)) if key else None
        hi = decode_key(t.hi) if key else None
        rng = KeyRange(lo, hi)
        cond, params = range_sql(key, rng)
        table = f"{quote_ident(t.database)}.{quote_ident(t.table)}".replace("%", "%%")
        sql = f"SELECT {select_list(info.schema.columns)} FROM {table}"
        if cond:
            sql += " WHERE " + cond
        limited = bool(key) and not t.repair
        if key:
            sql += " ORDER BY " + ", ".join(quote_ident(k).replace("%", "%%") for k in key)
        if limited:
            sql += f" LIMIT {int(job.chunk_size or self.scfg.chunk_size)}"
        marks: GtidMarks | None = None
        low = high = ""
        if self.scfg.read_only:
            from cynomys.snapshot.chunker import ChunkQuery

            if self._gtid is None:
                self._gtid = GtidWatermarker(conn)
            raw, marks = self._gtid.select(ChunkQuery(sql, params))
            phase = Phase.CLOSING if marks.reached(self._last_end) else Phase.OPEN
        else:
            if self._watermarks is None:
                self._watermarks = WatermarkTable(conn, self.wm_schema, self.cfg.producer.id)
            self._watermarks.ensure()
            low = self._watermarks.write("low")
            raw = conn.query(sql, params)
            high = self._watermarks.write("high")
            phase = Phase.WAIT_LOW
        convert = row_converter(info.schema.columns)
        rows = [convert(r) for r in raw]
        idx = info.schema.key_indexes()
        exhausted = not limited or len(rows) < int(job.chunk_size or self.scfg.chunk_size)
        if limited and not exhausted:
            rng = KeyRange(lo, tuple(rows[-1][j] for j in idx))
        a = _Active(job.id, i, info, rng, phase, exhausted=exhausted, low_uuid=low, high_uuid=high, marks=marks,
                    started=time.monotonic())
        if idx:
            a.rows = {tuple(r[j] for j in idx): r for r in rows}
        else:
            a.keyless = rows
        self._active = a

    def _schema_for(self, info: TableInfo) -> TableSchema:
        seen = self._schemas.get((info.schema.database, info.schema.table))
        if seen is not None and seen.column_names == info.schema.column_names and seen.key == info.schema.key:
            return seen
        return info.schema

    def _emit(self, a: _Active) -> list[Item]:
        self._active = None
        job = self._job(a.job_id)
        if job is None or job.status != RUNNING:
            return []
        t = job.tasks[a.task]
        if a.dirty:
            n = self._keyless_attempts[(a.job_id, a.task)] = self._keyless_attempts.get((a.job_id, a.task), 0) + 1
            if n >= _KEYLESS_ATTEMPTS:
                self._set_task(a.job_id, a.task, replace(t, error=(
                    f"the table (no primary key) changed during each of {n} whole-table reads (fix: verify it "
                    "while writes to it pause, or give it a primary key)")))
                self._save()
            return []
        schema = self._schema_for(a.info)
        rows = a.keyless if not schema.key else list(a.rows.values())
        cs = RowHasher(schema.columns).rows(rows)
        at, ts = self._last_end, self._last_ts or int(time.time())
        n = t.chunks + sum(1 for e in self._emitted if e.job_id == a.job_id and e.task == a.task)
        cid = chunk_id(a.job_id, t, n)
        chunk = {"id": cid, "table": t.name, "range": a.rng.to_dict()}
        payload = json.dumps({"job": a.job_id, "chunk": cid, "range": a.rng.to_dict(), **cs.to_dict(),
                              "repair": t.repair}, separators=(",", ":"))
        tid = f"verify:{cid}"
        db, table = schema.database, schema.table
        out: list[Item] = []
        if t.repair:
            out.append(Change(Op.PURGE, db, table, tid, at, ts, schema, sql=payload))
            out.extend(Change(Op.READ, db, table, tid, at, ts, schema, None, r) for r in rows)
        out.append(Change(Op.CHECKSUM, db, table, tid, at, ts, schema, sql=payload))
        out.append(Commit(at, at, ts, ""))
        next_lo = encode_key(a.rng.hi) if a.rng.hi is not None else t.lo
        self._lo[(a.job_id, a.task)] = next_lo
        if a.exhausted:
            self._exhausted.add((a.job_id, a.task))
        self._emitted.append(_Emitted(a.job_id, a.task, at, chunk, next_lo, a.exhausted, len(rows)))
        self.stats["chunks"] += 1
        self.stats["rows"] += len(rows)
        log.debug("verify %s: chunk %s (%s): %d rows, emitted at %s", a.job_id, cid,
                  a.rng.describe(schema.key), len(rows), at)
        return out

    # -- jobs and requests -------------------------------------------------------
    def _job(self, job_id: str) -> VerifyJob | None:
        return next((j for j in self.jobs if j.id == job_id), None)

    def _replace(self, job: VerifyJob) -> None:
        self.jobs = [job if j.id == job.id else j for j in self.jobs]

    def _set_task(self, job_id: str, i: int, t: VerifyTask) -> None:
        job = self._job(job_id)
        if job is not None:
            tasks = list(job.tasks)
            tasks[i] = t
            self._replace(replace(job, tasks=tuple(tasks)).settle())

    def _save(self) -> None:
        a = self._active
        live = None if a is None else {"job": a.job_id, "table": a.info.name, "phase": a.phase.value,
                                       "range": a.rng.describe(a.info.schema.key)}
        self.store.save_jobs(self.jobs, live)

    def _take_requests(self) -> None:
        for path, req in self.store.pending_requests():
            try:
                self._apply_request(req)
            except SnapshotError as exc:
                log.error("verify request %s refused: %s", path.name, exc)
                if req.get("id") and self._job(str(req["id"])) is None:
                    self.jobs.append(VerifyJob(str(req["id"]), FAILED, created=time.time(), finished=time.time(),
                                               error=exc.message + (f" (fix: {exc.hint})" if exc.hint else "")))
            self._save()  # the result is durable before the request goes away
            _unlink(path)

    def _apply_request(self, req: dict[str, Any]) -> None:
        action = req.get("action")
        ident = str(req.get("id") or "")
        if action in ("start", "repair"):
            if self._job(ident) is not None:
                return  # applied before a crash; the request file outlived it
            conn = self._connection()
            tasks = []
            if action == "start":
                for name in req.get("tables") or []:
                    db, _, t = str(name).partition(".")
                    if not self.filter(db, t):
                        tasks.append(VerifyTask(str(name), error=(
                            "not replicated ([source] include_tables/exclude_tables leave it out): there is no "
                            "replica of it to verify")))
                        continue
                    info = conn.describe(db, t)
                    tasks.append(VerifyTask(str(name), estimate=info.rows_estimate))
            else:
                for r in req.get("ranges") or []:
                    rng = r.get("range") or {}
                    tasks.append(VerifyTask(str(r["table"]), repair=True, lo=rng.get("lo"), hi=rng.get("hi")))
            job = VerifyJob(ident, RUNNING, tuple(tasks), int(req.get("chunk_size") or 0),
                            repair_of=str(req.get("repair_of") or ""), created=time.time()).settle()
            log.info("verify %s requested: %s", ident, ", ".join(
                t.name + (" " + KeyRange.from_dict({"lo": t.lo, "hi": t.hi}).describe() if t.repair else "")
                for t in tasks))
            # Keep the running jobs and the last finished ones (the file is rewritten per chunk).
            done = [j for j in self.jobs if j.status != RUNNING]
            self.jobs = [j for j in self.jobs if j.status == RUNNING or j in done[-_KEEP_FINISHED:]] + [job]
        elif action == "cancel":
            for job in self.jobs:
                if ident in ("*", job.id) and job.status == RUNNING:
                    self._replace(replace(job, status=CANCELLED, finished=time.time()))
                    if self._active is not None and self._active.job_id == job.id:
                        self._active = None
        else:
            log.warning("ignoring an unknown verify request: %r", req)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def new_job_id() -> str:
    return "v" + time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
