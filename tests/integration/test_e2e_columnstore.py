"""End to end: MariaDB -> producer -> Redis -> applier -> MariaDB (ColumnStore
target code with engine InnoDB), with both daemons killed with SIGKILL
several times while 4 clients write.  At the end every target table equals
its source table row by row."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
import pytest

from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).parents[2]
TABLES = {
    "acct": "id INT PRIMARY KEY, owner VARCHAR(40), balance DECIMAL(14,2), ver INT, note TEXT, "
            "at DATETIME(6), ts TIMESTAMP(6) NULL, flags SET('a','b','c'), raw VARBINARY(16)",
    "pair": "a INT, b VARCHAR(10), v DOUBLE, ver INT, PRIMARY KEY (a, b)",
    "log": "who INT, what VARCHAR(20), n INT",  # no primary key
}


def _daemon(cfg: Path, cmd: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(cfg)],
                            cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _writer(src: MariaDBServer, stop: threading.Event, seed: int, done: list[int], errors: list[BaseException]) -> None:
    rnd = random.Random(seed)
    conn = src.connect("app")
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                k = rnd.randrange(400)
                try:
                    cur.execute("BEGIN")
                    r = rnd.random()
                    if r < 0.35:
                        cur.execute("INSERT INTO acct (id, owner, balance, ver, note, at, ts, flags, raw) "
                                    "VALUES (%s, %s, %s, 0, %s, NOW(6), NOW(6), 'a,c', %s) "
                                    "ON DUPLICATE KEY UPDATE balance = balance + 1, ver = ver + 1",
                                    (k, f"o{k}\N{SNOWMAN}", rnd.randrange(10**6) / 100, "n" * rnd.randrange(20),
                                     bytes([rnd.randrange(256) for _ in range(rnd.randrange(16))])))
                    elif r < 0.55:
                        cur.execute("UPDATE acct SET balance = balance * 1.01, ver = ver + 1, flags = '' "
                                    "WHERE id BETWEEN %s AND %s", (k, k + 10))
                    elif r < 0.62:
                        cur.execute("UPDATE acct SET id = id + 1000 WHERE id = %s", (k,))
                    elif r < 0.72:
                        cur.execute("DELETE FROM acct WHERE id = %s", (k,))
                    elif r < 0.85:
                        cur.execute("INSERT INTO pair VALUES (%s, %s, %s, 0) ON DUPLICATE KEY UPDATE v = v + 0.5, "
                                    "ver = ver + 1", (k % 50, f"b{k % 7}", rnd.random()))
                        cur.execute("DELETE FROM pair WHERE a = %s AND b = %s", (rnd.randrange(50), f"b{rnd.randrange(7)}"))
                    else:
                        cur.execute("INSERT INTO log VALUES (%s, 'x', %s), (%s, 'x', %s)", (k % 5, k % 3, k % 5, k % 3))
                        cur.execute("DELETE FROM log WHERE who = %s LIMIT 1", (rnd.randrange(5),))
                    cur.execute("COMMIT")
                    done[0] += 1
                except (pymysql.err.OperationalError, pymysql.err.IntegrityError) as exc:
                    if exc.args[0] not in (1213, 1205, 1062):  # deadlocks and key clashes between writers: retry
                        raise
                    cur.execute("ROLLBACK")
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)
    finally:
        conn.close()


def _diff(src: MariaDBServer, tgt: MariaDBServer) -> dict[str, Any]:
    """Per table: None when equal, else a sample of what differs."""
    out: dict[str, Any] = {}
    for t in TABLES:
        q = f"SELECT * FROM app.{t} ORDER BY " + ("1" if t == "acct" else "1, 2, 3")
        try:
            a, b = set(src.execute(q)), set(tgt.execute(q))
            a_list, b_list = src.execute(q), tgt.execute(q)
        except pymysql.err.MySQLError as exc:
            out[t] = str(exc)
            continue
        out[t] = None if a_list == b_list else {
            "source_rows": len(a_list), "target_rows": len(b_list),
            "only_source": sorted(a - b)[:3], "only_target": sorted(b - a)[:3]}
    return out


@pytest.mark.slow
def test_random_workload_with_sigkills_ends_equal(tmp_path: Path, redis_url: str) -> None:
    src = MariaDBServer(server_id=1).start()
    tgt = MariaDBServer(server_id=2).start()
    producer = applier = subprocess.Popen(["true"])  # replaced once the daemons start
    try:
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(
            tmp_path / "c.toml", src,
            source={"include_tables": ["app.*"], "start": "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])},
            producer={"id": "p1", "batch_max_events": 500, "batch_max_delay_ms": 100},
            transport={"url": redis_url, "stream": "e2e"},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 2000, "max_delay_ms": 300, "consumer_name": "a1"},
            target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"},
        )
        logs = tmp_path / "logs"
        logs.mkdir()
        producer = _daemon(cfg, "produce", logs / "producer.log")
        applier = _daemon(cfg, "apply", logs / "applier.log")
        src.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()])
        stop, done, errors = threading.Event(), [0], []
        writers = [threading.Thread(target=_writer, args=(src, stop, s, done, errors)) for s in range(4)]
        for w in writers:
            w.start()
        rnd = random.Random(1)
        kills = {"producer": 0, "applier": 0}
        try:
            for i in range(8):
                time.sleep(rnd.uniform(0.5, 2.0))
                if i == 4:  # schema change in the middle of the run
                    src.execute("ALTER TABLE app.acct ADD COLUMN region CHAR(2) NOT NULL DEFAULT 'eu'")
                name = "producer" if i % 2 == 0 else "applier"
                proc = producer if name == "producer" else applier
                assert proc.poll() is None, (logs / f"{name}.log").read_text()[-3000:]
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills[name] += 1
                if name == "producer":
                    producer = _daemon(cfg, "produce", logs / "producer.log")
                else:
                    applier = _daemon(cfg, "apply", logs / "applier.log")
        finally:
            stop.set()
            for w in writers:
                w.join()
        assert not errors, errors
        assert done[0] > 200, "the workload did not run"
        try:
            def caught_up() -> bool:
                for name, p in (("producer", producer), ("applier", applier)):
                    assert p.poll() is None, f"{name} exited {p.returncode}:\n" + (logs / f"{name}.log").read_text()[-3000:]
                return not any(_diff(src, tgt).values())

            wait_for(caught_up, timeout=180, what="the target to equal the source")
        except AssertionError:
            raise AssertionError(f"{_diff(src, tgt)}\nproducer:\n{(logs / 'producer.log').read_text()[-4000:]}\n"
                                 f"applier:\n{(logs / 'applier.log').read_text()[-4000:]}") from None
        for p in (producer, applier):
            p.send_signal(signal.SIGTERM)
            assert p.wait(60) == 0
        counts = {t: src.execute(f"SELECT COUNT(*) FROM app.{t}")[0][0] for t in TABLES}
        print(f"\n{done[0]} source transactions from 4 writers, kills {kills}, final rows {counts}")
    finally:
        for p in (producer, applier):
            if p.poll() is None:
                p.kill()
        src.destroy()
        tgt.destroy()
