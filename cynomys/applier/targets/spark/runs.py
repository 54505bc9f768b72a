"""InsertRuns (core.columnar) -> the Spark target's typed Arrow columns,
without a Python object per value (issue #11: lineitem's early Spark
flushes spent 0.9-1.6 s of "plan" turning runs into Python rows and those
back into Arrow).

The result is the array ``types.encode_column`` makes from the same rows'
Python values, value for value (tests/unit/test_spark_runs.py compares
them), because each rule below is only taken where that holds:

- a wire column kind (codec: int64 integers, float64, UTF-8 text, bytes,
  DECIMAL as text, int32 days, int64 microseconds) meets the mapping
  family it can only come from (``types.TYPE_RULES``);
- the checks the per-value encoders make are made on the whole column
  (the MySQL integer range, FLOAT's single precision, DECIMAL's scale and
  precision through Arrow's safe cast, which refuses data loss).

Anything else -- a check that fails, a pair of kind and family not listed
(BIGINT UNSIGNED beyond int64 arrives as text, DECIMAL wider than 38 digits
is kept as text), a kind a future wire adds -- goes the reference way for
that column: Python values through ``encode_column``, which also names the
value it refuses.  Zero dates never reach a run (the codec keeps such
envelopes row-wise); should one arrive, its companion text comes back
as for rows.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cynomys.applier.targets.arrow import parts
from cynomys.applier.targets.spark import types as st
from cynomys.core.columnar import InsertRun
from cynomys.core.model import Row, TableSchema, Value

log = logging.getLogger(__name__)

#: (wire kind, mapping) -> the mapping's Arrow array, or None: not exact here.
Rule = Callable[[Any, st.Mapping], Any]


def _in_bounds(arr: Any, m: st.Mapping) -> Any:
    assert m.bounds is not None
    lo, hi = (v.as_py() for v in pc.min_max(arr).values())
    if lo < m.bounds[0] or hi > m.bounds[1]:
        return None  # the reference names the value out of range
    return arr.cast(m.arrow)


def _single(arr: Any, m: st.Mapping) -> Any:
    # FLOAT keeps single-precision values only; a double that does not
    # survive the round trip is refused by the reference.
    narrow = arr.cast(pa.float32(), safe=False)
    return narrow if pc.all(pc.equal(narrow.cast(pa.float64()), arr)).as_py() is not False else None


def _safe_cast(arr: Any, m: st.Mapping) -> Any:
    try:
        return arr.cast(m.arrow)  # safe: more fraction digits or too many digits raise
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _as_is(arr: Any, m: st.Mapping) -> Any:
    return arr


def _cast(arr: Any, m: st.Mapping) -> Any:
    return arr.cast(m.arrow)


RULES: dict[tuple[str, str], Rule] = {
    ("LongColumn", "integer"): _in_bounds,
    ("LongColumn", "uint64"): _in_bounds,
    ("DoubleColumn", "double"): _as_is,
    ("DoubleColumn", "float"): _single,
    ("StringColumn", "text"): _as_is,
    ("BytesColumn", "binary"): _as_is,
    ("DecimalColumn", "decimal"): _safe_cast,
    ("DateColumn", "date"): _cast,
    ("DateTimeColumn", "datetime"): _cast,
    ("TimestampColumn", "timestamp"): _cast,
    ("TimeColumn", "time"): _as_is,
}


def _converted(kind: str, m: st.Mapping, arr: Any) -> Any:
    if arr.null_count == len(arr):  # an all-NULL column travels as LongColumn whatever its type
        return pa.nulls(len(arr), m.arrow)
    rule = RULES.get((kind, m.family))
    return None if rule is None else rule(arr, m)


def _python_values(runs: Sequence[InsertRun], col: int) -> list[Value]:
    out: list[Value] = []
    for run in runs:
        assert run.block is not None
        values = run.block.values(col, run.start, run.count)
        out += [v for i, v in enumerate(values) if i not in run.excluded] if run.excluded else values
    return out


def run_images(runs: Sequence[InsertRun]) -> list[Row]:
    """The runs' row images in the order ``run_columns`` puts them."""
    return [row for run in runs for row in run.images()]


def run_columns(schema: TableSchema, mappings: Sequence[st.Mapping], runs: list[InsertRun]
                ) -> tuple[list[pa.ChunkedArray], dict[int, list[str | None]]]:
    """One Arrow array (chunked: one chunk per run piece) per column of
    ``schema`` holding the runs' rows (in order, without excluded rows),
    typed as ``mappings`` say, and the companion texts of columns holding zero dates (by column index).
    Raises ``types.ValueRejected`` (with the row index) for a value the
    column refuses."""
    pieces: list[list[Any]] = [[] for _ in schema.columns]
    fallback: set[int] = set()
    for kinds, arrays in parts(runs):
        for i, (kind, arr, m) in enumerate(zip(kinds, arrays, mappings, strict=True)):
            if i in fallback:
                continue
            out = _converted(kind, m, arr)
            if out is None:
                fallback.add(i)
            else:
                pieces[i].append(out)
    columns: list[Any] = []
    raws: dict[int, list[str | None]] = {}
    for i, m in enumerate(mappings):
        if i in fallback:
            log.debug("table %s column %s: runs converted value by value", schema.name, schema.columns[i].name)
            try:
                array, raw = st.encode_column(m, _python_values(runs, i))
            except st.ValueRejected as exc:
                exc.column = i
                raise
            if raw is not None:
                raws[i] = raw
            columns.append(pa.chunked_array([array], type=array.type))
        else:
            # Chunked, not concatenated: a copy of a snapshot flush's
            # columns (~30 MB per 200k lineitem rows) would only be
            # sliced again (_split_reads, direct.py writes in pieces).
            columns.append(pa.chunked_array(pieces[i], type=pieces[i][0].type))
    return columns, raws
