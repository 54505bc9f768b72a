"""A table as information_schema describes it -> the binlog decoder's terms.

READ changes travel next to the binlog's own row changes of the same table
and the applier requires one shape per table in a flush, so a snapshot's
``TableSchema`` must equal the one the row decoder builds from TABLE_MAP
(``parser.rows.column_defs``): column order, type text (no display widths,
'bigint unsigned', 'longtext' for a MariaDB JSON), ``nullable`` left at its
default, the primary key in key order.  Row values are converted from what
pymysql returns into the value domain of ``core.model`` (the table there):

=================  ===============================================
column             pymysql gives          -> model value
=================  ===============================================
TIMESTAMP          naive UTC datetime     -> UTC-aware datetime
                   (the session runs with time_zone '+00:00')
DATE/DATETIME/     str for zero dates     -> RawTemporal
TIMESTAMP
BIT(n)             bytes (big-endian)     -> int
FLOAT              double of CAST(AS DOUBLE) -> the single-precision value
BINARY/BLOB        bytes (a str never)    -> bytes
=================  ===============================================
"""
from __future__ import annotations

import datetime
import ipaddress
import re
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, cast

from cynomys.core.model import ColumnDef, RawTemporal, Row, TableSchema, Value
from cynomys.core.sourcetypes import BINARY_OF_SOURCE_TYPE, BINARY_TYPES, INT_FAMILIES, SPATIAL_TYPES, vector_type
from cynomys.snapshot.errors import SnapshotError

# Types whose binlog image the row decoder reads as something else than the
# SQL value: none left (MariaDB's INET4/INET6/UUID, binary in the binlog and
# text in a SELECT, are converted to the binlog's bytes by _binary).
_UNSUPPORTED: tuple[str, ...] = ()
_UTC = datetime.timezone.utc


def normalize_type(column_type: str) -> str:
    """information_schema COLUMN_TYPE -> the decoder's type text
    ('int(11) unsigned zerofill' -> 'int unsigned', 'year(4)' -> 'year',
    'float(7,3)' -> 'float', 'point' -> 'geometry')."""
    t = column_type.strip()
    low = t.lower()
    base = re.split(r"[(\s]", low, maxsplit=1)[0]
    if base in ("enum", "set"):
        return base + t[len(base):]  # member text keeps its case
    low = low.replace(" zerofill", "")
    unsigned = " unsigned" in low
    if base in INT_FAMILIES:
        return base + (" unsigned" if unsigned else "")
    if base in ("float", "double", "real"):
        return "double" if base == "real" else base
    if base == "year":
        return "year"
    if base in SPATIAL_TYPES:
        return "geometry"
    if base in BINARY_OF_SOURCE_TYPE:
        return BINARY_OF_SOURCE_TYPE[base]
    if base == "vector":
        m = re.match(r"vector\((\d+)\)", low)
        return vector_type(int(m.group(1)) if m else 0)
    if base in ("decimal", "numeric"):
        m = re.match(r"\w+\((\d+)(?:,(\d+))?\)", low)
        p, s = (m.group(1), m.group(2) or "0") if m else ("10", "0")
        return f"decimal({p},{s})" + (" unsigned" if unsigned else "")
    return low


def _timestamp(v: Any) -> Value:
    if isinstance(v, datetime.datetime):
        return v.replace(tzinfo=_UTC)
    return RawTemporal(v) if isinstance(v, str) else v


def _temporal(v: Any) -> Value:
    return RawTemporal(v) if isinstance(v, str) else v


def _bit(v: Any) -> Value:
    return int.from_bytes(v, "big") if isinstance(v, (bytes, bytearray)) else v


_F32 = struct.Struct("<f")


def _float(v: Any) -> Value:
    return _F32.unpack(_F32.pack(v))[0] if isinstance(v, float) else v  # type: ignore[no-any-return]


_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _binary(v: Any) -> Value:
    """A binary column's value.  The driver gives bytes for every binary
    type; text only for MariaDB's INET4, INET6 and UUID, whose binlog image
    (the model value, core/sourcetypes.py BINARY_OF_SOURCE_TYPE) is the
    address in network order and the UUID's 16 bytes in text order."""
    if not isinstance(v, str):
        return cast(Value, v)
    if ":" in v:
        return ipaddress.IPv6Address(v).packed
    if _UUID_TEXT.fullmatch(v):
        return uuid.UUID(v).bytes
    if v.count(".") == 3:
        return ipaddress.IPv4Address(v).packed
    return v.encode()


_CONVERT: dict[str, Callable[[Any], Value]] = {
    "timestamp": _timestamp, "date": _temporal, "datetime": _temporal, "bit": _bit, "float": _float,
    **dict.fromkeys(BINARY_TYPES, _binary), "geometry": _binary,
}


def row_converter(columns: Sequence[ColumnDef], done: frozenset[str] = frozenset()) -> Callable[[Sequence[Any]], Row]:
    """A function turning one driver row into a model row; ``done``: base
    types the driver already gives as model values (source.py ``MODEL_TYPES``)."""
    convs = [(i, _CONVERT[c.base_type]) for i, c in enumerate(columns)
             if c.base_type in _CONVERT and c.base_type not in done]
    if not convs:
        return tuple

    def convert(raw: Sequence[Any]) -> Row:
        out = list(raw)
        for i, f in convs:
            if out[i] is not None:
                out[i] = f(out[i])
        return tuple(out)

    return convert


def convert_rows(convert: Callable[[Sequence[Any]], Row], raw: Iterable[tuple[Any, ...]]) -> tuple[Row, ...]:
    """Driver rows as model rows by ``convert`` (a ``row_converter``); when
    that is ``tuple`` (nothing to convert) the driver's tuples are the rows."""
    return tuple(raw) if convert is tuple else tuple(map(convert, raw))


@dataclass(frozen=True)
class TableInfo:
    """What a snapshot needs to know about a source table."""

    schema: TableSchema
    engine: str
    rows_estimate: int
    avg_row_bytes: int = 0     # information_schema AVG_ROW_LENGTH (0: unknown)

    @property
    def name(self) -> str:
        return self.schema.name


def whole_column_indexes(parts: Sequence[tuple[str, str | None, bool, str]]) -> tuple[tuple[str, ...], ...]:
    """information_schema.STATISTICS rows (INDEX_NAME, COLUMN_NAME, has a
    SUB_PART, INDEX_TYPE), each index's in SEQ_IN_INDEX order -> the
    indexes on whole columns, each its column names, in the rows' order.
    An index with a prefix part, an expression part (no COLUMN_NAME, MySQL
    8) or a type other than B-tree/hash is left out: a target could not
    build it the same way."""
    names: dict[str, list[str] | None] = {}
    for index, column, prefix, kind in parts:
        cols = names.setdefault(index, [])
        if cols is None:
            continue
        if column is None or prefix or kind.upper() not in ("BTREE", "HASH"):
            names[index] = None
        else:
            cols.append(column)
    return tuple(dict.fromkeys(tuple(cols) for cols in names.values() if cols))  # one of two the same


def table_info(database: str, table: str, columns: Sequence[tuple[str, str]], primary_key: Sequence[str],
               engine: str, rows_estimate: int, avg_row_bytes: int = 0,
               indexes: tuple[tuple[str, ...], ...] = ()) -> TableInfo:
    """``columns`` as (COLUMN_NAME, COLUMN_TYPE) in ORDINAL_POSITION order,
    ``primary_key`` in key order, ``indexes`` the secondary indexes of a
    table without one (``TableSchema.indexes``)."""
    defs = []
    for name, ctype in columns:
        base = re.split(r"[(\s]", ctype.strip().lower(), maxsplit=1)[0]
        if base in _UNSUPPORTED:
            raise SnapshotError(
                f"column {database}.{table}.{name} has type {ctype}, which a snapshot cannot read in the "
                "binlog's value form",
                hint=f"leave {database}.{table} out of the snapshot (--tables), or change the column type")
        defs.append(ColumnDef(name, normalize_type(ctype)))
    return TableInfo(TableSchema(database, table, tuple(defs), tuple(primary_key), indexes), engine, rows_estimate,
                     avg_row_bytes)
