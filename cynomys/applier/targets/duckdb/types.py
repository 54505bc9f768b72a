"""How each source (MySQL/MariaDB) type lives in DuckDB, as data.

DuckDB has unsigned integers, a 128-bit DECIMAL up to 38 digits and
microsecond timestamps, so most types map one to one.  What it lacks:
DECIMAL beyond 38 digits (kept as its exact text), a TIME beyond 24 hours
(MySQL's spans +-838 h: kept as signed microseconds), and zero or partial
dates ('0000-00-00', '2020-00-10'), which no DATE/TIMESTAMP holds and which
are refused with the table and column.  Each column's comment keeps its
source type ('cynomys:time(6)'), so rows read back decode exactly.
"""
from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from cynomys.core.model import ColumnDef, RawTemporal, Value
from cynomys.core.sourcetypes import timedelta_micros, type_params

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class Unstorable(ValueError):
    """A value this target cannot hold (a zero date)."""


@dataclass(frozen=True)
class DuckType:
    """One source column in DuckDB: its SQL and Arrow types, how a value
    goes in (to what pyarrow takes) and comes back, and which values a type
    change may convert (``family``)."""

    sql: str
    arrow: pa.DataType
    family: str
    encode: Callable[[Value], Any] = lambda v: v
    decode: Callable[[Any], Value] = lambda v: v
    select: str = "{c}"          # read expression; {c} is the quoted column


def _no_zero_dates(v: Value) -> Value:
    if isinstance(v, RawTemporal):
        raise Unstorable(f"the zero or partial date {str(v)!r} has no DuckDB DATE/TIMESTAMP")
    return v


def _from_epoch_us(v: Any) -> Value:
    return _EPOCH + datetime.timedelta(microseconds=int(v))


def _time_us(v: Value) -> Any:
    assert isinstance(v, datetime.timedelta)
    return timedelta_micros(v)


_INTS = {  # base type -> (signed SQL, Arrow), (unsigned SQL, Arrow)
    "tinyint": (("TINYINT", pa.int8()), ("UTINYINT", pa.uint8())),
    "smallint": (("SMALLINT", pa.int16()), ("USMALLINT", pa.uint16())),
    "mediumint": (("INTEGER", pa.int32()), ("UINTEGER", pa.uint32())),
    "int": (("INTEGER", pa.int32()), ("UINTEGER", pa.uint32())),
    "bigint": (("BIGINT", pa.int64()), ("UBIGINT", pa.uint64())),
}
_TEXT = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json")
_BINARY = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")


def _decimal(col: ColumnDef) -> DuckType:
    p, s = (type_params(col.type) + [10, 0])[:2]
    if p <= 38:
        return DuckType(f"DECIMAL({p},{s})", pa.decimal128(p, s), "decimal")
    # Beyond DuckDB's 38 digits: the exact text ('f': never an exponent).
    return DuckType("VARCHAR", pa.string(), "decimal", lambda v: format(v, "f"), decimal.Decimal)


def duck_type(col: ColumnDef) -> DuckType:
    """The mapping of a source column; TypeError for a type not known here."""
    base = col.base_type
    if base in _INTS:
        sql, arrow = _INTS[base][1 if "unsigned" in col.type.lower() else 0]
        return DuckType(sql, arrow, "integer", decode=int)
    if base == "decimal":
        return _decimal(col)
    if base == "float":
        return DuckType("FLOAT", pa.float32(), "float", decode=float)
    if base == "double":
        return DuckType("DOUBLE", pa.float64(), "float", decode=float)
    if base == "bit":
        return DuckType("UBIGINT", pa.uint64(), "integer", decode=int)
    if base == "year":
        return DuckType("SMALLINT", pa.int16(), "integer", decode=int)
    if base == "date":
        return DuckType("DATE", pa.date32(), "date", _no_zero_dates)
    if base == "datetime":
        return DuckType("TIMESTAMP", pa.timestamp("us"), "datetime", _no_zero_dates)
    if base == "timestamp":
        # Read as epoch microseconds: exact, and no time zone database needed.
        return DuckType("TIMESTAMPTZ", pa.timestamp("us", tz="UTC"), "timestamp", _no_zero_dates,
                        _from_epoch_us, "epoch_us({c})")
    if base == "time":
        return DuckType("BIGINT", pa.int64(), "time", _time_us, lambda v: datetime.timedelta(microseconds=int(v)))
    if base in _TEXT:
        return DuckType("VARCHAR", pa.string(), "text", decode=str)
    if base in _BINARY:
        return DuckType("BLOB", pa.binary(), "binary", decode=bytes)
    raise TypeError(f"the source type {col.type!r} has no DuckDB mapping")


#: DuckDB type -> a source type that decodes it, for columns without a
#: 'cynomys:' comment (made by hand).
NATIVE_SOURCE_TYPES = {
    "TINYINT": "tinyint", "SMALLINT": "smallint", "INTEGER": "int", "BIGINT": "bigint",
    "UTINYINT": "tinyint unsigned", "USMALLINT": "smallint unsigned", "UINTEGER": "int unsigned",
    "UBIGINT": "bigint unsigned", "FLOAT": "float", "DOUBLE": "double", "DATE": "date",
    "TIMESTAMP": "datetime(6)", "TIMESTAMP WITH TIME ZONE": "timestamp(6)", "BLOB": "longblob",
    "BOOLEAN": "tinyint",
}


def native_source_type(duck_sql_type: str) -> str:
    if duck_sql_type.startswith("DECIMAL"):
        return duck_sql_type.lower()
    return NATIVE_SOURCE_TYPES.get(duck_sql_type, "longtext")


def arrow_column(t: DuckType, values: list[Value]) -> pa.Array:
    """One column of a batch; raises Unstorable/ValueError/TypeError/pa.ArrowException."""
    enc = t.encode
    return pa.array([None if v is None else enc(v) for v in values], type=t.arrow)


def literal(t: DuckType, v: Value) -> str:
    """A constant for ADD COLUMN ... DEFAULT: a bare number or a quoted text
    that DuckDB casts to the column's type.  (Not a CAST expression: DuckDB
    1.5 then fails to commit a second ADD COLUMN of the same table in the
    transaction, "another transaction has altered this table".)"""
    enc = None if v is None else t.encode(v)
    if enc is None:
        return "NULL"
    if isinstance(enc, (int, float, decimal.Decimal)) and not isinstance(enc, bool):
        return format(enc, "f") if isinstance(enc, decimal.Decimal) else repr(enc)
    if isinstance(enc, bytes):
        text = "".join(f"\\x{b:02X}" for b in enc)  # VARCHAR -> BLOB reads \xHH escapes
    elif isinstance(enc, datetime.datetime):
        text = enc.isoformat(sep=" ")
    elif isinstance(enc, datetime.date):
        text = enc.isoformat()
    else:
        text = str(enc)
    return "'" + text.replace("'", "''") + "'"
