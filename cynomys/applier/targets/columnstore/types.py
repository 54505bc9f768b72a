"""MariaDB-family target data: engine profiles, type mapping, value codecs.

What differs between storage engines of a MariaDB target (ColumnStore,
InnoDB, Aria) is an ``EngineProfile``: plain data the ColumnStore target reads
instead of branching on the engine's name.  Values travel to the server as
``LOAD DATA`` text (``encode_field``) or SQL literals (``literal``) and come
back through ``fetch_plan`` into the Python domain of ``core.model``.
"""
from __future__ import annotations

import datetime
import decimal
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from cynomys.core import compiled
from cynomys.core.dialect import MARIADB
from cynomys.core.model import ColumnDef, RawTemporal, Row, Value
from cynomys.core.sourcetypes import datetime_text, members, time_text, type_params

TypeRule = Callable[[ColumnDef], str]

# --------------------------------------------------------------------------
# ColumnStore type rules (source type -> a type ColumnStore has)
# --------------------------------------------------------------------------
def _cs_bit(c: ColumnDef) -> str:
    # BIGINT UNSIGNED on ColumnStore stops at 2^64-3 (two values mark
    # NULL/empty), so only BIT(64) needs the 20-digit DECIMAL.
    bits = (type_params(c.type) or [1])[0]
    return "bigint unsigned" if bits < 64 else "decimal(20,0)"


def _cs_enum(c: ColumnDef) -> str:
    return f"varchar({max([len(m) for m in members(c.type)] + [1])})"


def _cs_set(c: ColumnDef) -> str:
    ms = members(c.type)
    return f"varchar({max(sum(len(m) for m in ms) + len(ms) - 1, 1)})"


def _cs_decimal(c: ColumnDef) -> str:
    # ColumnStore DECIMAL holds at most 38 digits.  Keep the integer digits
    # and as many fraction digits as fit; a value that then does not fit is
    # rejected loudly by the load (its warning), never rounded silently.
    p, s = (type_params(c.type) + [10, 0])[:2]
    if p <= 38:
        return c.type
    s = max(0, min(s, 38 - (p - s)))
    return f"decimal(38,{s})" + (" unsigned" if c.unsigned else "")


def _cs_varchar(c: ColumnDef) -> str:
    # ColumnStore VARCHAR stops at 8000 bytes: 2000 utf8mb4 characters.
    n = (type_params(c.type) or [1])[0]
    return c.type if n <= 2000 else "text"


def _cs_varbinary(c: ColumnDef) -> str:
    n = (type_params(c.type) or [1])[0]
    return c.type if n <= 8000 else "blob"


def _binary_as_varbinary(c: ColumnDef) -> str:
    # Values arrive padded to n bytes, so VARBINARY(n) holds them exactly.
    return f"varbinary({(type_params(c.type) or [1])[0]})"


COLUMNSTORE_TYPES: dict[str, TypeRule] = {
    "bit": _cs_bit,
    "year": lambda c: "smallint",
    "enum": _cs_enum,
    "set": _cs_set,
    "json": lambda c: "longtext",
    "binary": _binary_as_varbinary,
    "decimal": _cs_decimal,
    "varchar": _cs_varchar,
    "varbinary": _cs_varbinary,
    "geometry": lambda c: "longblob",
}


@dataclass(frozen=True)
class EngineProfile:
    """How one storage engine of the target holds a replica."""

    #: Declare the source's primary key (ColumnStore has no indexes at all).
    declare_keys: bool = True
    #: Source base type -> rule giving the target type; others keep their type.
    types: Mapping[str, TypeRule] = field(default_factory=dict)
    #: Table options after ENGINE=...  A binary, no-pad collation makes
    #: deletes match exactly the row that was sent ('a' is not 'A' or 'a ').
    table_options: str = "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin"
    #: DELETE ... LIMIT n works; otherwise count, delete all, re-insert the rest.
    delete_limit: bool = True
    #: ALTER TABLE ... MODIFY changes a column's type; otherwise the target
    #: copies through a new column (ColumnStore cannot change a type).
    modify_in_place: bool = True
    #: Delete the keys of inserted rows first, so a flush applied twice ends
    #: the same (needed where the data commit is not atomic with the state).
    delete_inserted_keys: bool = False
    #: Extra session settings for this engine.
    session_sql: tuple[str, ...] = ()
    #: Snapshot rows may load on a second connection beside the flush's
    #: transaction (columnstore/beside.py): the engine has row locks and
    #: transactions of its own per connection (InnoDB).
    loads_beside: bool = False

    def target_type(self, col: ColumnDef) -> str:
        rule = self.types.get(col.base_type)
        return rule(col) if rule is not None else col.type


INNODB = EngineProfile(loads_beside=True)
#: Aria has no row locks (a writer locks the table) and no transaction to
#: keep a second connection's load apart: nothing is loaded beside.
ARIA = EngineProfile(loads_beside=False)
COLUMNSTORE = EngineProfile(
    declare_keys=False,
    types=COLUMNSTORE_TYPES,
    delete_limit=False,
    modify_in_place=False,
    delete_inserted_keys=True,
    # Inside a transaction, LOAD DATA goes through ColumnStore's DML path and
    # rolls back with it; 'ALWAYS' would run cpimport outside the transaction.
    session_sql=("SET SESSION columnstore_use_import_for_batchinsert = 'ON'",),
)

#: [target] engine (lower case) -> profile; other engines use INNODB's.
PROFILES: dict[str, EngineProfile] = {"columnstore": COLUMNSTORE, "innodb": INNODB, "aria": ARIA}


# --------------------------------------------------------------------------
# Values -> LOAD DATA fields and SQL literals
# --------------------------------------------------------------------------
def value_text(v: Value) -> str:
    """A non-NULL, non-bytes value as MariaDB reads it from text."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, str)):  # str includes RawTemporal
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, decimal.Decimal):
        return format(v, "f")  # never '1E+5'
    if isinstance(v, datetime.datetime):
        return datetime_text(v)
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return time_text(v)
    raise TypeError(f"cannot send a {type(v).__name__} to MariaDB")


def _escape(raw: bytes) -> bytes:
    # FIELDS ESCAPED BY '\\': only the escape, field and line terminators
    # need escaping; every other byte (NUL included) is read as is.
    return raw.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n")


def encode_field(v: Value) -> bytes:
    """One LOAD DATA field (file read with CHARACTER SET binary)."""
    if v is None:
        return b"\\N"
    if isinstance(v, bytes):
        return _escape(v)
    return _escape(value_text(v).encode("utf-8"))


def encode_year(v: Value) -> bytes:
    # Text '0' means 2000 in a YEAR column; '0000' is year 0.
    return f"{v:04d}".encode() if isinstance(v, int) else encode_field(v)


#: Source base type -> field encoder where it differs from encode_field.
FIELD_ENCODERS: dict[str, Callable[[Value], bytes]] = {"year": encode_year}


def load_data_rows(rows: Sequence[Row], encoders: Sequence[Callable[[Value], bytes]]) -> bytes:
    """Row images as LOAD DATA lines, a field per encoder (``encode_field``
    or a ``FIELD_ENCODERS`` one).  Compiled (``_speedups.load_data_rows``:
    the common exact types written in C, anything else given to the
    column's encoder), else ``load_data_rows_pure``: the same bytes.  The
    rows of updates and deletes come this way; value by value in Python
    they were about a third of the applier's CPU on a large UPDATE."""
    ext = compiled.ext
    if ext is None:
        return load_data_rows_pure(rows, encoders)
    out: bytes = ext.load_data_rows(rows if type(rows) is list else list(rows), list(encoders), encode_field)
    return out


def load_data_rows_pure(rows: Sequence[Row], encoders: Sequence[Callable[[Value], bytes]]) -> bytes:
    """The reference of ``load_data_rows``."""
    return b"".join([b"\t".join([enc(v) for enc, v in zip(encoders, row)]) + b"\n" for row in rows])


def literal(v: Value) -> str:
    """A SQL literal for deletes and the INSERT fallback.  Floats are written
    as double literals (1.5e0) so they compare as doubles, not decimals."""
    if isinstance(v, float):
        text = repr(v)
        return text if "e" in text or "n" in text else text + "e0"
    return MARIADB.literal(v)


# --------------------------------------------------------------------------
# Target rows -> the Python domain
# --------------------------------------------------------------------------
_UTC = datetime.timezone.utc


def _date(v: Any) -> Value:
    if v is None:
        return None
    try:
        return datetime.date.fromisoformat(v)
    except ValueError:  # zero or partial date ('0000-00-00', '2020-00-10')
        return RawTemporal(v)


def _datetime(v: Any) -> Value:
    if v is None:
        return None
    try:
        return datetime.datetime.fromisoformat(v)
    except ValueError:
        return RawTemporal(v)


def _timestamp(v: Any) -> Value:
    out = _datetime(v)
    return out.replace(tzinfo=_UTC) if isinstance(out, datetime.datetime) else out


def _as_int(v: Any) -> Value:
    return None if v is None else int(v)


def _float32(v: Any) -> Value:
    # The column holds a single-precision value; CAST(... AS DOUBLE) brought
    # it exactly, and this keeps it a float32 even if the engine widened it.
    return None if v is None else struct.unpack("<f", struct.pack("<f", v))[0]


def _text(v: Any) -> Value:
    return v.decode("utf-8") if isinstance(v, bytes) else v


def _binary(v: Any) -> Value:
    return v.encode("utf-8") if isinstance(v, str) else v


#: Source base type -> (SELECT expression with {c} for the column, converter).
#: Temporal values come as text so zero dates survive; BIT as a number.
FETCH: dict[str, tuple[str, Callable[[Any], Value]]] = {
    "date": ("CAST({c} AS CHAR)", _date),
    "datetime": ("CAST({c} AS CHAR)", _datetime),
    "timestamp": ("CAST({c} AS CHAR)", _timestamp),
    "bit": ("CAST({c} AS UNSIGNED)", _as_int),
    "year": ("{c} + 0", _as_int),
    "float": ("CAST({c} AS DOUBLE)", _float32),
    "enum": ("{c}", _text), "set": ("{c}", _text), "json": ("{c}", _text),
    "binary": ("{c}", _binary), "varbinary": ("{c}", _binary), "tinyblob": ("{c}", _binary),
    "blob": ("{c}", _binary), "mediumblob": ("{c}", _binary), "longblob": ("{c}", _binary),
}


def fetch_plan(columns: list[ColumnDef]) -> tuple[list[str], list[Callable[[Any], Value]]]:
    """SELECT expressions and converters for columns of these source types."""
    exprs, convs = [], []
    for c in columns:
        template, conv = FETCH.get(c.base_type, ("{c}", lambda v: v))
        exprs.append(template.format(c=MARIADB.ident(c.name)))
        convs.append(conv)
    return exprs, convs
