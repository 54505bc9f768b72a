"""The producer daemon on an OLTP binlog (many small transactions), against the server's C decoder.

    python bench/producer_oltp.py [--seconds 20] [--rounds 3] [--cpu N] [--before PATH] [--pure] [--no-profile]

The source first runs the mixed workload of the end-to-end tests (4 writers,
tests/integration/test_e2e_columnstore._writer: one- and two-statement
transactions on three tables, one of them keyless) for ``--seconds``; then
that binlog range is read, in interleaved rounds, by
``mariadb-binlog --read-from-remote-server --base64-output=decode-rows -v``
and by ``cynomys produce --once`` as a user runs it (the daemon process with
the file transport, from the range's start to the binlog's end), as
bench/decode.py does for lineitem rows -- pinned to one core, wall time and
CPU seconds, the load recorded, the daemon's start-up measured alone,
``--before`` another checkout's daemon in the same rounds, ``--pure`` one
round of the pure-Python reference, and where the daemon's time goes
(py-spy, sorted into the pipeline's stages).

Reported: source transactions per second, beside the rate at which the 4
writers committed them (a producer slower than that falls behind the
source for good).  Writes bench/results/producer_oltp.json and
producer_oltp.png.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, machine, write_result  # noqa: E402
from bench.decode import Run, compare, plot  # noqa: E402
from cynomys.core import compiled  # noqa: E402
from cynomys.core.model import Position  # noqa: E402
from tests.integration.test_e2e_columnstore import TABLES, _writer  # noqa: E402
from tests.servers.mariadb import MariaDBServer  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the one core every reader runs on")
    ap.add_argument("--before", type=Path, help="another checkout whose daemon runs in the same rounds")
    ap.add_argument("--pure", action="store_true", help="one round of the pure-Python reference daemon too")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not (compiled.available() and compiled.reader_available()):
        raise SystemExit("the compiled extensions are not built: pip install -e . (needs gcc and the Python headers)")
    work = Path(tempfile.mkdtemp(prefix="cynomys-bench-"))
    src = MariaDBServer(server_id=7, base=str(work / "mariadb")).start()
    try:
        print(f"4 writers for {args.seconds:.0f} s ...", flush=True)
        start, end, txns, took = write_workload(src, args.seconds)
        source_rate = txns / took
        print(f"{txns} transactions ({source_rate:,.0f}/s)", flush=True)

        seen: dict[str, dict[str, int]] = {}

        def check(run: Run) -> None:
            # Every run reads the same: transactions that changed nothing are
            # not in the binlog, so the writers' count is an upper bound.
            got = {k: int(run.stats.get(k, -1)) for k in ("transactions", "changes_in")}
            assert 0 < got["transactions"] <= txns and got == seen.setdefault("first", got) | {}, (got, seen)

        result = compare(src, start, end, work, include="app.*", units=txns, unit="txns", rounds=args.rounds,
                         cpu=args.cpu, before=args.before, pure=args.pure, profile=not args.no_profile, check=check)
    finally:
        src.destroy()
        shutil.rmtree(work, ignore_errors=True)
    readers = result["readers"]
    best = {k: v["txns_per_s_best"] for k, v in readers.items()}
    out = write_result("producer_oltp", {
        "workload": "tests/integration/test_e2e_columnstore._writer x 4", "seconds": round(took, 1),
        "transactions": txns, "source_txns_per_s": round(source_rate), "rounds": args.rounds,
        "pinned_cpu": args.cpu, "before": str(args.before) if args.before else None,
        "what": "cynomys produce --once (file transport) as a process vs mariadb-binlog -v, same binlog, one core",
        "txns_per_s_best": best, "txns_per_cpu_s_best": {k: v["txns_per_cpu_s_best"] for k, v in readers.items()},
        "ratio_to_source_write_rate": {n: round(v / source_rate, 2) for n, v in best.items()}, **result})
    m = machine()
    plot({"source (4 writers)": {"txns_per_s_best": round(source_rate), "txns_per_cpu_s_best": 0}, **readers}, "txns",
         RESULTS / "producer_oltp.png", "The producer daemon on an OLTP binlog (4 writers, small transactions)",
         f"{m['cpu']}, {m['cpus_online']} cores, every reader pinned to one; {txns:,} transactions; best of "
         f"{args.rounds}; load {min(r for v in readers.values() for r in v['load']):.0f}-"
         f"{max(r for v in readers.values() for r in v['load']):.0f}")
    print(json.dumps({k: result[k] for k in ("ratio_to_mariadb_binlog", "daemon_startup")}, indent=1))
    print("where the daemon's time goes:", json.dumps(result.get("profile_stage_shares", {}), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
