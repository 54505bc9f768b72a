"""A keyless target table whose rows change: each updated or deleted row is
found by all its values, a scan of an InnoDB table without an index.  The
applier says so once per table, with the fix; an index the user adds on
the target is used (real MariaDB)."""
from __future__ import annotations

import logging
from typing import Iterator

import pytest

from cynomys.applier.targets.columnstore import target as columnstore
from cynomys.applier.targets.columnstore.config import ColumnStoreConfig
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core.config import Config, TargetConfig
from cynomys.core.model import ColumnDef, Op, TableSchema
from tests.integration import target_contract as contract
from tests.servers.mariadb import MariaDBServer

ROWS = 1_500_000
SCHEMA = TableSchema("bag", "t", (ColumnDef("a", "int"), ColumnDef("b", "int"), ColumnDef("s", "varchar(20)")), ())


@pytest.fixture(scope="module")
def server() -> Iterator[MariaDBServer]:
    srv = MariaDBServer(server_id=9).start()
    yield srv
    srv.destroy()


def _delete_and_update(target: ColumnStoreTarget, n: int) -> None:
    target.apply(contract.flush([
        contract.change(Op.DELETE, SCHEMA, before=(n, n % 7, f"row {n}")),
        contract.change(Op.UPDATE, SCHEMA, before=(n + 1, (n + 1) % 7, f"row {n + 1}"), after=(n + 1, 0, "changed"))]))


def test_a_keyless_delete_that_scans_is_named_once_with_the_fix(server: MariaDBServer,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    cfg = Config(target=TargetConfig(kind="columnstore", url=server.url, options=(ColumnStoreConfig("InnoDB"),)))
    target = ColumnStoreTarget(cfg)
    target.connect()
    try:
        target.apply(contract.flush([contract.change(Op.INSERT, SCHEMA, after=(0, 0, "row 0"))]))
        server.execute(f"INSERT INTO bag.t SELECT seq, seq % 7, CONCAT('row ', seq) FROM bag.seq_1_to_{ROWS}")
        with caplog.at_level(logging.WARNING, logger=columnstore.__name__):
            # Rows near the table's end: a scan that stops at the first match reads it all.
            _delete_and_update(target, ROWS - 100)
            _delete_and_update(target, ROWS - 50)
        warned = [r.getMessage() for r in caplog.records if "has no primary key" in r.getMessage()]
        assert len(warned) == 1, warned  # once per table
        assert "target table bag.t" in warned[0] and "ALTER TABLE bag.t ADD INDEX" in warned[0], warned[0]
        assert server.execute(f"SELECT COUNT(*) FROM bag.t WHERE a IN ({ROWS - 100}, {ROWS - 50})")[0][0] == 0
        assert server.execute(f"SELECT b, s FROM bag.t WHERE a = {ROWS - 99}") == [(0, "changed")]

        # The fix it names: an index on the target is used, the deletes are fast.
        server.execute("ALTER TABLE bag.t ADD INDEX by_a (a)")
        fresh = ColumnStoreTarget(cfg)
        fresh.connect()
        try:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger=columnstore.__name__):
                _delete_and_update(fresh, ROWS - 10)
            assert not [r for r in caplog.records if "has no primary key" in r.getMessage()]
        finally:
            fresh.close()
        assert server.execute("SELECT COUNT(*) FROM bag.t")[0][0] == ROWS + 1 - 3
    finally:
        target.close()


def _rows_scanned(server: MariaDBServer) -> int:
    return int(server.execute("SHOW GLOBAL STATUS LIKE 'Handler_read_rnd_next'")[0][1])


def test_a_flush_of_many_keyless_deletes_scans_the_table_twice_not_once_a_row(server: MariaDBServer) -> None:
    """300 updated or deleted rows of a 100,000-row keyless table in one
    flush: one scan each would read ~15M rows; by batches, two scans a
    batch, and none once the target table has an index.  Rows with copies
    in the target (and rows with NULL) are still removed one copy at a
    time: the table ends exactly as the source."""
    n = 100_000
    schema = TableSchema("bag2", "t", SCHEMA.columns, ())
    cfg = Config(target=TargetConfig(kind="columnstore", url=server.url, options=(ColumnStoreConfig("InnoDB"),)))
    target = ColumnStoreTarget(cfg)
    target.connect()
    try:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(0, 0, None))]))
        server.execute(f"INSERT INTO bag2.t SELECT seq, seq % 7, CONCAT('row ', seq) FROM bag2.seq_1_to_{n}")
        deleted, updated = range(1, n, 500), range(250, n, 1000)  # 200 and 100 rows all over the table
        changes = [contract.change(Op.DELETE, schema, before=(k, k % 7, f"row {k}")) for k in deleted]
        changes += [contract.change(Op.UPDATE, schema, before=(k, k % 7, f"row {k}"), after=(k, k % 7, "changed"))
                    for k in updated]
        before = _rows_scanned(server)
        target.apply(contract.flush(changes))
        scanned = _rows_scanned(server) - before
        assert scanned < 5 * n, f"{scanned:,} rows read for 300 keyless deletes of a {n:,}-row table"
        assert server.execute("SELECT COUNT(*) FROM bag2.t")[0][0] == n + 1 - len(deleted)
        assert server.execute("SELECT COUNT(*) FROM bag2.t WHERE s = 'changed'")[0][0] == len(updated)
        assert server.execute(f"SELECT COUNT(*) FROM bag2.t WHERE a IN ({', '.join(map(str, deleted))})")[0][0] == 0

        # Copies: two of row 7, one of them deleted, in a batch with other
        # rows; a NULL row deleted beside them.
        server.execute("INSERT INTO bag2.t VALUES (7, 0, 'row 7')")
        target.apply(contract.flush([contract.change(Op.DELETE, schema, before=(7, 0, "row 7")),
                                     contract.change(Op.DELETE, schema, before=(8, 1, "row 8")),
                                     contract.change(Op.DELETE, schema, before=(0, 0, None))]))
        assert server.execute("SELECT a, COUNT(*) FROM bag2.t WHERE a IN (0, 7, 8) GROUP BY a") == [(7, 1)]

        # With an index on the target (the fix the warning names), the
        # batch's two statements find their rows through it: no scan.
        server.execute("ALTER TABLE bag2.t ADD INDEX by_a (a)")
        more = range(20, n, 500)
        before = _rows_scanned(server)
        target.apply(contract.flush([contract.change(Op.DELETE, schema, before=(k, k % 7, f"row {k}")) for k in more]))
        scanned = _rows_scanned(server) - before
        assert scanned < n // 10, f"{scanned:,} rows read for {len(more)} keyless deletes through an index"
        assert server.execute(f"SELECT COUNT(*) FROM bag2.t WHERE a IN ({', '.join(map(str, more))})")[0][0] == 0
    finally:
        target.close()


def test_a_new_keyless_table_gets_the_source_indexes_it_can_hold(server: MariaDBServer,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A keyless table's schema carrying the source's indexes (the snapshot
    reads them): the target table is created with those an InnoDB table
    can hold on whole columns, each refused one named in a warning, and a
    flush's deletes then find their rows through the index, not by scans."""
    n = 100_000
    cols = SCHEMA.columns + (ColumnDef("doc", "text"), ColumnDef("wide", "varchar(1000)"))
    schema = TableSchema("bag3", "t", cols, (), (("a",), ("doc",), ("wide", "s"), ("b", "s")))
    cfg = Config(target=TargetConfig(kind="columnstore", url=server.url, options=(ColumnStoreConfig("InnoDB"),)))
    target = ColumnStoreTarget(cfg)
    target.connect()
    try:
        with caplog.at_level(logging.WARNING, logger=columnstore.__name__):
            target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(0, 0, "row 0", "d", "w"))]))
        made = server.execute("SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM "
                              "information_schema.STATISTICS WHERE TABLE_SCHEMA = 'bag3' GROUP BY 1 ORDER BY 1")
        assert made == [("cynomys_a", "a"), ("cynomys_b_s", "b,s")], made
        refused = sorted(r.getMessage() for r in caplog.records if "is not made" in r.getMessage())
        assert len(refused) == 2 and "index (doc)" in refused[0] and "index (wide, s)" in refused[1], refused
        assert "too long" in refused[1].lower(), refused  # the server's own reason

        server.execute(f"INSERT INTO bag3.t SELECT seq, seq % 7, CONCAT('row ', seq), 'd', 'w' "
                       f"FROM bag3.seq_1_to_{n}")
        gone = range(3, n, 500)
        before = _rows_scanned(server)
        target.apply(contract.flush([contract.change(Op.DELETE, schema, before=(k, k % 7, f"row {k}", "d", "w"))
                                     for k in gone]))
        scanned = _rows_scanned(server) - before
        assert scanned < n // 10, f"{scanned:,} rows read for {len(gone)} keyless deletes through the mirrored index"
        assert server.execute("SELECT COUNT(*) FROM bag3.t")[0][0] == n + 1 - len(gone)
    finally:
        target.close()
