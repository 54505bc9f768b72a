"""Row images kept column-wise from the wire to the bulk load (issue #12).

The applier's common envelope carries INSERTs only (a bulk load, a busy
insert workload).  Its compiled reader (``codec.decode_columnar``) hands
the image columns over in Arrow's memory layout, and they stay that way:

- a ``ColumnBlock`` is one table's image block of one envelope: a pyarrow
  array per column holding the *wire* values (int64 for integers, DATETIME
  and TIME microseconds, int32 days for DATE, text for DECIMAL and big
  integers, UTF-8 / binary for strings and bytes), with the functions that
  turn a wire value into the Python value of ``core.model`` (the codec's);
- an ``InsertRun`` is a stretch of consecutive INSERTs of one source
  transaction into one table: a ``Change`` whose rows are ``count`` rows of
  a block from ``start``, minus ``excluded`` (rows the fold took out because
  a later change to their key arrived).

Only the key columns become Python objects (the fold needs the keys to see
collisions); the other values go from the Avro bytes to the target's bulk
format without a Python object each (``applier/targets/arrow.py``, ``columnstore/loaddata.py``).  Wherever a
run meets code that needs rows, ``images()``/``as_changes()`` give exactly
what the reference decoder would have given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from cynomys.core import compiled
from cynomys.core.model import Change, Row, TableSchema, Value

#: Rows per piece of a bulk-load file written at once, row images and runs
#: alike: bounds what a flush holds in memory (about 1.5 MB of lineitem
#: text, issue #12) while keeping per-call costs negligible.
PIECE_ROWS = 8192

#: The image column kinds of the wire format (schemas/batch.v1.avsc), in
#: its union order; Mixed columns never reach a ColumnBlock.
KINDS: tuple[str, ...] = ("LongColumn", "DoubleColumn", "StringColumn", "BytesColumn", "DecimalColumn",
                          "BigIntColumn", "DateColumn", "DateTimeColumn", "TimestampColumn", "TimeColumn")


class ColumnBlock:
    """One table's image block of one envelope, column-wise (pyarrow arrays
    of wire values, see the module docstring)."""

    __slots__ = ("schema", "kinds", "arrays", "_to_python")

    def __init__(self, schema: TableSchema, kinds: Sequence[str], arrays: Sequence[Any],
                 to_python: Sequence[Callable[[Any], Value] | None]) -> None:
        self.schema = schema
        self.kinds = tuple(kinds)
        self.arrays = tuple(arrays)
        self._to_python = tuple(to_python)  # None: the wire value is the Python value

    def __len__(self) -> int:
        return len(self.arrays[0]) if self.arrays else 0

    def values(self, col: int, start: int, count: int) -> list[Value]:
        """Python values of column ``col``, rows [start, start + count)."""
        return self.python_values(col, self.arrays[col].slice(start, count))

    def python_values(self, col: int, arr: Any) -> list[Value]:
        """Python values of ``arr``, an array of column ``col``'s wire kind
        (from this block or another block of the same kinds: the conversion
        depends on the kind only).  Compiled (``_speedups.column_values``,
        straight from the Arrow buffers) where it can, else pyarrow's
        ``to_pylist`` and the codec's conversion per value: the same values."""
        got = _compiled_values(self.kinds[col], arr)
        if got is not None:
            return got
        raw = arr.to_pylist()
        conv = self._to_python[col]
        if conv is None:
            return raw  # type: ignore[no-any-return]
        return [None if v is None else conv(v) for v in raw]

    def rows(self, start: int, count: int) -> list[Row]:
        """Row images [start, start + count), exactly as the reference decoder makes them."""
        if not self.arrays:
            return [()] * count
        return list(zip(*[self.values(i, start, count) for i in range(len(self.arrays))]))


#: Wire kind -> (its index, the bit width of its values; 0: text with int32 offsets).
_COMPILED_KINDS: dict[str, tuple[int, int]] = {kind: (i, 0 if 2 <= i <= 5 else 32 if i == 6 else 64)
                                               for i, kind in enumerate(KINDS)}


def _compiled_values(kind: str, arr: Any) -> list[Value] | None:
    """``_speedups.column_values`` of ``arr``; None on the pure path, for an
    Arrow layout it does not read, or a value it leaves to the reference
    (a date outside years 1-9999: the reference raises)."""
    ext = compiled.ext
    got = _COMPILED_KINDS.get(kind)
    if ext is None or got is None:
        return None
    index, width = got
    bufs = compiled_buffers(arr, width)
    if bufs is None:
        return None
    try:
        return ext.column_values(index, arr.offset, len(arr), *bufs)  # type: ignore[no-any-return]
    except ext.Fallback:
        compiled.fallbacks["column_values"] += 1
        return None


_SMALL_OFFSETS: list[Any] = []


def compiled_buffers(arr: Any, width: int) -> tuple[Any, Any, Any] | None:
    """(validity, data, offsets) of ``arr`` as the compiled readers take
    them (``_speedups.column_values``, ``load_data_lines``): ``width`` bits
    per value (offsets None), or, for ``width`` 0, text or bytes with 32-bit
    offsets; None for any other layout (the caller goes the reference way)."""
    bufs = arr.buffers()
    if width:
        return (bufs[0], bufs[1], None) if arr.type.bit_width == width else None
    if not _SMALL_OFFSETS:
        import pyarrow as pa  # loaded already: ``arr`` is an Arrow array

        _SMALL_OFFSETS.extend((pa.string(), pa.binary()))
    return (bufs[0], bufs[2], bufs[1]) if arr.type in _SMALL_OFFSETS else None


@dataclass(frozen=True, eq=False)
class InsertRun(Change):
    """``count`` INSERTs of one source transaction into one keyed table,
    rows [start, start + count) of ``block`` minus ``excluded`` (offsets
    within the run).  ``before``/``after`` are None: the images are in the
    block.  Identity equality: two runs are never the same change.

    ``op`` READ: snapshot rows (a chunk's READ changes), upserts: the
    target holds whatever it held for their keys until the flush deletes
    them (``build_flush`` adds their keys to the deletions); otherwise the
    same column-wise path to the bulk load as inserts."""

    block: ColumnBlock | None = None
    start: int = 0
    count: int = 0
    excluded: frozenset[int] = frozenset()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    @property
    def rows(self) -> int:
        return self.count - len(self.excluded)

    def _block(self) -> ColumnBlock:
        assert self.block is not None, "an InsertRun always has its block"
        return self.block

    def key_columns(self) -> list[list[Value]]:
        """Python values of the key columns, every row of the run (excluded too)."""
        block = self._block()
        return [block.values(i, self.start, self.count) for i in block.schema.key_indexes()]

    def images(self) -> list[Row]:
        """The run's row images (without the excluded ones)."""
        rows = self._block().rows(self.start, self.count)
        if self.excluded:
            rows = [r for i, r in enumerate(rows) if i not in self.excluded]
        return rows

    def image(self, i: int) -> Row:
        return self._block().rows(self.start + i, 1)[0]

    def change(self, image: Row) -> Change:
        """One of the run's inserts (reads) as a plain Change."""
        return Change(self.op, self.database, self.table, self.tid, self.txn, self.commit_ts, self.schema,
                      None, image, None)

    def as_changes(self) -> list[Change]:
        return [self.change(r) for r in self.images()]

    def arrays(self) -> list[Any]:
        """The run's columns as pyarrow arrays of wire values (zero-copy
        slices unless rows are excluded)."""
        block = self._block()
        out = [a.slice(self.start, self.count) for a in block.arrays]
        if self.excluded:
            import pyarrow as pa

            # A bit mask made from a buffer: pa.array(list) would import
            # pandas (~40 MB), probing its argument for pandas objects.
            bits = bytearray(b"\xff" * ((self.count + 7) // 8))
            for i in self.excluded:
                bits[i >> 3] &= ~(1 << (i & 7)) & 0xFF
            keep = pa.Array.from_buffers(pa.bool_(), self.count, [None, pa.py_buffer(bits)])
            out = [a.filter(keep) for a in out]
        return out


#: A binlog INSERT event of at least this many rows is assembled as one
#: ``ManyRows`` (parser/txn.py) instead of a ``Change`` per row: past a few
#: rows the per-row objects, the fold, the tasks' and the metrics' look at
#: each change were more than half of the producer's time on a bulk insert
#: (bench/decode.py).  Smaller events (OLTP) keep a Change per row, which
#: the producer folds with the changes around it.
MANY_ROWS_MIN = 16


@dataclass(frozen=True, eq=False)
class ManyRows(Change):
    """Many after images of one op (INSERT or READ), one source transaction,
    one table and position, as one object: ``images``, each one change
    (``before``/``after`` None).  The producer's form of a snapshot chunk
    (READ) and of a binlog INSERT event of ``MANY_ROWS_MIN`` rows or more.
    One object instead of one ``Change`` per row: building the Changes cost
    the producer more than encoding them.  The codec writes one record of
    ``op`` per row, exactly what as many Changes give (codec.encode_pure is
    the reference, the compiled writer its twin), so the wire and the
    applier do not know the form.  The fold keeps it as one slot behind a
    barrier (reducer/fold.py).  Identity equality, as InsertRun."""

    images: tuple[Row, ...] = ()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    @property
    def rows(self) -> int:
        return len(self.images)

    def as_changes(self) -> list[Change]:
        return [Change(self.op, self.database, self.table, self.tid, self.txn, self.commit_ts, self.schema, None, r,
                       None) for r in self.images]


def row_count(changes: Iterable[Change]) -> int:
    """How many row changes ``changes`` hold (an InsertRun or ManyRows counts its rows)."""
    return sum(c.rows if type(c) is InsertRun or type(c) is ManyRows else 1 for c in changes)
