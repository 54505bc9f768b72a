"""Large single source transactions: the daemons' peak RSS and time to target equal.

    python bench/bigtxn.py [--sizes 1000000,2000000,5000000,10000000] [--targets columnstore,spark]
                           [--ops update,delete] [--max-memory-mb 500]
    python bench/bigtxn.py --expansion     # the buffer's memory per payload byte (applier/spill.py)

For each target (``columnstore``: the ColumnStore target code on a second
MariaDB with ENGINE=InnoDB; ``spark``: local Spark, Iceberg) and each size
N: N lineitem rows are loaded into the source with LOAD DATA in chunks of
250,000 rows (one transaction each) and replicated; then ONE transaction
``UPDATE lineitem SET l_quantity = l_quantity + 1`` of all N rows, then ONE
``DELETE FROM lineitem`` (the table is empty again for the next size).  The
daemons run as a user runs them (``cynomys produce`` / ``cynomys apply``,
default settings but ``[applier] max_memory_mb``); their RSS is sampled
from /proc every 0.2 s during each statement's phase (the applier's JVM,
a child process on Spark, apart).  Reported per phase: the source's
statement time, the time from its commit to the target equal (the
applier's committed position at the source's binlog end), peak RSS of the
producer, the applier (and its JVM), how many parts the applier applied
ahead of the commit, and a check that the target holds what the source
holds (row count, SUM(l_quantity), and on MariaDB a CRC32 over every row).
The load average is recorded at the start of every phase: the machine is
shared.  Writes bench/results/bigtxn.json and bigtxn.png.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, daemon, redis_config, write_result  # noqa: E402
from bench.lineitem import applied_position, target_section  # noqa: E402
from bench.tpch import LINEITEM_DDL, _extension, dbgen_scale  # noqa: E402
from cynomys.sandbox.mariadb import MariaDBServer  # noqa: E402
from cynomys.sandbox.redis import RedisProcess  # noqa: E402

CHUNK = 250_000
#: Targets whose replica this bench can read while the applier runs.
CHECKABLE = frozenset({"columnstore", "spark"})
#: The applier's peak RSS for a 2,000,000-row UPDATE buffered whole, before
#: transactions were applied in parts (issue #24, measured the same way).
BEFORE_2M_UPDATE = {"columnstore": 3367, "spark": 3570}
COLUMNS = ("l_orderkey, l_partkey, l_suppkey, l_linenumber, l_quantity, l_extendedprice, l_discount, l_tax, "
           "l_returnflag, l_linestatus, l_shipdate, l_commitdate, l_receiptdate, l_shipinstruct, l_shipmode, "
           "l_comment")
#: One number per row set, the same on the source and on a MariaDB target.
CHECK_SQL = ("SELECT COUNT(*), COALESCE(SUM(l_quantity), 0), COALESCE(SUM(CRC32(CONCAT_WS('|', " + COLUMNS
             + "))), 0) FROM tpch.lineitem")
SPARK_CHECK_SQL = "SELECT COUNT(*), COALESCE(SUM(l_quantity), 0) FROM {table}"


# --------------------------------------------------------------------------
# Data: lineitem rows as tab-separated chunk files, from duckdb's dbgen
# --------------------------------------------------------------------------
def chunk_files(rows: int, folder: Path) -> list[Path]:
    import duckdb

    folder.mkdir(parents=True, exist_ok=True)
    sf = dbgen_scale(rows)
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{_extension()}'")
    print(f"dbgen sf={sf} for {rows:,} rows ...", flush=True)
    con.execute(f"CALL dbgen(sf={sf})")
    con.execute(f"CREATE TABLE li AS SELECT * FROM lineitem ORDER BY l_orderkey, l_linenumber LIMIT {int(rows)}")
    con.execute("DROP TABLE lineitem")
    made = con.execute("SELECT count(*) FROM li").fetchone()
    if made is None or made[0] < rows:  # a size measured must be the size asked for
        raise SystemExit(f"dbgen sf={sf} made {made} lineitem rows, fewer than the {rows:,} asked for")
    files = []
    for i, start in enumerate(range(0, rows, CHUNK)):
        path = folder / f"lineitem-{i:03d}.tsv"
        con.execute(f"COPY (SELECT * FROM li LIMIT {CHUNK} OFFSET {start}) TO '{path}' "
                    "(DELIMITER '\t', HEADER false)")
        files.append(path)
    con.close()
    return files


# --------------------------------------------------------------------------
# RSS from /proc
# --------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = {int(k) for k in (task / "children").read_text().split()} - out
                out |= kids
                todo += kids
        except OSError:
            continue
    return out


class Sampler(threading.Thread):
    """Peak RSS of the daemons (and the applier's children: Spark's JVM)."""

    def __init__(self, producer: int, applier: int) -> None:
        super().__init__(daemon=True)
        self.pids = {"producer": producer, "applier": applier}
        self.peaks: dict[str, float] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.reset()

    def reset(self) -> dict[str, float]:
        with self.lock:
            peaks, self.peaks = self.peaks, {"producer": 0.0, "applier": 0.0, "applier_children": 0.0}
        return {k: round(v, 1) for k, v in peaks.items()}

    def run(self) -> None:
        while not self.done.wait(0.2):
            now = {"producer": rss_mb(self.pids["producer"]), "applier": rss_mb(self.pids["applier"]),
                   "applier_children": sum(rss_mb(c) for c in descendants(self.pids["applier"]))}
            with self.lock:
                for k, v in now.items():
                    self.peaks[k] = max(self.peaks[k], v)


# --------------------------------------------------------------------------
# One target
# --------------------------------------------------------------------------
def config(work: Path, src: MariaDBServer, redis_url: str, target: str, keys: dict[str, Path],
           max_memory_mb: int, applier: str = "") -> Path:
    return redis_config(work, src, redis_url, keys, include="tpch.*", start=src.binlog_end(),
                        applier=f"max_memory_mb = {max_memory_mb}\n{applier}", tail=target)


def applied_gtid(work: Path) -> str | None:
    try:
        return str(json.loads((work / "applier" / "applier.json").read_text())["position"]["gtid"])
    except (OSError, ValueError, KeyError):
        return None


def applier_parts(log: Path) -> int:
    return len(re.findall(r"applied part \d+ of a source transaction", log.read_text(errors="replace")))


class Run:
    def __init__(self, kind: str, work: Path, max_memory_mb: int, monetdb_url: str, applier: str = "") -> None:
        from cynomys.transport.keys import generate_keys

        self.kind, self.work = kind, work
        self.src = MariaDBServer(server_id=1, base=str(work / "source"),
                                 extra_args=("--innodb-buffer-pool-size=2G",)).start()
        self.redis = RedisProcess(str(work / "redis")).start()
        section, self.tgt = target_section(kind, work, monetdb_url)
        self.src.execute("CREATE DATABASE tpch")
        self.src.execute(LINEITEM_DDL, database="tpch")
        self.cfg = config(work, self.src, self.redis.url, section, generate_keys(work / "keys"), max_memory_mb,
                          applier)
        self.procs = [daemon(self.cfg, "produce", work / "producer.log"),
                      daemon(self.cfg, "apply", work / "applier.log")]
        self.sampler = Sampler(self.procs[0].pid, self.procs[1].pid)
        self.sampler.start()
        self.spark_reader: Any = None

    def wait_applied(self, timeout: float = 7200) -> float:
        """Seconds until the applier has committed the source's last
        transaction: its GTID, not the binlog end, which a rotation after
        a large transaction moves to a new file no transaction reaches."""
        gtid = str(self.src.execute("SELECT @@gtid_binlog_pos")[0][0])
        t0 = time.monotonic()
        last = 0.0
        while time.monotonic() - t0 < timeout:
            for name, p in zip(("producer", "applier"), self.procs):
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: see {self.work / (name + '.log')}")
            at = applied_gtid(self.work)
            if at == gtid:
                return time.monotonic() - t0
            if time.monotonic() - last > 30:
                print(f"  [{self.kind}] target at {applied_position(self.work)} ({at}), source at {gtid}", flush=True)
                last = time.monotonic()
            time.sleep(0.05)
        raise TimeoutError("the target did not catch up")

    def load(self, files: list[Path]) -> float:
        t0 = time.monotonic()
        conn = self.src.connect("tpch", local_infile=True)
        try:
            with conn.cursor() as cur:
                for f in files:
                    cur.execute(f"LOAD DATA LOCAL INFILE '{f}' INTO TABLE lineitem FIELDS TERMINATED BY '\\t'")
        finally:
            conn.close()
        return time.monotonic() - t0

    def check(self) -> dict[str, Any]:
        src = [float(v) for v in self.src.execute(CHECK_SQL)[0]]
        if self.tgt is not None:  # a MariaDB target: the same SQL
            tgt = [float(v) for v in self.tgt.execute(CHECK_SQL)[0]]
        else:
            tgt = self._spark_check()
            src = src[:2]
        return {"source": src, "target": tgt, "equal": src == tgt}

    def _spark_check(self) -> list[float]:
        from cynomys.applier.targets.base import open_target
        from cynomys.core.config import load_config

        if self.spark_reader is None:
            self.spark_reader = open_target(load_config(self.cfg, env={}))
            self.spark_reader.connect()
        t = self.spark_reader
        name = t.qualified("tpch", "lineitem")
        t.spark.sql(f"REFRESH TABLE {name}")
        row = t.spark.sql(SPARK_CHECK_SQL.format(table=name)).collect()[0]
        return [float(row[0]), float(row[1])]

    def phase(self, what: str, rows: int, sql: str) -> dict[str, Any]:
        load = os.getloadavg()[0]
        parts_before = applier_parts(self.work / "applier.log")
        self.sampler.reset()
        t0 = time.monotonic()
        self.src.execute(sql, database="tpch")
        source_s = time.monotonic() - t0
        print(f"  [{self.kind}] {what} of {rows:,} rows: source {source_s:.1f}s; waiting for the target", flush=True)
        lag = self.wait_applied()
        peaks = self.sampler.reset()
        check = self.check()
        result = {"target": self.kind, "op": what, "rows": rows, "loadavg_1m_at_start": round(load, 2),
                  "source_s": round(source_s, 1), "commit_to_equal_s": round(lag, 1),
                  "peak_rss_mb": peaks, "parts": applier_parts(self.work / "applier.log") - parts_before,
                  "check": check}
        print(f"  [{self.kind}] {json.dumps(result)}", flush=True)
        return result

    def close(self) -> None:
        self.sampler.done.set()
        if self.spark_reader is not None:
            self.spark_reader.close()
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
        self.redis.stop()
        self.src.destroy()
        if self.tgt is not None:
            self.tgt.destroy()


def run_target(kind: str, sizes: list[int], ops: list[str], files: list[Path], max_memory_mb: int,
               monetdb_url: str, keep: bool, save: Any = None, applier: str = "") -> list[dict[str, Any]]:
    """``save(results)`` after every phase: a long run interrupted keeps what it measured."""
    work = Path(tempfile.mkdtemp(prefix=f"cynomys-bigtxn-{kind}-"))
    run = Run(kind, work, max_memory_mb, monetdb_url, applier)
    results: list[dict[str, Any]] = []
    ok = False
    try:
        time.sleep(8 if kind == "spark" else 2)
        for n in sizes:
            load_s = run.load(files[:(n + CHUNK - 1) // CHUNK])
            print(f"[{kind}] loaded {n:,} rows into the source in {load_s:.1f}s; replicating ...", flush=True)
            run.wait_applied()
            run.sampler.reset()
            statements = {"update": "UPDATE lineitem SET l_quantity = l_quantity + 1", "delete": "DELETE FROM lineitem"}
            for op in ops:
                results.append(run.phase(op, n, statements[op]))
                if save is not None:
                    save(results)
        ok = all(r["check"]["equal"] for r in results)
        return results
    finally:
        run.close()
        if keep or not ok:
            print(f"[{kind}] work folder kept: {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------
# The buffer's memory per payload byte (applier/spill.py EXPANSION)
# --------------------------------------------------------------------------
def expansion(rows: int = 5000) -> dict[str, Any]:
    """Decode and fold one envelope of lineitem UPDATEs / DELETEs and
    measure the Python objects it leaves in the buffer (tracemalloc)."""
    import datetime
    import decimal
    import gc
    import random
    import tracemalloc

    from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema
    from cynomys.reducer.fold import Folder
    from cynomys.schemas import codec

    types = ["bigint(20)"] * 3 + ["int(11)"] + ["decimal(15,2)"] * 4 + ["char(1)"] * 2 + ["date"] * 3 \
        + ["char(25)", "char(10)", "varchar(44)"]
    schema = TableSchema("tpch", "lineitem", tuple(ColumnDef(n.strip(), t) for n, t in zip(COLUMNS.split(","), types)),
                         ("l_orderkey", "l_linenumber"))
    rng = random.Random(1)

    def row(k: int) -> tuple[Any, ...]:
        d = decimal.Decimal
        return (k // 7 + 1, rng.randint(1, 200000), rng.randint(1, 10000), k % 7 + 1, d("17.00"),
                d(f"{rng.randint(900, 100000)}.{rng.randint(0, 99):02d}"), d("0.04"), d("0.02"), "N", "O",
                datetime.date(1996, 3, 13), datetime.date(1996, 2, 12), datetime.date(1996, 3, 22),
                "DELIVER IN PERSON", "TRUCK", "egular courts above the" + "x" * rng.randint(0, 15))
    out: dict[str, Any] = {"rows_per_envelope": rows}
    for op in (Op.UPDATE, Op.DELETE):
        changes = []
        for k in range(rows):
            before = row(k)
            after = before[:4] + (decimal.Decimal("18.00"),) + before[5:] if op is Op.UPDATE else None
            changes.append(Change(op, "tpch", "lineitem", "0-1-5", Position("b.000001", 4), 1, schema, before, after))
        payload = codec.encode(Batch("p", tuple(changes), Position("b.000001", 99), False))
        del changes
        gc.collect()
        tracemalloc.start()
        batch = codec.decode_columnar(payload)
        folder = Folder()
        folder.extend(batch.changes)
        del batch
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[op.value.lower()] = {"payload_bytes": len(payload), "held_bytes": held,
                                 "held_per_payload_byte": round(held / len(payload), 1),
                                 "peak_per_payload_byte": round(peak / len(payload), 1)}
        del folder
    return out


# --------------------------------------------------------------------------
def plot(results: list[dict[str, Any]], max_memory_mb: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for r_op, ax in zip(("update", "delete"), axes):
        for kind, marker in (("columnstore", "o"), ("spark", "s")):
            rs = sorted((r for r in results if r["target"] == kind and r["op"] == r_op), key=lambda r: r["rows"])
            if not rs:
                continue
            xs = [r["rows"] / 1e6 for r in rs]
            ax.plot(xs, [r["peak_rss_mb"]["applier"] for r in rs], marker=marker, label=f"applier ({kind})")
            ax.plot(xs, [r["peak_rss_mb"]["producer"] for r in rs], marker=marker, linestyle="--",
                    label=f"producer ({kind})")
        if r_op == "update":  # before: the whole transaction buffered (issue #24's run, 2M rows)
            for kind, mb in BEFORE_2M_UPDATE.items():
                ax.scatter([2.0], [mb], marker="x", s=60, label=f"applier before, buffered whole ({kind})")
        ax.axhline(max_memory_mb, color="#c33", linewidth=1, label=f"[applier] max_memory_mb = {max_memory_mb}")
        ax.set_xlabel("rows in the one source transaction (millions)")
        ax.set_ylabel("peak RSS (MB)")
        ax.set_title(f"single-transaction {r_op.upper()} of lineitem rows\n(Spark's JVM apart: its heap, "
                     "spark.driver.memory)", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,2000000,5000000,10000000")
    ap.add_argument("--targets", default="columnstore,spark")
    ap.add_argument("--ops", default="update,delete")
    ap.add_argument("--max-memory-mb", type=int, default=500)
    ap.add_argument("--applier", action="append", default=[], metavar="KEY=VALUE",
                    help="an [applier] setting, TOML (e.g. 'overlap_commits = false'); repeatable")
    ap.add_argument("--monetdb-url", default=os.environ.get("CYNOMYS_TEST_MONETDB", ""))
    ap.add_argument("--append", action="store_true", help="add to bench/results/bigtxn.json instead of replacing it")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--expansion", action="store_true", help="print the buffer's bytes per payload byte and exit")
    ap.add_argument("--name", default="bigtxn", help="result file name under bench/results (default bigtxn)")
    ap.add_argument("--earlier", default="", help="with --merge: a JSON file of earlier results to keep beside "
                                                  "them (as earlier_runs, not plotted)")
    ap.add_argument("--merge", default="", help="comma-separated result names to merge into --name and plot, "
                                                "without running anything (runs of two targets side by side)")
    args = ap.parse_args()
    unchecked = sorted(set(args.targets.split(",")) - CHECKABLE)
    if unchecked:
        ap.error(f"--targets {','.join(unchecked)}: not measured here; the check reads the replica while the applier "
                 f"runs (DuckDB admits one process to its file; MonetDB has no check written): one of "
                 f"{', '.join(sorted(CHECKABLE))}")
    if args.expansion:
        print(json.dumps(expansion(), indent=2))
        return
    if args.merge:
        runs = [json.loads((RESULTS / f"{n}.json").read_text()) for n in args.merge.split(",")]
        merged = [r for run in runs for r in run["results"]]
        extra = json.loads(Path(args.earlier).read_text()) if args.earlier else None
        out = write_result(args.name, {"max_memory_mb": args.max_memory_mb, "expansion": expansion(),
                                       "runs": [{k: v for k, v in run.items() if k != "results"} for run in runs],
                                       "results": merged, **({"earlier_runs": extra} if extra else {})})
        plot(merged, args.max_memory_mb, RESULTS / f"{args.name}.png")
        print(f"wrote {out} and {RESULTS / (args.name + '.png')}")
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    if ops[-1] != "delete":
        raise SystemExit("--ops must end with delete: it empties the table for the next size")
    data = Path(tempfile.mkdtemp(prefix="cynomys-bigtxn-data-"))
    try:
        files = chunk_files(max(sizes), data)
        path = RESULTS / f"{args.name}.json"
        earlier = json.loads(path.read_text()).get("results", []) if args.append and path.exists() else []
        ratio = expansion()
        done: list[dict[str, Any]] = []

        def save(more: list[dict[str, Any]]) -> None:
            results = earlier + done + more
            write_result(args.name, {"max_memory_mb": args.max_memory_mb, "sizes": sizes, "expansion": ratio,
                                     "results": results})
            plot(results, args.max_memory_mb, RESULTS / f"{args.name}.png")

        for kind in args.targets.split(","):
            done += run_target(kind, sizes, ops, files, args.max_memory_mb, args.monetdb_url, args.keep, save,
                               "".join(f"{line}\n" for line in args.applier))
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(f"wrote {path} and {RESULTS / (args.name + '.png')}")


if __name__ == "__main__":
    main()
