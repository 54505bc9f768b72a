"""Spark/Iceberg apply throughput: rows/s of one flush against buffer size.

    /tmp/venv/bin/python bench/bench_spark_merge.py [--quick] [--base-rows N]

A 5-column keyed table (BIGINT key, INT, VARCHAR(32), DECIMAL(12,2),
DATETIME(6)) is loaded with ``--base-rows`` rows, then flushes of
{100, 1000, 10000, 50000} net changes are applied through SparkTarget.apply
(Arrow encode, one MERGE, the applier state write): 50% inserts of new keys,
30% updates and 20% deletes of existing keys.  Also measured:

- the fixed cost of an (almost) empty flush: one updated row, and a flush
  with no rows (only the applier state moves);
- where the time of a flush goes: Python/Arrow encoding vs Spark (MERGE +
  state);
- merge-on-read (the target's choice) against copy-on-write on the same
  workload, for the middle buffer sizes;
- how a flush slows down as merge-on-read files pile up without compaction.

Local mode (``local[*]``), warehouse on local disk.  Writes
bench/results/spark_merge.json with the machine description.

Format v2 against v3 (issue #27: position-delete files against deletion
vectors; flush time and a reader's aggregate, maintenance on)::

    python bench/bench_spark_merge.py --skip-main --growth 500 --growth-base 200000 --growth-rows 2000 \
        --growth-workloads mixed_random --growth-variants v2,v3 --reader-every 10 \
        --growth-out bench/results/spark_format_versions.json

``--growth N`` (issue #11) measures flush time against flush number instead:
N flushes of ``--growth-rows`` net changes on a ``--growth-base``-row table,
for the flush path before the issue (every keyed flush a MERGE on ``<=>``),
after it (inserts-only appended; ``=`` plus the source key range), after it
without the key range, and after it with table maintenance on; workloads:
insert-only, mixed over random keys, mixed over the newest 10% of keys.
Every variant gets its own table; the variants take turns flush by flush (the
order rotated), so the machine's noise hits them alike.  Writes JSON and PNG
(``--growth-out``)::

    python bench/bench_spark_merge.py --skip-main --growth 50 --growth-base 500000 \
        --growth-workloads mixed_random --maintenance-commits 15 \
        --growth-out bench/results/spark_flush_growth_mixed.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common  # noqa: E402
from cynomys.applier.targets.base import Flush, TableFlush  # noqa: E402
from cynomys.applier.targets.spark.config import SparkConfig  # noqa: E402
from cynomys.applier.targets.spark.session import bundled_iceberg_jar  # noqa: E402
from cynomys.applier.targets.spark.target import SparkTarget  # noqa: E402
from cynomys.core.config import Config, TargetConfig  # noqa: E402
from cynomys.core.model import AppliedState, ColumnDef, Position, Row, TableSchema  # noqa: E402

SIZES = (100, 1000, 10000, 50000)
LOAD_CHUNK = 250_000
CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "2g"}
PRODUCER = "bench"
WORDS = "furiously regular deposits sleep quickly final packages haggle carefully ironic accounts".split()


class CopyOnWriteTarget(SparkTarget):
    """The same target with copy-on-write row-level operations."""

    table_properties: ClassVar[dict[str, str]] = {
        **SparkTarget.table_properties,
        "write.delete.mode": "copy-on-write", "write.update.mode": "copy-on-write",
        "write.merge.mode": "copy-on-write",
    }


class BeforeTarget(SparkTarget):
    """The flush path before issue #11: every keyed flush is a MERGE matching
    keys with ``<=>``, without a key-range condition."""

    append_new_keys: ClassVar[bool] = False
    prune_key_range: ClassVar[bool] = False
    null_safe_keys: ClassVar[bool] = True


class EqualityOnlyTarget(SparkTarget):
    """Keys matched with '=' but no key-range condition (to tell the two apart)."""

    prune_key_range: ClassVar[bool] = False


class ArrowHandoffTarget(SparkTarget):
    """Sources always go to Spark as an Arrow stream through Py4J (no Parquet file)."""

    parquet_handoff_rows: ClassVar[int] = 0


class Workload:
    """Keys and rows of one table; every flush moves it forward."""

    def __init__(self, database: str, table: str, seed: int = 7) -> None:
        self.schema = TableSchema(database, table, (
            ColumnDef("id", "bigint"), ColumnDef("qty", "int"), ColumnDef("note", "varchar(32)"),
            ColumnDef("price", "decimal(12,2)"), ColumnDef("at", "datetime(6)")), ("id",))
        self.rnd = random.Random(seed)
        self.live: list[int] = []
        self.next_key = 1

    def row(self, key: int) -> Row:
        r = self.rnd
        return (key, r.randrange(1, 10_000), " ".join(r.choices(WORDS, k=3))[:32],
                Decimal(r.randrange(100, 10_000_000)).scaleb(-2),
                datetime.datetime(2024, 1, 1) + datetime.timedelta(microseconds=r.randrange(0, 10**13)))

    def load(self, n: int) -> TableFlush:
        keys = list(range(self.next_key, self.next_key + n))
        self.next_key += n
        self.live.extend(keys)
        return TableFlush(self.schema, inserts=[self.row(k) for k in keys])

    def changes(self, n: int, hot: float = 1.0) -> TableFlush:
        """n net changes: 50% inserts, 30% updates, 20% deletes; updates and
        deletes touch the newest ``hot`` fraction of the live keys."""
        n_ins, n_upd = n // 2, n * 3 // 10
        n_del = n - n_ins - n_upd
        first = int(len(self.live) * (1 - hot))
        touched = self.rnd.sample(range(first, len(self.live)), n_upd + n_del)
        upd = [self.live[i] for i in touched[:n_upd]]
        dele = [self.live[i] for i in touched[n_upd:]]
        gone = set(dele)
        self.live = [k for k in self.live if k not in gone]
        new = list(range(self.next_key, self.next_key + n_ins))
        self.next_key += n_ins
        self.live.extend(new)
        # As build_flush makes them: an update is delete key + insert final image.
        return TableFlush(self.schema, delete_keys=[(k,) for k in upd + dele],
                          inserts=[self.row(k) for k in upd + new])


class Bench:
    def __init__(self, warehouse: Path) -> None:
        self.warehouse = warehouse
        self.seq = 0

    def target(self, cls: type[SparkTarget] = SparkTarget, **spark_kw: Any) -> SparkTarget:
        # Maintenance off unless asked for: the older measurements had none.
        spark_kw.setdefault("maintenance", False)
        spark = SparkConfig(master="local[*]", warehouse=str(self.warehouse), catalog="bench", conf=dict(CONF),
                            **spark_kw)
        t = cls(Config(target=TargetConfig(kind="spark", options=(spark,))))
        t.connect()
        return t

    def state(self) -> AppliedState:
        self.seq += 1
        return AppliedState(PRODUCER, self.seq, Position("mysql-bin.000001", 1000 + self.seq), self.seq)

    def timed(self, target: SparkTarget, tables: list[TableFlush]) -> dict[str, float]:
        # Encoding alone (the Python/Arrow side), then the whole apply.
        t0 = time.perf_counter()
        for tf in tables:
            target._plan(tf)
        encode = time.perf_counter() - t0
        t0 = time.perf_counter()
        target.apply(Flush(tables, self.state()))
        total = time.perf_counter() - t0
        return {"total_s": total, "encode_s": encode}


def run_sizes(bench: Bench, target: SparkTarget, table: str, sizes: tuple[int, ...], repeats: dict[int, int],
              base_rows: int) -> list[dict[str, Any]]:
    w = Workload("bench", table)
    t0 = time.perf_counter()
    for start in range(0, base_rows, LOAD_CHUNK):  # the source of one MERGE lives in the driver
        bench.timed(target, [w.load(min(LOAD_CHUNK, base_rows - start))])
    print(f"  {table}: loaded {base_rows} rows in {time.perf_counter() - t0:.1f}s", flush=True)
    for _ in range(5):  # warm-up: JIT and code generation of the MERGE plan
        bench.timed(target, [w.changes(100)])
    out = []
    for n in sizes:
        runs = [bench.timed(target, [w.changes(n)]) for _ in range(repeats[n])]
        totals = [r["total_s"] for r in runs]
        med = statistics.median(totals)
        res = {"buffer_rows": n, "repeats": len(runs), "median_s": round(med, 3), "min_s": round(min(totals), 3),
               "rows_per_s": round(n / med, 1), "encode_s": round(statistics.median(r["encode_s"] for r in runs), 4),
               "table_rows_after": len(w.live)}
        print(f"  {table}: {n:>6} rows  median {med:7.3f}s  {n / med:10.1f} rows/s  "
              f"(encode {res['encode_s']:.3f}s)", flush=True)
        out.append(res)
    return out


def fixed_cost(bench: Bench, target: SparkTarget, repeats: int) -> dict[str, Any]:
    w = Workload("bench", "fixed")
    bench.timed(target, [w.load(1000)])
    for _ in range(3):  # warm-up
        bench.timed(target, [w.changes(10)])
    one_row, state_only = [], []
    for _ in range(repeats):
        k = w.live[0]
        tf = TableFlush(w.schema, delete_keys=[(k,)], inserts=[w.row(k)])
        one_row.append(bench.timed(target, [tf])["total_s"])
        t0 = time.perf_counter()
        target.apply(Flush([], bench.state()))
        state_only.append(time.perf_counter() - t0)
    return {"one_row_update_flush_s": round(statistics.median(one_row), 3),
            "one_row_update_flush_min_s": round(min(one_row), 3),
            "state_only_flush_s": round(statistics.median(state_only), 4), "repeats": repeats}


def drift(bench: Bench, target: SparkTarget, flushes: int, base_rows: int) -> dict[str, Any]:
    """Consecutive 1000-row flushes without compaction: merge-on-read adds
    data and delete files each time, and each MERGE reads them all."""
    w = Workload("bench", "drift")
    bench.timed(target, [w.load(base_rows)])
    times = [bench.timed(target, [w.changes(1000)])["total_s"] for _ in range(flushes)]
    files = target.spark.sql(f"SELECT content, count(*) AS n FROM {target.qualified('bench', 'drift')}.files "
                             "GROUP BY content").collect()
    counts = {("data" if r.content == 0 else "position_deletes" if r.content == 1 else "equality_deletes"): r.n
              for r in files}
    k = max(1, flushes // 6)
    out = {"flushes": flushes, "rows_per_flush": 1000, "first_median_s": round(statistics.median(times[:k]), 3),
           "last_median_s": round(statistics.median(times[-k:]), 3), "files_after": counts,
           "all_s": [round(t, 3) for t in times]}
    print(f"  drift over {flushes} flushes: {out['first_median_s']}s -> {out['last_median_s']}s, files {counts}",
          flush=True)
    return out


#: name -> (target class, [target.spark] settings)
GROWTH_VARIANTS: dict[str, tuple[type[SparkTarget], dict[str, Any]]] = {
    "before": (BeforeTarget, {}),
    "after": (SparkTarget, {}),
    "after_without_key_range": (EqualityOnlyTarget, {}),
    "after_arrow_handoff": (ArrowHandoffTarget, {}),
    "after+maintenance": (SparkTarget, {"maintenance": True}),
    # Issue #27: Iceberg format v2 (position-delete files) against v3
    # (deletion vectors), both with the target's maintenance as shipped.
    "v2": (SparkTarget, {"maintenance": True, "format_version": 2}),
    "v3": (SparkTarget, {"maintenance": True, "format_version": 3}),
}
#: What a reader runs on a variant's table every ``--reader-every`` flushes
#: (an aggregate that reads every live row, so every delete file or vector).
READER_QUERY = "SELECT count(*), sum(price), max(at) FROM {table}"
GROWTH_WORKLOADS = {
    "insert_only": "flushes of new keys only (an auto-increment insert load, like lineitem)",
    "mixed_random": "50% inserts, 30% updates, 20% deletes of keys anywhere in the table",
    "mixed_recent": "50% inserts, 30% updates, 20% deletes of keys among the newest 10%",
}


def growth(bench: Bench, flushes: int, rows: int, base_rows: int,
           variants: dict[str, tuple[type[SparkTarget], dict[str, Any]]], workloads: list[str],
           maintenance_commits: int, checkpoint: Callable[[dict[str, Any]], None] | None = None,
           files_every: int = 5, reader_every: int = 0) -> dict[str, Any]:
    """Flush time against flush number, every variant on its own copy of each
    workload, interleaved flush by flush (the machine is shared: noise hits
    all variants alike).  ``all_s`` is each flush's apply time without the
    maintenance that ran inside it (``maintenance_s``, per flush, holds that);
    the live data/delete files are counted every ``files_every`` flushes
    (outside the timing); every ``reader_every`` flushes a reader's
    aggregate (READER_QUERY, through Spark) is timed on each table
    (``reader_s``, ``reader_at``).  ``checkpoint`` gets the partial result every few
    flushes, so a long run is never lost."""
    out: dict[str, Any] = {"flushes": flushes, "rows_per_flush": rows, "base_rows": base_rows,
                           "workloads": {w: GROWTH_WORKLOADS[w] for w in workloads},
                           "variants": {v: {"class": cls.__name__, **kw} for v, (cls, kw) in variants.items()},
                           "maintenance_commits": maintenance_commits, "results": {}}
    targets = {v: bench.target(cls, **kw, maintenance_commits=maintenance_commits)
               for v, (cls, kw) in variants.items()}
    started = time.monotonic()
    try:
        for wl in workloads:
            loads = {v: Workload("bench", f"g_{wl}_{v}") for v in variants}
            for v, w in loads.items():
                t0 = time.monotonic()
                for start in range(0, base_rows, LOAD_CHUNK):
                    bench.timed(targets[v], [w.load(min(LOAD_CHUNK, base_rows - start))])
                print(f"  {wl} {v}: loaded {base_rows} rows in {time.monotonic() - t0:.1f}s", flush=True)
                for _ in range(3):  # warm-up: code generation of this table's statements
                    bench.timed(targets[v], [w.load(100) if wl == "insert_only" else w.changes(100)])
            res: dict[str, dict[str, Any]] = {
                v: {"all_s": [], "maintenance_s": [], "files_at": [], "files_series": [], "reader_at": [],
                    "reader_s": []} for v in variants}
            out["results"][wl] = res
            for i in range(flushes):
                order = list(loads.items())
                for v, w in order[i % len(order):] + order[:i % len(order)]:  # rotated: no variant always first
                    tf = w.load(rows) if wl == "insert_only" else w.changes(rows, 0.1 if wl == "mixed_recent" else 1.0)
                    runs_before = len(targets[v].maintenance.runs)
                    total = bench.timed(targets[v], [tf])["total_s"]
                    maint = sum(r.seconds for r in targets[v].maintenance.runs[runs_before:])
                    res[v]["all_s"].append(round(total - maint, 3))
                    res[v]["maintenance_s"].append(round(maint, 3))
                    if (i + 1) % files_every == 0 or i == 0 or i == flushes - 1:
                        res[v]["files_at"].append(i + 1)
                        res[v]["files_series"].append(file_counts(targets[v], f"g_{wl}_{v}"))
                    if reader_every and ((i + 1) % reader_every == 0 or i == 0):
                        query = READER_QUERY.format(table=targets[v].qualified("bench", f"g_{wl}_{v}"))
                        t0 = time.perf_counter()
                        targets[v].spark.sql(query).collect()
                        res[v]["reader_at"].append(i + 1)
                        res[v]["reader_s"].append(round(time.perf_counter() - t0, 3))
                if (i + 1) % 10 == 0 or i == flushes - 1:
                    for v in variants:
                        summarize(res[v], targets[v], f"g_{wl}_{v}")
                    out["elapsed_s"] = round(time.monotonic() - started, 1)
                    out["flushes_done"] = i + 1
                    print(f"  {wl} flush {i + 1}/{flushes} ({out['elapsed_s']:.0f}s): " + "; ".join(
                        f"{v} last10 {statistics.median(r['all_s'][-10:]):.2f}s files {r['files_series'][-1]}"
                        for v, r in res.items()), flush=True)
                    if checkpoint:
                        checkpoint(out)
            for v in variants:
                r = res[v]
                print(f"  {wl:13} {v:22} first {r['first_median_s']:6.3f}s last {r['last_median_s']:6.3f}s median "
                      f"{r['median_s']:6.3f}s files {r['files']}", flush=True)
    finally:
        for t in targets.values():
            t.close()
    return out


def summarize(r: dict[str, Any], target: SparkTarget, table: str) -> None:
    """First/last medians (a fifth of the flushes each) and the maintenance log so far."""
    times = r["all_s"]
    k = max(1, len(times) // 5)
    r.update({"first_median_s": round(statistics.median(times[:k]), 3),
              "last_median_s": round(statistics.median(times[-k:]), 3),
              "last_over_first": round(statistics.median(times[-k:]) / statistics.median(times[:k]), 3),
              "median_s": round(statistics.median(times), 3), "mean_s": round(statistics.mean(times), 3),
              "files": r["files_series"][-1] if r["files_series"] else {},
              "max_files": max((sum(f.values()) for f in r["files_series"]), default=0),
              "maintenance_runs": [m.as_dict() for m in target.maintenance.runs if m.table.endswith(table)]})
    if r.get("reader_s"):
        q = r["reader_s"]
        r.update({"reader_median_s": round(statistics.median(q), 3),
                  "reader_last_median_s": round(statistics.median(q[-max(1, len(q) // 5):]), 3)})


def file_counts(target: SparkTarget, table: str) -> dict[str, int]:
    files = target.spark.sql(f"SELECT content, count(*) AS n FROM {target.qualified('bench', table)}.files "
                             "GROUP BY content").collect()
    return {("data" if r.content == 0 else "position_deletes" if r.content == 1 else "equality_deletes"): r.n
            for r in files}


def plot_growth(g: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = list(g["results"])
    fig, axes = plt.subplots(2, len(wls), figsize=(6 * len(wls), 7), squeeze=False)
    for col, wl in enumerate(wls):
        ax, fx = axes[0][col], axes[1][col]
        for v, r in g["results"][wl].items():
            n = len(r["all_s"])
            line = ax.plot(range(1, n + 1), r["all_s"], marker=".", markersize=3, linewidth=0.6, label=v)[0]
            if n >= 10:  # a rolling median shows the trend through the noise
                med = [statistics.median(r["all_s"][max(0, i - 9):i + 1]) for i in range(n)]
                ax.plot(range(1, n + 1), med, color=line.get_color(), linewidth=2, label=f"{v} (median of 10)")
            m = [(i + 1, s) for i, s in enumerate(r.get("maintenance_s", [])) if s > 0]
            if m:
                ax.scatter([x for x, _ in m], [s for _, s in m], marker="x", color=line.get_color(),
                           label=f"{v}: maintenance (s, not in the flush time)")
            if r.get("reader_s"):
                ax.plot(r["reader_at"], r["reader_s"], "^", color=line.get_color(), markersize=4,
                        label=f"{v}: reader's aggregate (s)")
            fs = r.get("files_series", [])
            if fs:
                for kind, style in (("data", "-"), ("position_deletes", "--")):
                    fx.plot(r["files_at"], [f.get(kind, 0) for f in fs], style, color=line.get_color(),
                            label=f"{v}: {kind} files")
        ax.set_title(f"{wl} ({g['rows_per_flush']} rows/flush, base {g['base_rows']} rows)")
        ax.set_xlabel("flush number")
        ax.set_ylabel("flush time (s)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        fx.set_xlabel("flush number")
        fx.set_ylabel("live files in the table")
        fx.set_ylim(bottom=0)
        fx.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def machine() -> dict[str, Any]:
    import pyarrow
    import pyspark

    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except (OSError, IndexError):
        java = "?"
    jar = bundled_iceberg_jar()
    return {**common.machine(), "java": java, "pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__,
            "iceberg_jar": jar.name if jar else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller base table")
    ap.add_argument("--base-rows", type=int, default=200_000, help="rows loaded before measuring")
    ap.add_argument("--out", default=str(common.RESULTS / "spark_merge.json"))
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    ap.add_argument("--no-cow", action="store_true", help="skip the copy-on-write comparison")
    ap.add_argument("--compare-rows", type=int, default=0,
                    help="also compare merge-on-read and copy-on-write on a table this large")
    ap.add_argument("--skip-main", action="store_true", help="only the --compare-rows / --growth runs")
    ap.add_argument("--growth", type=int, default=0, metavar="FLUSHES",
                    help="flush time vs flush number, before/after issue #11 (writes spark_flush_growth.json/.png)")
    ap.add_argument("--growth-rows", type=int, default=10_000, help="net changes per --growth flush")
    ap.add_argument("--growth-base", type=int, default=200_000, help="rows loaded before the --growth flushes")
    ap.add_argument("--growth-workloads", default=",".join(GROWTH_WORKLOADS), help="comma-separated")
    ap.add_argument("--growth-variants", default=",".join(GROWTH_VARIANTS), help="comma-separated")
    ap.add_argument("--maintenance-commits", type=int, default=40, help="[target.spark] maintenance_commits")
    ap.add_argument("--growth-out", default=str(common.RESULTS / "spark_flush_growth.json"))
    ap.add_argument("--reader-every", type=int, default=0, metavar="N",
                    help="time a reader's aggregate on each --growth table every N flushes")
    args = ap.parse_args()
    CONF.update(dict(kv.split("=", 1) for kv in args.conf))
    base = 20_000 if args.quick else args.base_rows
    repeats = {100: 3, 1000: 3, 10000: 3, 50000: 2} if args.quick else {100: 7, 1000: 5, 10000: 5, 50000: 3}
    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="cynomys-bench-"))
    bench = Bench(tmp / "warehouse")
    started = time.perf_counter()
    mor: list[dict[str, Any]] = []
    cow: list[dict[str, Any]] = []
    fixed: dict[str, Any] = {}
    grow: dict[str, Any] = {}
    large: dict[str, Any] = {}
    try:
        if not args.skip_main:
            target = bench.target()
            print("merge-on-read (the target's setting):", flush=True)
            mor = run_sizes(bench, target, "mor", SIZES, repeats, base)
            fixed = fixed_cost(bench, target, repeats[100])
            print(f"  fixed cost: {fixed}", flush=True)
            grow = drift(bench, target, 12 if args.quick else 30, base)
            target.close()
            if not args.no_cow:
                cow_target = bench.target(CopyOnWriteTarget)
                print("copy-on-write (for comparison):", flush=True)
                cow = run_sizes(bench, cow_target, "cow", SIZES[1:3], repeats, base)
                cow_target.close()
        if args.compare_rows:
            print(f"merge-on-read vs copy-on-write on {args.compare_rows} rows:", flush=True)
            few = {n: 3 for n in SIZES}
            for label, cls in (("merge_on_read", SparkTarget), ("copy_on_write", CopyOnWriteTarget)):
                t = bench.target(cls)
                large[label] = run_sizes(bench, t, f"large_{label}", (1000, 10000), few, args.compare_rows)
                t.close()
        if args.growth:
            print(f"flush time vs flush number ({args.growth} flushes of {args.growth_rows}):", flush=True)
            variants = {v: GROWTH_VARIANTS[v] for v in args.growth_variants.split(",")}
            path = Path(args.growth_out)

            def save(g: dict[str, Any], final: bool = False) -> None:
                g.update({"benchmark": "bench/bench_spark_merge.py " + " ".join(sys.argv[1:]),
                          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                          "machine": info, "spark_conf": CONF, "complete": final,
                          "loadavg_1m_now": os.getloadavg()[0]})
                tmp_path = path.with_suffix(".json.tmp")  # atomic: a reader never sees half a file
                tmp_path.write_text(json.dumps(g, indent=2) + "\n")
                tmp_path.replace(path)
                plot_growth(g, path.with_suffix(".png"), f"{info.get('cpu', '?')}; base {args.growth_base} rows"
                            + ("" if final else f" (partial: {g.get('flushes_done', 0)} flushes)"))

            g = growth(bench, args.growth, args.growth_rows, args.growth_base, variants,
                       args.growth_workloads.split(","), args.maintenance_commits, checkpoint=save,
                       reader_every=args.reader_every)
            save(g, final=True)
            print(f"wrote {path} and .png")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.skip_main and not args.compare_rows:
        return
    result = {
        "benchmark": "bench/bench_spark_merge.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": info,
        "settings": {
            "master": "local[*]", "spark_conf": CONF, "base_rows": base,
            "mix": {"insert": 0.5, "update": 0.3, "delete": 0.2},
            "table": "id BIGINT key, qty INT, note VARCHAR(32), price DECIMAL(12,2), at DATETIME(6)",
            "unit": "rows/s = net changes of one flush / median wall time of SparkTarget.apply (encode + MERGE "
                    "+ state write); encode_s is the Python/Arrow encoding alone",
            "repeats": repeats, "wall_time_s": round(time.perf_counter() - started, 1),
        },
        "merge_on_read": mor,
        "fixed_cost": fixed,
        "drift_without_compaction": grow,
        "copy_on_write": cow,
        "large_table": {"base_rows": args.compare_rows, **large} if large else None,
    }
    common.write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
