"""End to end: MariaDB -> producer -> Redis -> applier -> MariaDB (ColumnStore
target code with engine InnoDB), with both daemons killed with SIGKILL
several times while 4 clients write.  At the end every target table equals
its source table row by row."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

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


def _daemon(cfg: Path, cmd: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(cfg)],
                            cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})


def _applier_names(appliers: int) -> list[str]:
    """Daemon names of the appliers: "applier", or "applier0".."applier<N-1>"
    for partitioned appliers (partition i runs with CYNOMYS_APPLIER_PARTITION=i)."""
    return ["applier"] if appliers == 1 else [f"applier{i}" for i in range(appliers)]


def _start_applier(cfg: Path, name: str, logs: Path) -> subprocess.Popen[bytes]:
    env = {"CYNOMYS_APPLIER_PARTITION": name[len("applier"):]} if name != "applier" else None
    return _daemon(cfg, "apply", logs / f"{name}.log", env)


def _write_loop(src: MariaDBServer, stop: threading.Event, seed: int, done: list[int],
                errors: list[BaseException], txn: Callable[[Any, random.Random, int], None],
                database: str | None = "app") -> None:
    """Run ``txn`` as one source transaction after another until ``stop``;
    deadlocks, lock waits and key clashes between writers are rolled back and
    the next one goes on, anything else is handed to the test.  ``database``:
    the connection's default database (None: the transactions name theirs)."""
    rnd = random.Random(seed)
    conn = src.connect(database)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                try:
                    cur.execute("BEGIN")
                    txn(cur, rnd, seed)
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


def _mixed_txn(cur: Any, rnd: random.Random, seed: int) -> None:
    k = rnd.randrange(400)
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


def _small_txn(cur: Any, rnd: random.Random, seed: int) -> None:
    if rnd.random() < 0.04:
        base = rnd.randrange(400)
        for i in range(rnd.randrange(20, 50)):
            cur.execute("INSERT INTO log VALUES (%s, 'big', %s)", (seed, i))
            cur.execute("UPDATE acct SET ver = ver + 1 WHERE id = %s", ((base + i) % 400,))
        cur.execute("DELETE FROM log WHERE who = %s AND what = 'big' LIMIT 40", (seed,))
    else:
        k = rnd.randrange(400)
        cur.execute("INSERT INTO acct (id, owner, balance, ver) VALUES (%s, 'o', 1, 0) "
                    "ON DUPLICATE KEY UPDATE balance = balance + 1, ver = ver + 1", (k,))
        if rnd.random() < 0.3:
            cur.execute("DELETE FROM acct WHERE id = %s", (rnd.randrange(400),))
        if rnd.random() < 0.3:
            cur.execute("INSERT INTO pair VALUES (%s, 'b', 0, 0) ON DUPLICATE KEY UPDATE ver = ver + 1",
                        (k % 50,))


def _writer(src: MariaDBServer, stop: threading.Event, seed: int, done: list[int], errors: list[BaseException]) -> None:
    _write_loop(src, stop, seed, done, errors, _mixed_txn)


def _small_writer(src: MariaDBServer, stop: threading.Event, seed: int, done: list[int],
                  errors: list[BaseException]) -> None:
    """Many small transactions (1-3 rows), and now and then one of 60-150
    row changes: with batch_max_events = 50 the producer cuts those into
    fragments between small ones, all the time."""
    _write_loop(src, stop, seed, done, errors, _small_txn)


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


def _keep_artifacts(tmp_path: Path, cfg: Path, diff: dict[str, Any]) -> Path:
    """On failure: the daemons' logs, the config and every envelope on the
    transport (sequence, span, change counts) in one folder that outlives
    the test (``CYNOMYS_ARTIFACTS``, default ./artifacts)."""
    from cynomys.core.config import load_config
    from tests.helpers import transport_batches

    out = Path(os.environ.get("CYNOMYS_ARTIFACTS", ROOT / "artifacts")) / f"{tmp_path.name}-{int(time.time())}"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tmp_path / "logs", out / "logs", dirs_exist_ok=True)
    shutil.copy(cfg, out / "cynomys.toml")
    for state in ("producer-state", "applier-state"):
        if (tmp_path / state).exists():
            shutil.copytree(tmp_path / state, out / state, dirs_exist_ok=True)
    lines = [json.dumps({"diff": diff}, default=str)]
    try:
        for seq, b in transport_batches(load_config(cfg, env={})):
            lines.append(json.dumps({
                "seq": seq, "complete": b.complete, "meta": b.meta, "end": str(b.end),
                "first_txn": str(b.first_txn), "changes": len(b.changes),
                "tids": sorted({c.tid for c in b.changes})}))
    except Exception as exc:  # the artifacts are best effort; the failure itself is raised by the caller
        lines.append(json.dumps({"transport_error": repr(exc)}))
    (out / "envelopes.jsonl").write_text("\n".join(lines) + "\n")
    return out


def _reports_caught_up(tmp_path: Path, src: MariaDBServer, appliers: int = 1) -> bool:
    """producer.json has read to the source's binlog end and sent it all;
    applier.json (each partition's applier.p<i>.json) holds the producer's last envelope."""
    names = ["applier.json"] if appliers == 1 else [f"applier.p{i}.json" for i in range(appliers)]
    try:
        prod = json.loads((tmp_path / "producer-state" / "producer.json").read_text())
        apps = [json.loads((tmp_path / "applier-state" / n).read_text()) for n in names]
    except (OSError, ValueError):
        return False
    file, pos = src.execute("SHOW MASTER STATUS")[0][:2]
    read = prod.get("read") or {}
    return (read.get("file"), read.get("pos")) == (file, pos) and prod.get("pending") is None \
        and all(int(app.get("seq", 0)) >= int(prod.get("seq", 0)) for app in apps)


class MariaDBSide:
    """The target as a second MariaDB (the ColumnStore target code, engine InnoDB)."""

    def __init__(self, src: MariaDBServer) -> None:
        self.src = src
        self.tgt = MariaDBServer(server_id=2).start()
        self.config: dict[str, Any] = {"kind": "columnstore", "url": self.tgt.url, "engine": "InnoDB"}
        self.extra: dict[str, Any] = {}

    def diff(self, cfg: Path) -> dict[str, Any]:
        return _diff(self.src, self.tgt)

    def destroy(self) -> None:
        self.tgt.destroy()


class OneProducer:
    """The harness's producer: one process, SIGKILLed and started again.
    (tests/integration/test_ha.py has the HA pair: leader and standby.)"""

    def __init__(self, cfg: Path, logs: Path, redis_url: str) -> None:
        self.cfg, self.logs = cfg, logs
        self.proc = _daemon(cfg, "produce", logs / "producer.log")

    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [self.proc]

    def log_tail(self) -> str:
        return (self.logs / "producer.log").read_text()[-4000:]

    def check(self) -> None:
        assert self.proc.poll() is None, f"producer exited {self.proc.returncode}:\n" + self.log_tail()[-3000:]

    def kill(self) -> None:
        self.check()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = _daemon(self.cfg, "produce", self.logs / "producer.log")


def _kill(name: str, prods: Any, apps: dict[str, subprocess.Popen[bytes]], cfg: Path, logs: Path) -> None:
    """One kill of the run: the producer (``prods`` restarts it), or applier
    ``name`` with SIGKILL, started again at once."""
    if name == "producer":
        prods.kill()
        return
    assert apps[name].poll() is None, (logs / f"{name}.log").read_text()[-3000:]
    apps[name].send_signal(signal.SIGKILL)
    apps[name].wait()
    apps[name] = _start_applier(cfg, name, logs)


def _run(tmp_path: Path, redis_url: str, *, writer: Any, batch_max_events: int, kills: list[str],
         alter_at: int | None, target: Callable[[MariaDBServer], Any] = MariaDBSide, write_s: float = 0.0,
         catch_up_s: float = 180, applier: dict[str, Any] | None = None, producer: dict[str, Any] | None = None,
         producers: Callable[[Path, Path, str], Any] = OneProducer, appliers: int = 1,
         binlog_compress: bool = False) -> Path:
    """Writers and kills, then wait until the target equals the source.
    ``write_s``: keep writing at least this long (kills spread over it).
    ``producers`` starts the producer process(es) and kills "the" producer.
    ``appliers``: that many partitioned appliers ([applier] partitions), named
    "applier0".. in ``kills``.  ``binlog_compress``: the source writes
    compressed binlog events (log_bin_compress)."""
    src = MariaDBServer(server_id=1, binlog_compress=binlog_compress).start()
    side = target(src)
    prods: Any = None
    names = _applier_names(appliers)
    apps = {n: subprocess.Popen(["true"]) for n in names}  # replaced once the daemons start
    if appliers > 1:
        applier = {"partitions": appliers, "progress_interval_ms": 2000, **(applier or {})}
    try:
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(
            tmp_path / "c.toml", src,
            source={"include_tables": ["app.*"], "start": "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])},
            producer={"id": "p1", "batch_max_events": batch_max_events, "batch_max_delay_ms": 100, **(producer or {})},
            transport={"url": redis_url, "stream": f"e2e-{tmp_path.name}"},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 2000, "max_delay_ms": 300, "consumer_name": "a1", **(applier or {})},
            target=side.config, **side.extra,
        )
        logs = tmp_path / "logs"
        logs.mkdir()
        prods = producers(cfg, logs, redis_url)
        for name in names:
            apps[name] = _start_applier(cfg, name, logs)
        src.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()])
        stop, done, errors = threading.Event(), [0], []
        writers = [threading.Thread(target=writer, args=(src, stop, s, done, errors)) for s in range(4)]
        for w in writers:
            w.start()
        rnd = random.Random(1)
        counted = dict.fromkeys(["producer", *names], 0)
        pause = (0.5, 2.0) if not write_s else (0.5 * write_s / max(1, len(kills)), 1.5 * write_s / max(1, len(kills)))
        started = time.monotonic()
        try:
            for i, name in enumerate(kills):
                time.sleep(rnd.uniform(*pause))
                if i == alter_at:  # schema change in the middle of the run
                    src.execute("ALTER TABLE app.acct ADD COLUMN region CHAR(2) NOT NULL DEFAULT 'eu'")
                counted[name] += 1
                _kill(name, prods, apps, cfg, logs)
            time.sleep(max(0.0, write_s - (time.monotonic() - started)))
        finally:
            stop.set()
            for w in writers:
                w.join()
        assert not errors, errors
        assert done[0] > 200, "the workload did not run"
        stopped = time.monotonic()
        try:
            def caught_up() -> bool:
                prods.check()
                for name, p in apps.items():
                    assert p.poll() is None, f"{name} exited {p.returncode}:\n" + (logs / f"{name}.log").read_text()[-3000:]
                # Compare the tables (dear on Spark: it competes with the
                # applier for the CPU) only once the daemons' own reports say
                # the applier took everything the producer sent.
                if not _reports_caught_up(tmp_path, src, appliers):
                    time.sleep(0.5)
                    return False
                return not any(side.diff(cfg).values())

            wait_for(caught_up, timeout=catch_up_s, what="the target to equal the source")
        except AssertionError as exc:
            last = side.diff(cfg)
            kept = _keep_artifacts(tmp_path, cfg, last)
            tails = "".join(f"{n}:\n{(logs / f'{n}.log').read_text()[-4000:]}\n" for n in names)
            raise AssertionError(f"{exc}\n{last}\nartifacts kept in {kept}\n"
                                 f"producer:\n{prods.log_tail()}\n{tails}") from None
        equal_after = time.monotonic() - stopped
        for p in [*prods.procs(), *apps.values()]:
            p.send_signal(signal.SIGTERM)
        for p in [*prods.procs(), *apps.values()]:
            assert p.wait(120) == 0
        counts = {t: src.execute(f"SELECT COUNT(*) FROM app.{t}")[0][0] for t in TABLES}
        print(f"\n{done[0]} source transactions from 4 writers in {stopped - started:.0f}s, kills {counted}, "
              f"final rows {counts}; target equal {equal_after:.1f}s after the writers stopped")
        return cfg
    finally:
        for p in [*(prods.procs() if prods is not None else []), *apps.values()]:
            if p.poll() is None:
                p.kill()
        src.destroy()
        side.destroy()


@pytest.mark.slow
def test_random_workload_with_sigkills_ends_equal(tmp_path: Path, redis_url: str) -> None:
    """Both daemons killed 4 times each, an ALTER half way.  Run it in a loop
    with ``scripts/kill_loop.sh 20`` (keeps the artifacts of a failure)."""
    _run(tmp_path, redis_url, writer=_writer, batch_max_events=500, kills=["producer", "applier"] * 4, alter_at=4)


@pytest.mark.slow
def test_compressed_binlog_with_sigkills_ends_equal(tmp_path: Path, redis_url: str) -> None:
    """The same with log_bin_compress = ON (every event over 10 bytes
    compressed): both daemons killed 4 times each, an ALTER half way."""
    _run(tmp_path, redis_url, writer=_writer, batch_max_events=500, kills=["producer", "applier"] * 4, alter_at=4,
         binlog_compress=True)


@pytest.mark.slow
def test_busy_source_small_transactions_8_producer_kills(tmp_path: Path, redis_url: str) -> None:
    """batch_max_events = 50 on a busy source of small transactions with a
    large one now and then: batches end inside transactions all the time."""
    from cynomys.core.config import load_config
    from tests.helpers import transport_batches

    cfg = _run(tmp_path, redis_url, writer=_small_writer, batch_max_events=50, kills=["producer"] * 8, alter_at=None)
    fragments = sum(1 for _, b in transport_batches(load_config(cfg, env={})) if not b.complete)
    assert fragments > 0, "no batch was cut inside a transaction: the test did not test that"
