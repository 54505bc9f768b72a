"""The paper's Figure 11: rows/s into the target against the delay-commit buffer.

    python bench/delay_commit.py [--targets columnstore,spark] [--rows 20000] [--quick]

For tables of 5, 20 and 50 columns and buffer_rows in {1, 10, 100, 1000,
3000, 10000}, the applier's own flush path (DelayBuffer -> build_flush ->
Target.apply, one target transaction with the checkpoint per flush) loads a
stream of row changes (80% inserts, 15% updates, 5% deletes of earlier rows)
and the rate is rows of source changes per second.  Small buffers are
measured over fewer rows (a time budget per point) so the run stays short.

Targets: ``columnstore`` = the ColumnStore target code on a throwaway MariaDB
with ENGINE=InnoDB (the ColumnStore engine is not installable here); ``spark``
= local Spark with Iceberg tables.  Writes bench/results/delay_commit.json
and delay_commit.png.
"""
from __future__ import annotations

import argparse
import datetime
import decimal
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, write_result  # noqa: E402
from cynomys.applier.batcher import DelayBuffer  # noqa: E402
from cynomys.applier.targets.base import Target, build_flush, open_target  # noqa: E402
from cynomys.core.config import load_config  # noqa: E402
from cynomys.core.model import AppliedState, Change, ColumnDef, Op, Position, TableSchema  # noqa: E402

BUFFERS = [1, 10, 100, 1000, 3000, 10000]
WIDTHS = [5, 20, 50]
_TYPES = ["int", "decimal(15,2)", "varchar(40)", "datetime(6)", "double"]


def schema(width: int, n: int) -> TableSchema:
    cols = [ColumnDef("id", "bigint", False)] + [ColumnDef(f"c{i}", _TYPES[i % len(_TYPES)]) for i in range(1, width)]
    return TableSchema("bench", f"t{width}_{n}", tuple(cols), ("id",))


def value(t: str, rnd: random.Random) -> Any:
    return {
        "int": lambda: rnd.randrange(10**6),
        "decimal(15,2)": lambda: decimal.Decimal(rnd.randrange(10**7)) / 100,
        "varchar(40)": lambda: "v" * rnd.randrange(1, 40),
        "datetime(6)": lambda: datetime.datetime(2024, 1, 1) + datetime.timedelta(microseconds=rnd.randrange(10**12)),
        "double": lambda: rnd.random(),
    }[t]()


def changes(s: TableSchema, rows: int, seed: int = 1) -> list[Change]:
    rnd = random.Random(seed)
    live: list[tuple[Any, ...]] = []
    out: list[Change] = []
    pos = 4
    for i in range(rows):
        r = rnd.random()
        pos += 100
        txn = Position("mysql-bin.000001", pos)
        if r < 0.8 or len(live) < 10:
            row = (i,) + tuple(value(c.type, rnd) for c in s.columns[1:])
            live.append(row)
            out.append(Change(Op.INSERT, s.database, s.table, str(i), txn, 0, s, None, row))
        elif r < 0.95:
            j = rnd.randrange(len(live))
            new = (live[j][0],) + tuple(value(c.type, rnd) for c in s.columns[1:])
            out.append(Change(Op.UPDATE, s.database, s.table, str(i), txn, 0, s, live[j], new))
            live[j] = new
        else:
            j = rnd.randrange(len(live))
            out.append(Change(Op.DELETE, s.database, s.table, str(i), txn, 0, s, live.pop(j), None))
    return out


def run_point(target: Target, s: TableSchema, stream: list[Change], buffer_rows: int) -> dict[str, Any]:
    """Feed ``stream`` through a DelayBuffer of ``buffer_rows``; flush as the applier does."""
    buf = DelayBuffer(buffer_rows, max_delay_s=3600)
    seq = 0
    flushes = 0
    t0 = time.perf_counter()
    for i in range(0, len(stream), buffer_rows):
        part = stream[i:i + buffer_rows]
        buf.add(part)
        buf.mark(part[-1].txn, True, 0)
        seq += 1
        target.apply(build_flush(buf.take(), AppliedState("bench", seq, part[-1].txn)))
        flushes += 1
    dt = time.perf_counter() - t0
    return {"rows": len(stream), "flushes": flushes, "seconds": round(dt, 3), "rows_per_s": round(len(stream) / dt, 1)}


def rows_for(buffer_rows: int, total: int, quick: bool) -> int:
    # One commit per row costs ~ms on a target: measure small buffers on fewer rows.
    small = {1: 300, 10: 2000, 100: 5000}
    n = min(total, small.get(buffer_rows, total))
    return max(buffer_rows, n // (4 if quick else 1))


def _columnstore(work: Path) -> tuple[Target, Callable[[], None]]:
    from cynomys.sandbox.mariadb import MariaDBServer

    srv = MariaDBServer(server_id=9, base=str(work / "mariadb")).start()
    (work / "c.toml").write_text(f'[target]\nkind = "columnstore"\nurl = "{srv.url}"\nengine = "InnoDB"\n')
    t = open_target(load_config(work / "c.toml", env={}))
    t.connect()

    def cleanup() -> None:
        t.close()
        srv.destroy()
    return t, cleanup


def _spark(work: Path) -> tuple[Target, Callable[[], None]]:
    (work / "c.toml").write_text(f'[target]\nkind = "spark"\n[target.spark]\nmaster = "local[2]"\n'
                                 f'warehouse = "{work / "warehouse"}"\nconf = {{ "spark.ui.enabled" = "false", '
                                 f'"spark.sql.shuffle.partitions" = "2" }}\n')
    t = open_target(load_config(work / "c.toml", env={}))
    t.connect()
    return t, t.close


def _duckdb(work: Path) -> tuple[Target, Callable[[], None]]:
    (work / "c.toml").write_text(f'[target]\nkind = "duckdb"\nurl = "{work / "replica.duckdb"}"\n')
    t = open_target(load_config(work / "c.toml", env={}))
    t.connect()
    return t, t.close


#: Target kind -> a connected target and its cleanup (a table, not an if-chain).
TARGETS: dict[str, Callable[[Path], tuple[Target, Callable[[], None]]]] = {
    "columnstore": _columnstore, "spark": _spark, "duckdb": _duckdb,
}


def make_target(kind: str, work: Path) -> tuple[Target, Callable[[], None]]:
    make = TARGETS.get(kind)
    if make is None:
        raise SystemExit(f"unknown target {kind!r}; one of {', '.join(TARGETS)}")
    return make(work)


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(results)
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for width, points in results[kind].items():
            xs = [p["buffer_rows"] for p in points]
            ax.plot(xs, [p["rows_per_s"] for p in points], marker="o", label=f"{width} columns")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("applier buffer_rows (delay commit)")
        ax.set_ylabel("rows/s into the target")
        ax.set_title(f"{kind}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Delay commit: load rate against buffer size (cf. Cynomys paper, Fig. 11)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="columnstore")
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from tqdm import tqdm

    results: dict[str, Any] = {}
    points = [(w, b) for w in WIDTHS for b in BUFFERS]
    for kind in args.targets.split(","):
        with tempfile.TemporaryDirectory() as d:
            target, stop = make_target(kind, Path(d))
            try:
                results[kind] = {}
                for n, (width, b) in enumerate(tqdm(points, desc=f"delay-commit {kind}", unit="point")):
                    s = schema(width, n)
                    stream = changes(s, rows_for(b, args.rows, args.quick))
                    r = run_point(target, s, stream, b)
                    results[kind].setdefault(str(width), []).append({"buffer_rows": b, **r})
            finally:
                stop()
    speedup = {k: {w: round(pts[-1]["rows_per_s"] / pts[0]["rows_per_s"], 1) for w, pts in v.items()}
               for k, v in results.items()}
    out = write_result("delay_commit", {"settings": {"buffers": BUFFERS, "widths": WIDTHS, "rows": args.rows,
                                                     "mix": "80% insert, 15% update, 5% delete"},
                                        "results": results, "speedup_10000_over_1": speedup})
    plot(results, RESULTS / "delay_commit.png")
    for kind, v in results.items():
        print(f"{kind}: rows/s by buffer_rows {BUFFERS}")
        for w, pts in v.items():
            print(f"  {w:>2} columns: " + "  ".join(f"{p['rows_per_s']:>9.0f}" for p in pts)
                  + f"   speed-up x{speedup[kind][w]}")
    print(f"wrote {out} and {RESULTS / 'delay_commit.png'}")


if __name__ == "__main__":
    main()
