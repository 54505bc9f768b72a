"""The Cynomys paper's headline experiment: replication lag of TPC-H lineitem.

    python bench/lineitem.py [--rows 1000000] [--targets columnstore,spark] [--monetdb-url URL]

4 concurrent writers insert the first N lineitem rows into a throwaway
MariaDB (1000-row multi-row INSERTs, one commit each) while the producer
and applier daemons run (subprocesses, Redis Stream transport, sealed
envelopes).  Reported per target: rows, the source's write time, the time
until the target holds every row (the applier's committed position reaches
the source's binlog end), their ratio (the paper: 6.12 s / 5.68 s = 1.08),
the tail lag (target done minus source done), peak RSS of each daemon, and
a row-by-row equality check (all fields of a row joined into one string and
compared, as in the paper, plus a checksum over all rows).

Targets: ``columnstore`` (the ColumnStore target code on a second MariaDB
with ENGINE=InnoDB), ``spark`` (local Spark, Iceberg), ``monetdb`` (needs
--monetdb-url or CYNOMYS_TEST_MONETDB).  Writes bench/results/lineitem.json
and lineitem.png.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, daemon, redis_config, tear_down, write_result  # noqa: E402
from bench.tpch import LINEITEM_DDL, insert_lineitem, lineitem  # noqa: E402
from cynomys.sandbox.mariadb import MariaDBServer  # noqa: E402
from cynomys.sandbox.redis import RedisProcess  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _columnstore(work: Path, monetdb_url: str) -> tuple[str, Any]:
    tgt = MariaDBServer(server_id=2, base=str(work / "target")).start()
    return f'[target]\nkind = "columnstore"\nurl = "{tgt.url}"\nengine = "InnoDB"\n', tgt


def _spark(work: Path, monetdb_url: str) -> tuple[str, Any]:
    return (f'[target]\nkind = "spark"\n[target.spark]\nmaster = "local[2]"\nwarehouse = "{work / "warehouse"}"\n'
            f'conf = {{ "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "2", '
            f'"spark.driver.memory" = "3g" }}\n'), None


def _monetdb(work: Path, monetdb_url: str) -> tuple[str, Any]:
    if not monetdb_url:
        raise SystemExit("monetdb needs --monetdb-url (or CYNOMYS_TEST_MONETDB)")
    return f'[target]\nkind = "monetdb"\nurl = "{monetdb_url}"\n', None


def _duckdb(work: Path, monetdb_url: str) -> tuple[str, Any]:
    return f'[target]\nkind = "duckdb"\nurl = "{work / "replica.duckdb"}"\n', None


#: Target kind -> its [target] section and server (a table, not an if-chain).
TARGET_SECTIONS: dict[str, Callable[[Path, str], tuple[str, Any]]] = {
    "columnstore": _columnstore, "spark": _spark, "monetdb": _monetdb, "duckdb": _duckdb,
}


def target_section(kind: str, work: Path, monetdb_url: str) -> tuple[str, Any]:
    """TOML [target] text and a cleanup handle (a server object or None)."""
    make = TARGET_SECTIONS.get(kind)
    if make is None:
        raise SystemExit(f"unknown target {kind!r}; one of {', '.join(TARGET_SECTIONS)}")
    return make(work, monetdb_url)


def config(work: Path, src: MariaDBServer, redis_url: str, target: str, keys: dict[str, Path]) -> Path:
    return redis_config(work, src, redis_url, keys, include="tpch.*", start=src.binlog_end(), heartbeat_s=0.5,
                        producer="batch_max_events = 10000\nbatch_max_delay_ms = 100\n",
                        applier="buffer_rows = 50000\nmax_delay_ms = 200\n", tail=target)


def applied_position(work: Path) -> tuple[str, int] | None:
    try:
        d = json.loads((work / "applier" / "applier.json").read_text())
        return d["position"]["file"], int(d["position"]["pos"])
    except (OSError, ValueError, KeyError):
        return None


def row_text(row: tuple[Any, ...]) -> str:
    return "|".join("" if v is None else str(v) for v in row)


def check_equal(src: MariaDBServer, cfg: Path) -> dict[str, Any]:
    from cynomys.applier.targets.base import open_target
    from cynomys.core.config import load_config

    source = [row_text(r) for r in src.execute("SELECT * FROM tpch.lineitem ORDER BY l_orderkey, l_linenumber")]
    t = open_target(load_config(cfg, env={}))
    t.connect()
    try:
        target = sorted((row_text(r) for r in t.fetch_rows("tpch", "lineitem")),
                        key=lambda s: (int(s.split("|")[0]), int(s.split("|")[3])))
    finally:
        t.close()
    mismatched = sum(1 for a, b in zip(source, target) if a != b) + abs(len(source) - len(target))
    digest = lambda rows: hashlib.sha256("\n".join(rows).encode()).hexdigest()  # noqa: E731
    return {"source_rows": len(source), "target_rows": len(target), "mismatched_rows": mismatched,
            "source_sha256": digest(source), "target_sha256": digest(target),
            "equal": mismatched == 0 and digest(source) == digest(target)}


def peak_rss(log: Path) -> float | None:
    found = re.findall(r"peak RSS ([0-9.]+) MB", log.read_text(errors="replace"))
    return float(found[-1]) if found else None


def run(kind: str, rows: list[tuple[Any, ...]], monetdb_url: str, keep: bool = False) -> dict[str, Any]:
    """One target's run in a fresh work folder (servers, state, logs): removed
    after a run that ended equal, unless ``keep``; kept (and named) otherwise."""
    from cynomys.transport.keys import generate_keys

    work = Path(tempfile.mkdtemp(prefix=f"cynomys-lineitem-{kind}-"))
    src = MariaDBServer(server_id=1, base=str(work / "source")).start()
    redis = RedisProcess(str(work / "redis")).start()
    section, tgt = target_section(kind, work, monetdb_url)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        src.execute("CREATE DATABASE tpch")
        src.execute(LINEITEM_DDL, database="tpch")
        cfg = config(work, src, redis.url, section, generate_keys(work / "keys"))
        procs = [daemon(cfg, "produce", work / "producer.log"), daemon(cfg, "apply", work / "applier.log")]
        time.sleep(8 if kind == "spark" else 2)  # daemons up (Spark takes a while to start) before the clock runs
        print(f"[{kind}] 4 writers inserting {len(rows)} rows ...", flush=True)
        t0 = time.monotonic()
        write_s = insert_lineitem(src, "tpch", rows)
        end_file, end_pos = src.execute("SHOW MASTER STATUS")[0][:2]
        print(f"[{kind}] source written in {write_s:.2f}s ({len(rows) / write_s:,.0f} rows/s); waiting for the target",
              flush=True)
        deadline = time.monotonic() + 3600
        last_print = 0.0
        while time.monotonic() < deadline:
            for name, p in zip(("producer", "applier"), procs):
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: see {work / (name + '.log')}")
            at = applied_position(work)
            if at is not None and at[0] == end_file and at[1] >= end_pos:
                break
            if time.monotonic() - last_print > 5:
                print(f"[{kind}]   target at {at}, source end {end_file}:{end_pos}", flush=True)
                last_print = time.monotonic()
            time.sleep(0.05)
        done_s = time.monotonic() - t0
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
        check = check_equal(src, cfg)
        result = {
            "target": kind, "rows": len(rows), "source_write_s": round(write_s, 2), "target_done_s": round(done_s, 2),
            "ratio": round(done_s / write_s, 2), "tail_lag_s": round(done_s - write_s, 2),
            "source_rows_per_s": round(len(rows) / write_s), "end_to_end_rows_per_s": round(len(rows) / done_s),
            "peak_rss_mb": {"producer": peak_rss(work / "producer.log"), "applier": peak_rss(work / "applier.log")},
            "check": check,
        }
        print(f"[{kind}] {json.dumps(result)}", flush=True)
        keep = keep or not check.get("equal")
        return result
    except BaseException:
        keep = True
        raise
    finally:
        tear_down(kind, work, keep, procs, redis, src, tgt)


def plot(results: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["paper (MySQL → column store)"] + [r["target"] for r in results]
    src = [5.68] + [r["source_write_s"] for r in results]
    tgt = [6.12] + [r["target_done_s"] for r in results]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.8 * len(labels)))
    y = range(len(labels))
    ax.barh([i + 0.2 for i in y], src, height=0.4, label="source writes done", color="#999")
    ax.barh([i - 0.2 for i in y], tgt, height=0.4, label="target holds every row", color="#37a")
    for i, (s, t) in enumerate(zip(src, tgt)):
        ax.text(t, i - 0.2, f" ratio {t / s:.2f}", va="center", fontsize=8)
    ax.set_yticks(list(y), labels)
    ax.set_xlabel(f"seconds ({results[0]['rows'] if results else 0:,} lineitem rows here, 1,000,000 in the paper)")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    ax.set_title("Replication lag: 4 writers insert TPC-H lineitem")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--targets", default="columnstore")
    ap.add_argument("--monetdb-url", default=os.environ.get("CYNOMYS_TEST_MONETDB", ""))
    ap.add_argument("--keep", action="store_true", help="keep each run's work folder (logs, state) in the temp dir")
    args = ap.parse_args()
    print(f"generating {args.rows} lineitem rows ...", flush=True)
    rows = lineitem(args.rows)
    results = [run(kind, rows, args.monetdb_url, args.keep) for kind in args.targets.split(",")]
    out = write_result("lineitem", {"paper": {"rows": 1_000_000, "source_write_s": 5.68, "target_done_s": 6.12,
                                              "ratio": 1.08},
                                    "results": results})
    plot(results, RESULTS / "lineitem.png")
    print(f"wrote {out} and {RESULTS / 'lineitem.png'}")


if __name__ == "__main__":
    main()
