"""Queries on the Iceberg replica while replication runs (issue #27): TPC-H Q1
on the lineitem replica against the same rows written once and compacted.

    python bench/spark_query.py [--base-rows 300000] [--flushes 120] [--flush-rows 5000]

The applier's own flush path (SparkTarget.apply, merge-on-read, maintenance
as shipped: every ``maintenance_commits`` commits, run when the applier is
idle) keeps a lineitem replica in a local warehouse: a load of
``--base-rows`` rows, then a thread applies ``--flushes`` flushes of
``--flush-rows`` net changes (50% new lineitem rows, 30% updates of
quantity/price/discount, 20% deletes of existing rows), calling ``idle()``
after each one as an applier that keeps up does.

Every ``--every`` flushes, while the thread goes on flushing, the reader
takes the replica's current snapshot S, copies it once into a new table
(``CREATE TABLE AS SELECT ... VERSION AS OF S``) and compacts the copy
(``rewrite_data_files``), then runs Q1 alternately on the replica at S and
on the copy (``--repeats`` each): the same rows, the same moment and the
same competition for the CPU; only the files differ.  Reported per
checkpoint: both medians, their ratio (the goal: at most 1.3), and the
replica's live data and delete files at S.  Writes
bench/results/spark_query.json and .png.
"""
from __future__ import annotations

import argparse
import datetime
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, write_result  # noqa: E402
from bench.tpch import lineitem  # noqa: E402
from cynomys.applier.targets.base import AppliedState, Flush, TableFlush  # noqa: E402
from cynomys.applier.targets.spark.config import SparkConfig  # noqa: E402
from cynomys.applier.targets.spark.target import SparkTarget  # noqa: E402
from cynomys.core.config import Config, TargetConfig  # noqa: E402
from cynomys.core.model import ColumnDef, Position, TableSchema  # noqa: E402

COLUMNS = (
    ("l_orderkey", "bigint"), ("l_partkey", "bigint"), ("l_suppkey", "bigint"), ("l_linenumber", "int"),
    ("l_quantity", "decimal(15,2)"), ("l_extendedprice", "decimal(15,2)"), ("l_discount", "decimal(15,2)"),
    ("l_tax", "decimal(15,2)"), ("l_returnflag", "char(1)"), ("l_linestatus", "char(1)"), ("l_shipdate", "date"),
    ("l_commitdate", "date"), ("l_receiptdate", "date"), ("l_shipinstruct", "char(25)"), ("l_shipmode", "char(10)"),
    ("l_comment", "varchar(44)"))
SCHEMA = TableSchema("tpch", "lineitem", tuple(ColumnDef(n, t) for n, t in COLUMNS), ("l_orderkey", "l_linenumber"))

Q1 = """SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
  sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, avg(l_quantity) AS avg_qty,
  avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc, count(*) AS count_order
FROM {table}
WHERE l_shipdate <= date '1998-12-01' - interval '90' day
GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus"""


class Replication:
    """The applier side: lineitem flushes through SparkTarget.apply, in a thread."""

    def __init__(self, target: SparkTarget, rows: list[tuple[Any, ...]], base: int, seed: int = 27) -> None:
        self.target = target
        self.pending = rows[base:]
        self.live: dict[tuple[Any, Any], tuple[Any, ...]] = {(r[0], r[3]): r for r in rows[:base]}
        self.keys = list(self.live)
        self.rnd = random.Random(seed)
        self.seq = 0
        self.flushes = 0
        self.flush_s: list[float] = []
        self.maintained_at: list[int] = []  # flush numbers after which maintenance ran
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def state(self) -> AppliedState:
        self.seq += 1
        return AppliedState("bench", self.seq, Position("mysql-bin.000001", 1000 + self.seq), self.seq)

    def load(self, rows: list[tuple[Any, ...]]) -> None:
        for i in range(0, len(rows), 100_000):
            self.target.apply(Flush([TableFlush(SCHEMA, inserts=list(rows[i:i + 100_000]))], self.state()))

    def one(self, n: int) -> None:
        n_ins, n_upd = n // 2, n * 3 // 10
        n_del = n - n_ins - n_upd
        new, self.pending = self.pending[:n_ins], self.pending[n_ins:]
        picked = self.rnd.sample(range(len(self.keys)), n_upd + n_del)
        upd = [self.keys[i] for i in picked[:n_upd]]
        dele = {self.keys[i] for i in picked[n_upd:]}
        images = []
        for k in upd:
            r = list(self.live[k])
            r[4] = Decimal(self.rnd.randrange(100, 5000)).scaleb(-2)  # quantity
            r[5] = (r[5] * Decimal("1.01")).quantize(Decimal("0.01"))  # price
            r[6] = Decimal(self.rnd.randrange(0, 11)).scaleb(-2)  # discount
            self.live[k] = tuple(r)
            images.append(tuple(r))
        for k in dele:
            del self.live[k]
        for r in new:
            self.live[(r[0], r[3])] = r
        self.keys = [k for k in self.keys if k not in dele] + [(r[0], r[3]) for r in new]
        tf = TableFlush(SCHEMA, delete_keys=list(upd) + list(dele), inserts=images + list(new))
        t0 = time.monotonic()
        runs = len(self.target.maintenance.runs)
        self.target.apply(Flush([tf], self.state()))
        self.target.idle()  # an applier that keeps up is idle between flushes: due tables are maintained then
        self.flush_s.append(time.monotonic() - t0)
        self.flushes += 1
        if len(self.target.maintenance.runs) > runs:
            self.maintained_at.append(self.flushes)

    def run(self, flushes: int, n: int) -> None:
        try:
            for _ in range(flushes):
                if self.stop.is_set():
                    return
                self.one(n)
        except BaseException as exc:  # raised by the main thread
            self.error = exc


def timed(spark: Any, sql: str) -> float:
    t0 = time.perf_counter()
    spark.sql(sql).collect()
    return time.perf_counter() - t0


def checkpoint(target: SparkTarget, rep: Replication, k: int, repeats: int) -> dict[str, Any]:
    spark = target.spark
    name = target.qualified("tpch", "lineitem")
    snap = target.iceberg.current("tpch", "lineitem")
    assert snap is not None
    at = f"{name} VERSION AS OF {snap.id}"
    files = {r.content: r.n for r in spark.sql(
        f"SELECT content, count(*) AS n FROM {name}.files VERSION AS OF {snap.id} GROUP BY content").collect()}
    copy = target.qualified("tpch", f"lineitem_once_{k}")
    t0 = time.perf_counter()
    spark.sql(f"CREATE TABLE {copy} USING iceberg TBLPROPERTIES ('format-version' = "
              f"'{target.settings.format_version}') AS SELECT * FROM {at}")
    spark.sql(f"CALL {target.catalog}.system.rewrite_data_files(table => 'tpch.lineitem_once_{k}', "
              "options => map('rewrite-all', 'true'))").collect()
    copy_s = time.perf_counter() - t0
    copy_files = spark.sql(f"SELECT count(*) FROM {copy}.files").collect()[0][0]
    timed(spark, Q1.format(table=copy))  # both plans compiled once before the clock
    timed(spark, Q1.format(table=at))
    replica, once = [], []
    for _ in range(repeats):
        replica.append(timed(spark, Q1.format(table=at)))
        once.append(timed(spark, Q1.format(table=copy)))
    same = spark.sql(Q1.format(table=at)).collect() == spark.sql(Q1.format(table=copy)).collect()
    spark.sql(f"DROP TABLE {copy} PURGE")
    r = {"flushes_done": rep.flushes, "snapshot": snap.id, "rows": len(rep.live),
         "replica_files": {"data": files.get(0, 0), "position_deletes": files.get(1, 0)},
         "copy_files": copy_files, "copy_s": round(copy_s, 1),
         "replica_q1_s": [round(x, 3) for x in replica], "once_q1_s": [round(x, 3) for x in once],
         "replica_median_s": round(statistics.median(replica), 3), "once_median_s": round(statistics.median(once), 3),
         "same_result": same, "flushing_meanwhile": not rep.stop.is_set() and rep.error is None}
    r["ratio"] = round(r["replica_median_s"] / r["once_median_s"], 3)
    print(f"  checkpoint {k} after {rep.flushes} flushes: Q1 replica {r['replica_median_s']:.2f}s vs written once "
          f"{r['once_median_s']:.2f}s = {r['ratio']:.2f}x; replica files {r['replica_files']}, copy {copy_files}",
          flush=True)
    return r


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cps = result["checkpoints"]
    x = [c["flushes_done"] for c in cps]
    fig, (ax, fx) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    ax.plot(x, [c["replica_median_s"] for c in cps], "o-", label="Q1 on the replica (at snapshot S)")
    ax.plot(x, [c["once_median_s"] for c in cps], "s-", label="Q1 on the same rows written once, compacted")
    ax2 = ax.twinx()
    ax2.plot(x, [c["ratio"] for c in cps], "k--", label="ratio")
    ax2.axhline(1.3, color="red", linewidth=0.8, label="goal 1.3x")
    ax2.set_ylim(0, max(2.0, max(c["ratio"] for c in cps) * 1.1))
    ax2.set_ylabel("ratio")
    ax.set_ylabel("Q1 median (s)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    fx.plot(x, [c["replica_files"]["data"] for c in cps], "o-", label="replica data files")
    fx.plot(x, [c["replica_files"]["position_deletes"] for c in cps], "o--", label="replica delete files")
    for m in result.get("maintenance_at_flush", []):
        fx.axvline(m, color="#999", linewidth=0.6)
    fx.set_xlabel(f"flushes of {result['settings']['flush_rows']} net changes (grey: maintenance ran)")
    fx.set_ylabel("live files at S")
    fx.set_ylim(bottom=0)
    fx.legend(fontsize=8)
    fig.suptitle(f"TPC-H Q1 on the lineitem replica while replication runs "
                 f"(format v{result['settings']['format_version']}, {result['machine']['cpu']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-rows", type=int, default=300_000)
    ap.add_argument("--flushes", type=int, default=120)
    ap.add_argument("--flush-rows", type=int, default=5000)
    ap.add_argument("--every", type=int, default=15, help="flushes between checkpoints")
    ap.add_argument("--repeats", type=int, default=3, help="Q1 runs per table per checkpoint")
    ap.add_argument("--format-version", type=int, default=SparkConfig().format_version)
    ap.add_argument("--maintenance-commits", type=int, default=SparkConfig().maintenance_commits)
    ap.add_argument("--out", default="spark_query")
    args = ap.parse_args()
    total = args.base_rows + args.flushes * (args.flush_rows // 2) + 10
    print(f"generating {total} lineitem rows ...", flush=True)
    rows = lineitem(total)
    tmp = Path(tempfile.mkdtemp(prefix="cynomys-query-"))
    spark = SparkConfig(master="local[*]", warehouse=str(tmp / "warehouse"), catalog="bench",
                        format_version=args.format_version, maintenance_commits=args.maintenance_commits,
                        conf={"spark.ui.enabled": "false", "spark.driver.memory": "3g"})
    target = SparkTarget(Config(target=TargetConfig(kind="spark", options=(spark,))))
    started = time.monotonic()
    try:
        target.connect()
        rep = Replication(target, rows, args.base_rows)
        t0 = time.monotonic()
        rep.load(rows[:args.base_rows])
        print(f"loaded {args.base_rows} rows in {time.monotonic() - t0:.1f}s; {args.flushes} flushes of "
              f"{args.flush_rows} follow", flush=True)
        for _ in range(3):  # the flush path's code generation, before the clock
            rep.one(args.flush_rows)
        rep.flushes, rep.flush_s, rep.maintained_at = 0, [], []
        target.maintenance.runs = []
        thread = threading.Thread(target=rep.run, args=(args.flushes, args.flush_rows), daemon=True)
        thread.start()
        cps: list[dict[str, Any]] = []
        k = 0
        while thread.is_alive() and rep.error is None:
            if rep.flushes >= (k + 1) * args.every:
                k += 1
                cps.append(checkpoint(target, rep, k, args.repeats))
            time.sleep(0.5)
        thread.join()
        if rep.error is not None:
            raise rep.error
        k += 1
        cps.append(checkpoint(target, rep, k, args.repeats))  # replication done: the end state
        maint = [m.as_dict() for m in target.maintenance.runs]
        ratios = [c["ratio"] for c in cps if c["flushing_meanwhile"]]
        result = {
            "settings": {"base_rows": args.base_rows, "flushes": args.flushes, "flush_rows": args.flush_rows,
                         "every": args.every, "repeats": args.repeats, "format_version": args.format_version,
                         "maintenance_commits": args.maintenance_commits, "master": "local[*]",
                         "mix": {"insert": 0.5, "update": 0.3, "delete": 0.2}},
            "query": Q1.format(table="lineitem"),
            "checkpoints": cps,
            "ratio_while_replicating": {"median": round(statistics.median(ratios), 3) if ratios else None,
                                        "max": max(ratios) if ratios else None, "checkpoints": len(ratios)},
            "flush_s": {"median": round(statistics.median(rep.flush_s), 3), "max": round(max(rep.flush_s), 3)},
            "maintenance_runs": maint,
            "maintenance_at_flush": rep.maintained_at,
            "wall_s": round(time.monotonic() - started, 1),
        }
        out = write_result(args.out, result)
        result["machine"] = {"cpu": __import__("bench.common", fromlist=["cpu_model"]).cpu_model()}
        plot(result, RESULTS / f"{args.out}.png")
        print(f"ratio while replicating: {result['ratio_while_replicating']}; wrote {out} and .png", flush=True)
    finally:
        target.close()
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"done in {datetime.timedelta(seconds=int(time.monotonic() - started))}")


if __name__ == "__main__":
    main()
