"""A Redis writer raises the producer's sequence state while the daemons run.

``HSET <stream>:seq <producer> 1000000`` made the publish script answer
"already holds" for every later envelope: nothing was written, the producer
moved its checkpoint on, the applier saw an idle stream, and the rows never
arrived -- with no error anywhere.  Now the producer checks each such answer
against the stream entry and stops with a one-line terminal error.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).parents[2]



def _daemon(cfg: Path, cmd: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(cfg)],
                            cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=dict(os.environ))


def _producer_state(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "producer-state" / "producer.json").read_text()))


def _rows(tgt: MariaDBServer) -> int:
    try:
        return int(tgt.execute("SELECT COUNT(*) FROM w.k")[0][0])
    except Exception:  # the table is not there yet
        return 0


def test_raised_sequence_state_stops_the_producer(fresh_mariadb: MariaDBServer, target: MariaDBServer,
                                                  redis_url: str, tmp_path: Path) -> None:
    src = fresh_mariadb
    stream, producer = f"tamper-{tmp_path.name}", "p1"
    seq_key = f"{stream}:seq"
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    cfg = write_config(
        tmp_path / "c.toml", src,
        source={"include_tables": ["w.*"], "start": "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])},
        producer={"id": producer, "batch_max_events": 100, "batch_max_delay_ms": 100},
        transport={"url": redis_url, "stream": stream},
        security={k: str(v) for k, v in keys.items()},
        applier={"max_delay_ms": 200, "consumer_name": "a1"},
        target={"kind": "columnstore", "url": target.url, "engine": "InnoDB"},
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    prod = _daemon(cfg, "produce", logs / "producer.log")
    app = _daemon(cfg, "apply", logs / "applier.log")
    r = redis.Redis.from_url(redis_url)
    try:
        src.execute("CREATE DATABASE w", "CREATE TABLE w.k (id INT PRIMARY KEY, v INT)",
                    *[f"INSERT INTO w.k VALUES ({i}, {i})" for i in range(10)])
        wait_for(lambda: _rows(target) == 10, timeout=60, what="the first rows on the target")

        def settled() -> bool:  # the state is saved about once a second when idle
            st = _producer_state(tmp_path)
            return st["pending"] is None and int(st["seq"]) == int(r.hget(seq_key, producer) or 0)

        wait_for(settled, timeout=10, what="the producer's state to record what it sent")
        shipped = _producer_state(tmp_path)
        sent = int(shipped["seq"])
        entries = r.xlen(stream)
        assert sent >= 1 and int(r.hget(seq_key, producer) or 0) == sent

        r.hset(seq_key, producer, 1_000_000)  # the operator mistake, or an attacker
        src.execute(*[f"INSERT INTO w.k VALUES ({i}, {i})" for i in range(10, 20)])
        t0 = time.monotonic()
        rc = prod.wait(timeout=30)
        took = time.monotonic() - t0
        assert rc != 0
        assert took < 10, f"the producer took {took:.1f}s to stop"
        lines = (logs / "producer.log").read_text().splitlines()
        errors = [ln for ln in lines if ln.startswith("cynomys: terminal error:")]
        assert len(errors) == 1, lines[-20:]
        err = errors[0]
        assert f"stream {stream}" in err and f"producer {producer!r}" in err and f"{seq_key} says 1000000" in err
        assert f"envelope {sent + 1} " in err
        fix = re.search(rf"HSET {re.escape(seq_key)} {producer} (\d+)", err)
        assert fix is not None and int(fix.group(1)) == sent, err

        # Nothing reported as shipped: the state still ends at the last real
        # envelope, the batch is pending, the stream got nothing.
        state = _producer_state(tmp_path)
        assert int(state["seq"]) == sent and state["checkpoint"] == shipped["checkpoint"]
        assert state["pending"] is not None and int(state["pending"]["seq"]) == sent + 1
        assert r.xlen(stream) == entries
        time.sleep(1.0)
        assert app.poll() is None and _rows(target) == 10

        # The fix the message gives: the restarted producer sends the rest.
        r.hset(seq_key, producer, int(fix.group(1)))
        prod = _daemon(cfg, "produce", logs / "producer.log")
        wait_for(lambda: _rows(target) == 20, timeout=60, what="the rows sent after the repair")
        assert target.execute("SELECT id, v FROM w.k ORDER BY id") == [(i, i) for i in range(20)]
    finally:
        for p in (prod, app):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        r.close()
