"""The applier never applies two attempts of the same changes, whatever the
envelopes' fragment marks say.  The envelopes here are built by hand as a
producer that sends a stretch of the binlog again would build them (older
versions of Cynomys did, after a crash inside a batch cut mid-transaction),
and go through the real applier into a real MariaDB target."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cynomys.applier.loop import Applier, make_opener, make_subscriber
from cynomys.applier.targets.base import open_target
from cynomys.core.config import Config, load_config
from cynomys.core.errors import TerminalError
from cynomys.core.model import Batch, ColumnDef, Change, Op, Position, TableSchema
from cynomys.transport.keys import generate_keys
from tests.helpers import write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

F = "mysql-bin.000001"


def _applier(tmp_path: Path, mariadb: MariaDBServer) -> tuple[Applier, str]:
    db = f"rs_{uuid.uuid4().hex[:8]}"
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    # (producer id = db: the target's state table is shared by the tests on this server)
    path = write_config(tmp_path / "c.toml", mariadb, producer={"id": db},
                        transport={"kind": "file", "path": str(tmp_path / "t.bin")},
                        security={k: str(v) for k, v in keys.items()},
                        applier={"buffer_rows": 100_000, "max_delay_ms": 600_000},
                        target={"kind": "columnstore", "url": mariadb.url, "engine": "InnoDB"})
    return _open(load_config(path, env={})), db


def _open(cfg: Config) -> Applier:
    app = Applier(cfg, open_target(cfg), make_subscriber(cfg), make_opener(cfg))
    app.start()
    return app


def _txn(db: str, at: int, ids: range) -> list[Change]:
    schema = TableSchema(db, "t", (ColumnDef("id", "int(11)", False), ColumnDef("v", "int(11)")), ("id",))
    keyless = TableSchema(db, "n", (ColumnDef("a", "int(11)"),), ())
    txn = Position(F, at)
    out = []
    for i in ids:
        out.append(Change(Op.INSERT, db, "t", f"0-1-{at}", txn, 1, schema, None, (i, at)))
        out.append(Change(Op.INSERT, db, "n", f"0-1-{at}", txn, 1, keyless, None, (at,)))
    return out


def _batch(pid: str, changes: list[Change], *, end: int, complete: bool, start: tuple[int, int],
           stop: tuple[int, int] | None = None, frag: int | None = None) -> Batch:
    meta = {"from": f"{F}:{start[0]}", "from_n": str(start[1])}
    if stop is not None:
        meta.update({"to": f"{F}:{stop[0]}", "to_n": str(stop[1])})
    if frag is not None:
        meta["frag"] = str(frag)
    return Batch(pid, tuple(changes), Position(F, end), complete, changes[0].txn if changes else None, 0, 1, meta)


def _rows(mariadb: MariaDBServer, db: str) -> tuple[list[tuple], list[tuple]]:
    return (mariadb.execute(f"SELECT id, v FROM {db}.t ORDER BY id"),
            mariadb.execute(f"SELECT a, COUNT(*) FROM {db}.n GROUP BY a ORDER BY a"))


def test_a_resend_from_the_start_replaces_the_earlier_attempt(mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t1, t2 = _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 20))
    # Attempt 1: T1 whole and the first 6 changes of T2, cut inside T2.
    app.take(db, 1, _batch(db, t1 + t2[:6], end=250, complete=False, start=(100, 0), stop=(200, 6), frag=0))
    # The producer died and read T1 and T2 again, cut at the commit this time:
    # a plain complete envelope, no fragment mark at all.
    app.take(db, 2, _batch(db, t1 + t2, end=300, complete=True, start=(100, 0)))
    app.flush()
    assert _rows(mariadb, db) == ([(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 20)],
                                  [(100, 3), (200, 10)])


def test_a_continuation_is_taken_and_a_resend_of_part_of_the_buffer_stops(
        mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t1, t2 = _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 20))
    app.take(db, 1, _batch(db, t1 + t2[:6], end=250, complete=False, start=(100, 0), stop=(200, 6), frag=0))
    app.take(db, 2, _batch(db, t2[6:12], end=260, complete=False, start=(200, 6), stop=(200, 12), frag=1))
    # T2 sent again from its start: the buffer holds T1 folded with T2's
    # first part, which cannot be separated -- stop rather than guess.
    with pytest.raises(TerminalError, match="sent changes again"):
        app.take(db, 3, _batch(db, t2, end=300, complete=True, start=(200, 0)))
    # The right continuation instead completes the transaction.
    app.take(db, 3, _batch(db, t2[12:], end=300, complete=True, start=(200, 12), frag=2))
    app.flush()
    assert _rows(mariadb, db) == ([(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 20)],
                                  [(100, 3), (200, 10)])


def test_changes_the_target_holds_are_not_applied_again(mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t1, t2 = _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 12))
    app.take(db, 1, _batch(db, t1, end=150, complete=True, start=(100, 0)))
    app.flush()
    # A new sequence number carrying T1 again, then T2.
    app.take(db, 2, _batch(db, t1 + t2, end=300, complete=True, start=(100, 0)))
    app.flush()
    assert _rows(mariadb, db) == ([(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 12)],
                                  [(100, 3), (200, 2)])


def test_a_resend_drops_only_its_earlier_attempt_not_the_whole_transactions_before(
        mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t0, t1, t2 = _txn(db, 50, range(30, 33)), _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 20))
    app.take(db, 1, _batch(db, t0, end=90, complete=True, start=(50, 0)))       # buffered, not flushed
    app.take(db, 2, _batch(db, t1 + t2[:6], end=250, complete=False, start=(100, 0), stop=(200, 6), frag=0))
    app.take(db, 3, _batch(db, t1 + t2, end=300, complete=True, start=(100, 0)))  # sent again from T1
    app.flush()
    assert _rows(mariadb, db) == (
        [(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 20)] + [(i, 50) for i in range(30, 33)],
        [(50, 3), (100, 3), (200, 10)])
    # ... while one reaching into those whole transactions stops the applier.
    app.take(db, 4, _batch(db, _txn(db, 400, range(40, 41)), end=450, complete=True, start=(400, 0)))
    app.take(db, 5, _batch(db, _txn(db, 500, range(50, 52)), end=550, complete=False, start=(500, 0),
                           stop=(500, 2), frag=0))
    with pytest.raises(TerminalError, match="sent changes again"):
        app.take(db, 6, _batch(db, _txn(db, 400, range(40, 41)), end=600, complete=True, start=(400, 0)))


def test_an_applier_killed_right_after_a_ddl_loses_nothing_of_its_envelope(
        mariadb: MariaDBServer, tmp_path: Path) -> None:
    """The state recorded after a DDL said "applied up to the next change's
    transaction"; the next change was a net change folded from a later
    transaction, so after a crash there the changes of the transactions in
    between were filtered out as applied (keyless rows lost in the kill test)."""
    app, db = _applier(tmp_path, mariadb)
    ddl = Change(Op.DDL, db, "", "0-1-10", Position(F, 10), 1, sql=f"CREATE TABLE {db}.x (a INT)")
    t20 = _txn(db, 20, range(0, 1))                      # key 0 inserted, and a keyless row
    t30 = _txn(db, 30, range(5, 6))
    upd = [Change(Op.UPDATE, db, "t", "0-1-40", Position(F, 40), 1, t20[0].schema, (0, 20), (0, 40))]
    from cynomys.reducer.fold import fold
    changes = fold([ddl, *t20, *t30, *upd])
    assert changes[1].txn == Position(F, 40)  # the first net change after the DDL: key 0, folded from T20 and T40
    batch = _batch(db, changes, end=50, complete=True, start=(10, 0))
    app.take(db, 1, batch)                    # the DDL runs and commits its state; the rest is buffered
    app.sub.close()
    app.target.close()                        # killed before the flush
    app2 = _open(app.cfg)
    app2.take(db, 1, batch)
    app2.flush()
    assert _rows(mariadb, db) == ([(0, 40), (5, 30)], [(20, 1), (30, 1)])
