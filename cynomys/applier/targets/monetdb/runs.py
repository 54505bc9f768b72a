"""MonetDB: InsertRuns (core.columnar) -> ``COPY INTO`` text with pyarrow's
compute kernels, without a Python object per value (issue #28).

``copy_lines`` writes each run row as the record the row path writes
(``types.Codec.field`` per value, the reference), field for field where the
text matters and value for value where only the stored value does: the
fields end at '|', records at a newline, text is quoted with '"' and
backslash-escaped, NULL is the unquoted marker ``null``.  A rule below is
only taken where that holds:

- a wire column kind (codec: int64 integers, float64, UTF-8 text, bytes,
  DECIMAL as text, int32 days, int64 microseconds) meets the codec family
  it can only come from;
- the checks the per-value codecs make are made on the whole column: the
  integer range and the text length are interval checks, so the codec's
  own ``field`` run on the column's minimum and maximum (longest) value
  says whether every value passes; a NUL in text, a DECIMAL text with
  another scale, an exponent or too many digits fail a vectorised match.

Anything else -- a check that fails, a pair of kind and family not listed
(FLOAT/DOUBLE, whose text is Python's repr; BLOB hex; BIGINT UNSIGNED beyond
int64, which arrives as text), milliseconds-only servers -- goes the
reference way for that column: the Python values through ``Codec.field``,
which also names the value it refuses (``types.Unstorable``).

No array is made here with ``pa.array`` or ``pa.scalar`` of Python values
(that imports pandas; see ``targets/arrow.py``).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cynomys.applier.targets.arrow import binary_scalar, parts, text_array
from cynomys.applier.targets.monetdb.types import COPY_NULL, Codec, ServerFeatures
from cynomys.core.columnar import ColumnBlock, InsertRun

#: (wire array, codec, server) -> the column's COPY fields as a string array
#: (nulls stay null), or None: not exact here, take the reference way.
Rule = Callable[[Any, Codec, ServerFeatures], Any]

_NULL, _BAR, _NEWLINE, _EMPTY, _QUOTE, _UTC = (binary_scalar(b) for b in (COPY_NULL.encode(), b"|", b"\n", b"", b'"',
                                                                      b"+00:00"))
#: What ``types._COPY_ESCAPES`` escapes, the backslash first.
_ESCAPES = ((b"\\", b"\\\\"), (b'"', b'\\"'), (b"\n", b"\\n"), (b"\r", b"\\r"), (b"\t", b"\\t"), (b"|", b"\\|"))


def _passes(c: Codec, *values: Any) -> bool:
    """Whether the codec's own field() takes each of ``values``."""
    try:
        for v in values:
            c.field(v)
    except ValueError:  # types.Unstorable, or a conversion the codec refuses
        return False
    return True


def _integers(arr: Any, c: Codec, f: ServerFeatures) -> Any:
    # The codecs' integer checks are intervals (the source type's range; with
    # integers=native, the minimum refused): the extremes decide for all.
    lo, hi = (v.as_py() for v in pc.min_max(arr).values())
    return arr.cast(pa.string()) if _passes(c, lo, hi) else None


def _microseconds(arr: Any, c: Codec, f: ServerFeatures) -> Any:
    return arr.cast(pa.string())  # TIME: the wire's signed microseconds are the stored value


def _quoted(arr: Any) -> Any:
    arr = arr.cast(pa.binary())
    for raw, esc in _ESCAPES:
        arr = pc.replace_substring(arr, raw, esc)
    return pc.binary_join_element_wise(_QUOTE, arr, _QUOTE, _EMPTY)


def _text(arr: Any, c: Codec, f: ServerFeatures) -> Any:
    if pc.any(pc.match_substring(arr, "\x00")).as_py():
        return None  # the reference refuses it, naming the row
    lengths = pc.utf8_length(arr)
    longest = pc.index(lengths, pc.max(lengths)).as_py()
    if longest >= 0 and not _passes(c, arr[longest].as_py()):
        return None  # longer than the column: the reference refuses it
    return _quoted(arr)


def _decimal_pattern(c: Codec) -> str:
    """The wire texts (str(Decimal)) the codec writes unchanged: the column's
    scale exactly, at most p - s integer digits, no exponent."""
    p, s = _precision_scale(c)
    whole = "0" if p - s <= 0 else f"(0|[1-9][0-9]{{0,{p - s - 1}}})"
    sign = "" if c.source.unsigned else "-?"
    return f"^{sign}{whole}" + (f"\\.[0-9]{{{s}}}$" if s else "$")


def _precision_scale(c: Codec) -> tuple[int, int]:
    from cynomys.core.sourcetypes import type_params

    params = type_params(c.source.type)
    p, s = (params + [10, 0][len(params):])[:2]
    return p, s


def _decimal(arr: Any, c: Codec, f: ServerFeatures) -> Any:
    # The server parses the text into DECIMAL(p,s): what fits it unchanged
    # is the value the reference stores ('-0.00' is 0 either way).
    if not pc.all(pc.match_substring_regex(arr, _decimal_pattern(c))).as_py():
        return None
    return arr if c.family == "decimal" else _quoted(arr)


def _date(arr: Any, c: Codec, f: ServerFeatures) -> Any:
    return arr.cast(pa.date32()).cast(pa.string())


def _datetime(arr: Any, c: Codec, f: ServerFeatures) -> Any:
    if not f.timestamp_micro:
        return None  # the reference refuses sub-millisecond values there
    # 'YYYY-MM-DD HH:MM:SS.ffffff', as datetime.isoformat(" ", "microseconds")
    return arr.cast(pa.timestamp("us")).cast(pa.string())


def _timestamptz(arr: Any, c: Codec, f: ServerFeatures) -> Any:
    text = _datetime(arr, c, f)
    return None if text is None else pc.binary_join_element_wise(text.cast(pa.binary()), _UTC, _EMPTY)


RULES: dict[tuple[str, str], Rule] = {
    ("LongColumn", "int"): _integers,
    ("TimeColumn", "microseconds"): _microseconds,
    ("StringColumn", "text"): _text,
    ("DecimalColumn", "decimal"): _decimal,
    ("DecimalColumn", "text_number"): _decimal,
    ("DateColumn", "date"): _date,
    ("DateTimeColumn", "datetime"): _datetime,
    ("TimestampColumn", "timestamptz"): _timestamptz,
}


def _fields(kind: str, arr: Any, c: Codec, f: ServerFeatures, block: ColumnBlock, col: int) -> Any:
    """One column of one piece as COPY fields (a string array, nulls as null)."""
    if arr.null_count == len(arr):  # an all-NULL column travels as LongColumn whatever its type
        return None
    rule = RULES.get((kind, c.family))
    out = None if rule is None else rule(arr, c, f)
    if out is None:
        # The reference: Python values through the codec (raises Unstorable).
        field = c.field
        return text_array([None if v is None else field(v) for v in block.python_values(col, arr)])
    return out


def copy_lines(codecs: Sequence[Codec], features: ServerFeatures, runs: list[InsertRun],
               max_rows: int) -> Iterator[tuple[int, Any]]:
    """(rows, binary array of COPY records, each ending with a newline) per
    piece of ``max_rows`` to ``2 * max_rows`` rows of ``runs``."""
    blocks = {run.block.kinds: run.block for run in runs if run.block is not None}
    for kinds, arrays in parts(runs, max_rows):
        n = len(arrays[0]) if arrays else 0
        if not n:
            continue
        block = blocks[kinds]
        texts = []
        for col, (kind, arr, c) in enumerate(zip(kinds, arrays, codecs, strict=True)):
            out = _fields(kind, arr, c, features, block, col)
            texts.append(pa.nulls(n, pa.binary()).fill_null(_NULL) if out is None
                         else out.cast(pa.binary()).fill_null(_NULL))
        lines = pc.binary_join_element_wise(*texts, _BAR) if len(texts) > 1 else texts[0]
        yield n, pc.binary_join_element_wise(lines, _NEWLINE, _EMPTY)

