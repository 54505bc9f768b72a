"""`cynomys status`: where the producer and the applier are, and the lag.

Lag is reported two ways: bytes of binlog between the source's current end
and the producer's checkpoint / the target's applied position, and seconds
between now and the source time of the last change each side has.
Components that cannot be reached are reported as such, not hidden.

Everything comes from the daemons' own reports (``producer.json``,
``applier.json`` and, with ``[metrics] listen``, ``<daemon>.health.json`` in
their state directories), the source's binlog end and Redis: the target is
never opened (no Spark session for a Spark target).  The applier's files are
on the applier's host: run `cynomys status` there for its part.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cynomys.cli.common import config_of, with_config
from cynomys.core.checkpoint import read_json
from cynomys.core.config import Config
from cynomys.core.errors import CynomysError
from cynomys.core.model import Position


def _bytes_behind(source_end: Position | None, at: Position | None) -> int | None:
    if source_end is None or at is None:
        return None
    if source_end.file == at.file:
        return max(0, source_end.pos - at.pos)
    return None  # across files: not comparable without every file's size


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        d = read_json(path)
    except (OSError, ValueError, CynomysError) as exc:  # a half-written or unreadable report is shown as such
        return {"error": f"cannot read {path}: {exc}"}
    return d


def _extras(cfg: Config, state_dir: str, daemon: str, *keys: str) -> dict[str, Any]:
    """Sections of ``<daemon>.health.json`` besides the verdict (freshness,
    clocks: cynomys/metrics); none when there is no readable report."""
    d = _read_report(cfg.resolve(state_dir) / f"{daemon}.health.json")
    if d is None or "error" in d:
        return {}
    return {k: d[k] for k in keys if k in d}


def _health(cfg: Config, state_dir: str, daemon: str) -> dict[str, Any] | None:
    """The daemon's own verdict (``<daemon>.health.json``, written every
    [metrics] health_interval_s while [metrics] listen is set), with its age:
    a daemon that stopped writing is not reported healthy."""
    d = _read_report(cfg.resolve(state_dir) / f"{daemon}.health.json")
    if d is None or "error" in d:
        return d
    age = time.time() - float(d.get("written_at", 0))
    health = dict(d.get("health", {}))
    # Three intervals: one late write is jitter, more means the daemon is gone.
    if age > 3 * cfg.metrics.health_interval_s:
        health["status"] = "unknown"
        health.setdefault("reasons", []).append(f"report is {age:.0f}s old: is the {daemon} running?")
    return {"report_age_s": round(age, 1), "listen": d.get("listen"), **health}


def _transport(cfg: Config, producer_seq: int, applier_seq: int | None) -> dict[str, Any]:
    """What Redis holds: stream length, envelopes not yet acknowledged, dead letters."""
    if cfg.transport.kind != "redis":
        return {"kind": cfg.transport.kind, "path": cfg.transport.path}
    import redis

    from cynomys.transport.redis_bus import redis_client, translate

    out: dict[str, Any] = {"kind": "redis", "stream": cfg.transport.stream, "mode": cfg.transport.mode}
    r = redis_client(cfg.transport.url, 5.0)
    try:
        seq = r.hget(f"{cfg.transport.stream}:seq", cfg.producer.id)
        out["last_sequence"] = int(seq) if seq is not None else 0
        if cfg.transport.mode == "stream":
            out["length"] = int(r.xlen(cfg.transport.stream))
            out["dead_letters"] = int(r.xlen(cfg.transport.dead_letter_stream or f"{cfg.transport.stream}:dead"))
            try:
                groups = {str(g["name"], "utf-8") if isinstance(g["name"], bytes) else g["name"]: g
                          for g in r.xinfo_groups(cfg.transport.stream)}
            except redis.ResponseError:  # no stream yet
                groups = {}
            base = cfg.transport.consumer_group
            names = [base] if cfg.applier.partitions == 1 else [f"{base}.p{i}" for i in range(cfg.applier.partitions)]
            for name in names:
                g = groups.get(name)
                where = "" if len(names) == 1 else f" {name}"
                out[f"unacknowledged{where}"] = int(g["pending"]) if g else None
                out[f"lag_entries{where}"] = int(g["lag"]) if g and g.get("lag") is not None else None
            # Groups no applier of this config reads hold back the stream's trimming.
            stale = sorted(set(groups) - set(names))
            if stale:
                out["other_groups"] = stale
        out["reachable"] = True
    except redis.RedisError as exc:
        out.update(reachable=False, error=str(translate(exc, cfg.transport.url, "reading the stream's state")))
    finally:
        r.close()
    if applier_seq is not None:
        out["envelopes_behind_producer"] = max(0, producer_seq - applier_seq)
    return out


def _applier(cfg: Config, suffix: str, source_end: Position | None,
             producer_seq: int) -> tuple[dict[str, Any], int | None, dict[str, Any] | None]:
    """One applier's section (``suffix`` ".p<i>" names a partition's files),
    its applied sequence, and its raw report."""
    state_dir = cfg.applier.state_dir
    areport = _read_report(cfg.resolve(state_dir) / f"applier{suffix}.json")
    health = _health(cfg, state_dir, f"applier{suffix}")
    if areport is None:
        return {"state": "no report yet (the applier has not flushed)", "health": health}, None, None
    if "error" in areport:
        return areport, None, areport
    position = Position.from_dict(areport["position"])
    commit_ts = int(areport.get("commit_ts", 0))
    seq = int(areport["seq"])
    caught_up = source_end is not None and position.file == source_end.file and position.pos >= source_end.pos
    return {
        "sequence": seq, "position": str(position),
        "flushed_s_ago": round(time.time() - float(areport.get("flushed_at", 0)), 1),
        "lag_bytes": _bytes_behind(source_end, position),
        # Caught up means no lag, however old the last change is.
        "lag_s": 0.0 if caught_up else (round(time.time() - commit_ts, 1) if commit_ts else None),
        "envelopes_behind_producer": max(0, producer_seq - seq),
        # Source commit -> readable on the target, over the last minutes, and
        # the clock offsets it was corrected by (metrics/freshness.py).
        **_extras(cfg, state_dir, f"applier{suffix}", "freshness"),
        "stats": areport.get("stats", {}),
        "health": health,
    }, seq, areport


def collect(cfg: Config) -> dict[str, Any]:
    """Positions and lag from the daemons' own reports (their state files)
    plus the source's binlog end and Redis; the target is never opened, so
    a Spark target needs no Spark session here."""
    from cynomys.producer import ProducerState

    report: dict[str, Any] = {"config": cfg.path, "now": time.time()}
    source_end: Position | None = None
    try:
        from cynomys.parser.stream import open_inspector

        ins = open_inspector(cfg.source)  # the server, or the end of [source] binlog_files
        try:
            source_end = ins.current()
            report["source"] = {"reachable": True, "binlog_end": str(source_end)}
        finally:
            ins.close()
    except CynomysError as exc:
        report["source"] = {"reachable": False, "error": str(exc)}

    pstate = ProducerState.load(cfg.resolve(cfg.producer.state_dir) / "producer.json")
    ha: dict[str, Any] | None = None
    if cfg.producer.ha:
        pstate, ha = _ha_section(cfg, pstate)
    report["producer"] = {
        "id": cfg.producer.id,
        "checkpoint": str(pstate.checkpoint) if pstate.checkpoint else None,
        "read": str(pstate.read) if pstate.read else None,
        "sequence": pstate.seq,
        "state_updated_s_ago": round(time.time() - pstate.updated, 1) if pstate.updated else None,
        "lag_bytes": _bytes_behind(source_end, pstate.checkpoint),
        "last_event_age_s": round(time.time() - pstate.last_event_ts, 1) if pstate.last_event_ts else None,
        "stats": pstate.stats,
        # Which row decoder the producer runs: the compiled hot path or the
        # pure-Python fallback (written by the producer into producer.json).
        "hot_path": (_read_report(cfg.resolve(cfg.producer.state_dir) / "producer.json") or {}).get("hot_path"),
        "health": _health(cfg, cfg.producer.state_dir, "producer"),
        **_extras(cfg, cfg.producer.state_dir, "producer", "clock"),
    }
    if ha is not None:
        report["producer"]["ha"] = ha
    # The applier mirrors what it committed to the target into applier.json
    # after every flush (cynomys/applier/loop.py _report); partitioned
    # appliers each into applier.p<i>.json, shown one by one.
    a = cfg.applier
    applier_seq: int | None = None
    if a.partitions == 1:
        report["applier"], applier_seq, areport = _applier(cfg, "", source_end, pstate.seq)
    else:
        report["applier"] = {"partitions": a.partitions}
        seqs: list[int | None] = []
        for i in range(a.partitions):
            report["applier"][f"partition {i}"], seq, areport = _applier(cfg, f".p{i}", source_end, pstate.seq)
            seqs.append(seq)
        # The stream is applied as far as the partition furthest behind.
        applier_seq = None if None in seqs else min(s for s in seqs if s is not None)
    if areport is not None and "target_maintenance" in areport:  # written by the applier (Spark: maintenance)
        report["target_maintenance"] = areport["target_maintenance"]
    try:
        report["transport"] = _transport(cfg, pstate.seq, applier_seq)
    except CynomysError as exc:
        report["transport"] = {"reachable": False, "error": str(exc)}
    report["snapshot"] = _snapshot_section(cfg)
    report["verify"] = _verify_section(cfg)
    return report


def _ha_section(cfg: Config, mirror: Any) -> tuple[Any, dict[str, Any]]:
    """HA producers: the state from Redis (the truth; the local
    producer.json is only the mirror of whoever led on this host) and who
    holds the lease."""
    from cynomys.producer import ProducerState
    from cynomys.transport.lease import RedisLease

    try:
        lease = RedisLease(cfg.transport, cfg.producer.id, "status", cfg.producer.lease_ms)
        try:
            holder, state = lease.holder(), lease.load_state()
        finally:
            lease.close()
    except CynomysError as exc:
        return mirror, {"lease": lease_key(cfg), "error": str(exc).splitlines()[0], "state": "local mirror"}
    token, _, owner = (holder or "").partition(":")
    if state is not None:  # signed by the producer (cynomys/producer/ha.py); status shows it unverified
        state = json.loads(state["state"]) if isinstance(state.get("state"), str) else None
    return (ProducerState.from_dict(state) if state is not None else mirror), {
        "lease": lease_key(cfg), "leader": owner or None, "fencing_token": int(token) if token else None,
        "state": "redis" if state is not None else "local mirror (no state in Redis yet)"}


def lease_key(cfg: Config) -> str:
    return f"{cfg.transport.stream}:lease:{cfg.producer.id}"


def _verify_section(cfg: Config) -> dict[str, Any]:
    """Verify jobs (producer's verify.json) and their results (applier's verify-results.jsonl)."""
    from cynomys.verify.command import status_report

    try:
        return status_report(cfg)
    except (CynomysError, OSError, ValueError) as exc:
        return {"error": str(exc)}


def _snapshot_section(cfg: Config) -> dict[str, Any]:
    """Snapshot jobs as the producer records them (cynomys/snapshot/state.py)."""
    from cynomys.snapshot.state import status_report

    try:
        return status_report(cfg.resolve(cfg.producer.state_dir))
    except CynomysError as exc:
        return {"error": str(exc)}


def freshness_text(f: dict[str, Any]) -> str:
    """One line: the applier's freshness over its window, and the clock skew used."""
    def s(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}s"

    if not f.get("transactions"):
        text = f"no transaction applied in the last {f.get('window_s', 0):.0f}s"
    else:
        text = (f"p50 {s(f.get('p50_s'))}, p99 {s(f.get('p99_s'))}, max {s(f.get('max_s'))} over the last "
                f"{f.get('window_s', 0):.0f}s ({f['transactions']} transactions)")
    text += f"; last flush {s(f.get('last_flush_s'))}"
    c = f.get("clock") or {}
    if c.get("measured"):
        text += (f"; clock skew used: source {c['source_minus_applier_s']:+.3f}s, producer "
                 f"{c['producer_minus_applier_s']:+.3f}s vs this host (+-{c['uncertainty_s']:.3f}s, "
                 f"measured {c['measured_s_ago']:.0f}s ago)")
    else:
        text += "; clock skew not measured (clocks taken as equal)"
    return text


def _line(k: str, v: Any) -> str:
    if k == "freshness" and isinstance(v, dict):
        return f"{k}: {freshness_text(v)}"
    return f"{k}: {v}"


def render_text(report: dict[str, Any]) -> str:
    lines = [f"config: {report['config']}"]
    for part in ("source", "producer", "applier", "transport"):
        lines.append(f"{part}:")
        for k, v in report.get(part, {}).items():
            if isinstance(v, dict) and k.startswith("partition "):  # a partitioned applier's partition
                lines.append(f"  {k}:")
                lines += [f"    {_line(kk, vv)}" for kk, vv in v.items()]
            else:
                lines.append(f"  {_line(k, v)}")
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
    ver = report.get("verify", {})
    lines.append("verify:")
    if "error" in ver:
        lines.append(f"  error: {ver['error']}")
    for ident, j in ver.get("jobs", {}).items():
        lines.append(f"  {ident}: {j['status']}, {j['chunks_checked']}/{j['chunks_emitted']} chunks checked, "
                     f"{j['rows_checked']} rows, {len(j['mismatches'])} differ")
        lines += [f"    differs: {m}" for m in j["mismatches"]]
    return "\n".join(lines)


# -- the command ----------------------------------------------------------

def run(args: argparse.Namespace) -> int:

    cfg = config_of(args)
    report = collect(cfg)
    print(json.dumps(report, indent=1, default=str) if args.json else render_text(report))
    return 0


def register(sub: Any) -> None:
    st = with_config(sub.add_parser("status", help="positions and lag"))
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=run)

