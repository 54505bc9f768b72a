"""How fast can a snapshot read the source?  Drivers and forms side by side.

    python bench/source_reads.py [--rows 2000000] [--chunk 5000] [--drivers pymysql,mysqlclient,mariadb]

One throwaway MariaDB holding ``--rows`` TPC-H lineitem rows (16 columns:
BIGINT, INT, DECIMAL(15,2), CHAR, DATE, VARCHAR; loaded with LOAD DATA from
a file made by duckdb's dbgen).  Each way of reading is timed on the same
table in one run, rows/s over the whole table:

  cli            ``mariadb --quick -e 'SELECT * ...' > /dev/null``: the server
                 and its C client, the ceiling
  <driver>.whole one ``SELECT *`` streamed (unbuffered cursor), driver values
  <driver>.chunks the snapshot's way: key-range chunks of ``--chunk`` rows in
                 key order, each fetched whole, driver values (what a chunk
                 select costs, without the watermarks)
  <driver>.raw   chunks with no value conversion in the driver (every field
                 as the server's text, bytes): the floor of per-field cost
  +model         chunks converted to the model's values (snapshot/columns.py
                 row_converter), ready for the codec

The drivers: pymysql (pure Python, what Cynomys used), mysqlclient
(MySQLdb, C, on libmariadb) and MariaDB Connector/Python (``mariadb``, C).
Missing ones are skipped (``pip install mysqlclient mariadb``; both need
libmariadb-dev to build).  Writes bench/results/source_reads.json.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402
from bench.tpch import LINEITEM_DDL, _extension  # noqa: E402
from cynomys.sandbox.mariadb import ROOT_PASSWORD, MariaDBServer  # noqa: E402

KEY = ("l_orderkey", "l_linenumber")


def load(srv: MariaDBServer, rows: int, work: Path) -> None:
    import duckdb

    sf = max(0.01, round(rows / 6_000_000 + 0.005, 3))
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{_extension()}'")
    con.execute(f"CALL dbgen(sf={sf})")
    path = work / "lineitem.tsv"
    con.execute(f"COPY (SELECT * FROM lineitem ORDER BY l_orderkey, l_linenumber LIMIT {int(rows)}) TO '{path}' "
                "(HEADER false, DELIMITER '\t')")
    con.close()
    srv.execute("CREATE DATABASE IF NOT EXISTS bench")
    conn = srv.connect("bench", local_infile=True)
    with conn.cursor() as cur:
        cur.execute(LINEITEM_DDL)
        cur.execute(f"LOAD DATA LOCAL INFILE '{path}' INTO TABLE lineitem FIELDS TERMINATED BY '\\t'")
        cur.execute("ANALYZE TABLE lineitem")
    conn.close()
    path.unlink()


def _cli(srv: MariaDBServer) -> int:
    out = subprocess.run(["mariadb", "--quick", "-h127.0.0.1", f"-P{srv.port}", "-uroot", f"-p{ROOT_PASSWORD}",
                          "-N", "-e", "SELECT * FROM bench.lineitem"], stdout=subprocess.PIPE, check=True)
    return out.stdout.count(b"\n")


def _connect(driver: str, srv: MariaDBServer, raw: bool) -> Any:
    if driver == "pymysql":
        import pymysql
        import pymysql.converters

        conv = dict(pymysql.converters.conversions)
        if raw:  # field types (int keys) decode to the server's text; Python types (encoders) stay
            conv.update({k: (lambda v: v) for k in pymysql.converters.decoders})
        kw: dict[str, Any] = {"conv": conv}
        return pymysql.connect(host="127.0.0.1", port=srv.port, user="root", password=ROOT_PASSWORD,
                               charset="utf8mb4", autocommit=True, binary_prefix=False, **kw)
    if driver == "mysqlclient":
        import MySQLdb
        import MySQLdb.converters

        # raw: no decoder for any field type (the server's text as bytes); the encoders stay
        conv = {k: v for k, v in MySQLdb.converters.conversions.items() if not (raw and isinstance(k, int))}
        kw = {"conv": conv}
        return MySQLdb.connect(host="127.0.0.1", port=srv.port, user="root", password=ROOT_PASSWORD,
                               charset="utf8mb4", autocommit=True, **kw)
    if driver == "mariadb":
        import mariadb

        return mariadb.connect(host="127.0.0.1", port=srv.port, user="root", password=ROOT_PASSWORD,
                               autocommit=True)
    raise ValueError(driver)


def _chunks(conn: Any, chunk: int, convert: Callable[[Any], Any] | None) -> int:
    """The whole table in key-range chunks, the snapshot's select."""
    cur = conn.cursor()
    n = 0
    after: tuple[Any, ...] | None = None
    while True:
        if after is None:
            cur.execute(f"SELECT * FROM bench.lineitem ORDER BY l_orderkey, l_linenumber LIMIT {chunk}")
        else:
            cur.execute("SELECT * FROM bench.lineitem WHERE (l_orderkey, l_linenumber) > (%s, %s) "
                        "AND l_orderkey >= %s "
                        f"ORDER BY l_orderkey, l_linenumber LIMIT {chunk}", (after[0], after[1], after[0]))
        rows = cur.fetchall()
        if convert is not None:
            rows = [convert(r) for r in rows]
        n += len(rows)
        if len(rows) < chunk:
            return n
        last = rows[-1]
        after = (int(last[0]), int(last[3]))  # (raw text converts too)


def _whole(driver: str, srv: MariaDBServer) -> int:
    conn = _connect(driver, srv, False)
    if driver == "pymysql":
        import pymysql.cursors

        cur = conn.cursor(pymysql.cursors.SSCursor)
    elif driver == "mysqlclient":
        import MySQLdb.cursors

        cur = conn.cursor(MySQLdb.cursors.SSCursor)
    else:
        cur = conn.cursor(buffered=False)
    cur.execute("SELECT * FROM bench.lineitem")
    n = 0
    while True:
        got = cur.fetchmany(10000)
        if not got:
            break
        n += len(got)
    conn.close()
    return n


def timed(name: str, fn: Callable[[], int], results: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    c0 = time.process_time()
    n = fn()
    secs = time.perf_counter() - t0
    cpu = time.process_time() - c0
    results[name] = {"rows": n, "seconds": round(secs, 3), "rows_per_s": round(n / secs), "client_cpu_s": round(cpu, 3)}
    print(f"{name:24s} {n:>9d} rows {secs:7.2f} s {n / secs:>10,.0f} rows/s (client CPU {cpu:.2f} s)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--chunk", type=int, default=5000)
    ap.add_argument("--drivers", default="pymysql,mysqlclient,mariadb")
    args = ap.parse_args()
    from cynomys.snapshot.columns import row_converter, table_info

    work = Path(tempfile.mkdtemp(prefix="cynomys-bench-reads-"))
    srv = MariaDBServer(server_id=1, base=str(work / "src")).start()
    results: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        load(srv, args.rows, work)
        print(f"loaded {args.rows} rows in {time.monotonic() - t0:.1f}s (load {os.getloadavg()[0]:.1f})", flush=True)
        cols = srv.execute("SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                           "'bench' AND TABLE_NAME = 'lineitem' ORDER BY ORDINAL_POSITION")
        info = table_info("bench", "lineitem", [(str(a), str(b)) for a, b in cols], list(KEY), "InnoDB", args.rows)
        convert = row_converter(info.schema.columns)
        _chunks(_connect("pymysql", srv, False), args.chunk, None)  # warm the buffer pool
        timed("cli", lambda: _cli(srv), results)
        for driver in args.drivers.split(","):
            try:
                _connect(driver, srv, False).close()
            except ImportError:
                print(f"{driver}: not installed, skipped")
                continue
            timed(f"{driver}.whole", lambda: _whole(driver, srv), results)
            timed(f"{driver}.chunks", lambda: _chunks(_connect(driver, srv, False), args.chunk, None), results)
            if driver != "mariadb":
                timed(f"{driver}.raw", lambda: _chunks(_connect(driver, srv, True), args.chunk, None), results)
            timed(f"{driver}.chunks+model", lambda: _chunks(_connect(driver, srv, False), args.chunk, convert),
                  results)
        out = write_result("source_reads", {"rows": args.rows, "chunk": args.chunk, "table": "lineitem (16 columns)",
                                            "results": results,
                                            "notes": "one run, same table, warm buffer pool; client_cpu_s is this "
                                                     "process's CPU (the server's is not counted); 2-CPU shared VM"})
        print(f"wrote {out}")
    finally:
        srv.destroy()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
