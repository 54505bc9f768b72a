"""Initial load: Cynomys' initial snapshot vs a hand copy, side by side in one run.

    python bench/initial_load.py [--rows 10000000] [--targets columnstore,spark] [--keyless]
                                 [--writers 4] [--write-rate 25]

For each target, in a fresh work folder: a throwaway MariaDB source holding
``--rows`` TPC-H lineitem rows (loaded with LOAD DATA from duckdb's dbgen),
with the primary key (l_orderkey, l_linenumber) -- or, with ``--keyless``,
the same table without a key.  Measured in the same run:

  hand copy   ``SELECT * INTO OUTFILE`` on the source + ``LOAD DATA INFILE``
              into a fresh table of a second MariaDB (InnoDB): what a user
              would do by hand, without writers (``--keyless-index``: the
              copy's table has no index either, like Cynomys' target)
  Cynomys     the producer and applier daemons started on the source with
              writers going (``[source] start = "current"``, the initial
              snapshot on, every other setting the default; Redis Stream
              transport, sealed envelopes), timed from their start until the
              target holds the source's rows: the snapshot finished, then the
              writers stopped and the target caught up with the source's
              binlog end; then the target is checked equal to the source

The writers (``--writers`` threads, ``--write-rate`` transactions/s each)
update a random existing row and insert a new order past the table's end in
each transaction, so keys change inside chunk windows while they are read.
``--two-hosts`` pins the source side (source server, Redis, producer) to
core 0 and the analytics side (applier, target server) to core 1: the
deployment the daemons are made for (a producer on the source host, an
applier on the analytics host), on one box; the hand copy's OUTFILE then
runs on core 0 and its LOAD DATA on core 1.

Recorded: seconds and rows/s of each, their ratio, the producer's and
applier's peak RSS (VmHWM), the load average during the run and the cores
each process used second by second (plotted, ``*_cpu.png``).  Targets:
``columnstore`` (the ColumnStore target code on a second MariaDB with
engine InnoDB) and ``spark`` (local Spark, Iceberg).  Equality: row count
and the canonical checksum of every row (verify/checksum.py) in SQL on both
MariaDBs (columnstore); on Spark, the row count and sums of every numeric
column and of the text lengths in Spark SQL against the same sums on the
source.  Writes bench/results/initial_load.json (``--keyless``:
initial_load_keyless.json) and a PNG.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, daemon, redis_config, tear_down, write_result  # noqa: E402
from bench.lineitem import TARGET_SECTIONS, applied_position  # noqa: E402
from bench.tpch import LINEITEM_DDL, _extension, dbgen_scale  # noqa: E402
from cynomys.sandbox.mariadb import MariaDBServer  # noqa: E402
from cynomys.sandbox.redis import RedisProcess  # noqa: E402

COLUMNS = ("l_orderkey, l_partkey, l_suppkey, l_linenumber, l_quantity, l_extendedprice, l_discount, l_tax, "
           "l_returnflag, l_linestatus, l_shipdate, l_commitdate, l_receiptdate, l_shipinstruct, l_shipmode, l_comment")


def make_tsv(rows: int, path: Path) -> None:
    """``rows`` lineitem rows as a tab-separated file (duckdb's dbgen)."""
    import duckdb

    sf = dbgen_scale(rows)
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{_extension()}'")
    con.execute(f"CALL dbgen(sf={sf})")
    con.execute(f"COPY (SELECT * FROM lineitem ORDER BY l_orderkey, l_linenumber LIMIT {int(rows)}) TO '{path}' "
                "(HEADER false, DELIMITER '\t')")
    con.close()


def ddl(keyless: bool, index: bool = False) -> str:
    """The table; ``keyless``: without its primary key; ``index``: a keyless
    table with a non-unique index on l_orderkey (still no key to tell rows
    apart, so Cynomys reads it as any keyless table)."""
    if not keyless:
        return LINEITEM_DDL
    return LINEITEM_DDL.replace(",\n  PRIMARY KEY (l_orderkey, l_linenumber))",
                                ",\n  KEY (l_orderkey))" if index else ")")


def load(srv: MariaDBServer, tsv: Path, keyless: bool, index: bool = False) -> None:
    srv.execute("CREATE DATABASE IF NOT EXISTS tpch")
    conn = srv.connect("tpch", local_infile=True)
    with conn.cursor() as cur:
        cur.execute(ddl(keyless, index))
        cur.execute(f"LOAD DATA LOCAL INFILE '{tsv}' INTO TABLE lineitem FIELDS TERMINATED BY '\\t'")
        cur.execute("ANALYZE TABLE lineitem")
    conn.close()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpu: int) -> None:
    """Every thread of ``pid``, and those it starts, on core ``cpu`` only."""
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, stdout=subprocess.DEVNULL)


def server_cpu(srv: MariaDBServer) -> float:
    assert srv.proc is not None
    return cpu_s(srv.proc.pid)


class CpuTimeline:
    """Cores each named process used, second by second, from the daemons'
    start: where the time goes (reading, loading, idle) on a box of 2 cores."""

    def __init__(self, pids: dict[str, int], period_s: float = 1.0) -> None:
        self.pids, self.period_s = pids, period_s
        self.t: list[float] = []
        self.cores: dict[str, list[float]] = {name: [] for name in pids}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        last = {name: cpu_s(pid) for name, pid in self.pids.items()}
        at = t0
        while not self.stop.wait(self.period_s):
            now = time.monotonic()
            try:
                cur = {name: cpu_s(pid) for name, pid in self.pids.items()}
            except OSError:  # a process ended: the run is over
                return
            self.t.append(round(now - t0, 1))
            for name in self.pids:
                self.cores[name].append(round((cur[name] - last[name]) / (now - at), 2))
            last, at = cur, now

    def start(self) -> CpuTimeline:
        self.thread.start()
        return self

    def close(self) -> dict[str, Any]:
        self.stop.set()
        self.thread.join(5)
        return {"t_s": self.t, "cores": self.cores}


def hand_copy(src: MariaDBServer, tgt: MariaDBServer, work: Path, keyless: bool, index: bool = False) -> dict[str, Any]:
    """SELECT ... INTO OUTFILE on the source + LOAD DATA INFILE into the
    target, timed; into the source's own table definition (a keyless
    table's index too: Cynomys makes it on the target as well)."""
    out = work / "handcopy.tsv"
    tgt.execute("DROP DATABASE IF EXISTS handcopy", "CREATE DATABASE handcopy")
    tgt.execute(ddl(keyless, index), database="handcopy")
    t0 = time.monotonic()
    c0 = server_cpu(src)
    src.execute(f"SELECT * INTO OUTFILE '{out}' FROM tpch.lineitem")
    t1 = time.monotonic()
    c1 = server_cpu(tgt)
    tgt.execute(f"LOAD DATA INFILE '{out}' INTO TABLE handcopy.lineitem")
    t2 = time.monotonic()
    cpu = {"source_server": round(server_cpu(src) - c0, 1), "target_server": round(server_cpu(tgt) - c1, 1)}
    n = int(tgt.execute("SELECT COUNT(*) FROM handcopy.lineitem")[0][0])
    out.unlink()
    tgt.execute("DROP DATABASE handcopy")
    return {"rows": n, "outfile_s": round(t1 - t0, 2), "load_data_s": round(t2 - t1, 2),
            "seconds": round(t2 - t0, 2), "rows_per_s": round(n / (t2 - t0)), "cpu_s": cpu}


class Writers:
    """``n`` threads, each ``rate`` transactions/s: update a random row,
    insert a new order (orderkeys past the table's end)."""

    def __init__(self, src: MariaDBServer, n: int, rate: float, max_key: int, keyless: bool) -> None:
        self.src, self.n, self.rate, self.keyless = src, n, rate, keyless
        self.next_key = max_key + 1
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.count = 0
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i, max_key), daemon=True) for i in range(n)]

    def start(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def _run(self, i: int, max_key: int) -> None:
        rng = random.Random(i)
        try:
            conn = self.src.connect("tpch")
            conn.autocommit(False)
            with conn.cursor() as cur:
                next_at = time.monotonic()
                while not self.stop.is_set():
                    k = rng.randint(1, max_key)
                    if self.keyless:
                        cur.execute("UPDATE lineitem SET l_comment = %s WHERE l_orderkey = %s LIMIT 1",
                                    (f"w{i}-{rng.random():.6f}", k))
                    else:
                        cur.execute("UPDATE lineitem SET l_comment = %s, l_quantity = l_quantity + 1 "
                                    "WHERE l_orderkey = %s AND l_linenumber = 1", (f"w{i}-{rng.random():.6f}", k))
                    with self.lock:
                        new = self.next_key
                        self.next_key += 1
                    cur.execute(f"INSERT INTO lineitem ({COLUMNS}) VALUES (%s, 1, 1, 1, 1.00, 2.00, 0.05, 0.01, "
                                "'N', 'O', '2024-01-01', '2024-01-02', '2024-01-03', 'NONE', 'MAIL', %s)",
                                (new, f"writer {i}"))
                    conn.commit()
                    self.count += 1
                    next_at += 1.0 / self.rate
                    time.sleep(max(0.0, next_at - time.monotonic()))
            conn.close()
        except BaseException as exc:  # reported by the main thread
            self.errors.append(exc)

    def close(self) -> int:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        if self.errors:
            raise self.errors[0]
        return self.count


def config(work: Path, src: MariaDBServer, redis_url: str, target: str, keys: dict[str, Path],
           snapshot: str = "", applier: str = "") -> Path:
    return redis_config(work, src, redis_url, keys, include="tpch.*", start="current", heartbeat_s=0.5,
                        applier=applier, tail=f"{snapshot}\n{target}")


def vm_hwm_mb(pid: int) -> float | None:
    try:
        m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
        return round(int(m.group(1)) / 1024, 1) if m else None
    except OSError:
        return None




def snapshot_job(work: Path) -> dict[str, Any] | None:
    try:
        jobs = json.loads((work / "producer" / "snapshot.json").read_text())["jobs"]
    except (OSError, ValueError, KeyError):
        return None
    return next((j for j in jobs if j["id"] == "initial"), None)


def mariadb_digest(srv: MariaDBServer, db: str, keyless: bool) -> tuple[int, int]:
    """(rows, canonical checksum) of db.lineitem, in SQL on the server."""
    from cynomys.core.config import SourceConfig
    from cynomys.snapshot.source import SnapshotConnection
    from cynomys.verify.sqlhash import checksum_sql

    conn = SnapshotConnection(SourceConfig(**srv.source_settings()) if db == "tpch" else
                              SourceConfig(host="127.0.0.1", port=srv.port, user="root", password="root-secret"))
    try:
        schema = conn.describe(db, "lineitem").schema
        sql = checksum_sql(schema)
        assert sql is not None
        n, total = conn.query(sql)[0]
        return int(n), int(total or 0) & ((1 << 64) - 1)
    finally:
        conn.close()


_SUMS = ("COUNT(*)", "SUM(l_orderkey)", "SUM(l_partkey)", "SUM(l_linenumber)", "SUM(l_quantity)",
         "SUM(l_extendedprice)", "SUM(l_discount)", "SUM(l_tax)", "SUM(LENGTH(l_comment))",
         "SUM(LENGTH(l_shipinstruct))")


def spark_sums(work: Path, cfg: Path) -> list[str]:
    from cynomys.applier.targets.base import open_target
    from cynomys.core.config import load_config

    t = open_target(load_config(cfg, env={}))
    t.connect()
    try:
        table = t.qualified("tpch", "lineitem")  # type: ignore[attr-defined]
        got = t.spark.sql(f"SELECT {', '.join(_SUMS)} FROM {table}").collect()  # type: ignore[attr-defined]
        return [str(v) for v in got[0]]
    finally:
        t.close()


def duckdb_sums(work: Path) -> list[str]:
    """The same sums on the DuckDB replica file (daemons stopped: one writer at a time)."""
    import duckdb

    con = duckdb.connect(str(work / "replica.duckdb"), read_only=True)
    try:
        got = con.execute(f"SELECT {', '.join(_SUMS)} FROM tpch.lineitem").fetchone()
        assert got is not None
        return [str(v) for v in got]
    finally:
        con.close()


#: Sums of the replica, for targets that are not a MariaDB server.
TARGET_SUMS = {"spark": spark_sums, "duckdb": lambda work, cfg: duckdb_sums(work)}


def run(kind: str, tsv: Path, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    from cynomys.transport.keys import generate_keys

    work = Path(tempfile.mkdtemp(prefix=f"cynomys-initial-{kind}-"))
    src = MariaDBServer(server_id=1, base=str(work / "source")).start()
    redis = RedisProcess(str(work / "redis")).start()
    section, tgt = TARGET_SECTIONS[kind](work, "")
    copy_tgt = tgt if isinstance(tgt, MariaDBServer) else MariaDBServer(server_id=3, base=str(work / "copy")).start()
    # --read-from-replica: a GTID replica of the source the chunks are read on.
    replica = MariaDBServer(server_id=4, base=str(work / "replica")).start() if args.read_from_replica else None
    procs: list[subprocess.Popen[bytes]] = []
    loads: list[float] = []
    keep = args.keep
    try:
        if replica is not None:
            replica.make_replica_of(src)
        load(src, tsv, args.keyless, args.keyless_index)
        if replica is not None:
            replica.wait_caught_up(src, timeout=args.timeout)
        rows = int(src.execute("SELECT COUNT(*) FROM tpch.lineitem")[0][0])
        print(f"[{kind}] source holds {rows:,} rows", flush=True)
        if args.two_hosts:
            pin(src.proc.pid, 0)  # type: ignore[union-attr]
            pin(copy_tgt.proc.pid, 1)  # type: ignore[union-attr]
        copy = hand_copy(src, copy_tgt, work, args.keyless, args.keyless_index)
        print(f"[{kind}] hand copy: {copy}", flush=True)
        max_key = int(src.execute("SELECT MAX(l_orderkey) FROM tpch.lineitem")[0][0])
        extra = "[snapshot]\n" + (f"max_connections = {args.max_connections}\n" if args.max_connections else "") + (
            f'read_from = "127.0.0.1:{replica.port}"\n' if replica is not None else "")
        applier = "".join(f"{setting}\n" for setting in args.applier)
        cfg = config(work, src, redis.url, section, generate_keys(work / "keys"), extra, applier)
        writers = Writers(src, args.writers, args.write_rate, max_key, args.keyless).start()
        t0 = time.monotonic()
        servers = {"source_server": src, **({"target_server": tgt} if isinstance(tgt, MariaDBServer) else {}),
                   **({"replica_server": replica} if replica is not None else {})}
        cpu0 = {name: server_cpu(srv) for name, srv in servers.items()}
        procs = [daemon(cfg, "produce", work / "producer.log"), daemon(cfg, "apply", work / "applier.log")]
        if args.two_hosts and isinstance(tgt, MariaDBServer):
            # The deployment Cynomys is made for, on one box of 2 cores: the
            # source host (source, producer, Redis) on core 0, the analytics
            # host (applier, target) on core 1.
            for pid in (src.proc.pid, redis.proc.pid, procs[0].pid):  # type: ignore[union-attr]
                pin(pid, 0)
            for pid in (tgt.proc.pid, procs[1].pid):  # type: ignore[union-attr]
                pin(pid, 1)
        timeline = CpuTimeline({**{name: srv.proc.pid for name, srv in servers.items() if srv.proc is not None},
                                "producer": procs[0].pid, "applier": procs[1].pid}).start()
        rss: dict[str, float | None] = {}
        snap_s = None
        last_print = 0.0
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            for name, p in zip(("producer", "applier"), procs):
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: see {work / (name + '.log')}")
            job = snapshot_job(work)
            if job is not None and job["status"] in ("done", "failed", "cancelled"):
                if job["status"] != "done":
                    raise RuntimeError(f"the initial snapshot ended {job['status']}: {job.get('error')}")
                snap_s = time.monotonic() - t0
                break
            if time.monotonic() - last_print > 10:
                loads.append(os.getloadavg()[0])
                # What `cynomys status` shows (a keyless read's rows so far included).
                from cynomys.snapshot.state import status_report
                st = status_report(work / "producer").get("jobs", {}).get("initial") or {}
                print(f"[{kind}]   {time.monotonic() - t0:6.1f}s snapshot read {st.get('rows_read', 0):,} rows "
                      f"({st.get('progress')}, {st.get('rows_per_s')} rows/s, ETA {st.get('eta_s')} s)", flush=True)
                last_print = time.monotonic()
            time.sleep(0.1)
        if snap_s is None:
            raise RuntimeError(f"the initial snapshot did not finish in {args.timeout}s; see {work}")
        written = writers.close()
        end_file, end_pos = src.execute("SHOW MASTER STATUS")[0][:2]
        while time.monotonic() < deadline:
            at = applied_position(work)
            if at is not None and at[0] == end_file and at[1] >= end_pos:
                break
            for name, p in zip(("producer", "applier"), procs):
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: see {work / (name + '.log')}")
            time.sleep(0.05)
        equal_s = time.monotonic() - t0
        loads.append(os.getloadavg()[0])
        # Where the CPU went from the daemons' start to target equal (the
        # box has 2 cores: their sum over 2 x the wall time says how busy it was).
        cpu = {name: round(server_cpu(srv) - cpu0[name], 1) for name, srv in servers.items()}
        for name, p in zip(("producer", "applier"), procs):
            rss[name] = vm_hwm_mb(p.pid)
            cpu[name] = round(cpu_s(p.pid), 1)
        cpu_timeline = timeline.close()
        try:  # the applier's counters (flushes, rows), from its state report
            stats = json.loads((work / "applier" / "applier.json").read_text()).get("stats", {})
        except (OSError, ValueError):
            stats = {}
        steady = steady_phase(args, src, servers, procs, work, max_key, deadline) if args.steady else None
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(300)
        check: dict[str, Any]
        if isinstance(tgt, MariaDBServer):
            s, t = mariadb_digest(src, "tpch", args.keyless), mariadb_digest(tgt, "tpch", args.keyless)
            check = {"source": list(s), "target": list(t), "equal": s == t}
        else:
            want = [str(v) for v in src.execute(f"SELECT {', '.join(_SUMS)} FROM tpch.lineitem")[0]]
            got = TARGET_SUMS[kind](work, cfg)
            norm = [lambda v: re.sub(r"\.0+$|(\.\d*?)0+$", r"\1", v)]  # 12.50 vs 12.5
            check = {"source": want, "target": got,
                     "equal": [norm[0](v) for v in want] == [norm[0](v) for v in got]}
        result = {
            "target": kind, "keyless": args.keyless, "keyless_index": args.keyless_index, "rows": rows,
            "hand_copy": copy,
            "max_connections": args.max_connections or "default", "read_from_replica": args.read_from_replica,
            "two_hosts": args.two_hosts,
            "cynomys": {"snapshot_done_s": round(snap_s, 2), "target_equal_s": round(equal_s, 2),
                        "rows_per_s": round(rows / equal_s), "writer_transactions": written,
                        "peak_rss_mb": rss, "cpu_s": cpu, "cpu_timeline": cpu_timeline,
                        "applier_flushes": stats.get("flushes"), "applier_parts": stats.get("parts")},
            "cynomys_vs_hand_copy": round(equal_s / copy["seconds"], 2),
            **({"steady": steady} if steady is not None else {}),
            "load_avg": {"samples": [round(x, 1) for x in loads],
                         "mean": round(sum(loads) / len(loads), 1) if loads else None},
            "check": check,
        }
        print(f"[{kind}] {json.dumps(result)}", flush=True)
        keep = keep or not check["equal"]
        return result
    except BaseException:
        keep = True
        raise
    finally:
        tear_down(kind, work, keep, procs, redis, src, tgt, copy_tgt if copy_tgt is not tgt else None, replica)


def steady_phase(args: argparse.Namespace, src: MariaDBServer, servers: dict[str, MariaDBServer],
                 procs: list[subprocess.Popen[bytes]], work: Path, max_key: int, deadline: float) -> dict[str, Any]:
    """After the load: the writers again for ``--steady`` seconds, the
    applier's lag sampled every second (a source position taken, then the
    time until the applier's state reaches it), then the catch-up once they
    stop, and the CPU the analytics side spent on it."""
    writers = Writers(src, args.writers, args.write_rate, max_key, args.keyless)
    writers.next_key = int(src.execute("SELECT MAX(l_orderkey) FROM tpch.lineitem")[0][0]) + 1
    cpu0 = {name: server_cpu(srv) for name, srv in servers.items()}
    app0 = cpu_s(procs[1].pid)
    writers.start()
    t0 = time.monotonic()
    pending: list[tuple[float, tuple[str, int]]] = []
    lags: list[float] = []
    next_sample = t0
    written, stopped = 0, 0.0

    def drain() -> None:
        at = applied_position(work)
        while pending and at is not None and at >= pending[0][1]:
            lags.append(time.monotonic() - pending.pop(0)[0])

    while time.monotonic() < deadline:
        now = time.monotonic()
        if not stopped and now - t0 >= args.steady:
            written = writers.close()
            end = src.execute("SHOW MASTER STATUS")[0][:2]
            pending.append((now, (str(end[0]), int(end[1]))))
            stopped = now
        if stopped and not pending:
            break
        if not stopped and now >= next_sample:
            f, pos = src.execute("SHOW MASTER STATUS")[0][:2]
            pending.append((now, (str(f), int(pos))))
            next_sample += 1.0
        for name, p in zip(("producer", "applier"), procs):
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited {p.returncode}: see {work / (name + '.log')}")
        drain()
        time.sleep(0.05)
    wall = time.monotonic() - t0
    cpu = {name: round(server_cpu(srv) - cpu0[name], 1) for name, srv in servers.items()}
    cpu["applier"] = round(cpu_s(procs[1].pid) - app0, 1)
    lags.sort()
    out = {"seconds": args.steady, "writer_transactions": written, "catch_up_s": round(lags[-1] if lags else -1, 2),
           "lag_s": {"median": round(lags[len(lags) // 2], 2), "p95": round(lags[int(len(lags) * 0.95)], 2),
                     "max": round(lags[-1], 2), "samples": len(lags)} if lags else None,
           "cpu_s": cpu, "cores": {k: round(v / wall, 2) for k, v in cpu.items()},
           "stopped_to_caught_up_s": round(time.monotonic() - stopped, 2) if stopped else None}
    print(f"[steady] {json.dumps(out)}", flush=True)
    return out


def plot(results: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, colors = [], [], []
    for r in results:
        labels += [f"{r['target']}: hand copy", f"{r['target']}: Cynomys"]
        values += [r["hand_copy"]["rows_per_s"], r["cynomys"]["rows_per_s"]]
        colors += ["#999", "#37a"]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.6 * len(labels)))
    ax.barh(range(len(labels)), values, color=colors)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("rows/s (start to target equal; hand copy: OUTFILE + LOAD DATA)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_cpu(results: list[dict[str, Any]], out: Path, title: str) -> None:
    """Cores each process used over the run, one panel per target (stacked:
    the top line is the box's load, 2 cores at most here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 3.2 * len(results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        tl = r["cynomys"]["cpu_timeline"]
        names = list(tl["cores"])
        ax.stackplot(tl["t_s"], *[tl["cores"][n] for n in names], labels=names, alpha=0.85)
        ax.axvline(r["cynomys"]["snapshot_done_s"], color="k", ls="--", lw=0.8)
        ax.text(r["cynomys"]["snapshot_done_s"], 0.05, " read done", fontsize=8)
        ax.set_ylabel("cores")
        ax.set_xlabel("seconds from the daemons' start")
        ax.set_title(f"{r['target']}: target equal at {r['cynomys']['target_equal_s']:.1f} s "
                     f"(hand copy {r['hand_copy']['seconds']:.1f} s)", fontsize=9)
        ax.legend(loc="upper right", fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--targets", default="columnstore,spark")
    ap.add_argument("--keyless", action="store_true", help="the table without a primary key")
    ap.add_argument("--keyless-index", action="store_true",
                    help="with --keyless: a non-unique index on l_orderkey, so the writers' single-row updates "
                         "find their row through it instead of scanning the table (still no primary key)")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--write-rate", type=float, default=25.0, help="transactions/s of each writer")
    ap.add_argument("--timeout", type=float, default=7200.0)
    ap.add_argument("--steady", type=float, default=0.0,
                    help="after target equal, the writers again for this many seconds: the applier's lag and CPU")
    ap.add_argument("--keep", action="store_true", help="keep each run's work folder")
    ap.add_argument("--name", default="", help="result file name (default initial_load[_keyless])")
    ap.add_argument("--max-connections", type=int, default=0, help="[snapshot] max_connections (0: the default)")
    ap.add_argument("--read-from-replica", action="store_true",
                    help="start a GTID replica of the source and read the snapshot's chunks there ([snapshot] read_from)")
    ap.add_argument("--two-hosts", action="store_true",
                    help="pin the source side (source server, Redis, producer) to core 0 and the analytics side "
                         "(applier, target server) to core 1, as on two hosts (columnstore only)")
    ap.add_argument("--applier", action="append", default=[], metavar="KEY=VALUE",
                    help="an [applier] setting, TOML (e.g. 'buffer_rows = 200000'); repeatable; default: none")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cynomys-initial-data-"))
    try:
        tsv = tmp / "lineitem.tsv"
        print(f"generating {args.rows:,} lineitem rows ...", flush=True)
        make_tsv(args.rows, tsv)
        results = [run(kind, tsv, args.rows, args) for kind in args.targets.split(",")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    name = args.name or ("initial_load_keyless" if args.keyless else "initial_load")
    out = write_result(name, {"rows": args.rows, "writers": args.writers, "write_rate_per_writer": args.write_rate,
                              "results": results})
    plot(results, RESULTS / f"{name}.png",
         f"Initial load of {args.rows:,} lineitem rows{' (no primary key)' if args.keyless else ''}, "
         f"{args.writers} writers going")
    plot_cpu(results, RESULTS / f"{name}_cpu.png", f"CPU by process, {args.rows:,} rows")
    print(f"wrote {out}, {RESULTS / (name + '.png')} and {RESULTS / (name + '_cpu.png')}")


if __name__ == "__main__":
    main()
