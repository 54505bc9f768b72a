"""The paper's correctness experiment, into MonetDB: TPC-H lineitem.

    python bench/monetdb_lineitem.py [--rows 1000000] [--writers 4] [--monetdb-url URL]

4 concurrent writers insert the first N rows of TPC-H lineitem (duckdb's
tpch extension, ``bench/tpch.py``) into a throwaway MariaDB, 1000-row
multi-row INSERTs with one commit each, while the producer and applier
daemons run as subprocesses (``python -m cynomys.cli produce|apply``, Redis
Stream transport, sealed envelopes).  The applier loads a MonetDB server
(``--monetdb-url``, default ``$CYNOMYS_TEST_MONETDB``); the table reaches it
as the source's own CREATE TABLE, through the DDL path.

Reported: the source's write time, the time until MonetDB holds every row
(polled with COUNT(*) on its own connection, from the first write), their
ratio (the paper: 6.12 s / 5.68 s = 1.08), and a check of every row: all
fields of a row joined into one string and compared with the source's, as in
the paper, plus a SHA-256 over all rows; the source is also compared with the
generated rows.  Writes bench/results/monetdb_lineitem.json (one entry per
row count; a run replaces the entry of its own size).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, daemon, redis_config, write_result  # noqa: E402
from bench.tpch import LINEITEM_DDL, insert_lineitem, lineitem  # noqa: E402
from cynomys.sandbox.mariadb import MariaDBServer  # noqa: E402
from cynomys.sandbox.redis import RedisProcess  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAPER = {"rows": 1_000_000, "source_write_s": 5.68, "target_done_s": 6.12, "ratio": 1.08}
KEY = (0, 3)  # l_orderkey, l_linenumber


def config(work: Path, src: MariaDBServer, redis_url: str, monetdb_url: str, database: str,
           keys: dict[str, Path]) -> Path:
    # Start at the source's current position: the CREATE TABLE comes after
    # it, so MonetDB gets the table through the DDL path.
    return redis_config(work, src, redis_url, keys, include=f"{database}.*", start=src.binlog_end(), heartbeat_s=0.5,
                        producer_id=f"bench-monetdb-{uuid.uuid4().hex[:8]}", stream="bench-monetdb",
                        producer="batch_max_events = 10000\nbatch_max_delay_ms = 100\n",
                        applier="buffer_rows = 50000\nmax_delay_ms = 200\n",
                        tail=f'[target]\nkind = "monetdb"\nurl = "{monetdb_url}"\n')


def monetdb_count(conn: Any, database: str) -> int | None:
    """Rows MonetDB holds now; None while the table does not exist yet."""
    cur = conn.cursor()
    try:
        cur.execute("SELECT COUNT(*) FROM sys.tables t JOIN sys.schemas s ON t.schema_id = s.id "
                    f"WHERE s.name = '{database}' AND t.name = 'lineitem'")
        if not cur.fetchone()[0]:
            return None
        cur.execute(f'SELECT COUNT(*) FROM "{database}"."lineitem"')
        return int(cur.fetchone()[0])
    finally:
        conn.commit()  # a fresh snapshot for the next poll
        cur.close()


def row_text(row: Iterable[Any]) -> str:
    """All fields of a row joined into one string (the paper's check)."""
    return "|".join("" if v is None else str(v) for v in row)


def keyed(rows: Iterable[tuple[Any, ...]]) -> dict[tuple[int, int], str]:
    return {(int(r[KEY[0]]), int(r[KEY[1]])): row_text(r) for r in rows}


def digest(rows: dict[tuple[int, int], str]) -> str:
    h = hashlib.sha256()
    for k in sorted(rows):
        h.update(rows[k].encode())
        h.update(b"\n")
    return h.hexdigest()


def compare(want: dict[tuple[int, int], str], got: dict[tuple[int, int], str]) -> dict[str, Any]:
    mismatched = [k for k in want.keys() & got.keys() if want[k] != got[k]]
    missing, extra = want.keys() - got.keys(), got.keys() - want.keys()
    out: dict[str, Any] = {"rows": len(want), "compared_rows": len(got), "mismatched_rows": len(mismatched),
                           "missing_rows": len(missing), "extra_rows": len(extra),
                           "sha256_expected": digest(want), "sha256_got": digest(got)}
    out["equal"] = not (mismatched or missing or extra) and out["sha256_expected"] == out["sha256_got"]
    if mismatched:
        k = min(mismatched)
        out["first_mismatch"] = {"key": k, "expected": want[k], "got": got[k]}
    return out


def check(src: MariaDBServer, cfg: Path, database: str, generated: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Every row, as one string, in MonetDB (read through the target's own
    fetch_rows, which undoes the type mapping) against the source, and the
    source against the generated rows."""
    from cynomys.applier.targets.base import open_target
    from cynomys.core.config import load_config

    t0 = time.monotonic()
    conn = src.connect(database)
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM lineitem")
        source = keyed(cur.fetchall())
    conn.close()
    target = open_target(load_config(cfg, env={}))
    target.connect()
    try:
        got = keyed(target.fetch_rows(database, "lineitem"))
    finally:
        target.close()
    vs_source, vs_generated = compare(source, got), compare(keyed(generated), source)
    return {"monetdb_vs_source": vs_source, "source_vs_generated": vs_generated,
            "check_s": round(time.monotonic() - t0, 2), "equal": vs_source["equal"] and vs_generated["equal"]}


def monetdb_version(url: str) -> str:
    import pymonetdb

    conn = pymonetdb.connect(url)
    try:
        cur = conn.cursor()
        cur.execute("SELECT value FROM sys.environment WHERE name = 'monet_version'")
        return str(cur.fetchone()[0])
    finally:
        conn.close()


def drop_schema(url: str, database: str) -> None:
    import pymonetdb

    conn = pymonetdb.connect(url, autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT COUNT(*) FROM sys.schemas WHERE name = '{database}'")
        if cur.fetchone()[0]:
            cur.execute(f'DROP SCHEMA "{database}" CASCADE')
    finally:
        conn.close()


def run(rows: list[tuple[Any, ...]], monetdb_url: str, writers: int, database: str, keep: bool) -> dict[str, Any]:
    import pymonetdb

    from cynomys.transport.keys import generate_keys

    work = Path(tempfile.mkdtemp(prefix="cynomys-monetdb-lineitem-"))
    drop_schema(monetdb_url, database)
    src = MariaDBServer(server_id=1, base=str(work / "source")).start()
    redis = RedisProcess(str(work / "redis")).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cfg = config(work, src, redis.url, monetdb_url, database, generate_keys(work / "keys"))
        src.execute(f"CREATE DATABASE {database}")
        src.execute(LINEITEM_DDL, database=database)
        procs = [daemon(cfg, "produce", work / "producer.log"), daemon(cfg, "apply", work / "applier.log")]
        watch = pymonetdb.connect(monetdb_url)
        deadline = time.monotonic() + 60
        while monetdb_count(watch, database) is None:  # the CREATE TABLE arrives before the clock starts
            if time.monotonic() > deadline:
                raise RuntimeError(f"the table did not reach MonetDB in 60s; see {work / 'applier.log'}")
            time.sleep(0.2)
        print(f"{writers} writers inserting {len(rows):,} rows into MariaDB ...", flush=True)
        done = threading.Event()
        result: dict[str, Any] = {}

        def write() -> None:
            result["write_s"] = insert_lineitem(src, database, rows, writers)
            done.set()

        t0 = time.monotonic()
        writer = threading.Thread(target=write)
        writer.start()
        last_print, have = 0.0, 0
        timeout = time.monotonic() + max(600.0, len(rows) / 500)
        while time.monotonic() < timeout:
            for name, p in zip(("producer", "applier"), procs):
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: see {work / (name + '.log')}")
            have = monetdb_count(watch, database) or 0
            if have >= len(rows):
                break
            now = time.monotonic()
            if now - last_print >= 2:
                state = f"source done in {result['write_s']:.1f}s" if done.is_set() else "source writing"
                print(f"  {now - t0:6.1f}s  MonetDB holds {have:>9,} / {len(rows):,} rows ({state})", flush=True)
                last_print = now
            time.sleep(0.05)
        done_s = time.monotonic() - t0
        writer.join()
        watch.close()
        if have < len(rows):
            raise RuntimeError(f"MonetDB holds {have} of {len(rows)} rows after {done_s:.0f}s; see {work}")
        write_s = float(result["write_s"])
        print(f"source written in {write_s:.2f}s; MonetDB held every row {done_s:.2f}s after the first write",
              flush=True)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
        print("checking every row ...", flush=True)
        verdict = check(src, cfg, database, rows)
        return {
            "rows": len(rows), "writers": writers, "source_write_s": round(write_s, 2),
            "target_done_s": round(done_s, 2), "ratio": round(done_s / write_s, 2),
            "tail_lag_s": round(done_s - write_s, 2), "source_rows_per_s": round(len(rows) / write_s),
            "end_to_end_rows_per_s": round(len(rows) / done_s), "check": verdict,
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        redis.stop()
        if keep:
            print(f"kept {work}")
            src.stop()
        else:
            src.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="lineitem rows to write (the paper: 1,000,000)")
    ap.add_argument("--writers", type=int, default=4, help="concurrent source writers (the paper: 4)")
    ap.add_argument("--monetdb-url", default=os.environ.get("CYNOMYS_TEST_MONETDB", ""),
                    help="pymonetdb URL, e.g. monetdb://monetdb:monetdb@127.0.0.1:50000/demo")
    ap.add_argument("--database", default="tpch", help="source database = MonetDB schema (dropped first)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, config)")
    args = ap.parse_args()
    if not args.monetdb_url:
        raise SystemExit("no MonetDB: pass --monetdb-url or set CYNOMYS_TEST_MONETDB")
    print(f"generating {args.rows:,} lineitem rows ...", flush=True)
    rows = lineitem(args.rows)
    load_at_start = os.getloadavg()[0]
    result = run(rows, args.monetdb_url, args.writers, args.database, args.keep)
    result["loadavg_1m_at_start"] = load_at_start
    result["monetdb_version"] = monetdb_version(args.monetdb_url)
    result["loadavg_1m_at_end"] = os.getloadavg()[0]  # shared, noisy machines: say how busy it was
    # Keep the runs of other sizes already in the file (one entry per size).
    earlier: list[dict[str, Any]] = []
    try:
        earlier = [r for r in json.loads((RESULTS / "monetdb_lineitem.json").read_text()).get("results", [])
                   if r.get("rows") != result["rows"]]
    except (OSError, ValueError):
        pass
    runs = sorted(earlier + [result], key=lambda r: int(r["rows"]))
    out = write_result("monetdb_lineitem", {"paper": PAPER, "results": runs})
    print(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}")
    if not result["check"]["equal"]:
        raise SystemExit("MonetDB does not equal the source: see the check above")


if __name__ == "__main__":
    main()
