"""Chunk queries: the next N rows in primary-key order after a key.

A chunk is ``SELECT cols FROM t WHERE key > last ORDER BY key LIMIT n``.
On a composite key ``(a, b, c) > (x, y, z)`` is the exact condition, but
MariaDB does not turn a row-constructor comparison into an index range (it
scans the primary key from its start: every chunk would cost O(offset)).  So
the same condition is also written as the disjunction the range optimizer
understands::

    (a, b, c) > (x, y, z) AND (a > x OR (a = x AND b > y) OR (a = x AND b = y AND c > z))

which reads exactly the chunk's rows from the index (measured on MariaDB
10.11: Handler_read_next = chunk size, instead of the offset).

FLOAT columns are read as ``CAST(col AS DOUBLE)``: the text the server
sends for a FLOAT has six significant digits, which does not identify the
stored single-precision value; the double does, exactly.

Last keys are kept as the driver returned them (they go back as query
parameters) and persisted as tagged JSON (``encode_key``/``decode_key``).
"""
from __future__ import annotations

import base64
import datetime
import decimal
from dataclasses import dataclass
from typing import Any, Sequence

from cynomys.core.dialect import MARIADB
from cynomys.core.model import ColumnDef, Value

#: A source (MariaDB/MySQL) identifier in backquotes, backquotes doubled.
quote_ident = MARIADB.ident


def _pct(sql: str) -> str:
    # The driver formats the statement with ``%``: literal percent signs (in
    # a name or a WHERE clause such as LIKE 'a%') must be doubled.
    return sql.replace("%", "%%")


@dataclass(frozen=True)
class ChunkQuery:
    sql: str
    params: tuple[Any, ...]


def select_list(columns: Sequence[ColumnDef]) -> str:
    out = []
    for c in columns:
        q = _pct(quote_ident(c.name))
        out.append(f"CAST({q} AS DOUBLE)" if c.base_type == "float" else q)
    return ", ".join(out)


def key_condition(key: Sequence[str], after: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
    """``key > after`` as SQL the range optimizer can use, and its parameters."""
    if len(key) != len(after):
        raise ValueError(f"key {tuple(key)} has {len(key)} columns, the last key {tuple(after)!r} {len(after)}")
    cols = [_pct(quote_ident(k)) for k in key]
    if len(cols) == 1:
        return f"{cols[0]} > %s", (after[0],)
    row = f"({', '.join(cols)}) > ({', '.join(['%s'] * len(cols))})"
    params: list[Any] = list(after)
    terms = []
    for i in range(len(cols)):
        eqs = [f"{cols[j]} = %s" for j in range(i)]
        terms.append("(" + " AND ".join([*eqs, f"{cols[i]} > %s"]) + ")" if eqs else f"{cols[i]} > %s")
        params.extend(after[:i + 1])
    return f"{row} AND ({' OR '.join(terms)})", tuple(params)


def key_at_most(key: Sequence[str], hi: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
    """``key <= hi`` as SQL the range optimizer can use as an upper bound
    (the row comparison plus its disjunction, as ``key_condition``)."""
    if len(key) != len(hi):
        raise ValueError(f"key {tuple(key)} has {len(key)} columns, the bound {tuple(hi)!r} {len(hi)}")
    cols = [_pct(quote_ident(k)) for k in key]
    if len(cols) == 1:
        return f"{cols[0]} <= %s", (hi[0],)
    row = f"({', '.join(cols)}) <= ({', '.join(['%s'] * len(cols))})"
    params: list[Any] = list(hi)
    terms = []
    for i in range(len(cols)):
        eqs = [f"{cols[j]} = %s" for j in range(i)]
        last = "<=" if i == len(cols) - 1 else "<"
        terms.append("(" + " AND ".join([*eqs, f"{cols[i]} {last} %s"]) + ")" if eqs else f"{cols[i]} {last} %s")
        params.extend(hi[:i + 1])
    return f"{row} AND ({' OR '.join(terms)})", tuple(params)


def build_range_query(database: str, table: str, columns: Sequence[ColumnDef], key: Sequence[str],
                      after: Sequence[Any] | None, upto: Sequence[Any], where: str = "") -> ChunkQuery:
    """The rows with ``after < key <= upto`` (``after`` None: from the
    start), in key order: a chunk whose end a boundary query fixed
    (``build_boundary_query``), so rows inserted into it meanwhile are read
    too and no LIMIT can cut it short."""
    conds: list[str] = []
    params: list[Any] = []
    if after is not None:
        cond, p = key_condition(key, after)
        conds.append(cond)
        params.extend(p)
    cond, p = key_at_most(key, upto)
    conds.append(cond)
    params.extend(p)
    if where.strip():
        conds.append(f"({_pct(where.strip())})")
    sql = (f"SELECT {select_list(columns)} FROM {_pct(quote_ident(database))}.{_pct(quote_ident(table))}"
           f" WHERE {' AND '.join(conds)} ORDER BY {', '.join(_pct(quote_ident(k)) for k in key)}")
    return ChunkQuery(sql, tuple(params))


def build_boundary_query(database: str, table: str, columns: Sequence[ColumnDef], key: Sequence[str],
                         after: Sequence[Any] | None, rows: int, where: str = "") -> ChunkQuery:
    """The key of the ``rows``-th row after ``after`` (none: fewer rows
    are left): where a chunk of ``rows`` rows ends, found without sending
    them, so the next chunk's read can start before this one's."""
    by_name = {c.name: c for c in columns}
    q = build_chunk_query(database, table, [by_name[k] for k in key], key, after, None, where)
    return ChunkQuery(q.sql + f" LIMIT 1 OFFSET {max(0, int(rows) - 1)}", q.params)


# -- key order (verify/checksum.py, "Key order") -----------------------------
#: Character sets whose encoded bytes sort as their code points, i.e. as
#: Python sorts the decoded str (UTF-8; ASCII is a part of it).
_CODE_POINT_CHARSETS = frozenset({"utf8mb4", "utf8mb3", "utf8", "ascii"})

#: information_schema columns that decide how MariaDB/MySQL compares a
#: column: (COLUMN_NAME, DATA_TYPE, CHARACTER_SET_NAME, COLLATION_NAME).
COLUMN_ORDER_SQL = ("SELECT COLUMN_NAME, DATA_TYPE, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s")


def byte_ordered(data_type: str, charset: str | None, collation: str | None) -> bool:
    """Does MariaDB/MySQL compare and sort this column as verify compares key
    values (Python's order: text by its UTF-8 bytes, no padding)?

    Numbers, temporals and binary strings (no collation): yes.  Text: only
    in a NO PAD binary collation of a UTF-8 charset (``utf8mb4_nopad_bin``,
    MySQL's ``utf8mb4_0900_bin``).  Not ``utf8mb4_bin``: it is PAD SPACE
    (``'a' = 'a '``, ``'a\t' < 'a'``).  ENUM and SET sort by member
    number: no."""
    if data_type.lower() in ("enum", "set"):
        return False
    if not collation:
        return True
    c, cs = collation.lower(), (charset or "").lower()
    return cs in _CODE_POINT_CHARSETS and (c.endswith("_nopad_bin") or c.endswith("_0900_bin"))


def unordered_columns(info_rows: Sequence[Sequence[Any]], names: Sequence[str]) -> dict[str, str]:
    """Of the columns ``names`` (a key), those not ``byte_ordered``, each with
    what makes it so (its collation, or its type), from ``COLUMN_ORDER_SQL``
    rows; names match case-insensitively, as MariaDB's do."""
    by_name = {str(r[0]).lower(): r for r in info_rows}
    out: dict[str, str] = {}
    for n in names:
        r = by_name.get(n.lower())
        if r is None:
            continue
        data_type, charset, collation = str(r[1] or ""), r[2], r[3]
        if byte_ordered(data_type, None if charset is None else str(charset),
                        None if collation is None else str(collation)):
            continue
        if data_type.lower() in ("enum", "set"):
            out[n] = f"{data_type.upper()} (sorted by member number)"
        else:
            out[n] = f"collation {collation}"
    return out


def byte_key_sql(quoted: str) -> str:
    """A text column as its UTF-8 bytes: compared and sorted byte by byte,
    whatever its charset and collation.  (No index on the column serves a
    comparison of this expression: see verify/coordinator.py for the cost.)"""
    return f"CAST(CONVERT({quoted} USING utf8mb4) AS BINARY)"


def byte_key_param(v: Any) -> Any:
    """A key value compared with ``byte_key_sql``: text as its UTF-8 bytes
    (the driver sends bytes as a binary string, never in a collation)."""
    return v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v


def build_chunk_query(database: str, table: str, columns: Sequence[ColumnDef], key: Sequence[str],
                      after: Sequence[Any] | None, limit: int | None, where: str = "") -> ChunkQuery:
    """The chunk after ``after`` (None: the first chunk).  A keyless table
    (``key`` empty) is read whole: ``limit`` must be None then."""
    if not key and (after is not None or limit is not None):
        raise ValueError("a table without a primary key is read whole, in one chunk")
    conds: list[str] = []
    params: tuple[Any, ...] = ()
    if after is not None:
        cond, params = key_condition(key, after)
        conds.append(cond)
    if where.strip():
        conds.append(f"({_pct(where.strip())})")
    sql = f"SELECT {select_list(columns)} FROM {_pct(quote_ident(database))}.{_pct(quote_ident(table))}"
    if conds:
        sql += " WHERE " + " AND ".join(conds)
    if key:
        sql += " ORDER BY " + ", ".join(_pct(quote_ident(k)) for k in key)
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return ChunkQuery(sql, params)


# -- last keys as JSON -------------------------------------------------------
def encode_value(v: Any) -> list[Any]:
    """A driver value -> ``[tag, json value]`` (exact round trip)."""
    if isinstance(v, bool) or v is None:
        raise TypeError(f"not a key value: {v!r}")
    if isinstance(v, int):
        return ["int", str(v)]
    if isinstance(v, float):
        return ["float", repr(v)]
    if isinstance(v, decimal.Decimal):
        return ["dec", str(v)]
    if isinstance(v, str):
        return ["str", str(v)]
    if isinstance(v, (bytes, bytearray)):
        return ["bytes", base64.b64encode(bytes(v)).decode("ascii")]
    if isinstance(v, datetime.datetime):
        return ["dt", v.isoformat()]
    if isinstance(v, datetime.date):
        return ["date", v.isoformat()]
    if isinstance(v, datetime.timedelta):
        return ["td", str((v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds)]
    raise TypeError(f"cannot persist a key value of type {type(v).__name__}: {v!r}")


_DECODE: dict[str, Any] = {
    "int": int,
    "float": float,
    "dec": decimal.Decimal,
    "str": str,
    "bytes": lambda s: base64.b64decode(s),
    "dt": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "td": lambda s: datetime.timedelta(microseconds=int(s)),
}


def decode_value(tagged: Sequence[Any]) -> Value:
    tag, raw = tagged
    return _DECODE[tag](raw)  # type: ignore[no-any-return]


def encode_key(key: Sequence[Any] | None) -> list[list[Any]] | None:
    return None if key is None else [encode_value(v) for v in key]


def decode_key(data: Sequence[Sequence[Any]] | None) -> tuple[Value, ...] | None:
    return None if data is None else tuple(decode_value(t) for t in data)
