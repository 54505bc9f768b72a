"""MySQL column types -> Iceberg columns (Spark SQL types) and value codecs.

Every MySQL type lands losslessly or is refused with an error naming the
column and the value.  Iceberg has no 8- or 16-bit integers and no unsigned
types, so integers widen to the next Iceberg type that holds the whole
unsigned range; values outside the *MySQL* type's range are refused (they
cannot come from a correct source, and would otherwise pass silently).

=========================  ====================  ==========================================
MySQL (COLUMN_TYPE)        Iceberg / Spark SQL   how values are kept
=========================  ====================  ==========================================
TINYINT..MEDIUMINT (+U)    INT                   as is (range of the MySQL type checked)
INT                        INT
INT UNSIGNED               BIGINT
BIGINT                     BIGINT
BIGINT UNSIGNED            DECIMAL(20,0)         0..18446744073709551615 exactly
BIT(1..63)                 BIGINT                the bit field as an unsigned number
BIT(64)                    DECIMAL(20,0)
YEAR                       INT                   0 for YEAR 0000
DECIMAL(p,s), p <= 38      DECIMAL(p,s)          exact
DECIMAL(p,s), p > 38       STRING                exact decimal text, scale kept ('1.500');
                                                 Iceberg decimals stop at 38 digits.  Cast
                                                 in queries: CAST(c AS DECIMAL(38,x))
FLOAT                      FLOAT                 the exact single-precision value
DOUBLE                     DOUBLE
DATE                       DATE                  zero/partial dates: see below
DATETIME(n)                TIMESTAMP_NTZ         wall-clock time, no zone
TIMESTAMP(n)               TIMESTAMP             an instant (Iceberg timestamptz, UTC)
TIME(n)                    BIGINT                signed microseconds (-838:59:59 .. 838:59:59
                                                 and beyond 24h): exact, sortable, summable
CHAR/VARCHAR/TEXT family   STRING
ENUM, SET                  STRING                SET as 'a,b'; '' is the empty set, not NULL
JSON                       STRING                the JSON text
BINARY/VARBINARY/BLOB      BINARY                BINARY(n) keeps its trailing 0x00 bytes
GEOMETRY family            BINARY                the bytes the source gives
=========================  ====================  ==========================================

Zero and partial dates ('0000-00-00', '2020-00-10', TIMESTAMP '0000-00-00
00:00:00'; ``RawTemporal`` in core.model) exist in MySQL but not in Iceberg
or Python's datetime.  They are kept losslessly, without giving up the typed
column: the typed column holds NULL and a *companion* STRING column
``<name>__cynomys_raw`` holds MySQL's text.  The companion is added to the
table the first time such a value arrives (most tables never get one), is
NULL whenever the typed column holds the value, and is read back as the
``RawTemporal``.  Refusing these values was the alternative; it would stop
replication on common legacy schemas (``TIMESTAMP NOT NULL DEFAULT 0``).

Each Iceberg column's comment records the source type ('mysql:time(6)',
after a note where the mapping is not obvious), so a table read back after a
restart (or by a person) says what its values mean.
"""
from __future__ import annotations

import datetime
import decimal
import struct
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pyarrow as pa
from pyspark.sql import types as T

from cynomys.core.model import ColumnDef, RawTemporal, Value
from cynomys.core.sourcetypes import (
    BINARY_TYPES,
    DECIMAL_NAMES,
    INT_FAMILIES,
    SPATIAL_TYPES,
    STRING_TYPES,
    type_params,
)

Encoder = Callable[[Any], Any]
Decoder = Callable[[Any], Value]

UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)
_US = datetime.timedelta(microseconds=1)

#: Suffix of the STRING column that keeps zero/partial dates of a temporal column.
COMPANION_SUFFIX = "__cynomys_raw"
#: Comment prefix naming the source type of a column.
SOURCE_TYPE_TAG = "mysql:"


class ValueRejected(ValueError):
    """A value does not fit the column (raised by the encoders); ``row`` is
    its index in the column when known, ``column`` the column's index in
    its table when the raiser knows it."""

    def __init__(self, message: str, row: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.row = row
        self.column = column


@dataclass(frozen=True)
class Mapping:
    """How one MySQL column lives in Iceberg.

    ``family`` groups mappings whose Python values mean the same thing, so a
    MODIFY COLUMN between two of them keeps every stored value meaningful
    (see ``conversion``)."""

    spark: T.DataType
    arrow: pa.DataType
    family: str
    encode: Encoder           # a non-NULL Python value -> what pyarrow takes; raises ValueRejected
    decode: Decoder           # a non-NULL value Spark returns -> the Python domain
    note: str = ""            # said in the column comment
    select: str = "{c}"       # read expression ({c}: the quoted column)
    temporal: bool = False    # may carry RawTemporal values (companion column)
    bounds: tuple[int, int] | None = None  # integer families: the MySQL type's range (checked)

    @property
    def sql(self) -> str:
        """The type in Spark SQL DDL ('decimal(20,0)', 'timestamp_ntz')."""
        return self.spark.simpleString()


def comment(col: ColumnDef, mapping: Mapping) -> str:
    """The Iceberg column comment: an optional note, then the source type."""
    tag = f"{SOURCE_TYPE_TAG}{col.type}"
    return f"{mapping.note}; {tag}" if mapping.note else tag


def source_type(comment_text: str | None) -> str | None:
    """The source type recorded in a column comment, or None."""
    if not comment_text:
        return None
    i = comment_text.find(SOURCE_TYPE_TAG)
    return comment_text[i + len(SOURCE_TYPE_TAG):] if i >= 0 else None


# --------------------------------------------------------------------------
# Encoders (Python domain -> pyarrow input) and decoders (Spark -> domain)
# --------------------------------------------------------------------------
def _int(lo: int, hi: int) -> Encoder:
    def enc(v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueRejected(f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise ValueRejected(f"{v} is outside the type's range {lo}..{hi}")
        return v
    return enc


def _uint64_as_decimal(hi: int) -> Encoder:
    check = _int(0, hi)
    return lambda v: decimal.Decimal(check(v))


#: Arithmetic on a value goes through this context, never the thread's
#: default one: its 28 digits would round a DECIMAL(65,30) value (abs() of
#: 99999999999999999999999999999999999.999999999999999999999999999999 is
#: 1.000000000000000000000000000E+35 there).  MySQL decimals have at most 65.
_WIDE = decimal.Context(prec=200, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def _decimal_check(p: int, s: int) -> Callable[[Any], decimal.Decimal]:
    step = decimal.Decimal(1).scaleb(-s, context=_WIDE)
    limit = _WIDE.power(10, p - s)

    def check(v: Any) -> decimal.Decimal:
        if not isinstance(v, decimal.Decimal):
            raise ValueRejected(f"expected a Decimal, got {type(v).__name__}")
        if not v.is_finite():
            raise ValueRejected(f"{v} is not a finite number")
        q = _WIDE.quantize(v, step)
        if q != v:
            raise ValueRejected(f"{v} has more than {s} fraction digits")
        if q.copy_abs() >= limit:  # copy_abs: exact, no context (abs() rounds)
            raise ValueRejected(f"{v} has more than {p - s} integer digits")
        return q
    return check


def _decimal_text(p: int, s: int) -> Encoder:
    check = _decimal_check(p, s)
    return lambda v: format(check(v), "f")  # plain notation, never '1E+5'


def _float32(v: Any) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueRejected(f"expected a float, got {type(v).__name__}")
    try:
        single = struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        raise ValueRejected(f"{v!r} does not fit a single-precision FLOAT") from None
    if single != v:
        raise ValueRejected(f"{v!r} is not a single-precision value (FLOAT would store {single!r})")
    return float(v)


def _float64(v: Any) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueRejected(f"expected a float, got {type(v).__name__}")
    return float(v)


def _date(v: Any) -> datetime.date:
    if not isinstance(v, datetime.date) or isinstance(v, datetime.datetime):
        raise ValueRejected(f"expected a date, got {type(v).__name__}")
    return v


def _naive(v: Any) -> datetime.datetime:
    if not isinstance(v, datetime.datetime) or v.tzinfo is not None:
        raise ValueRejected(f"expected a naive datetime (DATETIME has no time zone), got {v!r}")
    return v


def _aware(v: Any) -> datetime.datetime:
    if not isinstance(v, datetime.datetime) or v.tzinfo is None:
        raise ValueRejected(f"expected a UTC-aware datetime (TIMESTAMP is an instant), got {v!r}")
    return v.astimezone(UTC)


def _micros(v: Any) -> int:
    if not isinstance(v, datetime.timedelta):
        raise ValueRejected(f"expected a timedelta, got {type(v).__name__}")
    return v // _US


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueRejected(f"expected a str, got {type(v).__name__}")
    return v


def _bytes(v: Any) -> bytes:
    if not isinstance(v, (bytes, bytearray, memoryview)):
        raise ValueRejected(f"expected bytes, got {type(v).__name__}")
    return bytes(v)


def _same(v: Any) -> Value:
    return v  # type: ignore[no-any-return]


def _to_int(v: Any) -> Value:
    return int(v)


def _to_decimal(v: Any) -> Value:
    return decimal.Decimal(v)


def _to_bytes(v: Any) -> Value:
    return bytes(v)


def _from_micros(v: Any) -> Value:
    return _EPOCH + datetime.timedelta(microseconds=int(v))


def _to_timedelta(v: Any) -> Value:
    return datetime.timedelta(microseconds=int(v))


# --------------------------------------------------------------------------
# The mapping table: MySQL base type -> rule building a Mapping
# --------------------------------------------------------------------------
_INT = T.IntegerType()
_LONG = T.LongType()
_U64 = T.DecimalType(20, 0)

def _integer(c: ColumnDef) -> Mapping:
    # The narrowest Iceberg type holding the MySQL type's whole range.
    (lo, hi) = INT_FAMILIES[c.base_type].bounds(c.unsigned)
    if hi >= 2 ** 63:  # BIGINT UNSIGNED
        return Mapping(_U64, pa.decimal128(20, 0), "uint64", _uint64_as_decimal(hi), _to_int,
                       note="unsigned 64-bit integer", bounds=(lo, hi))
    if lo >= -2 ** 31 and hi < 2 ** 31:
        return Mapping(_INT, pa.int32(), "integer", _int(lo, hi), _to_int, bounds=(lo, hi))
    return Mapping(_LONG, pa.int64(), "integer", _int(lo, hi), _to_int, bounds=(lo, hi))


def _bit(c: ColumnDef) -> Mapping:
    bits = (type_params(c.type) or [1])[0]
    if bits >= 64:
        return Mapping(_U64, pa.decimal128(20, 0), "uint64", _uint64_as_decimal(2 ** 64 - 1), _to_int,
                       note="bit field as an unsigned number", bounds=(0, 2 ** 64 - 1))
    return Mapping(_LONG, pa.int64(), "integer", _int(0, 2 ** bits - 1), _to_int,
                   note="bit field as an unsigned number", bounds=(0, 2 ** bits - 1))


def _decimal(c: ColumnDef) -> Mapping:
    params = type_params(c.type)  # DECIMAL = DECIMAL(10,0); DECIMAL(p) = DECIMAL(p,0)
    p = params[0] if params else 10
    s = params[1] if len(params) > 1 else 0
    if p <= 38:
        check = _decimal_check(p, s)
        return Mapping(T.DecimalType(p, s), pa.decimal128(p, s), "decimal", check, _same)
    return Mapping(T.StringType(), pa.string(), "decimal_text", _decimal_text(p, s), _to_decimal,
                   note="exact decimal text (Iceberg decimals stop at 38 digits)")


def _const(m: Mapping) -> Callable[[ColumnDef], Mapping]:
    return lambda c: m


_STRING = Mapping(T.StringType(), pa.string(), "text", _text, _same)
_BINARY = Mapping(T.BinaryType(), pa.binary(), "binary", _bytes, _to_bytes)

#: MySQL base type (ColumnDef.base_type) -> rule.  A type not listed is refused.
TYPE_RULES: dict[str, Callable[[ColumnDef], Mapping]] = {
    **{t: _integer for t in INT_FAMILIES},
    "bit": _bit,
    "year": _const(Mapping(_INT, pa.int32(), "integer", _int(0, 2155), _to_int, bounds=(0, 2155))),
    **{t: _decimal for t in DECIMAL_NAMES},
    "float": _const(Mapping(T.FloatType(), pa.float32(), "float", _float32, _same)),
    "double": _const(Mapping(T.DoubleType(), pa.float64(), "double", _float64, _same)),
    "real": _const(Mapping(T.DoubleType(), pa.float64(), "double", _float64, _same)),
    "date": _const(Mapping(T.DateType(), pa.date32(), "date", _date, _same, temporal=True)),
    "datetime": _const(Mapping(T.TimestampNTZType(), pa.timestamp("us"), "datetime", _naive, _same,
                               temporal=True)),
    "timestamp": _const(Mapping(T.TimestampType(), pa.timestamp("us", tz="UTC"), "timestamp", _aware,
                                _from_micros, select="unix_micros({c})", temporal=True)),
    "time": _const(Mapping(_LONG, pa.int64(), "time", _micros, _to_timedelta, note="signed microseconds")),
    **{t: _const(_STRING) for t in STRING_TYPES},
    **{t: _const(_BINARY) for t in BINARY_TYPES + SPATIAL_TYPES},
}

#: Iceberg/Spark type of a column with no source type in its comment (a
#: table Cynomys did not create) -> the source type its values are read as.
DEFAULT_SOURCE_TYPES: dict[str, str] = {
    "int": "int", "bigint": "bigint", "smallint": "smallint", "tinyint": "tinyint",
    "float": "float", "double": "double", "date": "date", "timestamp_ntz": "datetime(6)",
    "timestamp": "timestamp(6)", "string": "longtext", "binary": "longblob", "boolean": "tinyint",
}


def mapping(col: ColumnDef) -> Mapping:
    """The Iceberg mapping of a source column; ValueError when there is none."""
    rule = TYPE_RULES.get(col.base_type)
    if rule is None:
        raise ValueError(f"column {col.name!r} has type {col.type!r}, which has no lossless Iceberg mapping")
    return rule(col)


def column_for(name: str, spark_type: T.DataType, comment_text: str | None) -> ColumnDef:
    """The source column a target column stands for (from its comment, or
    guessed from its Iceberg type when the comment is not ours)."""
    found = source_type(comment_text)
    if found is None:
        simple = spark_type.simpleString()
        found = DEFAULT_SOURCE_TYPES.get(simple, simple if simple.startswith("decimal") else "longtext")
    return ColumnDef(name, found)


# --------------------------------------------------------------------------
# Whole columns
# --------------------------------------------------------------------------
def encode_column(m: Mapping, values: Sequence[Value]) -> tuple[pa.Array, list[str | None] | None]:
    """Python values of one column -> (typed Arrow array, companion texts or
    None when no value is a zero/partial date).  Raises ValueRejected with
    the index of the value."""
    typed: list[Any] = []
    raw: list[str | None] | None = None
    for i, v in enumerate(values):
        if v is None:
            typed.append(None)
        elif isinstance(v, RawTemporal):
            if not m.temporal:
                raise ValueRejected(f"{v!r} is a zero/partial date in a column that is not temporal", i)
            if raw is None:
                raw = [None] * len(values)
            raw[i] = str(v)
            typed.append(None)
        else:
            try:
                typed.append(m.encode(v))
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise ValueRejected(f"{v!r}: {exc}", i) from None
    try:
        return pa.array(typed, type=m.arrow), raw
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise ValueRejected(f"{exc}") from None


def decoder(m: Mapping) -> Decoder:
    """A decoder that passes NULL through."""
    dec = m.decode
    return lambda v: None if v is None else dec(v)


# --------------------------------------------------------------------------
# MODIFY COLUMN: which type changes keep every stored value
# --------------------------------------------------------------------------
#: Families whose values are numbers: converting between them is a CAST
#: (run with ANSI overflow checks, so a value that does not fit is an error).
NUMERIC_FAMILIES = frozenset({"integer", "uint64", "decimal"})


def promotable(old: T.DataType, new: T.DataType) -> bool:
    """Iceberg changes the type in place (metadata only): int -> long,
    float -> double, decimal(p,s) -> decimal(p',s) with p' >= p."""
    if isinstance(old, T.IntegerType) and isinstance(new, T.LongType):
        return True
    if isinstance(old, T.FloatType) and isinstance(new, T.DoubleType):
        return True
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return old.scale == new.scale and new.precision >= old.precision
    return False


def conversion(old: Mapping, new: Mapping) -> str:
    """How a column changes from ``old`` to ``new``: 'same' (only the
    comment), 'promote' (Iceberg type promotion), 'rewrite' (rewrite the
    table with a CAST), or 'refuse: <reason>'."""
    if old.family == new.family or {old.family, new.family} == {"float", "double"}:
        if old.spark == new.spark:
            return "same"
        if promotable(old.spark, new.spark):
            return "promote"
    if old.family in NUMERIC_FAMILIES and new.family in NUMERIC_FAMILIES:
        return "rewrite"
    return (f"refuse: Iceberg cannot change {old.sql} ({old.family}) to {new.sql} ({new.family}) in place, "
            "and rewriting the values would need MySQL's own conversion rules")
