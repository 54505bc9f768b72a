"""End to end into DuckDB: MariaDB -> producer -> Redis -> applier -> a DuckDB
file, with both daemons killed with SIGKILL while 4 clients write (the
workload of test_e2e_columnstore.py: keyed, composite-key and keyless tables,
a key change, an ADD COLUMN mid-run).  At the end every target table equals
its source table row by row, read by another process while the applier
keeps running (the file is open only during a flush)."""
from __future__ import annotations

import datetime
import random
import signal
import subprocess
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.integration.test_e2e_columnstore import TABLES, _daemon, _writer
from tests.servers.mariadb import MariaDBServer

duckdb = pytest.importorskip("duckdb", reason="the duckdb extra is not installed (pip install 'cynomys[duckdb]')")
from cynomys.applier.targets.duckdb.target import DuckDBTarget  # noqa: E402  (needs duckdb)
from cynomys.applier.targets.duckdb.types import duck_type  # noqa: E402

pytestmark = [pytest.mark.integration]


def _norm(v: Any) -> Any:
    """One domain for both sides: TIMESTAMP as naive UTC (the source session
    runs in UTC), SET as its text."""
    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    if isinstance(v, (set, frozenset)):
        return ",".join(sorted(v))
    return v


def _target_tables(path: Path) -> dict[str, list[tuple[Any, ...]]] | None:
    """Every table of the file read like any other process would (read-only,
    one short connection); None while the applier holds the file for a flush."""
    try:
        conn = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for table in TABLES:
            cols = DuckDBTarget.columns(conn, "app", table)
            types = [duck_type(c) for c in cols]
            exprs = ", ".join(t.select.format(c='"' + c.name.replace('"', '""') + '"') for t, c in zip(types, cols))
            rows = conn.execute(f'SELECT {exprs} FROM "app"."{table}"').fetchall() if cols else []
            out[table] = sorted(tuple(_norm(None if v is None else t.decode(v)) for t, v in zip(types, r)) for r in rows)
        return out
    finally:
        conn.close()


def _source_rows(src: MariaDBServer, table: str) -> list[tuple[Any, ...]]:
    rows = src.execute("SET time_zone = '+00:00'", f"SELECT * FROM app.{table}")
    return sorted(tuple(_norm(v) for v in r) for r in rows)


def _diff(src: MariaDBServer, path: Path) -> dict[str, Any]:
    target = _target_tables(path)
    if target is None:
        return {"file": "held by the applier"}
    out: dict[str, Any] = {}
    for t in TABLES:
        a, b = _source_rows(src, t), target[t]
        out[t] = None if a == b else {"source_rows": len(a), "target_rows": len(b),
                                      "only_source": [r for r in a if r not in b][:2],
                                      "only_target": [r for r in b if r not in a][:2]}
    return out


@pytest.mark.slow
def test_random_workload_with_sigkills_ends_equal_in_duckdb(tmp_path: Path, redis_url: str) -> None:
    src = MariaDBServer(server_id=1).start()
    replica = tmp_path / "replica.duckdb"
    producer = applier = subprocess.Popen(["true"])  # replaced once the daemons start
    try:
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(
            tmp_path / "c.toml", src,
            source={"include_tables": ["app.*"], "start": "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])},
            producer={"id": "p1", "batch_max_events": 500, "batch_max_delay_ms": 100},
            transport={"url": redis_url, "stream": "e2e-duck"},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 2000, "max_delay_ms": 300, "consumer_name": "a1"},
            target={"kind": "duckdb", "url": str(replica)},
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
        rnd = random.Random(2)
        try:
            for i in range(6):
                time.sleep(rnd.uniform(0.5, 2.0))
                if i == 3:  # schema change in the middle of the run
                    src.execute("ALTER TABLE app.acct ADD COLUMN region CHAR(2) NOT NULL DEFAULT 'eu'")
                name = "producer" if i % 2 == 0 else "applier"
                proc = producer if name == "producer" else applier
                assert proc.poll() is None, (logs / f"{name}.log").read_text()[-3000:]
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                if name == "producer":
                    producer = _daemon(cfg, "produce", logs / "producer.log")
                else:
                    applier = _daemon(cfg, "apply", logs / "applier.log")
        finally:
            stop.set()
            for w in writers:
                w.join()
        assert not errors, errors
        assert done[0] > 100, "the workload did not run"

        def caught_up() -> bool:
            for name, p in (("producer", producer), ("applier", applier)):
                assert p.poll() is None, f"{name} exited {p.returncode}:\n" + (logs / f"{name}.log").read_text()[-3000:]
            time.sleep(1.0)  # a reader now and then, as an analyst would
            return not any(_diff(src, replica).values())

        try:
            wait_for(caught_up, timeout=240, what="the DuckDB file to equal the source")
        except AssertionError:
            raise AssertionError(f"{_diff(src, replica)}\napplier:\n{(logs / 'applier.log').read_text()[-4000:]}") from None
        # The values kept their types, not only their text.
        tables = _target_tables(replica)
        acct = tables["acct"] if tables else []
        assert acct and isinstance(acct[0][2], Decimal) and isinstance(acct[0][5], datetime.datetime)
        for p in (producer, applier):
            p.send_signal(signal.SIGTERM)
            assert p.wait(60) == 0
    finally:
        for p in (producer, applier):
            if p.poll() is None:
                p.kill()
        src.destroy()
