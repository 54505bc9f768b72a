"""A keyless table's snapshot rows loaded beside a transaction applied in
parts (applier/targets/columnstore/sidexa.py), on a real MariaDB target:
they commit with it, and the faults between its two commits end exact.

The faults are real: a connection the server closes (its XA transaction
then outlives it, prepared), a connection KILLed by the server before the
commit.  The daemons' SIGKILLs inside a keyless read loaded beside run in
test_keyless_snapshot.py."""
from __future__ import annotations

import itertools
from typing import Any, Iterator

import pytest

from cynomys.applier.targets.base import build_flush
from cynomys.applier.targets.columnstore import sidexa
from cynomys.applier.targets.columnstore.config import ColumnStoreConfig
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core.config import Config, TargetConfig
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, Op, Position, Row, TableSchema
from cynomys.schemas import codec
from tests.integration.target_contract import change, compiled_path
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

_dbs = itertools.count(1)


@pytest.fixture(scope="module")
def server() -> Iterator[MariaDBServer]:
    srv = MariaDBServer(server_id=9).start()
    yield srv
    srv.destroy()


@pytest.fixture
def schema(server: MariaDBServer) -> TableSchema:
    return TableSchema(f"xa_{next(_dbs)}", "bag", (ColumnDef("n", "int"), ColumnDef("w", "varchar(20)")), ())


def _target(server: MariaDBServer, pid: str, side_rows: int = 10) -> ColumnStoreTarget:
    t = ColumnStoreTarget(Config(target=TargetConfig(
        kind="columnstore", url=server.url, options=(ColumnStoreConfig("InnoDB", side_load_rows=side_rows),))))
    t.connect()
    t.recover(pid)
    return t


def _rows(a: int, b: int) -> list[Row]:
    return [(i % 7, f"row {i}") for i in range(a, b)]


def _part(schema: TableSchema, rows: list[Row], seq: int, extra: list[Change] | None = None) -> Any:
    """A flush of READ rows (column-wise, as the applier decodes them)."""
    reads = codec.decode_columnar(codec.encode(Batch("p", tuple(
        change(Op.READ, schema, after=r) for r in rows), Position("f", 9)))).changes
    return build_flush([*reads, *(extra or [])], AppliedState(schema.database, seq, Position("f", 100 + seq)), True, True)


def _count(server: MariaDBServer, schema: TableSchema) -> int:
    return int(server.execute(f"SELECT COUNT(*) FROM {schema.database}.{schema.table}")[0][0])


def _prepared(server: MariaDBServer) -> list[str]:
    return [bytes(r[3]).decode() for r in server.execute("XA RECOVER") if bytes(r[3]).startswith(b"cynomys-side-")]


def _bag(server: MariaDBServer, schema: TableSchema) -> list[tuple[Any, ...]]:
    return sorted(server.execute(f"SELECT n, w FROM {schema.database}.{schema.table}"))


def test_parts_load_beside_and_commit_together(server: MariaDBServer, schema: TableSchema) -> None:
    with compiled_path():
        target = _target(server, schema.database)
        try:
            target.apply_part(_part(schema, _rows(0, 300), 1))
            target.apply_part(_part(schema, _rows(300, 700), 1))
            assert target.xa.active and target.xa.rows > 0
            assert _count(server, schema) == 0, "a part is visible before its transaction commits"
            target.commit_parts(_part(schema, _rows(700, 800), 2))
            assert _bag(server, schema) == sorted(_rows(0, 800))
            assert target.xa.committed_rows >= 350, target.xa.committed_rows  # about half went beside
            assert not _prepared(server)
            assert server.execute("SELECT COUNT(*) FROM cynomys_state.side_xa")[0][0] == 0
            assert target.applied(schema.database) is not None and target.applied(schema.database).seq == 2  # type: ignore[union-attr]
            # A transaction loaded beside, rolled back: nothing of either connection stays.
            target.apply_part(_part(schema, _rows(800, 1000), 3))
            assert target.xa.active
            target.rollback_parts()
            assert not target.xa.active and _bag(server, schema) == sorted(_rows(0, 800)) and not _prepared(server)
        finally:
            target.close()


def test_a_side_left_prepared_after_its_commit_is_committed_at_the_next_start(
        server: MariaDBServer, schema: TableSchema, monkeypatch: pytest.MonkeyPatch) -> None:
    """The applier dies between the open transaction's COMMIT and the
    side's XA COMMIT: its connection goes, the prepared side stays."""
    with compiled_path():
        target = _target(server, schema.database)
        monkeypatch.setattr(sidexa.XaSide, "commit", lambda self, table: self._forget(drop=True))
        try:
            target.apply_part(_part(schema, _rows(0, 400), 1))
            target.commit_parts(_part(schema, _rows(400, 500), 2))
        finally:
            target.close()
        monkeypatch.undo()
        assert len(_prepared(server)) == 1
        assert _count(server, schema) < 500  # the side's rows are not there yet
        again = _target(server, schema.database)  # the next start
        try:
            assert _bag(server, schema) == sorted(_rows(0, 500)) and not _prepared(server)
            assert again.applied(schema.database).seq == 2  # type: ignore[union-attr]
        finally:
            again.close()


def test_a_side_prepared_for_a_commit_that_never_happened_is_rolled_back(
        server: MariaDBServer, schema: TableSchema, monkeypatch: pytest.MonkeyPatch) -> None:
    """The open transaction's connection is killed by the server after the
    side is prepared, before the COMMIT: the state is not written, so the
    side's rows must not stay."""
    with compiled_path():
        target = _target(server, schema.database)
        real = sidexa.XaSide.prepare

        def prepare_then_kill(self: sidexa.XaSide) -> str:
            xid = real(self)
            conn = target._open_conn
            assert conn is not None
            server.execute(f"KILL CONNECTION {conn.thread_id()}")
            return xid
        monkeypatch.setattr(sidexa.XaSide, "prepare", prepare_then_kill)
        try:
            target.apply_part(_part(schema, _rows(0, 400), 1))
            with pytest.raises(TargetUnavailableError):
                target.commit_parts(_part(schema, _rows(400, 500), 2))
        finally:
            target.close()
        monkeypatch.undo()
        assert len(_prepared(server)) == 1 and _count(server, schema) == 0
        again = _target(server, schema.database)
        try:
            assert _count(server, schema) == 0 and not _prepared(server)
            assert again.applied(schema.database) is None
            # The transaction applied again, from its start, lands whole.
            again.apply_part(_part(schema, _rows(0, 400), 1))
            again.commit_parts(_part(schema, _rows(400, 500), 2))
            assert _bag(server, schema) == sorted(_rows(0, 500))
        finally:
            again.close()


def test_a_live_appliers_prepared_side_is_left_to_it(server: MariaDBServer, schema: TableSchema) -> None:
    """Recovery by a second applier of the same producer never finishes a
    side whose connection is alive (the server refuses it: XAER_NOTA)."""
    with compiled_path():
        target = _target(server, schema.database)
        try:
            target.apply_part(_part(schema, _rows(0, 400), 1))
            with target.xa._conn.cursor() as cur:  # prepared while its applier lives (as inside commit_parts)
                cur.execute("XA END %s", (target.xa.xid,))
                cur.execute("XA PREPARE %s", (target.xa.xid,))
            target.xa.prepared = True
            other = ColumnStoreTarget(target.cfg)
            other.connect()
            try:
                other.recover(schema.database)  # neither commits nor rolls back the live one
            finally:
                other.close()
            assert _prepared(server) == [target.xa.xid]
        finally:
            target.close()  # abandoned prepared: recovery decides
        again = _target(server, schema.database)
        again.close()
        assert not _prepared(server) and _count(server, schema) == 0  # never recorded: rolled back


def test_a_part_deleting_rows_loaded_beside_stops(server: MariaDBServer, schema: TableSchema) -> None:
    with compiled_path():
        target = _target(server, schema.database)
        try:
            target.apply_part(_part(schema, _rows(0, 400), 1))
            gone = change(Op.DELETE, schema, before=_rows(0, 1)[0])
            with pytest.raises(TargetRejectedError, match=rf"(?s)deletes from {schema.database}\.bag.*side_load_rows = 0"):
                target.apply_part(_part(schema, [], 1, extra=[gone]))
        finally:
            target.close()
        assert _count(server, schema) == 0 and not _prepared(server)


def test_a_side_load_locked_out_rolls_back_and_the_next_attempt_loads_on_one_connection(
        server: MariaDBServer, schema: TableSchema, monkeypatch: pytest.MonkeyPatch) -> None:
    import pymysql

    from cynomys.applier.targets.columnstore import target as target_module

    def locked_out(cur: Any, tf: Any) -> None:
        raise pymysql.err.OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")
    monkeypatch.setattr(target_module, "_XA_OFF", set())
    with compiled_path():
        target = _target(server, schema.database)
        try:
            target.apply_part(_part(schema, _rows(0, 400), 1))  # beside, for real
            monkeypatch.setattr(target.xa, "_load", locked_out)
            with pytest.raises(TargetUnavailableError, match="side load .* failed .*1205"):
                target.apply_part(_part(schema, _rows(400, 800), 1))
            assert not target.parts_open and not target.xa.active
        finally:
            target.close()
        assert _count(server, schema) == 0 and not _prepared(server)
        again = _target(server, schema.database)  # the applier's next attempt
        try:
            again.apply_part(_part(schema, _rows(0, 400), 1))
            assert not again.xa.active  # one connection now
            again.commit_parts(_part(schema, _rows(400, 500), 2))
            assert _bag(server, schema) == sorted(_rows(0, 500))
        finally:
            again.close()
