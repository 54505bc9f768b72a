"""MonetDB target alone: a flush's updates of a keyless table, its rows
deleted together (one temporary table, a join and a semijoin) against one
row at a time (count the copies, delete them all: two scans a row, the way
before), side by side in one process, alternating.

    python bench/monetdb_keyless.py [--rows 1000000] [--updates 1,100,1000,10000] [--monetdb-url URL]

A lineitem table without a key (``--rows`` rows, loaded once by the
target's COPY) takes flushes of ``--updates`` single-row UPDATEs (a row
image out, the same row with a new comment in), each flush one MonetDB
transaction with its state, as the applier sends them.  Reported: seconds
a flush and updated rows/s for each way and size, the load average; the
table's row count is checked after each flush.  Writes
bench/results/monetdb_keyless.json and a PNG.  Schema ``bench_mkeyless`` is
created and dropped on the server.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, write_result  # noqa: E402
from bench.monetdb_apply import COLUMNS  # noqa: E402
from bench.tpch import lineitem  # noqa: E402


def main() -> None:
    from cynomys.applier.targets.base import build_flush
    from cynomys.applier.targets.monetdb.target import MonetDBTarget
    from cynomys.core.config import Config, TargetConfig
    from cynomys.core.model import AppliedState, Change, ColumnDef, Op, Position, Row, TableSchema

    class OneAtATime(MonetDBTarget):
        """The way before: each keyless row counted and deleted alone."""

        def _delete_rows(self, cur: Any, schema: TableSchema, codecs: Any, rows: Mapping[Row, int]) -> list[Row]:
            return [r for row, n in rows.items() for r in self._delete_row(cur, schema, codecs, row, n)]

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--updates", default="1,100,1000,10000", help="rows updated by one flush, comma-separated")
    ap.add_argument("--monetdb-url", default=os.environ.get("CYNOMYS_TEST_MONETDB", ""))
    args = ap.parse_args()
    if not args.monetdb_url:
        raise SystemExit("no MonetDB: pass --monetdb-url or set CYNOMYS_TEST_MONETDB")
    cfg = Config(target=TargetConfig(kind="monetdb", url=args.monetdb_url))
    ways = {"together": MonetDBTarget(cfg), "one at a time": OneAtATime(cfg)}
    for t in ways.values():
        t.connect()
    db = "bench_mkeyless"
    schema = TableSchema(db, "lineitem", tuple(ColumnDef(c, t) for c, t in COLUMNS), ())
    rows = lineitem(args.rows)
    load_at_start = os.getloadavg()[0]
    target = ways["together"]
    seq = 0

    def apply(t: MonetDBTarget, changes: list[Change]) -> float:
        nonlocal seq
        seq += 1
        t0 = time.perf_counter()
        t.apply(build_flush(changes, AppliedState("bench-mkeyless", seq, Position("b.000001", seq))))
        return time.perf_counter() - t0

    for i in range(0, len(rows), 100_000):
        apply(target, [Change(Op.INSERT, db, "lineitem", "t", Position("b.000001", 4), 1, schema, None, r)
                       for r in rows[i:i + 100_000]])
    print(f"loaded {len(rows):,} rows", flush=True)
    current = list(rows)
    step = max(len(rows) // 20_011, 1)  # rows spread over the table
    results: list[dict[str, Any]] = []
    picked = 0
    for size in (int(s) for s in args.updates.split(",")):
        for way, t in ways.items():
            changes = []
            for _ in range(size):
                i = (picked * step) % len(current)
                picked += 1
                before = current[i]
                current[i] = before[:-1] + (f"u{picked}",)
                changes.append(Change(Op.UPDATE, db, "lineitem", "t", Position("b.000001", 4), 1, schema, before,
                                      current[i]))
            took = apply(t, changes)
            with t.transaction("counting rows") as cur:
                cur.execute(f'SELECT COUNT(*) FROM "{db}"."lineitem"')
                held = int(cur.fetchone()[0])
            results.append({"updates": size, "way": way, "s": round(took, 3), "rows_per_s": round(size / took),
                            "rows_held": held, "loadavg_1m": os.getloadavg()[0]})
            print(f"{size:6} updates {way:14} {took:8.3f} s  {size / took:9,.0f} rows/s  load {os.getloadavg()[0]:.1f}",
                  flush=True)
            if held != len(rows):
                raise SystemExit(f"{db}.lineitem holds {held} rows, not {len(rows)}")
    with target.transaction(f"dropping {db}") as cur:
        cur.execute(f'DROP SCHEMA "{db}" CASCADE')
    result = {"rows": len(rows), "monetdb": target.features.version, "results": results,
              "loadavg_1m_at_start": load_at_start, "loadavg_1m_at_end": os.getloadavg()[0]}
    for t in ways.values():
        t.close()
    out = write_result("monetdb_keyless", result)
    plot(results, len(rows), RESULTS / "monetdb_keyless.png")
    print(f"wrote {out}")


def plot(results: list[dict[str, Any]], rows: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for way in ("together", "one at a time"):
        pts = [(r["updates"], r["s"]) for r in results if r["way"] == way]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=way)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keyless rows updated in one flush")
    ax.set_ylabel("flush seconds")
    ax.set_title(f"MonetDB, keyless table of {rows:,} rows")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
