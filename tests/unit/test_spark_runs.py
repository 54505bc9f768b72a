"""The Spark target's column-wise conversion of InsertRuns
(targets/spark/runs.py) against the reference (row images through
``types.encode_column``): the same typed Arrow arrays, value for value, and
the same refusals."""
from __future__ import annotations

import datetime
import decimal
import random
from typing import Any, Callable

import pytest

from cynomys.applier.targets.spark import types as st
from cynomys.applier.targets.spark.runs import RULES, run_columns, run_images
from cynomys.core import compiled
from cynomys.core.columnar import InsertRun
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema, Value
from cynomys.schemas import codec

pytestmark = pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")

UTC = datetime.timezone.utc
D = decimal.Decimal
#: (column type, value maker): every Spark mapping family, and the kinds
#: that must take the value-by-value way (big unsigned, wide DECIMAL).
COLUMNS: tuple[tuple[str, Callable[[random.Random], Value]], ...] = (
    ("int", lambda r: r.randint(1, 10**9)),
    ("tinyint", lambda r: r.choice([-128, 0, 127])),
    ("smallint unsigned", lambda r: r.choice([0, 65535])),
    ("int unsigned", lambda r: r.choice([0, 2**32 - 1])),
    ("bigint", lambda r: r.choice([-2**63, 2**63 - 1, 0])),
    ("bigint unsigned", lambda r: r.choice([0, 2**63 - 1, 2**64 - 1])),
    ("bigint unsigned", lambda r: r.choice([0, 2**63 - 1])),
    ("year", lambda r: r.choice([0, 1901, 2155])),
    ("bit(8)", lambda r: r.randint(0, 255)),
    ("bit(64)", lambda r: r.choice([0, 2**64 - 1])),
    ("decimal(15,2)", lambda r: r.choice([D("0.00"), D("-1.50"), D("9999999999999.99"), D("0E-2"), D(r.randint(0, 10**6)) / 100])),
    ("decimal(38,10)", lambda r: r.choice([D("0E-10"), D("-12.5000000000"), D("1E-10"), D("9" * 28 + "." + "9" * 10)])),
    ("decimal(65,30)", lambda r: r.choice([D("1.5"), D("9" * 35 + "." + "9" * 30)])),
    ("float", lambda r: r.choice([0.0, -0.0, 1.5, 3.4028234663852886e38, 0.10000000149011612])),
    ("double", lambda r: r.choice([0.0, 1e16, 1.5e-5, 3.14, -2.5e300])),
    ("varchar(20)", lambda r: r.choice(["", "a\tb", "caf\u00e9 \U0001F600", "plain"])),
    ("json", lambda r: r.choice(['{"a": 1}', "[]"])),
    ("varbinary(8)", lambda r: r.choice([b"", b"\x00\xff", bytes(r.getrandbits(8) for _ in range(8))])),
    ("date", lambda r: r.choice([datetime.date(1000, 1, 1), datetime.date(9999, 12, 31), datetime.date(2024, 2, 29)])),
    ("datetime(6)", lambda r: datetime.datetime(r.randint(1000, 9999), 12, 31, 23, 59, 59, r.choice([0, 999999]))),
    ("timestamp(6)", lambda r: datetime.datetime(2038, 1, 19, 3, 14, 7, r.choice([0, 999999]), tzinfo=UTC)),
    ("time(6)", lambda r: datetime.timedelta(microseconds=r.choice([-3020399000000, 0, 1, 3020399000000]))),
    ("date", lambda r: None),  # all NULL: travels as a LongColumn
)
SCHEMA = TableSchema("d", "t", (ColumnDef("id", "int"),) + tuple(
    ColumnDef(f"c{i}", t) for i, (t, _) in enumerate(COLUMNS)), ("id",))
MAPPINGS = [st.mapping(c) for c in SCHEMA.columns]


@pytest.fixture(autouse=True)
def compiled_path() -> object:
    was = compiled.ext is not None
    compiled.use_compiled(True)
    yield
    compiled.use_compiled(was)


def _runs(schema: TableSchema, rows: list[tuple[Value, ...]], per_txn: int = 50) -> list[InsertRun]:
    changes = [Change(Op.INSERT, "d", "t", str(i // per_txn), Position("b.000001", 100 + i // per_txn), 1, schema,
                      None, row) for i, row in enumerate(rows)]
    batch = codec.decode_columnar(codec.encode(Batch("p", tuple(changes), Position("b.000001", 10**6))))
    runs = [c for c in batch.changes if type(c) is InsertRun]
    assert len(runs) == len(batch.changes), "the envelope left the column-wise path"
    return runs


def _reference(schema: TableSchema, runs: list[InsertRun]) -> list[Any]:
    images = run_images(runs)
    return [st.encode_column(st.mapping(c), [r[i] for r in images])[0] for i, c in enumerate(schema.columns)]


def test_runs_give_the_reference_arrays_for_every_mapping() -> None:
    rng = random.Random(7)
    rows: list[tuple[Value, ...]] = [(i,) + tuple(make(rng) if rng.random() > 0.1 else None for _, make in COLUMNS)
                                     for i in range(400)]
    runs = _runs(SCHEMA, rows)
    # Fold-style exclusions: rows a later change replaced are left out.
    runs[1] = InsertRun(**{**runs[1].__dict__, "excluded": frozenset({0, 3, 7})})
    got, raws = run_columns(SCHEMA, MAPPINGS, runs)
    want = _reference(SCHEMA, runs)
    assert raws == {}
    for col, g, w in zip(SCHEMA.columns, got, want):
        assert g.type == w.type, col
        assert g.combine_chunks().equals(w), f"{col}: {g.to_pylist()[:5]} != {w.to_pylist()[:5]}"
    assert len(got[0]) == 400 - 3


def test_most_columns_take_the_vectorized_way() -> None:
    # Not the point of the conversion if everything went value by value.
    row: tuple[Value, ...] = (1,) + tuple(make(random.Random(1)) for _, make in COLUMNS)
    kinds = {(k, m.family) for run in _runs(SCHEMA, [row]) if run.block is not None
             for k, m in zip(run.block.kinds, MAPPINGS)}
    assert len(kinds & RULES.keys()) >= 10, kinds


@pytest.mark.parametrize("type_, good, bad, says", [
    ("tinyint", 127, 128, "outside the type's range"),
    ("int unsigned", 0, -1, "outside the type's range"),
    ("float", 1.5, 0.1, "not a single-precision value"),
    ("decimal(5,2)", D("1.25"), D("1.234"), "more than 2 fraction digits"),
    ("decimal(5,2)", D("999.99"), D("1000.00"), "more than 3 integer digits"),
])
def test_a_value_the_column_refuses_is_named_as_the_reference_names_it(
        type_: str, good: Value, bad: Value, says: str) -> None:
    schema = TableSchema("d", "t", (ColumnDef("id", "int"), ColumnDef("v", type_)), ("id",))
    mappings = [st.mapping(c) for c in schema.columns]
    runs = _runs(schema, [(1, good), (2, good), (3, bad), (4, good)], per_txn=2)
    with pytest.raises(st.ValueRejected) as ref:
        _reference(schema, runs)
    with pytest.raises(st.ValueRejected) as got:
        run_columns(schema, mappings, runs)
    assert (got.value.column, got.value.row) == (1, 2)
    assert str(got.value) == str(ref.value) and says in str(got.value)
