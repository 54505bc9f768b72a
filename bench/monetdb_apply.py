"""MonetDB target alone: lineitem InsertRuns applied as row images (the way
before issue #28) and column-wise (``monetdb/runs.py``, COPY ... ON CLIENT),
side by side in one process, alternating.

    python bench/monetdb_apply.py [--rows 200000] [--rounds 3] [--monetdb-url URL]

The runs come from the applier's compiled decoder (1000-row source
transactions, one envelope each) and are applied in flushes of 10,000 rows
(``[applier] buffer_rows``), each one MonetDB transaction with its state.
Reported: seconds and rows/s per round and way, the best of each, the load
average.  Writes bench/results/monetdb_apply.json.  Schemas ``bench_mapply_*``
are created and dropped on the server.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402
from bench.tpch import lineitem  # noqa: E402

COLUMNS = [("l_orderkey", "bigint"), ("l_partkey", "bigint"), ("l_suppkey", "bigint"), ("l_linenumber", "int"),
           ("l_quantity", "decimal(15,2)"), ("l_extendedprice", "decimal(15,2)"), ("l_discount", "decimal(15,2)"),
           ("l_tax", "decimal(15,2)"), ("l_returnflag", "char(1)"), ("l_linestatus", "char(1)"),
           ("l_shipdate", "date"), ("l_commitdate", "date"), ("l_receiptdate", "date"), ("l_shipinstruct", "char(25)"),
           ("l_shipmode", "char(10)"), ("l_comment", "varchar(44)")]


def main() -> None:
    from cynomys.applier.targets.base import build_flush
    from cynomys.applier.targets.monetdb.target import MonetDBTarget
    from cynomys.core import compiled
    from cynomys.core.config import Config, TargetConfig
    from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, Op, Position, TableSchema
    from cynomys.schemas import codec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--monetdb-url", default=os.environ.get("CYNOMYS_TEST_MONETDB", ""))
    args = ap.parse_args()
    if not args.monetdb_url:
        raise SystemExit("no MonetDB: pass --monetdb-url or set CYNOMYS_TEST_MONETDB")
    if not compiled.available():
        raise SystemExit("cynomys._speedups is not built: the column-wise path needs it")
    compiled.use_compiled(True)
    rows = lineitem(args.rows)
    target = MonetDBTarget(Config(target=TargetConfig(kind="monetdb", url=args.monetdb_url)))
    target.connect()
    load_at_start = os.getloadavg()[0]
    seq = 0
    rounds: list[dict[str, Any]] = []
    for n in range(args.rounds):
        for columnar in (False, True):
            db = f"bench_mapply_{n}_{int(columnar)}"
            schema = TableSchema(db, "lineitem", tuple(ColumnDef(c, t) for c, t in COLUMNS),
                                 ("l_orderkey", "l_linenumber"))
            runs: list[Change] = []
            for i in range(0, len(rows), 1000):
                txn = Position("b.000001", 100 + i)
                changes = tuple(Change(Op.INSERT, db, "lineitem", "t", txn, 1, schema, None, r) for r in rows[i:i + 1000])
                runs += codec.decode_columnar(codec.encode(Batch("p", changes, Position("b.000001", 10**6)))).changes
            t0 = time.perf_counter()
            for i in range(0, len(runs), 10):
                seq += 1
                state = AppliedState("bench-mapply", seq, Position("b.000001", seq))
                target.apply(build_flush(runs[i:i + 10], state, columnar))
            took = time.perf_counter() - t0
            held = len(target.fetch_rows(db, "lineitem"))
            with target.transaction(f"dropping {db}") as cur:
                cur.execute(f'DROP SCHEMA "{db}" CASCADE')
            target.forget_caches()
            way = "column-wise" if columnar else "row images"
            rounds.append({"round": n, "way": way, "s": round(took, 2), "rows_per_s": round(len(rows) / took),
                           "rows_held": held, "loadavg_1m": os.getloadavg()[0]})
            print(f"{way:12} {took:6.2f} s  {len(rows) / took:9,.0f} rows/s  load {os.getloadavg()[0]:.1f}", flush=True)
            if held != len(rows):
                raise SystemExit(f"{db} holds {held} rows, not {len(rows)}")
    best = {way: min(r["s"] for r in rounds if r["way"] == way) for way in ("row images", "column-wise")}
    result = {"rows": len(rows), "flush_rows": 10_000, "monetdb": target.features.version,
              "copy_on_client": target.features.copy_on_client, "rounds": rounds,
              "best_s": best, "speedup": round(best["row images"] / best["column-wise"], 2),
              "loadavg_1m_at_start": load_at_start, "loadavg_1m_at_end": os.getloadavg()[0]}
    target.close()
    out = write_result("monetdb_apply", result)
    print(f"best: row images {best['row images']} s, column-wise {best['column-wise']} s "
          f"(x{result['speedup']}); wrote {out}")


if __name__ == "__main__":
    main()
