"""What a Spark target writes: flush markers, MERGE source rows, statements.

Pure data and text (no session): the SparkTarget builds one Arrow table per
table of a flush from these rows and runs one of these statements on it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from cynomys.applier.targets import state as applied_state
from cynomys.applier.targets.base import TableFlush
from cynomys.core.dialect import SPARK
from cynomys.core.model import AppliedState, Row, TableSchema, Value

log = logging.getLogger(__name__)

#: Column of the MERGE source saying what a row is: 'U' upsert, 'D' delete, 'I' insert.
OP_COLUMN = "__cynomys_op"
#: Column of the keyless MERGE source: copies of a row value to delete.
COUNT_COLUMN = "__cynomys_n"

#: Snapshot summary keys of the flush marker: the state's fields as text
#: (targets/state.py ``as_text``), lineage aside.
MARKS: dict[str, str] = {
    applied_state.KEY: "cynomys.producer", "seq": "cynomys.seq", "file": "cynomys.file", "pos": "cynomys.pos",
    "gtid": "cynomys.gtid", "commit_ts": "cynomys.commit-ts"}
MARK_PRODUCER = MARKS[applied_state.KEY]
#: Snapshot summary key of a commit staging part of a source transaction
#: on a branch (target.py, "A source transaction in parts"): the producer.
PART_MARK = "cynomys.part-of"


def marker(state: AppliedState) -> dict[str, str]:
    """Snapshot summary properties naming the flush (or DDL) a commit belongs to."""
    return {MARKS[k]: v for k, v in applied_state.as_text(state).items()}


#: Prefix of the flush marker inside a part commit's summary: a part that
#: precedes its flush's own commit (snapshot rows appended directly,
#: ``direct.py``) names its flush without being taken for it.
PART_PREFIX = "cynomys.part."


def part_marker(state: AppliedState) -> dict[str, str]:
    """Snapshot summary of a commit made ahead of ``state``'s own commit of
    the same table in one flush: rolled back with it, or alone when the
    flush's commit never came (``SparkTarget._ahead``)."""
    return {PART_MARK: state.producer_id, **{PART_PREFIX + k[len("cynomys."):]: v for k, v in marker(state).items()}}


def part_state(summary: dict[str, str]) -> AppliedState | None:
    """The flush a part commit was made for (``part_marker``), if it says."""
    producer = summary.get(PART_MARK)
    inner = {"cynomys." + k[len(PART_PREFIX):]: v for k, v in summary.items() if k.startswith(PART_PREFIX)}
    return marker_of(inner, producer) if producer and inner else None


def marker_of(summary: dict[str, str], producer_id: str) -> AppliedState | None:
    """The flush a snapshot summary names, if it is one of ``producer_id``'s."""
    if summary.get(MARK_PRODUCER) != producer_id:
        return None
    return applied_state.from_text({k: summary[mark] for k, mark in MARKS.items() if mark in summary})


#: How states of a producer compare (targets/state.py).
order = applied_state.order
same_flush = applied_state.same_flush


#: A Spark SQL identifier, in backquotes (backquotes doubled).
q = SPARK.ident


def lit(text: str) -> str:
    """A Spark SQL string literal.  Spark reads 'a''b' as two adjacent
    literals ('ab'), so quotes are escaped with a backslash."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class Layout:
    """The columns a target table has: name -> Spark field (lower-case keys)."""

    fields: dict[str, T.StructField]

    @classmethod
    def of(cls, schema: T.StructType) -> Layout:
        return cls({f.name.lower(): f for f in schema.fields})

    def get(self, name: str) -> T.StructField | None:
        return self.fields.get(name.lower())

    def has(self, name: str) -> bool:
        return name.lower() in self.fields


@dataclass
class TablePlan:
    """One table's part of a flush, encoded and ready to commit."""

    schema: TableSchema
    name: str                          # qualified Spark name
    data: pa.Table
    spark_schema: T.StructType
    sql: str                           # the statement; {src} stands for the source view
    rows: int = 0
    #: Snapshot rows that may go to the table as a data file of their own
    #: (``direct.py``): the rows of ``data`` from here on are READ rows;
    #: ``written``/``match``/``null_safe`` rebuild the MERGE of the rest.
    reads_from: int | None = None
    written: list[str] = field(default_factory=list)
    match: list[str] = field(default_factory=list)
    null_safe: frozenset[str] = frozenset()
    #: What the flush log line adds for this table (direct appends).
    note: str = ""
    #: A way to commit it without a Spark job, tried before the statement
    #: (target.py ``_fast``): "append" (a data file, ``direct.py``),
    #: "upsert" or "multiset" (a keyed or keyless row delta, ``delta.py``)
    #: or "" (the statement only).
    fast: str = ""
    #: When its commit ended (time.time(); 0: not committed yet): readers
    #: see it from there on (the freshness metric's moment).
    committed_at: float = 0.0


@dataclass
class Columns:
    """The columns of a MERGE source being built: names, Arrow arrays, Spark fields."""

    names: list[str] = field(default_factory=list)
    arrays: list[pa.Array | pa.ChunkedArray] = field(default_factory=list)
    fields: list[T.StructField] = field(default_factory=list)

    def add(self, name: str, array: pa.Array | pa.ChunkedArray, spark_type: T.DataType) -> None:
        # Every column nullable: a key of zero dates is NULL in its typed column.
        self.names.append(name)
        self.arrays.append(array)
        self.fields.append(T.StructField(name, spark_type, True))


def keyed_rows(tf: TableFlush) -> tuple[list[Row], list[str], list[int | None]]:
    """Final images ('U') and keys deleted without a new image ('D'),
    at most one source row per key (MERGE refuses more)."""
    idx = tf.schema.key_indexes()
    latest: dict[tuple[Value, ...], Row] = {}
    for r in tf.inserts:
        latest[tuple(r[i] for i in idx)] = r
    if len(latest) < len(tf.inserts):
        log.warning("table %s: %d final images share a key; the last one of each key is kept",
                    tf.schema.name, len(tf.inserts) - len(latest))
    # A snapshot's READ runs: the MERGE upserts run rows ('U'), and a key may
    # be one source row only, so a key the log deleted and a READ row brings
    # back is not also a 'D' row (their keys are not in delete_keys).
    upserted = set(tf.read_keys()) if tf.delete_keys else set()
    deleted = [k for k in dict.fromkeys(tf.delete_keys) if k not in latest and k not in upserted]
    width = len(tf.schema.columns)
    rows: list[Row] = list(latest.values())
    for k in deleted:
        image: list[Value] = [None] * width
        for i, v in zip(idx, k, strict=True):
            image[i] = v
        rows.append(tuple(image))
    return rows, ["U"] * len(latest) + ["D"] * len(deleted), [None] * len(rows)


def keyless_rows(tf: TableFlush) -> tuple[list[Row], list[str], list[int | None]]:
    """Row values to delete ('D', with how many copies) and rows to insert ('I')."""
    deletes = list(tf.delete_rows.items())
    rows = [r for r, _ in deletes] + list(tf.inserts)
    counts: list[int | None] = [n for _, n in deletes]
    return rows, ["D"] * len(deletes) + ["I"] * len(tf.inserts), counts + [None] * len(tf.inserts)


# --------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------
def keyed_merge(name: str, columns: list[str], match: list[str], null_safe: frozenset[str] = frozenset(),
                prune: str = "") -> str:
    """MERGE of final images ('U') and deleted keys ('D') on the key.

    Key columns compare with ``=`` (primary keys are never NULL); ``null_safe``
    names the match columns that can be NULL after all (a key of zero dates
    is NULL in its typed column, its text in the companion).  ``prune`` is
    an extra condition on the target alone (the key range of the source):
    Spark pushes it into the target scan, where Iceberg skips the files
    whose column bounds miss it -- only with ``=``: with ``<=>`` the join
    keys become coalesce/isnull pairs and EXPLAIN shows no pushed filter.
    Measured (bench_spark_merge.py --growth, 300k rows, 10k-row flushes,
    variants interleaved): updates among the newest 10% of keys 0.83 s vs
    1.24 s a flush; keys spread over the whole table 1.80 s vs 1.57 s (the
    range prunes nothing there, and ``=`` costs ~12% for a reason not yet
    found)."""
    on = " AND ".join(f"t.{q(c)} {'<=>' if c in null_safe else '='} s.{q(c)}" for c in match)
    if prune:
        on += f" AND {prune}"
    lowered = {m.lower() for m in match}
    update = ", ".join(f"t.{q(c)} = s.{q(c)}" for c in columns if c.lower() not in lowered)
    insert = ", ".join(q(c) for c in columns)
    values = ", ".join(f"s.{q(c)}" for c in columns)
    return (f"MERGE INTO {name} t USING {{src}} s ON {on}\n"
            f"WHEN MATCHED AND s.{q(OP_COLUMN)} = 'D' THEN DELETE\n"
            + (f"WHEN MATCHED THEN UPDATE SET {update}\n" if update else "")
            + f"WHEN NOT MATCHED AND s.{q(OP_COLUMN)} = 'U' THEN INSERT ({insert}) VALUES ({values})")


def key_range(column: str, array: pa.Array) -> str:
    """``t.column BETWEEN min AND max`` of a source key column, or '' when
    the column's type has no exact literal here (or holds a NULL)."""
    if array.null_count or len(array) == 0:
        return ""
    t = array.type
    if not (pa.types.is_integer(t) or pa.types.is_string(t)):
        return ""
    lo, hi = (v.as_py() for v in pc.min_max(array).values())
    if isinstance(lo, str) and isinstance(hi, str):
        bounds = f"{lit(lo)} AND {lit(hi)}"
    else:
        bounds = f"{int(lo)} AND {int(hi)}"
    return f"t.{q(column)} BETWEEN {bounds}"


#: Keys further apart than this split the source's keys into spans
#: (merge.key_spans): a range across such a gap would let through target
#: rows the flush does not touch.
SPAN_GAP = 64
#: A span becomes a range when it holds at least this many keys; fewer are
#: listed one by one.
SPAN_MIN_KEYS = 4
#: At most this many ranges in one prune condition (Spark evaluates each
#: on every row of the files it reads).
SPAN_MAX_RANGES = 16


def key_spans(values: np.ndarray, max_values: int) -> tuple[list[tuple[int, int]], list[int]] | None:
    """Sorted distinct integer keys ``values`` covered by at most
    ``SPAN_MAX_RANGES`` ranges plus at most ``max_values`` single keys, or
    None when they cannot be.  Every value is covered: a range spans its
    first and last key.

    Why: a MERGE's target side is every target row its prune condition
    lets through, shuffled and sorted for the join.  A flush holding a
    snapshot chunk (dense keys) and a few updates spread over the table had
    the whole table as its range, so every flush of an initial load under
    writers shuffled the whole table, and cost more as the table grew
    (1.1 s at 150k rows, 1.8 s at 1M).  Keys are cut where the next one is
    more than ``SPAN_GAP`` away: a chunk's or a batch of inserts' keys stay
    one range, a scattered update stands alone."""
    n = len(values)
    if n == 0:
        return [], []
    # float: the gaps of a BIGINT UNSIGNED key do not fit in int64.
    cuts = np.flatnonzero(np.diff(values.astype(np.float64)) > SPAN_GAP) + 1
    starts = np.concatenate(([0], cuts)).astype(np.int64)
    ends = np.concatenate((cuts, [n])).astype(np.int64)
    sizes = ends - starts
    # The biggest spans become ranges, the rest single keys.
    big = [int(i) for i in np.argsort(-sizes, kind="stable")[:SPAN_MAX_RANGES] if sizes[i] >= SPAN_MIN_KEYS]
    if n - int(sizes[big].sum()) > max_values:
        return None
    ranges = sorted((int(values[starts[i]]), int(values[ends[i] - 1])) for i in big)
    chosen = set(big)
    singles = [int(v) for i in range(len(starts)) if i not in chosen for v in values[starts[i]:ends[i]]]
    return ranges, singles


def key_prune(column: str, array: pa.Array, max_values: int) -> str:
    """The target-side condition of a keyed MERGE on the first key column:
    the source's keys as ranges and single keys (``key_spans``) where that
    is short, else their whole range (``key_range``); '' when the column
    has no exact literal here or a NULL."""
    if array.null_count or len(array) == 0 or not pa.types.is_integer(array.type):
        return key_range(column, array)
    values = np.unique(array.to_numpy(zero_copy_only=False))
    spans = key_spans(values, max_values)
    if spans is None or (len(spans[0]) == 1 and not spans[1]):
        return key_range(column, array)
    ranges, singles = spans
    c = f"t.{q(column)}"
    parts = [f"{c} BETWEEN {lo} AND {hi}" for lo, hi in ranges]
    if singles:
        parts.append(f"{c} IN ({', '.join(map(str, singles))})")
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def key_values(column: str, array: pa.Array, limit: int) -> str:
    """``t.column IN (...)`` of a source key column's distinct values, or ''
    when there are more than ``limit`` of them (or a NULL, or a type without
    an exact literal here).  For a table partitioned by a transform of the
    column (bucket, identity, truncate): Iceberg projects the values through
    the transform and reads only the partitions they fall in, where a range
    prunes nothing (every bucket spans the whole key range).  Spark's
    dynamic partition pruning does not reach the target scan of a
    merge-on-read MERGE (EXPLAIN shows ``RuntimeFilters: []``), hence the list."""
    if array.null_count or len(array) == 0 or not (pa.types.is_integer(array.type) or pa.types.is_string(array.type)):
        return ""
    values = pc.unique(array)
    if len(values) > limit:
        return ""
    items = values.to_pylist()
    text = ", ".join(lit(v) for v in items) if pa.types.is_string(array.type) else ", ".join(str(int(v)) for v in items)
    return f"t.{q(column)} IN ({text})"


def keyless_merge(name: str, columns: list[str]) -> str:
    """Delete every copy of each deleted row value, insert back the copies
    that stay (present - deleted, counted in the same statement), insert
    the new rows.  Rows compare NULL-safe on every column."""
    cols = ", ".join(q(c) for c in columns)
    d_cols = ", ".join(f"d.{q(c)}" for c in columns)
    joined = " AND ".join(f"x.{q(c)} <=> d.{q(c)}" for c in columns)
    on = " AND ".join(f"t.{q(c)} <=> s.{q(c)}" for c in columns)
    values = ", ".join(f"s.{q(c)}" for c in columns)
    op, n = q(OP_COLUMN), q(COUNT_COLUMN)
    return (f"MERGE INTO {name} t USING (\n"
            f"  SELECT {cols}, {op} FROM {{src}}\n"
            f"  UNION ALL\n"
            f"  SELECT {cols}, 'I' FROM (\n"
            f"    SELECT {d_cols},\n"
            f"      explode(array_repeat(0, CAST(greatest(count(x.`__cynomys_one`) - d.{n}, 0) AS INT)))\n"
            f"    FROM (SELECT * FROM {{src}} WHERE {op} = 'D') d\n"
            f"    LEFT JOIN (SELECT {cols}, 1 AS `__cynomys_one` FROM {name}) x ON {joined}\n"
            f"    GROUP BY {d_cols}, d.{n})\n"
            f") s ON s.{op} = 'D' AND {on}\n"
            f"WHEN MATCHED THEN DELETE\n"
            f"WHEN NOT MATCHED AND s.{op} = 'I' THEN INSERT ({cols}) VALUES ({values})")


def append(name: str, columns: list[str], absent: dict[str, str] | None = None) -> str:
    """INSERT of the source's columns; ``absent`` (name -> SQL type) are the
    table's columns the flush does not have (a skipped or late DDL): they
    get NULL.  Spark's INSERT refuses a column list that leaves one out."""
    extra = list((absent or {}).items())
    cols = ", ".join(q(c) for c in columns + [c for c, _ in extra])
    values = ", ".join([q(c) for c in columns] + [f"CAST(NULL AS {t})" for _, t in extra])
    return f"INSERT INTO {name} ({cols}) SELECT {values} FROM {{src}}"
