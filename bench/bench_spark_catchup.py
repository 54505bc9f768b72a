"""Spark/Iceberg catch-up after a live OLTP source stops (issue #11).

    python bench/bench_spark_catchup.py [--runs 1] [--spark-buffer-rows 10000,2000] [--no-reference]

The scenario of tests/integration/test_e2e_spark.py (4 writers of the mixed
workload for 60 s, producer and applier SIGKILLed twice each, an ALTER half
way, every table then compared with the source row by row), run through the
same helper (tests/integration/test_e2e_columnstore._run), once per Spark
``[applier] buffer_rows`` and once into a plain MariaDB (the ColumnStore
target code, engine InnoDB) as the reference: a target whose commit costs
milliseconds shows what the producer and the transport allow.  Recorded per
run: seconds from the writers' stop until every table was equal (the test
asserts equality only, never a time), the source transactions written, and
the applier's per-flush profile from its log (the ``flush seq`` lines of
SparkTarget.apply).  Writes bench/results/spark_catchup.json.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common  # noqa: E402

EQUAL = re.compile(r"(\d+) source transactions from 4 writers in (\d+)s, kills (\{[^}]*\}), final rows (\{[^}]*\}); "
                   r"target equal ([\d.]+)s after the writers stopped")
FLUSH = re.compile(r"^(\S+ \S+) INFO \S+: flush seq (\d+): (\d+) net changes in ([\d.]+)s \(plan ([\d.]+)s; (.*); "
                   r"state ([\d.]+)s\)")


def table_seconds(tables: str) -> dict[str, float]:
    """Each table's seconds in a flush line's table part ("a 10 rows 0.52s
    (a note); b ...").  A table's note in parentheses (direct appends, row
    deltas) holds "; " too: notes are dropped first."""
    parts = re.sub(r" \([^()]*\)", "", tables).split("; ")
    return {t.split()[0]: float(t.rsplit(" ", 1)[1].rstrip("s")) for t in parts if t != "no rows"}


def flush_profile(log: Path) -> dict[str, Any]:
    """Summary of the applier's flushes in one test's log (every incarnation)."""
    flushes: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        m = FLUSH.match(line)
        if m:
            tables = table_seconds(m.group(6))
            flushes.append({"at": m.group(1), "seq": int(m.group(2)), "net_changes": int(m.group(3)),
                            "seconds": float(m.group(4)), "plan_s": float(m.group(5)), "tables_s": tables,
                            "state_s": float(m.group(7))})
    if not flushes:
        return {"flushes": 0}
    secs = [f["seconds"] for f in flushes]
    # The second half of the flushes: envelopes committed per second.  When
    # the flushes there take far fewer envelopes than a full read (200), the
    # applier was waiting for them: this is then the rate they arrived at.
    half = flushes[len(flushes) // 2:]
    t = [datetime.datetime.strptime(f["at"], "%Y-%m-%d %H:%M:%S,%f") for f in half]
    span = (t[-1] - t[0]).total_seconds()
    tail = {"envelopes_per_s": round((half[-1]["seq"] - half[0]["seq"]) / span, 2) if span > 0 else None,
            "envelopes_per_flush_median": statistics.median(
                b["seq"] - a["seq"] for a, b in zip(half, half[1:])) if len(half) > 1 else None}
    return {"second_half": tail, "flushes": len(flushes), "seconds_total": round(sum(secs), 1), "seconds_median": statistics.median(secs),
            "net_changes_median": statistics.median(f["net_changes"] for f in flushes),
            "envelopes_per_flush_median": statistics.median(
                b["seq"] - a["seq"] for a, b in zip(flushes, flushes[1:])) if len(flushes) > 1 else None,
            "each": flushes}


def run_once(kind: str, buffer_rows: int, tmp: Path) -> dict[str, Any]:
    from tests.integration.test_e2e_columnstore import MariaDBSide, _run, _writer
    from tests.integration.test_e2e_spark import SparkSide
    from tests.servers.redis import RedisServer

    tmp.mkdir(parents=True)
    side: Any = (lambda src: SparkSide(src, tmp / "c.toml")) if kind == "spark" else MariaDBSide
    redis = RedisServer()
    out: dict[str, Any] = {"target": kind, "buffer_rows": buffer_rows,
                           "loadavg_1m_before": os.getloadavg()[0]}
    printed = io.StringIO()
    t0 = time.monotonic()
    try:
        with contextlib.redirect_stdout(printed):
            _run(tmp, redis.url, writer=_writer, batch_max_events=500, kills=["producer", "applier"] * 2,
                 alter_at=2, target=side, write_s=60, catch_up_s=600,
                 applier={"buffer_rows": buffer_rows, "max_delay_ms": 300})
        out["equal"] = True
    except AssertionError as exc:
        out["equal"] = False
        out["error"] = str(exc)[:2000]
    finally:
        redis.stop()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    m = EQUAL.search(printed.getvalue())
    if m:
        out.update({"source_transactions": int(m.group(1)), "write_s": int(m.group(2)), "kills": m.group(3),
                    "final_rows": m.group(4), "catch_up_s": float(m.group(5))})
    log = tmp / "logs" / "applier.log"
    if log.exists():
        out["applier_flushes"] = flush_profile(log)
        app = tmp / "applier-state" / "applier.json"
        if app.exists():
            stats = out["applier_stats"] = json.loads(app.read_text()).get("stats")
            if stats and stats.get("flushes"):
                # Far below a full read (200): the applier waited for envelopes (it was not the bottleneck).
                out["envelopes_per_flush_last_incarnation"] = round(stats["envelopes"] / stats["flushes"], 1)
            rate = out["applier_flushes"].get("second_half", {}).get("envelopes_per_s")
            if stats and stats.get("envelopes") and rate:
                # Source row changes per second reaching the applier then.
                out["second_half_row_changes_per_s"] = round(rate * stats["rows_in"] / stats["envelopes"])
    print(f"{kind} buffer_rows {buffer_rows}: equal {out['equal']}, catch-up {out.get('catch_up_s')}s, "
          f"{out.get('source_transactions')} source transactions, applier stats {out.get('applier_stats')}",
          flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spark-buffer-rows", default="10000,2000", help="comma-separated [applier] buffer_rows")
    ap.add_argument("--no-reference", action="store_true", help="skip the MariaDB reference run")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--note", default="", help="what this run measures (recorded)")
    ap.add_argument("--out", default=str(common.RESULTS / "spark_catchup.json"))
    ap.add_argument("--keep", default="", help="a directory to keep each run's logs and state in (default: removed)")
    args = ap.parse_args()
    info = common.machine()
    plan = [("spark", int(n)) for n in args.spark_buffer_rows.split(",")]
    if not args.no_reference:
        plan.insert(1, ("mariadb", 10_000))  # between the Spark runs: the box's load drifts
    runs = []
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="cynomys-catchup-"))
        for i in range(args.runs):
            for kind, n in plan:
                runs.append(run_once(kind, n, Path(tmp) / f"r{i}-{kind}-{n}"))
    result = {"benchmark": "bench/bench_spark_catchup.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": info, "note": args.note,
              "scenario": "tests/integration/test_e2e_spark.py: 4 writers, mixed workload, 60 s, producer and "
                          "applier SIGKILLed twice each, ALTER half way, max_delay_ms 300, Spark local[2]; "
                          "catch_up_s = seconds from the writers' stop until every table equalled the source row "
                          "by row; target mariadb = the ColumnStore target code on InnoDB (reference)",
              "runs": runs}
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
