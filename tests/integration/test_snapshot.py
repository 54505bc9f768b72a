"""Snapshots (DBLog watermarks, and Debezium's read-only GTID variant) on a real MariaDB.

- Snapshot rows are in the binlog decoder's value domain, with its schema.
- `cynomys snapshot` against a running producer: named tables, --where,
  refusal of keyless tables, pause / resume / cancel, `cynomys status`.
- Read-only windows close on an idle source too (log position, heartbeats).
- A 50k-row table snapshotted while 4 writers insert, update and delete the
  same keys, the producer SIGKILLed mid-snapshot and resumed: replaying what
  the transport holds gives the source row by row, and per key no version
  ever goes backwards in stream order (no older image overwrites a newer).
  Then the real applier loads it into a second MariaDB (READ = upsert).
- The same in read-only mode, as a user with only SELECT, REPLICATION SLAVE
  and REPLICATION CLIENT.
"""
from __future__ import annotations

import dataclasses
import io
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pymysql
import pytest

from cynomys.core.checkpoint import read_json
from cynomys.core.config import Config, load_config
from cynomys.core.model import Batch, Change, Op, Position
from cynomys.producer import Producer
from cynomys.snapshot.command import run_snapshot_command
from cynomys.snapshot.errors import SnapshotRequestError
from cynomys.snapshot.source import SnapshotConnection
from cynomys.snapshot.state import CANCELLED, FINISHED, PAUSED, SnapshotJob, SnapshotStore, status_report
from cynomys.transport.keys import generate_keys
from tests.helpers import ListSink, transport_batches, wait_for, whole_transactions, write_config
from tests.integration.test_producer import ALL_TYPES, ROWS
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
ROWS_BIG = 50_000
KEY_SPACE = 55_000
VER = 2  # index of `ver` in w.t rows


# -- helpers ------------------------------------------------------------------------
def _master(srv: MariaDBServer) -> Position:
    f, p = srv.execute("SHOW MASTER STATUS")[0][:2]
    return Position(str(f), int(p))


class _Running:
    """An in-process blocking producer on a thread, with a ListSink."""

    def __init__(self, cfg: Config) -> None:
        self.sink = ListSink()
        self.stop = threading.Event()
        self.error: list[BaseException] = []
        self.producer = Producer(cfg, self.sink, self.stop)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.producer.run()
        except BaseException as exc:  # surfaced by close()
            self.error.append(exc)

    def __enter__(self) -> _Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.error, self.error


def _jobs(cfg: Config) -> list[SnapshotJob]:
    return SnapshotStore(cfg.resolve(cfg.producer.state_dir)).load()


def _job(cfg: Config, ident: str) -> SnapshotJob | None:
    return next((j for j in _jobs(cfg) if j.id == ident), None)


# -- values and schema -----------------------------------------------------------------
@pytest.mark.parametrize("driver", ["pymysql", "mysqlclient"])
def test_snapshot_rows_match_the_binlog_decoder_exactly(mariadb: MariaDBServer, tmp_path: Path, driver: str) -> None:
    # Both drivers of chunk selects (snapshot/source.py) give the decoder's values
    # (mysqlclient: setup.sh installs it; a missing one fails here, naming it).
    db = "snapv_" + uuid.uuid4().hex[:8]
    start = _master(mariadb)
    cfg = load_config(write_config(
        tmp_path / "c.toml", mariadb, source={"start": f"{start.file}:{start.pos}", "include_tables": [f"{db}.*"]},
        snapshot={"chunk_size": 2, "allow_no_primary_key": True, "driver": driver}), env={})
    cols = ", ".join(f"`{n}` {t}" for n, t in ALL_TYPES)
    # tk: every type again, without a primary key (read whole, in one
    # consistent read, by the same driver: snapshot/keyless.py).
    keyless_cols = cols.replace("NOT NULL PRIMARY KEY", "NOT NULL")
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t ({cols}) DEFAULT CHARSET=utf8mb4",
                    f"CREATE TABLE {db}.tk ({keyless_cols}) DEFAULT CHARSET=utf8mb4",
                    f"CREATE TABLE {db}.c (a int, b varchar(5), v double, PRIMARY KEY (b, a))",
                    f"CREATE TABLE {db}.n (x int, y varchar(3))")
    mariadb.execute("SET SESSION sql_mode=''", "SET SESSION time_zone='+00:00'",
                    *[f"INSERT INTO {db}.t VALUES {r}" for r in ROWS], *[f"INSERT INTO {db}.tk VALUES {r}" for r in ROWS],
                    f"INSERT INTO {db}.c SELECT seq % 3, CONCAT('k', seq % 4), seq / 7 FROM {db}.seq_1_to_12",
                    f"INSERT INTO {db}.n VALUES (1, 'a'), (1, 'a'), (2, NULL)")
    with _Running(cfg) as run:
        # Let the INSERTs ship first: in one batch a READ would fold into them.
        wait_for(lambda: sum(c.op is Op.INSERT for c in run.sink.changes()) == 2 * len(ROWS) + 12 + 3, 30, "the inserts")
        out = io.StringIO()
        assert run_snapshot_command(cfg, tables=[f"{db}.t", f"{db}.n", f"{db}.tk"], where="", out=out,
                                    progress=False) == 0, out.getvalue()
        assert run_snapshot_command(cfg, tables=[f"{db}.c"], where="b = 'k1' AND a > 0", out=out,
                                    progress=False) == 0, out.getvalue()
        # Keyless tables are refused unless allow_no_primary_key is set.
        strict = dataclasses.replace(cfg, snapshot=dataclasses.replace(cfg.snapshot, allow_no_primary_key=False))
        with pytest.raises(SnapshotRequestError, match=f"table {db}.n has no primary key"):
            run_snapshot_command(strict, tables=[f"{db}.n"], where="", out=out, progress=False)
        with pytest.raises(SnapshotRequestError, match="is not replicated"):
            run_snapshot_command(cfg, tables=["mysql.user"], where="", out=out, progress=False)
        report = status_report(cfg.resolve(cfg.producer.state_dir))
        time.sleep(0.5)
    changes = run.sink.changes()
    for table in ("t", "tk"):
        inserts = {c.after[0]: c for c in changes if c.op is Op.INSERT and c.table == table}  # type: ignore[index]
        reads = {c.after[0]: c for c in changes if c.op is Op.READ and c.table == table}  # type: ignore[index]
        assert sorted(reads) == sorted(inserts) == [1, 2, 3, 4], table
        for k, ins in inserts.items():
            assert reads[k].schema == ins.schema
            for col, want, got in zip(ins.schema.columns, ins.after, reads[k].after):  # type: ignore[union-attr, arg-type]
                assert (type(got), got) == (type(want), want), f"{table} row {k} column {col.name} ({col.type})"
    inserts = {c.after[0]: c for c in changes if c.op is Op.INSERT and c.table == "t"}  # type: ignore[index]
    # The schema built from information_schema equals the decoder's (the
    # emitter uses it when the log has not shown the table yet).
    conn = SnapshotConnection(cfg.source)
    try:
        assert conn.describe(db, "t").schema == inserts[1].schema
        c_schema = next(c.schema for c in changes if c.table == "c" and c.op is Op.INSERT)
        assert conn.describe(db, "c").schema == c_schema and c_schema.key == ("b", "a")  # type: ignore[union-attr]
    finally:
        conn.close()
    got_c = sorted(c.after for c in changes if c.op is Op.READ and c.table == "c")  # type: ignore[type-var]
    want_c = sorted(mariadb.execute(f"SELECT a, b, v FROM {db}.c WHERE b = 'k1' AND a > 0"))
    assert got_c == want_c and len(got_c) == 2
    assert sorted((c.after for c in changes if c.op is Op.READ and c.table == "n"), key=repr) == \
        sorted([(1, "a"), (1, "a"), (2, None)], key=repr)
    assert not any(c.database == "cynomys_meta" or "cynomys_meta" in (c.sql or "") for c in changes), \
        "the watermark table must never be shipped"
    jobs = report["jobs"]
    assert [j["status"] for j in jobs.values()] == ["done", "done"]
    assert sum(j["rows_emitted"] for j in jobs.values()) == 2 * len(ROWS) + 3 + 2


def test_pause_resume_cancel_and_status(mariadb: MariaDBServer, tmp_path: Path) -> None:
    db = "snapc_" + uuid.uuid4().hex[:8]
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id int primary key, v int)",
                    # Rows enough that the job outlasts a `cynomys status` started on a loaded box
                    # (2,000 rows at ~430 rows/s ended before it once); it is cancelled below.
                    f"INSERT INTO {db}.t SELECT seq, seq FROM {db}.seq_1_to_20000")
    start = _master(mariadb)
    cfg = load_config(write_config(
        tmp_path / "c.toml", mariadb, source={"start": f"{start.file}:{start.pos}", "include_tables": [f"{db}.*"]},
        snapshot={"chunk_size": 20, "throttle_ms": 50},
        # (`cynomys status` never opens the target; an unreachable one shows it does not need to.)
        target={"kind": "columnstore", "url": "mysql://nobody:x@127.0.0.1:1/"}), env={})
    out = io.StringIO()
    with _Running(cfg):
        assert run_snapshot_command(cfg, tables=[f"{db}.t"], where="", wait=False, out=out) == 0
        ident = out.getvalue().split()[1]
        wait_for(lambda: (j := _job(cfg, ident)) is not None and j.tables[0].chunks >= 3, 30, "three chunks")
        assert run_snapshot_command(cfg, tables=[], where="", action="pause", job_id=ident, out=out) == 0
        wait_for(lambda: _job(cfg, ident).status == PAUSED, 10, "the pause")  # type: ignore[union-attr]
        time.sleep(0.5)  # a chunk in flight finishes
        chunks = _job(cfg, ident).tables[0].chunks  # type: ignore[union-attr]
        time.sleep(1.0)
        assert _job(cfg, ident).tables[0].chunks == chunks, "a paused snapshot went on"  # type: ignore[union-attr]
        run_snapshot_command(cfg, tables=[], where="", action="resume", job_id=ident, out=out)
        wait_for(lambda: _job(cfg, ident).tables[0].chunks > chunks + 2, 10, "the resume")  # type: ignore[union-attr]
        text = subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "-c", cfg.path], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert f"{ident}: running, 0/1 tables" in text.stdout, text.stdout + text.stderr
        run_snapshot_command(cfg, tables=[], where="", action="cancel", job_id=ident, out=out)
        wait_for(lambda: _job(cfg, ident).status == CANCELLED, 10, "the cancel")  # type: ignore[union-attr]
        listed = subprocess.run([sys.executable, "-m", "cynomys.cli", "snapshot", "-c", cfg.path, "--list"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert f"{ident}  cancelled" in listed.stdout, listed.stdout + listed.stderr
    job = _job(cfg, ident)
    assert job is not None and 0 < job.tables[0].scanned < 20000


def test_read_only_snapshot_of_an_idle_source(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """No writes anywhere: every window closes on the log position the
    producer has reached (its last commit or heartbeat), not on a new
    transaction."""
    db = "snapro_" + uuid.uuid4().hex[:8]
    user = "ro_" + uuid.uuid4().hex[:6]
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (a int, b int, v varchar(8), PRIMARY KEY (a, b))",
                    f"INSERT INTO {db}.t SELECT seq DIV 10, seq MOD 10, HEX(seq) FROM {db}.seq_0_to_999",
                    f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw'",
                    f"GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'127.0.0.1'")
    start = _master(mariadb)
    cfg = load_config(write_config(
        tmp_path / "c.toml", mariadb,
        source={"start": f"{start.file}:{start.pos}", "include_tables": [f"{db}.*"], "user": user, "password": "pw"},
        snapshot={"chunk_size": 64, "read_only": True}), env={})
    with _Running(cfg) as run:
        t0 = time.monotonic()
        out = io.StringIO()
        assert run_snapshot_command(cfg, tables=[f"{db}.t"], where="", out=out, progress=False) == 0, out.getvalue()
        took = time.monotonic() - t0
        time.sleep(0.3)
    assert _master(mariadb) == start, "a read-only snapshot wrote to the source"
    got = [c.after for c in run.sink.changes() if c.op is Op.READ]
    assert got == [tuple(r) for r in mariadb.execute(f"SELECT a, b, v FROM {db}.t ORDER BY a, b")]
    job = _jobs(cfg)[0]
    assert (job.status, job.tables[0].chunks, job.tables[0].rows) == (FINISHED, 16, 1000)
    assert took < 15, f"{took:.1f}s for 16 chunks of an idle source"


# -- under load, with a crash ------------------------------------------------------------
def _load(srv: MariaDBServer) -> None:
    srv.execute("CREATE DATABASE w",
                "CREATE TABLE w.t (id int PRIMARY KEY, val int, ver bigint NOT NULL, pad varchar(40))",
                "CREATE TABLE w.vers (id int PRIMARY KEY, v bigint NOT NULL)",  # not replicated: version source
                f"INSERT INTO w.t SELECT seq, seq, 0, REPEAT('p', seq % 40) FROM w.seq_0_to_{ROWS_BIG - 1}",
                f"INSERT INTO w.vers SELECT seq, 0 FROM w.seq_0_to_{ROWS_BIG - 1}")


def _writer(srv: MariaDBServer, stop: threading.Event, seed: int, done: list[int], hot: list[int],
            errors: list[BaseException]) -> None:
    """Random inserts, updates and deletes; half of them near where the
    snapshot is reading.  Each write takes a fresh version for its key from
    w.vers in the same transaction (the row lock orders writers of one key),
    so per key versions grow in commit order, across deletes too."""
    rnd = random.Random(seed)
    conn = srv.connect("w")
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                k = rnd.randrange(KEY_SPACE) if rnd.random() < 0.5 else min(KEY_SPACE - 1, hot[0] + rnd.randrange(2500))
                try:
                    cur.execute("BEGIN")
                    cur.execute("INSERT INTO vers VALUES (%s, 1) ON DUPLICATE KEY UPDATE v = v + 1", (k,))
                    cur.execute("SELECT v FROM vers WHERE id = %s", (k,))
                    v = cur.fetchone()[0]
                    r = rnd.random()
                    if r < 0.4:
                        cur.execute("INSERT INTO t VALUES (%s, %s, %s, 'ins') ON DUPLICATE KEY UPDATE "
                                    "val = VALUES(val), ver = VALUES(ver), pad = 'upsert'", (k, rnd.randrange(10**6), v))
                    elif r < 0.8:
                        cur.execute("UPDATE t SET val = val + 1, ver = %s WHERE id = %s", (v, k))
                    else:
                        cur.execute("DELETE FROM t WHERE id = %s", (k,))
                    cur.execute("COMMIT")
                    done[0] += 1
                except pymysql.err.OperationalError as exc:
                    if exc.args[0] not in (1213, 1205):
                        raise
                    cur.execute("ROLLBACK")
                # About 150 transactions/s per writer: a load the producer
                # follows on a small shared machine (DBLog needs the log read
                # to keep up: watermarks are only seen once it reaches them).
                time.sleep(0.005)
    except BaseException as exc:
        errors.append(exc)
    finally:
        conn.close()


@dataclasses.dataclass
class _Replayed:
    rows: dict[int, tuple[Any, ...]]
    reads: int
    first_read_after: dict[int, int]  # seq -> first READ key in it


def _replay(batches: list[tuple[int, Batch]]) -> _Replayed:
    """Apply the stream as the applier does (READ/UPDATE/DELETE remove the
    key, then the after image goes in; INSERT adds), checking per key that
    versions never go backwards in stream order.  A DELETE of version v
    counts as v + 0.5: a stale image of v coming after it would resurrect
    a deleted row."""
    rows: dict[int, tuple[Any, ...]] = {}
    last: dict[int, float] = {}
    reads = 0
    first_read: dict[int, int] = {}
    for seq, changes in whole_transactions(batches):
        for c in changes:
            if c.op is Op.DDL or c.table != "t":
                continue
            assert c.database == "w", c
            _check_version(c, last)
            before: tuple[Any, ...] | None = c.before
            after: tuple[Any, ...] | None = c.after
            if c.op is Op.READ:
                assert after is not None
                reads += 1
                first_read.setdefault(seq, after[0])
            if c.op is Op.INSERT:
                assert after is not None and after[0] not in rows, f"key {after} inserted twice ({c.tid})"
            else:
                image = before if before is not None else after
                assert image is not None
                rows.pop(image[0], None)
            if after is not None:
                rows[after[0]] = after
    return _Replayed(rows, reads, first_read)


def _check_version(c: Change, last: dict[int, float]) -> None:
    before: tuple[Any, ...] | None = c.before
    after: tuple[Any, ...] | None = c.after
    if before is not None and c.op is not Op.INSERT:
        k, v = before[0], before[VER]
        assert v >= last.get(k, -1), f"{c.op.value} of key {k} carries version {v} after {last[k]} was shipped"
        last[k] = max(last.get(k, -1), v + 0.5 if after is None else v)
    if after is not None:
        k, v = after[0], after[VER]
        assert v >= last.get(k, -1), \
            f"{c.op.value} of key {k} version {v} came after version {last[k]} (an older image overwrote a newer one)"
        last[k] = v


def _run_with_crash(srv: MariaDBServer, tmp_path: Path, cfg_path: Path, start_snapshot: Any,
                    fault: Callable[[subprocess.Popen[bytes], Config, str], None] | None = None,
                    ) -> tuple[Config, dict[str, Any]]:
    """Writers on; producer; snapshot; SIGKILL mid-snapshot (or ``fault``,
    given the running producer); restart; finish; writers off; drain.
    Returns the config and numbers for the report."""
    cfg = load_config(cfg_path, env={})
    logs = tmp_path / "producer.log"

    def produce() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", "produce", "-c", str(cfg_path)],
                                cwd=ROOT, stdout=logs.open("ab"), stderr=subprocess.STDOUT)

    def log_tail() -> str:
        return logs.read_text(errors="replace")[-4000:]

    stop, done, hot = threading.Event(), [0], [0]
    errors: list[BaseException] = []
    writers = [threading.Thread(target=_writer, args=(srv, stop, s, done, hot, errors)) for s in range(4)]
    t0 = time.monotonic()
    proc = produce()
    numbers: dict[str, Any] = {}
    try:
        for w in writers:
            w.start()
        ident = start_snapshot(cfg)

        def progress() -> int:
            j = _job(cfg, ident)
            if j is None:
                return 0
            t = j.tables[0]
            if t.last_key:
                hot[0] = int(t.last_key[0][1])
            return t.scanned

        def killable() -> bool:
            assert proc.poll() is None, log_tail()
            return progress() >= 12_000

        wait_for(killable, 120, "12k snapshot rows before the kill")
        if fault is not None:
            fault(proc, cfg, ident)
        else:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            at_kill = _job(cfg, ident)
            assert at_kill is not None and at_kill.status != FINISHED, "the snapshot finished before the kill"
            numbers["rows_at_kill"] = at_kill.tables[0].scanned
            numbers["seq_at_kill"] = max((s for s, _ in transport_batches(cfg)), default=0)
            proc = produce()

        def finished() -> bool:
            assert proc.poll() is None, log_tail()
            progress()
            j = _job(cfg, ident)
            return j is not None and j.status == FINISHED

        wait_for(finished, 150, "the snapshot to finish after the restart")
        time.sleep(1.0)  # writes keep coming after the snapshot
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert not errors, errors
    assert done[0] > 500, "the workload did not run"
    end = _master(srv)

    def caught_up() -> bool:
        assert proc.poll() is None, log_tail()
        d = read_json(cfg.resolve(cfg.producer.state_dir) / "producer.json") or {}
        if not d.get("checkpoint"):
            return False
        at = Position.from_dict(d["checkpoint"])
        return (at.file, at.pos) == (end.file, end.pos)  # the checkpoint also carries the GTID position

    wait_for(caught_up, 120, "the producer to reach the binlog end")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log_tail()
    job = _job(cfg, ident)
    assert job is not None
    numbers.update(seconds=round(time.monotonic() - t0, 1), writes=done[0], chunks=job.tables[0].chunks,
                   rows_emitted=job.tables[0].rows, left_to_log=job.tables[0].dropped)
    return cfg, numbers


def _check(srv: MariaDBServer, cfg: Config, numbers: dict[str, Any]) -> _Replayed:
    batches = transport_batches(cfg)
    got = _replay(batches)
    want = {r[0]: tuple(r) for r in srv.execute("SELECT id, val, ver, pad FROM w.t")}
    missing = sorted(set(want) - set(got.rows))[:5]
    extra = sorted(set(got.rows) - set(want))[:5]
    differ = sorted(k for k in want if k in got.rows and got.rows[k] != want[k])[:5]
    assert got.rows == want, f"missing {missing}, extra {extra}, differ {[(k, want[k], got.rows[k]) for k in differ]}"
    if "seq_at_kill" in numbers:
        # The restarted producer resumed the snapshot after the last finished
        # chunk, not from the table's first key.
        resumed = [k for s, k in sorted(got.first_read_after.items()) if s > numbers["seq_at_kill"]]
        assert resumed and resumed[0] > 5_000, f"after the restart the snapshot re-read from key {resumed[:1]}"
    assert got.reads >= ROWS_BIG * 0.8
    numbers["reads_shipped"] = got.reads
    return got


def _recorded_stream(srv: MariaDBServer, tmp_path: Path) -> dict[str, Any]:
    """The stream the applier tests load: a DBLog snapshot of w.t under 4
    writers, the producer SIGKILLed in it, into a file transport (checked).
    Returns the transport and security settings an applier config needs."""
    _load(srv)
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    common: dict[str, Any] = dict(transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
                                  security={k: str(v) for k, v in keys.items()})
    cfg_path = write_config(
        tmp_path / "c.toml", srv, source={"include_tables": ["w.t"], "start": "current"},
        producer={"id": "p1", "batch_max_events": 2000, "batch_max_delay_ms": 100},
        snapshot={"chunk_size": 1000, "throttle_ms": 10}, **common)
    cfg, numbers = _run_with_crash(srv, tmp_path, cfg_path, lambda cfg: "initial")
    _check(srv, cfg, numbers)
    return common


def _sigkill_applier_twice(cfg_path: Path, log: Path, marker: str, level: str, what: str) -> Callable[[], int]:
    """Start `cynomys apply` twice, each time SIGKILLed once its log shows
    ``marker`` again (what the test kills it in the middle of); returns the
    count of ``marker`` in the log, for the test's last check.  On the
    reference decoder (no InsertRuns) the marker never shows: killed at once."""
    from cynomys.core import compiled

    def count() -> int:
        return log.read_text(errors="replace").count(marker) if log.exists() else 0

    for kill in (1, 2):
        proc = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", level, "apply", "-c",
                                 str(cfg_path)], cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        try:
            seen = count()

            def again() -> bool:
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                return count() > seen or not compiled.available()
            wait_for(again, 180, f"{what} (start {kill})")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    return count


@pytest.mark.slow
def test_dblog_snapshot_under_writers_with_sigkill(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    srv = fresh_mariadb
    _load(srv)
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    # start = current on a first start: the initial snapshot of every included table.
    cfg_path = write_config(
        tmp_path / "c.toml", srv, source={"include_tables": ["w.t"], "start": "current"},
        producer={"id": "p1", "batch_max_events": 2000, "batch_max_delay_ms": 100},
        transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
        security={k: str(v) for k, v in keys.items()}, snapshot={"chunk_size": 1000, "throttle_ms": 10},
        applier={"buffer_rows": 5000, "max_delay_ms": 300, "consumer_name": "a1"})
    cfg, numbers = _run_with_crash(srv, tmp_path, cfg_path, lambda cfg: "initial")
    _check(srv, cfg, numbers)
    assert srv.execute("SELECT COUNT(*) FROM cynomys_meta.watermark")[0][0] == 1
    print(f"\nDBLog snapshot under 4 writers with a SIGKILL: {numbers}")

    # The real applier loads the stream (READ rows as upserts, delay commit)
    # into another MariaDB through the ColumnStore target code.
    from cynomys.applier.loop import run_applier

    tgt = MariaDBServer(server_id=2).start()
    try:
        target_cfg = load_config(write_config(
            tmp_path / "c.toml", srv, source={"include_tables": ["w.t"]}, producer={"id": "p1"},
            transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 5000, "max_delay_ms": 300, "consumer_name": "a1"},
            target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"}), env={})
        t0 = time.monotonic()
        stats = run_applier(target_cfg, threading.Event(), until_idle_s=2.0)
        q = "SELECT id, val, ver, pad FROM w.t ORDER BY id"
        assert tgt.execute(q) == srv.execute(q)
        print(f"applier: {stats.rows_in} changes -> {stats.rows_out} net rows in {stats.flushes} flushes, "
              f"{time.monotonic() - t0:.1f}s")
    finally:
        tgt.destroy()


@pytest.mark.slow
@pytest.mark.spark
def test_dblog_snapshot_into_iceberg_with_applier_sigkills(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    """The same recorded stream (a snapshot under 4 writers, the producer
    SIGKILLed inside it) into Spark/Iceberg, where snapshot rows new to the
    table are appended as data files of their own beside the flush's MERGE
    (targets/spark/direct.py): the applier SIGKILLed twice while it does
    that, restarted, then the table equals the source."""
    pytest.importorskip("pyspark")
    from cynomys.applier.loop import run_applier
    from cynomys.applier.targets.base import open_target
    from cynomys.core import compiled

    srv = fresh_mariadb
    common = _recorded_stream(srv, tmp_path)
    spark_path = write_config(
        tmp_path / "s.toml", srv, source={"include_tables": ["w.t"]}, producer={"id": "p1"},
        applier={"buffer_rows": 5000, "max_buffer_rows": 10_000, "max_delay_ms": 300, "consumer_name": "a1"},
        target={"kind": "spark"}, target__spark={"master": "local[2]", "warehouse": str(tmp_path / "warehouse")},
        **common)
    directly = _sigkill_applier_twice(spark_path, tmp_path / "applier.log", "appended directly", "INFO",
                                      "the applier appending snapshot rows directly")
    spark_cfg = load_config(spark_path, env={})
    run_applier(spark_cfg, threading.Event(), until_idle_s=3.0)
    reader = open_target(spark_cfg)
    reader.connect()
    try:
        got = sorted(tuple(r) for r in reader.fetch_rows("w", "t"))
    finally:
        reader.close()
    want = sorted(tuple(r) for r in srv.execute("SELECT id, val, ver, pad FROM w.t"))
    assert len(got) == len(want) and got == want, (len(got), len(want))
    assert directly() >= 2 or not compiled.available()


@pytest.mark.slow
def test_dblog_snapshot_into_mariadb_with_applier_sigkills_while_loading_beside(
        fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    """The same recorded stream into a second MariaDB (InnoDB), where half of
    each flush's snapshot rows load on a second connection committed just
    before the flush (targets/columnstore/beside.py): the applier SIGKILLed
    twice while it does that, restarted, then the table equals the source."""
    from cynomys.applier.loop import run_applier
    from cynomys.core import compiled

    srv = fresh_mariadb
    common = _recorded_stream(srv, tmp_path)
    tgt = MariaDBServer(server_id=2).start()
    try:
        apply_path = write_config(
            tmp_path / "a.toml", srv, source={"include_tables": ["w.t"]}, producer={"id": "p1"},
            applier={"buffer_rows": 5000, "max_buffer_rows": 10_000, "max_delay_ms": 300, "consumer_name": "a1"},
            target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB", "side_load_rows": 1000}, **common)
        beside = _sigkill_applier_twice(apply_path, tmp_path / "applier.log", "beside the flush", "DEBUG",
                                        "the applier loading snapshot rows beside a flush")
        run_applier(load_config(apply_path, env={}), threading.Event(), until_idle_s=3.0)
        q = "SELECT id, val, ver, pad FROM w.t ORDER BY id"
        got, want = tgt.execute(q), srv.execute(q)
        assert len(got) == len(want) and got == want, (len(got), len(want))
        assert beside() >= 2 or not compiled.available()
    finally:
        tgt.destroy()


@pytest.mark.slow
def test_read_only_snapshot_under_writers_with_sigkill(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    srv = fresh_mariadb
    _load(srv)
    srv.execute("CREATE USER 'ro'@'127.0.0.1' IDENTIFIED BY 'ro-secret'",
                "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'ro'@'127.0.0.1'")
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    cfg_path = write_config(
        tmp_path / "c.toml", srv,
        source={"include_tables": ["w.t"], "start": "current", "user": "ro", "password": "ro-secret"},
        producer={"id": "p1", "batch_max_events": 2000, "batch_max_delay_ms": 100},
        transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
        security={k: str(v) for k, v in keys.items()},
        snapshot={"chunk_size": 1000, "throttle_ms": 10, "read_only": True, "initial": False})

    def request(cfg: Config) -> str:
        wait_for(lambda: (cfg.resolve(cfg.producer.state_dir) / "producer.json").exists(), 30, "the producer")
        r = subprocess.run([sys.executable, "-m", "cynomys.cli", "snapshot", "-c", str(cfg_path), "--tables", "w.t",
                            "--no-wait"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout.split()[1]

    # The user cannot write: a DBLog snapshot would be refused.
    with pytest.raises(pymysql.err.OperationalError, match="denied"):
        pymysql.connect(host="127.0.0.1", port=srv.port, user="ro", password="ro-secret", autocommit=True) \
            .cursor().execute("CREATE DATABASE cynomys_meta")
    cfg, numbers = _run_with_crash(srv, tmp_path, cfg_path, request)
    _check(srv, cfg, numbers)
    assert not srv.execute("SHOW DATABASES LIKE 'cynomys_meta'"), "read-only mode wrote to the source"
    print(f"\nread-only snapshot under 4 writers with a SIGKILL: {numbers}")
