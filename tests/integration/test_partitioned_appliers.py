"""Partitioned appliers on real servers: per-partition state on a MariaDB
target (and moving between partition counts), one consumer group per
partition on Redis (trimming waits for all of them), and end to end: two
partitioned appliers, one killed with SIGKILL again and again while four
clients write, end equal to the source."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from cynomys.applier.partition import Partitioning, PartitionTarget, table_partition
from cynomys.applier.receive import make_subscriber
from cynomys.applier.targets.base import Flush, Target, open_target
from cynomys.core.config import Config, load_config
from cynomys.core.errors import TerminalError
from cynomys.core.model import AppliedState, Position
from cynomys.transport.bus import open_publisher
from cynomys.transport.redis_bus import RedisStreamPublisher
from tests.helpers import write_config
from tests.integration.test_e2e_columnstore import ROOT, TABLES, _mixed_txn, _run, _write_loop
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration]

F = "mysql-bin.000001"


def _cfg(tmp_path: Path, server: MariaDBServer, pid: str, partitions: int, partition: int = 0,
         **extra: dict[str, object]) -> Config:
    path = write_config(tmp_path / f"c{partitions}-{partition}.toml", server, producer={"id": pid},
                        applier={"partitions": partitions, "partition": partition},
                        target={"kind": "columnstore", "url": server.url, "engine": "InnoDB"}, **extra)
    return load_config(path, env={})


def _partition(tmp_path: Path, server: MariaDBServer, pid: str, partitions: int, partition: int = 0) -> Target:
    cfg = _cfg(tmp_path, server, pid, partitions, partition)
    t = PartitionTarget(open_target(cfg), Partitioning.of(cfg))
    t.connect()
    return t


def test_each_partition_keeps_its_own_state_and_the_count_is_guarded(tmp_path: Path, mariadb: MariaDBServer) -> None:
    pid = f"pp_{uuid.uuid4().hex[:8]}"  # the state table is shared by the tests on this server
    raw = open_target(_cfg(tmp_path, mariadb, pid, 1))
    raw.connect()
    # A single applier got to envelope 5; then two partitions start: both from there.
    raw.apply(Flush([], AppliedState(pid, 5, Position(F, 500), 11)))
    p0 = _partition(tmp_path, mariadb, pid, 2, 0)
    assert [raw.applied(f"{pid}#p{i}") for i in (0, 1)] == \
        [AppliedState(f"{pid}#p{i}", 5, Position(F, 500), 11) for i in (0, 1)]
    assert raw.applied(f"{pid}#partitions").seq == 2  # type: ignore[union-attr]

    p0.apply(Flush([], AppliedState(pid, 7, Position(F, 700), 12)))
    assert p0.applied(pid) == AppliedState(pid, 7, Position(F, 700), 12)  # the loop keeps its producer id
    assert raw.applied(f"{pid}#p0").seq == 7 and raw.applied(f"{pid}#p1").seq == 5  # type: ignore[union-attr]
    assert raw.applied(pid).seq == 5  # type: ignore[union-attr]  # the single applier's row, untouched

    # p0 at 7, p1 at 5: no other count may start, a single applier neither.
    for n in (3, 1):
        with pytest.raises(TerminalError, match=r"2 partition\(s\) .* at different envelopes \(p0: 7, p1: 5\)"):
            _partition(tmp_path, mariadb, pid, n)
    # The same count restarts as usual.
    assert _partition(tmp_path, mariadb, pid, 2, 1).applied(pid).seq == 5  # type: ignore[union-attr]

    # Drained (every partition at the same envelope): 2 -> 3 -> 1 is allowed.
    _partition(tmp_path, mariadb, pid, 2, 1).apply(Flush([], AppliedState(pid, 7, Position(F, 700), 12)))
    three = _partition(tmp_path, mariadb, pid, 3, 2)
    assert three.applied(pid) == AppliedState(pid, 7, Position(F, 700), 12)
    assert raw.applied(f"{pid}#partitions").seq == 3  # type: ignore[union-attr]
    for i in (0, 1):
        _partition(tmp_path, mariadb, pid, 3, i)
    one = _partition(tmp_path, mariadb, pid, 1)
    assert one.applied(pid) == AppliedState(pid, 7, Position(F, 700), 12)  # the old single row moved on
    raw.close()


def test_every_partition_group_exists_from_the_start_and_trimming_waits_for_all(
        tmp_path: Path, mariadb: MariaDBServer, redis_url: str) -> None:
    stream = f"part-{uuid.uuid4().hex[:8]}"
    transport = {"url": redis_url, "stream": stream, "max_stream_len": 10}
    cfgs = [_cfg(tmp_path, mariadb, "p1", 2, i, transport=transport) for i in (0, 1)]
    pub = open_publisher(cfgs[0].transport)
    assert isinstance(pub, RedisStreamPublisher)
    for s in range(1, 301):  # (trimming removes whole stream nodes of 100 entries)
        pub.publish("p1", s, b"envelope %d" % s)
    r = redis.Redis.from_url(redis_url)
    sub0 = make_subscriber(cfgs[0])
    got = sub0.read(500, 100)  # partition 0 only: partition 1 has not started
    assert len(got) == 300
    groups = {g["name"].decode(): g for g in r.xinfo_groups(stream)}
    assert set(groups) == {"cynomys-appliers.p0", "cynomys-appliers.p1"}
    sub0.ack([d.id for d in got])
    assert pub.trim() == 0 and r.xlen(stream) == 300  # partition 1 still needs them all
    sub1 = make_subscriber(cfgs[1])
    got1 = sub1.read(500, 100)
    assert [d.envelope for d in got1] == [d.envelope for d in got]  # every partition reads every envelope
    sub1.ack([d.id for d in got1[:250]])
    assert pub.trim() > 0
    assert 50 <= r.xlen(stream) < 300  # what both acknowledged may go (~: whole nodes only)
    assert len(r.xrange(stream, min=got1[250].id)) == 50  # what partition 1 still holds stays
    for s in (sub0, sub1, pub):
        s.close()
    r.close()


def _paced_writer(src: MariaDBServer, stop: threading.Event, seed: int, done: list[int],
                  errors: list[BaseException]) -> None:
    """The e2e test's mixed transactions, at most ~200 a second per writer:
    unpaced, 4 writers make ~5k a second here, and 40 s of that takes the
    daemons minutes to catch up on this 2-core box."""
    def txn(cur: Any, rnd: random.Random, seed: int) -> None:
        time.sleep(0.005)  # before the first statement: no locks held yet
        _mixed_txn(cur, rnd, seed)

    _write_loop(src, stop, seed, done, errors, txn)


@pytest.mark.slow
def test_two_partitioned_appliers_one_killed_repeatedly_end_equal(tmp_path: Path, redis_url: str) -> None:
    """[applier] partitions = 2, both processes sharing one config file
    (CYNOMYS_APPLIER_PARTITION), partition 1 killed with SIGKILL 5 times
    and the producer once over ~40 s of writing, an ALTER of a table of
    partition 1 in the middle."""
    owners = {t: table_partition("app", t, 2) for t in TABLES}
    assert set(owners.values()) == {0, 1}, f"the workload's tables must reach both partitions: {owners}"
    kills = ["applier1", "applier1", "producer", "applier1", "applier1", "applier1"]
    cfg = _run(tmp_path, redis_url, writer=_paced_writer, batch_max_events=500, kills=kills, alter_at=2,
               write_s=40, appliers=2)
    logs = tmp_path / "logs"
    # Each partition ran only its own tables' DDL (the CREATE TABLEs; the ALTER of acct).
    for i in (0, 1):
        ran = (logs / f"applier{i}.log").read_text()
        for t, owner in owners.items():
            assert (f"CREATE TABLE app.{t} " in ran) == (owner == i), (i, t)
        assert ("ALTER TABLE app.acct" in ran) == (owners["acct"] == i)
    # `cynomys status` shows each partition's state and consumer group.
    out = subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "-c", str(cfg), "--json"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    status = json.loads(out.stdout)
    assert status["applier"]["partitions"] == 2
    for i in (0, 1):
        part = status["applier"][f"partition {i}"]
        assert part["sequence"] == status["producer"]["sequence"] and part["envelopes_behind_producer"] == 0
        assert status["transport"][f"unacknowledged cynomys-appliers.p{i}"] == 0
    text = subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "-c", str(cfg)],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "  partition 0:\n    sequence: " in text and "  partition 1:\n    sequence: " in text


def test_envelopes_without_the_partitions_tables_move_its_state_without_a_write_each(
        tmp_path: Path, mariadb: MariaDBServer) -> None:
    """Partition 0 takes envelopes holding only partition 1's table: nothing
    is written for them one by one; their progress is committed with the
    next flush of its own data, or after progress_interval_ms."""
    from cynomys.applier.loop import Applier
    from cynomys.core.model import Batch, Change, ColumnDef, Op, TableSchema
    from cynomys.transport.channel import make_opener
    from cynomys.transport.keys import generate_keys

    db = f"pp_{uuid.uuid4().hex[:8]}"
    mine = next(f"m{i}" for i in range(1000) if table_partition(db, f"m{i}", 2) == 0)
    other = next(f"o{i}" for i in range(1000) if table_partition(db, f"o{i}", 2) == 1)
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    cfg = load_config(write_config(
        tmp_path / "c.toml", mariadb, producer={"id": db},  # (the state table is shared on this server)
        transport={"kind": "file", "path": str(tmp_path / "t.bin")}, security={k: str(v) for k, v in keys.items()},
        applier={"buffer_rows": 100_000, "max_delay_ms": 0, "partitions": 2, "partition": 0,
                 "progress_interval_ms": 400},
        target={"kind": "columnstore", "url": mariadb.url, "engine": "InnoDB"}), env={})
    app = Applier(cfg, open_target(cfg), make_subscriber(cfg), make_opener(cfg))
    app.start()

    def envelope(seq: int, table: str) -> Batch:
        schema = TableSchema(db, table, (ColumnDef("id", "int(11)", False),), ("id",))
        txn = Position(F, seq * 100)
        return Batch(db, (Change(Op.INSERT, db, table, f"0-1-{seq}", txn, 1, schema, None, (seq,)),),
                     Position(F, seq * 100 + 50), True, txn, 0, 1, {"from": f"{F}:{seq * 100}"})

    def take(seq: int, table: str) -> None:
        app.take(db, seq, app.partitioning.select(envelope(seq, table)))
        if app.buffer.due():  # as the loop does after each read
            app.flush()

    for seq in (1, 2, 3):
        take(seq, other)
    assert app.target.applied(db) is None, "a target write for envelopes holding nothing of partition 0"
    take(4, mine)
    assert app.target.applied(db) == AppliedState(db, 4, Position(F, 450), 1)
    assert mariadb.execute(f"SELECT id FROM {db}.{mine}") == [(4,)]
    take(5, other)
    take(6, other)
    assert app.target.applied(db).seq == 4  # type: ignore[union-attr]
    time.sleep(0.5)  # progress_interval_ms passes
    assert app.buffer.due()
    app.flush()
    assert app.target.applied(db) == AppliedState(db, 6, Position(F, 650), 1)
    assert not app.target.table_exists(db, other)  # partition 1's table: never touched here
    app.target.close()
    app.sub.close()
