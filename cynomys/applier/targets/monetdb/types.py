"""MonetDB target data: what the server can do, the type mapping, value codecs.

Every source column becomes one MonetDB column described by a ``Codec``: the
MonetDB type, how a value is written as a SQL literal and as a ``COPY INTO``
field, how it is read back, and which values cannot be stored (raised as
``Unstorable`` with the reason, before anything is sent).  The mapping is the
``RULES`` table, keyed by the source base type; what differs between MonetDB
releases is a ``ServerFeatures`` value the target probes once per connection.

Type mapping (source -> MonetDB -> how the value is held)
=========================  =====================================  ==========================================
MySQL / MariaDB            MonetDB                                why / value
=========================  =====================================  ==========================================
TINYINT [UNSIGNED]         SMALLINT                               MonetDB has no unsigned types, and every
SMALLINT [UNSIGNED]        INT                                    integer type keeps its minimum as NULL
MEDIUMINT [UNSIGNED]       INT                                    (TINYINT -128 *is* NULL), so each integer
INT [UNSIGNED]             BIGINT                                 widens one step; source ranges are
BIGINT [UNSIGNED]          HUGEINT (VARCHAR(21) text w/o HUGEINT) checked here, never by the wider column.
                                                                  url option integers=native: signed types
                                                                  keep their width, the minimum is refused
BIT(n<64) / BIT(64)        BIGINT / HUGEINT (else VARCHAR text)   the number
YEAR                       SMALLINT                               the year (0 for YEAR 0000)
DECIMAL(p,s)               DECIMAL(p,s) if p <= 38 (18 w/o        exact; wider: the exact text with s
                           HUGEINT), else VARCHAR(p+2)            fraction digits (cast to use as a number)
FLOAT / DOUBLE             REAL / DOUBLE                          exact binary value
DATE                       DATE                                   zero/partial dates: rejected (see below)
DATETIME(n)                TIMESTAMP(n)                           naive; microseconds need MonetDB >= 11.35
TIMESTAMP(n)               TIMESTAMP(n) WITH TIME ZONE            the UTC instant (sessions run in UTC)
TIME(n)                    BIGINT                                 signed microseconds: MonetDB TIME holds
                                                                  0-24h only, MySQL TIME is +-838:59:59
CHAR(n) / VARCHAR(n)       VARCHAR(n)                             characters, binary collation
*TEXT                      CLOB
ENUM / SET                 VARCHAR(longest / all members)         the member text
JSON                       JSON, or CLOB from 11.49 on            the exact text: 11.49+ rewrites JSON
                                                                  values (whitespace, duplicate keys)
BINARY/VARBINARY/*BLOB     BLOB                                   the bytes
GEOMETRY                   BLOB                                   the source's internal bytes
=========================  =====================================  ==========================================

MonetDB's DATE/TIMESTAMP cannot hold MySQL's zero and partial dates
('0000-00-00', '2020-00-10', '2020-02-31'); such a value is rejected with
the table, column and fix rather than stored as something else.  Each
column's source type is kept in its MonetDB column comment
(``cynomys:<type>``), so ``fetch_rows`` undoes the mapping exactly even in
a process that did not create the table.
"""
from __future__ import annotations

import datetime
import decimal
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cynomys.applier.targets.source_types import SOURCE_TYPE_TAG, source_type_comment
from cynomys.core.dialect import MONETDB
from cynomys.core.model import ColumnDef, RawTemporal, Value
from cynomys.core.sourcetypes import (
    BINARY_TYPES,
    BOOLEAN_FAMILY,
    BOOLEAN_NAMES,
    DECIMAL_NAMES,
    INT_FAMILIES,
    INT_SYNONYMS,
    TEXT_LOBS,
    int_family,
    members,
    type_params,
)

_UTC = datetime.timezone.utc
_FLT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
_DBL_MAX = 1.7976931348623157e308

#: Prefix of the column comment that records the source type.
COMMENT_PREFIX = SOURCE_TYPE_TAG


class Unstorable(ValueError):
    """A value the MonetDB column cannot hold as the source had it."""

    def __init__(self, reason: str, hint: str) -> None:
        self.reason = reason
        self.hint = hint
        super().__init__(reason)


@dataclass(frozen=True)
class ServerFeatures:
    """What one MonetDB server can do; probed once per connection."""

    version: str = "unknown"
    #: 128-bit integers: HUGEINT and DECIMAL up to 38 digits (else 18).
    hugeint: bool = True
    #: TIMESTAMP keeps microseconds (11.35 Nov2019 and later; before: ms).
    timestamp_micro: bool = True
    #: -FLT_MAX / -DBL_MAX are NULL (before 11.37 Jun2020; later NaN is).
    float_min_is_null: bool = False
    #: '...' literals read backslash escapes (the default unless the
    #: server runs with raw_strings=true).
    literal_backslash: bool = True
    #: A JSON column gives back the text as written (before 11.49 Dec2023).
    json_keeps_text: bool = False
    #: ALTER TABLE t ALTER COLUMN c <type> changes a type in place.
    alter_column_type: bool = False
    #: COPY INTO ... FROM '<name>' ON CLIENT: the client streams the
    #: records from its upload handler (11.41 Jan2022 and later).
    copy_on_client: bool = False

    @property
    def max_decimal(self) -> int:
        return 38 if self.hugeint else 18


@dataclass(frozen=True)
class Codec:
    """One source column on MonetDB.

    ``family`` names the value encoding (int, decimal, float, text_number,
    text, date, datetime, timestamptz, microseconds, bytes), for deciding
    whether a type change can be done by CAST on the server (``CASTABLE``)."""

    source: ColumnDef
    sql_type: str
    family: str
    literal: Callable[[Value], str]      # SQL literal of a non-NULL value (raises Unstorable)
    field: Callable[[Value], str]        # COPY INTO field of a value, None -> null (raises Unstorable)
    decode: Callable[[Any], Value]       # driver value (not None) -> the Python domain
    select: str = "{c}"                  # SELECT expression, {c} = the quoted column
    coerce: Callable[[Value], Value] = lambda v: v  # a DDL DEFAULT value -> this column's domain


# --------------------------------------------------------------------------
# Literals and COPY fields
# --------------------------------------------------------------------------
#: A MonetDB identifier, double-quoted; a schema-qualified table name.
quote_ident = MONETDB.ident
qualified = MONETDB.table


def string_literal(s: str, features: ServerFeatures) -> str:
    """A '...' literal; backslashes doubled where the server reads escapes."""
    if features.literal_backslash:
        s = s.replace("\\", "\\\\")
    return "'" + s.replace("'", "''") + "'"


# COPY INTO ... FROM STDIN reads fields with backslash escapes (its default,
# in every release); a quoted field is never taken for the NULL marker
# (tablet.c: only unquoted fields are compared with it), so every text-like
# value is quoted and NULL is the unquoted default marker 'null'.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "|": "\\|"})
_COPY_SPECIAL = re.compile('[\\\\"\n\r\t|\x00]')
COPY_NULL = "null"


def copy_text(s: str) -> str:
    # One C-level scan; most values need no escaping at all.
    return '"' + (s.translate(_COPY_ESCAPES) if _COPY_SPECIAL.search(s) else s) + '"'


def _text_check(s: str, limit: int | None) -> str:
    if "\x00" in s:
        raise Unstorable("the text holds a NUL character, which MonetDB strings cannot hold",
                         "remove NUL characters on the source, or make the column VARBINARY/BLOB")
    if limit is not None and len(s) > limit:
        raise Unstorable(f"the text has {len(s)} characters, more than the column's {limit}",
                         "widen the column on the target (ALTER TABLE ... ALTER COLUMN)")
    return s


# --------------------------------------------------------------------------
# Integers (and YEAR, BIT)
# --------------------------------------------------------------------------
#: Source integer family -> (MonetDB type one step wider, the MonetDB type
#: of the same width for ``integers=native``).
INT_TYPES: dict[str, tuple[str, str]] = {
    "tinyint": ("SMALLINT", "TINYINT"), "smallint": ("INT", "SMALLINT"), "mediumint": ("INT", "INT"),
    "int": ("BIGINT", "INT"), "bigint": ("HUGEINT", "BIGINT"),
}


def _as_int(v: Value) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, decimal.Decimal) and v == v.to_integral_value():
        return int(v)
    if isinstance(v, str) and re.fullmatch(r"\s*[-+]?\d+\s*", v):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise Unstorable(f"{v!r} is not an integer", "fix the value on the source")


def _int_codec(col: ColumnDef, lo: int, hi: int, sql_type: str, what: str, features: ServerFeatures) -> Codec:
    def check(v: Value) -> int:
        n = _as_int(v)
        if not lo <= n <= hi:
            raise Unstorable(f"{n} is out of range for the source type {what} ({lo}..{hi})",
                             "the value cannot have come from the source column: check that the target table "
                             "matches the source schema (re-snapshot the table)")
        return n

    if sql_type == "TEXT_INT":
        # No HUGEINT: a 64-bit unsigned value is kept as its decimal text.
        width = len(str(hi))
        return Codec(col, f"VARCHAR({width + 1})", "text_number",
                     lambda v: string_literal(str(check(v)), features),
                     lambda v: COPY_NULL if v is None else copy_text(str(check(v))),
                     lambda v: int(v), coerce=_as_int)

    def field(v: Value) -> str:
        if type(v) is int and lo <= v <= hi:  # the common case first: this runs per value
            return str(v)
        return COPY_NULL if v is None else str(check(v))

    return Codec(col, sql_type, "int", lambda v: str(check(v)), field, int, coerce=_as_int)


def _integer(col: ColumnDef, features: ServerFeatures, native: bool = False) -> Codec:
    family = int_family(col.base_type)
    assert family is not None
    sql_type, native_type = INT_TYPES[family.name]
    lo, hi = family.bounds(col.unsigned)
    if native and not col.unsigned:
        # Same width as the source: the type's minimum is MonetDB's NULL,
        # so that one value is refused instead of stored.
        if native_type == "INT" and family.bits < 32:  # MEDIUMINT: INT holds all of it
            return _int_codec(col, lo, hi, native_type, col.type, features)

        def check(v: Value) -> str:
            n = _as_int(v)
            if n == lo:
                raise Unstorable(f"{n} is the value MonetDB uses for NULL in a {native_type} column",
                                 "use the default [target] url option integers=widen (one size wider columns)")
            if not lo <= n <= hi:
                raise Unstorable(f"{n} is out of range for the source type {col.type} ({lo}..{hi})",
                                 "check that the target table matches the source schema (re-snapshot the table)")
            return str(n)

        return Codec(col, native_type, "int", check, lambda v: COPY_NULL if v is None else check(v), int,
                     coerce=_as_int)
    if sql_type == "HUGEINT" and not features.hugeint:
        sql_type = "TEXT_INT"
    return _int_codec(col, lo, hi, sql_type, col.type, features)


def _bit(col: ColumnDef, features: ServerFeatures) -> Codec:
    bits = (type_params(col.type) or [1])[0]
    # BIGINT keeps its minimum as NULL but BIT(63) tops out at 2^63-1.
    sql_type = "BIGINT" if bits < 64 else "HUGEINT" if features.hugeint else "TEXT_INT"
    return _int_codec(col, 0, 2 ** bits - 1, sql_type, col.type, features)


def _boolean(col: ColumnDef, features: ServerFeatures) -> Codec:
    return _int_codec(col, *BOOLEAN_FAMILY.signed, INT_TYPES[BOOLEAN_FAMILY.name][0], BOOLEAN_FAMILY.name, features)


def _year(col: ColumnDef, features: ServerFeatures) -> Codec:
    return _int_codec(col, 0, 2155, "SMALLINT", "year", features)


# --------------------------------------------------------------------------
# DECIMAL
# --------------------------------------------------------------------------
def _as_decimal(v: Value) -> decimal.Decimal:
    if isinstance(v, decimal.Decimal):
        return v
    if isinstance(v, (int, str)) and not isinstance(v, RawTemporal):
        try:
            return decimal.Decimal(v)
        except decimal.InvalidOperation:
            pass
    if isinstance(v, float):
        return decimal.Decimal(repr(v))
    raise Unstorable(f"{v!r} is not a decimal number", "fix the value on the source")


def _decimal(col: ColumnDef, features: ServerFeatures) -> Codec:
    params = type_params(col.type)
    p, s = (params + [10, 0][len(params):])[:2]  # DECIMAL = (10,0), DECIMAL(p) = (p,0)
    quantum = decimal.Decimal(1).scaleb(-s)
    ctx = decimal.Context(prec=p + 5)
    Decimal = decimal.Decimal

    def text(v: Value) -> str:
        """The exact text with s fraction digits; Unstorable when the value
        does not fit DECIMAL(p,s) exactly."""
        if type(v) is Decimal:
            # Fast path (per value): the source sends values at the column's
            # scale, so the plain text already has s fraction digits.
            # (str() is 4x faster than format(); it writes an exponent only
            # for tiny values, which then take the slow path.)
            t = str(v)
            whole, _, frac = t.partition(".")
            if len(frac) == s and whole[0] != "-" and "E" not in t and len(whole.lstrip("0")) <= p - s:
                return t
        d = _as_decimal(v)
        try:
            q = d.quantize(quantum, context=ctx)
        except decimal.InvalidOperation:
            q = d
        if q != d or (len(q.as_tuple().digits) > p and q != 0):
            raise Unstorable(f"{d} does not fit the source type {col.type}",
                             "check that the target table matches the source schema (re-snapshot the table)")
        if col.unsigned and q < 0:
            raise Unstorable(f"{d} is negative but the source type is {col.type}",
                             "check that the target table matches the source schema")
        if q.is_zero():
            q = abs(q)  # -0.00 is 0.00 (MySQL has no negative zero; MonetDB neither)
        return format(q, "f")  # never '1E+5'

    if p <= features.max_decimal:
        # Read back as text: pymonetdb's binary result decoder divides by
        # 10**scale in a 28-digit context, dropping the scale (25.00 -> 25)
        # and digits beyond 28.
        return Codec(col, f"DECIMAL({p},{s})", "decimal", text, lambda v: COPY_NULL if v is None else text(v),
                     lambda v: Decimal(str(v)), select=f"CAST({{c}} AS VARCHAR({p + 3}))", coerce=_as_decimal)
    # Wider than MonetDB's DECIMAL: the exact text, with the column's scale,
    # so equal values have equal text (deletes compare text).
    return Codec(col, f"VARCHAR({p + 2})", "text_number", lambda v: string_literal(text(v), features),
                 lambda v: COPY_NULL if v is None else copy_text(text(v)), lambda v: Decimal(str(v)),
                 coerce=_as_decimal)


# --------------------------------------------------------------------------
# FLOAT / DOUBLE
# --------------------------------------------------------------------------
def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _as_float(v: Value) -> float:
    if isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str) and not isinstance(v, RawTemporal):
        try:
            return float(v)
        except ValueError:
            pass
    raise Unstorable(f"{v!r} is not a number", "fix the value on the source")


def _float_text(x: float) -> str:
    text = repr(x)
    # A double literal (1.5e0), so the server reads a double, not a DECIMAL.
    return text if "e" in text else text + "e0"


def _floating(col: ColumnDef, features: ServerFeatures, single: bool) -> Codec:
    lowest = -_FLT_MAX if single else -_DBL_MAX
    sql_type = "REAL" if single else "DOUBLE"

    def text(v: Value) -> str:
        x = _as_float(v)
        if not math.isfinite(x):
            raise Unstorable(f"{x!r} is not a finite number", "MySQL columns hold finite numbers only")
        if single:
            x = _f32(x)
        if features.float_min_is_null and x == lowest:
            raise Unstorable(f"{x!r} is the value this MonetDB release uses for NULL in a {sql_type} column",
                             "upgrade MonetDB to Jun2020 (11.37) or later, where NULL is NaN")
        return _float_text(x)

    decode: Callable[[Any], Value] = (lambda v: _f32(float(v))) if single else float
    # Read back as DOUBLE: exact for a REAL, and printed with every digit.
    return Codec(col, sql_type, "float", lambda v: f"CAST({text(v)} AS {sql_type})",
                 lambda v: COPY_NULL if v is None else text(v), decode,
                 select="CAST({c} AS DOUBLE)" if single else "{c}", coerce=_as_float)


# --------------------------------------------------------------------------
# Temporals
# --------------------------------------------------------------------------
_ZERO_HINT = ("MonetDB's DATE/TIMESTAMP cannot hold MySQL zero or partial dates: on the source, set such values "
              "to NULL or a real date (e.g. UPDATE ... SET c = NULL WHERE c = '0000-00-00') and enable "
              "NO_ZERO_DATE,NO_ZERO_IN_DATE in sql_mode, then re-snapshot the table")


def _reject_raw(v: Value, col: ColumnDef) -> None:
    if isinstance(v, RawTemporal):
        raise Unstorable(f"{str(v)!r} is a zero or partial date", _ZERO_HINT)


def _as_date(v: Value) -> datetime.date:
    if isinstance(v, RawTemporal):
        return v  # type: ignore[return-value]  # rejected by the caller
    if isinstance(v, datetime.datetime):
        return v.date()
    if isinstance(v, datetime.date):
        return v
    if isinstance(v, str):
        try:
            return datetime.date.fromisoformat(v.strip()[:10])
        except ValueError:
            return RawTemporal(v.strip())  # type: ignore[return-value]
    raise Unstorable(f"{v!r} is not a date", "fix the value on the source")


def _as_datetime(v: Value) -> datetime.datetime:
    if isinstance(v, RawTemporal):
        return v  # type: ignore[return-value]
    if isinstance(v, datetime.datetime):
        return v
    if isinstance(v, datetime.date):
        return datetime.datetime(v.year, v.month, v.day)
    if isinstance(v, str):
        try:
            return datetime.datetime.fromisoformat(v.strip())
        except ValueError:
            return RawTemporal(v.strip())  # type: ignore[return-value]
    raise Unstorable(f"{v!r} is not a date and time", "fix the value on the source")


def _date(col: ColumnDef, features: ServerFeatures) -> Codec:
    date = datetime.date

    def text(v: Value) -> str:
        d = _as_date(v)
        _reject_raw(d, col)
        return d.isoformat()

    def field(v: Value) -> str:
        if type(v) is date:
            return v.isoformat()
        return COPY_NULL if v is None else text(v)

    return Codec(col, "DATE", "date", lambda v: f"DATE '{text(v)}'", field,
                 lambda v: v if isinstance(v, datetime.date) else datetime.date.fromisoformat(str(v)),
                 coerce=lambda v: _as_date(v))


def _timestamp_text(dt: datetime.datetime, features: ServerFeatures) -> str:
    if not features.timestamp_micro and dt.microsecond % 1000:
        raise Unstorable(f"{dt.isoformat()} has microseconds, which this MonetDB release ({features.version}) "
                         "rounds to milliseconds", "upgrade MonetDB to Nov2019 (11.35) or later")
    return dt.isoformat(sep=" ", timespec="microseconds")


def _datetime(col: ColumnDef, features: ServerFeatures) -> Codec:
    fsp = (type_params(col.type) or [0])[0]

    def text(v: Value) -> str:
        dt = _as_datetime(v)
        _reject_raw(dt, col)
        if dt.tzinfo is not None:  # a DATETIME has no zone; keep the wall time as given in UTC
            dt = dt.astimezone(_UTC).replace(tzinfo=None)
        return _timestamp_text(dt, features)

    def decode(v: Any) -> Value:
        return v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else datetime.datetime.fromisoformat(str(v))

    return Codec(col, f"TIMESTAMP({fsp})", "datetime", lambda v: f"TIMESTAMP '{text(v)}'",
                 lambda v: COPY_NULL if v is None else text(v), decode,
                 coerce=lambda v: _as_datetime(v))


def _timestamp(col: ColumnDef, features: ServerFeatures) -> Codec:
    fsp = (type_params(col.type) or [0])[0]

    def text(v: Value) -> str:
        dt = _as_datetime(v)
        _reject_raw(dt, col)
        # TIMESTAMP values are UTC-aware; a naive one is taken as UTC.
        dt = dt.astimezone(_UTC) if dt.tzinfo is not None else dt.replace(tzinfo=_UTC)
        return _timestamp_text(dt.replace(tzinfo=None), features) + "+00:00"

    def decode(v: Any) -> Value:
        dt = v if isinstance(v, datetime.datetime) else datetime.datetime.fromisoformat(str(v))
        return dt.astimezone(_UTC) if dt.tzinfo is not None else dt.replace(tzinfo=_UTC)

    return Codec(col, f"TIMESTAMP({fsp}) WITH TIME ZONE", "timestamptz",
                 lambda v: f"TIMESTAMP WITH TIME ZONE '{text(v)}'", lambda v: COPY_NULL if v is None else text(v),
                 decode, coerce=lambda v: _as_datetime(v))


_TIME_TEXT = re.compile(r"^\s*(-)?(\d+):(\d{1,2}):(\d{1,2})(?:\.(\d{1,6}))?\s*$")


def _as_timedelta(v: Value) -> datetime.timedelta:
    if isinstance(v, datetime.timedelta):
        return v
    if isinstance(v, str):
        m = _TIME_TEXT.match(v)
        if m:
            td = datetime.timedelta(hours=int(m.group(2)), minutes=int(m.group(3)), seconds=int(m.group(4)),
                                    microseconds=int((m.group(5) or "0").ljust(6, "0")))
            return -td if m.group(1) else td
    if isinstance(v, int) and not isinstance(v, bool):  # MySQL reads 1234 as 00:12:34
        sign, n = (-1 if v < 0 else 1), abs(v)
        return sign * datetime.timedelta(hours=n // 10000, minutes=n // 100 % 100, seconds=n % 100)
    raise Unstorable(f"{v!r} is not a time", "fix the value on the source")


def _time(col: ColumnDef, features: ServerFeatures) -> Codec:
    # MonetDB's TIME is a time of day (0-24h); MySQL's TIME is a signed
    # duration up to 838:59:59.999999, so it is kept as microseconds.
    def text(v: Value) -> str:
        td = _as_timedelta(v)
        return str((td.days * 86400 + td.seconds) * 1_000_000 + td.microseconds)

    return Codec(col, "BIGINT", "microseconds", text, lambda v: COPY_NULL if v is None else text(v),
                 lambda v: datetime.timedelta(microseconds=int(v)),
                 coerce=_as_timedelta)


# --------------------------------------------------------------------------
# Text, JSON, bytes
# --------------------------------------------------------------------------
def _as_text(v: Value) -> str:
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise Unstorable("the bytes are not UTF-8 text", "fix the value on the source") from None
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if v is None:
        raise Unstorable("NULL", "")
    return str(v)


def _text_codec(col: ColumnDef, sql_type: str, limit: int | None, features: ServerFeatures,
                select: str = "{c}") -> Codec:
    def check(v: Value) -> str:
        return _text_check(_as_text(v), limit)

    def field(v: Value) -> str:
        if type(v) is str and (limit is None or len(v) <= limit):
            if not _COPY_SPECIAL.search(v):  # the common case: nothing to escape, no NUL
                return '"' + v + '"'
            if "\x00" not in v:
                return '"' + v.translate(_COPY_ESCAPES) + '"'
        return COPY_NULL if v is None else copy_text(check(v))

    return Codec(col, sql_type, "text", lambda v: string_literal(check(v), features), field,
                 lambda v: v if isinstance(v, str) else str(v), select=select, coerce=_as_text)


def _varchar(col: ColumnDef, features: ServerFeatures) -> Codec:
    n = (type_params(col.type) or [255])[0]
    return _text_codec(col, f"VARCHAR({max(n, 1)})", n, features)


def _clob(col: ColumnDef, features: ServerFeatures) -> Codec:
    return _text_codec(col, "CLOB", None, features)


def _enum(col: ColumnDef, features: ServerFeatures) -> Codec:
    n = max([len(m) for m in members(col.type)] + [1])
    return _text_codec(col, f"VARCHAR({n})", n, features)


def _set(col: ColumnDef, features: ServerFeatures) -> Codec:
    ms = members(col.type)
    n = max(sum(len(m) for m in ms) + len(ms) - 1, 1)
    return _text_codec(col, f"VARCHAR({n})", n, features)


def _json(col: ColumnDef, features: ServerFeatures) -> Codec:
    if features.json_keeps_text:
        # Read back as text: the driver would parse JSON into Python objects.
        return _text_codec(col, "JSON", None, features, select="CAST({c} AS CLOB)")
    return _text_codec(col, "CLOB", None, features)


def _as_bytes(v: Value) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    raise Unstorable(f"{v!r} is not bytes", "fix the value on the source")


def _blob(col: ColumnDef, features: ServerFeatures) -> Codec:
    n = (type_params(col.type) or [0])[0] if col.base_type in ("binary", "varbinary") else 0

    def hexed(v: Value) -> str:
        b = _as_bytes(v)
        if n and len(b) > n:
            raise Unstorable(f"{len(b)} bytes do not fit the source type {col.type}",
                             "check that the target table matches the source schema")
        return b.hex()

    return Codec(col, "BLOB", "bytes", lambda v: f"CAST('{hexed(v)}' AS BLOB)",
                 lambda v: COPY_NULL if v is None else f'"{hexed(v)}"',
                 lambda v: bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else bytes.fromhex(str(v)),
                 coerce=_as_bytes)


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------
Rule = Callable[[ColumnDef, ServerFeatures], Codec]

RULES: dict[str, Rule] = {
    **{name: _integer for name in (*INT_FAMILIES, *INT_SYNONYMS)},
    "bit": _bit,
    "year": _year,
    **{name: _boolean for name in BOOLEAN_NAMES},
    **{name: _decimal for name in DECIMAL_NAMES},
    "float": lambda c, f: _floating(c, f, single=True),
    "double": lambda c, f: _floating(c, f, single=False),
    "real": lambda c, f: _floating(c, f, single=False),
    "date": _date,
    "datetime": _datetime,
    "timestamp": _timestamp,
    "time": _time,
    "char": _varchar, "varchar": _varchar,
    **{name: _clob for name in TEXT_LOBS},
    "enum": _enum, "set": _set,
    "json": _json,
    **{name: _blob for name in BINARY_TYPES}, "geometry": _blob,
}


def codec(col: ColumnDef, features: ServerFeatures, native_integers: bool = False) -> Codec:
    """The codec of a source column; TypeError for a type Cynomys does not know.

    ``native_integers`` ([target] url option ``integers=native``) keeps
    signed integers at their source width and refuses the one value MonetDB
    reserves for NULL (TINYINT -128, ..., BIGINT -2^63) instead of widening."""
    if native_integers and int_family(col.base_type) is not None:
        return _integer(col, features, native=True)
    rule = RULES.get(col.base_type)
    if rule is None:
        raise TypeError(f"column {col.name!r} has source type {col.type!r}, which has no MonetDB mapping")
    return rule(col, features)


#: (old family, new family) pairs a type change can do with CAST on the
#: server and get what the source got; any other change is refused (skip it
#: and re-snapshot the table): MonetDB writes floats and temporals as text
#: differently from MySQL, reads text as BLOB hex, and converts temporals
#: between zones in its own session's zone, not the source's.
CASTABLE: frozenset[tuple[str, str]] = frozenset({
    ("int", "int"), ("int", "decimal"), ("int", "float"), ("int", "text_number"), ("int", "text"),
    ("decimal", "decimal"), ("decimal", "text_number"), ("decimal", "text"),
    ("text_number", "decimal"), ("text_number", "text_number"), ("text_number", "text"),
    ("float", "float"),
    ("text", "text"), ("text", "int"), ("text", "text_number"),
    ("date", "date"), ("date", "datetime"), ("datetime", "datetime"), ("datetime", "date"),
    ("timestamptz", "timestamptz"),
    ("microseconds", "microseconds"),
    ("bytes", "bytes"),
})


# --------------------------------------------------------------------------
# Reading a table MonetDB has but Cynomys did not describe
# --------------------------------------------------------------------------
#: MonetDB type name (sys.columns.type) -> source type text to decode with,
#: for columns without a ``cynomys:`` comment.
NATIVE_SOURCE: Mapping[str, str] = {
    "tinyint": "tinyint", "smallint": "smallint", "int": "int", "bigint": "bigint", "hugeint": "bigint unsigned",
    "real": "float", "double": "double", "date": "date", "timestamp": "datetime(6)",
    "timestamptz": "timestamp(6)", "varchar": "longtext", "char": "longtext", "clob": "longtext",
    "json": "json", "blob": "longblob", "boolean": "tinyint",
}


def native_source_type(monet_type: str, digits: int, scale: int) -> str:
    """A source type that decodes a MonetDB column's values faithfully."""
    if monet_type == "decimal":
        return f"decimal({digits},{scale})"
    return NATIVE_SOURCE.get(monet_type, "longtext")


def comment_for(col: ColumnDef) -> str:
    return source_type_comment(col.type)
