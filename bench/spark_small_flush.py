"""Small Spark flushes, as an applier under a steady OLTP load makes them.

    python bench/spark_small_flush.py [--flushes 25] [--rows 50000] [--jfr FILE] [--count-py4j]

Four Iceberg tables like bench/freshness.py's (two keyed, one keyless, the
one-row beat table), each holding ``--rows`` rows, then ``--flushes``
flushes of ~60 changes through ``SparkTarget.apply`` (scattered updates, a
few inserts, a keyless delete, the beat's update): the fixed per-flush cost
that bounds Spark's freshness (bench/README.md, "Freshness").  Reports the
flush seconds (the first three left out: the JVM warms up); ``--jfr``
records a Java Flight Recording of the applier's JVM (`jfr print --json
--stack-depth 200 --events jdk.ExecutionSample FILE` reads it);
``--count-py4j`` counts the Py4J name lookups and the Java exceptions
PySpark converted (issue #28: both were per-flush costs).

Compare code revisions side by side by running it from each one's work
tree, one after the other.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import random
import re
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import machine, write_result  # noqa: E402
from cynomys.applier.targets.spark.config import SparkConfig  # noqa: E402
from cynomys.applier.targets.spark.target import SparkTarget  # noqa: E402
from cynomys.core.config import ApplierConfig, Config, TargetConfig  # noqa: E402
from cynomys.core.model import Change, ColumnDef, Op, TableSchema  # noqa: E402
from tests.integration import target_contract as contract  # noqa: E402
from tests.integration.target_setups.spark import counting_py4j  # noqa: E402

DB = "app"
ACCT = TableSchema(DB, "acct", (ColumnDef("id", "int"), ColumnDef("owner", "varchar(40)"),
                                ColumnDef("balance", "decimal(14,2)"), ColumnDef("ver", "int")), ("id",))
PAIR = TableSchema(DB, "pair", (ColumnDef("a", "int"), ColumnDef("b", "varchar(10)"), ColumnDef("v", "double")),
                   ("a", "b"))
LOG = TableSchema(DB, "log", (ColumnDef("who", "int"), ColumnDef("what", "varchar(20)"), ColumnDef("n", "int")), ())
BEAT = TableSchema(DB, "beat", (ColumnDef("id", "int"), ColumnDef("n", "bigint"), ColumnDef("ts", "double")), ("id",))


class TableSeconds(logging.Handler):
    """Each table's commit seconds, from the target's ``flush seq`` line."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, list[float]] = collections.defaultdict(list)

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("flush seq"):
            for table, secs in re.findall(r"(\w+) \d+ rows ([\d.]+)s", msg):
                self.seconds[table].append(float(secs))


def flush(target: SparkTarget, rnd: random.Random, i: int, n: int, top: int, logn: int,
          seconds: list[float]) -> tuple[int, int]:
    """Flush ``i``: scattered updates, a few inserts, a keyless delete and the
    beat's update; its seconds appended to ``seconds``."""
    c = contract.change
    ch: list[Change] = []
    for k in rnd.sample(range(top), 15):
        ch.append(c(Op.UPDATE, ACCT, before=(k, f"o{k}", Decimal("1.00"), 0), after=(k, f"o{k}", Decimal("2.00"), i)))
    for k in range(top, top + 5):
        ch += [c(Op.INSERT, ACCT, after=(k, f"o{k}", Decimal("1.00"), 0)), c(Op.INSERT, PAIR, after=(k, "x", 1.0))]
    top += 5
    for k in rnd.sample(range(n), 10):
        ch.append(c(Op.UPDATE, PAIR, before=(k, str(k % 7), 1.0), after=(k, str(k % 7), float(i))))
    ch += [c(Op.INSERT, LOG, after=(j, "x", logn + j)) for j in range(10)]
    logn += 10
    ch.append(c(Op.DELETE, LOG, before=(i % 100, "w", i)))
    ch.append(c(Op.UPDATE, BEAT, before=(1, i, 0.0), after=(1, i + 1, float(i))))
    t0 = time.perf_counter()
    target.apply(contract.flush(ch))
    seconds.append(time.perf_counter() - t0)
    print(f"flush {i}: {seconds[-1]:.3f} s", flush=True)
    return top, logn


def run(args: argparse.Namespace, warehouse: Path) -> dict[str, Any]:
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "3g",
            **dict(kv.split("=", 1) for kv in args.conf)}
    if args.jfr:
        conf["spark.driver.extraJavaOptions"] = \
            f"-XX:StartFlightRecording=filename={args.jfr},settings=profile,dumponexit=true"
    spark = SparkConfig(master="local[2]", warehouse=str(warehouse), catalog="cy", conf=conf)
    target = SparkTarget(Config(target=TargetConfig(kind="spark", options=(spark,)), applier=ApplierConfig()))
    c = contract.change
    n = args.rows
    target.apply(contract.flush([c(Op.INSERT, ACCT, after=(k, f"o{k}", Decimal("1.00"), 0)) for k in range(n)]
                                + [c(Op.INSERT, PAIR, after=(k, str(k % 7), 1.0)) for k in range(n)]
                                + [c(Op.INSERT, LOG, after=(k % 100, "w", k)) for k in range(n // 2)]
                                + [c(Op.INSERT, BEAT, after=(1, 0, 0.0))]))
    per_table = TableSeconds()
    tlog = logging.getLogger("cynomys.applier.targets.spark.target")
    tlog.addHandler(per_table)
    tlog.setLevel(logging.INFO)
    rnd = random.Random(1)
    top, logn, seconds = n, n // 2, []
    counting = counting_py4j() if args.count_py4j else contextlib.nullcontext(None)
    with counting as counts:
        for i in range(args.flushes):
            top, logn = flush(target, rnd, i, n, top, logn, seconds)
    target.close()
    warm = seconds[3:]
    out: dict[str, Any] = {"flushes": len(seconds), "rows_per_table": n, "seconds": [round(s, 3) for s in seconds],
                           "median_s": round(statistics.median(warm), 3), "mean_s": round(statistics.mean(warm), 3),
                           "min_s": round(min(warm), 3), "max_s": round(max(warm), 3),
                           "table_commit_median_s": {t: round(statistics.median(v[3:]), 3)
                                                     for t, v in per_table.seconds.items() if len(v) > 3}}
    if counts is not None:
        lookups, exceptions = counts
        out["py4j_lookups_per_flush"] = round(len(lookups) / len(seconds), 1)
        out["java_exceptions_per_flush"] = round(len(exceptions) / len(seconds), 1)
        out["java_exceptions"] = dict(collections.Counter(exceptions).most_common(5))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--flushes", type=int, default=25)
    ap.add_argument("--rows", type=int, default=50_000, help="rows of each keyed table (the keyless one: half)")
    ap.add_argument("--jfr", help="record a Java Flight Recording of the JVM into this file")
    ap.add_argument("--count-py4j", action="store_true")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    ap.add_argument("--label", default="", help="what this run measures (a revision)")
    ap.add_argument("--out", default="spark_small_flush")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cynomys-small-flush-") as tmp:
        res = run(args, Path(tmp) / "warehouse")
    res.update(label=args.label, machine=machine(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print({k: v for k, v in res.items() if k not in ("seconds", "machine")})
    path = ROOT / "bench" / "results" / f"{args.out}.json"
    runs = []
    if path.exists():
        import json
        runs = json.loads(path.read_text()).get("runs", [])
    print("wrote", write_result(args.out, {"benchmark": "spark_small_flush", "runs": runs + [res]}))


if __name__ == "__main__":
    main()
