"""Snapshot rows loaded beside a flush on a second connection
(columnstore/beside.py), against a real MariaDB (InnoDB tables).

- A flush of snapshot runs and log changes of the same table: about half
  of the snapshot rows load on the side connection, the target ends as
  applying the flush in order would leave it (a read row wins over the
  log's earlier change of its key; the log's later change wins over it).
- The flush failing after the side committed: the target holds the side's
  rows and the old state; the flush applied again ends exact.
- The side locked out by another session: it gives its rows back to the
  flush after its lock wait, and the flush loads them.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from typing import Any, Iterator

import pytest

from cynomys.applier.targets.base import Flush, build_flush
from cynomys.applier.targets.columnstore import beside
from cynomys.applier.targets.columnstore.config import ColumnStoreConfig
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core.columnar import InsertRun
from cynomys.core.config import Config, TargetConfig
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, Row, TableSchema
from cynomys.schemas import codec
from tests.integration import target_contract as contract
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

CHUNK = 2000
_names = itertools.count(1)


@pytest.fixture(scope="module")
def server() -> Iterator[MariaDBServer]:
    srv = MariaDBServer(server_id=8).start()
    yield srv
    srv.destroy()


@pytest.fixture
def schema() -> TableSchema:
    return TableSchema(f"side_{next(_names)}", "t",
                       (ColumnDef("k", "bigint"), ColumnDef("n", "int"), ColumnDef("v", "varchar(40)")), ("k", "n"))


def config(url: str, side_load_rows: int = 1000) -> Config:
    return Config(target=TargetConfig(kind="columnstore", url=url,
                                      options=(ColumnStoreConfig("InnoDB", side_load_rows=side_load_rows),)))


def change(schema: TableSchema, op: Op, row: Row, before: Row | None = None) -> Change:
    return Change(op, schema.database, schema.table, "tid", Position("mysql-bin.000001", 4), 0, schema, before,
                  None if op is Op.DELETE else row)


def reads(schema: TableSchema, keys: range, tag: str = "read") -> list[Change]:
    """Snapshot chunks of ``keys`` as the compiled decoder hands them over: READ runs."""
    out: list[Change] = []
    for at in range(keys.start, keys.stop, CHUNK):
        batch = Batch("p", tuple(change(schema, Op.READ, (k, 1, f"{tag}{k}"))
                                 for k in range(at, min(at + CHUNK, keys.stop))), Position("f", 9))
        out.extend(codec.decode_columnar(codec.encode(batch)).changes)
    assert all(isinstance(c, InsertRun) for c in out)
    return out


def flush_of(changes: list[Change], seq: int) -> Flush:
    return build_flush(changes, contract.state(seq=seq, producer="side"), columnar=True)


def rows(server: MariaDBServer, schema: TableSchema) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in server.execute(f"SELECT k, n, v FROM {schema.database}.t ORDER BY k, n")]


def holding_key_10(target: ColumnStoreTarget, server: MariaDBServer, schema: TableSchema) -> Any:
    """A row (10, 1) in the target table, and another session holding its lock (rolled back to let go)."""
    target.apply(flush_of([change(schema, Op.INSERT, (10, 1, "old"))], 1))
    blocker = server.connect(schema.database)
    blocker.begin()
    with blocker.cursor() as cur:
        cur.execute("SELECT * FROM t WHERE k = 10 FOR UPDATE")
    return blocker


@pytest.fixture(autouse=True)
def _compiled() -> Iterator[None]:
    with contract.compiled_path():
        yield


def test_half_of_the_snapshot_rows_load_beside_and_the_flush_ends_exact(server: MariaDBServer,
                                                                        schema: TableSchema) -> None:
    target = ColumnStoreTarget(config(server.url))
    target.connect()
    try:
        # Rows the target holds before: some the log then changes, some a chunk reads again.
        target.apply(flush_of([change(schema, Op.INSERT, (k, 1, f"old{k}")) for k in (5, 6, 9000, 9001)], 1))
        log_first = [change(schema, Op.UPDATE, (9000, 1, "log9000"), before=(9000, 1, "old9000"))]
        snapshot = reads(schema, range(0, 10_000))
        # The buffer folds a read row the log changes later out of its run.
        last = snapshot[-1]
        assert isinstance(last, InsertRun)
        snapshot[-1] = dataclasses.replace(last, excluded=frozenset({9001 - 8000}))
        log_after = [change(schema, Op.INSERT, (20_000, 1, "new")),
                     change(schema, Op.DELETE, (9001, 1, "read9001"), before=(9001, 1, "read9001"))]
        flush = flush_of(log_first + snapshot + log_after, 2)
        target.apply(flush)
        assert target.side.rows >= 4000, "about half of the snapshot rows load beside"
        want = {k: (k, 1, f"read{k}") for k in range(10_000)}  # read rows replace the old ones (5, 6, 9000)
        del want[9001]  # deleted by the log after its read
        want[20_000] = (20_000, 1, "new")
        assert rows(server, schema) == sorted(want.values())
        assert target.applied("side") == flush.state
    finally:
        target.close()


class FailsAtState(ColumnStoreTarget):
    """Fails after every table (and the side load) is done, before the state."""

    def _write_state(self, cur: Any, state: Any) -> None:
        raise RuntimeError("killed before the state was written")


def test_a_flush_failing_after_the_side_commit_is_applied_again_exactly(server: MariaDBServer,
                                                                        schema: TableSchema) -> None:
    good = ColumnStoreTarget(config(server.url))
    good.connect()
    bad = FailsAtState(config(server.url))
    bad.connect()
    try:
        first = flush_of([change(schema, Op.INSERT, (k, 1, f"old{k}")) for k in range(3)], 1)
        good.apply(first)
        flush = flush_of([change(schema, Op.UPDATE, (1, 1, "log1"), before=(1, 1, "old1"))]
                         + reads(schema, range(1000, 9000)), 2)
        with pytest.raises(RuntimeError):
            bad.apply(flush)
        assert bad.side.rows > 0
        got = rows(server, schema)
        # The side's rows are in (committed first), the flush's own change and state are not.
        assert (1, 1, "old1") in got and (1000, 1, "read1000") in got and len(got) == 3 + bad.side.rows
        assert good.applied("side") == first.state
        # Applied again (after a restart: the same envelopes): exact.
        good.apply(flush)
        want = [(0, 1, "old0"), (1, 1, "log1"), (2, 1, "old2")] + [(k, 1, f"read{k}") for k in range(1000, 9000)]
        assert rows(server, schema) == want
        assert good.applied("side") == flush.state
    finally:
        bad.close()
        good.close()


def test_a_side_load_locked_out_gives_its_rows_back_to_the_flush(server: MariaDBServer, schema: TableSchema,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(beside, "SIDE_SESSION_SQL", (beside.ISOLATION_SQL, "SET SESSION innodb_lock_wait_timeout = 1"))
    target = ColumnStoreTarget(config(server.url))
    target.connect()
    # Another session holds the row a snapshot chunk replaces (key 10, in
    # the first chunk: the side's), then lets go after 3 s.
    blocker = holding_key_10(target, server, schema)
    try:
        timer = threading.Timer(3.0, blocker.rollback)
        timer.start()
        flush = flush_of(reads(schema, range(0, 8000)), 2)
        with caplog.at_level(logging.INFO, logger="cynomys.applier.targets.columnstore.target"):
            target.apply(flush)
        timer.join()
        assert "gave its" in caplog.text and "back to the flush" in caplog.text
        assert target.side.rows == 0
        assert rows(server, schema) == [(k, 1, f"read{k}") for k in range(8000)]
        assert target.applied("side") == flush.state
        # The side connection was dropped; the next flush loads beside again.
        target.apply(flush_of(reads(schema, range(8000, 16000)), 3))
        assert target.side.rows > 0
        assert len(rows(server, schema)) == 16000
    finally:
        blocker.close()
        target.close()


def test_off_and_below_the_threshold_nothing_loads_beside(server: MariaDBServer, schema: TableSchema) -> None:
    for side_load_rows in (0, 100_000):
        target = ColumnStoreTarget(config(server.url, side_load_rows))
        target.connect()
        try:
            target.apply(flush_of(reads(schema, range(0, 8000), tag=f"t{side_load_rows}-"), side_load_rows + 1))
            assert target.side.rows == 0
            assert rows(server, schema) == [(k, 1, f"t{side_load_rows}-{k}") for k in range(8000)]
        finally:
            target.close()


class ShortLockWait(ColumnStoreTarget):
    session_sql = (*ColumnStoreTarget.session_sql, "SET SESSION innodb_lock_wait_timeout = 1")


def test_a_load_timing_out_on_a_lock_is_transient_not_a_refused_value(server: MariaDBServer,
                                                                     schema: TableSchema) -> None:
    """A LOAD DATA that fails for the connection or a lock (not a value) is
    retried: it was reported as a value the target refused, which stops the
    applier."""
    from cynomys.core.errors import TargetUnavailableError

    target = ShortLockWait(config(server.url, side_load_rows=0))
    target.connect()
    blocker = holding_key_10(target, server, schema)
    try:
        flush = flush_of(reads(schema, range(0, 100)), 2)
        with pytest.raises(TargetUnavailableError, match="1205"):
            target.apply(flush)
        blocker.rollback()
        target.apply(flush)  # the retry
        assert rows(server, schema) == [(k, 1, f"read{k}") for k in range(100)]
    finally:
        blocker.close()
        target.close()
