"""Batch <-> Avro bytes (fastavro), lossless for every MySQL type.

Payload layout: ``b"CYB"`` + one byte schema version + the Avro binary
encoding of a ``cynomys.v1.Batch`` record (schemaless; the version names the
writer schema, kept as ``batch.v<N>.avsc`` next to this file).  A new schema
version is a new file; readers keep every version they know.

Values whose Avro primitive would lose their type (DECIMAL, dates and times,
zero dates, integers beyond int64) travel as small named records chosen with
fastavro's tuple notation; plain ints, floats, strings, bytes and NULL are
Avro primitives.

``encode_pure`` is the reference (it builds fastavro's datum).  Its
compiled twin (``cynomys/_speedups.c``, ``encode_batch``) writes the same
bytes straight from the Batch, without a Python object per value; on
anything it does not handle exactly like the reference it raises
``Fallback`` and the reference runs.  ``cynomys.core.compiled`` selects the path.
"""
from __future__ import annotations

import datetime
import decimal
import io
import json
from pathlib import Path
from typing import Any, Callable

import fastavro

from cynomys.core import compiled
from cynomys.core.columnar import KINDS, ColumnBlock, InsertRun, ManyRows
from cynomys.core.errors import SchemaError
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, RawTemporal, Row, TableSchema, Value

MAGIC = b"CYB"
# Writers use the oldest version that can carry the batch: v1 unless it
# holds a verification record (CHECKSUM, PURGE: the only change in v2, two
# enum symbols appended, so v1's indexes stay) or a keyless table's source
# indexes (TableDef.indexes, v3: a snapshot or repair of such a table).  An
# applier that predates v2 thus keeps reading every producer that does not
# run `cynomys verify`, one that predates v3 every log change.
VERSION = 1
INDEXES = 3
LATEST = 3
_V2_OPS = frozenset({Op.CHECKSUM, Op.PURGE})
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
_EPOCH_ORDINAL = _EPOCH_DATE.toordinal()
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

def _date_of(days: int) -> datetime.date:
    """Days since 1970-01-01 as a date: ``_EPOCH_DATE + timedelta(days)``,
    3.4x faster (no timedelta made; a large UPDATE of lineitem rows turns
    three dates a row back into Python values), the same OverflowError
    outside years 1-9999."""
    try:
        return datetime.date.fromordinal(days + _EPOCH_ORDINAL)
    except ValueError:
        raise OverflowError("date value out of range") from None


_DECODE: dict[str, Callable[[Any], Value]] = {
    _NS + "Decimal": decimal.Decimal,
    _NS + "BigInt": int,
    _NS + "Date": _date_of,
    _NS + "DateTime": lambda us: _EPOCH_NAIVE + datetime.timedelta(microseconds=us),
    _NS + "Timestamp": lambda us: _EPOCH_UTC + datetime.timedelta(microseconds=us),
    _NS + "Time": lambda us: datetime.timedelta(microseconds=us),
    _NS + "RawTemporal": RawTemporal,
}

def _tagged(v: Value) -> Any:
    """One value as a branch of the Value union (MixedColumn)."""
    t = type(v)
    if t is str or t is float or v is None or t is bytes or (t is int and _INT64_MIN <= v <= _INT64_MAX):  # type: ignore[operator]
        return v
    enc = _ENCODE.get(t)
    if enc is None:
        raise SchemaError(f"cannot encode a {t.__name__} value in a row image")
    return enc(v)


def _untag(v: Any) -> Value:
    return _DECODE[v[0]](v[1]["v"]) if type(v) is tuple else v


# Column kinds: (Avro record name, value -> Avro item, Avro item -> value).
# A column is written with the kind of its values' Python type; values of
# several types in one column (dates and zero dates) fall back to Mixed.
_ident: Callable[[Any], Any] = lambda v: v  # noqa: E731
_COLUMN_OF_TYPE: dict[type, tuple[str, Callable[[Any], Any]]] = {
    int: ("LongColumn", _ident),
    bool: ("LongColumn", int),
    float: ("DoubleColumn", _ident),
    str: ("StringColumn", _ident),
    bytes: ("BytesColumn", _ident),
    bytearray: ("BytesColumn", bytes),
    memoryview: ("BytesColumn", bytes),
    decimal.Decimal: ("DecimalColumn", str),
    datetime.date: ("DateColumn", lambda v: (v - _EPOCH_DATE).days),
    datetime.timedelta: ("TimeColumn", _td_us),
}
_READ_COLUMN: dict[str, Callable[[Any], Value]] = {
    "LongColumn": _ident, "DoubleColumn": _ident, "StringColumn": _ident, "BytesColumn": _ident,
    "DecimalColumn": decimal.Decimal, "BigIntColumn": int, "DateColumn": _DECODE[_NS + "Date"],
    "DateTimeColumn": _DECODE[_NS + "DateTime"], "TimestampColumn": _DECODE[_NS + "Timestamp"],
    "TimeColumn": _DECODE[_NS + "Time"], "MixedColumn": _untag,  # (Mixed keeps NULLs inline)
}


def _split_nulls(values: list[Value]) -> tuple[list[int], list[Value]]:
    """NULLs travel as a list of row indexes so the values array needs no
    per-value union (fastavro writes plain typed arrays about 4x faster)."""
    if None not in values:
        return [], values
    return [i for i, v in enumerate(values) if v is None], [v for v in values if v is not None]


def _encode_column(values: list[Value]) -> tuple[str, dict[str, Any]]:
    nulls, present = _split_nulls(values)
    kinds = set(map(type, present))
    name: str | None = None
    out: list[Any] = present
    if not kinds:
        name = "LongColumn"
    elif len(kinds) == 1:
        (t,) = kinds
        if t is int:
            if all(_INT64_MIN <= v <= _INT64_MAX for v in present):  # type: ignore[operator]
                name = "LongColumn"
            else:
                name, out = "BigIntColumn", [str(v) for v in present]
        elif t is datetime.datetime:
            naive = {v.tzinfo is None for v in present}  # type: ignore[union-attr]
            if naive == {True}:
                name, out = "DateTimeColumn", [_td_us(v - _EPOCH_NAIVE) for v in present]  # type: ignore[operator,arg-type]
            elif naive == {False}:
                name, out = "TimestampColumn", [_td_us(v - _EPOCH_UTC) for v in present]  # type: ignore[operator,arg-type]
        elif t in _COLUMN_OF_TYPE:
            name, conv = _COLUMN_OF_TYPE[t]
            if conv is not _ident:
                out = [conv(v) for v in present]
    if name is None:
        return (_NS + "MixedColumn", {"v": [_tagged(v) for v in values]})
    return (_NS + name, {"nulls": nulls, "v": out})


def _decode_column(col: tuple[str, dict[str, Any]]) -> list[Value]:
    name, body = col
    conv = _READ_COLUMN[name.rsplit(".", 1)[-1]]
    values: list[Value] = body["v"] if conv is _ident else [conv(v) for v in body["v"]]
    nulls = body.get("nulls")
    if nulls:
        gaps = set(nulls)
        it = iter(values)
        values = [None if i in gaps else next(it) for i in range(len(values) + len(nulls))]
    return values


def _pos(p: Position) -> dict[str, Any]:
    return {"file": p.file, "pos": p.pos, "gtid": p.gtid}


def _unpos(d: Any) -> Position:
    if type(d) is tuple:  # a record inside a union comes back as (name, record)
        d = d[1]
    return Position(d["file"], d["pos"], d.get("gtid", ""))


_OP_INDEX: dict[Op, int] = {}
_OP_OF: dict[int, Op] = {}  # its inverse (the compiled reader's records)


def _op_index() -> dict[Op, int]:
    """Op -> its index in the writer schema's enum (for the compiled writer)."""
    if not _OP_INDEX:
        raw = json.loads((_HERE / f"batch.v{LATEST}.avsc").read_text())
        records = next(f for f in raw["fields"] if f["name"] == "records")["type"]["items"]
        op_type = next(f for f in records["fields"] if f["name"] == "op")["type"]
        _OP_INDEX.update({Op(sym): i for i, sym in enumerate(op_type["symbols"])})
        _OP_OF.update({i: op for op, i in _OP_INDEX.items()})
    return _OP_INDEX


def writer_version(batch: Batch) -> int:
    """The oldest schema version that holds ``batch``."""
    v2 = False
    for c in batch.changes:
        if c.schema is not None and c.schema.indexes:
            return INDEXES
        v2 = v2 or c.op in _V2_OPS
    return 2 if v2 else VERSION


def encode(batch: Batch) -> bytes:
    """The batch as ``MAGIC + version + Avro``; compiled when available."""
    compiled.announce()
    ext = compiled.ext
    if ext is not None:
        changes = batch.changes if type(batch.changes) is tuple else tuple(batch.changes)
        try:
            out: bytes = ext.encode_batch(MAGIC + bytes([writer_version(batch)]), batch.producer_id, batch.end, batch.complete,
                                          batch.first_txn, batch.created_us, batch.last_commit_ts, dict(batch.meta),
                                          changes, _op_index(), ManyRows)
            return out
        except ext.Fallback:
            # A value the reference must judge: encode (or refuse) exactly as it does.
            compiled.fallbacks["encode"] += 1
    return encode_pure(batch)


def encode_pure(batch: Batch) -> bytes:
    """The reference encoder: fastavro over a datum built in Python."""
    tables: list[dict[str, Any]] = []
    refs: dict[int, int] = {}                 # id(schema) -> table_ref (schemas are shared objects)
    by_value: dict[TableSchema, int] = {}     # equal schemas from different objects share a ref
    images: list[list[Row]] = []              # per table_ref: row images in order
    records: list[dict[str, Any]] = []

    def table_ref(schema: TableSchema) -> int:
        ref = refs.get(id(schema))
        if ref is None:
            ref = by_value.get(schema)
            if ref is None:
                ref = by_value[schema] = len(tables)
                tables.append({
                    "database_name": schema.database, "table_name": schema.table,
                    "columns": [{"name": col.name, "type": col.type, "nullable": col.nullable} for col in schema.columns],
                    "key_columns": list(schema.key),
                    "indexes": [list(i) for i in schema.indexes],  # written from v3 on
                })
                images.append([])
            refs[id(schema)] = ref
        return ref

    def image(ref: int, row: Row | None) -> int:
        if row is None:
            return -1
        rows = images[ref]
        rows.append(row)
        return len(rows) - 1

    for c in batch.changes:
        ref = -1 if c.schema is None else table_ref(c.schema)
        # A ManyRows (core.columnar) is one record of its op per row.
        for before, after in (((None, r) for r in c.images) if type(c) is ManyRows else ((c.before, c.after),)):
            records.append({
                "tid": c.tid, "database_name": c.database, "table_name": c.table, "sql": c.sql,
                "op": c.op.value, "txn": _pos(c.txn), "commit_ts": c.commit_ts, "table_ref": ref,
                "before": image(ref, before), "after": image(ref, after),
            })
    blocks = []
    for ref, rows in enumerate(images):
        if not rows:
            continue
        width = len(tables[ref]["columns"])
        if any(len(r) != width for r in rows):
            raise SchemaError(f"a row image of {tables[ref]['database_name']}.{tables[ref]['table_name']} "
                              f"does not have its {width} columns")
        blocks.append({"table_ref": ref, "rows": len(rows),
                       "columns": [_encode_column(list(col)) for col in zip(*rows)]})
    datum = {
        "producer_id": batch.producer_id, "end": _pos(batch.end), "complete": batch.complete,
        "first_txn": _pos(batch.first_txn) if batch.first_txn else None,
        "created_us": batch.created_us, "last_commit_ts": batch.last_commit_ts, "meta": dict(batch.meta),
        "tables": tables, "records": records, "images": blocks,
    }
    version = writer_version(batch)
    buf = io.BytesIO()
    buf.write(MAGIC + bytes([version]))
    try:
        fastavro.schemaless_writer(buf, schema(version), datum)
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"batch does not fit Avro schema v{version}: {exc}") from None
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
                           tuple(t["key_columns"]), tuple(map(tuple, t.get("indexes", ()))))
               for t in d["tables"]]
    rows: dict[int, list[Row]] = {}
    for block in d["images"]:
        columns = [_decode_column(c) for c in block["columns"]]
        rows[block["table_ref"]] = list(zip(*columns)) if columns else [()] * block["rows"]

    def row(ref: int, i: int) -> Row | None:
        return None if i < 0 else rows[ref][i]

    changes = tuple(
        Change(op=Op(r["op"]), database=r["database_name"], table=r["table_name"], tid=r["tid"],
               txn=_unpos(r["txn"]), commit_ts=r["commit_ts"],
               schema=schemas[r["table_ref"]] if r["table_ref"] >= 0 else None,
               before=row(r["table_ref"], r["before"]), after=row(r["table_ref"], r["after"]), sql=r["sql"])
        for r in d["records"])
    return Batch(producer_id=d["producer_id"], changes=changes, end=_unpos(d["end"]), complete=d["complete"],
                 first_txn=_unpos(d["first_txn"]) if d["first_txn"] else None, created_us=d["created_us"],
                 last_commit_ts=d["last_commit_ts"], meta=dict(d["meta"]))


# --------------------------------------------------------------------------
# The applier's column-wise reader (issue #12)
# --------------------------------------------------------------------------
def _arrow_types() -> dict[str, Any]:
    import pyarrow as pa

    return {"LongColumn": pa.int64(), "DoubleColumn": pa.float64(), "StringColumn": pa.string(),
            "BytesColumn": pa.binary(), "DecimalColumn": pa.string(), "BigIntColumn": pa.string(),
            "DateColumn": pa.int32(), "DateTimeColumn": pa.int64(), "TimestampColumn": pa.int64(),
            "TimeColumn": pa.int64()}


_ARROW: dict[str, Any] = {}
#: Kinds whose wire value is text that must be valid UTF-8 (fastavro checks it).
_TEXT_KINDS = frozenset({"StringColumn", "DecimalColumn", "BigIntColumn"})


def _block(schema: TableSchema, rows: int, columns: list[tuple[int, int, bytes | None, Any]]) -> ColumnBlock:
    import pyarrow as pa

    if not _ARROW:
        _ARROW.update(_arrow_types())
    kinds, arrays, convs = [], [], []
    for kind_i, nulls, validity, values in columns:
        kind = KINDS[kind_i]
        valid = None if validity is None else pa.py_buffer(validity)
        if type(values) is tuple:  # (int32 offsets, data): strings and bytes
            bufs = [valid, pa.py_buffer(values[0]), pa.py_buffer(values[1])]
        else:
            bufs = [valid, pa.py_buffer(values)]
        arr = pa.Array.from_buffers(_ARROW[kind], rows, bufs, null_count=nulls)
        if kind in _TEXT_KINDS:
            arr.validate(full=True)  # invalid UTF-8: the reference decides (it refuses the payload)
        conv = _READ_COLUMN[kind]
        kinds.append(kind)
        arrays.append(arr)
        convs.append(None if conv is _ident else conv)
    if len(kinds) != len(schema.columns):
        raise ValueError("image block width differs from its table")
    return ColumnBlock(schema, kinds, arrays, convs)


#: The table definitions the compiled reader has met, each one object: a
#: flush meets a table's definition once per envelope, and equal but
#: distinct objects cost a comparison of every column per change where
#: code checks that changes share a shape (applier/targets/base.py).
_TABLES: dict[tuple[Any, ...], TableSchema] = {}
_TABLES_MAX = 4096


def _schema(db: str, tb: str, cols: Any, key: Any, indexes: Any) -> TableSchema:
    ident = (db, tb, tuple(map(tuple, cols)), tuple(key), tuple(map(tuple, indexes)))
    schema = _TABLES.get(ident)
    if schema is None:
        if len(_TABLES) >= _TABLES_MAX:
            _TABLES.clear()  # DDL churn: start again rather than grow
        schema = _TABLES[ident] = TableSchema(db, tb, tuple(ColumnDef(n, t, nl) for n, t, nl in cols), tuple(key),
                                              ident[4])
    return schema


def decode_columnar(payload: bytes) -> Batch:
    """``decode`` for the applier: the same Batch, except that runs of
    INSERTs (or of snapshot READs: upserts) come as
    ``InsertRun`` changes whose images stay column-wise (``core.columnar``).
    The other records (updates, deletes, DDL) are read by the same compiled
    reader and come as the reference's ``Change``s, their images made from
    the column blocks (``ColumnBlock.rows``: the reference's values) --
    fastavro's record-by-record read was about half of the applier's CPU on
    a large UPDATE.  Compiled only: on the pure-Python path, or for any
    envelope the compiled reader does not take (mixed columns, schema v2,
    anything unexpected), this is ``decode``."""
    ext = compiled.ext
    if ext is None or len(payload) < 4 or payload[:3] != MAGIC or payload[3] not in (VERSION, INDEXES):
        return decode(payload)
    ops = _op_index()
    try:
        (producer_id, end, complete, first_txn, created_us, last_commit_ts, meta, tables, runs,
         images) = ext.decode_columns(memoryview(payload)[4:], ops[Op.INSERT], ops[Op.READ], True,
                                      payload[3] >= INDEXES)
        schemas = [_schema(*table) for table in tables]
        blocks = {ref: _block(schemas[ref], rows, cols) for ref, rows, cols in images}
        rows_of: dict[int, list[Row]] = {}  # a block's row images, made at its first record that needs them

        def image(ref: int, i: int) -> Row | None:
            if i < 0:
                return None
            rows = rows_of.get(ref)
            if rows is None:
                block = blocks[ref]
                rows = rows_of[ref] = block.rows(0, len(block))
            return rows[i]

        positions: dict[Any, Position] = {}  # a transaction's changes share its position: one object

        def position(txn: Any) -> Position:
            p = positions.get(txn)
            if p is None:
                p = positions[txn] = Position(*txn)
            return p

        changes: list[Change] = []
        for rec in runs:
            if len(rec) == 10:  # a record of its own (rd_record)
                tid, db, tb, txn, commit_ts, ref, op, before, after, sql = rec
                changes.append(Change(_OP_OF[op], db, tb, tid, position(txn), commit_ts,
                                      schemas[ref] if ref >= 0 else None, image(ref, before), image(ref, after), sql))
                continue
            tid, db, tb, txn, commit_ts, ref, first, count, op = rec
            block = blocks[ref]
            if first + count > len(block):
                raise ValueError("a record names a row its block does not have")
            run = InsertRun(Op.READ if op == ops[Op.READ] else Op.INSERT, db, tb, tid, position(txn), commit_ts,
                            schemas[ref], block=block, start=first, count=count)
            changes.append(run)  # a keyless table's too: build_flush decides (Capabilities.keyless_runs)
    except (ext.Fallback, ValueError, KeyError, IndexError):
        # pyarrow's invalid-data errors are ValueErrors (ArrowInvalid).
        compiled.fallbacks["decode_columns"] += 1
        return decode(payload)
    return Batch(producer_id=producer_id, changes=tuple(changes), end=Position(*end), complete=complete,
                 first_txn=Position(*first_txn) if first_txn else None, created_us=created_us,
                 last_commit_ts=last_commit_ts, meta=meta)
