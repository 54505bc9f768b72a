"""The applier's decode-to-bulk-bytes step, old path beside new, one core.

    python bench/applier_decode.py [--rows 200000] [--rounds 3] [--cpu N]

TPC-H lineitem rows (bench/tpch.py) become producer envelopes the way the
producer makes them (Changes of 1000-row source transactions, folded and
encoded by codec.encode in 10000-change batches, as bench/decode.py does),
then the applier's work up to the LOAD DATA file bytes is timed, without a
target (its own load time is not counted):

- reference: codec.decode (fastavro -> Change rows) -> DelayBuffer fold ->
  build_flush -> types.encode_field value by value (the pure-Python path);
- columnar: codec.decode_columnar (C reader, Arrow layout) -> InsertRuns
  through the same DelayBuffer -> build_flush -> pyarrow LOAD DATA text.

Both produce the same bytes (checked).  Rounds interleave the two; the best
round is reported as rows per second and per CPU second.  Writes
bench/results/applier_decode.json and applier_decode.png.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, machine, write_result  # noqa: E402
from bench.tpch import lineitem  # noqa: E402
from cynomys.applier.batcher import DelayBuffer  # noqa: E402
from cynomys.applier.targets.base import build_flush  # noqa: E402
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget  # noqa: E402
from cynomys.core import compiled  # noqa: E402
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, Op, Position, TableSchema  # noqa: E402
from cynomys.reducer.fold import Folder  # noqa: E402
from cynomys.schemas import codec  # noqa: E402

#: lineitem as the producer describes it (bench/tpch.py LINEITEM_DDL).
COLUMNS = [("l_orderkey", "bigint"), ("l_partkey", "bigint"), ("l_suppkey", "bigint"), ("l_linenumber", "int"),
           ("l_quantity", "decimal(15,2)"), ("l_extendedprice", "decimal(15,2)"), ("l_discount", "decimal(15,2)"),
           ("l_tax", "decimal(15,2)"), ("l_returnflag", "char(1)"), ("l_linestatus", "char(1)"),
           ("l_shipdate", "date"), ("l_commitdate", "date"), ("l_receiptdate", "date"),
           ("l_shipinstruct", "char(25)"), ("l_shipmode", "char(10)"), ("l_comment", "varchar(44)")]
SCHEMA = TableSchema("tpch", "lineitem", tuple(ColumnDef(n, t, False) for n, t in COLUMNS),
                     ("l_orderkey", "l_linenumber"))


def envelopes(rows: list[tuple[Any, ...]], txn_rows: int = 1000, batch_rows: int = 10000) -> list[bytes]:
    """Producer payloads: 1000-row source transactions, 10000-change batches."""
    compiled.use_compiled(True)
    out, folder, pos = [], Folder(), 4
    for t in range(0, len(rows), txn_rows):
        txn = Position("mysql-bin.000001", pos)
        for r in rows[t:t + txn_rows]:
            folder.add(Change(Op.INSERT, "tpch", "lineitem", f"0-1-{t}", txn, 1700000000, SCHEMA, None, r))
        pos += 100_000
        if len(folder) >= batch_rows:
            out.append(codec.encode(Batch("bench", tuple(folder.changes()), Position("mysql-bin.000001", pos))))
            folder = Folder()
    if len(folder):
        out.append(codec.encode(Batch("bench", tuple(folder.changes()), Position("mysql-bin.000001", pos))))
    return out


def apply_path(payloads: list[bytes], columnar: bool, buffer_rows: int = 50000) -> list[bytes]:
    """The applier's steps from payload to LOAD DATA bytes, per flush."""
    compiled.use_compiled(columnar)
    buf, files = DelayBuffer(buffer_rows, 1e9), []

    def flush() -> None:
        f = build_flush(buf.take(), AppliedState("bench", 1, Position("mysql-bin.000001", 4)), columnar)
        files.extend(ColumnStoreTarget.load_data_bytes(tf.schema, tf.inserts, tf.runs) for tf in f.tables)

    for payload in payloads:
        buf.add(codec.decode_columnar(payload).changes)
        if len(buf) >= buffer_rows:
            flush()
    flush()
    return files


def plot(best: dict[str, float], out: Path, note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 2.6))
    names = list(best)
    bars = ax.barh(names, [best[n] for n in names], color=["#d9a441", "#37a"][:len(names)])
    ax.axvline(150_000, color="#c33", ls="--", lw=1, label="goal 150k rows/s")
    for b, n in zip(bars, names):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {best[n]:,.0f}", va="center")
    ax.set_xlabel("lineitem rows/s, one core (Avro payload -> LOAD DATA bytes)")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.text(0.01, 0.01, note, fontsize=7, color="#555")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the one core to run on")
    args = ap.parse_args()
    if not compiled.available():
        raise SystemExit("cynomys._speedups is not built: pip install -e . (needs gcc and the Python headers)")
    m = machine()
    print(f"generating {args.rows} lineitem rows ...", flush=True)
    payloads = envelopes(lineitem(args.rows))
    os.sched_setaffinity(0, {args.cpu})
    import logging
    logging.getLogger("cynomys.core.compiled").setLevel(logging.ERROR)  # the path switches on purpose here
    paths = {"reference (fastavro, rows, encode_field)": False, "columnar (C reader, InsertRun, pyarrow)": True}
    best: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    outputs: dict[str, list[bytes]] = {}
    for r in range(args.rounds):
        for name, columnar in paths.items():
            t0, c0 = time.perf_counter(), time.process_time()
            outputs[name] = apply_path(payloads, columnar)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            best[name] = max(best.get(name, 0.0), args.rows / dt)
            best_cpu[name] = max(best_cpu.get(name, 0.0), args.rows / dc)
            print(f"round {r + 1}: {name:<44} {args.rows / dt:>10,.0f} rows/s {args.rows / dc:>10,.0f} rows/cpu-s",
                  flush=True)
    same = len({b"".join(v) for v in outputs.values()}) == 1
    assert same, "the two paths wrote different LOAD DATA bytes"
    compiled.use_compiled(True)
    out = write_result("applier_decode", {
        "rows": args.rows, "rounds": args.rounds, "pinned_cpu": args.cpu, "envelopes": len(payloads),
        "bytes_equal": same, "compiled_fallbacks": dict(compiled.fallbacks),
        "loadavg_1m_at_end": os.getloadavg()[0],
        "rows_per_s_best": {k: round(v) for k, v in best.items()},
        "rows_per_cpu_s_best": {k: round(v) for k, v in best_cpu.items()}})
    plot(best, RESULTS / "applier_decode.png",
         f"{m['cpu']}, {m['cpus_online']} cores, pinned to one, load {m['loadavg_1m_at_start']:.1f} at start; "
         f"{args.rows} rows; best of {args.rounds}")
    for name in paths:
        print(f"  {name:<44} {best[name]:>10,.0f} rows/s  {best_cpu[name]:>10,.0f} rows/cpu-s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
