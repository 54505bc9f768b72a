"""The canonical row hash (verify/checksum.py) written in MariaDB/MySQL SQL.

One rendering serves both ends of a verification: the producer selects a
chunk as (key, row hash) pairs instead of whole rows (verify/coordinator.py:
a few bytes a row cross the wire and nothing is rendered or hashed in
Python), and the ColumnStore/MariaDB target sums the same expression over a
key range (targets/columnstore/verify.py).

A type is here only when the server's text for it *is* the canonical text:
FLOAT and DOUBLE are missing on purpose (their canonical text is Python's
shortest round-trip repr(), which the server does not print: '1e16' vs
'1e+16'), so a table with such a column is hashed in Python on both sides.
Zero and invalid dates (``RawTemporal`` in the model, a month or day of
0) render as the server's own text of them, which is what the model holds.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

from cynomys.core.dialect import MARIADB
from cynomys.core.model import ColumnDef, TableSchema
from cynomys.core.sourcetypes import BOOLEAN_NAMES, DECIMAL_NAMES, INT_FAMILIES, INT_SYNONYMS

_SCALE = re.compile(r"\(\s*\d+\s*,\s*(\d+)\s*\)")
_INT = "CAST({c} AS CHAR)"
# A DATETIME/TIMESTAMP the model holds as a datetime (valid year, month and
# day) renders with microseconds; any other (a zero date) is the model's
# RawTemporal, the server's text.
_DATETIME = ("IF(YEAR({c}) > 0 AND MONTH({c}) > 0 AND DAY({c}) > 0, DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f'), "
             "CAST({c} AS CHAR))")

#: Source base type -> SQL giving the canonical text of a non-NULL value.
SQL_TEXT: dict[str, str] = {
    **{t: _INT for t in (*INT_FAMILIES, *INT_SYNONYMS, *BOOLEAN_NAMES)},
    "bit": "CAST(CAST({c} AS UNSIGNED) AS CHAR)",
    "year": "CAST({c} + 0 AS CHAR)",
    # {s}: the source scale (a target column may keep fewer digits: ColumnStore's DECIMAL(38, 3))
    **dict.fromkeys(DECIMAL_NAMES, "CAST(CAST({c} AS DECIMAL(65, {s})) AS CHAR)"),
    "date": "CAST({c} AS CHAR)",
    "datetime": _DATETIME,
    "timestamp": _DATETIME,   # the session runs in UTC
    "time": "CAST(ROUND(TIME_TO_SEC({c}) * 1000000) AS CHAR)",
    **{t: "LOWER(HEX({c}))" for t in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")},
    **{t: "CONVERT({c} USING utf8mb4)" for t in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                                                 "enum", "set", "json")},
}


def row_hash_sql(columns: Sequence[ColumnDef], quote: Callable[[str], str] = MARIADB.ident) -> str | None:
    """The expression of a row's hash (an unsigned 64-bit integer), or None
    when a column's type has no exact SQL rendering."""
    parts = []
    for col in columns:
        template = SQL_TEXT.get(col.base_type)
        if template is None:
            return None
        m = _SCALE.search(col.type)
        text = "CAST(" + template.format(c=quote(col.name), s=int(m.group(1)) if m else 0) + " AS BINARY)"
        # CONCAT is NULL when the value is: NULL hashes as the byte 0xFF.
        parts.append(f"IFNULL(CONCAT(LENGTH({text}), ':', {text}), X'FF')")
    return f"CAST(CONV(LEFT(MD5(CONCAT({', '.join(parts)})), 16), 16, 10) AS UNSIGNED)"


def checksum_sql(schema: TableSchema) -> str | None:
    """``SELECT COUNT(*), SUM(row hash)`` of the canonical checksum, or None
    when a column's type has no exact SQL rendering here."""
    row_hash = row_hash_sql(schema.columns)
    if row_hash is None:
        return None
    return f"SELECT COUNT(*), SUM({row_hash}) FROM {MARIADB.table(schema.database, schema.table)}"
