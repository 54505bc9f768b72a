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
