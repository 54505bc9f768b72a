"""The applier never applies two attempts of the same changes, whatever the
envelopes' fragment marks say.  The envelopes here are built by hand as a
producer that sends a stretch of the binlog again would build them (older
versions of Cynomys did, after a crash inside a batch cut mid-transaction),
and go through the real applier into a real MariaDB target."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cynomys.applier.loop import Applier
from cynomys.applier.receive import make_subscriber
from cynomys.applier.targets.base import open_target
from cynomys.core.config import Config, load_config
from cynomys.core.errors import TerminalError
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.transport.channel import make_opener
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


def _txn(db: str, at: int, ids: range, file: str = F, gtid: str = "") -> list[Change]:
    schema = TableSchema(db, "t", (ColumnDef("id", "int(11)", False), ColumnDef("v", "int(11)")), ("id",))
    keyless = TableSchema(db, "n", (ColumnDef("a", "int(11)"),), ())
    txn = Position(file, at)
    out = []
    for i in ids:
        out.append(Change(Op.INSERT, db, "t", gtid or f"0-1-{at}", txn, 1, schema, None, (i, at)))
        out.append(Change(Op.INSERT, db, "n", gtid or f"0-1-{at}", txn, 1, keyless, None, (at,)))
    return out


def _batch(pid: str, changes: list[Change], *, end: int, complete: bool, start: tuple[int, int],
           stop: tuple[int, int] | None = None, frag: int | None = None, after: int | None = None,
           file: str = F, server: str = "", gtid: str = "") -> Batch:
    meta = {"from": f"{file}:{start[0]}", "from_n": str(start[1])}
    if stop is not None:
        meta.update({"to": f"{file}:{stop[0]}", "to_n": str(stop[1])})
    if frag is not None:
        meta["frag"] = str(frag)
    if after is not None:
        meta["after"] = f"{file}:{after}"
    if server:
        meta["server"] = server
    return Batch(pid, tuple(changes), Position(file, end, gtid), complete, changes[0].txn if changes else None, 0, 1,
                 meta)


def _rows(mariadb: MariaDBServer, db: str) -> tuple[list[tuple], list[tuple]]:
    return (mariadb.execute(f"SELECT id, v FROM {db}.t ORDER BY id"),
            mariadb.execute(f"SELECT a, COUNT(*) FROM {db}.n GROUP BY a ORDER BY a"))


def test_a_resend_from_the_start_replaces_the_earlier_attempt(mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t1, t2 = _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 20))
    # Attempt 1: T1 whole and the first 6 changes of T2, cut inside T2.
    app.offer(db, 1, _batch(db, t1 + t2[:6], end=250, complete=False, start=(100, 0), stop=(200, 6), frag=0))
    # The producer died and read T1 and T2 again, cut at the commit this time:
    # a plain complete envelope, no fragment mark at all.
    app.offer(db, 2, _batch(db, t1 + t2, end=300, complete=True, start=(100, 0)))
    app.flush()
    assert _rows(mariadb, db) == ([(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 20)],
                                  [(100, 3), (200, 10)])


def test_a_continuation_is_taken_and_a_resend_of_part_of_the_buffer_stops(
        mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t1, t2 = _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 20))
    app.offer(db, 1, _batch(db, t1 + t2[:6], end=250, complete=False, start=(100, 0), stop=(200, 6), frag=0))
    app.offer(db, 2, _batch(db, t2[6:12], end=260, complete=False, start=(200, 6), stop=(200, 12), frag=1))
    # T2 sent again from its start: the buffer holds T1 folded with T2's
    # first part, which cannot be separated -- stop rather than guess.
    with pytest.raises(TerminalError, match="sent changes again"):
        app.offer(db, 3, _batch(db, t2, end=300, complete=True, start=(200, 0)))
    # The right continuation instead completes the transaction.
    app.offer(db, 3, _batch(db, t2[12:], end=300, complete=True, start=(200, 12), frag=2))
    app.flush()
    assert _rows(mariadb, db) == ([(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 20)],
                                  [(100, 3), (200, 10)])


def test_changes_the_target_holds_are_not_applied_again(mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t1, t2 = _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 12))
    app.offer(db, 1, _batch(db, t1, end=150, complete=True, start=(100, 0)))
    app.flush()
    # A new sequence number carrying T1 again, then T2.
    app.offer(db, 2, _batch(db, t1 + t2, end=300, complete=True, start=(100, 0)))
    app.flush()
    assert _rows(mariadb, db) == ([(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 12)],
                                  [(100, 3), (200, 2)])


def test_a_resend_drops_only_its_earlier_attempt_not_the_whole_transactions_before(
        mariadb: MariaDBServer, tmp_path: Path) -> None:
    app, db = _applier(tmp_path, mariadb)
    t0, t1, t2 = _txn(db, 50, range(30, 33)), _txn(db, 100, range(0, 3)), _txn(db, 200, range(10, 20))
    app.offer(db, 1, _batch(db, t0, end=90, complete=True, start=(50, 0)))       # buffered, not flushed
    app.offer(db, 2, _batch(db, t1 + t2[:6], end=250, complete=False, start=(100, 0), stop=(200, 6), frag=0))
    app.offer(db, 3, _batch(db, t1 + t2, end=300, complete=True, start=(100, 0)))  # sent again from T1
    app.flush()
    assert _rows(mariadb, db) == (
        [(i, 100) for i in range(3)] + [(i, 200) for i in range(10, 20)] + [(i, 50) for i in range(30, 33)],
        [(50, 3), (100, 3), (200, 10)])
    # ... while one reaching into those whole transactions stops the applier.
    app.offer(db, 4, _batch(db, _txn(db, 400, range(40, 41)), end=450, complete=True, start=(400, 0)))
    app.offer(db, 5, _batch(db, _txn(db, 500, range(50, 52)), end=550, complete=False, start=(500, 0),
                           stop=(500, 2), frag=0))
    with pytest.raises(TerminalError, match="sent changes again"):
        app.offer(db, 6, _batch(db, _txn(db, 400, range(40, 41)), end=600, complete=True, start=(400, 0)))


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
    app.offer(db, 1, batch)                    # the DDL runs and commits its state; the rest is buffered
    app.sub.close()
    app.target.close()                        # killed before the flush
    app2 = _open(app.cfg)
    app2.offer(db, 1, batch)
    app2.flush()
    assert _rows(mariadb, db) == ([(0, 40), (5, 30)], [(20, 1), (30, 1)])


def test_a_resent_number_with_other_boundaries_applies_its_tail(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """The producer's state went back (a Redis that lost its last second
    under HA) after envelope 1, while the target took 2 and 3; the producer
    re-reads and re-sends number 2 covering more.  Compared by number only,
    it was skipped whole and rows 4 and 5 were lost (target [1,2,3,6])."""
    app, db = _applier(tmp_path, mariadb)
    for seq, at in ((1, 100), (2, 200), (3, 300)):
        app.offer(db, seq, _batch(db, _txn(db, at, range(seq, seq + 1)), end=at + 50, complete=True, start=(at, 0),
                                  after=at - 50))
    app.flush()
    resent = _txn(db, 200, range(2, 3)) + _txn(db, 300, range(3, 4)) + _txn(db, 400, range(4, 5)) \
        + _txn(db, 500, range(5, 6))
    app.offer(db, 2, _batch(db, resent, end=550, complete=True, start=(200, 0), after=150))
    app.offer(db, 3, _batch(db, _txn(db, 600, range(6, 7)), end=650, complete=True, start=(600, 0), after=550))
    app.flush()
    assert _rows(mariadb, db) == ([(i, i * 100) for i in range(1, 7)], [(i * 100, 1) for i in range(1, 7)])
    assert app.target.applied(db).seq == 3  # the recorded number never moves back


def test_a_resent_stream_numbered_past_the_highest_never_moves_the_position_back(
        mariadb: MariaDBServer, tmp_path: Path) -> None:
    """The producer's state went back to after envelope 1 while the target
    took 2 and 3 (up to 350); re-batching, it sends 2 and 3 again covering
    less, then 4, which still ends inside what the target holds.  Number 4
    follows the highest taken, but recording its end (250) moved the
    target's position back, and envelope 5 then applied 300's keyless row a
    second time: silently (a keyed row stops on its duplicate key).  Found
    by tests/unit/test_exactly_once.py on the fakes."""
    app, db = _applier(tmp_path, mariadb)
    for seq, at in ((1, 100), (2, 200), (3, 300)):
        app.offer(db, seq, _batch(db, _txn(db, at, range(seq, seq + 1)), end=at + 50, complete=True, start=(at, 0),
                                  after=at - 50))
    app.flush()
    app.offer(db, 2, _batch(db, [], end=150, complete=True, start=(150, 0), after=150))
    app.offer(db, 3, _batch(db, [], end=200, complete=True, start=(200, 0), after=150))
    app.offer(db, 4, _batch(db, _txn(db, 200, range(2, 3)), end=250, complete=True, start=(200, 0), after=200))
    app.flush()
    assert app.target.applied(db).position == Position(F, 350)
    app.offer(db, 5, _batch(db, _txn(db, 300, range(3, 4)) + _txn(db, 400, range(4, 5)), end=450, complete=True,
                            start=(300, 0), after=250))
    app.flush()
    assert _rows(mariadb, db) == ([(i, i * 100) for i in range(1, 5)], [(i * 100, 1) for i in range(1, 5)])
    assert app.target.applied(db).position == Position(F, 450)


def test_changes_of_another_server_are_placed_by_gtid(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """A failover: the target holds the old primary (binlog.000004) up to
    GTID 0-1-11; the new primary writes binlog.000001.  By file number every
    change of the new primary sorted below the applied position (dropped)."""
    app, db = _applier(tmp_path, mariadb)
    old, new = "binlog.000004", "binlog.000001"
    app.offer(db, 1, _batch(db, _txn(db, 100, range(1, 2), old, "0-1-10") + _txn(db, 900, range(2, 3), old, "0-1-11"),
                            end=950, complete=True, start=(100, 0), file=old, server="server_id=1", gtid="0-1-11"))
    app.flush()
    # The producer moved to the new primary by GTID: it re-reads 0-1-11 there.
    app.offer(db, 2, _batch(db, _txn(db, 300, range(2, 3), new, "0-1-11") + _txn(db, 400, range(3, 4), new, "0-2-12"),
                            end=450, complete=True, start=(300, 0), file=new, server="server_id=2", gtid="0-2-12"))
    app.flush()
    assert _rows(mariadb, db) == ([(1, 100), (2, 900), (3, 400)], [(100, 1), (400, 1), (900, 1)])
    st = app.target.applied(db)
    assert (st.position, st.server) == (Position(new, 450, "0-2-12"), "server_id=2")
    # Without GTIDs the new server's changes cannot be placed: a stop, not a guess.
    with pytest.raises(TerminalError, match="cannot be placed"):
        app.offer(db, 3, _batch(db, _txn(db, 500, range(5, 6), old, f"{old}:500"), end=550, complete=True,
                                start=(500, 0), file=old, server="server_id=3"))
