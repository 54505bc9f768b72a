"""Snapshot chunks read on a replica of the source ([snapshot] read_from).

Real servers: a MariaDB primary and a GTID replica of it.  The exactness test
delays the replica by a second (MASTER_DELAY): a chunk read there without
waiting for its low watermark would hold rows older than the log's changes
before the window, and the version check of ``_check`` would catch the stream
going backwards."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from cynomys.core.checkpoint import read_json
from cynomys.core.config import Config, load_config
from cynomys.core.errors import ConfigError, SourceUnavailableError
from cynomys.core.model import Position
from cynomys.snapshot.errors import SnapshotError
from cynomys.snapshot.replica import ReplicaReads
from cynomys.snapshot.state import FAILED
from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.integration.test_snapshot import ROOT, _check, _job, _load, _run_with_crash
from tests.servers.mariadb import REPLICATION_ARGS, MariaDBServer, com_select


@pytest.fixture
def pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    primary = MariaDBServer(server_id=1, extra_args=REPLICATION_ARGS).start()
    replica = MariaDBServer(server_id=2, extra_args=REPLICATION_ARGS).start()
    try:
        replica.make_replica_of(primary)
        yield primary, replica
    finally:
        replica.destroy()
        primary.destroy()


def _config(tmp_path: Path, primary: MariaDBServer, replica: MariaDBServer, *, read_only: bool,
            replica_wait_s: float) -> Path:
    """A producer of w.t into a file transport, chunks read on ``replica``."""
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    return write_config(
        tmp_path / "c.toml", primary, source={"include_tables": ["w.t"], "start": "current"},
        producer={"id": "p1", "batch_max_events": 2000, "batch_max_delay_ms": 100},
        transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
        security={k: str(v) for k, v in keys.items()},
        snapshot={"chunk_size": 2500, "throttle_ms": 10, "read_only": read_only,
                  "read_from": f"127.0.0.1:{replica.port}", "replica_wait_s": replica_wait_s})


@pytest.mark.slow
@pytest.mark.parametrize("read_only", [False, True], ids=["dblog", "read_only"])
def test_snapshot_from_a_lagging_replica_under_writers_with_sigkill(
        pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, read_only: bool) -> None:
    primary, replica = pair
    _load(primary)
    replica.wait_caught_up(primary)
    # A replica a second behind: what it shows is always older than the source.
    replica.execute("STOP SLAVE", "CHANGE MASTER TO MASTER_DELAY = 1", "START SLAVE")
    cfg_path = _config(tmp_path, primary, replica, read_only=read_only, replica_wait_s=20)
    selects = com_select(replica)
    cfg, numbers = _run_with_crash(primary, tmp_path, cfg_path, lambda cfg: "initial")
    _check(primary, cfg, numbers)
    log = (tmp_path / "producer.log").read_text(errors="replace")
    assert f"reading chunks from the replica 127.0.0.1:{replica.port}" in log
    # Every chunk select ran there (plus the readers' boundary queries).
    assert com_select(replica) - selects >= numbers["chunks"], numbers
    print(f"\nsnapshot read on a replica 1 s behind, 4 writers, a SIGKILL ({'read-only' if read_only else 'DBLog'}): "
          f"{numbers}")


@pytest.mark.slow
def test_a_replica_held_back_pauses_the_snapshot_while_the_log_flows(
        pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path) -> None:
    """The replica's SQL thread stopped (maintenance) when the snapshot
    starts, under writers: the producer neither restarts nor stops; it warns
    that the snapshot waits, reads nothing, and the writers' changes keep
    reaching the transport; once replication runs again the snapshot
    finishes and the stream is exact."""
    primary, replica = pair
    _load(primary)
    replica.wait_caught_up(primary)
    cfg_path = _config(tmp_path, primary, replica, read_only=False, replica_wait_s=2)
    log = tmp_path / "producer.log"
    warning = "waits for it, the log goes on"
    replica.execute("STOP SLAVE SQL_THREAD")

    def checkpoint(cfg: Config) -> Position:
        d = read_json(cfg.resolve(cfg.producer.state_dir) / "producer.json") or {}
        return Position.from_dict(d["checkpoint"])

    def held_back(cfg: Config) -> str:
        """The producer and the writers run; the initial snapshot waits."""
        wait_for(lambda: warning in log.read_text(errors="replace"), 30, "the snapshot's wait to be warned of")
        at = checkpoint(cfg)
        time.sleep(5)  # two more waits
        job = _job(cfg, "initial")
        assert job is not None and job.tables[0].scanned == 0, "chunks were read while the replica stood still"
        assert at < checkpoint(cfg), "the writers' changes did not reach the transport"
        replica.execute("START SLAVE SQL_THREAD")
        return "initial"

    cfg, numbers = _run_with_crash(primary, tmp_path, cfg_path, held_back, fault=lambda proc, cfg, ident: None)
    _check(primary, cfg, numbers)
    text = log.read_text(errors="replace")
    assert "retrying in" not in text, "the producer restarted"
    warned = [ln for ln in text.splitlines() if warning in ln]
    assert warned and all(" WARNING " in ln and f"replica 127.0.0.1:{replica.port}" in ln
                          and "SQL thread running: No" in ln for ln in warned), warned
    assert len(warned) <= 4, f"warned more than once per wait: {len(warned)}"
    print(f"\nsnapshot paused by a replica held back ({len(warned)} warnings), then finished: {numbers}")


def test_a_replica_that_lags_or_stopped_is_named(pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path) -> None:
    primary, replica = pair
    source = load_config(write_config(tmp_path / "c.toml", primary), env={}).source
    primary.execute("CREATE DATABASE r", "CREATE TABLE r.t (id int PRIMARY KEY)", "INSERT INTO r.t VALUES (1)")
    replica.wait_caught_up(primary)

    # The primary itself replicates nothing: refused at once, terminal.
    with pytest.raises(SnapshotError, match="replicates nothing"):
        ReplicaReads(source, f"127.0.0.1:{primary.port}", "pymysql", 1.0)

    reads = ReplicaReads(source, f"127.0.0.1:{replica.port}", "pymysql", 1.0)
    try:
        reads.wait(primary.gtid_binlog_pos())  # caught up: returns
        # Its SQL thread stopped (maintenance): the source's next GTID is not
        # applied within the wait -- lagging, transient.
        replica.execute("STOP SLAVE SQL_THREAD")
        primary.execute("INSERT INTO r.t VALUES (2)")
        with pytest.raises(SourceUnavailableError, match=f"replica 127.0.0.1:{replica.port} .* it lags") as lag:
            reads.wait(primary.gtid_binlog_pos())
        assert "SQL thread running: No" in str(lag.value)
        replica.execute("START SLAVE SQL_THREAD")
        reads.wait(primary.gtid_binlog_pos())  # caught up again
        # Replication stopped on an error (a row written on the replica, then
        # the same key on the source): it will not catch up by itself -- terminal.
        replica.execute("SET SESSION gtid_domain_id = 9", "INSERT INTO r.t VALUES (3)")
        primary.execute("INSERT INTO r.t VALUES (3)")
        with pytest.raises(SnapshotError, match="stopped replicating on error 1062"):
            reads.wait(primary.gtid_binlog_pos())
    finally:
        reads.close()


def test_a_table_fails_with_the_reason_when_read_from_is_no_replica(
        pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path) -> None:
    """As any table a snapshot cannot read: it fails alone, logged and in
    the job's status with the reason, while replication goes on."""
    primary, _ = pair
    primary.execute("CREATE DATABASE w", "CREATE TABLE w.t (id int PRIMARY KEY)", "INSERT INTO w.t VALUES (1), (2)")
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    cfg_path = write_config(
        tmp_path / "c.toml", primary, source={"include_tables": ["w.t"], "start": "current"},
        producer={"id": "p1"}, transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
        security={k: str(v) for k, v in keys.items()}, snapshot={"read_from": f"127.0.0.1:{primary.port}"})
    cfg = load_config(cfg_path, env={})
    log = tmp_path / "producer.log"
    proc = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "produce", "-c", str(cfg_path)], cwd=ROOT,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        def failed() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            job = _job(cfg, "initial")
            return job is not None and job.status == FAILED
        wait_for(failed, 60, "the initial snapshot to fail")
        job = _job(cfg, "initial")
        assert job is not None
        reason = job.tables[0].error
        assert f"127.0.0.1:{primary.port} replicates nothing" in reason and "read_from" in reason, reason
        errors = [ln for ln in log.read_text(errors="replace").splitlines() if " ERROR " in ln]
        assert any("replicates nothing" in ln for ln in errors), errors
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


@pytest.mark.parametrize("bad", ["replica", "host:", ":3306", "host:99999"])
def test_read_from_must_be_host_and_port(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[snapshot]\nread_from = "{bad}"\n')
    with pytest.raises(ConfigError, match="read_from"):
        load_config(path, env={})
