"""The commit stage overlapped with the loop (applier/committer.py), on a real
MariaDB target: while behind, a flush commits on the worker as the loop
takes the next envelopes; its envelopes are acknowledged only once it
committed; a commit that fails in flight stops the loop with its error,
nothing of it acknowledged, and the next start makes the target exact."""
from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import pytest

from cynomys.applier.loop import Applier
from cynomys.applier.receive import make_subscriber
from cynomys.applier.targets.base import Flush, open_target
from cynomys.core.config import Config, load_config
from cynomys.core.errors import TargetUnavailableError
from cynomys.transport.bus import Subscriber
from cynomys.transport.channel import make_opener
from cynomys.transport.keys import generate_keys
from tests.helpers import SubscriberProxy, produce_to_end, transport_envelopes, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

TXNS = 40  # source transactions of 26 changes (25 rows inserted) each


class Recorder:
    """The events of a run, in order: commits started and ended (with the
    highest envelope number each commits and the thread it ran on), and
    acknowledgements (how many envelopes acknowledged so far)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, int, int]] = []
        self.acked = 0
        self.committed_seq = 0
        self.taken_during_commit = 0

    def add(self, kind: str, value: int) -> None:
        with self.lock:
            self.events.append((kind, value, threading.get_ident()))


class Acks(SubscriberProxy):
    """The real subscriber; each acknowledgement recorded, to be checked against what committed."""

    def __init__(self, sub: Subscriber, rec: Recorder) -> None:
        super().__init__(sub)
        self.rec = rec

    def ack(self, ids: Sequence[str]) -> None:
        self.rec.acked += len(ids)
        self.rec.add("ack", self.rec.acked)
        self.sub.ack(ids)



def _source(mariadb: MariaDBServer, target: MariaDBServer, tmp_path: Path,
            overlap: bool = True) -> tuple[str, Config, int]:
    """The source's transactions on the transport; returns the database, the
    config and how many envelopes carry them."""
    db = f"oc_{uuid.uuid4().hex[:8]}"
    start = mariadb.execute("SHOW MASTER STATUS")[0]
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.k (id INT PRIMARY KEY, v INT)")
    for t in range(TXNS):
        mariadb.execute("BEGIN", *(f"INSERT INTO {db}.k VALUES ({t * 100 + i}, {t})" for i in range(25)),
                        f"UPDATE {db}.k SET v = v + 1 WHERE id = {t * 100}", "COMMIT")
    keys = {k: str(v) for k, v in generate_keys(tmp_path / "keys", rsa_bits=2048).items()}
    cfg = load_config(write_config(
        tmp_path / "c.toml", mariadb, source={"include_tables": [f"{db}.*"], "start": f"{start[0]}:{start[1]}"},
        producer={"id": db, "batch_max_events": 30, "batch_max_delay_ms": 0},
        transport={"kind": "file", "path": str(tmp_path / "t.bin")}, security=keys,
        # Read 20 envelopes at a time (a full read: behind), flush every 100
        # changes (4 envelopes) while behind: several flushes per read.
        applier={"buffer_rows": 100, "max_delay_ms": 0, "max_buffer_rows": 100, "overlap_commits": overlap},
        target={"kind": "columnstore", "url": target.url, "engine": "InnoDB"}), env={})
    produce_to_end(cfg)
    envelopes = transport_envelopes(cfg)
    assert [o.seq for o in envelopes] == list(range(1, len(envelopes) + 1)) and len(envelopes) > 10
    return db, cfg, len(envelopes)


def _applier(cfg: Config, rec: Recorder, fail_at: int = 0, slow_s: float = 0.15) -> tuple[Applier, Acks]:
    """An applier whose target commits slowly (``slow_s`` each, so the loop
    has time to go on) and, at its ``fail_at``-th commit, fails before it."""
    t = open_target(cfg)
    real = t.apply
    calls = [0]
    app: list[Applier] = []

    def apply(flush: Flush) -> None:
        calls[0] += 1
        before = app[0].stats.envelopes
        rec.add("commit-start", flush.state.seq)
        time.sleep(slow_s)
        if calls[0] == fail_at:
            rec.add("commit-failed", flush.state.seq)
            raise TargetUnavailableError("injected: the target connection broke during the commit")
        real(flush)
        rec.committed_seq = max(rec.committed_seq, flush.state.seq)
        rec.taken_during_commit += app[0].stats.envelopes - before
        rec.add("commit-end", flush.state.seq)

    t.apply = apply  # type: ignore[method-assign]
    acks = Acks(make_subscriber(cfg), rec)
    app.append(Applier(cfg, t, acks, make_opener(cfg)))
    return app[0], acks


def _run_to_idle(app: Applier, acks: Acks) -> None:
    try:
        app.run(until_idle_s=0.5)
    finally:
        acks.close()
        app.target.close()


def _check_acks_follow_commits(rec: Recorder) -> None:
    committed = 0
    for kind, value, _ in rec.events:
        if kind == "commit-end":
            committed = max(committed, value)
        elif kind == "ack":
            # Envelopes are numbered 1, 2, ... in delivery order here: the
            # n-th acknowledged envelope must be in a committed flush.
            assert value <= committed, f"{value} envelopes acknowledged with only {committed} committed: {rec.events}"


def _rows(srv: MariaDBServer, db: str) -> Any:
    return srv.execute(f"SELECT id, v FROM {db}.k ORDER BY id")


def test_while_behind_the_loop_takes_envelopes_as_a_flush_commits_and_acknowledges_it_after(
        mariadb: MariaDBServer, target: MariaDBServer, tmp_path: Path) -> None:
    db, cfg, n = _source(mariadb, target, tmp_path)
    rec = Recorder()
    app, acks = _applier(cfg, rec)
    _run_to_idle(app, acks)
    main = threading.get_ident()
    on_worker = [e for e in rec.events if e[0] == "commit-start" and e[2] != main]
    assert on_worker, "no flush committed on the commit stage's worker"
    assert rec.taken_during_commit > 0, "the loop took no envelope while a flush was committing"
    _check_acks_follow_commits(rec)
    assert rec.acked == n, "every envelope acknowledged at the end"
    assert _rows(target, db) == _rows(mariadb, db) and len(_rows(target, db)) == 25 * TXNS


def test_overlap_commits_off_commits_each_flush_in_the_loop(mariadb: MariaDBServer, target: MariaDBServer,
                                                            tmp_path: Path) -> None:
    db, cfg, _ = _source(mariadb, target, tmp_path, overlap=False)
    rec = Recorder()
    app, acks = _applier(cfg, rec, slow_s=0.0)
    _run_to_idle(app, acks)
    assert {e[2] for e in rec.events if e[0] == "commit-start"} == {threading.get_ident()}
    assert rec.taken_during_commit == 0
    assert _rows(target, db) == _rows(mariadb, db)


def test_a_flush_that_fails_in_flight_stops_the_loop_unacknowledged_and_the_next_start_is_exact(
        mariadb: MariaDBServer, target: MariaDBServer, tmp_path: Path) -> None:
    db, cfg, n = _source(mariadb, target, tmp_path)
    rec = Recorder()
    app, acks = _applier(cfg, rec, fail_at=3)
    with pytest.raises(TargetUnavailableError, match="injected"):
        _run_to_idle(app, acks)
    failed = [e for e in rec.events if e[0] == "commit-failed"]
    assert failed and failed[0][2] != threading.get_ident(), "the failing commit ran on the worker"
    _check_acks_follow_commits(rec)
    assert 0 < rec.committed_seq < n and rec.acked <= rec.committed_seq
    # What the loop took after the failed flush was never committed either:
    # the target holds exactly the flushes before it, whole transactions.
    check = open_target(cfg)
    check.connect()
    try:
        state = check.applied(db)
    finally:
        check.close()
    assert state is not None and state.seq == rec.committed_seq
    groups: dict[int, list[int]] = {}
    for row_id, _ in _rows(target, db):
        groups.setdefault(int(row_id) // 100, []).append(int(row_id))
    assert groups and all(len(ids) == 25 for ids in groups.values()), "a transaction applied in part"
    assert sorted(groups) == list(range(len(groups))), "transactions applied out of order"

    again = Recorder()
    app, acks = _applier(cfg, again, slow_s=0.0)
    _run_to_idle(app, acks)
    assert again.acked == n - rec.acked, "the next start acknowledges what the failed run had not"
    assert _rows(target, db) == _rows(mariadb, db) and len(_rows(target, db)) == 25 * TXNS
