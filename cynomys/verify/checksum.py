"""The canonical checksum of a set of rows, and key ranges, for `cynomys verify`.

One definition, computed on both sides of the wire: by the producer over a
chunk of source rows (brought to their state at the chunk's place in the
stream) and by the applier over the same key range read back from the
target.  Both hold rows in the model's value domain (core/model.py), and
every target's ``fetch_rows`` returns that domain, so hashing in Python
gives one answer wherever the rows live.

Canonical form: each value is rendered as text by its *source* column type
(not by whichever Python type a driver returned, so a target that stores a
YEAR as a SMALLINT or a FLOAT as a double still renders the same text):

=====================  ============================================
integers, BIT, YEAR    decimal digits
DECIMAL(p,s)           the exact value with exactly s decimals
FLOAT                  repr() of the single-precision value
DOUBLE                 repr() of the double
DATE                   YYYY-MM-DD (zero dates: MySQL's own text)
DATETIME, TIMESTAMP    YYYY-MM-DD HH:MM:SS.ffffff (TIMESTAMP in UTC)
TIME                   signed microseconds
binary types           lower-case hex
everything else        the text itself
NULL                   a marker no value renders to
=====================  ============================================

A row hashes to the first 8 bytes (big-endian) of the MD5 of its value
texts, each prefixed by its length in bytes as decimal text and ':'
(``5:hello``), NULL as ``\xff`` without a prefix; a set
of rows to (row count, sum of the row hashes mod 2^64).  The sum does not
depend on row order (every target returns rows in its own order) and is a
multiset hash, so it also fits tables without a primary key.  MD5 (not for
security: a checksum of data the user owns on both sides) and decimal
length prefixes because SQL engines have both: a target may compute the
same value in SQL (targets/<kind>/verify.py).

Key order.  A key range (``KeyRange``) is a set of keys only once both
sides agree on what ``<`` means.  It means one thing everywhere: Python's
order of the model's key values, where text compares by code points, which
is the order of its UTF-8 bytes (and bytes by their bytes), with no
padding: ``'B' < 'a'``, ``'a' < 'a '``, ``'f' < 'é'``.  A collation's order
(MariaDB's default utf8mb4_general_ci says ``'a' < 'B'`` and ``'a' = 'a '``)
is never used to cut or test a range: a range cut in one order and purged
in another deletes rows outside it (the bug this replaced).  So a source
key column whose collation is not that order is read with ``CAST(... AS
BINARY)`` (verify/coordinator.py), a MariaDB target compares such a column
the same way, DuckDB with ``COLLATE "binary"``; Spark, MonetDB and the
Python fallback compare text by its bytes already.
"""
from __future__ import annotations

import datetime
import decimal
import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from cynomys.core.model import ColumnDef, Row, TableSchema, Value
from cynomys.core.sourcetypes import BINARY_TYPES, BOOLEAN_NAMES, DECIMAL_NAMES, INT_FAMILIES, INT_SYNONYMS
from cynomys.snapshot.chunker import decode_key, encode_key

MASK = (1 << 64) - 1
_NULL = b"\xff"  # not valid UTF-8: no rendered value equals it

#: Types whose values render as decimal digits.
_INTS = frozenset({*INT_FAMILIES, *INT_SYNONYMS, *BOOLEAN_NAMES, "bit", "year"})
_SCALE = re.compile(r"\(\s*\d+\s*,\s*(\d+)\s*\)")


def _int(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return str(int.from_bytes(v, "big"))
    return str(int(v))


def _decimal(scale: int) -> Callable[[Any], str]:
    q = decimal.Decimal(1).scaleb(-scale)

    def render(v: Any) -> str:
        d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v))
        # 'f': never an exponent ('0E-30' is '0.000...0' in SQL too)
        return format(d.quantize(q, context=decimal.Context(prec=100)), "f")
    return render


def _single(v: Any) -> str:
    return repr(struct.unpack("<f", struct.pack("<f", float(v)))[0])


def _double(v: Any) -> str:
    return repr(float(v))


def _date(v: Any) -> str:
    return f"{v.year:04d}-{v.month:02d}-{v.day:02d}" if isinstance(v, datetime.date) else str(v)


def _datetime(v: Any) -> str:
    # Written out: strftime('%Y') does not pad years before 1000 on glibc.
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return (f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}."
                f"{v.microsecond:06d}")
    if isinstance(v, datetime.date):
        return _date(v) + " 00:00:00.000000"
    return str(v)


def _time(v: Any) -> str:
    if isinstance(v, datetime.timedelta):
        return str((v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds)
    if isinstance(v, datetime.time):
        return str(((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond)
    return str(v)


def _binary(v: Any) -> str:
    return (v.encode() if isinstance(v, str) else bytes(v)).hex()


def _text(v: Any) -> str:
    return bytes(v).decode("utf-8", "surrogateescape") if isinstance(v, (bytes, bytearray)) else str(v)


def renderer(col: ColumnDef) -> Callable[[Any], str]:
    """value -> canonical text, by the column's source type."""
    base = col.base_type
    if base in _INTS:
        return _int
    if base in DECIMAL_NAMES:
        m = _SCALE.search(col.type)
        return _decimal(int(m.group(1)) if m else 0)
    if base == "float":
        return _single
    if base in ("double", "real"):
        return _double
    if base == "date":
        return _date
    if base in ("datetime", "timestamp"):
        return _datetime
    if base == "time":
        return _time
    if base in BINARY_TYPES:
        return _binary
    return _text


@dataclass(frozen=True)
class Checksum:
    count: int = 0
    hash: int = 0

    def __add__(self, other: Checksum) -> Checksum:
        return Checksum(self.count + other.count, (self.hash + other.hash) & MASK)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "hash": f"{self.hash:016x}"}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Checksum:
        return cls(int(d["count"]), int(str(d["hash"]), 16))


class RowHasher:
    """Hashes rows of one table shape."""

    def __init__(self, columns: Sequence[ColumnDef]) -> None:
        self.render = [renderer(c) for c in columns]

    def row(self, row: Sequence[Value]) -> int:
        parts = []
        for r, v in zip(self.render, row):
            if v is None:
                parts.append(_NULL)
            else:
                b = r(v).encode("utf-8", "surrogateescape")
                parts.append(b"%d:%s" % (len(b), b))
        return int.from_bytes(hashlib.md5(b"".join(parts), usedforsecurity=False).digest()[:8], "big")

    def rows(self, rows: Iterable[Sequence[Value]]) -> Checksum:
        n = total = 0
        for r in rows:
            total += self.row(r)
            n += 1
        return Checksum(n, total & MASK)


@dataclass(frozen=True)
class KeyRange:
    """Primary-key values ``lo < key <= hi`` (model values, compared in
    byte order: see "Key order" above, never in a collation's order);
    ``lo`` None: from the start, ``hi`` None: to the end.  A table without
    a key has one range, the whole table (both None)."""

    lo: tuple[Value, ...] | None = None
    hi: tuple[Value, ...] | None = None

    def contains(self, key: tuple[Value, ...]) -> bool:
        return (self.lo is None or _cmp_key(key) > _cmp_key(self.lo)) and \
            (self.hi is None or _cmp_key(key) <= _cmp_key(self.hi))

    def describe(self, key: Sequence[str] = ()) -> str:
        name = ", ".join(key) if key else "key"
        if self.lo is None and self.hi is None:
            return "whole table" if not key else f"all keys ({name})"
        lo = "" if self.lo is None else f"{_show(self.lo)} < "
        hi = "" if self.hi is None else f" <= {_show(self.hi)}"
        return f"{lo}({name}){hi}"

    def to_dict(self) -> dict[str, Any]:
        return {"lo": encode_key(self.lo), "hi": encode_key(self.hi)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KeyRange:
        return cls(decode_key(d.get("lo")), decode_key(d.get("hi")))


#: Source base types holding text: a key column of one of these types is
#: compared by a collation in SQL unless told otherwise (ENUM and SET sort
#: by member number in MariaDB: their text is compared instead).
TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})


def text_key_columns(schema: TableSchema) -> frozenset[str]:
    """The key columns of ``schema`` whose values are text."""
    by_name = {c.name: c for c in schema.columns}
    return frozenset(k for k in schema.key if k in by_name and by_name[k].base_type in TEXT_TYPES)


def key_predicate(key: Sequence[str], rng: KeyRange, quote: Callable[[str], str],
                  mark: Callable[[int], str], *, expr: Callable[[str, str], str] | None = None,
                  param: Callable[[str, Value], Any] | None = None) -> tuple[str, list[Any]]:
    """``lo < key <= hi`` as portable SQL: ``quote`` quotes a column name,
    ``mark(i)`` is the placeholder of parameter i; ('', []) for every row.
    The comparison is written out column by column (``a > x OR (a = x AND
    b > y)``), which every engine understands.

    The SQL must compare in byte order (``KeyRange``): ``expr(name,
    quoted)`` gives the expression compared for a column (e.g. ``CAST(..
    AS BINARY)`` for a text column in a collation) and ``param(name,
    value)`` the parameter it is compared with (e.g. the text's UTF-8
    bytes); by default the column and the value themselves."""
    conds: list[str] = []
    params: list[Any] = []
    cols = [quote(k) if expr is None else expr(k, quote(k)) for k in key]

    def value(i: int, v: Value) -> Any:
        return v if param is None else param(key[i], v)

    def greater(bound: tuple[Value, ...]) -> str:
        terms = []
        for i in range(len(key)):
            eqs = []
            for j in range(i):
                eqs.append(f"{cols[j]} = {mark(len(params))}")
                params.append(value(j, bound[j]))
            terms.append(" AND ".join([*eqs, f"{cols[i]} > {mark(len(params))}"]))
            params.append(value(i, bound[i]))
        return "(" + " OR ".join(f"({t})" for t in terms) + ")"

    if rng.lo is not None:
        conds.append(greater(rng.lo))
    if rng.hi is not None:
        conds.append("NOT " + greater(rng.hi))
    return " AND ".join(conds), params


def key_of(schema: TableSchema) -> Callable[[Sequence[Value]], tuple[Value, ...]]:
    """row -> its key tuple."""
    idx = schema.key_indexes()
    return lambda r: tuple(r[i] for i in idx)


def sort_key(key: tuple[Value, ...]) -> tuple[Any, ...]:
    """A key as Python sorts it in byte order (``sorted(keys, key=sort_key)``)."""
    return _cmp_key(key)


def _show(key: tuple[Value, ...]) -> str:
    return repr(key[0]) if len(key) == 1 else "(" + ", ".join(repr(v) for v in key) + ")"


def _cmp_key(key: tuple[Value, ...]) -> tuple[Any, ...]:
    # Aware and naive datetimes do not compare in Python: keys compare as
    # naive UTC (the model's TIMESTAMP is UTC-aware, a driver's naive UTC).
    return tuple(v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
                 if isinstance(v, datetime.datetime) and v.tzinfo is not None else v for v in key)


def range_checksum(schema: TableSchema, rng: KeyRange, rows: Iterable[Row]) -> Checksum:
    """The checksum of the rows of ``rows`` whose key is in ``rng`` (the
    read-back path: every target can give its rows)."""
    hasher = RowHasher(schema.columns)
    idx = schema.key_indexes()
    if not idx:
        return hasher.rows(rows)
    return hasher.rows(r for r in rows if rng.contains(tuple(r[i] for i in idx)))
