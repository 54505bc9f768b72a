"""Which rows of a part go beside in an XA transaction (columnstore/sidexa.py):
pure logic on decoded runs; the XA transactions themselves run against a
real MariaDB in tests/integration/test_side_xa.py."""
from __future__ import annotations

import pytest

from cynomys.applier.targets.base import TableFlush, build_flush
from cynomys.applier.targets.columnstore import sidexa
from cynomys.core import compiled
from cynomys.core.columnar import InsertRun
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.schemas import codec

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the compiled decoder makes the runs")

BAG = TableSchema("d", "bag", (ColumnDef("n", "int"), ColumnDef("v", "varchar(20)")), ())
KEYED = TableSchema("d", "t", (ColumnDef("k", "bigint"), ColumnDef("v", "varchar(20)")), ("k",))
STATE = AppliedState("p", 1, Position("f", 9))


def change(op: Op, row: tuple[object, ...], schema: TableSchema = BAG) -> Change:
    return Change(op, schema.database, schema.table, "tid", Position("f", 4), 0, schema,
                  row if op is Op.DELETE else None, None if op is Op.DELETE else row)


def runs(schema: TableSchema, n: int, op: Op = Op.READ) -> list[Change]:
    batch = Batch("p", tuple(change(op, (i, f"r{i}"), schema) for i in range(n)), Position("f", 9))
    out = list(codec.decode_columnar(codec.encode(batch)).changes)
    assert all(isinstance(r, InsertRun) for r in out)
    return out


def tables(changes: list[Change]) -> list[TableFlush]:
    return build_flush(changes, STATE, columnar=True, keyless_runs=True).tables


@pytest.fixture(autouse=True)
def _compiled(compiled_path: None) -> None:
    """The compiled path selected for every test here."""


def test_a_keyless_read_gives_the_side_about_half() -> None:
    (tf,) = tables(runs(BAG, 300))
    got = sidexa.split([tf], 100)
    assert got.side_rows == 150 and sum(t.rows for t in got.kept) == 150
    assert [t.schema for t in got.side] == [BAG] and all(r.op is Op.READ for t in got.side for r in t.runs)


def test_below_the_threshold_or_off_nothing_goes_beside() -> None:
    tfs = tables(runs(BAG, 300))
    assert sidexa.split(tfs, 301).side == [] and sidexa.split(tfs, 0).side == []


def test_keyed_tables_and_keyless_tables_with_other_changes_stay() -> None:
    keyed = tables(runs(KEYED, 300))
    assert sidexa.split(keyed, 10).side == []  # beside.py's (REPLACE by key), not XA
    mixed = tables([*runs(BAG, 300), change(Op.DELETE, (1, "r1"))])
    assert not sidexa.loads_beside(mixed[0]) and sidexa.split(mixed, 10).side == []
    inserted = tables(runs(BAG, 300, Op.INSERT))  # a source transaction's rows, not a read's
    assert sidexa.split(inserted, 10).side == []


def test_the_half_is_of_the_whole_part() -> None:
    """Other tables' rows count in the half: the side gets about half of
    what the part loads, not half of the keyless read alone."""
    tfs = tables([*runs(KEYED, 200), *runs(BAG, 200)])
    got = sidexa.split(tfs, 10)
    assert got.side_rows == 200 and [t.schema for t in got.side] == [BAG]
    assert sorted(t.schema.table for t in got.kept) == ["t"]


def test_xids_name_their_producer_and_fit_the_server() -> None:
    a, b = sidexa.new_xid("p1"), sidexa.new_xid("p1")
    assert a != b and a.startswith(sidexa.PREFIX + sidexa.producer_tag("p1") + "-")
    assert sidexa.producer_tag("p1") != sidexa.producer_tag("p2") and len(a) <= 64
