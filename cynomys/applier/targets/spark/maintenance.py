"""Iceberg table maintenance between flushes: compaction and snapshot expiry.

Every merge-on-read flush adds a data file and a position-delete file; every
later MERGE and every reader opens them all, so without maintenance a flush
gets slower with each one before it (bench/bench_spark_merge.py: 2.2-2.6x
after 30 flushes).  After ``maintenance_commits`` Cynomys commits on a
table, the target runs, between two flushes (never inside one):

1. ``rewrite_data_files``: small data files are bin-packed together, and files
   with many deleted rows rewritten without them (Iceberg's default
   ``delete-ratio-threshold``); ``remove-dangling-deletes`` drops the delete
   files that no longer point at a live data file;
2. ``rewrite_position_delete_files``: the remaining small delete files are
   packed into few;
3. ``expire_snapshots`` older than ``snapshot_retention_s``, keeping at least
   ``snapshots_kept`` (and always the current one).

A small table (``compact.py``: a v3 table of at most 16 MB that takes files
written outside Spark) is compacted and expired without Spark: the same
result in tenths of a second instead of seconds of Spark jobs.

Exactly-once is untouched: maintenance commits carry no flush marker, and
the marker walk (``SparkTarget._ahead``) skips snapshots without one.  A
table is maintained only when no commit of it is beyond the applier state
(the state is written before maintenance runs), so a rollback after a crash
never has to cross an expired snapshot: the snapshot it rolls back to was
current when maintenance last ran, and expiry never removes the current one.
If every snapshot carrying a marker has expired, the table simply holds no
flush beyond the state, which is what the walk then concludes.

A failure is logged and reported, never raised: the flush itself committed;
the table is tried again after another ``maintenance_commits`` commits.
"""
from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.applier.targets.spark.merge import lit, q

if TYPE_CHECKING:
    from cynomys.applier.targets.spark.target import SparkTarget

log = logging.getLogger(__name__)

#: rewrite_data_files options.  min-input-files 2: the flushes' small files
#: are packed as soon as there are two (Iceberg's default 5 waits for more).
#: use-starting-sequence-number false: the new files get the rewrite's own
#: sequence number, above every delete file already applied to them, so
#: remove-dangling-deletes can drop those (with the default, the newest
#: delete file has the same number and stays, pointing at a removed file).
#: That default protects deletes committed *during* a rewrite; none are
#: (maintenance runs between flushes, and Cynomys is the only writer).
REWRITE_DATA_OPTIONS: dict[str, str] = {
    "min-input-files": "2",
    "use-starting-sequence-number": "false",
    "remove-dangling-deletes": "true",
    "partial-progress.enabled": "false",
}


@dataclass(frozen=True)
class MaintenanceRun:
    """One table's maintenance: what it did and how long it took."""

    table: str
    at: float
    seconds: float
    rewritten_data_files: int = 0
    added_data_files: int = 0
    removed_delete_files: int = 0
    expired_files: int = 0
    #: Snapshots expired (the Java API's expiry, ``how = "pyarrow"``, does not
    #: count the files it deletes).
    expired_snapshots: int = 0
    files_after: dict[str, int] = field(default_factory=dict)
    error: str = ""
    #: "spark" (the procedures) or "pyarrow" (a small table: compact.py).
    how: str = "spark"

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "at": self.at, "seconds": round(self.seconds, 3),
                "rewritten_data_files": self.rewritten_data_files, "added_data_files": self.added_data_files,
                "removed_delete_files": self.removed_delete_files, "expired_files": self.expired_files,
                "expired_snapshots": self.expired_snapshots, "files_after": self.files_after, "how": self.how,
                **({"error": self.error} if self.error else {})}


class Maintenance:
    """Counts commits per table and maintains the tables that are due."""

    def __init__(self, cfg: SparkConfig) -> None:
        self.cfg = cfg
        self._commits: dict[tuple[str, str], int] = {}
        self.runs: list[MaintenanceRun] = []  # the latest few, newest last

    @property
    def enabled(self) -> bool:
        return self.cfg.maintenance

    def committed(self, database: str, table: str) -> None:
        ident = (database, table)
        self._commits[ident] = self._commits.get(ident, 0) + 1

    def due(self, factor: int = 1) -> list[tuple[str, str]]:
        """Tables with ``factor`` x maintenance_commits commits since their
        last run (the applier maintains due tables while idle, and overdue
        ones, factor 3, between flushes when it is never idle)."""
        if not self.enabled:
            return []
        return [i for i, n in self._commits.items() if n >= factor * self.cfg.maintenance_commits]

    def forget(self, database: str, table: str) -> None:
        self._commits.pop((database, table), None)

    def run(self, target: SparkTarget, database: str, table: str) -> MaintenanceRun:
        """Compact and expire one table now (the caller checked it holds no
        commit beyond the applier state)."""
        self._commits[(database, table)] = 0
        name = f"{database}.{table}"
        t0 = time.monotonic()
        try:
            cutoff = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
                seconds=self.cfg.snapshot_retention_s)
            small = target.compaction.run(database, table, int(cutoff.timestamp() * 1000), self.cfg.snapshots_kept) \
                if target.small_compaction else None
            if small is not None:
                run = MaintenanceRun(name, time.time(), time.monotonic() - t0,
                                     rewritten_data_files=small.rewritten_data_files,
                                     added_data_files=small.added_data_files,
                                     removed_delete_files=small.removed_delete_files,
                                     expired_snapshots=small.expired_snapshots, files_after=small.files_after,
                                     how="pyarrow")
                log.info("maintained Iceberg table %s without Spark in %.2fs: %d data files -> %d, %d deletion "
                         "vectors removed, %d snapshots expired", name, run.seconds, run.rewritten_data_files,
                         run.added_data_files, run.removed_delete_files, run.expired_snapshots)
            else:
                run = self._with_spark(target, database, table, t0, cutoff)
        except Exception as exc:  # logged and reported; the flush before it stands
            from cynomys.applier.targets.spark.session import first_line

            run = MaintenanceRun(name, time.time(), time.monotonic() - t0, error=first_line(exc))
            log.warning("maintenance of Iceberg table %s failed after %.1fs (%s); it is tried again after "
                        "%d more commits", name, run.seconds, run.error, self.cfg.maintenance_commits)
        self.runs = (self.runs + [run])[-20:]
        return run

    def _with_spark(self, target: SparkTarget, database: str, table: str, t0: float,
                    cutoff: datetime.datetime) -> MaintenanceRun:
        """Iceberg's Spark procedures: compaction, delete files, expiry."""
        name = f"{database}.{table}"
        # With the catalog: a database named like a catalog would be read as one.
        ident = lit(target.qualified(database, table))
        proc = f"{q(target.catalog)}.system"
        counts: dict[str, int] = {}
        opts = ", ".join(f"{lit(k)}, {lit(v)}" for k, v in REWRITE_DATA_OPTIONS.items())
        r = _one(target, f"CALL {proc}.rewrite_data_files(table => {ident}, options => map({opts}))")
        counts["rewritten_data_files"] = int(r.get("rewritten_data_files_count", 0))
        counts["added_data_files"] = int(r.get("added_data_files_count", 0))
        removed = int(r.get("removed_delete_files_count", 0) or 0)
        r = _one(target, f"CALL {proc}.rewrite_position_delete_files(table => {ident}, "
                         "options => map('rewrite-all', 'true'))")
        removed += max(0, int(r.get("rewritten_delete_files_count", 0)) - int(r.get("added_delete_files_count", 0)))
        counts["removed_delete_files"] = removed
        r = _one(target, f"CALL {proc}.expire_snapshots(table => {ident}, older_than => TIMESTAMP "
                         f"{lit(cutoff.strftime('%Y-%m-%d %H:%M:%S.%f'))}, "
                         f"retain_last => {self.cfg.snapshots_kept})")
        counts["expired_files"] = sum(int(v or 0) for k, v in r.items() if k.startswith("deleted_"))
        run = MaintenanceRun(name, time.time(), time.monotonic() - t0,
                             rewritten_data_files=counts["rewritten_data_files"],
                             added_data_files=counts["added_data_files"],
                             removed_delete_files=counts["removed_delete_files"],
                             expired_files=counts["expired_files"],
                             files_after=file_counts(target, database, table))
        log.info("maintained Iceberg table %s in %.1fs: %d data files -> %d, %d delete files removed, "
                 "%d expired files deleted; now %s", name, run.seconds, run.rewritten_data_files,
                 run.added_data_files, run.removed_delete_files, run.expired_files, run.files_after)
        return run


def _one(target: SparkTarget, statement: str) -> dict[str, Any]:
    log.debug("Spark SQL: %s", statement)
    rows = target.spark.sql(statement).collect()
    return rows[0].asDict() if rows else {}


def file_counts(target: SparkTarget, database: str, table: str) -> dict[str, int]:
    """Live files of the table's current snapshot by content."""
    rows = target.spark.sql(f"SELECT content, count(*) AS n FROM {target.qualified(database, table)}.files "
                            "GROUP BY content").collect()
    names = {0: "data", 1: "position_deletes", 2: "equality_deletes"}
    return {names.get(int(r["content"]), str(r["content"])): int(r["n"]) for r in rows}
