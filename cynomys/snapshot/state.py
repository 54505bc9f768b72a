"""Snapshot jobs as the producer persists them, and requests to the producer.

``<producer state_dir>/snapshot.json`` holds every job and, per table, the
last key of the last *finished* chunk: one whose READ rows are in a batch
the transport accepted and behind the producer's checkpoint.  A producer
restarted after a crash resumes each table after that key, so a chunk is
either finished or done again (READ rows are upserts: doing one twice is
harmless).  Written atomically (tmp + fsync + rename).

``<producer state_dir>/snapshot-requests/*.json`` are requests (start,
pause, resume, cancel) written by `cynomys snapshot`; the running producer
picks them up in name order, records the result in snapshot.json and only
then removes the request file (a crash in between applies it again, and
applying a request twice changes nothing).

The job store (``JobStore``), a job's part about one table (``TablePart``)
and the rule that settles a job (``settled``) serve verify's jobs as well
(verify/state.py).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Generic, Protocol, Self, Sequence, TypeVar

from cynomys.core.checkpoint import read_json, write_json_atomic

# Table states.
PENDING, DONE, FAILED, SKIPPED = "pending", "done", "failed", "skipped"
# Job states.
QUEUED, RUNNING, PAUSED, FINISHED, CANCELLED = "queued", "running", "paused", "done", "cancelled"
JOB_ACTIVE = (QUEUED, RUNNING)
JOB_OVER = (FINISHED, CANCELLED, FAILED)

STATE_FILE = "snapshot.json"
REQUEST_DIR = "snapshot-requests"
#: The live phase of a keyless table's read (snapshot/keyless.py), in the state file.
KEYLESS_PHASE = "keyless read"


class Part(Protocol):
    """What a chunked task's job does to one table (the base: ``TablePart``)."""

    @property
    def name(self) -> str: ...

    @property
    def error(self) -> str: ...

    @property
    def over(self) -> bool:
        """Nothing left to do (done, failed or skipped)."""

    @property
    def failed(self) -> bool: ...

    @property
    def after(self) -> list[Any] | None:
        """The encoded key its next chunk starts after, as persisted (None: the start)."""


def settled(parts: Sequence[Part]) -> tuple[str, str] | None:
    """A job's (status, error) once every part is over: failed, naming each
    failed part, or done; None while a part has work left."""
    if not all(p.over for p in parts):
        return None
    failed = [p for p in parts if p.failed]
    return (FAILED if failed else FINISHED), "; ".join(f"{p.name}: {p.error}" for p in failed)


@dataclass(frozen=True)
class TablePart:
    """One table of a job, 'db.table' (a snapshot's table, a verify job's
    table or key range)."""

    name: str

    @property
    def database(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]


@dataclass(frozen=True)
class TableProgress(TablePart):
    status: str = PENDING
    last_key: list[Any] | None = None  # chunker.encode_key of the last finished chunk's last key
    chunks: int = 0
    rows: int = 0                      # READ rows emitted (finished chunks)
    scanned: int = 0                   # rows selected (finished chunks)
    dropped: int = 0                   # selected rows dropped because the log changed them in the window
    estimate: int = 0                  # information_schema TABLE_ROWS when the job started
    error: str = ""
    # Keyless tables (snapshot/keyless.py): the binlog position of the last
    # consistent read, recorded before its rows are handed over; the
    # table's changes in transactions beginning before it are dropped.
    read_at: dict[str, Any] | None = None

    @property
    def over(self) -> bool:
        return self.status in (DONE, FAILED, SKIPPED)

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    @property
    def after(self) -> list[Any] | None:
        return self.last_key

    def failing(self, reason: str) -> TableProgress:
        return replace(self, status=FAILED, error=reason)


@dataclass(frozen=True)
class Progress:
    """A job's progress: rows read of rows expected (``total``: the tables'
    information_schema estimates, raised to what was read when the estimate
    was low), rows per second since its first chunk, and the seconds left
    at that rate (None: not known, or over)."""

    done: int
    total: int
    rows_per_s: float
    eta_s: float | None

    def describe(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 0.0
        eta = "" if self.eta_s is None else f", ETA {_duration(self.eta_s)}"
        return f"{self.done}/{self.total} rows ({pct:.1f}%), {self.rows_per_s:,.0f} rows/s{eta}"


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass(frozen=True)
class SnapshotJob:
    id: str
    origin: str                        # 'initial', 'request' (cynomys snapshot) or 'rename' (a table renamed in)
    status: str
    tables: tuple[TableProgress, ...] = ()
    where: str = ""
    created: float = 0.0
    updated: float = 0.0
    finished: float = 0.0
    error: str = ""
    started: float = 0.0               # when its first chunk was read (wall clock; 0: not yet)
    # 'file:pos' the log must be past before it starts ('rename': where the
    # statement began; a producer resumed before it reads it again first).
    not_before: str = ""
    not_before_gtid: str = ""          # the statement's GTID (MariaDB: compared by domain and seq)

    @property
    def active(self) -> bool:
        return self.status in JOB_ACTIVE

    @property
    def parts(self) -> tuple[TableProgress, ...]:
        return self.tables

    def progress(self, now: float | None = None, reading: int = 0) -> Progress:
        """Rows done and expected, the rate since the job started and the
        time left at that rate (``Progress``); ``reading``: rows of a read
        still streaming (a keyless table's), not yet counted in its part."""
        done = sum(t.scanned for t in self.tables) + reading
        total = max(sum(max(t.estimate, t.scanned) for t in self.tables), done)
        end = self.finished or (time.time() if now is None else now)
        secs = max(0.0, end - self.started) if self.started else 0.0
        rate = done / secs if secs > 0 else 0.0
        eta = None if self.status in JOB_OVER or rate <= 0 else max(0.0, (total - done) / rate)
        return Progress(done, total, round(rate, 1), None if eta is None else round(eta, 1))

    def table(self, name: str) -> TableProgress:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def with_table(self, progress: TableProgress) -> SnapshotJob:
        return replace(self, tables=tuple(progress if t.name == progress.name else t for t in self.tables),
                       updated=time.time())

    def failing(self, i: int, reason: str) -> SnapshotJob:
        return self.with_table(self.tables[i].failing(reason)).settle()

    def settle(self) -> SnapshotJob:
        """Mark the job over once every table is over."""
        end = settled(self.tables) if self.active else None
        return self if end is None else replace(self, status=end[0], finished=time.time(), error=end[1])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SnapshotJob:
        tables = tuple(TableProgress(**t) for t in d.get("tables", ()))
        return cls(**{**d, "tables": tables})


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


class Job(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


class TaskJob(Job, Protocol):
    """A job of a chunked task (snapshot/task.py): parts worked through in order."""

    @property
    def id(self) -> str: ...

    @property
    def active(self) -> bool:
        """Chunks of it may be read now (not paused, not over)."""

    @property
    def parts(self) -> Sequence[Part]: ...

    def failing(self, i: int, reason: str) -> Self:
        """The job with part ``i`` failed for ``reason``, settled."""


J = TypeVar("J", bound=Job)


@dataclass
class JobStore(Generic[J]):
    """A producer task's jobs (``<state_dir>/<file>``, written atomically) and
    the request files commands leave for the producer (``<state_dir>/<dir>/``):
    one store for snapshots and verify, each with its job type."""

    state_dir: Path
    file: str
    request_dir: str
    job_of: Callable[[dict[str, Any]], J]
    path: Path = field(init=False)
    requests: Path = field(init=False)

    def __post_init__(self) -> None:
        self.path = self.state_dir / self.file
        self.requests = self.state_dir / self.request_dir

    def load(self) -> list[J]:
        d = read_json(self.path)
        return [] if d is None else [self.job_of(j) for j in d.get("jobs", [])]

    def save(self, jobs: list[J], live: dict[str, Any] | None = None) -> None:
        """``live``: the chunk in flight, for `cynomys status` (not needed to resume)."""
        write_json_atomic(self.path, {"jobs": [j.to_dict() for j in jobs], "live": live, "updated": time.time()})

    def load_live(self) -> dict[str, Any] | None:
        d = read_json(self.path)
        return None if d is None else d.get("live")

    # -- requests --------------------------------------------------------------
    def submit(self, request: dict[str, Any]) -> Path:
        """Write a request file for the producer (atomically: the producer
        never reads half a request)."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        path = self.requests / name
        write_json_atomic(path, {**request, "submitted": time.time()})
        return path

    def pending_requests(self) -> list[tuple[Path, dict[str, Any]]]:
        try:
            names = sorted(n for n in os.listdir(self.requests) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            p = self.requests / n
            try:
                with open(p) as fh:
                    out.append((p, json.load(fh)))
            except FileNotFoundError:
                continue
            except ValueError:
                out.append((p, {"action": "invalid", "file": str(p)}))
        return out


def status_report(state_dir: Path, recent: int = 5) -> dict[str, Any]:
    """The snapshot section of `cynomys status`: active and recent jobs,
    the chunk in flight, requests not yet picked up."""
    store = SnapshotStore(state_dir)
    jobs = store.load()
    shown = [j for j in jobs if j.status not in JOB_OVER] + [j for j in jobs if j.status in JOB_OVER][-recent:]
    out: dict[str, Any] = {"pending_requests": len(store.pending_requests()), "in_flight": store.load_live(),
                           "jobs": {}}
    live = out["in_flight"] or {}
    for j in shown:
        # A keyless table's rows so far: it is read whole, in one read that
        # counts in its part only when it ends.
        reading = int(live.get("selected") or 0) if live.get("phase") == KEYLESS_PHASE and live.get("job") == j.id \
            and j.status not in JOB_OVER else 0
        p = j.progress(reading=reading)
        scanned, estimate = p.done, p.total
        current = next((t for t in j.tables if not t.over), None)
        out["jobs"][j.id] = {
            "status": j.status, "origin": j.origin, "where": j.where or None,
            "tables_done": sum(1 for t in j.tables if t.over), "tables": len(j.tables),
            "rows_read": scanned, "rows_emitted": sum(t.rows for t in j.tables),
            "rows_left_to_log": sum(t.dropped for t in j.tables), "rows_estimate": estimate,
            "progress": f"{100.0 * scanned / estimate:.1f}%" if estimate else ("100.0%" if j.status == FINISHED else "0.0%"),
            "rows_per_s": p.rows_per_s, "eta_s": p.eta_s,
            "current_table": current.name if current and j.status not in JOB_OVER else None,
            "resume_after_key": current.last_key if current and j.status not in JOB_OVER else None,
            "errors": {t.name: t.error for t in j.tables if t.error} or (j.error or None),
        }
    return out


class SnapshotStore(JobStore[SnapshotJob]):
    """snapshot.json and snapshot-requests/."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir, STATE_FILE, REQUEST_DIR, SnapshotJob.from_dict)
