"""Spark/Iceberg catch-up after a live OLTP source stops (issue #11).

    python bench/bench_spark_catchup.py [--runs 1] [--buffer-rows 10000,2000]

Runs tests/integration/test_e2e_spark.py (4 writers of the mixed workload for
60 s, producer and applier SIGKILLed twice each, every Iceberg table then
compared with the source row by row) once per ``[applier] buffer_rows`` and
records how long after the writers stopped the target was equal (the test
prints it; the test itself asserts equality only, never a time), with the
applier's per-flush profile from its log (the ``flush seq`` lines of
SparkTarget.apply: net changes, seconds, each table's commit).  Writes
bench/results/spark_catchup.json.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EQUAL = re.compile(r"(\d+) source transactions from 4 writers in (\d+)s, kills (\{[^}]*\}), final rows (\{[^}]*\}); "
                   r"target equal ([\d.]+)s after the writers stopped")
FLUSH = re.compile(r"^(\S+ \S+) INFO \S+: flush seq (\d+): (\d+) net changes in ([\d.]+)s \(plan ([\d.]+)s; (.*); "
                   r"state ([\d.]+)s\)")


def flush_profile(log: Path) -> dict[str, Any]:
    """Summary of the applier's flushes in one test's log (every incarnation)."""
    flushes = []
    for line in log.read_text(errors="replace").splitlines():
        m = FLUSH.match(line)
        if m:
            tables = {t.split()[0]: float(t.rsplit(" ", 1)[1].rstrip("s")) for t in m.group(6).split("; ")
                      if t != "no rows"}
            flushes.append({"at": m.group(1), "seq": int(m.group(2)), "net_changes": int(m.group(3)),
                            "seconds": float(m.group(4)), "plan_s": float(m.group(5)), "tables_s": tables,
                            "state_s": float(m.group(7))})
    if not flushes:
        return {"flushes": 0}
    secs = [f["seconds"] for f in flushes]
    return {"flushes": len(flushes), "seconds_total": round(sum(secs), 1), "seconds_median": statistics.median(secs),
            "net_changes_median": statistics.median(f["net_changes"] for f in flushes),
            "envelopes_per_flush_median": statistics.median(
                b["seq"] - a["seq"] for a, b in zip(flushes, flushes[1:])) if len(flushes) > 1 else None,
            "each": flushes}


def run_once(buffer_rows: int, basetemp: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/integration/test_e2e_spark.py", "-k",
                           f"iceberg[{buffer_rows}]", "-s", "-p", "no:cacheprovider", f"--basetemp={basetemp}"],
                          cwd=ROOT, capture_output=True, text=True)
    out: dict[str, Any] = {"buffer_rows": buffer_rows, "passed": proc.returncode == 0,
                           "wall_s": round(time.monotonic() - t0, 1)}
    m = EQUAL.search(proc.stdout)
    if m:
        out.update({"source_transactions": int(m.group(1)), "write_s": int(m.group(2)), "kills": m.group(3),
                    "final_rows": m.group(4), "catch_up_s": float(m.group(5))})
    else:
        out["tail"] = proc.stdout[-2000:]
    logs = sorted(basetemp.glob("*/logs/applier.log"))
    if logs:
        out["applier_flushes"] = flush_profile(logs[-1])
    print(f"buffer_rows {buffer_rows}: passed {out['passed']}, catch-up {out.get('catch_up_s')}s, "
          f"{out.get('applier_flushes', {}).get('flushes')} flushes", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--buffer-rows", default="10000,2000", help="comma-separated [applier] buffer_rows")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--note", default="", help="what this run measures (recorded)")
    ap.add_argument("--out", default=str(common.RESULTS / "spark_catchup.json"))
    args = ap.parse_args()
    info = common.machine()
    runs = []
    with tempfile.TemporaryDirectory(prefix="cynomys-catchup-") as tmp:
        for i in range(args.runs):
            for n in (int(x) for x in args.buffer_rows.split(",")):
                runs.append(run_once(n, Path(tmp) / f"r{i}-{n}"))
    result = {"benchmark": "bench/bench_spark_catchup.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": info, "note": args.note,
              "scenario": "tests/integration/test_e2e_spark.py: 4 writers, mixed workload, 60 s, producer and "
                          "applier SIGKILLed twice each, max_delay_ms 300, local[2]; catch_up_s = seconds from the "
                          "writers' stop until every Iceberg table equalled the source row by row",
              "runs": runs}
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(__import__("json").dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
