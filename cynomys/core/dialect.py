"""SQL dialects as data: how each system spells identifiers and literals.

One ``Dialect`` value per system Cynomys writes SQL for (the source's
MariaDB/MySQL, and the targets).  A dialect is declared as the MariaDB one
with only what differs replaced (the sqlglot ``Generator`` / dlt
``DestinationCapabilitiesContext`` pattern): code takes a dialect and never
branches on a system's name.  Every quoter of identifiers in Cynomys is one
of these values' ``ident``.
"""
from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from cynomys.core.model import RawTemporal, Value
from cynomys.core.sourcetypes import datetime_text, time_text


def _hex_literal(b: bytes) -> str:
    return "X'" + b.hex() + "'"


@dataclass(frozen=True)
class Dialect:
    """How one SQL dialect spells identifiers and literals."""

    name: str
    #: Quote character of identifiers; doubled inside a name.
    ident_quote: str
    #: String literals: backslash is an escape character (MariaDB's default,
    #: MonetDB's unless it runs with raw_strings), so it is doubled.
    backslash_escapes: bool
    bytes_literal: Callable[[bytes], str]
    null_safe_eq: str  # operator for NULL-safe equality
    supports_limit_in_dml: bool
    upsert_keyword: str  # how a READ (upsert of a full row) is written; '' = none
    #: A quote inside a string literal is doubled; else backslash-escaped
    #: (Spark SQL reads 'it''s' as 'its').
    doubled_quotes: bool = True

    def ident(self, name: str) -> str:
        """An identifier, quoted (a quote character in it doubled)."""
        q = self.ident_quote
        return q + name.replace(q, q + q) + q

    def table(self, database: str, table: str) -> str:
        return f"{self.ident(database)}.{self.ident(table)}"

    def string(self, s: str) -> str:
        if self.backslash_escapes:
            s = s.replace("\\", "\\\\").replace("\0", "\\0")
        if self.doubled_quotes:
            return "'" + s.replace("'", "''") + "'"
        return "'" + s.replace("'", "\\'") + "'"

    def literal(self, v: Value) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "1" if v else "0"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, decimal.Decimal):
            # Positional notation: str() gives '1.23E-7' for small values,
            # which servers read as an (inexact) DOUBLE.
            return format(v, "f")
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, bytes):
            return self.bytes_literal(v)
        if isinstance(v, datetime.datetime):
            # TIMESTAMP (aware): rendered in UTC; sessions run with time_zone '+00:00'.
            return self.string(datetime_text(v, always_fraction=False))
        if isinstance(v, datetime.date):
            return self.string(v.isoformat())
        if isinstance(v, datetime.timedelta):
            return self.string(time_text(v, always_fraction=False))
        if isinstance(v, (str, RawTemporal)):
            return self.string(str(v))
        raise TypeError(f"cannot render {type(v).__name__} as SQL")

    def keys_in(self, columns: Sequence[str], keys: Sequence[Sequence[Value]],
                literal: Callable[[Value], str] | None = None) -> str:
        """A WHERE condition true for the rows whose ``columns`` hold one of
        ``keys`` (a key never matches NULL, as with ``IN``), each value
        written by ``literal`` (default: this dialect's).  One key of
        several columns is spelled ``a = 1 AND b = 2``, not ``(a, b) IN ((1,
        2))``: MariaDB 10.11 resolves a one-row row-value IN in a DELETE by a
        full table scan, not the primary key (884,811 rows examined to delete
        one lineitem row of a 1M-row table; two or more rows use the key)."""
        lit = literal or self.literal
        cols = [self.ident(c) for c in columns]
        if len(cols) == 1:
            return f"{cols[0]} IN (" + ", ".join(lit(k[0]) for k in keys) + ")"
        if len(keys) == 1:
            return " AND ".join(f"{c} = {lit(v)}" for c, v in zip(cols, keys[0]))
        return ("(" + ", ".join(cols) + ") IN ("
                + ", ".join("(" + ", ".join(lit(v) for v in k) + ")" for k in keys) + ")")


#: The source's dialect (MariaDB/MySQL), and ColumnStore-on-MariaDB's.
MARIADB = Dialect(
    name="mariadb", ident_quote="`", backslash_escapes=True,
    bytes_literal=lambda b: _hex_literal(b) if b else "''",
    null_safe_eq="<=>", supports_limit_in_dml=True, upsert_keyword="REPLACE",
)
#: MonetDB reads backslash escapes in '...' literals unless started with raw_strings.
MONETDB = replace(
    MARIADB, name="monetdb", ident_quote='"', bytes_literal=lambda b: "BLOB '" + b.hex() + "'",
    null_safe_eq="IS NOT DISTINCT FROM", supports_limit_in_dml=False, upsert_keyword="",
)
#: Spark SQL (Iceberg tables).
SPARK = replace(
    MARIADB, name="spark", bytes_literal=_hex_literal, supports_limit_in_dml=False, upsert_keyword="",
    doubled_quotes=False,
)
#: DuckDB: standard strings (a backslash is itself); a VARCHAR '\xHH' casts to BLOB.
DUCKDB = replace(
    MONETDB, name="duckdb", backslash_escapes=False,
    bytes_literal=lambda b: "'" + "".join(f"\\x{x:02X}" for x in b) + "'::BLOB",
)
DIALECTS: dict[str, Dialect] = {d.name: d for d in (MARIADB, MONETDB, SPARK, DUCKDB)}
