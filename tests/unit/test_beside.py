"""Which snapshot rows of a flush load beside it (columnstore/beside.py ``split``).

Pure logic: the runs are the compiled decoder's InsertRuns, the choice is
checked against what the flush's own transaction still does to the table.
"""
from __future__ import annotations

import dataclasses

import pytest

from cynomys.applier.targets.base import TableFlush, build_flush
from cynomys.applier.targets.columnstore import beside
from cynomys.core import compiled
from cynomys.core.columnar import InsertRun
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.schemas import codec

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the compiled decoder makes the runs")

SCHEMA = TableSchema("d", "t", (ColumnDef("k", "bigint"), ColumnDef("n", "int"), ColumnDef("v", "varchar(20)")),
                     ("k", "n"))
STATE = AppliedState("p", 1, Position("f", 9))


def change(op: Op, row: tuple[object, ...], schema: TableSchema = SCHEMA, before: tuple[object, ...] | None = None) -> Change:
    return Change(op, schema.database, schema.table, "tid", Position("f", 4), 0, schema, before,
                  None if op is Op.DELETE else row)


def read_run(keys: range, schema: TableSchema = SCHEMA) -> InsertRun:
    """One READ run of ``keys`` (a chunk of a snapshot), as the applier decodes it."""
    batch = Batch("p", tuple(change(Op.READ, (k, 1, f"r{k}"), schema) for k in keys), Position("f", 9))
    (run,) = codec.decode_columnar(codec.encode(batch)).changes
    assert isinstance(run, InsertRun) and run.op is Op.READ
    return run


def table(changes: list[Change]) -> TableFlush:
    (tf,) = build_flush(changes, STATE, columnar=True).tables
    return tf


def always(tf: TableFlush) -> bool:
    return True


@pytest.fixture(autouse=True)
def _compiled(compiled_path: None) -> None:
    """The compiled path selected for every test here."""


def test_a_flush_of_snapshot_rows_gives_the_side_a_prefix_of_about_half() -> None:
    runs = [read_run(range(i * 100, i * 100 + 100)) for i in range(6)]
    got = beside.split([table(list(runs))], always, 200)
    assert [r for tf in got.side for r in tf.runs] == runs[:3]
    assert [r for tf in got.kept for r in tf.runs] == runs[3:]
    assert got.side_rows == 300
    odd = beside.split([table(runs[:3])], always, 200)  # 150 rows each: the second run is cut
    assert [r.count for tf in odd.side for r in tf.runs] == [100, 50]
    assert [r.count for tf in odd.kept for r in tf.runs] == [50, 100]


def test_below_the_threshold_or_off_nothing_goes_beside() -> None:
    tf = table([read_run(range(0, 100)), read_run(range(100, 200))])
    assert beside.split([tf], always, 201).side == []
    assert beside.split([tf], always, 0).side == []
    assert beside.split([tf], always, 200).side != []


def test_a_key_the_flush_also_changes_ends_the_prefix() -> None:
    """The second run holds key 150, which the flush also deletes: it and
    every READ run after it stay in the flush (a later run of a key loads
    after an earlier one), the first goes beside."""
    runs = [read_run(range(i * 100, i * 100 + 100)) for i in range(4)]
    delete = change(Op.DELETE, (150, 7, "x"), before=(150, 7, "x"))
    got = beside.split([table([*runs[:1], delete, *runs[1:]])], always, 100)
    assert [r for tf in got.side for r in tf.runs] == runs[:1]
    (kept,) = got.kept
    assert kept.runs == runs[1:] and kept.delete_keys == [(150, 7)]


def test_the_first_key_column_is_compared_alone_conservatively() -> None:
    """(150, 7) is not a key of the run, but 150 is its first column's value:
    the run stays (equal on the server implies equal first columns)."""
    runs = [read_run(range(100, 200)), read_run(range(200, 300))]
    insert = change(Op.INSERT, (150, 7, "new"))
    got = beside.split([table([insert, *runs])], always, 100)
    assert got.side == []


def test_inserted_runs_of_the_table_count_as_its_changes() -> None:
    batch = Batch("p", tuple(change(Op.INSERT, (k, 2, "i")) for k in range(5, 8)), Position("f", 9))
    (ins,) = codec.decode_columnar(codec.encode(batch)).changes
    assert isinstance(ins, InsertRun) and ins.op is Op.INSERT
    clash, free = read_run(range(0, 100)), read_run(range(100, 200))
    assert beside.split([table([ins, clash, free])], always, 100).side == []
    got = beside.split([table([ins, free, clash])], always, 100)
    side_keys = {k for tf in got.side for r in tf.runs for k, _n in zip(*r.key_columns())}
    assert side_keys == set(range(100, 200)) | {0}, "the rest of the half: keys 0.. up to the first clash"
    assert ins in got.kept[0].runs


def test_a_run_is_cut_where_the_half_ends() -> None:
    """A flush is often one snapshot chunk: it is shared between the two
    connections, its excluded rows kept with their half."""
    run = dataclasses.replace(read_run(range(0, 1000)), excluded=frozenset({10, 700}))
    got = beside.split([table([run])], always, 100)
    (side,), (kept,) = got.side, got.kept
    (head,), (tail,) = side.runs, kept.runs
    assert (head.start, head.count, head.excluded) == (run.start, 499, frozenset({10}))
    assert (tail.start, tail.count, tail.excluded) == (run.start + 499, 501, frozenset({700 - 499}))
    assert head.images() + tail.images() == run.images()
    assert beside.cut(run, 1000) == (run, None)


def test_excluded_rows_are_not_conflicts() -> None:
    """A READ row superseded later in the buffer is excluded from its run:
    the later change is the flush's, the run loads without that row."""
    run = read_run(range(0, 100))
    superseded = dataclasses.replace(run, excluded=frozenset({50}))
    update = change(Op.UPDATE, (50, 1, "later"), before=(50, 1, "r50"))
    got = beside.split([table([superseded, update, read_run(range(200, 300)), read_run(range(300, 400))])], always, 100)
    assert [r for tf in got.side for r in tf.runs][:1] == [superseded]
    unexcluded = dataclasses.replace(run, excluded=frozenset())
    assert beside.split([table([unexcluded, update, read_run(range(200, 300))])], always, 100).side == []


@pytest.mark.parametrize("first", ["varchar(10)", "decimal(10,2)", "datetime"])
def test_only_integer_first_key_columns_are_compared(first: str) -> None:
    schema = TableSchema("d", "s", (ColumnDef("k", first), ColumnDef("n", "int"), ColumnDef("v", "varchar(20)")),
                         ("k", "n"))
    tf = TableFlush(schema, runs=[read_run(range(0, 100)), read_run(range(100, 200))])
    assert beside.split([tf], always, 100).side == []


def test_a_table_whose_target_key_differs_stays_whole() -> None:
    tf = table([read_run(range(0, 100)), read_run(range(100, 200))])
    assert beside.split([tf], lambda tf: False, 100).side == []


def test_other_tables_fill_the_side_in_flush_order() -> None:
    other = dataclasses.replace(SCHEMA, table="u")
    a = table([read_run(range(0, 100))])
    b = table([read_run(range(0, 100), other), read_run(range(100, 200), other)])
    got = beside.split([a, b], always, 100)
    assert [(tf.schema.table, tf.rows) for tf in got.side] == [("t", 100), ("u", 50)]
    assert [(tf.schema.table, tf.rows) for tf in got.kept] == [("t", 0), ("u", 150)]
