"""InsertRuns (core.columnar) as Arrow arrays, for the targets that load
them column-wise (ColumnStore's LOAD DATA text, Spark's typed columns).

No array is made here with ``pa.array`` or ``pa.scalar`` of Python values:
pyarrow probes every such call for pandas objects, which imports pandas
(~40 MB of RSS) in a process that never uses it; ``text_array`` and
``binary_scalar`` build them from buffers instead.
"""
from __future__ import annotations

from array import array
from typing import Any, Iterator

import pyarrow as pa

from cynomys.core.columnar import InsertRun


def text_array(values: list[str | None]) -> Any:
    """A pa.string() array of ``values``, built from buffers (see the
    module docstring: ``pa.array`` would import pandas)."""
    data = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = array("i", [0])
    pos = 0
    for b in data:
        pos += len(b)
        offsets.append(pos)
    valid = bytearray((len(values) + 7) // 8)
    nulls = 0
    for i, v in enumerate(values):
        if v is None:
            nulls += 1
        else:
            valid[i >> 3] |= 1 << (i & 7)
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [pa.py_buffer(valid) if nulls else None, pa.py_buffer(offsets),
                                  pa.py_buffer(b"".join(data))], null_count=nulls)


def buffer_of(values: Any) -> memoryview:
    """The bytes of a string or binary array's values (32-bit offsets), without a copy."""
    offsets = memoryview(values.buffers()[1]).cast("i")
    data = values.buffers()[2]
    first, last = offsets[values.offset], offsets[values.offset + len(values)]
    return memoryview(b"") if data is None else memoryview(data)[first:last]


def binary_scalar(value: bytes) -> Any:
    """A pa.binary() scalar made from buffers: pyarrow.compute would turn a
    bytes argument into one with pa.scalar (see the module docstring)."""
    return pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(array("i", [0, len(value)])),
                                                  pa.py_buffer(value)])[0]


def parts(runs: list[InsertRun], max_rows: int | None = None) -> Iterator[tuple[tuple[str, ...], list[Any]]]:
    """(column kinds, arrays) per stretch of runs: adjacent runs of one block
    are one slice; stretches with the same kinds are concatenated (once) into
    parts of ``max_rows`` to ``2 * max_rows`` rows (None: no limit), a longer
    stretch being cut first: few pyarrow calls per row, bounded memory."""
    pending: list[list[Any]] = []
    pending_kinds: tuple[str, ...] = ()
    pending_rows = 0
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
        if pending and kinds != pending_kinds:
            yield pending_kinds, _joined(pending)
            pending, pending_rows = [], 0
        pending_kinds = kinds
        n = _rows(arrays)
        step = max_rows or max(n, 1)
        for at in range(0, n, step):
            pending.append([a.slice(at, step) for a in arrays] if n > step else arrays)
            pending_rows += min(step, n - at)
            if max_rows is not None and pending_rows >= max_rows:
                yield kinds, _joined(pending)
                pending, pending_rows = [], 0
        i = j
    if pending:
        yield pending_kinds, _joined(pending)


def _rows(arrays: list[Any]) -> int:
    return len(arrays[0]) if arrays else 0


def _joined(pieces: list[list[Any]]) -> list[Any]:
    """Column arrays of several pieces, each column concatenated once."""
    if len(pieces) == 1:
        return pieces[0]
    return [pa.concat_arrays(list(col)) for col in zip(*pieces)]
