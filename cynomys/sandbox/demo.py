"""`cynomys demo`: the sample job, end to end, on throwaway local servers.

1. starts a MariaDB source (ROW binlog, FULL metadata) and Redis,
   writes fresh keys and a config file into the work directory;
2. runs a shop workload (orders inserted, updated, re-keyed, deleted);
3. runs the producer and the applier as two daemons (subprocesses, as they
   would run on two hosts) into the embedded default target -- Iceberg
   tables in a local warehouse, written by Spark in local mode -- until the
   target has caught up;
4. prints a few records as SQL (`cynomys tail`), the status, and checks that
   every target table equals its source table row by row.
"""
from __future__ import annotations

import datetime
import json
import logging
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cynomys.sandbox.daemons import stop_daemons
from cynomys.sandbox.mariadb import MariaDBServer
from cynomys.sandbox.redis import RedisProcess

log = logging.getLogger(__name__)

TABLES = {
    "customers": "id INT PRIMARY KEY, name VARCHAR(80), email VARCHAR(120), since DATE, vip BOOLEAN",
    "orders": "id BIGINT UNSIGNED PRIMARY KEY, customer_id INT, amount DECIMAL(12,2), status ENUM('new','paid','shipped'),"
              " placed_at DATETIME(6), note TEXT",
    "events": "customer_id INT, kind VARCHAR(20), at TIMESTAMP(6) NULL",  # no primary key
}


def _config_text(work: Path, src: MariaDBServer, redis_url: str) -> str:
    return f"""# Written by `cynomys demo`.
{src.source_toml("shop.*", "earliest")}

[producer]
id = "demo-producer"
state_dir = "{work / 'state/producer'}"
batch_max_events = 5000
batch_max_delay_ms = 200

[transport]
kind = "redis"
url = "{redis_url}"
stream = "cynomys-demo"

[security]
applier_public_key = "{work / 'keys/applier_public.pem'}"
producer_private_key = "{work / 'keys/producer_private.pem'}"
applier_private_key = "{work / 'keys/applier_private.pem'}"
producer_public_key = "{work / 'keys/producer_public.pem'}"

[applier]
buffer_rows = 10000
max_delay_ms = 500
state_dir = "{work / 'state/applier'}"

# No [target]: the embedded default, a local Iceberg warehouse (./warehouse
# next to this file) written by Spark in local mode.
"""


def _workload(src: MariaDBServer, rows: int, seed: int = 42) -> int:
    rnd = random.Random(seed)
    conn = src.connect("shop")
    statements = 0
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)",
                        [(i, f"customer {i} \N{GRINNING FACE}", f"c{i}@example.com", f"2020-01-{1 + i % 28:02d}", i % 5 == 0)
                         for i in range(1, 501)])
        for start in range(0, rows, 1000):
            cur.execute("BEGIN")
            cur.executemany("INSERT INTO orders VALUES (%s, %s, %s, %s, NOW(6), %s)",
                            [(i, rnd.randrange(1, 501), f"{rnd.uniform(1, 999):.2f}", "new", "x" * rnd.randrange(50))
                             for i in range(start + 1, min(rows, start + 1000) + 1)])
            cur.execute("UPDATE orders SET status='paid' WHERE id BETWEEN %s AND %s", (start + 1, start + 300))
            cur.execute("DELETE FROM orders WHERE id BETWEEN %s AND %s", (start + 900, start + 950))
            cur.execute("UPDATE orders SET id = id + 10000000 WHERE id = %s", (start + 5,))
            cur.executemany("INSERT INTO events VALUES (%s, %s, NOW(6))", [(rnd.randrange(1, 501), "view")] * 20)
            cur.execute("COMMIT")
            statements += 6
        cur.execute("ALTER TABLE customers ADD COLUMN country CHAR(2) DEFAULT 'NZ'")
        cur.execute("UPDATE customers SET country='AU' WHERE id % 3 = 0")
    conn.close()
    return statements


def _daemon(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", *args], stdout=log_path.open("ab"),
                            stderr=subprocess.STDOUT)


def _caught_up(work: Path, end: tuple[str, int]) -> bool:
    """The applier's committed position (mirrored in applier.json) reached ``end``."""
    try:
        d = json.loads((work / "state/applier/applier.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(d["position"]["file"] == end[0] and int(d["position"]["pos"]) >= end[1])


def _compare(src: MariaDBServer, cfg: Path) -> dict[str, Any]:
    """Every target table against its source table, row by row."""
    from cynomys.applier.targets.base import open_target
    from cynomys.core.config import load_config

    target = open_target(load_config(cfg))
    target.connect()
    out: dict[str, Any] = {}
    try:
        for table in TABLES:
            cols = [r[0] for r in src.execute(
                f"SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA='shop' AND TABLE_NAME='{table}' "
                "ORDER BY ORDINAL_POSITION")]
            a = sorted(map(_norm, src.execute(f"SELECT * FROM shop.{table}")))
            b = sorted(map(_norm, target.fetch_rows("shop", table)))
            out[table] = (len(a), a == b, len(cols))
    finally:
        target.close()
    return out


def _norm(row: tuple[Any, ...]) -> tuple[str, ...]:
    """Compare as text: the source's driver and the target give TIMESTAMPs
    naive/aware and BOOLEAN as int, which are the same values."""
    out = []
    for v in row:
        if isinstance(v, datetime.datetime) and v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        out.append("" if v is None else str(v))
    return tuple(out)


def run_demo(work: Path, *, rows: int = 20000, keep: bool = False) -> int:
    work = work.resolve()
    if work.exists():
        shutil.rmtree(work)
    (work / "logs").mkdir(parents=True)
    print(f"== cynomys demo in {work}")
    src = MariaDBServer(server_id=1, base=str(work / "source")).start()
    redis = RedisProcess(str(work / "redis")).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        print(f"   source MariaDB 127.0.0.1:{src.port}, Redis {redis.url}, target: Iceberg warehouse {work / 'warehouse'}")
        from cynomys.transport.keys import generate_keys

        generate_keys(work / "keys")
        cfg = work / "cynomys.toml"
        cfg.write_text(_config_text(work, src, redis.url))
        src.execute("CREATE DATABASE shop", *[f"CREATE TABLE shop.{t} ({cols})" for t, cols in TABLES.items()])
        procs.append(_daemon(["produce", "-c", str(cfg)], work / "logs/producer.log"))
        procs.append(_daemon(["apply", "-c", str(cfg)], work / "logs/applier.log"))
        print(f"== writing {rows} orders in transactions of 1000 rows (with updates, key changes, deletes, DDL) ...")
        t0 = time.monotonic()
        _workload(src, rows)
        t_src = time.monotonic() - t0
        end = src.execute("SHOW MASTER STATUS")[0][:2]
        deadline = time.monotonic() + 600
        while not _caught_up(work, (end[0], int(end[1]))):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"replication did not finish; see the logs in {work / 'logs'}")
            time.sleep(0.2)
        t_done = time.monotonic() - t0
        print(f"== source written in {t_src:.1f}s; the target held every change {t_done:.1f}s after the start")
        print("== the first records on the wire, as SQL (cynomys tail -n 8):")
        subprocess.run([sys.executable, "-m", "cynomys.cli", "--log-level", "ERROR", "tail", "-c", str(cfg), "-n", "8"],
                       check=False)
        subprocess.run([sys.executable, "-m", "cynomys.cli", "--log-level", "ERROR", "status", "-c", str(cfg)], check=False)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
        print("== comparing every target table with its source table ...")
        result = _compare(src, cfg)
        ok = all(same for _, same, _ in result.values())
        for table, (n, same, _) in result.items():
            print(f"   shop.{table}: {n} rows, target {'equals' if same else 'DIFFERS FROM'} source")
        print(f"== query the result with Spark SQL:\n   cynomys sql -c {cfg} "
              "\"SELECT status, count(*), sum(amount) FROM shop.orders GROUP BY status\"")
        print("== OK: every target table equals its source table" if ok else "== FAILED: see logs in " + str(work / "logs"))
        return 0 if ok else 1
    finally:
        stop_daemons(procs, 60)
        if not keep:
            redis.stop()
            src.stop()
        else:
            print(f"   servers left running (--keep); config {work / 'cynomys.toml'}")
