"""`cynomys status`: where the producer and the applier are, and the lag.

Lag is reported two ways: bytes of binlog between the source's current end
and the producer's checkpoint / the target's applied position, and seconds
between now and the source time of the last change each side has.
Components that cannot be reached are reported as such, not hidden.
"""
from __future__ import annotations

import time
from typing import Any

from cynomys.core.config import Config
from cynomys.core.errors import CynomysError
from cynomys.core.model import Position


def _bytes_behind(source_end: Position | None, at: Position | None) -> int | None:
    if source_end is None or at is None:
        return None
    if source_end.file == at.file:
        return max(0, source_end.pos - at.pos)
    return None  # across files: not comparable without every file's size


def collect(cfg: Config) -> dict[str, Any]:
    from cynomys.producer import ProducerState

    report: dict[str, Any] = {"config": cfg.path, "now": time.time()}
    source_end: Position | None = None
    try:
        from cynomys.parser.stream import SourceInspector

        ins = SourceInspector(cfg.source)
        try:
            source_end = ins.current()
            report["source"] = {"reachable": True, "binlog_end": str(source_end)}
        finally:
            ins.close()
    except CynomysError as exc:
        report["source"] = {"reachable": False, "error": str(exc)}

    pstate = ProducerState.load(cfg.resolve(cfg.producer.state_dir) / "producer.json")
    report["producer"] = {
        "id": cfg.producer.id,
        "checkpoint": str(pstate.checkpoint) if pstate.checkpoint else None,
        "read": str(pstate.read) if pstate.read else None,
        "sequence": pstate.seq,
        "state_updated_s_ago": round(time.time() - pstate.updated, 1) if pstate.updated else None,
        "lag_bytes": _bytes_behind(source_end, pstate.checkpoint),
        "last_event_age_s": round(time.time() - pstate.last_event_ts, 1) if pstate.last_event_ts else None,
        "stats": pstate.stats,
    }
    try:
        from cynomys.applier.targets.base import open_target

        target = open_target(cfg)
        try:
            target.connect()
            st = target.applied(cfg.producer.id)
            # Targets that maintain their tables (Spark/Iceberg) say how it went.
            maintenance_report = getattr(target, "maintenance_report", None)
            if maintenance_report is not None:
                try:
                    report["target_maintenance"] = maintenance_report()
                except CynomysError as exc:
                    report["target_maintenance"] = {"error": str(exc)}
        finally:
            target.close()
        report["applier"] = {"reachable": True} if st is None else {
            "reachable": True, "sequence": st.seq, "position": str(st.position),
            "lag_bytes": _bytes_behind(source_end, st.position),
            # Caught up means no lag, however old the last change is.
            "lag_s": 0.0 if source_end is not None and st.position.file == source_end.file
            and st.position.pos >= source_end.pos else (round(time.time() - st.commit_ts, 1) if st.commit_ts else None),
            "envelopes_behind_producer": max(0, pstate.seq - st.seq),
        }
    except (CynomysError, OSError) as exc:
        report["applier"] = {"reachable": False, "error": str(exc)}
    report["snapshot"] = _snapshot_section(cfg)
    return report


def _snapshot_section(cfg: Config) -> dict[str, Any]:
    """Snapshot jobs as the producer records them (cynomys/snapshot/state.py)."""
    from cynomys.snapshot.state import status_report

    try:
        return status_report(cfg.resolve(cfg.producer.state_dir))
    except CynomysError as exc:
        return {"error": str(exc)}


def render_text(report: dict[str, Any]) -> str:
    lines = [f"config: {report['config']}"]
    for part in ("source", "producer", "applier"):
        lines.append(f"{part}:")
        for k, v in report.get(part, {}).items():
            lines.append(f"  {k}: {v}")
    if "target_maintenance" in report:
        m = report["target_maintenance"]
        lines.append("target maintenance:")
        lines += [f"  {k}: {v}" for k, v in m.items() if k != "tables"]
        lines += [f"  {t}: {r}" for t, r in m.get("tables", {}).items()]
    snap = report.get("snapshot", {})
    lines.append("snapshot:")
    for k, v in snap.items():
        if k != "jobs":
            lines.append(f"  {k}: {v}")
    for ident, job in snap.get("jobs", {}).items():
        lines.append(f"  {ident}: {job['status']}, {job['tables_done']}/{job['tables']} tables, "
                     f"{job['rows_read']}/{job['rows_estimate']} rows ({job['progress']})"
                     + (f", at {job['current_table']}" if job["current_table"] else "")
                     + (f", errors: {job['errors']}" if job["errors"] else ""))
    return "\n".join(lines)
