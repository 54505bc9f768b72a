"""InsertRuns (core.columnar) -> bulk-load bytes with pyarrow's compute
kernels, without a Python object per value (issue #12, applier side).

``load_data_text`` writes MariaDB ``LOAD DATA`` fields exactly as the
reference ``targets/columnstore/types.encode_field`` does, value for value
(the tests compare the bytes): NULL as ``\\N``; backslash, tab and newline
escaped with a backslash; integers in decimal; DECIMAL as plain text (never
an exponent); DATE as ISO text; DATETIME/TIMESTAMP as
'YYYY-MM-DD HH:MM:SS.ffffff' (TIMESTAMP in UTC); YEAR as 4 digits.  Kinds
whose text Arrow would write differently (a DOUBLE's shortest repr, TIME
beyond 24 hours) are written by the reference function, per value: rare in
bulk loads and exact.

``arrow_table`` is the same runs as one typed Arrow table, for targets that
load Arrow (Spark can adopt it in place of row images).
"""
from __future__ import annotations

import datetime
import decimal
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from cynomys.applier.targets.source_types import time_text
from cynomys.core.columnar import InsertRun
from cynomys.core.model import ColumnDef, TableSchema

Text = Callable[[Any, ColumnDef], Any]


def _as_text(arr: Any, col: ColumnDef) -> Any:
    return arr.cast(pa.string())


def _escaped(arr: Any, col: ColumnDef) -> Any:
    # FIELDS ESCAPED BY '\\': the escape first, then the field and line terminators.
    for raw, esc in ((b"\\", b"\\\\"), (b"\t", b"\\t"), (b"\n", b"\\n")):
        arr = pc.replace_substring(arr, raw, esc)
    return arr


def _long(arr: Any, col: ColumnDef) -> Any:
    text = arr.cast(pa.string())
    # YEAR: text '0' would mean 2000; the reference writes 4 digits.
    return pc.utf8_lpad(text, 4, "0") if col.base_type == "year" else text


def _per_value(fmt: Callable[[Any], str]) -> Text:
    def text(arr: Any, col: ColumnDef) -> Any:
        return pa.array([None if v is None else fmt(v) for v in arr.to_pylist()], pa.string())
    return text


def _decimal(arr: Any, col: ColumnDef) -> Any:
    # The wire holds str(Decimal); the reference writes format(Decimal, 'f'),
    # the same text unless str() chose an exponent ('0E-10', '1E+3').
    if not pc.any(pc.match_substring(arr, "E")).as_py():
        return arr
    return pa.array([v if v is None or "E" not in v else format(decimal.Decimal(v), "f")
                     for v in arr.to_pylist()], pa.string())


#: Wire column kind -> its LOAD DATA text (NULLs stay null here).
LOAD_DATA_TEXT: dict[str, Text] = {
    "LongColumn": _long,
    "DoubleColumn": _per_value(repr),
    "StringColumn": _escaped,
    "BytesColumn": _escaped,
    "DecimalColumn": _decimal,
    "BigIntColumn": lambda arr, col: arr,
    "DateColumn": lambda arr, col: arr.cast(pa.date32()).cast(pa.string()),
    "DateTimeColumn": lambda arr, col: arr.cast(pa.timestamp("us")).cast(pa.string()),
    "TimestampColumn": lambda arr, col: arr.cast(pa.timestamp("us")).cast(pa.string()),
    "TimeColumn": _per_value(lambda us: time_text(datetime.timedelta(microseconds=us))),
}


def _parts(runs: list[InsertRun]) -> list[tuple[tuple[str, ...], list[Any]]]:
    """(column kinds, arrays) per stretch of runs: adjacent runs of one block
    are one slice; blocks with the same kinds are concatenated."""
    out: list[tuple[tuple[str, ...], list[Any]]] = []
    i = 0
    while i < len(runs):
        run = runs[i]
        assert run.block is not None
        j, end = i + 1, run.start + run.count
        while (not run.excluded and j < len(runs) and runs[j].block is run.block and runs[j].start == end
               and not runs[j].excluded):
            end += runs[j].count
            j += 1
        arrays = [a.slice(run.start, end - run.start) for a in run.block.arrays] if j > i + 1 else run.arrays()
        kinds = run.block.kinds
        if out and out[-1][0] == kinds:
            out[-1] = (kinds, [pa.concat_arrays([a, b]) for a, b in zip(out[-1][1], arrays)])
        else:
            out.append((kinds, arrays))
        i = j
    return out


def load_data_text(schema: TableSchema, runs: list[InsertRun]) -> bytes:
    """The runs' rows as LOAD DATA lines (tab-separated, '\\n'-terminated)."""
    if not runs:
        return b""
    if not schema.columns:
        return b"\n" * sum(r.rows for r in runs)
    texts: list[list[Any]] = [[] for _ in schema.columns]
    for kinds, arrays in _parts(runs):
        for i, (kind, arr, col) in enumerate(zip(kinds, arrays, schema.columns)):
            text = LOAD_DATA_TEXT[kind](arr, col)
            texts[i].append(text.cast(pa.binary()).fill_null(b"\\N"))
    columns = [pa.concat_arrays(t) if len(t) > 1 else t[0] for t in texts]
    lines = pc.binary_join_element_wise(*columns, b"\t")
    lines = pc.binary_join_element_wise(lines, b"\n", b"")
    offsets = lines.buffers()[1]
    data = lines.buffers()[2]
    first, last = memoryview(offsets).cast("i")[lines.offset], memoryview(offsets).cast("i")[lines.offset + len(lines)]
    return data.to_pybytes()[first:last] if data is not None else b""


#: Wire column kind -> Arrow type of ``arrow_table`` (text kinds stay text).
_TABLE_TYPES: dict[str, Callable[[Any], Any]] = {
    "DateColumn": lambda a: a.cast(pa.date32()),
    "DateTimeColumn": lambda a: a.cast(pa.timestamp("us")),
    "TimestampColumn": lambda a: a.cast(pa.timestamp("us", tz="UTC")),
    "TimeColumn": lambda a: a.cast(pa.duration("us")),
}


def arrow_table(schema: TableSchema, runs: list[InsertRun]) -> Any:
    """The runs' rows as one pyarrow Table named by the schema's columns:
    int64, float64, string (also DECIMAL and big integers, as exact text),
    binary, date32, timestamp[us] (TIMESTAMP with tz UTC), duration[us]."""
    columns: list[list[Any]] = [[] for _ in schema.columns]
    for kinds, arrays in _parts(runs):
        for i, (kind, arr) in enumerate(zip(kinds, arrays)):
            conv = _TABLE_TYPES.get(kind)
            columns[i].append(conv(arr) if conv else arr)
    return pa.table([pa.chunked_array(c) for c in columns], names=list(schema.column_names))
