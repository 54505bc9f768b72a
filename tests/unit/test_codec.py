"""Avro codec: every value of the Python domain survives a round trip."""
from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path

import pytest

from cynomys.core.errors import SchemaError
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, RawTemporal, TableSchema
from cynomys.schemas import codec

VALUES = [
    None, 0, -1, 127, -9223372036854775808, 9223372036854775807, 18446744073709551615,
    decimal.Decimal("-12345.000000000000000000000000000001"), decimal.Decimal("1.50"), decimal.Decimal("0E-30"),
    3.141590118408203, 1e308, -0.0,
    "", "h😀", "a\x00b", "x" * 70000,
    b"", b"A\x00\x00\x00", bytes(range(256)),
    dt.date(1000, 1, 1), dt.date(9999, 12, 31),
    dt.datetime(2021, 3, 4, 5, 6, 7, 123456), dt.datetime(1, 1, 1),
    dt.datetime(2038, 1, 19, 3, 14, 8, 1, tzinfo=dt.timezone.utc),
    dt.timedelta(hours=-838, minutes=-59, seconds=-59), dt.timedelta(hours=838, microseconds=999999),
    RawTemporal("0000-00-00"), RawTemporal("2020-00-10 00:00:00.000000"),
]


def _batch(values: list) -> Batch:
    cols = tuple(ColumnDef(f"c{i}", "text") for i in range(len(values)))
    schema = TableSchema("d", "t", cols, ("c1",))
    c = Change(Op.UPDATE, "d", "t", "0-1-5", Position("mysql-bin.000002", 400, "0-1-5"), 1700000000,
               schema, tuple(values), tuple(reversed(values)))
    ddl = Change(Op.DDL, "d", "", "0-1-6", Position("mysql-bin.000002", 900), 1700000001, sql="ALTER TABLE t ADD x int")
    return Batch("p1", (c, ddl), Position("mysql-bin.000002", 1000, "0-1-6"), True, c.txn, 1, 1700000001, {"k": "v"})


def test_round_trip_every_value_type() -> None:
    b = _batch(VALUES)
    out = codec.decode(codec.encode(b))
    assert out == b
    got = out.changes[0].before
    assert got is not None
    for want, have in zip(VALUES, got):
        assert type(have) is type(want) and have == want and str(have) == str(want)


def test_schema_file_is_valid_and_versioned() -> None:
    path = Path(codec.__file__).parent / "batch.v1.avsc"
    assert json.loads(path.read_text())["name"] == "Batch"
    assert codec.encode(_batch([1]))[:4] == b"CYB\x01"


def test_bad_payloads_are_rejected_with_schema_error() -> None:
    good = codec.encode(_batch([1, "a"]))
    with pytest.raises(SchemaError, match="bad magic"):
        codec.decode(b"XXXX" + good[4:])
    with pytest.raises(SchemaError, match="version 9"):
        codec.decode(b"CYB\x09" + good[4:])
    with pytest.raises(SchemaError):
        codec.decode(good[: len(good) // 2])


def test_unencodable_value_names_the_problem() -> None:
    with pytest.raises(SchemaError, match="complex"):
        codec.encode(_batch([1, complex(1, 2)]))


def test_column_blocks_with_nulls_and_mixed_kinds_round_trip() -> None:
    cols = tuple(ColumnDef(f"c{i}", "text") for i in range(6))
    schema = TableSchema("d", "t", cols, ("c0",))
    rows = []
    for i in range(300):
        rows.append((
            i,
            None if i % 3 == 0 else f"s{i}",                                    # sparse NULLs
            None,                                                               # all NULL
            RawTemporal("0000-00-00") if i % 7 == 0 else dt.date(2020, 1, 1 + i % 28),  # mixed kinds
            18446744073709551615 - i if i % 2 else i,                           # beyond int64 in places
            None if i % 5 else dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
        ))
    changes = tuple(Change(Op.INSERT if i % 4 else Op.UPDATE, "d", "t", str(i), Position("b.000001", 4 + i), 0, schema,
                           None if i % 4 else rows[i - 1], r) for i, r in enumerate(rows))
    b = Batch("p", changes, Position("b.000001", 9999))
    out = codec.decode(codec.encode(b))
    assert out == b
    assert [type(v) for v in out.changes[7].after or ()][3] is RawTemporal
