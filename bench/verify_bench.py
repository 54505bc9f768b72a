"""`cynomys verify` throughput on both sides, and what it costs the source's writers.

    python bench/verify_bench.py [--rows 1000000] [--chunk-size 5000] [--phase-s 10] [--quick]

One throwaway MariaDB source with a table of ``--rows`` rows (8 columns:
bigint key, int, varchar, decimal, datetime(6), decimal, text, int
unsigned); the real producer (`cynomys produce` in its own process, sealed
envelopes to a file transport) following the binlog.  A client measures the
latency of paced single-row autocommit INSERTs into another table of the
source, side by side, in three phases of one run:

  baseline   no verify (the producer follows the binlog)
  verify     while `cynomys verify` of the table runs (producer-side checksums)
  after      no verify again (drift check)

Producer side: rows / seconds from the request being picked up to the last
chunk's CHECKSUM record being accepted by the transport (checkpointed).

Applier side: a second MariaDB holds the same rows (loaded directly, the
ColumnStore target code with engine InnoDB); the applier's checksum of every
chunk range the producer emitted is timed two ways on the same table: the
aggregate query in SQL (columnstore/verify.py) and the range read back and
hashed in Python (the path tables with FLOAT/DOUBLE columns take).  Every
target checksum is compared with the producer's CHECKSUM record of the same
chunk (decoded from the transport): they must all be equal.

Through the daemons (what a user runs): the real applier (`cynomys apply`,
own process, target = that second MariaDB through the ColumnStore target
with engine InnoDB, wrapped as in every daemon) follows the same transport;
once it has caught up, `cynomys verify --tables bench.t` runs as a command
with both daemons going, timed from its start to its exit (every chunk
checksummed on both sides and compared).

Writes bench/results/verify.json and verify.png.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, daemon, security_toml, write_result  # noqa: E402
from bench.snapshot import Latency, _load, _plot_latency, _stats, _time_job, _wait_started  # noqa: E402
from cynomys.sandbox.mariadb import MariaDBServer  # noqa: E402
from cynomys.transport.keys import generate_keys  # noqa: E402
from tests.helpers import transport_batches  # noqa: E402

# The snapshot bench's table with e DECIMAL (not DOUBLE): the SQL aggregate
# checksum applies to it (FLOAT/DOUBLE tables take the read-back path).
DDL = ("CREATE TABLE bench.t (id BIGINT PRIMARY KEY, a INT, b VARCHAR(40), c DECIMAL(12,2), d DATETIME(6), "
       "e DECIMAL(16,1), f TEXT, g INT UNSIGNED)")


def _target_section(tgt: MariaDBServer | None, duckdb_path: Path | None) -> str:
    if duckdb_path is not None:
        return f'[target]\nkind = "duckdb"\nurl = "{duckdb_path}"'
    assert tgt is not None
    return f'[target]\nkind = "columnstore"\nurl = "{tgt.url}"\nengine = "InnoDB"'


def _config(path: Path, srv: MariaDBServer, tgt: MariaDBServer | None, keys: dict[str, Path], chunk: int,
            duckdb_path: Path | None = None) -> Path:
    path.write_text(f"""
{srv.source_toml("bench.*", srv.binlog_end(), heartbeat_s=1.0)}
[producer]
id = "bench"
state_dir = "{path.parent / 'state'}"
[applier]
state_dir = "{path.parent / 'applier-state'}"
[transport]
kind = "file"
path = "{path.parent / 'transport.bin'}"
{_target_section(tgt, duckdb_path)}
{security_toml(keys)}
[snapshot]
chunk_size = {chunk}
initial = false
""")
    return path


def _load_duckdb(path: Path, cfg_path: Path, rows: int) -> None:
    """The same rows as ``_load`` in a DuckDB file, in the table the DuckDB
    target creates (its types and source-type comments), generated in SQL."""
    from cynomys.applier.targets.base import open_target
    from cynomys.core.config import load_config
    from cynomys.snapshot.source import SnapshotConnection

    cfg = load_config(cfg_path, env={})
    conn = SnapshotConnection(cfg.source)
    schema = conn.describe("bench", "t").schema
    conn.close()
    target = open_target(cfg)
    target.connect()
    try:
        target._prepare(schema)  # type: ignore[attr-defined]
        table = target.table_name("bench", "t")  # type: ignore[attr-defined]
        with target.transaction("loading the verify bench table") as cur:  # type: ignore[attr-defined]
            cur.execute(f"INSERT INTO {table} SELECT s, s % 1000, 'name-' || s, CAST(s AS DECIMAL(20,2)) / 100, "
                        "TIMESTAMP '2024-01-01' + to_seconds(s), CAST(s AS DECIMAL(20,1)) * 0.5, "
                        f"repeat('x', CAST(s % 50 AS INTEGER)), s * 7 FROM range(0, {rows}) r(s)")
    finally:
        target.close()


def _producer_checksums(cfg_path: Path) -> dict[str, dict[str, Any]]:
    """chunk id -> the CHECKSUM record's payload, read from the file transport."""
    from cynomys.core.config import load_config
    from cynomys.core.model import Op

    out: dict[str, dict[str, Any]] = {}
    for _, batch in transport_batches(load_config(cfg_path, env={})):
        for c in batch.changes:
            if c.op is Op.CHECKSUM:
                p = json.loads(c.sql or "{}")
                out[p["chunk"]] = p
    return out


def _producer_side(cfg: Path, lat: Latency) -> tuple[dict[str, Any], list[float], Any]:
    from cynomys.core.config import load_config
    from cynomys.verify.state import DONE, RUNNING, store_for

    c = load_config(cfg, env={})
    store = store_for(c)
    log = cfg.parent / "producer.log"
    proc = daemon(cfg, "produce", log)
    try:
        _wait_started(proc, cfg.parent / "state", log)
        ident = "bench-verify"

        def over(job: Any) -> dict[str, Any] | None:
            if job.status == RUNNING:
                return None
            return {"status": job.status, "chunks": len(job.chunks), "rows": job.tasks[0].rows, "job": job}

        store.submit({"action": "start", "id": ident, "tables": ["bench.t"], "chunk_size": 0})
        info, samples = _time_job(proc, lat, lambda: next((j for j in store.load() if j.id == ident), None), over)
        if info.get("status") != DONE:
            raise RuntimeError(f"verify ended {info}; see {log}")
        job = info.pop("job")
        info["rows_per_s"] = round(info["rows"] / info["seconds"], 1)
        return info, samples, job
    finally:
        proc.terminate()
        proc.wait(60)


def _applier_side(tgt: MariaDBServer, cfg_path: Path, job: Any, records: dict[str, dict[str, Any]],
                  read_back: bool = True) -> dict[str, Any]:
    from cynomys.applier.targets.base import Target
    from cynomys.applier.targets.columnstore import verify as cs_verify
    from cynomys.applier.targets.columnstore.config import ColumnStoreConfig
    from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
    from cynomys.core.config import Config, TargetConfig, load_config
    from cynomys.snapshot.source import SnapshotConnection
    from cynomys.verify.checksum import Checksum, KeyRange

    src_cfg = load_config(cfg_path, env={})
    conn = SnapshotConnection(src_cfg.source)
    schema = conn.describe("bench", "t").schema
    conn.close()
    target = ColumnStoreTarget(Config(target=TargetConfig(kind="columnstore", url=tgt.url,
                                                          options=(ColumnStoreConfig("InnoDB"),))))
    target.connect()
    out: dict[str, Any] = {}
    try:
        ranges = [(c["id"], KeyRange.from_dict(c["range"])) for c in job.chunks]
        ways = [("sql", lambda r: cs_verify.checksum_range(target, schema, r)),
                ("read_back", lambda r: Target.checksum_range(target, schema, r))]
        for name, compute in ways if read_back else ways[:1]:
            t0 = time.monotonic()
            rows = mismatched = 0
            for cid, rng in ranges:
                got: Checksum = compute(rng)
                rows += got.count
                if got != Checksum.from_dict(records[cid]):
                    mismatched += 1
            secs = time.monotonic() - t0
            out[name] = {"seconds": round(secs, 3), "rows": rows, "rows_per_s": round(rows / secs, 1),
                         "chunks": len(ranges), "chunks_differing_from_producer": mismatched}
            print(f"applier side ({name}): {out[name]}", flush=True)
    finally:
        target.close()
    return out


def _through_daemons(cfg: Path, rows: int, chunks: int, timeout_s: float, peaks: dict[str, Any]) -> dict[str, Any]:
    """`cynomys verify` as a user runs it, with both daemons going (their
    peak RSS into ``peaks``)."""
    import subprocess

    from cynomys.core.config import load_config
    from cynomys.verify.applier import read_results, results_path

    work = cfg.parent
    prod = daemon(cfg, "produce", work / "producer-e2e.log")
    app = daemon(cfg, "apply", work / "applier-e2e.log")
    try:
        # Caught up: the applier has checked every chunk of the producer-side
        # job that is already in the transport.
        path = results_path(load_config(cfg, env={}))
        deadline = time.monotonic() + timeout_s
        while len(read_results(path)) < chunks and time.monotonic() < deadline:
            if app.poll() is not None or prod.poll() is not None:
                raise RuntimeError(f"a daemon exited; see {work}/*-e2e.log")
            time.sleep(0.5)
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "cynomys.cli", "verify", "-c", str(cfg), "--tables", "bench.t",
                               "--no-progress", "--timeout", str(int(timeout_s))],
                              cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
        secs = time.monotonic() - t0
        if done.returncode != 0:
            raise RuntimeError(f"cynomys verify exited {done.returncode}: {done.stdout}{done.stderr}")
        last = done.stdout.strip().splitlines()[-1]
        out = {"seconds": round(secs, 3), "rows": rows, "rows_per_s": round(rows / secs, 1), "summary": last,
               "load_avg_1m_at_end": os.getloadavg()[0]}
        print(f"through the daemons: {out}", flush=True)
        return out
    finally:
        for proc in (prod, app):
            proc.terminate()
            proc.wait(60)
        import re

        for name in ("producer", "applier"):
            found = re.findall(r"peak RSS ([0-9.]+) MB", (work / f"{name}-e2e.log").read_text(errors="replace"))
            peaks[name] = float(found[-1]) if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk-size", type=int, default=0, help="rows per chunk (0: the product's default)")
    ap.add_argument("--phase-s", type=float, default=10.0, help="length of the no-verify phases")
    ap.add_argument("--write-rate", type=float, default=200.0, help="latency client's INSERTs per second")
    ap.add_argument("--quick", action="store_true", help="50k rows, 3 s phases")
    ap.add_argument("--target", default="columnstore", choices=("columnstore", "duckdb"))
    ap.add_argument("--no-read-back", dest="read_back", action="store_false",
                    help="skip timing the read-back checksum (Python) on the target")
    ap.add_argument("--name", default="", help="result file name (default verify, verify_duckdb)")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.phase_s = 50_000, 3.0
    work = Path(tempfile.mkdtemp(prefix="cynomys-bench-verify-"))
    srv = MariaDBServer(server_id=1).start()
    duck = work / "target.duckdb" if args.target == "duckdb" else None
    tgt = MariaDBServer(server_id=2).start() if duck is None else None
    try:
        t0 = time.monotonic()
        _load(srv, args.rows, DDL)
        keys = generate_keys(work / "keys", rsa_bits=2048)
        cfg = _config(work / "c.toml", srv, tgt, keys, args.chunk_size, duck)
        if tgt is not None:
            _load(tgt, args.rows, DDL)
        else:
            _load_duckdb(duck, cfg, args.rows)  # type: ignore[arg-type]
        print(f"loaded {args.rows} rows on both sides in {time.monotonic() - t0:.1f}s", flush=True)
        lat = Latency(srv, args.write_rate)
        samples: dict[str, list[float]] = {}
        # The producer follows the binlog during the baseline too.
        base = daemon(cfg, "produce", work / "baseline.log")
        time.sleep(2.0)
        lat.run_until(None, min(5.0, args.phase_s))  # warm-up, not counted
        samples["baseline"] = lat.run_until(None, args.phase_s)
        base.terminate()
        base.wait(60)
        print(f"baseline: {_stats(samples['baseline'])}", flush=True)
        producer, samples["verify"], job = _producer_side(cfg, lat)
        print(f"producer side: {producer}, latency {_stats(samples['verify'])}", flush=True)
        samples["after"] = lat.run_until(None, args.phase_s)
        print(f"after: {_stats(samples['after'])}", flush=True)
        records = _producer_checksums(cfg)
        applier = _applier_side(tgt, cfg, job, records, args.read_back) if tgt is not None else {}
        peaks: dict[str, Any] = {}
        applier["through_daemons"] = _through_daemons(cfg, args.rows, len(job.chunks), 3600, peaks)
        applier["through_daemons"]["peak_rss_mb"] = peaks
        lat_stats = {k: _stats(v) for k, v in samples.items()}
        p99_ratio = round(lat_stats["verify"]["p99_ms"] / lat_stats["baseline"]["p99_ms"], 2)
        result = {
            "target": args.target,
            "rows": args.rows, "chunk_size": args.chunk_size, "table_columns": 8, "write_rate_per_s": args.write_rate,
            "producer_side": producer, "applier_side": applier,
            "write_latency": lat_stats, "writer_p99_ratio_verify_vs_baseline": p99_ratio,
            "notes": ("producer = `cynomys produce` (own process), sealed envelopes to a file transport; producer "
                      "rows_per_s from the request being picked up to the last chunk being checkpointed (select "
                      "between watermarks, canonical hash in Python, envelope); applier side timed in this "
                      "process against a second MariaDB holding the same rows (InnoDB), every chunk range of the "
                      "producer's job, compared with the producer's CHECKSUM records; latency client = paced "
                      "single-row autocommit INSERTs into another table of the source; 2-CPU shared VM: the "
                      "source, target, producer and client share the CPUs, other jobs ran too (load in machine)"),
        }
        name = args.name or ("verify" if args.target == "columnstore" else f"verify_{args.target}")
        out = write_result(name, result)
        _plot(samples, producer, applier, RESULTS / f"{name}.png")
        print(f"wrote {out} and {RESULTS / (name + '.png')}; writer p99 ratio {p99_ratio}")
    finally:
        srv.destroy()
        if tgt is not None:
            tgt.destroy()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _plot(samples: dict[str, list[float]], producer: dict[str, Any], applier: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    _plot_latency(ax1, samples, "`cynomys verify`")
    bars = {"producer\n(source chunks)": producer["rows_per_s"]}
    if "sql" in applier:
        bars["applier\nSQL aggregate"] = applier["sql"]["rows_per_s"]
    if "read_back" in applier:
        bars["applier\nread back"] = applier["read_back"]["rows_per_s"]
    bars["`cynomys verify`\nthrough daemons"] = applier["through_daemons"]["rows_per_s"]
    ax2.bar(list(bars), list(bars.values()), color=["tab:blue", "tab:green", "tab:orange", "tab:purple"][-len(bars):])
    for i, v in enumerate(bars.values()):
        ax2.text(i, v, f"{v:.0f}", ha="center", va="bottom")
    ax2.set_ylabel("rows/s checksummed")
    ax2.set_title("verify throughput")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
