"""Snapshot throughput, and what a snapshot costs the source's writers.

    python bench/snapshot.py [--rows 300000] [--chunk-size 5000] [--phase-s 10] [--quick]

One throwaway MariaDB source; a table of ``--rows`` rows (8 columns: ints,
varchar, decimal, datetime(6), double, text); the real producer
(`cynomys produce` in its own process, sealed envelopes to a file
transport) following the binlog.  One client measures the latency of
single-row autocommit INSERTs into another table of the source, side by
side, in four phases of one run:

  baseline   no snapshot (the producer follows the binlog)
  dblog      while a DBLog snapshot of the table runs (watermark table)
  read_only  while a read-only snapshot (GTID watermarks) runs
  after      no snapshot again (drift check)

Snapshot throughput is rows of the table / seconds from the request being
picked up to the snapshot being finished (every chunk's rows accepted by
the transport, the producer's checkpoint past them).  Writes
bench/results/snapshot.json and snapshot.png.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, security_toml, write_result  # noqa: E402
from cynomys.core.checkpoint import read_json  # noqa: E402
from cynomys.sandbox.mariadb import MariaDBServer  # noqa: E402
from cynomys.snapshot.state import FINISHED, JOB_OVER, SnapshotStore, new_job_id  # noqa: E402
from cynomys.transport.keys import generate_keys  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _config(path: Path, srv: MariaDBServer, keys: dict[str, Path], chunk: int, read_only: bool) -> Path:
    path.write_text(f"""
{srv.source_toml("bench.*", srv.binlog_end(), heartbeat_s=1.0)}
[producer]
id = "bench"
state_dir = "{path.parent / 'state'}"
[transport]
kind = "file"
path = "{path.parent / 'transport.bin'}"
{security_toml(keys)}
[snapshot]
chunk_size = {chunk}
read_only = {"true" if read_only else "false"}
initial = false
""")
    return path


DDL = ("CREATE TABLE bench.t (id BIGINT PRIMARY KEY, a INT, b VARCHAR(40), c DECIMAL(12,2), d DATETIME(6), "
       "e DOUBLE, f TEXT, g INT UNSIGNED)")


def _load(srv: MariaDBServer, rows: int, ddl: str = DDL) -> None:
    """bench.t (``ddl``: its 8 columns) with ``rows`` generated rows, and the
    latency client's table bench.lat."""
    srv.execute("CREATE DATABASE IF NOT EXISTS bench", ddl,
                "CREATE TABLE IF NOT EXISTS bench.lat (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT, pad VARCHAR(20))")
    step = 100_000
    for lo in range(0, rows, step):
        hi = min(rows, lo + step) - 1
        srv.execute(f"INSERT INTO bench.t SELECT seq, seq % 1000, CONCAT('name-', seq), seq / 100, "
                    f"'2024-01-01' + INTERVAL seq SECOND, seq * 0.5, REPEAT('x', seq % 50), seq * 7 "
                    f"FROM bench.seq_{lo}_to_{hi}")
    srv.execute("ANALYZE TABLE bench.t")


class Latency:
    """One client: single-row autocommit INSERTs at a fixed rate.

    Paced, not back to back: an unpaced client commits ~4k transactions/s
    here, more than the producer (sharing the 2 CPUs) decodes, and DBLog
    closes a chunk's window only when the log read reaches its high
    watermark, so the snapshot would measure the producer's backlog."""

    def __init__(self, srv: MariaDBServer, rate: float) -> None:
        self.conn = srv.connect("bench")
        self.interval = 1.0 / rate

    def run_until(self, done: threading.Event | None, seconds: float) -> list[float]:
        out: list[float] = []
        deadline = time.monotonic() + seconds
        next_at = time.perf_counter()
        with self.conn.cursor() as cur:
            while (done is None and time.monotonic() < deadline) or (done is not None and not done.is_set()):
                t0 = time.perf_counter()
                cur.execute("INSERT INTO lat (v, pad) VALUES (1, 'latency-probe')")
                t1 = time.perf_counter()
                out.append((t1 - t0) * 1000.0)
                next_at = max(next_at + self.interval, t1 - 0.05)
                if next_at > t1:
                    time.sleep(next_at - t1)
        return out


def _wait_started(proc: subprocess.Popen[bytes], state: Path, log: Path) -> None:
    """Until the producer has written its first checkpoint (``state``/producer.json)."""
    deadline = time.monotonic() + 60
    while not (state / "producer.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the producer did not start; see {log}")
        time.sleep(0.1)


def _time_job(proc: subprocess.Popen[bytes], lat: Latency, find: Callable[[], Any | None],
              over: Callable[[Any], dict[str, Any] | None]) -> tuple[dict[str, Any], list[float]]:
    """A producer-side job (already submitted) timed while ``lat`` writes:
    seconds from the job being picked up (``find`` first returns it) until
    ``over`` returns its numbers (with "status"), or the producer exits.
    Returns those numbers with "seconds", and the write latencies."""
    done = threading.Event()
    info: dict[str, Any] = {}

    def watch() -> None:
        t_pick = None
        while True:
            job = find()
            if job is not None and t_pick is None:
                t_pick = time.monotonic()
            numbers = over(job) if job is not None else None
            if numbers is not None:
                info.update(status=numbers["status"], seconds=round(time.monotonic() - (t_pick or 0), 3))
                info.update(numbers)
                done.set()
                return
            if proc.poll() is not None:
                info["status"] = f"producer exited {proc.returncode}"
                done.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    samples = lat.run_until(done, 0)
    watcher.join()
    return info, samples


def _plot_latency(ax: Any, samples: dict[str, list[float]], during: str) -> None:
    """The source's write latency CDF of each phase (``during``: what the
    phases without it lack)."""
    for name, ms in samples.items():
        s = sorted(ms)
        st = _stats(ms)
        ax.plot(s, [i / len(s) for i in range(1, len(s) + 1)],
                label=f"{name} (p50 {st['p50_ms']:.2f}, p99 {st['p99_ms']:.2f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("single-row INSERT latency on the source (ms, log scale)")
    ax.set_ylabel("fraction of writes")
    ax.set_title(f"source write latency with and without {during}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _stats(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))], 3)

    return {"n": len(s), "mean_ms": round(statistics.fmean(s), 3), "p50_ms": q(0.50), "p90_ms": q(0.90),
            "p99_ms": q(0.99), "max_ms": round(s[-1], 3)}


def _snapshot_phase(cfg_path: Path, srv: MariaDBServer, lat: Latency, rows: int) -> tuple[dict[str, Any], list[float]]:
    state = cfg_path.parent / "state"
    log = (cfg_path.parent / "producer.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", "produce", "-c", str(cfg_path)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_started(proc, state, cfg_path.parent / "producer.log")
        store = SnapshotStore(state)
        ident = new_job_id()

        def over(job: Any) -> dict[str, Any] | None:
            if job.status not in JOB_OVER:
                return None
            return {"status": job.status, "chunks": job.tables[0].chunks, "rows": job.tables[0].scanned,
                    "left_to_log": job.tables[0].dropped}

        store.submit({"action": "start", "id": ident, "tables": ["bench.t"], "where": ""})
        info, samples = _time_job(proc, lat, lambda: next((j for j in store.load() if j.id == ident), None), over)
        if info.get("status") != FINISHED:
            raise RuntimeError(f"snapshot ended {info}; see {cfg_path.parent / 'producer.log'}")
        info["rows_per_s"] = round(info["rows"] / info["seconds"], 1)
        return info, samples
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--chunk-size", type=int, default=5000)
    ap.add_argument("--phase-s", type=float, default=10.0, help="length of the no-snapshot phases")
    ap.add_argument("--write-rate", type=float, default=500.0, help="latency client's INSERTs per second")
    ap.add_argument("--quick", action="store_true", help="30k rows, 3 s phases")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.phase_s = 30_000, 3.0
    work = Path(tempfile.mkdtemp(prefix="cynomys-bench-snapshot-"))
    srv = MariaDBServer(server_id=1).start()
    try:
        t0 = time.monotonic()
        _load(srv, args.rows)
        print(f"loaded {args.rows} rows in {time.monotonic() - t0:.1f}s", flush=True)
        keys = generate_keys(work / "keys", rsa_bits=2048)
        lat = Latency(srv, args.write_rate)
        phases: dict[str, Any] = {}
        samples: dict[str, list[float]] = {}
        # The producer follows the binlog during the baseline too.
        (work / "baseline").mkdir()
        cfg = _config(work / "baseline" / "c.toml", srv, keys, args.chunk_size, read_only=False)
        proc = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "WARNING", "produce", "-c", str(cfg)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2.0)
        lat.run_until(None, min(5.0, args.phase_s))  # warm-up (after the load: purge, flushing), not counted
        samples["baseline"] = lat.run_until(None, args.phase_s)
        proc.terminate()
        proc.wait(60)
        print(f"baseline: {_stats(samples['baseline'])}", flush=True)
        for name, ro in (("dblog", False), ("read_only", True)):
            (work / name).mkdir()
            cfg = _config(work / name / "c.toml", srv, keys, args.chunk_size, read_only=ro)
            info, samples[name] = _snapshot_phase(cfg, srv, lat, args.rows)
            phases[name] = info
            print(f"{name}: {info}, latency {_stats(samples[name])}", flush=True)
        samples["after"] = lat.run_until(None, args.phase_s)
        print(f"after: {_stats(samples['after'])}", flush=True)
        checkpoint = read_json(work / "read_only" / "state" / "producer.json")
        result = {
            "rows": args.rows, "chunk_size": args.chunk_size, "table_columns": 8, "write_rate_per_s": args.write_rate,
            "snapshot": phases,
            "write_latency": {k: _stats(v) for k, v in samples.items()},
            "notes": ("one client, single-row autocommit INSERTs at write_rate_per_s into another table of the source; "
                      "producer = `cynomys produce` (own process) with sealed envelopes to a file transport; "
                      "rows_per_s counts from the request being picked up to the last chunk being checkpointed; "
                      "2-CPU shared VM: the source, the producer and the client share the CPUs"),
            "producer_checkpoint_after": checkpoint.get("checkpoint") if checkpoint else None,
        }
        out = write_result("snapshot", result)
        _plot(samples, phases, RESULTS / "snapshot.png")
        print(f"wrote {out} and {RESULTS / 'snapshot.png'}")
    finally:
        srv.destroy()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _plot(samples: dict[str, list[float]], phases: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    _plot_latency(ax1, samples, "a snapshot")
    names = list(phases)
    ax2.bar(names, [phases[n]["rows_per_s"] for n in names], color=["tab:orange", "tab:green"][:len(names)])
    for i, n in enumerate(names):
        ax2.text(i, phases[n]["rows_per_s"], f"{phases[n]['rows_per_s']:.0f}", ha="center", va="bottom")
    ax2.set_ylabel("snapshot rows/s (to the transport)")
    ax2.set_title("snapshot throughput")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
