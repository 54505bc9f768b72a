"""Freshness measured and exported, on real components: a MariaDB source
whose clock runs 30 s ahead (mariadbd under libfaketime), Redis, both
daemons as subprocesses with the default delay settings, the ColumnStore
target code on a second MariaDB (engine InnoDB), and a real Prometheus
(Debian ``prometheus``) scraping both daemons with deploy/alerts.yml loaded.

One run of single-row transactions, each committed at a known moment and
its row polled for on the target, feeds every test here: the applier's
histogram counts each transaction once and agrees with what the poller
saw, although the source's binlog timestamps are 30 s off (the measured
skew corrects them, and is exported and shown by `cynomys status`); and
Prometheus' HTTP API answers the freshness histogram, the up series and
the alert rules, all healthy."""
from __future__ import annotations

import glob
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.servers.mariadb import MariaDBServer, free_port
from tests.servers.prometheus import PrometheusServer
from tests.servers.redis import RedisServer

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).parents[2]
# Debian's libfaketime (package faketime), multi-threaded flavour (mariadbd has threads).
FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))), "libfaketimeMT.so.1")
SOURCE_AHEAD_S = 30.0
TRANSACTIONS = 80
EVERY_S = 0.05  # one transaction every 50 ms: several per envelope, several envelopes per flush


@dataclass
class Run:
    tmp: Path
    cfg: Path
    plisten: str
    alisten: str
    prometheus: PrometheusServer
    sent: dict[int, float]      # id -> wall time just before its autocommit INSERT was sent
    seen: dict[int, float]      # id -> wall time of the first poll that found it on the target
    metrics: dict[str, float]   # the applier's /metrics once it counted every transaction
    producer_metrics: dict[str, float]


def _scrape(listen: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def _skewed_source() -> MariaDBServer:
    """A source whose clock (NOW(), binlog event times) runs SOURCE_AHEAD_S ahead."""
    if not os.path.exists(FAKETIME):
        pytest.skip(f"libfaketime not installed ({FAKETIME}); apt-get install faketime")
    server = MariaDBServer(server_id=1)
    saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC")}
    os.environ.update(LD_PRELOAD=FAKETIME, FAKETIME=f"+{SOURCE_AHEAD_S:g}s", FAKETIME_DONT_FAKE_MONOTONIC="1")
    try:
        return server.start()  # the server process inherits the environment: only it runs faked
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _daemon(cfg: Path, cmd: str, listen: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CYNOMYS_METRICS_LISTEN": listen}
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", cmd, "-c", str(cfg)], cwd=ROOT, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("freshness")
    src = _skewed_source()
    tgt = MariaDBServer(server_id=2).start()
    redis = RedisServer()
    procs: list[subprocess.Popen[bytes]] = []
    prom: PrometheusServer | None = None
    logs = tmp / "logs"
    logs.mkdir()
    db = "fr_" + uuid.uuid4().hex[:6]
    try:
        keys = generate_keys(tmp / "keys", rsa_bits=2048)
        # The delay settings are the defaults ([producer] batch_max_delay_ms,
        # [applier] buffer_rows and max_delay_ms are not set).
        cfg = write_config(
            tmp / "c.toml", src,
            source={"include_tables": [f"{db}.*"], "start": "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])},
            producer={"id": "p1"}, transport={"url": redis.url, "stream": f"fr-{tmp.name}"},
            security={k: str(v) for k, v in keys.items()}, applier={"consumer_name": "a1"},
            target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"},
            metrics={"listen": "127.0.0.1:1", "health_interval_s": 1.0},
        )
        plisten, alisten = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        procs.append(_daemon(cfg, "produce", plisten, logs / "producer.log"))
        procs.append(_daemon(cfg, "apply", alisten, logs / "applier.log"))
        prom = PrometheusServer({plisten: "producer", alisten: "applier"}, rule_files=[ROOT / "deploy" / "alerts.yml"])

        def tails() -> str:
            return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.iterdir()))

        src.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10))")
        wait_for(lambda: _has_table(tgt, db), 90, "the table on the target")
        # The applier's clock thread has read the producer's record (it retries every 5 s until then).
        wait_for(lambda: _scrape(alisten).get("cynomys_applier_clock_skew_seconds{clock=source}", 0) > 1, 60,
                 "the applier's clock skew")

        # Prometheus holds the histogram before the first transaction: a
        # dashboard's increase() over the run starts from it (once, on a
        # loaded box, the first scrape came after the 4-s workload: p50 NaN).
        scraper = prom
        wait_for(lambda: [float(r["value"][1]) for r in scraper.query("cynomys_applier_freshness_seconds_count")]
                 == [0.0], 60, "Prometheus's first scrape of the applier")

        sent: dict[int, float] = {}
        seen: dict[int, float] = {}
        done = threading.Event()

        def poll() -> None:
            conn = tgt.connect()
            try:
                with conn.cursor() as cur:
                    while not done.is_set() and len(seen) < TRANSACTIONS:
                        cur.execute(f"SELECT id FROM {db}.t")
                        now = time.time()
                        for (i,) in cur.fetchall():
                            seen.setdefault(i, now)
                        time.sleep(0.01)
            finally:
                conn.close()

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        conn = src.connect()
        try:
            with conn.cursor() as cur:
                start = time.monotonic()
                for i in range(1, TRANSACTIONS + 1):
                    time.sleep(max(0.0, start + i * EVERY_S - time.monotonic()))
                    sent[i] = time.time()
                    cur.execute(f"INSERT INTO {db}.t VALUES (%s, 'x')", (i,))  # autocommit: one transaction each
        finally:
            conn.close()
        try:
            wait_for(lambda: len(seen) == TRANSACTIONS, 60, "every row on the target")
        except AssertionError:
            raise AssertionError(tails()) from None
        finally:
            done.set()
            poller.join()
        wait_for(lambda: _scrape(alisten).get("cynomys_applier_freshness_seconds_count", 0) >= TRANSACTIONS, 30,
                 "the applier to count every transaction")
        # One health interval more: status reads the report written every interval.
        time.sleep(2.5)
        yield Run(tmp, cfg, plisten, alisten, prom, sent, seen, _scrape(alisten), _scrape(plisten))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        if prom is not None:
            prom.stop()
        redis.stop()
        src.destroy()
        tgt.destroy()


def _has_table(tgt: MariaDBServer, db: str) -> bool:
    try:
        tgt.execute(f"SELECT 1 FROM {db}.t LIMIT 1")
        return True
    except Exception:
        return False


def test_metric_counts_each_transaction_and_agrees_with_the_poller(run: Run) -> None:
    m = run.metrics
    assert m["cynomys_applier_freshness_seconds_count"] == TRANSACTIONS  # one each, DDL not counted
    metric_mean = m["cynomys_applier_freshness_seconds_sum"] / TRANSACTIONS
    outside = [run.seen[i] - run.sent[i] for i in run.sent]
    outside_mean = statistics.mean(outside)
    # Default delays: about 1 s from commit to readable.  The metric's
    # commit times are estimated inside the binlog's whole seconds (each
    # off by at most half the time between two envelopes, unbiased), the
    # poller's visibility times are late by half its 10 ms period.  Without
    # the 30 s skew correction every observation would be 0 (or 30 s).
    print(f"\nfreshness mean: metric {metric_mean:.3f}s, poller {outside_mean:.3f}s "
          f"(poller p50 {statistics.median(outside):.3f}s, max {max(outside):.3f}s)")
    assert 0.2 < outside_mean < 5.0, outside
    assert abs(metric_mean - outside_mean) <= 0.1 * outside_mean + 0.05, (metric_mean, outside_mean, outside)
    last = m["cynomys_applier_freshness_last_flush_seconds"]
    assert 0.0 <= last <= max(outside) + 0.1, (last, outside)


def test_clock_skew_is_measured_exported_and_shown(run: Run) -> None:
    # Applier and producer share this host: the source is 30 s ahead of both.
    assert m_close(run.metrics["cynomys_applier_clock_skew_seconds{clock=source}"], SOURCE_AHEAD_S)
    assert abs(run.metrics["cynomys_applier_clock_skew_seconds{clock=producer}"]) < 0.05
    assert 0 <= run.metrics["cynomys_applier_clock_skew_uncertainty_seconds"] < 0.05
    assert m_close(run.producer_metrics["cynomys_producer_clock_skew_seconds{clock=source}"], SOURCE_AHEAD_S)
    assert abs(run.producer_metrics["cynomys_producer_clock_skew_seconds{clock=reference}"]) < 0.05
    out = subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "-c", str(run.cfg), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    fresh = report["applier"]["freshness"]
    assert fresh["transactions"] == TRANSACTIONS and fresh["p50_s"] <= fresh["p99_s"] <= fresh["max_s"], fresh
    assert m_close(fresh["clock"]["source_minus_applier_s"], SOURCE_AHEAD_S), fresh
    assert m_close(report["producer"]["clock"]["source_minus_producer_s"], SOURCE_AHEAD_S), report["producer"]
    text = subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "-c", str(run.cfg)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120).stdout
    line = next(x for x in text.splitlines() if x.strip().startswith("freshness:"))
    assert f"({TRANSACTIONS} transactions)" in line and "clock skew used: source +30.0" in line, line


def m_close(value: float, want: float) -> bool:
    return abs(value - want) < 0.5


def test_prometheus_scrapes_both_daemons(run: Run) -> None:
    prom = run.prometheus

    def up() -> dict[str, float]:
        return {r["metric"]["daemon"]: float(r["value"][1]) for r in prom.query('up{job="cynomys"}')}

    wait_for(lambda: up() == {"producer": 1.0, "applier": 1.0}, 30, "both daemons up in Prometheus")
    count = prom.query("cynomys_applier_freshness_seconds_count")
    assert [float(r["value"][1]) for r in count] == [TRANSACTIONS], count
    buckets = prom.query("cynomys_applier_freshness_seconds_bucket")
    assert len(buckets) > 40 and {r["metric"]["le"] for r in buckets} >= {"1.0", "+Inf"}, buckets
    # The quantile as a dashboard asks for it: over the whole run (its
    # transactions are all older than a scrape or two by now).
    p50 = prom.query("histogram_quantile(0.5, sum by (le) (increase(cynomys_applier_freshness_seconds_bucket[10m])))")
    outside = sorted(run.seen[i] - run.sent[i] for i in run.sent)
    assert p50 and math.isfinite(float(p50[0]["value"][1])), p50
    assert abs(float(p50[0]["value"][1]) - statistics.median(outside)) < 0.5, (p50, statistics.median(outside))
    skew = prom.query('cynomys_applier_clock_skew_seconds{clock="source"}')
    assert m_close(float(skew[0]["value"][1]), SOURCE_AHEAD_S), skew


def test_alert_rules_load_and_evaluate_against_the_daemons(run: Run) -> None:
    prom = run.prometheus

    def rules() -> list[dict[str, Any]]:
        return [r for g in prom.api("rules")["groups"] for r in g["rules"]]

    # Every rule evaluated at least once without an error, on real series.
    wait_for(lambda: all(r.get("lastEvaluation", "").startswith("2") and not r["lastEvaluation"].startswith("0001")
                         for r in rules()), 30, "every rule evaluated")
    got = rules()
    assert len(got) >= 10 and all(r["health"] == "ok" for r in got), [(r["name"], r.get("lastError")) for r in got]
    firing = prom.query('ALERTS{alertstate="firing"}')
    assert firing == [], firing  # a healthy pair of daemons
