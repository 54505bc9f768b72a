"""`cynomys sql` on the demo's replica: wall time of one query, per engine.

    python bench/sql_console.py --config cynomys-demo/cynomys.toml [--rounds 3] [--before /path/to/old/checkout]

Runs ``cynomys sql -c CONFIG QUERY`` as a user does (a new process each
time) with ``--engine spark`` and ``--engine duckdb``; ``--before`` adds the
same command from another checkout (the console before issue #27: the
applier's session with its state table and write warm-up).  The variants
take turns round by round, so the machine's load hits them alike; the load
average is recorded with every run.  Writes bench/results/sql_console.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUERY = "SELECT status, count(*), sum(amount) FROM shop.orders GROUP BY status"


def variants(config: str, before: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    cli = [sys.executable, "-m", "cynomys.cli", "sql", "-c", config]
    out = {"spark": ([*cli, "--engine", "spark", QUERY], {"PYTHONPATH": str(ROOT)}),
           "duckdb": ([*cli, "--engine", "duckdb", QUERY], {"PYTHONPATH": str(ROOT)})}
    if before:
        out["before (applier session + warm-up)"] = ([*cli, QUERY], {"PYTHONPATH": before,
                                                                    "PYTHONDONTWRITEBYTECODE": "1"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default="", help="a checkout of the code before, run with PYTHONPATH")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {}
    for i in range(args.rounds):
        todo = list(variants(args.config, args.before).items())
        todo = todo[i % len(todo):] + todo[:i % len(todo)]  # rotated: none always first
        for name, (cmd, env) in todo:
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT)
            took = time.monotonic() - t0
            ok = p.returncode == 0 and "paid" in p.stdout
            runs.setdefault(name, []).append({"s": round(took, 2), "loadavg_1m": load, "ok": ok})
            print(f"round {i + 1} {name}: {took:.1f}s (load {load:.1f}){'' if ok else ' FAILED: ' + p.stderr[-300:]}",
                  flush=True)
    summary = {n: {"median_s": statistics.median(r["s"] for r in rs), "min_s": min(r["s"] for r in rs),
                   "all_ok": all(r["ok"] for r in rs)} for n, rs in runs.items()}
    out = write_result("sql_console", {"query": QUERY, "config": "cynomys demo's (local Hadoop warehouse)",
                                       "summary": summary, "runs": runs})
    print(summary)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
