"""Metrics and health (issue #16) on real servers: a MariaDB source, Redis,
and the ColumnStore target code on a second MariaDB (engine InnoDB), with
both daemons as subprocesses.  /metrics is parsed by the Prometheus
client's own text parser; /healthz of the applier turns unhealthy within
two health intervals of the target server stopping, and healthy again once
it is back; `cynomys status --json` reads the daemons' reports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cynomys.sandbox.daemons import stop_daemons
from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.servers.mariadb import MariaDBServer, free_port

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).parents[2]
INTERVAL = 1.5  # [metrics] health_interval_s


def _daemon(cfg: Path, cmd: str, listen: str, log: Path) -> subprocess.Popen[bytes]:
    # One config for both daemons, as on a single host: each gets its own
    # address from the environment.
    env = {**os.environ, "CYNOMYS_METRICS_LISTEN": listen}
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", cmd, "-c", str(cfg)], cwd=ROOT, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _metrics(listen: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}, through the client's parser."""
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _health(listen: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{listen}/healthz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _value(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def _unhealthy_within_two_intervals(listen: str, what: str) -> dict[str, Any]:
    """Poll /healthz right after ``what`` was stopped; the body of the first 503."""
    stopped = time.monotonic()
    while True:
        code, body = _health(listen)
        if code == 503:
            return body
        assert time.monotonic() - stopped <= 2 * INTERVAL + 0.5, (what, code, body)  # 0.5 s: polling, HTTP
        time.sleep(0.1)


def test_metrics_healthz_and_status(redis_url: str, tmp_path: Path) -> None:
    db = "met_" + uuid.uuid4().hex[:8]
    table = f"{db}.t"
    # Servers of the test's own: it stops them.
    mariadb = MariaDBServer(server_id=1).start()
    tgt = MariaDBServer(server_id=2).start()
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(
            tmp_path / "c.toml", mariadb,
            source={"include_tables": [f"{db}.*"],
                    "start": "{}:{}".format(*mariadb.execute("SHOW MASTER STATUS")[0][:2])},
            producer={"id": "p1", "batch_max_delay_ms": 100},
            transport={"url": redis_url, "stream": f"met-{tmp_path.name}"},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 1000, "max_delay_ms": 200, "consumer_name": "a1"},
            target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"},
            metrics={"listen": "127.0.0.1:1", "health_interval_s": INTERVAL, "max_lag_s": 600.0},
        )
        plisten, alisten = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        procs.append(_daemon(cfg, "produce", plisten, logs / "producer.log"))
        procs.append(_daemon(cfg, "apply", alisten, logs / "applier.log"))

        def logs_tail() -> str:
            return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.iterdir()))

        mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20))",
                        f"INSERT INTO {table} SELECT seq, 'a' FROM {db}.seq_1_to_50",
                        f"UPDATE {table} SET v = 'b' WHERE id <= 10")

        def applied(n: int) -> bool:
            try:
                return tgt.execute(f"SELECT count(*) FROM {table}")[0][0] == n
            except Exception:
                return False

        wait_for(lambda: applied(50), 90, "the rows on the target")
        wait_for(lambda: _value(_metrics(alisten), "cynomys_applier_rows_out_total", table=table) >= 50, 30,
                 "the applier's rows_out")
        pm, am = _metrics(plisten), _metrics(alisten)
        # 50 inserts + 10 updates read; folded per key within a batch: at most 60 out, at least 50.
        assert _value(pm, "cynomys_producer_events_in_total", table=table) == 60, pm
        assert 50 <= _value(pm, "cynomys_producer_rows_out_total", table=table) <= 60
        assert _value(pm, "cynomys_producer_batches_total") >= 1
        assert _value(pm, "cynomys_producer_envelope_bytes_total") > 0
        assert _value(pm, "cynomys_producer_binlog_bytes_read_total") > 0
        assert _value(pm, "cynomys_producer_leader") == 1
        assert _value(am, "cynomys_applier_rows_in_total", table=table) >= 50
        assert _value(am, "cynomys_applier_rows_out_total", table=table) >= 50
        assert _value(am, "cynomys_applier_envelopes_total") >= 1
        assert _value(am, "cynomys_applier_envelope_bytes_total") > 0
        assert _value(am, "cynomys_applier_flush_duration_seconds_count") >= 1
        assert _value(am, "cynomys_applier_envelopes_rejected_total", reason="bad-signature") == 0
        wait_for(lambda: _health(plisten)[0] == 200 and _health(alisten)[0] == 200, 30,
                 "both daemons healthy")
        # Idle and caught up: no lag on either side (real values, from the source's binlog end).
        wait_for(lambda: _value(_metrics(plisten), "cynomys_producer_lag_bytes") == 0, 30, "producer lag 0")
        assert _value(_metrics(plisten), "cynomys_producer_lag_seconds") == 0
        wait_for(lambda: _value(_metrics(alisten), "cynomys_applier_lag_seconds") == 0, 30, "applier lag 0")
        am = _metrics(alisten)
        assert _value(am, "cynomys_applier_lag_bytes") == 0 and _value(am, "cynomys_applier_buffer_rows") == 0
        assert _value(am, "cynomys_applier_reachable") == 1 and _value(am, "cynomys_applier_healthy") == 1
        assert _value(_metrics(plisten), "cynomys_producer_reachable") == 1

        # `status --json`: from the daemons' reports (written every interval) and Redis.
        wait_for(lambda: (tmp_path / "applier-state" / "applier.health.json").exists(), 30, "the health report")
        out = subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "-c", str(cfg), "--json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert status["applier"]["sequence"] >= 1 and status["applier"]["health"]["status"] == "healthy", status
        assert status["producer"]["health"]["status"] == "healthy", status
        assert status["transport"]["reachable"] is True and status["transport"]["last_sequence"] >= 1, status

        assert isinstance(status["transport"]["unacknowledged"], int) and status["transport"]["dead_letters"] == 0

        # The target stops: unhealthy within two intervals, saying why.
        tgt.stop()
        body = _unhealthy_within_two_intervals(alisten, "the target")
        assert any("target" in r for r in body["reasons"]), body
        assert _value(_metrics(alisten), "cynomys_applier_healthy") == 0

        # Back again: healthy, and replication goes on.
        tgt.start()
        wait_for(lambda: _health(alisten)[0] == 200, 90, "the applier healthy again")
        mariadb.execute(f"INSERT INTO {table} VALUES (51, 'c')")
        wait_for(lambda: applied(51), 90, "replication after the target came back")

        # The same for the producer and its source.
        mariadb.stop()
        body = _unhealthy_within_two_intervals(plisten, "the source")
        assert any("source" in r for r in body["reasons"]), body
        assert _value(_metrics(plisten), "cynomys_producer_reachable") == 0
        mariadb.start()
        wait_for(lambda: _health(plisten)[0] == 200, 90, "the producer healthy again")
        mariadb.execute(f"INSERT INTO {table} VALUES (52, 'd')")
        wait_for(lambda: applied(52), 90, "replication after the source came back")
        for p in procs:
            assert p.poll() is None, logs_tail()
    finally:
        stop_daemons(procs, 60)
        tgt.destroy()
        mariadb.destroy()
