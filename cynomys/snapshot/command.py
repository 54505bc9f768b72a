"""`cynomys snapshot`: ask the running producer for a snapshot and follow it.

The snapshot itself always runs inside the producer (`cynomys produce`):
only the process reading the binlog can see the watermarks and drop the
keys the log changes in a chunk's window, and only it can order the READ
rows with the log's changes on the wire.  So this command checks the
request against the source (tables exist, have a primary key, are
replicated; the WHERE clause is valid), writes it as a request file into
the producer's state_dir, and shows the progress the producer records in
``snapshot.json`` with a progress bar.  A request written while no producer
runs waits for the next one.  Interrupting the command stops only the
watching; ``--cancel`` stops the snapshot.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from cynomys.core.config import Config
from cynomys.parser.stream import TableFilter
from cynomys.snapshot.chunker import quote_ident
from cynomys.snapshot.errors import SnapshotError, SnapshotRequestError
from cynomys.snapshot.jobwait import NOTICE_AFTER_S, JobView, wait_for_job
from cynomys.snapshot.keyless import check_keyless
from cynomys.snapshot.source import SnapshotConnection
from cynomys.snapshot.state import FAILED, FINISHED, JOB_OVER, SnapshotJob, SnapshotStore, new_job_id

log = logging.getLogger(__name__)



def check_request(cfg: Config, tables: list[str], where: str, out: TextIO) -> list[str]:
    """The tables to snapshot, checked against the source; refuses (raises
    SnapshotRequestError) a named table that cannot be snapshotted."""
    flt = TableFilter(cfg.source.include_tables, cfg.source.exclude_tables)
    conn = SnapshotConnection(cfg.source)
    try:
        named = bool(tables)
        if not named:
            tables = [f"{d}.{t}" for d, t in conn.base_tables()
                      if d != cfg.snapshot.watermark_schema and flt(d, t)]
        chosen = []
        for name in tables:
            db, _, t = name.partition(".")
            if not db or not t:
                raise SnapshotRequestError(f"--tables: {name!r} is not a table name 'db.table'")
            try:
                if not flt(db, t):
                    raise SnapshotRequestError(
                        f"table {name} is not replicated ([source] include_tables/exclude_tables in {cfg.path} "
                        "leave it out), so the producer cannot keep a snapshot of it consistent",
                        hint=f"add {name} to [source] include_tables")
                info = conn.describe(db, t)
                if not info.schema.key:
                    check_keyless(info, initial=False, where=where, allowed=cfg.snapshot.allow_no_primary_key)
                if where:
                    try:
                        conn.query(f"SELECT 1 FROM {quote_ident(db)}.{quote_ident(t)} WHERE ({where}) LIMIT 0")
                    except SnapshotError as exc:
                        raise SnapshotRequestError(
                            f"--where {where!r} is not a valid condition on {name}: {exc.message}",
                            hint="pass a SQL condition on the table's columns, e.g. --where \"id IN (1, 2)\"") from None
            except SnapshotError as exc:
                if named:
                    raise
                print(f"skipping {name}: {exc.message}", file=out)
                continue
            chosen.append(name)
        return chosen
    finally:
        conn.close()


def _summary(job: SnapshotJob) -> tuple[int, int]:
    """(rows read so far, rows expected) over the job's tables."""
    p = job.progress()
    return p.done, max(p.total, 1)


def _wait(store: SnapshotStore, job_id: str, out: TextIO, progress: bool) -> SnapshotJob | None:
    def view(job: SnapshotJob) -> JobView:
        done, total = _summary(job)
        current = next((t.name for t in job.tables if not t.over), "")
        p = job.progress()
        # The producer's own rate and ETA (since the job's first chunk), not
        # the bar's: the bar starts when the command does.
        rate = f"{p.rows_per_s:,.0f} rows/s" + ("" if p.eta_s is None else f", ETA {p.eta_s:.0f}s")
        return JobView(done, total, f"{job.status} {current} {rate if p.rows_per_s else ''}".strip(),
                       job.status in JOB_OVER, job.status == FINISHED)

    return wait_for_job(f"snapshot {job_id}", store.state_dir,
                        lambda: next((j for j in store.load() if j.id == job_id), None), view, out, progress)


def _print_jobs(jobs: list[SnapshotJob], out: TextIO) -> None:
    if not jobs:
        print("no snapshots", file=out)
    for j in jobs:
        done, total = _summary(j)
        tables = sum(1 for t in j.tables if t.over)
        p = j.progress()
        print(f"{j.id}  {j.status:9}  {tables}/{len(j.tables)} tables  {done}/{total} rows"
              + (f"  {p.rows_per_s:,.0f} rows/s" if p.rows_per_s else "")
              + ("" if p.eta_s is None else f"  ETA {p.eta_s:.0f}s")
              + (f"  where {j.where}" if j.where else "") + (f"  error: {j.error}" if j.error else ""), file=out)


def run_snapshot_command(cfg: Config, *, tables: list[str], where: str, action: str | None = None,
                         job_id: str = "*", wait: bool = True, progress: bool = True,
                         out: TextIO = sys.stdout) -> int:
    """The `cynomys snapshot` command.  Returns the exit code."""
    store = SnapshotStore(cfg.resolve(cfg.producer.state_dir))
    if action == "list":
        _print_jobs(store.load(), out)
        return 0
    if action in ("pause", "resume", "cancel"):
        path = store.submit({"action": action, "id": job_id})
        print(f"{action} request for snapshot {job_id} written to {path}", file=out)
        deadline = time.monotonic() + (NOTICE_AFTER_S if wait else 0)
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if path.exists():
            print("the producer has not picked it up yet; it will when it runs", file=out)
        else:
            _print_jobs([j for j in store.load() if job_id in ("*", j.id)], out)
        return 0
    chosen = check_request(cfg, tables, where, out)
    if not chosen:
        raise SnapshotRequestError("nothing to snapshot: no replicated table with a primary key",
                                   hint="name tables with --tables db.t1,db.t2")
    ident = new_job_id()
    store.submit({"action": "start", "id": ident, "tables": chosen, "where": where})
    print(f"snapshot {ident} requested: {', '.join(chosen)}" + (f" where {where}" if where else ""), file=out)
    if not wait:
        return 0
    try:
        job = _wait(store, ident, out, progress)
    except KeyboardInterrupt:
        print(f"\nstopped watching; snapshot {ident} goes on (cancel it with "
              f"`cynomys snapshot -c {cfg.path} --cancel {ident}`)", file=out)
        return 0
    assert job is not None
    _print_jobs([job], out)
    return 0 if job.status == FINISHED else (3 if job.status == FAILED else 1)
