"""Freshness measured from outside (issue #28): source commit -> row readable on the target.

    python bench/freshness.py [--targets columnstore,duckdb,spark] [--seconds 120] [--warmup 30]
                              [--rate 100] [--set applier.max_delay_ms=500 ...] [--out freshness]

Per target, on throwaway servers (a MariaDB source, Redis, the target) with
both daemons as subprocesses and the default delay settings ([producer]
batch_max_delay_ms, [applier] buffer_rows / max_delay_ms not set, unless
``--set`` says otherwise):

- 2 writers run the mixed workload of tests/integration/test_e2e_columnstore
  (multi-row inserts, range updates, deletes, key changes, a keyless table),
  each paced at ``--rate`` transactions/s: a steady load the pipeline can
  hold (unpaced writers on this 2-core box outrun it, and freshness then
  only measures a growing backlog);
- a beat writer updates one row of ``app.beat`` every 100 ms with a counter
  and its own wall time, autocommit;
- a poller on the target reads the beat row as often as the target allows
  (MariaDB every 20 ms; DuckDB every 100 ms, opening the file read-only
  between the applier's flushes; Spark through a Spark session of its own
  with the Iceberg catalog cache off, as fast as a query returns).  Beat k
  is readable from the first poll that returns a counter >= k; its moment
  is taken as the middle between that poll's and the previous poll's
  snapshot (each snapshot at the middle of its query).

Recorded per target for the beats committed in the ``--seconds`` window
after ``--warmup``: p50/p99/max commit -> readable, the metric's own p50/p99
(``cynomys_applier_freshness_seconds`` scraped from the applier's /metrics
at the window's start and once the window's last beat was readable, the
quantiles of the difference, as Prometheus' histogram_quantile gives them)
and whether they agree within 10%, the writers' transactions/s, CPU seconds
of each daemon (with its children: Spark's JVM) and of the target server
over the window, and the load average (sampled every 5 s).  Writes
bench/results/<out>.json and <out>.png (latency over time, and the CDF, per
target).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, tear_down, write_result  # noqa: E402
from cynomys.metrics.freshness import bucket_quantile  # noqa: E402
from cynomys.sandbox.daemons import stop_daemons  # noqa: E402
from cynomys.sandbox.mariadb import MariaDBServer, free_port  # noqa: E402
from cynomys.sandbox.redis import RedisProcess  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BEAT_EVERY_S = 0.1
BEAT_DDL = "CREATE TABLE app.beat (id INT PRIMARY KEY, n BIGINT NOT NULL, ts DOUBLE NOT NULL)"
METRIC = "cynomys_applier_freshness_seconds"


# -- targets: their [target] section, and a reader of the beat row -------------------
class Side:
    """One target kind: its config, servers and the beat poller's reads."""

    poll_every_s = 0.02

    def __init__(self, work: Path) -> None:
        self.work = work

    def config(self) -> dict[str, Any]:
        raise NotImplementedError

    def open_reader(self, cfg: Path) -> None:
        """Called once the daemons run and the beat table exists."""

    def read_beat(self) -> int | None:
        """The beat counter the target holds now (None: not readable yet)."""
        raise NotImplementedError

    def server_pid(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class ColumnStoreSide(Side):
    """The ColumnStore target code on a second MariaDB, engine InnoDB."""

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.server = MariaDBServer(server_id=2, base=str(work / "target")).start()
        self.conn: Any = None

    def config(self) -> dict[str, Any]:
        return {"target": {"kind": "columnstore", "url": self.server.url, "engine": "InnoDB"}}

    def open_reader(self, cfg: Path) -> None:
        self.conn = self.server.connect()  # autocommit: every SELECT sees the latest commit

    def read_beat(self) -> int | None:
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT n FROM app.beat WHERE id = 1")
                row = cur.fetchone()
            return int(row[0]) if row else None
        except Exception:  # the table is not there yet
            return None

    def server_pid(self) -> int | None:
        return self.server.proc.pid if self.server.proc else None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.destroy()


class DuckDBSide(Side):
    """A DuckDB file: the applier opens it per flush, the poller read-only between flushes."""

    poll_every_s = 0.1  # each open can make a flush wait (it retries every 50 ms)

    def config(self) -> dict[str, Any]:
        return {"target": {"kind": "duckdb", "url": str(self.work / "replica.duckdb")}}

    def read_beat(self) -> int | None:
        import duckdb

        try:
            conn = duckdb.connect(str(self.work / "replica.duckdb"), read_only=True)
        except (duckdb.Error, OSError):  # the applier holds it (a flush), or not created yet
            return None
        try:
            row = conn.execute("SELECT n FROM app.beat WHERE id = 1").fetchone()
            return int(row[0]) if row else None
        except duckdb.Error:
            return None
        finally:
            conn.close()


class SparkSide(Side):
    """Iceberg tables written by the applier's Spark; read by a Spark session
    of the bench's own (local[1]) whose catalog cache is off (the target's
    session sets cache-enabled=false: a reader would otherwise keep serving
    the snapshot it first loaded, DESIGN.md's pitfall)."""

    poll_every_s = 0.05

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.reader: Any = None

    def config(self) -> dict[str, Any]:
        # As bench/lineitem.py runs Spark; the Cynomys delay settings stay default.
        return {"target": {"kind": "spark"},
                "target__spark": {"master": "local[2]", "warehouse": str(self.work / "warehouse"),
                                  "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                           "spark.driver.memory": "3g"}}}

    def open_reader(self, cfg: Path) -> None:
        from cynomys.applier.targets.base import open_target
        from cynomys.applier.targets.spark.config import SparkConfig
        from cynomys.core.config import load_config

        c = load_config(cfg, env={})
        spark = dataclasses.replace(c.target.of(SparkConfig), master="local[1]", warm_up=False, maintenance=False)
        self.reader = open_target(dataclasses.replace(c, target=c.target.with_options(spark)))
        self.reader.connect()

    def read_beat(self) -> int | None:
        try:
            rows = self.reader.fetch_rows("app", "beat")
        except Exception:  # not created yet
            return None
        return int(rows[0][1]) if rows else None

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


class SparkDuckDBSide(SparkSide):
    """The same Spark target, the beat read by DuckDB's iceberg extension
    (`cynomys sql --engine duckdb`'s reader) from the table's current
    metadata file, found again at every poll.  A Spark session polling as
    fast as its queries return keeps a core of this 2-core box busy
    (``cpu_s.bench``), which slows the applier it measures; a reader of the
    lakehouse runs elsewhere, and this one costs milliseconds a poll."""

    poll_every_s = 0.05

    def open_reader(self, cfg: Path) -> None:
        from cynomys.applier.targets.spark import readers
        from cynomys.core.config import load_config

        self.cfg = load_config(cfg, env={})
        self.reader = readers.duckdb_connection(self.cfg)
        self._readers = readers

    def read_beat(self) -> int | None:
        meta = Path(self._readers.warehouse_path(self.cfg)) / "app" / "beat" / "metadata"
        version = self._readers._hadoop_version(meta) if meta.is_dir() else None
        if version is None:
            return None
        try:
            row = self.reader.execute("SELECT n FROM iceberg_scan(?) WHERE id = 1",
                                      [str(meta / f"v{version}.metadata.json")]).fetchone()
        except Exception:  # a metadata file replaced between the listing and the read
            return None
        return int(row[0]) if row else None


SIDES: dict[str, Callable[[Path], Side]] = {"columnstore": ColumnStoreSide, "duckdb": DuckDBSide,
                                            "spark": SparkSide}
#: ``--spark-reader``: what reads the beat from the Spark target's tables.
SPARK_READERS: dict[str, Callable[[Path], Side]] = {"spark": SparkSide, "duckdb": SparkDuckDBSide}


# -- measuring -------------------------------------------------------------------------
def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants alive now."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def scrape_buckets(listen: str) -> dict[str, list[tuple[float, float]]]:
    """Cumulative buckets of the applier's histograms from /metrics, by name."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[float, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                out.setdefault(s.name.removesuffix("_bucket"), []).append((float(s.labels["le"]), s.value))
    return {k: sorted(v) for k, v in out.items()}


def histogram_delta(after: dict[str, list[tuple[float, float]]], before: dict[str, list[tuple[float, float]]],
                    name: str) -> list[tuple[float, float]]:
    return [(le, b - a) for (le, b), (_, a) in zip(after[name], before[name])]


def spark_flushes(log: Path, t0: float, t1: float) -> dict[str, Any] | None:
    """Where the Spark applier's flushes in [t0, t1] spent their time (its
    "flush seq" log lines): the beat table is readable from its own Iceberg
    commit, while the flush (what the metric counts to) ends after every
    table's commit and the state's."""
    import datetime

    from bench.bench_spark_catchup import FLUSH, table_seconds

    rows = []
    row_deltas = statements = 0  # table commits without a Spark job (spark/delta.py), and with one
    for line in log.read_text(errors="replace").splitlines():
        m = FLUSH.match(line)
        if not m:
            continue
        at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if t0 <= at <= t1:
            tables = table_seconds(m.group(6))
            row_deltas += m.group(6).count("(row delta:")
            statements += sum(1 for t in re.sub(r" \([^()]*\)", "", m.group(6)).split("; ") if t != "no rows") \
                - m.group(6).count("(row delta:") - m.group(6).count("(appended directly")
            rows.append((float(m.group(4)), float(m.group(5)), tables.get("beat"), float(m.group(7))))
    if not rows:
        return None
    med = statistics.median
    beat = [b for _, _, b, _ in rows if b is not None]
    return {"flushes": len(rows), "flush_s_median": round(med(r[0] for r in rows), 3),
            "plan_s_median": round(med(r[1] for r in rows), 3),
            "beat_table_commit_s_median": round(med(beat), 3) if beat else None,
            "state_s_median": round(med(r[3] for r in rows), 3),
            "table_commits_as_row_deltas": row_deltas, "table_commits_as_statements": statements}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_s": None, "p99_s": None, "max_s": None}
    v = sorted(values)
    return {"p50_s": round(v[int(0.5 * (len(v) - 1))], 3), "p99_s": round(v[int(0.99 * (len(v) - 1))], 3),
            "max_s": round(v[-1], 3)}


class Writers:
    """2 paced writers of the mixed workload, and the beat."""

    def __init__(self, src: MariaDBServer, rate: float, writers: int = 2) -> None:
        from tests.integration.test_e2e_columnstore import _mixed_txn

        self.src, self.rate, self.txn = src, rate, _mixed_txn
        self.stop = threading.Event()
        self.done = [0] * writers
        self.errors: list[BaseException] = []
        self.beats: dict[int, float] = {}  # beat number -> writer's wall time, sent in the row
        self.beat_rtt: list[float] = []    # seconds from that wall time until the UPDATE returned (committed)
        self.threads = [threading.Thread(target=self._write, args=(i,), daemon=True) for i in range(writers)]
        self.threads.append(threading.Thread(target=self._beat, daemon=True))

    def start(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def _write(self, seed: int) -> None:
        import pymysql

        rnd = random.Random(seed)
        conn = self.src.connect("app")
        start, k = time.monotonic(), 0
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    try:
                        cur.execute("BEGIN")
                        self.txn(cur, rnd, seed)
                        cur.execute("COMMIT")
                        self.done[seed] += 1
                    except (pymysql.err.OperationalError, pymysql.err.IntegrityError) as exc:
                        if exc.args[0] not in (1213, 1205, 1062):  # writers' deadlocks and key clashes
                            raise
                        cur.execute("ROLLBACK")
                    k += 1
                    if self.rate:
                        self.stop.wait(max(0.0, start + k / self.rate - time.monotonic()))
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            conn.close()

    def _beat(self) -> None:
        conn = self.src.connect("app")
        start, n = time.monotonic(), 0
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    n += 1
                    ts = time.time()
                    cur.execute("UPDATE beat SET n = %s, ts = %s WHERE id = 1", (n, ts))  # autocommit
                    self.beats[n] = ts
                    self.beat_rtt.append(time.time() - ts)
                    self.stop.wait(max(0.0, start + n * BEAT_EVERY_S - time.monotonic()))
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


class Poller(threading.Thread):
    """Reads the beat on the target; records when each beat became readable."""

    def __init__(self, side: Side) -> None:
        super().__init__(daemon=True)
        self.side = side
        self.stop = threading.Event()
        self.seen: dict[int, float] = {}     # beat -> estimated moment it became readable
        self.periods: list[float] = []       # seconds between two polls' snapshots
        self.highest = 0

    def run(self) -> None:
        previous: float | None = None
        while not self.stop.is_set():
            t0 = time.time()
            n = self.side.read_beat()
            t1 = time.time()
            snap = (t0 + t1) / 2
            if n is not None and previous is not None:
                self.periods.append(snap - previous)
                # Readable between the previous snapshot (which did not hold it) and this one.
                for k in range(self.highest + 1, n + 1):
                    self.seen[k] = (previous + snap) / 2
                self.highest = max(self.highest, n)
            # A read that failed (a DuckDB file the applier holds during a
            # flush, a table not there yet) is a moment the beat was not
            # readable either: the next beat's window starts here.
            previous = snap
            self.stop.wait(max(0.0, self.side.poll_every_s - (time.time() - t0)))


def _daemon(cfg: Path, cmd: str, listen: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CYNOMYS_METRICS_LISTEN": listen}
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(cfg)],
                            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _overrides(sets: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for s in sets:
        key, _, value = s.partition("=")
        section, _, name = key.rpartition(".")
        try:
            parsed: Any = json.loads(value)  # numbers, true/false
        except ValueError:
            parsed = value
        out.setdefault(section.replace(".", "__"), {})[name] = parsed
    return out


def wait(cond: Callable[[], bool], timeout: float, what: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a daemon exited {p.returncode} while waiting for {what}")
        if cond():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def run(kind: str, settings: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from cynomys.transport.keys import generate_keys
    from tests.helpers import write_config
    from tests.integration.test_e2e_columnstore import TABLES

    work = Path(tempfile.mkdtemp(prefix=f"cynomys-freshness-{kind}-"))
    src = MariaDBServer(server_id=1, base=str(work / "source")).start()
    redis = RedisProcess(str(work / "redis")).start()
    side = SIDES[kind](work)
    procs: list[subprocess.Popen[bytes]] = []
    writers: Writers | None = None
    poller: Poller | None = None
    keep = args.keep
    try:
        sections = {**side.config(), **_overrides(settings)}
        cfg = write_config(
            work / "cynomys.toml", src,
            source={"include_tables": ["app.*"], "start": "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])},
            producer={"id": "bench", **sections.pop("producer", {})},
            transport={"url": redis.url, "stream": "bench"},
            security={k: str(v) for k, v in generate_keys(work / "keys").items()},
            applier={"consumer_name": "a1", **sections.pop("applier", {})},
            metrics={"listen": "127.0.0.1:1"}, **sections)
        plisten, alisten = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        procs = [_daemon(cfg, "produce", plisten, work / "producer.log"),
                 _daemon(cfg, "apply", alisten, work / "applier.log")]
        src.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()], BEAT_DDL,
                    "INSERT INTO app.beat VALUES (1, 0, 0)")
        # The applier has created the tables and flushed the first beat row
        # (a Spark reader must not race the applier creating its catalog).
        wait(lambda: (work / "applier-state" / "applier.json").exists(), 600, "the applier's first flush", procs)
        side.open_reader(cfg)
        wait(lambda: side.read_beat() is not None, 600, "the beat table on the target", procs)
        writers = Writers(src, args.rate).start()
        poller = Poller(side)
        poller.start()
        print(f"[{kind}] writers and beat running; warming up {args.warmup}s", flush=True)
        time.sleep(args.warmup)
        load: list[float] = [os.getloadavg()[0]]
        pids = {"producer": procs[0].pid, "applier": procs[1].pid, "target_server": side.server_pid()}
        # "bench": this process (the writers, the beat, the poller) and, reading
        # Spark with Spark, its JVM: its tree less the servers and daemons it started.
        others = [p for p in (*pids.values(), src.proc.pid if src.proc else None,
                              redis.proc.pid if redis.proc else None) if p]

        def bench_cpu() -> float:
            return tree_cpu_s(os.getpid()) - sum(tree_cpu_s(p) for p in others)
        cpu0 = {k: tree_cpu_s(p) for k, p in pids.items() if p} | {"bench": bench_cpu()}
        before = scrape_buckets(alisten)
        done0, t0 = sum(writers.done), time.time()
        first_beat = max(writers.beats, default=0) + 1
        print(f"[{kind}] measuring {args.seconds}s", flush=True)
        while time.time() - t0 < args.seconds:
            time.sleep(5)
            load.append(os.getloadavg()[0])
            if writers.errors:
                raise writers.errors[0]
        t1 = time.time()
        txns = sum(writers.done) - done0
        last_beat = max(writers.beats)
        # The window's beats all readable (the poller keeps going), then the metric.
        wait(lambda: poller.highest >= last_beat, 300, "the window's last beat on the target", procs)
        after = scrape_buckets(alisten)
        time.sleep(6)  # one [metrics] health_interval_s: the applier's report holds the window's end
        status = json.loads((work / "applier-state" / "applier.health.json").read_text()).get("freshness")
        cpu1 = {k: tree_cpu_s(p) for k, p in pids.items() if p} | {"bench": bench_cpu()}
        writers.close()
        poller.stop.set()
        poller.join(30)
        beats = {k: (writers.beats[k], poller.seen[k]) for k in range(first_beat, last_beat + 1)}
        lat = [seen - sent for sent, seen in beats.values()]
        half = len(lat) // 2
        delta = histogram_delta(after, before, METRIC)
        flush_s = histogram_delta(after, before, "cynomys_applier_flush_duration_seconds")
        metric = {"p50_s": bucket_quantile(0.5, delta), "p99_s": bucket_quantile(0.99, delta),
                  "transactions": delta[-1][1] if delta else 0}
        outside = quantiles(lat)

        def agree(key: str) -> bool | None:
            m, o = metric[key], outside[key]
            return None if m is None or not o else abs(m - o) / o <= 0.10

        result = {
            "target": kind, "settings": settings,
            "reader": args.spark_reader if kind == "spark" else kind, "window_s": round(t1 - t0, 1), "beats": len(lat),
            "outside": outside,
            "metric": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in metric.items()},
            "metric_agrees_within_10pct": {"p50": agree("p50_s"), "p99": agree("p99_s")},
            # `cynomys status`'s exact quantiles (its last 300 s: warm-up included when the window is shorter).
            "status_freshness": status,
            # Each flush's apply() (the target transaction, and on Spark any overdue maintenance).
            "flush_duration": {"p50_s": _round(bucket_quantile(0.5, flush_s)),
                               "p99_s": _round(bucket_quantile(0.99, flush_s)), "flushes": flush_s[-1][1]},
            "spark_flush_profile": spark_flushes(work / "applier.log", t0, t1) if kind == "spark" else None,
            "outside_p50_first_half_s": quantiles(lat[:half])["p50_s"],
            "outside_p50_second_half_s": quantiles(lat[half:])["p50_s"],
            "writers": 2, "writer_rate_per_s": args.rate, "source_txns_per_s": round(txns / (t1 - t0), 1),
            "cpu_s": {k: round(cpu1[k] - cpu0[k], 1) for k in cpu1 if k in cpu0},
            # The beat's own commit: from the wall time it carries until the source confirmed it
            # (a loaded client or server delays it; it counts in "outside").
            "beat_commit_rtt_s": quantiles(writers.beat_rtt),
            "poll_period_median_s": round(statistics.median(poller.periods), 4) if poller.periods else None,
            "loadavg_1m": {"start": load[0], "max": max(load), "end": load[-1]},
            # Every beat of the window, in order (one each BEAT_EVERY_S): commit -> readable in ms, as
            # one string (the plot's data, kept compact).
            "beat_latency_ms": " ".join(str(round((seen - sent) * 1000)) for sent, seen in beats.values()),
        }
        print(f"[{kind} {' '.join(settings) or 'defaults'}] outside {outside}, metric {result['metric']}, agree {result['metric_agrees_within_10pct']}, "
              f"{result['source_txns_per_s']} txns/s, cpu {result['cpu_s']}, load {result['loadavg_1m']}",
              flush=True)
        return result
    except BaseException:
        keep = True
        raise
    finally:
        if writers is not None:
            writers.close()
        if poller is not None:
            poller.stop.set()
        stop_daemons(procs)
        side.close()
        tear_down(kind, work, keep, procs, redis, src)


def plot(results: list[dict[str, Any]], out: Path) -> None:
    """Left: latency over time of the runs with the default settings; right:
    every run's CDF (one colour per target, one line style per setting),
    with the metric's p50 and p99 as crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5 + 0.18 * len(results)))
    colours = {t: f"C{i}" for i, t in enumerate(dict.fromkeys(r["target"] for r in results))}
    styles: dict[str, str] = {}
    for r in results:
        setting = ", ".join(r["settings"]) or "defaults"
        when = r.get("round", {}).get("date", "")[11:16]  # runs of several rounds: which one
        style = styles.setdefault(setting, ["-", "--", ":", "-."][len(styles) % 4])
        colour = colours[r["target"]]
        ys = [int(v) / 1000 for v in r["beat_latency_ms"].split()]
        xs = [i * BEAT_EVERY_S for i in range(len(ys))]
        if not r["settings"]:
            ax1.plot(xs, ys, lw=0.8, color=colour, alpha=0.8, label=f"{r['target']} ({when} UTC)")
        v = sorted(ys)
        ax2.plot(v, [(i + 1) / len(v) for i in range(len(v))], color=colour, ls=style,
                 label=f"{r['target']} ({setting}; {when} UTC, load {r['loadavg_1m']['max']:.0f}): "
                       f"p50 {r['outside']['p50_s']} s, p99 {r['outside']['p99_s']} s")
        for q, key in ((0.5, "p50_s"), (0.99, "p99_s")):
            if r["metric"][key] is not None:
                ax2.plot([r["metric"][key]], [q], marker="x", color=colour, ms=8)
    ax1.set_xlabel("beat commit, seconds into the window")
    ax1.set_ylabel("commit -> readable on the target (s)")
    ax1.set_title("Freshness over time, default settings (a beat every 100 ms, 2 writers)")
    ax2.set_xscale("log")
    ax2.set_xlabel("commit -> readable (s, log scale)")
    ax2.set_ylabel("fraction of beats")
    ax2.set_title("CDF per run (x: the applier's own metric, p50 and p99)")
    ax2.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    fig.tight_layout()
    fig.savefig(out, dpi=85)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="columnstore,duckdb,spark")
    ap.add_argument("--seconds", type=float, default=120.0, help="measurement window per target")
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=100.0, help="transactions/s per writer (0: unpaced)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a config value for every run (e.g. applier.max_delay_ms=500); default: defaults")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]|default",
                    help="run each target once per variant, one after the other (side by side in one round)")
    ap.add_argument("--out", default="freshness", help="result name in bench/results")
    ap.add_argument("--append", action="store_true", help="add these runs to the result file's earlier ones")
    ap.add_argument("--note", default="")
    ap.add_argument("--keep", action="store_true", help="keep each run's work folder (logs, state)")
    ap.add_argument("--spark-reader", choices=sorted(SPARK_READERS), default="spark",
                    help="what polls the beat on the Spark target: a Spark session of the bench's own, or DuckDB")
    args = ap.parse_args()
    SIDES["spark"] = SPARK_READERS[args.spark_reader]
    variants = [[] if v == "default" else v.split(",") for v in args.variant] or [[]]
    results = []
    for kind in args.targets.split(","):
        if kind not in SIDES:
            raise SystemExit(f"unknown target {kind!r}; one of {', '.join(SIDES)}")
        for variant in variants:
            r = run(kind, [*args.set, *variant], args)
            r["round"] = {"command": "bench/freshness.py " + " ".join(sys.argv[1:]), "note": args.note,
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            results.append(r)
    earlier = []
    if args.append and (RESULTS / f"{args.out}.json").exists():
        earlier = json.loads((RESULTS / f"{args.out}.json").read_text())["results"]
    out = write_result(args.out, {"results": [*earlier, *results]})
    plot([*earlier, *results], RESULTS / f"{args.out}.png")
    print(f"wrote {out} and {RESULTS / (args.out + '.png')}")


if __name__ == "__main__":
    main()
