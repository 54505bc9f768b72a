"""Batch <-> Avro bytes (fastavro), lossless for every MySQL type.

Payload layout: ``b"CYB"`` + one byte schema version + the Avro binary
encoding of a ``cynomys.v1.Batch`` record (schemaless; the version names the
writer schema, kept as ``batch.v<N>.avsc`` next to this file).  A new schema
version is a new file; readers keep every version they know.

Values whose Avro primitive would lose their type (DECIMAL, dates and times,
zero dates, integers beyond int64) travel as small named records chosen with
fastavro's tuple notation; plain ints, floats, strings, bytes and NULL are
Avro primitives.
"""
from __future__ import annotations

import datetime
import decimal
import io
import json
from pathlib import Path
from typing import Any, Callable

import fastavro

from cynomys.core.errors import SchemaError
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, RawTemporal, Row, TableSchema, Value

MAGIC = b"CYB"
VERSION = 1
_HERE = Path(__file__).parent
_NS = "cynomys.v1."


def load_schema(version: int) -> Any:
    path = _HERE / f"batch.v{version}.avsc"
    if not path.exists():
        raise SchemaError(f"no Avro schema version {version} ({path.name})",
                          hint="upgrade Cynomys on this host to read this producer's records")
    return fastavro.parse_schema(json.loads(path.read_text()))


_SCHEMAS: dict[int, Any] = {}


def schema(version: int = VERSION) -> Any:
    if version not in _SCHEMAS:
        _SCHEMAS[version] = load_schema(version)
    return _SCHEMAS[version]


_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_NAIVE = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_US = datetime.timedelta(microseconds=1)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _td_us(td: datetime.timedelta) -> int:
    return (td.days * 86400 + td.seconds) * 1000000 + td.microseconds


def _dt_value(v: datetime.datetime) -> tuple[str, dict[str, int]]:
    if v.tzinfo is None:
        return (_NS + "DateTime", {"v": _td_us(v - _EPOCH_NAIVE)})
    return (_NS + "Timestamp", {"v": _td_us(v - _EPOCH_UTC)})


def _int_value(v: int) -> Any:
    return v if _INT64_MIN <= v <= _INT64_MAX else (_NS + "BigInt", {"v": str(v)})


# type(value) -> Avro union branch.  Exact types: a RawTemporal is a str
# subclass and must not be written as a plain string.
_ENCODE: dict[type, Callable[[Any], Any]] = {
    type(None): lambda v: None,
    str: lambda v: v,
    float: lambda v: v,
    bytes: lambda v: v,
    bool: lambda v: int(v),
    int: _int_value,
    decimal.Decimal: lambda v: (_NS + "Decimal", {"v": str(v)}),
    datetime.date: lambda v: (_NS + "Date", {"v": (v - _EPOCH_DATE).days}),
    datetime.datetime: _dt_value,
    datetime.timedelta: lambda v: (_NS + "Time", {"v": _td_us(v)}),
    RawTemporal: lambda v: (_NS + "RawTemporal", {"v": str(v)}),
    bytearray: bytes,
    memoryview: bytes,
}

_DECODE: dict[str, Callable[[Any], Value]] = {
    _NS + "Decimal": decimal.Decimal,
    _NS + "BigInt": int,
    _NS + "Date": lambda d: _EPOCH_DATE + datetime.timedelta(days=d),
    _NS + "DateTime": lambda us: _EPOCH_NAIVE + datetime.timedelta(microseconds=us),
    _NS + "Timestamp": lambda us: _EPOCH_UTC + datetime.timedelta(microseconds=us),
    _NS + "Time": lambda us: datetime.timedelta(microseconds=us),
    _NS + "RawTemporal": RawTemporal,
}

_PLAIN = (str, int, float, bytes, type(None))


def _encode_row(row: Row | None) -> list[Any] | None:
    if row is None:
        return None
    out: list[Any] = []
    for v in row:
        t = type(v)
        if t is str or t is float or v is None or t is bytes or (t is int and _INT64_MIN <= v <= _INT64_MAX):  # type: ignore[operator]
            out.append(v)
        else:
            enc = _ENCODE.get(t)
            if enc is None:
                raise SchemaError(f"cannot encode a {t.__name__} value in a row image")
            out.append(enc(v))
    return out


def _decode_row(row: list[Any] | None) -> Row | None:
    if row is None:
        return None
    return tuple(_DECODE[v[0]](v[1]["v"]) if type(v) is tuple else v for v in row)


def _pos(p: Position) -> dict[str, Any]:
    return {"file": p.file, "pos": p.pos, "gtid": p.gtid}


def _unpos(d: Any) -> Position:
    if type(d) is tuple:  # a record inside a union comes back as (name, record)
        d = d[1]
    return Position(d["file"], d["pos"], d.get("gtid", ""))


def encode(batch: Batch) -> bytes:
    tables: list[dict[str, Any]] = []
    refs: dict[TableSchema, int] = {}
    records: list[dict[str, Any]] = []
    for c in batch.changes:
        ref = -1
        if c.schema is not None:
            ref = refs.get(c.schema, -1)
            if ref < 0:
                ref = refs[c.schema] = len(tables)
                tables.append({
                    "database_name": c.schema.database, "table_name": c.schema.table,
                    "columns": [{"name": col.name, "type": col.type, "nullable": col.nullable} for col in c.schema.columns],
                    "key_columns": list(c.schema.key),
                })
        records.append({
            "tid": c.tid, "database_name": c.database, "table_name": c.table, "sql": c.sql,
            "op": c.op.value, "txn": _pos(c.txn), "commit_ts": c.commit_ts, "table_ref": ref,
            "before": _encode_row(c.before), "after": _encode_row(c.after),
        })
    datum = {
        "producer_id": batch.producer_id, "end": _pos(batch.end), "complete": batch.complete,
        "first_txn": _pos(batch.first_txn) if batch.first_txn else None,
        "created_us": batch.created_us, "last_commit_ts": batch.last_commit_ts, "meta": dict(batch.meta),
        "tables": tables, "records": records,
    }
    buf = io.BytesIO()
    buf.write(MAGIC + bytes([VERSION]))
    try:
        fastavro.schemaless_writer(buf, schema(VERSION), datum)
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"batch does not fit Avro schema v{VERSION}: {exc}") from None
    return buf.getvalue()


def decode(payload: bytes) -> Batch:
    if len(payload) < 4 or payload[:3] != MAGIC:
        raise SchemaError("payload is not a Cynomys batch (bad magic)")
    version = payload[3]
    try:
        d = fastavro.schemaless_reader(io.BytesIO(payload[4:]), schema(version), None,
                                       return_record_name=True)
    except (ValueError, TypeError, EOFError, IndexError, KeyError, UnicodeDecodeError) as exc:
        raise SchemaError(f"payload does not decode as Avro schema v{version}: {exc}") from None
    assert isinstance(d, dict)
    schemas = [TableSchema(t["database_name"], t["table_name"],
                           tuple(ColumnDef(c["name"], c["type"], c["nullable"]) for c in t["columns"]),
                           tuple(t["key_columns"])) for t in d["tables"]]
    changes = tuple(
        Change(op=Op(r["op"]), database=r["database_name"], table=r["table_name"], tid=r["tid"],
               txn=_unpos(r["txn"]), commit_ts=r["commit_ts"],
               schema=schemas[r["table_ref"]] if r["table_ref"] >= 0 else None,
               before=_decode_row(r["before"]), after=_decode_row(r["after"]), sql=r["sql"])
        for r in d["records"])
    return Batch(producer_id=d["producer_id"], changes=changes, end=_unpos(d["end"]), complete=d["complete"],
                 first_txn=_unpos(d["first_txn"]) if d["first_txn"] else None, created_us=d["created_us"],
                 last_commit_ts=d["last_commit_ts"], meta=dict(d["meta"]))
