"""`cynomys verify`: compare source and target, chunk by chunk, while writes go on.

Like `cynomys snapshot`, the work happens in the running daemons: this
command writes a request into the producer's state_dir
(``verify-requests/``); the producer checksums each key-range chunk inside
a watermark window and sends the checksum in the stream
(verify/coordinator.py); the applier computes the same checksum on the target
once it has committed everything before it and appends the result to
``<applier state_dir>/verify-results.jsonl`` (verify/applier.py).  This
command reads both files -- no source lock, no target connection -- and
exits like diff: 0 when every chunk matches, 1 when a mismatch remains
(each named by table and key range), 2 on error.

``--repair`` then asks the producer to re-read each mismatching range and
send, at one point of the stream, "delete the range on the target", the
range's rows and a new checksum; the repaired ranges are verified again.
"""
from __future__ import annotations

import fnmatch
import sys
from typing import Any, TextIO

from cynomys.core.config import Config
from cynomys.parser.stream import TableFilter
from cynomys.snapshot.errors import SnapshotRequestError
from cynomys.snapshot.jobwait import JobView, wait_for_job
from cynomys.snapshot.source import SnapshotConnection
from cynomys.verify.applier import read_results, results_path
from cynomys.verify.state import CANCELLED, DONE, FAILED, RUNNING, VerifyJob, VerifyStore, new_job_id, store_for

OK, MISMATCH, ERROR = 0, 1, 2


def choose_tables(cfg: Config, patterns: list[str], out: TextIO) -> list[str]:
    """Replicated base tables matching ``patterns`` ('db.t', 'db.*'; none: all)."""
    flt = TableFilter(cfg.source.include_tables, cfg.source.exclude_tables)
    conn = SnapshotConnection(cfg.source)
    try:
        tables = [f"{d}.{t}" for d, t in conn.base_tables() if d != cfg.snapshot.watermark_schema and flt(d, t)]
    finally:
        conn.close()
    if not patterns:
        return tables
    chosen = [t for t in tables if any(fnmatch.fnmatchcase(t, p) for p in patterns)]
    for p in patterns:
        if not any(fnmatch.fnmatchcase(t, p) for t in tables):
            raise SnapshotRequestError(
                f"--tables {p!r} names no replicated table of the source",
                hint="give db.table names or patterns such as 'app.*' ([source] include_tables limits the choice)")
    return chosen


def job_results(cfg: Config, job: VerifyJob) -> tuple[list[dict[str, Any]], int]:
    """(results of the job's chunks checked so far, chunks not checked yet)."""
    results = read_results(results_path(cfg))
    got = [results[c["id"]] for c in job.chunks if c["id"] in results]
    return got, len(job.chunks) - len(got)


def _finished(job: VerifyJob, missing: int) -> bool:
    return job.status in (FAILED, CANCELLED) or (job.status == DONE and missing == 0)


def _wait(cfg: Config, store: VerifyStore, job_id: str, out: TextIO, progress: bool,
          timeout_s: float) -> tuple[VerifyJob | None, list[dict[str, Any]]]:
    results: list[dict[str, Any]] = []

    def view(job: VerifyJob) -> JobView:
        nonlocal results
        results, missing = job_results(cfg, job)
        done_rows = sum(int(r["source"]["count"]) for r in results)
        total = max(sum(max(t.estimate, t.rows) for t in job.tasks), done_rows, 1)
        bad = sum(1 for r in results if not r["match"])
        return JobView(done_rows, total, f"{len(results)} chunks checked, {bad} differ", _finished(job, missing),
                       job.status == DONE)

    job = wait_for_job(f"verify {job_id}", store.state_dir,
                       lambda: next((j for j in store.load() if j.id == job_id), None), view, out, progress,
                       timeout_s=timeout_s, interval_s=0.3)
    return job, results


def _print_mismatches(results: list[dict[str, Any]], out: TextIO) -> None:
    for r in results:
        if not r["match"]:
            s, t = r["source"], r["target"]
            print(f"differs: {r['table']} {r['describe']}: source {s['count']} rows (hash {s['hash']}), "
                  f"target {t['count']} rows (hash {t['hash']})", file=out)
        if r.get("error"):  # the applier refused to repair it (and says how to fix that)
            print(f"not repaired: {r['table']} {r['describe']}: {r['error']}", file=out)


def _run_job(cfg: Config, store: VerifyStore, request: dict[str, Any], out: TextIO, progress: bool,
             timeout_s: float) -> tuple[int, list[dict[str, Any]]]:
    """Submit ``request``, wait for it; (exit code, its results)."""
    store.submit(request)
    job, results = _wait(cfg, store, request["id"], out, progress, timeout_s)
    if job is None:
        print(f"verify {request['id']}: the producer did not pick up the request within {timeout_s:.0f}s", file=out)
        return ERROR, []
    if job.status in (FAILED, CANCELLED):
        print(f"verify {job.id} {job.status}" + (f": {job.error}" if job.error else ""), file=out)
        return ERROR, results
    if not _finished(job, len(job.chunks) - len(results)):
        print(f"verify {job.id}: gave up waiting after {timeout_s:.0f}s ({len(results)} of {len(job.chunks)} "
              f"chunks checked so far, producer status {job.status}); see `cynomys verify --status`", file=out)
        return ERROR, results
    bad = [r for r in results if not r["match"]]
    rows = sum(int(r["source"]["count"]) for r in results)
    print(f"verify {job.id}: {len(results)} chunks, {rows} source rows, {len(bad)} differ", file=out)
    _print_mismatches(results, out)
    return (MISMATCH if bad else OK), results


def run_verify_command(cfg: Config, *, tables: list[str], chunk_size: int = 0, wait: bool = True,
                       repair: bool = False, progress: bool = True, timeout_s: float = 0.0,
                       out: TextIO | None = None) -> int:
    """The `cynomys verify` command.  Returns the exit code (0 equal, 1 differ, 2 error)."""
    out = out or sys.stdout  # at call time: a redirected stdout counts
    store = store_for(cfg)
    chosen = choose_tables(cfg, tables, out)
    if not chosen:
        raise SnapshotRequestError("nothing to verify: no replicated table", hint="name tables with --tables db.t1,db.*")
    ident = new_job_id()
    request = {"action": "start", "id": ident, "tables": chosen, "chunk_size": chunk_size}
    print(f"verify {ident} requested: {', '.join(chosen)}", file=out)
    if not wait:
        store.submit(request)
        return OK
    rc, results = _run_job(cfg, store, request, out, progress, timeout_s)
    if rc != MISMATCH or not repair:
        return rc
    bad = [r for r in results if not r["match"]]
    fix = {"action": "repair", "id": new_job_id(), "repair_of": ident,
           "ranges": [{"table": r["table"], "range": r["range"]} for r in bad]}
    print(f"repair {fix['id']}: reading {len(bad)} ranges again and verifying them", file=out)
    rc, _ = _run_job(cfg, store, fix, out, progress, timeout_s)
    return rc


def print_status(cfg: Config, out: TextIO | None = None, recent: int = 5) -> int:
    """`cynomys verify --status`: recent jobs, their progress and mismatches."""
    out = out or sys.stdout
    report = status_report(cfg, recent)
    if not report["jobs"]:
        print("no verify jobs", file=out)
    for ident, j in report["jobs"].items():
        print(f"{ident}  {j['status']:9}  {j['chunks_checked']}/{j['chunks_emitted']} chunks checked"
              f"  {j['rows_checked']} rows  {len(j['mismatches'])} differ"
              + (f"  (repair of {j['repair_of']})" if j["repair_of"] else "")
              + (f"  error: {j['error']}" if j["error"] else ""), file=out)
        for m in j["mismatches"]:
            print(f"  differs: {m}", file=out)
    return OK


def status_report(cfg: Config, recent: int = 5) -> dict[str, Any]:
    """The verify section of `cynomys status`."""
    jobs = store_for(cfg).load()
    shown = [j for j in jobs if j.status == RUNNING] + [j for j in jobs if j.status != RUNNING][-recent:]
    out: dict[str, Any] = {"jobs": {}}
    for j in shown:
        results, missing = job_results(cfg, j)
        out["jobs"][j.id] = {
            "status": j.status if not (j.status == DONE and missing) else "checking",
            "repair_of": j.repair_of or None, "tables": [t.name for t in j.tasks],
            "chunks_emitted": len(j.chunks), "chunks_checked": len(results),
            "rows_checked": sum(int(r["source"]["count"]) for r in results),
            "mismatches": [f"{r['table']} {r['describe']} (source {r['source']['count']} rows, target "
                           f"{r['target']['count']})" + (f": not repaired: {r['error']}" if r.get("error") else "")
                           for r in results if not r["match"]],
            "error": j.error or None,
        }
    return out
