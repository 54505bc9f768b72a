"""TPC-H lineitem rows for the benchmarks, from duckdb's tpch extension
(PyPI duckdb + duckdb-extension-tpch; loaded from the wheel's file, offline)."""
from __future__ import annotations

import glob
import math
import os
import threading
import time
from typing import Any

#: lineitem in MySQL/MariaDB, keyed like TPC-H (orderkey, linenumber).
LINEITEM_DDL = """CREATE TABLE lineitem (
  l_orderkey BIGINT NOT NULL, l_partkey BIGINT NOT NULL, l_suppkey BIGINT NOT NULL, l_linenumber INT NOT NULL,
  l_quantity DECIMAL(15,2) NOT NULL, l_extendedprice DECIMAL(15,2) NOT NULL, l_discount DECIMAL(15,2) NOT NULL,
  l_tax DECIMAL(15,2) NOT NULL, l_returnflag CHAR(1) NOT NULL, l_linestatus CHAR(1) NOT NULL,
  l_shipdate DATE NOT NULL, l_commitdate DATE NOT NULL, l_receiptdate DATE NOT NULL,
  l_shipinstruct CHAR(25) NOT NULL, l_shipmode CHAR(10) NOT NULL, l_comment VARCHAR(44) NOT NULL,
  PRIMARY KEY (l_orderkey, l_linenumber))"""


def _extension() -> str:
    import duckdb_extension_tpch

    found = glob.glob(os.path.join(os.path.dirname(duckdb_extension_tpch.__file__), "extensions", "*",
                                   "tpch.duckdb_extension"))
    if not found:
        raise SystemExit("tpch.duckdb_extension not found: pip install duckdb-extension-tpch")
    return found[0]


def dbgen_scale(rows: int) -> float:
    """A dbgen scale factor giving at least ``rows`` lineitem rows (about
    6M per unit).  Past one, duckdb's dbgen makes whole scale factors only:
    sf 1.67 gave sf 1's 6.0M rows, so it is rounded up to a whole one."""
    sf = max(0.01, round(rows / 6_000_000 + 0.005, 3))
    return float(math.ceil(rows / 5_900_000)) if sf > 1 else sf


def lineitem(rows: int) -> list[tuple[Any, ...]]:
    """The first ``rows`` lineitem rows (scale factor chosen to have enough:
    sf=0.17 gives about 1.02M)."""
    import duckdb

    sf = max(0.01, round(rows / 6_000_000 + 0.005, 3))
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{_extension()}'")
    con.execute(f"CALL dbgen(sf={sf})")
    out = con.execute(f"SELECT * FROM lineitem ORDER BY l_orderkey, l_linenumber LIMIT {int(rows)}").fetchall()
    con.close()
    return out


def insert_lineitem(src: Any, database: str, rows: list[tuple[Any, ...]], writers: int = 4) -> float:
    """``writers`` concurrent clients insert ``rows`` into ``database``.lineitem in
    1000-row multi-row INSERTs, one commit each (the paper's workload): each
    thread has its own connection and takes every ``writers``-th chunk.
    Returns the seconds taken."""
    chunks = [rows[i:i + 1000] for i in range(0, len(rows), 1000)]
    marks = "(" + ",".join(["%s"] * 16) + ")"
    errors: list[BaseException] = []

    def work(part: list[list[tuple[Any, ...]]]) -> None:
        try:
            conn = src.connect(database)
            with conn.cursor() as cur:
                for chunk in part:
                    cur.execute("INSERT INTO lineitem VALUES " + ",".join([marks] * len(chunk)),
                                [v for r in chunk for v in r])
            conn.close()
        except BaseException as exc:  # re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(chunks[w::writers],)) for w in range(writers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.monotonic() - t0
