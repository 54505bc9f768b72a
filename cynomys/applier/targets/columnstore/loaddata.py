"""ColumnStore/MariaDB: InsertRuns (core.columnar) -> LOAD DATA bytes with pyarrow's compute
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

Memory (issue #12: the applier's peak RSS): the text is written in pieces
of at most ``core.columnar.PIECE_ROWS`` rows (``write_load_data``), straight from Arrow's
buffer to the file, so a flush never holds the whole file as one bytes
object plus its copies.  And no array is made here with ``pa.array`` or
``pa.scalar`` of Python values: pyarrow probes every such call for pandas
objects, which imports pandas (~40 MB of RSS) in a process that never uses
it; ``text_array`` and ``_NULL`` are built from buffers instead (targets/arrow.py).
"""
from __future__ import annotations

import datetime
import decimal
import io
from typing import IO, Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from cynomys.applier.targets.arrow import binary_scalar, buffer_of, parts, text_array
from cynomys.core import columnar as core_columnar
from cynomys.core import compiled
from cynomys.core.columnar import InsertRun
from cynomys.core.model import ColumnDef, TableSchema
from cynomys.core.sourcetypes import time_text

Text = Callable[[Any, ColumnDef], Any]

_NULL, _TAB, _NEWLINE, _EMPTY = (binary_scalar(b) for b in (b"\\N", b"\t", b"\n", b""))


def _as_text(arr: Any, col: ColumnDef) -> Any:
    return arr.cast(pa.string())


def _escaped(arr: Any, col: ColumnDef) -> Any:
    # FIELDS ESCAPED BY '\\': the escape first, then the field and line terminators.
    if not _needs_escape(arr):
        return arr
    for raw, esc in _ESCAPES:
        arr = pc.replace_substring(arr, raw, esc)
    return arr


_ESCAPES = ((b"\\", b"\\\\"), (b"\t", b"\\t"), (b"\n", b"\\n"))
_SMALL_OFFSETS = (pa.string(), pa.binary())


def _needs_escape(arr: Any) -> bool:
    """Whether a value of the string/binary array holds a byte to escape,
    searched in its data buffer at memchr speed: the three replace passes
    copy the whole column each, and bulk text rarely needs one (they were
    14% of the applier's CPU in an initial load of lineitem)."""
    if arr.type not in _SMALL_OFFSETS:
        return True  # (64-bit offsets: not what the decoder makes) the passes decide
    text = bytes(buffer_of(arr))
    return any(raw in text for raw, _ in _ESCAPES)


def _long(arr: Any, col: ColumnDef) -> Any:
    text = arr.cast(pa.string())
    # YEAR: text '0' would mean 2000; the reference writes 4 digits.
    return pc.utf8_lpad(text, 4, "0") if col.base_type == "year" else text


def _per_value(fmt: Callable[[Any], str]) -> Text:
    def text(arr: Any, col: ColumnDef) -> Any:
        return text_array([None if v is None else fmt(v) for v in arr.to_pylist()])
    return text


def _decimal(arr: Any, col: ColumnDef) -> Any:
    # The wire holds str(Decimal); the reference writes format(Decimal, 'f'),
    # the same text unless str() chose an exponent ('0E-10', '1E+3').
    if not pc.any(pc.match_substring(arr, "E")).as_py():
        return arr
    return text_array([v if v is None or "E" not in v else format(decimal.Decimal(v), "f")
                        for v in arr.to_pylist()])


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


#: Wire column kind -> the compiled writer's mode (_speedups.load_data_lines):
#: the kinds it writes byte for byte as ``LOAD_DATA_TEXT`` does; a piece
#: with another kind (DOUBLE, TIME) is written by pyarrow.
_MODES = {"LongColumn": 0, "StringColumn": 2, "BytesColumn": 2, "DecimalColumn": 3, "BigIntColumn": 4,
          "DateColumn": 5, "DateTimeColumn": 6, "TimestampColumn": 6}
#: Bits per value of the fixed-width modes (the others are text: 32-bit offsets).
_YEAR, _WIDTHS = 1, {0: 64, 1: 64, 5: 32, 6: 64}


def _compiled_lines(schema: TableSchema, kinds: tuple[str, ...], arrays: list[Any]) -> bytes | None:
    """One piece's LOAD DATA lines by the compiled writer, straight from
    the Arrow buffers (about 10x pyarrow's kernels: casts and an
    element-wise join per column were 80% of the applier's CPU in an
    initial load); None where it does not apply (pure Python, another
    kind, a value it leaves to the reference: the piece goes to ``_lines``)."""
    ext = compiled.ext
    if ext is None:
        return None
    columns = []
    for kind, arr, col in zip(kinds, arrays, schema.columns):
        mode = _MODES.get(kind)
        if mode is None:
            return None
        if mode == 0 and col.base_type == "year":
            mode = _YEAR
        bufs = core_columnar.compiled_buffers(arr, _WIDTHS.get(mode, 0))
        if bufs is None:
            return None
        columns.append((mode, arr.offset, *bufs))
    try:
        return ext.load_data_lines(len(arrays[0]), columns)  # type: ignore[no-any-return]
    except ext.Fallback:
        compiled.fallbacks["load_data"] += 1
        return None


def _lines(schema: TableSchema, kinds: tuple[str, ...], arrays: list[Any]) -> Any:
    """One piece's rows as a binary array of LOAD DATA lines."""
    texts = [_null_filled(LOAD_DATA_TEXT[kind](arr, col).cast(pa.binary()))
             for kind, arr, col in zip(kinds, arrays, schema.columns)]
    lines = pc.binary_join_element_wise(*texts, _TAB)
    return pc.binary_join_element_wise(lines, _NEWLINE, _EMPTY)


def _null_filled(arr: Any) -> Any:
    return arr.fill_null(_NULL) if arr.null_count else arr


def write_load_data(out: IO[bytes], schema: TableSchema, runs: list[InsertRun]) -> int:
    """Write the runs' rows as LOAD DATA lines (tab-separated,
    '\\n'-terminated) to ``out``, piece by piece; returns the bytes written."""
    if not runs:
        return 0
    if not schema.columns:
        return out.write(b"\n" * sum(r.rows for r in runs))
    written = 0
    for kinds, arrays in parts(runs, core_columnar.PIECE_ROWS):
        text: bytes | memoryview | None = _compiled_lines(schema, kinds, arrays)
        if text is None:
            text = buffer_of(_lines(schema, kinds, arrays))
        if text:
            written += out.write(text)  # no copy into a bytes object
    return written


def load_data_text(schema: TableSchema, runs: list[InsertRun]) -> bytes:
    """The runs' rows as LOAD DATA lines, as one bytes object (what
    ``write_load_data`` writes)."""
    buf = io.BytesIO()
    write_load_data(buf, schema, runs)
    return buf.getvalue()
