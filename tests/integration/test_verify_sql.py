"""`cynomys verify` on the ColumnStore/MariaDB target: the checksum the
server computes in SQL equals the producer's Python checksum of the same
rows, for every type it renders in SQL (both type profiles: InnoDB, and
ColumnStore's mapping on InnoDB tables)."""
from __future__ import annotations

from typing import Iterator

import pytest

from cynomys.applier.targets.columnstore import verify as cs_verify
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core.model import ColumnDef, Op, TableSchema
from cynomys.snapshot.checksum import KeyRange, RowHasher
from tests.integration import target_contract as contract
from tests.integration.test_columnstore_target import EmulatedColumnStore, columnstore_rows, make_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[MariaDBServer]:
    srv = MariaDBServer(server_id=8).start()
    yield srv
    srv.destroy()


@pytest.mark.parametrize("cls", [ColumnStoreTarget, EmulatedColumnStore], ids=["innodb", "columnstore-profile"])
def test_sql_checksum_equals_python_checksum(server: MariaDBServer, cls: type[ColumnStoreTarget]) -> None:
    db = f"vsql_{cls.__name__.lower()}"
    keep = [i for i, (_, t) in enumerate(contract.ALL_TYPES) if t not in ("float", "double")]
    schema = TableSchema(db, "t", tuple(ColumnDef(*contract.ALL_TYPES[i]) for i in keep), ("id",))
    source = contract.ALL_TYPES_ROWS if cls is ColumnStoreTarget else columnstore_rows()
    rows = [tuple(r[i] for i in keep) for r in source]
    target = cls(make_config(server.url))
    target.connect()
    try:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in rows]))
        hasher = RowHasher(schema.columns)
        assert cs_verify.checksum_sql(schema) is not None
        for i, r in enumerate(rows):  # one row at a time: a mismatch names the row
            got = cs_verify.checksum_range(target, schema, KeyRange((r[0] - 1,), (r[0],)))
            assert got == hasher.rows([r]), f"row {i}: {r!r}"
        whole = cs_verify.checksum_range(target, schema, KeyRange())
        assert whole == hasher.rows(rows) == target.checksum_range(schema, KeyRange())
        # a FLOAT column has no exact SQL text: the range is read back instead
        with_float = TableSchema(db, "t", schema.columns + (ColumnDef("f", "float"),), ("id",))
        assert cs_verify.checksum_sql(with_float) is None
    finally:
        target.close()
