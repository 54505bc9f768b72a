"""The producer killed with SIGKILL at random points, and a 200k-row transaction.

The records written to the (file) transport across all the producer's lives
are replayed into a model of the target the way an applier would; the model
must equal the source table, with no transaction applied twice.
"""
from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pymysql
import pytest

from cynomys.core.config import load_config
from cynomys.core.model import Batch, Op
from cynomys.transport.keys import generate_keys
from tests.helpers import transport_batches, whole_transactions, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _setup(tmp_path: Path, srv: MariaDBServer, **producer: Any) -> Path:
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    return write_config(
        tmp_path / "c.toml", srv,
        source={"include_tables": ["w.*"], "start": "earliest"},
        producer={"id": "p1", "batch_max_events": 200, "batch_max_delay_ms": 50, **producer},
        transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
        security={k: str(v) for k, v in keys.items()},
    )


def _produce(cfg: Path, *extra: str, level: str = "WARNING", **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", level, "produce", "-c", str(cfg), *extra],
                            cwd=Path(__file__).parents[2], **kw)


def _batches(cfg_path: Path) -> list[tuple[int, Batch]]:
    return transport_batches(load_config(cfg_path, env={}))


def _replay(batches: list[tuple[int, Batch]]) -> tuple[dict[tuple[Any, ...], tuple[Any, ...]], Counter[tuple[Any, ...]], list[str]]:
    """Apply batches as an applier would; fail on any double application."""
    keyed: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    keyless: Counter[tuple[Any, ...]] = Counter()
    tids: list[str] = []
    for _, changes in whole_transactions(batches):
        for c in changes:
            if c.op is Op.DDL:
                continue
            assert c.schema is not None
            if c.schema.key:
                if c.before is not None and c.op is not Op.INSERT:
                    k = c.key(c.before)
                    # The before image's key may be missing where the fold left a
                    # tombstone (an insert, then a delete in a later transaction of
                    # one envelope: reducer/fold.py) -- a DELETE, or an UPDATE when
                    # the key came back: applied as the applier does (delete the
                    # key if there, then insert), the final state is what counts.
                    keyed.pop(k, None)
                if c.after is not None:
                    k = c.key(c.after)
                    assert k not in keyed, f"key {k} inserted twice (tid {c.tid})"
                    keyed[k] = c.after
            else:
                if c.before is not None:
                    keyless[c.before] -= 1
                if c.after is not None:
                    keyless[c.after] += 1
            tids.append(c.tid)
    return keyed, +keyless, tids


def _workload(srv: MariaDBServer, stop: threading.Event, seed: int, counter: list[int]) -> None:
    rnd = random.Random(seed)
    conn = srv.connect("w")
    with conn.cursor() as cur:
        while not stop.is_set():
            k = rnd.randrange(300)
            cur.execute("BEGIN")
            choice = rnd.random()
            try:
                if choice < 0.45:
                    cur.execute("INSERT INTO t VALUES (%s, %s, 0) ON DUPLICATE KEY UPDATE v = v + 1, ver = ver + 1",
                                (k, rnd.randrange(1000)))
                elif choice < 0.7:
                    cur.execute("UPDATE t SET v = v + 1, ver = ver + 1 WHERE id BETWEEN %s AND %s", (k, k + 5))
                elif choice < 0.8:
                    cur.execute("UPDATE t SET id = id + 1000 WHERE id = %s", (k,))
                elif choice < 0.9:
                    cur.execute("DELETE FROM t WHERE id = %s", (k,))
                else:
                    cur.execute("INSERT INTO n VALUES (%s, %s)", (k % 7, k % 3))
                    cur.execute("DELETE FROM n WHERE a = %s LIMIT 1", (rnd.randrange(7),))
                cur.execute("COMMIT")
            except (pymysql.err.IntegrityError, pymysql.err.OperationalError) as exc:
                if exc.args[0] not in (1062, 1213, 1205):  # key clash, deadlock, lock wait: the next one
                    raise
                cur.execute("ROLLBACK")
                continue
            counter[0] += 1
    conn.close()


def test_sigkill_at_random_points_loses_and_duplicates_nothing(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    srv = fresh_mariadb
    srv.execute("CREATE DATABASE w", "CREATE TABLE w.t (id int primary key, v int, ver int)", "CREATE TABLE w.n (a int, b int)")
    cfg = _setup(tmp_path, srv)
    stop = threading.Event()
    counter = [0]
    writers = [threading.Thread(target=_workload, args=(srv, stop, s, counter)) for s in range(2)]
    for w in writers:
        w.start()
    rnd = random.Random(7)
    kills = 0
    try:
        for _ in range(6):
            p = _produce(cfg)
            time.sleep(rnd.uniform(0.3, 1.5))
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert counter[0] > 100, "the workload did not run"
    drain = _produce(cfg, "--once")
    assert drain.wait(120) == 0
    keyed, keyless, tids = _replay(_batches(cfg))
    src = {(r[0],): r for r in srv.execute("SELECT id, v, ver FROM w.t")}
    assert keyed == src
    assert keyless == Counter(tuple(r) for r in srv.execute("SELECT a, b FROM w.n"))
    print(f"\n{kills} SIGKILLs, {counter[0]} source transactions, {len(tids)} net changes replayed")


def test_one_transaction_of_200k_rows_keeps_memory_bounded(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    srv = fresh_mariadb
    srv.execute("CREATE DATABASE w", "CREATE TABLE w.big (id int primary key, pad varchar(100), n double)")
    rows = 200_000
    conn = srv.connect("w")
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        for start in range(0, rows, 10_000):
            cur.execute("INSERT INTO big VALUES " + ",".join(
                f"({i}, REPEAT('x', 100), {i}.5)" for i in range(start, start + 10_000)))
        cur.execute("COMMIT")
    conn.close()
    cfg = _setup(tmp_path, srv, batch_max_events=5000)
    p = _produce(cfg, "--once", level="INFO", stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()
    peak_mb = float(re.search(rb"peak RSS ([0-9.]+) MB", err).group(1))  # type: ignore[union-attr]
    batches = _batches(cfg)
    assert sum(1 for _, b in batches for c in b.changes if c.op is Op.INSERT) == rows
    assert all(not b.complete for _, b in batches[:-1]) and batches[-1][1].complete
    print(f"\n200k-row transaction: {len(batches)} envelopes, producer peak RSS {peak_mb:.0f} MB")
    # The whole transaction decoded at once would hold 200k Python row tuples
    # (~150 MB); batches of 5000 keep the producer near its baseline.
    assert peak_mb < 200, f"producer peak RSS {peak_mb:.0f} MB"
