"""The whole producer daemon against the server's own C decoder, on one binlog, side by side.

    python bench/decode.py [--rows 1000000] [--rounds 3] [--cpu N] [--before PATH] [--pure] [--no-profile]

Writes TPC-H lineitem rows into a throwaway MariaDB (1000-row multi-row
INSERTs, one commit each), then reads that binlog, in interleaved rounds,
with:

1. ``mariadb-binlog --read-from-remote-server --base64-output=decode-rows -v``
   (the server's own C decoder, printing every row; output to /dev/null);
2. ``cynomys produce --once`` as a user runs it: the daemon process, started
   at the binlog's start ([source] start) and running to its end, reading
   from the server, assembling transactions, folding, writing Avro, sealing
   (gzip, AES-GCM, Ed25519) and publishing to the file transport with its
   state saved -- its whole life, start-up included;
3. with ``--before PATH``: the same daemon from another checkout (the code
   before a change, e.g. /work/main), in the same rounds;
4. with ``--pure``: the daemon on the pure-Python reference path
   (``CYNOMYS_PURE_PYTHON=1``), one round (it is slow).

Every reader is pinned to one core (``--cpu``, default the last); the
MariaDB server serving the binlog is not.  The machine is shared, so each
run records the load, and both wall time and CPU seconds (the process's own
rusage, which other work disturbs less) are reported; the ratio of the
daemon to mariadb-binlog is taken per round (the two ran back to back) and
its median reported.  The daemon runs with its bytecode compiled once
beforehand (as an installed package has it).

Then, where the time goes: the daemon sampled by py-spy (every thread; the
samples sorted into the pipeline's stages: read, assemble, tasks, batching,
fold, Avro, seal, transport, state, start-up), and in this process on one
core the cost per row of each step alone (read, assemble, fold, Avro, seal).
Writes bench/results/decode.json and decode.png.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import RESULTS, machine, write_result  # noqa: E402
from bench.tpch import LINEITEM_DDL, lineitem  # noqa: E402
from cynomys.core import compiled  # noqa: E402
from cynomys.core.config import SourceConfig  # noqa: E402
from cynomys.core.model import Batch, Change, Position  # noqa: E402
from cynomys.sandbox.mariadb import REPL_PASSWORD, REPL_USER, MariaDBServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


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


# -- running the readers as processes, pinned, measured ----------------------------
@dataclass
class Run:
    """One reader's run: wall seconds, CPU seconds (user + system of the
    process and what it waited for), the load average before it."""

    wall: float
    cpu: float
    load: float
    stats: dict[str, Any] = field(default_factory=dict)


def run_pinned(cmd: list[str], cpu: int, *, env: dict[str, str] | None = None, cwd: Path | None = None,
               quiet: bool = True) -> Run:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL if quiet else None,
                            stderr=subprocess.PIPE, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} ... exited {proc.returncode}:\n{err.decode(errors='replace')[-3000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, load)


def mariadb_binlog(srv: MariaDBServer, start: Position, end: Position, cpu: int) -> Run:
    exe = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if exe is None:
        raise SystemExit("mariadb-binlog not found: apt-get install mariadb-client")
    return run_pinned([exe, "--read-from-remote-server", "--host=127.0.0.1", f"--port={srv.port}",
                       f"--user={REPL_USER}", f"--password={REPL_PASSWORD}", "--base64-output=decode-rows", "-v",
                       f"--start-position={start.pos}", f"--stop-position={end.pos}", start.file], cpu)


class Daemon:
    """``cynomys produce --once`` with the file transport, as a process:
    one config per run (a fresh state and transport file), keys made once."""

    def __init__(self, work: Path, srv: MariaDBServer, start: Position, include: str, *, code: Path = ROOT,
                 pure: bool = False) -> None:
        from cynomys.transport.keys import generate_keys

        self.work, self.srv, self.start, self.include, self.code = work, srv, start, include, code
        self.keys = work / "keys"
        if not self.keys.exists():
            generate_keys(self.keys)
        self.pure = pure
        self.runs = 0
        self.pycache = work / "pycache"

    def config(self, start: Position | None = None) -> Path:
        self.runs += 1
        d = self.work / f"run-{self.runs}"
        d.mkdir(parents=True)
        at = start or self.start
        cfg = d / "cynomys.toml"
        cfg.write_text(f"""[source]
host = "127.0.0.1"
port = {self.srv.port}
user = "{REPL_USER}"
password = "{REPL_PASSWORD}"
start = "{at.file}:{at.pos}"
include_tables = ["{self.include}"]
[producer]
state_dir = "{d / 'state'}"
[transport]
kind = "file"
path = "{d / 'bus'}"
[security]
applier_public_key = "{self.keys / 'applier_public.pem'}"
producer_private_key = "{self.keys / 'producer_private.pem'}"
""")
        return cfg

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "CYNOMYS_PURE_PYTHON")}
        # Bytecode compiled once into a cache of its own (an install has it;
        # never written into the repository).
        env.update(PYTHONPATH=str(self.code), PYTHONPYCACHEPREFIX=str(self.pycache))
        if self.pure:
            env["CYNOMYS_PURE_PYTHON"] = "1"
        return env

    def command(self, cfg: Path) -> list[str]:
        return [sys.executable, "-m", "cynomys.cli", "--log-level", "WARNING", "produce", "--once", "-c", str(cfg)]

    def run(self, cpu: int, start: Position | None = None) -> Run:
        cfg = self.config(start)
        r = run_pinned(self.command(cfg), cpu, env=self.env(), cwd=self.code)
        state = json.loads((cfg.parent / "state" / "producer.json").read_text())
        r.stats = state.get("stats", {})
        r.stats["hot_path"] = state.get("hot_path", {})
        shutil.rmtree(cfg.parent, ignore_errors=True)
        return r

    def profile(self, cpu: int, out: Path) -> Run | None:
        """One run under py-spy (every thread, raw stacks); None without py-spy."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            return None
        cfg = self.config()
        r = run_pinned([spy, "record", "--rate", "250", "--threads", "--format", "raw", "--output", str(out),
                        "--", *self.command(cfg)], cpu, env=self.env(), cwd=self.code)
        shutil.rmtree(cfg.parent, ignore_errors=True)
        return r


# -- where the time goes: py-spy samples sorted into the pipeline's stages ---------
def _in(*paths: str) -> Callable[[str, str], bool]:
    return lambda func, path: any(path.endswith(p) or f"/{p}" in path for p in paths)


#: (stage, test on a frame's function and file); a sample of the loop goes
#: to the stage of its innermost frame that matches (Batching.flush ->
#: Sealer.seal is "seal").
STAGES: list[tuple[str, Callable[[str, str], bool]]] = [
    ("waiting (queue)", lambda f, p: f in ("Condition.wait", "Queue.get", "Queue.put")),
    ("seal (gzip, AES-GCM, Ed25519)", lambda f, p: f == "Sealer.seal"),
    ("Avro encode", _in("schemas/codec.py")),
    ("transport (file append, fsync)", lambda f, p: _in("transport/file_bus.py")(f, p) or f == "SealedSink.send"),
    ("state saves (JSON, fsync)", _in("core/checkpoint.py", "producer/state.py")),
    ("fold", _in("reducer/fold.py")),
    ("tasks observe (snapshot, verify)", lambda f, p: _in("snapshot/", "verify/")(f, p) or f == "observe_in_order"),
    ("metrics", _in("metrics/")),
    ("batching", _in("producer/batching.py")),
    ("assemble", _in("parser/txn.py")),
    # The compiled reader runs on the loop's thread (producer/loop.py _Direct):
    # its C calls show as the Python frames that make them.
    ("read (compiled reader, handoffs)",
     lambda f, p: _in("parser/creader.py", "parser/stream.py", "parser/files.py")(f, p) or f == "_Direct.get"),
    ("loop", lambda f, p: f == "Producer._loop"),
]


def _frame(text: str) -> tuple[str, str]:
    func, _, where = text.partition(" (")
    return func, where.rsplit(":", 1)[0]


def stage_shares(raw: Path) -> tuple[dict[str, float], int]:
    """Share of the samples per stage, and the number of samples.  The
    reader thread's samples are "read"; the main thread's outside the loop
    are start-up and exit (imports, keys, connections, the last save)."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        thread, *rest = stack.split(";")
        frames = [_frame(f) for f in rest]
        total += int(n)
        if "binlog-reader" in thread:
            stage = "waiting (queue)" if frames and frames[-1][0] in ("Condition.wait", "Queue.put") else \
                "read (the reader thread: C reader, handoffs)"
        elif not any(f == "Producer._loop" for f, _ in frames):
            stage = "start-up and exit (imports, keys, connections)"
        else:
            stage = next((name for func, path in reversed(frames) for name, test in STAGES if test(func, path)),
                         "other")
        counts[stage] += int(n)
    return {k: round(v / total, 3) for k, v in counts.most_common()} if total else {}, total


# -- the steps alone, in this process -------------------------------------------------
def step_costs(cfg: SourceConfig, start: Position, end: Position, rows: int) -> dict[str, float]:
    """Microseconds per row of each producer step alone, on one core, on the
    compiled path: read (BinlogSource with the compiled reader), assemble,
    fold (the producer's rules), Avro encode, seal."""
    from cynomys.parser.stream import BinlogSource
    from cynomys.parser.txn import Assembler
    from cynomys.reducer.fold import PRODUCER_RULES, Folder
    from cynomys.schemas import codec

    compiled.use_compiled(True)
    clock = time.process_time
    out: dict[str, float] = {}
    t0 = clock()
    src = BinlogSource(cfg, start, blocking=False, is_mariadb=True)
    events = []
    for batch in src.batches():
        events.extend(ev for ev in batch if not (ev.end.file == end.file and ev.end.pos > end.pos))
    src.close()
    out["read"] = clock() - t0
    asm = Assembler()
    t0 = clock()
    items = [x for ev in events for x in asm.feed(ev)]
    out["assemble"] = clock() - t0
    del events
    folder = Folder(PRODUCER_RULES)
    t0 = clock()
    for x in items:
        if isinstance(x, Change):
            folder.add(x)
    out["fold"] = clock() - t0
    changes = folder.changes()
    batches = [Batch("bench", tuple(changes[i:i + 5000]), end) for i in range(0, len(changes), 5000)]
    t0 = clock()
    payloads = [codec.encode(b) for b in batches]
    out["Avro encode"] = clock() - t0
    seal = _sealer()
    t0 = clock()
    for p in payloads:
        seal(p)
    out["seal"] = clock() - t0
    return {k: round(v / rows * 1e6, 2) for k, v in out.items()}


def _sealer() -> Callable[[bytes], bytes]:
    from cynomys.transport.envelope import Sealer
    from cynomys.transport.keys import generate_keys, load_private_key, load_public_key

    d = Path(tempfile.mkdtemp())
    k = generate_keys(d)
    s = Sealer("bench", "bench", load_public_key(k["applier_public_key"]), load_private_key(k["producer_private_key"]),
               rotate_envelopes=1000, rotate_seconds=300)
    seq = iter(range(1, 10**9))
    return lambda payload: s.seal(payload, next(seq))


# -- the whole comparison ---------------------------------------------------------
def compare(srv: MariaDBServer, start: Position, end: Position, work: Path, *, include: str, units: int,
            unit: str, rounds: int, cpu: int, before: Path | None, pure: bool, profile: bool,
            check: Callable[[Run], None]) -> dict[str, Any]:
    """mariadb-binlog and the daemon(s) in interleaved rounds; the daemon's
    start-up alone; a profile.  ``units``: rows or transactions in the range."""
    daemons = {"cynomys produce": Daemon(work / "now", srv, start, include)}
    if before is not None:
        daemons["cynomys produce (before)"] = Daemon(work / "before", srv, start, include, code=before)
    for d in daemons.values():  # compile the bytecode once; warm the server's cache
        d.run(cpu, start=end)
    mariadb_binlog(srv, start, end, cpu)
    runs: dict[str, list[Run]] = collections.defaultdict(list)
    for r in range(rounds):
        readers: dict[str, Callable[[], Run]] = {"mariadb-binlog -v": lambda: mariadb_binlog(srv, start, end, cpu)}
        readers.update({name: (lambda d=d: d.run(cpu)) for name, d in daemons.items()})
        for name, fn in readers.items():
            run = fn()
            if name != "mariadb-binlog -v":
                check(run)
            runs[name].append(run)
            print(f"round {r + 1}: {name:<28} {units / run.wall:>12,.0f} {unit}/s wall {units / run.cpu:>12,.0f} "
                  f"{unit}/cpu-s  ({run.wall:.2f} s, {run.cpu:.2f} cpu-s, load {run.load:.1f})", flush=True)
    if pure:
        d = Daemon(work / "pure", srv, start, include, pure=True)
        run = d.run(cpu)
        check(run)
        runs["cynomys produce (pure Python)"].append(run)
        print(f"pure: {units / run.wall:,.0f} {unit}/s wall {units / run.cpu:,.0f} {unit}/cpu-s", flush=True)
    startup = [daemons["cynomys produce"].run(cpu, start=end) for _ in range(3)]
    shares, samples = {}, 0
    if profile:
        raw = work / "profile.txt"
        if daemons["cynomys produce"].profile(cpu, raw) is not None:
            shares, samples = stage_shares(raw)
    base = runs["mariadb-binlog -v"]

    def summary(rs: list[Run]) -> dict[str, Any]:
        return {"wall_s": [round(r.wall, 3) for r in rs], "cpu_s": [round(r.cpu, 3) for r in rs],
                "load": [round(r.load, 1) for r in rs],
                f"{unit}_per_s_best": round(max(units / r.wall for r in rs)),
                f"{unit}_per_cpu_s_best": round(max(units / r.cpu for r in rs))}

    out: dict[str, Any] = {"readers": {name: summary(rs) for name, rs in runs.items()}}
    # Per round: the daemon's rate over mariadb-binlog's, both run back to back.
    out["ratio_to_mariadb_binlog"] = {
        name: {"wall_median": round(statistics.median(b.wall / r.wall for b, r in zip(base, rs)), 3),
               "cpu_median": round(statistics.median(b.cpu / r.cpu for b, r in zip(base, rs)), 3),
               "wall_best_over_best": round(min(b.wall for b in base) / min(r.wall for r in rs), 3),
               "cpu_best_over_best": round(min(b.cpu for b in base) / min(r.cpu for r in rs), 3)}
        for name, rs in runs.items() if name != "mariadb-binlog -v" and len(rs) == len(base)}
    out["daemon_startup"] = {"wall_s_min": round(min(r.wall for r in startup), 3),
                             "cpu_s_min": round(min(r.cpu for r in startup), 3),
                             "note": "cynomys produce --once with nothing to read: imports, keys, connections"}
    if shares:
        out["profile_stage_shares"] = shares
        out["profile_samples"] = samples
    out["hot_path"] = runs["cynomys produce"][0].stats.get("hot_path", {})
    return out


def plot(results: dict[str, dict[str, Any]], unit: str, out: Path, title: str, note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.9 + 0.55 * len(names)), sharey=True)
    palette = {"mariadb": "#888", "before": "#c77", "pure": "#d9a441"}
    colors = [next((c for k, c in palette.items() if k in n), "#37a") for n in names]
    for ax, key, label in ((axes[0], f"{unit}_per_s_best", f"{unit}/s, wall clock"),
                           (axes[1], f"{unit}_per_cpu_s_best", f"{unit} per CPU second")):
        vals = [results[n][key] for n in names]
        bars = ax.barh(names, vals, color=colors)
        ax.set_xlabel(label + " (best round)")
        for b, v in zip(bars, vals):
            ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v:,.0f}", va="center", fontsize=8)
        ax.set_xlim(0, max(vals) * 1.25)
    axes[0].invert_yaxis()
    fig.suptitle(title)
    fig.text(0.01, 0.01, note, fontsize=7, color="#555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the one core every reader runs on")
    ap.add_argument("--before", type=Path, help="another checkout whose daemon runs in the same rounds")
    ap.add_argument("--pure", action="store_true", help="one round of the pure-Python reference daemon too")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    if not (compiled.available() and compiled.reader_available()):
        raise SystemExit("the compiled extensions are not built: pip install -e . (needs gcc and the Python headers)")
    print(f"generating {args.rows} lineitem rows ...", flush=True)
    rows = lineitem(args.rows)
    work = Path(tempfile.mkdtemp(prefix="cynomys-bench-"))
    srv = MariaDBServer(server_id=7, base=str(work / "mariadb")).start()
    try:
        print("writing them into MariaDB ...", flush=True)
        start, end = load(srv, rows)
        del rows

        def check(run: Run) -> None:
            assert run.stats.get("changes_in") == args.rows, f"the daemon read {run.stats}, expected {args.rows} rows"

        result = compare(srv, start, end, work, include="tpch.*", units=args.rows, unit="rows", rounds=args.rounds,
                         cpu=args.cpu, before=args.before, pure=args.pure, profile=not args.no_profile, check=check)
        os.sched_setaffinity(0, {args.cpu})
        cfg = SourceConfig(host="127.0.0.1", port=srv.port, user=REPL_USER, password=REPL_PASSWORD,
                           include_tables=["tpch.*"])
        result["step_costs_us_per_row"] = step_costs(cfg, start, end, args.rows)
        result["step_costs_note"] = ("each step alone in one process on one core, compiled path: read (BinlogSource, "
                                     "the compiled reader), assemble, fold, Avro encode, seal")
    finally:
        srv.destroy()
        shutil.rmtree(work, ignore_errors=True)
    readers = result["readers"]
    out = write_result("decode", {
        "rows": args.rows, "rounds": args.rounds, "pinned_cpu": args.cpu,
        "what": "cynomys produce --once (file transport) as a process vs mariadb-binlog -v, same binlog, one core",
        "before": str(args.before) if args.before else None,
        "rows_per_s_best": {k: v["rows_per_s_best"] for k, v in readers.items()},
        "rows_per_cpu_s_best": {k: v["rows_per_cpu_s_best"] for k, v in readers.items()},
        **result})
    m = machine()
    plot(readers, "rows", RESULTS / "decode.png", "The producer daemon reading a binlog of TPC-H lineitem inserts",
         f"{m['cpu']}, {m['cpus_online']} cores, every reader pinned to one; {args.rows:,} rows; best of "
         f"{args.rounds}; load {min(r for v in readers.values() for r in v['load']):.0f}-"
         f"{max(r for v in readers.values() for r in v['load']):.0f}")
    print(json.dumps({k: result[k] for k in ("ratio_to_mariadb_binlog", "daemon_startup")}, indent=1))
    print("where the daemon's time goes:", json.dumps(result.get("profile_stage_shares", {}), indent=1))
    print("each step alone (us/row):", result["step_costs_us_per_row"])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
