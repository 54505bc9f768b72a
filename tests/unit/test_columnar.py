"""The applier's column-wise path (codec.decode_columnar -> InsertRun ->
fold -> pyarrow LOAD DATA text) against the reference (codec.decode ->
Change rows -> types.encode_field): the same bulk bytes, the same net rows."""
from __future__ import annotations

import datetime
import decimal
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cynomys.applier.batcher import DelayBuffer
from cynomys.applier.targets.base import Flush, build_flush
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.core import compiled
from cynomys.core.columnar import InsertRun, row_count
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, Op, Position, TableSchema
from cynomys.schemas import codec

pytestmark = pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")

UTC = datetime.timezone.utc
COLS = (("id", "int"), ("big", "bigint unsigned"), ("yr", "year"), ("bt", "bit(8)"), ("d", "decimal(20,10)"),
        ("f", "double"), ("s", "varchar(20)"), ("b", "varbinary(8)"), ("dt", "date"), ("dtm", "datetime(6)"),
        ("ts", "timestamp(6)"), ("tm", "time(6)"))
SCHEMA = TableSchema("d", "t", tuple(ColumnDef(n, t) for n, t in COLS), ("id",))


def _value(rng: random.Random, col: int) -> object:
    if col and rng.random() < 0.15:
        return None
    return [
        lambda: rng.randint(1, 10**6),
        lambda: rng.choice([0, 2**64 - 1, rng.randint(0, 2**63)]),
        lambda: rng.choice([0, 1901, 2155, 5]),
        lambda: rng.randint(0, 255),
        lambda: rng.choice([decimal.Decimal("0E-10"), decimal.Decimal("-12.5000000000"),
                            decimal.Decimal("1E-10"), decimal.Decimal(rng.randint(-10**9, 10**9)) / 1000]),
        lambda: rng.choice([0.0, -0.0, 1e16, 1.5e-5, 3.14, -2.5e300, float(rng.randint(0, 99))]),
        lambda: rng.choice(["", "a\tb", "c\nd", "back\\slash", "caf\u00e9 \U0001F600", "\\N", "plain"]),
        lambda: rng.choice([b"", b"\x00\xff", b"\t\n\\", bytes(rng.getrandbits(8) for _ in range(8))]),
        lambda: rng.choice([datetime.date(1, 1, 1), datetime.date(9999, 12, 31), datetime.date(2024, 2, 29)]),
        lambda: datetime.datetime(rng.randint(1, 9999), 12, 31, 23, 59, 59, rng.choice([0, 1, 999999])),
        lambda: datetime.datetime(2038, 1, 19, 3, 14, 7, rng.choice([0, 999999]), tzinfo=UTC),
        lambda: datetime.timedelta(microseconds=rng.choice([-3020399000000, 0, 1, 3020399000000])),
    ][col]()


def _envelopes(rng: random.Random, n: int, ops: bool, reads: bool = False) -> list[bytes]:
    """Envelopes of 1-3 transactions each: inserts of new ids, and with
    ``ops`` also updates, deletes and re-inserts of earlier ids; with
    ``reads`` every third envelope is a snapshot chunk instead: READ rows
    (upserts) of a run of ids, some held already, some new."""
    out: list[bytes] = []
    live: dict[int, tuple[object, ...]] = {}
    dead: list[int] = []
    seq = 0
    for e in range(n):
        changes = []
        if reads and e % 3 == 2:
            seq += 1
            txn = Position("b.000001", seq * 100)
            first = rng.randint(1, len(live) + len(dead) + 5)
            for key in range(first, first + rng.randint(1, 60)):
                row = (key,) + tuple(_value(rng, i) for i in range(1, len(COLS)))
                live[key] = row
                if key in dead:
                    dead.remove(key)
                changes.append(Change(Op.READ, "d", "t", f"snapshot:{seq}", txn, 1, SCHEMA, None, row))
            out.append(codec.encode(Batch("p", tuple(changes), txn)))
            continue
        for t in range(rng.randint(1, 3)):
            seq += 1
            txn = Position("b.000001", seq * 100)
            for _ in range(rng.randint(1, 40)):
                row = tuple(_value(rng, i) for i in range(len(COLS)))
                what = rng.random() if ops and live else 0.0
                if what < 0.7:
                    # a new id, or (sometimes) one deleted earlier: delete + insert folds to an update
                    key = dead.pop() if dead and rng.random() < 0.3 else max([0, *live, *dead]) + 1
                    row = (key,) + row[1:]
                    live[key] = row
                    changes.append(Change(Op.INSERT, "d", "t", str(seq), txn, 1, SCHEMA, None, row))
                else:
                    key = rng.choice(sorted(live))
                    old = live.pop(key)
                    if what < 0.9:
                        live[key] = (key,) + row[1:]
                        changes.append(Change(Op.UPDATE, "d", "t", str(seq), txn, 1, SCHEMA, old, live[key]))
                    else:
                        dead.append(key)
                        changes.append(Change(Op.DELETE, "d", "t", str(seq), txn, 1, SCHEMA, old, None))
        # Each envelope on its own: the fold across envelopes is the applier's.
        out.append(codec.encode(Batch("p", tuple(changes), Position("b.000001", seq * 100 + 50))))
    return out


def _bulk(envelopes: list[bytes], columnar: bool, flush_every: int) -> tuple[list[bytes], int]:
    """Bulk files per flush through the applier's buffer; and how many InsertRuns were seen."""
    buf, files, runs = DelayBuffer(10**9, 1e9), [], 0
    for i, payload in enumerate(envelopes):
        batch = codec.decode_columnar(payload) if columnar else codec.decode(payload)
        runs += sum(type(c) is InsertRun for c in batch.changes)
        buf.add(batch.changes)
        if (i + 1) % flush_every == 0 or i == len(envelopes) - 1:
            flush = build_flush(buf.take(), AppliedState("p", 1, Position("b", 1)), columnar)
            for tf in flush.tables:
                # What a target deletes first: the keys deleted, and a READ
                # run's keys (an upsert; not in delete_keys column-wise).
                deletes = sorted(map(repr, tf.delete_keys + tf.read_keys()))
                files.append(repr(deletes).encode() + b"\n" + ColumnStoreTarget.load_data_bytes(tf.schema, tf.inserts, tf.runs))
    return files, runs


def test_insert_only_envelopes_give_the_same_bytes(compiled_path: object) -> None:
    envelopes = _envelopes(random.Random(1), 30, ops=False)
    before = compiled.fallbacks["decode_columns"]
    ref, _ = _bulk(envelopes, False, 7)
    col, runs = _bulk(envelopes, True, 7)
    assert compiled.fallbacks["decode_columns"] == before, "an insert-only envelope left the column-wise path"
    assert runs >= 30
    assert col == ref  # byte for byte, in the same order


def test_mixed_envelopes_fold_to_the_same_rows(compiled_path: object) -> None:
    # Updates/deletes of keys inserted by earlier runs take those rows out of
    # the runs; a flush then holds plain rows and runs (order may differ).
    envelopes = _envelopes(random.Random(2), 60, ops=True)
    ref, _ = _bulk(envelopes, False, 5)
    col, runs = _bulk(envelopes, True, 5)
    assert runs > 0
    assert len(col) == len(ref)
    for c, r in zip(col, ref):
        assert sorted(c.split(b"\n")) == sorted(r.split(b"\n"))


def test_snapshot_reads_ride_the_column_wise_path_as_upserts(compiled_path: object) -> None:
    # Chunks of READ rows (upserts: their keys are deleted first, whatever
    # the target holds) among inserts, updates and deletes of the same keys:
    # the same deletions and rows as the reference, and the chunks' envelopes
    # never leave the column-wise path.
    envelopes = _envelopes(random.Random(4), 45, ops=True, reads=True)
    before = compiled.fallbacks["decode_columns"]
    chunks = [codec.decode_columnar(e) for e in envelopes[2::3]]
    assert compiled.fallbacks["decode_columns"] == before, "a READ-only envelope left the column-wise path"
    assert all(type(c) is InsertRun and c.op is Op.READ for b in chunks for c in b.changes)
    assert [c.as_changes() for b in chunks for c in b.changes] == \
        [list(codec.decode(e).changes) for e in envelopes[2::3]]
    for flush_every in (1, 4):
        ref, _ = _bulk(envelopes, False, flush_every)
        col, runs = _bulk(envelopes, True, flush_every)
        assert runs > 0
        assert len(col) == len(ref)
        for c, r in zip(col, ref):
            assert sorted(c.split(b"\n")) == sorted(r.split(b"\n"))


def _expanded(batch: Batch) -> list[tuple[Change, list[tuple[type, object]]]]:
    """Every change as the reference gives it, with its values' types."""
    out = []
    for c in batch.changes:
        for x in (c.as_changes() if isinstance(c, InsertRun) else [c]):
            out.append((x, [(type(v), v) for img in (x.before, x.after) for v in img or ()]))
    return out


def test_updates_deletes_and_ddl_are_read_by_the_compiled_reader_like_the_reference(compiled_path: object) -> None:
    """Envelopes of inserts, updates, deletes, snapshot reads and DDL (SQL
    text, no images): the compiled reader takes them all (no fallback) and
    gives the reference's changes, values of the same types, in order."""
    envelopes = _envelopes(random.Random(5), 40, ops=True, reads=True)
    ddl = Change(Op.DDL, "d", "t", "9", Position("b.000002", 4), 7, None, None, None, "ALTER TABLE t ADD c int")
    upd = Change(Op.UPDATE, "d", "t", "9", Position("b.000002", 4), 7, SCHEMA,
                 (1,) + (None,) * (len(COLS) - 1), (1,) + (None,) * (len(COLS) - 1))
    envelopes.append(codec.encode(Batch("p", (upd, ddl, upd), Position("b.000002", 90))))
    before, values_before = compiled.fallbacks["decode_columns"], compiled.fallbacks["column_values"]
    for payload in envelopes:
        ref, col = codec.decode(payload), codec.decode_columnar(payload)
        assert _expanded(col) == _expanded(ref)
        assert (col.producer_id, col.end, col.complete, col.first_txn, col.meta) == \
            (ref.producer_id, ref.end, ref.complete, ref.first_txn, ref.meta)
    assert compiled.fallbacks["decode_columns"] == before, "an envelope left the compiled reader"
    assert compiled.fallbacks["column_values"] == values_before, "a column's values left the compiled path"
    assert any(c.op is Op.UPDATE for p in envelopes for c in codec.decode_columnar(p).changes)
    # One table definition is one object across envelopes (a flush compares
    # shapes by identity first), and a transaction's changes share a position.
    schemas = {id(c.schema) for p in envelopes for c in codec.decode_columnar(p).changes if c.schema is not None}
    assert len(schemas) == 1
    last = codec.decode_columnar(envelopes[-1]).changes
    assert last[0].txn is last[2].txn


def test_runs_count_as_rows_and_materialize_like_the_reference(compiled_path: object) -> None:
    payload = _envelopes(random.Random(3), 1, ops=False)[0]
    ref, col = codec.decode(payload), codec.decode_columnar(payload)
    assert row_count(col.changes) == len(ref.changes)
    images = [r for c in col.changes for r in (c.images() if isinstance(c, InsertRun) else [c.after])]
    assert images == [c.after for c in ref.changes]
    assert [(type(v), v) for r in images for v in r] == [(type(v), v) for c in ref.changes for v in c.after or ()]


def test_pure_path_decodes_with_the_reference() -> None:
    payload = _envelopes(random.Random(4), 1, ops=False)[0]
    was = compiled.ext is not None
    compiled.use_compiled(False)
    try:
        batch = codec.decode_columnar(payload)
    finally:
        compiled.use_compiled(was)
    assert batch == codec.decode(payload)
    assert not any(isinstance(c, InsertRun) for c in batch.changes)


def test_held_counts_run_rows_like_the_reference(compiled_path: object) -> None:
    # The backlog cap (Applier._full) reads DelayBuffer.held(): a run must
    # count as its live rows, also after the fold took some of them out.
    envelopes = _envelopes(random.Random(4), 40, ops=True)
    ref, col = DelayBuffer(10**9, 1e9), DelayBuffer(10**9, 1e9)
    for i, payload in enumerate(envelopes):
        ref.add(codec.decode(payload).changes)
        col.add(codec.decode_columnar(payload).changes)
        if i % 9 == 8:
            ref.seal()
            col.seal()
        assert col.held() == ref.held(), f"after envelope {i}"


def test_pieces_give_the_same_bytes(compiled_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    # The LOAD DATA file is written in pieces of PIECE_ROWS rows (the
    # applier's memory, issue #12): tiny pieces cut runs, blocks and the row
    # images anywhere, and the file must not change by a byte.
    from cynomys.core import columnar

    inserts, mixed = _envelopes(random.Random(5), 30, ops=False), _envelopes(random.Random(6), 40, ops=True)
    whole = [_bulk(inserts, False, 7)[0], _bulk(inserts, True, 7)[0], _bulk(mixed, True, 5)[0], _bulk(mixed, False, 5)[0]]
    for rows in (1, 3, 64):
        monkeypatch.setattr(columnar, "PIECE_ROWS", rows)  # row images and runs alike
        pieces = [_bulk(inserts, False, 7)[0], _bulk(inserts, True, 7)[0], _bulk(mixed, True, 5)[0],
                  _bulk(mixed, False, 5)[0]]
        assert pieces == whole, f"PIECE_ROWS={rows}"
    assert whole[0] == whole[1]


def test_the_columnar_path_never_imports_pandas() -> None:
    # pyarrow imports pandas (~40 MB of RSS) the first time pa.array or
    # pa.scalar gets Python values; the applier's LOAD DATA path must not,
    # for any column kind, with rows taken out of runs (excluded) too.
    script = (
        "import sys\n"
        "from cynomys.core import compiled\n"
        "compiled.use_compiled(True)\n"
        "from tests.unit.test_columnar import _bulk, _envelopes\n"
        "import random\n"
        "files, runs = _bulk(_envelopes(random.Random(7), 40, ops=True), True, 5)\n"
        "assert runs and files\n"
        "print('pyarrow' in sys.modules, 'pandas' in sys.modules)\n")
    assert _printed_by_a_fresh_process(script) == ["True", "False"]


def test_the_pure_python_columnstore_applier_never_imports_pyarrow() -> None:
    # Without the compiled reader there are no InsertRuns: the ColumnStore
    # target writes row images and needs no pyarrow (~50 MB of RSS).
    script = (
        "import sys\n"
        "from cynomys.core import compiled\n"
        "compiled.use_compiled(False)\n"
        "import cynomys.applier.loop\n"
        "from tests.unit.test_columnar import _bulk, _envelopes\n"
        "import random\n"
        "files, runs = _bulk(_envelopes(random.Random(8), 20, ops=True), False, 5)\n"
        "assert files and not runs\n"
        "print('pyarrow' in sys.modules)\n")
    assert _printed_by_a_fresh_process(script) == ["False"]


def _printed_by_a_fresh_process(script: str) -> list[str]:
    """What ``script`` prints (split), run in a new interpreter: which modules
    a code path imports can only be seen in a process that imported nothing."""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize("values", [
    ["plain", "a\tb", "text", None, "c"],          # the tab is outside the slice taken below
    ["plain", "x", "back\\slash", None, "c\nd"],   # inside it
    ["plain", "x", "y", None, "z"],                # nowhere
])
def test_load_data_escapes_look_at_the_slice_only_as_a_shortcut(values: list[str | None]) -> None:
    """The escape passes are skipped when a column's bytes hold nothing to
    escape; a slice of a block whose other rows do is written exactly as
    the reference writes it either way."""
    import pyarrow as pa

    from cynomys.applier.targets.arrow import text_array
    from cynomys.applier.targets.columnstore.loaddata import LOAD_DATA_TEXT, _needs_escape
    from cynomys.applier.targets.columnstore.types import encode_field

    col = ColumnDef("s", "varchar(20)")
    for arr in (text_array(values), text_array(values).slice(2, 3)):
        want = [None if v is None else encode_field(v) for v in arr.to_pylist()]
        for kind in ("StringColumn", "BytesColumn"):
            a = arr if kind == "StringColumn" else arr.cast(pa.binary())
            got = LOAD_DATA_TEXT[kind](a, col).cast(pa.binary()).to_pylist()
            assert got == want, (kind, arr.to_pylist())
    sliced = text_array(values).slice(2, 3).to_pylist()
    assert _needs_escape(text_array(values).slice(2, 3)) == any(
        c in v for v in sliced if v is not None for c in "\\\t\n")


KEYLESS = TableSchema("d", "k", tuple(ColumnDef(n, t) for n, t in COLS), ())


def _keyless_rows(flush: Flush) -> list[bytes]:
    """A keyless flush as the target sees it: the rows deleted (with their
    counts) and the LOAD DATA lines inserted, as sorted multisets."""
    (tf,) = flush.tables
    deleted = sorted(repr(kv).encode() for kv in tf.delete_rows.items())
    lines = ColumnStoreTarget.load_data_bytes(tf.schema, tf.inserts, tf.runs).splitlines()
    return deleted + [b"--"] + sorted(lines)


@pytest.mark.parametrize("deletes", [False, True])
def test_a_keyless_tables_runs_stay_column_wise_unless_the_flush_deletes_its_rows(
        compiled_path: object, deletes: bool) -> None:
    """A keyless table's snapshot read and bulk inserts reach a target with
    ``keyless_runs`` as InsertRuns (no Python row per value); a flush that
    also deletes rows of it nets them as whole rows, as before.  Either way
    the target gets the multiset the reference path gives."""
    rng = random.Random(3)
    rows = [tuple(_value(rng, i) for i in range(len(COLS))) for _ in range(50)]
    rows += rows[:5]  # identical rows: a multiset
    envelopes = [
        codec.encode(Batch("p", tuple(Change(Op.READ, "d", "k", "snapshot:1", Position("b.000001", 100), 1, KEYLESS,
                                             None, r) for r in rows[:30]), Position("b.000001", 100))),
        codec.encode(Batch("p", tuple(Change(Op.INSERT, "d", "k", "7", Position("b.000001", 200), 1, KEYLESS,
                                             None, r) for r in rows[30:]), Position("b.000001", 250))),
    ]
    if deletes:  # one copy of a row read above, and a row never held
        envelopes.append(codec.encode(Batch("p", (
            Change(Op.DELETE, "d", "k", "8", Position("b.000001", 300), 1, KEYLESS, rows[0], None),
            Change(Op.DELETE, "d", "k", "8", Position("b.000001", 300), 1, KEYLESS, rows[40][:1] + (None,) * 11, None),
        ), Position("b.000001", 350))))
    state = AppliedState("p", 1, Position("b", 1))
    got, want = DelayBuffer(10**9, 1e9), DelayBuffer(10**9, 1e9)
    for payload in envelopes:
        got.add(codec.decode_columnar(payload).changes)
        want.add(codec.decode(payload).changes)
    assert got.held() == want.held() == len(rows) + (2 if deletes else 0)  # a run counts its rows
    flush = build_flush(got.take(), state, columnar=True, keyless_runs=True)
    ref = build_flush(want.take(), state, columnar=True)
    (tf,) = flush.tables
    assert [len(tf.runs) > 0, len(tf.inserts) > 0] == ([False, True] if deletes else [True, False])
    assert _keyless_rows(flush) == _keyless_rows(ref)
    # The copy of rows[0] deleted nets against one read here; the other row is deleted from the target.
    assert sum(tf.delete_rows.values()) == (1 if deletes else 0)


def test_column_values_are_made_as_pyarrow_and_the_codec_make_them(compiled_path: object) -> None:
    """_speedups.column_values against to_pylist + the codec's conversion,
    every wire kind, NULLs, slices (an array offset) and concatenations."""
    import pyarrow as pa

    from cynomys.core.columnar import _compiled_values

    blocks = [c.block for p in _envelopes(random.Random(8), 30, ops=False)
              for c in codec.decode_columnar(p).changes if isinstance(c, InsertRun)]
    assert blocks
    seen = set()
    for block in blocks:
        for col, (kind, arr) in enumerate(zip(block.kinds, block.arrays)):
            conv = block._to_python[col]
            for piece in (arr, arr.slice(1, max(0, len(arr) - 2)), pa.concat_arrays([arr, arr.slice(len(arr) // 2)])):
                raw = piece.to_pylist()
                want = raw if conv is None else [None if v is None else conv(v) for v in raw]
                got = _compiled_values(kind, piece)
                assert got is not None
                assert [(type(v), v) for v in got] == [(type(v), v) for v in want]
                assert all(g.tzinfo is w.tzinfo for g, w in zip(got, want) if isinstance(g, datetime.datetime))
                seen.add((kind, piece.null_count > 0))
    assert {k for k, _ in seen} >= {"LongColumn", "DoubleColumn", "StringColumn", "BytesColumn", "DecimalColumn",
                                    "DateColumn", "DateTimeColumn", "TimestampColumn", "TimeColumn"}
    assert any(nulls for _, nulls in seen)


def test_a_date_outside_python_years_goes_to_the_reference(compiled_path: object) -> None:
    import array

    import pyarrow as pa

    from cynomys.core.columnar import _compiled_values

    before = compiled.fallbacks["column_values"]
    for kind, typ, code, value in (("DateColumn", pa.int32(), "i", 2932897),
                                   ("DateTimeColumn", pa.int64(), "q", 253402300800000000)):
        arr = pa.Array.from_buffers(typ, 1, [None, pa.py_buffer(array.array(code, [value]))])
        assert _compiled_values(kind, arr) is None
    assert compiled.fallbacks["column_values"] == before + 2
