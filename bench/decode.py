"""Producer decode rate against its baselines, on one binlog, side by side.

    python bench/decode.py [--rows 200000] [--rounds 3] [--cpu N]

Writes TPC-H lineitem rows into a throwaway MariaDB (1000-row multi-row
INSERTs, one commit each), then reads the same binlog range with:

1. ``mariadb-binlog --read-from-remote-server --base64-output=decode-rows -v``
   (the server's own C decoder, output to /dev/null);
2. raw ``mysql-replication``: iterate every row of every WRITE_ROWS event;
3. Cynomys parse (BinlogSource: our row decoder) only;
4. Cynomys parse + reduce (fold) + serialize (Avro): the producer's work
   before the transport;
5. the same plus sealing (gzip + AES-GCM + signature);

3-5 on both hot paths: compiled (``cynomys._speedups``) and pure Python
(``cynomys.core.compiled.use_compiled(False)``, what ``CYNOMYS_PURE_PYTHON=1``
selects).  This process and the processes it starts (mariadb-binlog) are
pinned to one core (``--cpu``, default the last one); the MariaDB server
serving the binlog is not.

Rounds are interleaved (1,2,3,...,8,1,2,...) so load on this shared machine
hits all alike; the best round is reported, as rows per wall-clock second
(the headline) and per CPU second of the reader (this process, or the
mariadb-binlog child), which the other work on a shared box disturbs less.  A cProfile of (4) on the
compiled path says where the time goes.  Writes bench/results/decode.json
and decode.png.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, write_result  # noqa: E402
from bench.tpch import LINEITEM_DDL, lineitem  # noqa: E402
from cynomys.core import compiled  # noqa: E402
from cynomys.core.config import SourceConfig  # noqa: E402
from cynomys.core.model import Batch, Change, Position  # noqa: E402
from cynomys.parser.stream import BinlogSource  # noqa: E402
from cynomys.parser.txn import Assembler, Commit  # noqa: E402
from cynomys.reducer.fold import Folder  # noqa: E402
from cynomys.sandbox.mariadb import REPL_PASSWORD, REPL_USER, MariaDBServer  # noqa: E402
from cynomys.schemas import codec  # noqa: E402


def load(srv: MariaDBServer, rows: list[tuple[Any, ...]]) -> tuple[Position, Position]:
    srv.execute("CREATE DATABASE IF NOT EXISTS tpch", "USE tpch", "DROP TABLE IF EXISTS tpch.lineitem")
    srv.execute(LINEITEM_DDL, database="tpch")
    f, p = srv.execute("SHOW MASTER STATUS")[0][:2]
    conn = srv.connect("tpch")
    marks = ",".join(["%s"] * 16)
    with conn.cursor() as cur:
        for i in range(0, len(rows), 1000):
            part = rows[i:i + 1000]
            cur.execute("INSERT INTO lineitem VALUES " + ",".join(f"({marks})" for _ in part),
                        [v for r in part for v in r])
    conn.close()
    f2, p2 = srv.execute("SHOW MASTER STATUS")[0][:2]
    return Position(f, p), Position(f2, p2)


def source_cfg(srv: MariaDBServer) -> SourceConfig:
    return SourceConfig(host="127.0.0.1", port=srv.port, user=REPL_USER, password=REPL_PASSWORD,
                        include_tables=["tpch.*"])


def run_mariadb_binlog(srv: MariaDBServer, start: Position, end: Position, expect: int) -> int:
    exe = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if exe is None:
        raise SystemExit("mariadb-binlog not found: apt-get install mariadb-client")
    subprocess.run([exe, "--read-from-remote-server", "--host=127.0.0.1", f"--port={srv.port}", f"--user={REPL_USER}",
                    f"--password={REPL_PASSWORD}", "--base64-output=decode-rows", "-v",
                    f"--start-position={start.pos}", f"--stop-position={end.pos}", start.file],
                   check=True, stdout=subprocess.DEVNULL)
    return expect  # it prints every row; counted by the other readers


def run_raw_library(srv: MariaDBServer, start: Position, end: Position, expect: int) -> int:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    reader = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": srv.port, "user": REPL_USER, "password": REPL_PASSWORD},
        server_id=991, blocking=False, resume_stream=True, log_file=start.file, log_pos=start.pos,
        only_events=[WriteRowsEvent], end_log_pos=end.pos)
    n = 0
    for ev in reader:
        for row in ev.rows:
            n += 1
    reader.close()
    return n


def _cynomys(srv: MariaDBServer, start: Position, end: Position, *, fold: bool, seal: Callable[[bytes], bytes] | None,
             batch_rows: int = 5000) -> int:
    src = BinlogSource(source_cfg(srv), start, blocking=False, is_mariadb=True)
    asm = Assembler()
    folder = Folder()
    n = 0
    for ev in src:
        if ev.end.file == end.file and ev.end.pos > end.pos:
            break
        if not fold:
            n += len(ev.rows)
            continue
        for item in asm.feed(ev):
            if isinstance(item, Change):
                folder.add(item)
                n += 1
            elif isinstance(item, Commit) and len(folder) >= batch_rows:
                payload = codec.encode(Batch("bench", tuple(folder.changes()), item.end))
                if seal:
                    seal(payload)
                folder = Folder()
    if len(folder):
        payload = codec.encode(Batch("bench", tuple(folder.changes()), end))
        if seal:
            seal(payload)
    src.close()
    return n


def make_sealer() -> Callable[[bytes], bytes]:
    from cynomys.transport.envelope import Sealer
    from cynomys.transport.keys import generate_keys, load_private_key, load_public_key

    d = Path(tempfile.mkdtemp())
    k = generate_keys(d)
    s = Sealer("bench", "bench", load_public_key(k["applier_public_key"]), load_private_key(k["producer_private_key"]),
               rotate_envelopes=1000, rotate_seconds=300)
    seq = iter(range(1, 10**9))
    return lambda payload: s.seal(payload, next(seq))


def plot(results: dict[str, float], out: Path, machine_note: str, *, unit: str = "rows/s",
         title: str = "Reading one binlog of TPC-H lineitem inserts") -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(10, 5))
    palette = {"mariadb": "#888", "mysql-replication": "#c77", "compiled": "#37a", "pure": "#d9a441"}
    colors = [next((c for k, c in palette.items() if k in n), "#7a7") for n in names]
    bars = ax.barh(names, [results[n] for n in names], color=colors)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
    ax.set_xlabel(f"{unit} (log scale)")
    ax.set_title(title)
    for b, n in zip(bars, names):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {results[n]:,.0f}", va="center")
    ax.invert_yaxis()
    fig.text(0.01, 0.01, machine_note, fontsize=7, color="#555")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the one core to run on")
    args = ap.parse_args()
    if not compiled.available():
        raise SystemExit("cynomys._speedups is not built: pip install -e . (needs gcc and the Python headers)")
    print(f"generating {args.rows} lineitem rows ...", flush=True)
    rows = lineitem(args.rows)
    work = Path(tempfile.mkdtemp(prefix="cynomys-bench-"))
    srv = MariaDBServer(server_id=7, base=str(work / "mariadb")).start()
    try:
        print("writing them into MariaDB ...", flush=True)
        start, end = load(srv, rows)
        sealer = make_sealer()
        # One core for this process and what it starts (mariadb-binlog).
        os.sched_setaffinity(0, {args.cpu})

        def on(path: str, fn: Callable[[], int]) -> Callable[[], int]:
            def run() -> int:
                compiled.use_compiled(path == "compiled")
                return fn()
            return run

        readers: dict[str, Callable[[], int]] = {
            "mariadb-binlog (C, decode-rows -v)": lambda: run_mariadb_binlog(srv, start, end, len(rows)),
            "mysql-replication, raw rows": lambda: run_raw_library(srv, start, end, len(rows)),
        }
        for path in ("compiled", "pure"):
            readers.update({
                f"Cynomys parse [{path}]": on(path, lambda: _cynomys(srv, start, end, fold=False, seal=None)),
                f"Cynomys parse+reduce+serialize [{path}]": on(path, lambda: _cynomys(srv, start, end, fold=True, seal=None)),
                f"... + seal (gzip, AES-GCM, sign) [{path}]": on(path, lambda: _cynomys(srv, start, end, fold=True, seal=sealer)),
            })
        logging.getLogger("cynomys.core.compiled").setLevel(logging.ERROR)  # the path switches on purpose here

        def cpu_s() -> float:
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            return time.process_time() + kids.ru_utime + kids.ru_stime

        best: dict[str, float] = {}
        best_cpu: dict[str, float] = {}
        for r in range(args.rounds):
            for name, fn in readers.items():
                t0, c0 = time.perf_counter(), cpu_s()
                n = fn()
                dt, dc = time.perf_counter() - t0, cpu_s() - c0
                assert n == len(rows), f"{name} read {n} rows, expected {len(rows)}"
                best[name] = max(best.get(name, 0.0), n / dt)
                best_cpu[name] = max(best_cpu.get(name, 0.0), n / dc)
                print(f"round {r + 1}: {name:<46} {n / dt:>12,.0f} rows/s {n / dc:>12,.0f} rows/cpu-s", flush=True)
        compiled.use_compiled(True)
        prof = cProfile.Profile()
        prof.enable()
        _cynomys(srv, start, end, fold=True, seal=None)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        top = [line for line in s.getvalue().splitlines() if line.strip() and line.strip()[0].isdigit()][:15]
        total = pstats.Stats(prof).total_tt  # type: ignore[attr-defined]
    finally:
        srv.destroy()
        shutil.rmtree(work, ignore_errors=True)
    ratios = {n: round(v / best["mysql-replication, raw rows"], 2) for n, v in best.items()}
    out = write_result("decode", {"rows": len(rows), "rounds": args.rounds, "pinned_cpu": args.cpu,
                                  "compiled_fallbacks": dict(compiled.fallbacks),
                                  "rows_per_s_best": {k: round(v) for k, v in best.items()},
                                  "rows_per_cpu_s_best": {k: round(v) for k, v in best_cpu.items()},
                                  "ratio_to_raw_mysql_replication": ratios,
                                  "profile_top_tottime": top, "profile_total_s": round(total, 2)})
    from bench.common import machine
    m = machine()
    plot(best, RESULTS / "decode.png", f"{m['cpu']}, {m['cpus_online']} cores, readers pinned to one; "
                                       f"{len(rows)} rows; best of {args.rounds}")
    print("\nbest rows/s (ratio to raw mysql-replication), and rows per CPU second:")
    for name, v in best.items():
        print(f"  {name:<46} {v:>12,.0f}  x{ratios[name]:<8} {best_cpu[name]:>12,.0f} /cpu-s")
    print("\nwhere Cynomys parse+reduce+serialize [compiled] spends its time (tottime):")
    print("\n".join(top[:10]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
