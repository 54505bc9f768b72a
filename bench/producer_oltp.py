"""The producer on an OLTP binlog (many small transactions), side by side.

    python bench/producer_oltp.py [--seconds 20] [--rounds 3] [--cpu N]

The source first runs the mixed workload of the end-to-end tests (4 writers,
tests/integration/test_e2e_columnstore._writer: one- and two-statement
transactions on three tables) for ``--seconds``; then the same binlog range
is read by:

1. ``mariadb-binlog --read-from-remote-server --base64-output=decode-rows -v``
   (the server's own C decoder, output to /dev/null);
2. raw ``mysql-replication`` as the library comes (every event);
3. the same with Cynomys' TABLE_MAP cache (cynomys/parser/tablemap.py);
4. Cynomys parse (BinlogSource), with and without the cache;
5. the whole producer (cynomys.producer.Producer: reader thread, assembly,
   fold, batching, state, Avro, gzip + AES-GCM + signature; no transport),
   with and without the cache.

Every reader runs pinned to one core (``--cpu``); the MariaDB server is
not.  Reported per reader: source transactions per second (best of the
rounds), beside the rate at which the 4 writers committed them: a producer
slower than that falls behind the source for good.  Writes
bench/results/producer_oltp.json and producer_oltp.png, and a cProfile of
(5) with the cache.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, machine, write_result  # noqa: E402
from bench.decode import make_sealer, plot, run_mariadb_binlog  # noqa: E402
from cynomys.core.config import SourceConfig, load_config  # noqa: E402
from cynomys.core.model import Position  # noqa: E402
from cynomys.parser import tablemap  # noqa: E402
from cynomys.parser.stream import _ALL_EVENT_CLASSES, BinlogSource  # noqa: E402
from cynomys.producer import Producer  # noqa: E402
from cynomys.schemas import codec  # noqa: E402
from tests.helpers import write_config  # noqa: E402
from tests.integration.test_e2e_columnstore import TABLES, _writer  # noqa: E402
from tests.servers.mariadb import REPL_PASSWORD, REPL_USER, MariaDBServer  # noqa: E402


def write_workload(src: MariaDBServer, seconds: float) -> tuple[Position, Position, int, float]:
    src.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()])
    f0, p0 = src.execute("SHOW MASTER STATUS")[0][:2]
    stop, done, errors = threading.Event(), [0], []  # type: ignore[var-annotated]
    writers = [threading.Thread(target=_writer, args=(src, stop, seed, done, errors)) for seed in range(4)]
    t0 = time.perf_counter()
    for w in writers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in writers:
        w.join()
    took = time.perf_counter() - t0
    if errors:
        raise errors[0]
    f1, p1 = src.execute("SHOW MASTER STATUS")[0][:2]
    return Position(f0, p0), Position(f1, p1), done[0], took


def raw_library(src: MariaDBServer, start: Position, end: Position) -> int:
    from pymysqlreplication import BinLogStreamReader

    reader = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": src.port, "user": REPL_USER, "password": REPL_PASSWORD},
        server_id=991, blocking=False, resume_stream=True, log_file=start.file, log_pos=start.pos,
        only_events=list(_ALL_EVENT_CLASSES), filter_non_implemented_events=False, end_log_pos=end.pos)
    n = sum(1 for _ in reader)
    reader.close()
    return n


def parse(src: MariaDBServer, start: Position, end: Position) -> int:
    s = BinlogSource(SourceConfig(host="127.0.0.1", port=src.port, user=REPL_USER, password=REPL_PASSWORD,
                                  include_tables=["app.*"]), start, blocking=False)
    n = sum(1 for ev in s if not (ev.end.file == end.file and ev.end.pos > end.pos))
    s.close()
    return n


class SealSink:
    """The producer's sink minus the network: Avro, then sealed."""

    fence_token = 0  # no HA lease
    fence_term = ""
    bytes_sent = 0

    def __init__(self) -> None:
        self.seal = make_sealer()
        self.changes = 0

    def last_sequence(self) -> int:
        return 0

    def send(self, seq: int, batch: Any, stop: threading.Event) -> None:
        self.seal(codec.encode(batch))
        self.changes += len(batch.changes)

    def describe(self) -> str:
        return "sealed, not sent"


def producer(src: MariaDBServer, work: Path) -> int:
    d = Path(tempfile.mkdtemp(dir=work))
    cfg = load_config(write_config(d / "c.toml", src, source={"include_tables": ["app.*"]}), env={})
    sink = SealSink()
    Producer(cfg, sink, blocking=False).run()
    return sink.changes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the one core to run on")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="cynomys-bench-"))
    src = MariaDBServer(server_id=7, base=str(work / "mariadb")).start()
    try:
        print(f"4 writers for {args.seconds:.0f} s ...", flush=True)
        start, end, txns, took = write_workload(src, args.seconds)
        source_rate = txns / took
        print(f"{txns} transactions ({source_rate:,.0f}/s)", flush=True)
        os.sched_setaffinity(0, {args.cpu})

        def cache(on: bool, fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                tablemap.install(on)
                return fn()
            return run

        readers: dict[str, Callable[[], Any]] = {
            "mariadb-binlog (C, decode-rows -v)": lambda: run_mariadb_binlog(src, start, end, 0),
            "mysql-replication, every event": cache(False, lambda: raw_library(src, start, end)),
            "mysql-replication + TABLE_MAP cache": cache(True, lambda: raw_library(src, start, end)),
            "Cynomys parse [no cache]": cache(False, lambda: parse(src, start, end)),
            "Cynomys parse": cache(True, lambda: parse(src, start, end)),
            "Cynomys producer, no transport [no cache]": cache(False, lambda: producer(src, work)),
            "Cynomys producer, no transport": cache(True, lambda: producer(src, work)),
        }
        best: dict[str, float] = {}
        for r in range(args.rounds):
            for name, fn in readers.items():
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                best[name] = max(best.get(name, 0.0), txns / dt)
                print(f"round {r + 1}: {name:<44} {txns / dt:>10,.0f} txns/s ({dt:.1f} s)", flush=True)
        tablemap.install(True)
        prof = cProfile.Profile()
        prof.enable()
        producer(src, work)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        top = [line for line in s.getvalue().splitlines() if line.strip() and line.strip()[0].isdigit()][:15]
    finally:
        src.destroy()
        shutil.rmtree(work, ignore_errors=True)
    ratios = {n: round(v / source_rate, 2) for n, v in best.items()}
    out = write_result("producer_oltp", {
        "workload": "tests/integration/test_e2e_columnstore._writer x 4", "seconds": round(took, 1),
        "transactions": txns, "source_txns_per_s": round(source_rate), "rounds": args.rounds,
        "pinned_cpu": args.cpu, "txns_per_s_best": {k: round(v) for k, v in best.items()},
        "ratio_to_source_write_rate": ratios,
        "profile_note": "cProfile sees the main thread only; the reader thread's share is 'acquire' (waiting)",
        "profile_top_tottime": top})
    m = machine()
    plot({"source (4 writers)": source_rate, **best}, RESULTS / "producer_oltp.png",
         f"{m['cpu']}, {m['cpus_online']} cores, readers pinned to one; {txns} transactions; best of {args.rounds}",
         unit="source transactions/s", title="Reading an OLTP binlog (4 writers, small transactions)")
    print("\nbest transactions/s (ratio to the writers' rate):")
    for name, v in best.items():
        print(f"  {name:<44} {v:>10,.0f}  x{ratios[name]}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
