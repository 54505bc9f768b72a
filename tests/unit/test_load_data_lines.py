"""The compiled LOAD DATA writer (_speedups.load_data_lines) against its
twins: pyarrow's kernels (loaddata._lines) and the reference encoder of
row images (columnstore/types.encode_field), byte for byte."""
from __future__ import annotations

import datetime
import decimal
import random
from typing import Any, Callable, Sequence

import pytest

from cynomys.applier.targets.arrow import buffer_of, parts
from cynomys.applier.targets.columnstore import loaddata
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core import compiled
from cynomys.core.columnar import InsertRun
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema, Value
from cynomys.schemas import codec

pytestmark = pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")

UTC = datetime.timezone.utc
#: Every kind the compiled writer takes (no DOUBLE, no TIME: pyarrow's).
COLS = (("id", "bigint"), ("neg", "int"), ("big", "bigint unsigned"), ("yr", "year"), ("bt", "bit(8)"),
        ("d", "decimal(20,10)"), ("s", "varchar(40)"), ("b", "varbinary(8)"), ("dt", "date"),
        ("dtm", "datetime(6)"), ("ts", "timestamp(6)"), ("c", "char(3)"))
SCHEMA = TableSchema("d", "t", tuple(ColumnDef(n, t) for n, t in COLS), ("id",))


def _value(rng: random.Random, col: int, key: int) -> Value:
    if col == 0:
        return key
    if rng.random() < 0.15:
        return None
    makers: list[Callable[[], Value]] = [
        lambda: key,
        lambda: rng.choice([-2**31, -1, 0, 7, 2**31 - 1, rng.randint(-10**6, 10**6)]),
        lambda: rng.choice([0, 2**64 - 1, 2**63, rng.randint(0, 2**63 - 1)]),
        lambda: rng.choice([0, 1901, 2155, 5, 99]),
        lambda: rng.randint(0, 255),
        lambda: rng.choice([decimal.Decimal("-12.5000000000"), decimal.Decimal("0.0000000010"), decimal.Decimal("-0.0000000000"),
                            decimal.Decimal(rng.randint(-10**9, 10**9)) / 1000]),
        lambda: rng.choice(["", "a\tb", "c\nd", "back\\slash", "caf\u00e9 \U0001F600", "\\N", "plain", "\r\x00"]),
        lambda: rng.choice([b"", b"\x00\xff", b"\t\n\\", bytes(rng.getrandbits(8) for _ in range(8))]),
        lambda: rng.choice([datetime.date(1, 1, 1), datetime.date(9999, 12, 31), datetime.date(2024, 2, 29),
                            datetime.date(1969, 12, 31), datetime.date(1970, 1, 1),
                            datetime.date(1, 1, 1) + datetime.timedelta(days=rng.randint(0, 3652058))]),
        lambda: rng.choice([datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
                            datetime.datetime(1969, 12, 31, 23, 59, 59, 999999),
                            datetime.datetime(rng.randint(1, 9999), rng.randint(1, 12), rng.randint(1, 28),
                                              rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                                              rng.choice([0, 1, 999999, rng.randint(0, 999999)]))]),
        lambda: datetime.datetime(rng.choice([1970, 2000, 2038]), 1, 19, 3, 14, 7, rng.choice([0, 999999]), tzinfo=UTC),
        lambda: rng.choice(["abc", "", "\t"]),
    ]
    return makers[col]()


def _runs(seed: int, envelopes: int = 12) -> list[InsertRun]:
    rng = random.Random(seed)
    runs: list[InsertRun] = []
    key = 0
    for e in range(envelopes):
        changes = []
        for _ in range(rng.randint(1, 50)):
            key += 1
            row = tuple(_value(rng, i, key) for i in range(len(COLS)))
            changes.append(Change(Op.INSERT, "d", "t", str(e), Position("b.000001", e * 10 + 4), 1, SCHEMA, None, row))
        batch = codec.decode_columnar(codec.encode(Batch("p", tuple(changes), Position("b.000001", e * 10 + 5))))
        runs.extend(c for c in batch.changes if type(c) is InsertRun)
    return runs


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("piece", [1, 7, 8192])
def test_every_piece_is_written_as_pyarrow_and_the_reference_write_it(compiled_path: object, seed: int,
                                                                      piece: int) -> None:
    runs = _runs(seed)
    assert runs and all(r.block is not None for r in runs)
    before = compiled.fallbacks["load_data"]
    pieces = list(parts(runs, piece))
    for kinds, arrays in pieces:  # slices of blocks (array offsets) and concatenations
        got = loaddata._compiled_lines(SCHEMA, kinds, arrays)
        assert got is not None
        assert got == bytes(buffer_of(loaddata._lines(SCHEMA, kinds, arrays)))
    assert compiled.fallbacks["load_data"] == before
    rows = [row for run in runs for row in run.images()]
    assert ColumnStoreTarget.load_data_bytes(SCHEMA, [], runs) == ColumnStoreTarget.load_data_bytes(SCHEMA, rows)


def _one(kind: str, col: ColumnDef, values: Sequence[Any]) -> tuple[bytes | None, bytes]:
    """The compiled and the pyarrow text of one column of wire values."""
    import array

    import pyarrow as pa

    from cynomys.applier.targets.arrow import text_array

    if kind == "DecimalColumn":
        arr = text_array(list(values))
    else:
        typ, code = (pa.int32(), "i") if kind == "DateColumn" else (pa.int64(), "q")
        arr = pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(array.array(code, values))])
    schema = TableSchema("d", "t", (col,), ())
    return loaddata._compiled_lines(schema, (kind,), [arr]), bytes(buffer_of(loaddata._lines(schema, (kind,), [arr])))


def test_decimal_texts_in_exponent_form_are_written_plain(compiled_path: object) -> None:
    # str(Decimal) writes small values of a column's scale as '1.0E-9' or
    # '0E-10'; LOAD DATA gets format(Decimal, 'f'), as the reference writes.
    rng = random.Random(11)
    texts = ["0E-10", "-0E-10", "1.0E-9", "1E-30", "-1.23E-7", "9.99999999E-8", "12.5", "-0.000001"]
    for _ in range(20000):
        i = rng.choice([0, rng.randint(-9, 9), rng.randint(-10**40, 10**40), rng.randint(-10**65, 10**65)])
        texts.append(str(decimal.Decimal(f"{i}E-{rng.randint(0, 30)}")))
    assert sum("E" in t for t in texts) > 1000
    before = compiled.fallbacks["load_data"]
    got, want = _one("DecimalColumn", ColumnDef("d", "decimal(65,30)"), texts)
    assert got == want == b"".join(format(decimal.Decimal(t), "f").encode() + b"\n" for t in texts)
    assert compiled.fallbacks["load_data"] == before


def test_values_it_leaves_to_pyarrow_fall_back_and_are_counted(compiled_path: object) -> None:
    before = compiled.fallbacks["load_data"]
    # A DECIMAL text with a positive exponent (not from a DECIMAL column).
    got, want = _one("DecimalColumn", ColumnDef("d", "decimal(20,10)"), ["1.5", "1E+3"])
    assert got is None and want == b"1.5\n1000\n"
    # A date past year 9999.
    got, want = _one("DateColumn", ColumnDef("dt", "date"), [0, 2932897])
    assert got is None and want.startswith(b"1970-01-01\n")
    # A negative YEAR (never met; pyarrow pads the sign).
    got, want = _one("LongColumn", ColumnDef("y", "year"), [5, -5])
    assert got is None and want == b"0005\n00-5\n"
    assert compiled.fallbacks["load_data"] == before + 3
    # Kinds it does not write at all go to pyarrow without counting.
    schema = TableSchema("d", "t", (ColumnDef("f", "double"),), ())
    import pyarrow as pa

    assert loaddata._compiled_lines(schema, ("DoubleColumn",), [pa.array([1.5], pa.float64())]) is None
    assert compiled.fallbacks["load_data"] == before + 3


def test_the_pure_path_writes_with_pyarrow() -> None:
    was = compiled.ext is not None
    compiled.use_compiled(False)
    try:
        kinds, arrays = next(iter(parts(_runs_compiled(1), None)))
        assert loaddata._compiled_lines(SCHEMA, kinds, arrays) is None
    finally:
        compiled.use_compiled(was)


def _runs_compiled(seed: int) -> list[InsertRun]:
    was = compiled.ext is not None
    compiled.use_compiled(True)
    try:
        return _runs(seed, 2)
    finally:
        compiled.use_compiled(was)


@pytest.mark.parametrize("bad", [
    [(9, 0, None, b"", None)],                                      # no such mode
    [(0, 0, None, b"\x00" * 8, None)],                              # data shorter than the rows
    [(2, 0, None, b"abc", b"\x00\x00\x00\x00\x05\x00\x00\x00")],  # offsets past the data
    [(2, 0, None, b"abc", None)],                                   # text without offsets
    [(0, 0, b"", b"\x00" * 16, None)],                              # validity shorter than the rows
])
def test_buffers_that_do_not_hold_the_rows_are_refused(compiled_path: object, bad: list[tuple[object, ...]]) -> None:
    assert compiled.ext is not None
    with pytest.raises(ValueError):
        compiled.ext.load_data_lines(2, bad)


def _odd_value(rng: random.Random) -> Value:
    """Values the compiled row writer hands to the column's encoder."""
    from cynomys.core.model import RawTemporal

    return rng.choice([True, False, 1.5, -0.0, 1e300, float("inf"), 2**64 + 1, -2**63 - 1, -2**63,
                       RawTemporal("0000-00-00"), RawTemporal("2020-00-10 00:00:00"),
                       datetime.timedelta(hours=-838, minutes=-59), datetime.timedelta(microseconds=1),
                       datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
                       datetime.datetime(1999, 12, 31, 23, 0, tzinfo=UTC), decimal.Decimal("1E+5"),
                       decimal.Decimal("-0E-10"), decimal.Decimal("NaN")])


@pytest.mark.parametrize("seed", range(4))
def test_row_images_are_written_as_the_reference_writes_them(compiled_path: object, seed: int) -> None:
    """_speedups.load_data_rows against types.load_data_rows_pure (the loop
    value by value): every kind of value, in generic columns and a YEAR's,
    rows shorter and longer than the columns (zip's rule), byte for byte."""
    from cynomys.applier.targets.columnstore.types import (
        FIELD_ENCODERS,
        encode_field,
        load_data_rows,
        load_data_rows_pure,
    )

    rng = random.Random(seed)
    encoders = [FIELD_ENCODERS.get(ColumnDef(n, t).base_type, encode_field) for n, t in COLS]
    assert FIELD_ENCODERS["year"] in encoders
    rows = []
    for key in range(2000):
        row = [(_odd_value(rng) if rng.random() < 0.1 and i != 3 else _value(rng, i, key)) for i in range(len(COLS))]
        cut = rng.random()
        rows.append(tuple(row[:rng.randint(0, len(row))] if cut < 0.02 else row + [1] if cut < 0.04 else row))
    got = load_data_rows(rows, encoders)
    assert got == load_data_rows_pure(rows, encoders)
    assert got.count(b"\n") == len(rows)
    assert load_data_rows([], encoders) == b""


def test_a_row_value_its_encoder_refuses_raises_as_the_reference(compiled_path: object) -> None:
    from cynomys.applier.targets.columnstore.types import encode_field, load_data_rows, load_data_rows_pure

    for bad in ("lone \ud800 surrogate", object()):
        errors = []
        for write in (load_data_rows, load_data_rows_pure):
            with pytest.raises(Exception) as exc:
                write([(1, bad)], [encode_field, encode_field])
            errors.append(type(exc.value))
        assert errors[0] is errors[1]
