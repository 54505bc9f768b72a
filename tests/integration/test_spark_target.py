"""SparkTarget against real Spark (local mode) and Iceberg tables on local disk.

One Spark session serves the whole module (starting one costs ~10 s on a
small machine): every target the tests make shares it, and a module
fixture keeps it alive until the end.  What is particular to Spark/Iceberg
is here: the table layout, the flush marker in snapshot summaries, and the
crash window between two table commits; the contract every target passes
runs in test_target_contract.py (target_setups/spark.py).
"""
from __future__ import annotations

import datetime
import itertools
import random
import threading
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import pytest

from cynomys.applier.targets.base import Flush, build_flush, open_target
from cynomys.applier.targets.spark.merge import TablePlan, marker_of
from cynomys.applier.targets.spark.target import SparkTarget
from cynomys.core.columnar import InsertRun
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import AppliedState, Change, ColumnDef, Op, Position, RawTemporal, Row, TableSchema
from cynomys.reducer.fold import fold
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory
from tests.integration.target_setups import spark as spark_setup

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warehouse")


@pytest.fixture(scope="module")
def factory(warehouse: Path) -> Iterator[Factory]:
    f = spark_setup.factory(warehouse)
    f()  # starts the session for the module
    yield f
    f.close()


@pytest.fixture(scope="module")
def target(factory: Factory) -> SparkTarget:
    return factory()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def parquet_factory(factory: Factory, warehouse: Path) -> Iterator[Factory]:
    """Every flush source goes to Spark as a Parquet file (the path large
    flushes take on a local master), whatever its size."""
    f = spark_setup.factory(warehouse, spark_setup.parquet_handoff_target())
    yield f
    f.close()


_names = itertools.count(1)


@pytest.fixture
def db() -> str:
    return f"spark_test_{next(_names)}"


# --------------------------------------------------------------------------
# Layout of the Iceberg tables
# --------------------------------------------------------------------------
def test_registry_opens_it(tmp_path: Path) -> None:
    assert isinstance(open_target(spark_setup.make_config(tmp_path)), SparkTarget)


def _describe(target: SparkTarget, db: str, table: str) -> dict[str, tuple[str, str]]:
    rows = target.spark.sql(f"DESCRIBE TABLE {target.qualified(db, table)}").collect()
    return {r.col_name: (r.data_type, r.comment or "") for r in rows if r.col_name and not r.col_name.startswith("#")}


def test_all_types_layout_and_read_back_after_restart(factory: Factory, target: SparkTarget, db: str) -> None:
    schema = contract.all_types_schema(db)
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in contract.ALL_TYPES_ROWS]))
    cols = _describe(target, db, "all_types")
    expected = {
        "ti": "int", "ti_u": "int", "si_u": "int", "mi_u": "int", "i_u": "bigint", "bi": "bigint",
        "bi_u": "decimal(20,0)", "dec": "string", "f": "float", "d": "double", "b": "decimal(20,0)", "b1": "bigint",
        "dt": "date", "dtt": "timestamp_ntz", "ts": "timestamp", "tm": "bigint", "yr": "int", "s": "string",
        "bn": "binary", "bl": "binary", "e": "string", "st": "string", "j": "string",
        # zero/partial dates arrived in these: companions hold MySQL's text
        "zd__cynomys_raw": "string", "zdt__cynomys_raw": "string", "zts__cynomys_raw": "string",
    }
    assert {c: cols[c][0] for c in expected} == expected
    assert cols["tm"][1] == "signed microseconds; mysql:time(6)"
    assert cols["e"][1] == "mysql:enum('a','b','it''s')"
    assert "dt__cynomys_raw" not in cols  # only where such values came
    props = {r.key: r.value for r in target.spark.sql(
        f"SHOW TBLPROPERTIES {target.qualified(db, 'all_types')}").collect()}
    assert props["format-version"] == "3" and props["write.merge.mode"] == "merge-on-read"
    assert props["cynomys.primary-key"] == '["id"]'
    # A new target (as after a restart) reads the source types from the comments.
    fresh = factory()
    contract.assert_rows(fresh, schema, contract.ALL_TYPES_ROWS)
    raw = target.spark.sql(f"SELECT zd, zd__cynomys_raw, tm, bi_u FROM {target.qualified(db, 'all_types')} "
                           "WHERE id = 1").collect()[0]
    assert raw.zd is None and raw.zd__cynomys_raw == "0000-00-00"
    assert raw.tm == (838 * 3600 + 59 * 60 + 59) * 10**6 and raw.bi_u == Decimal(2**64 - 1)


def test_all_types_through_the_parquet_handoff(parquet_factory: Factory, db: str) -> None:
    schema = contract.all_types_schema(db)
    t = parquet_factory()
    t.apply(contract.flush([contract.change(Op.INSERT, schema, after=r) for r in contract.ALL_TYPES_ROWS]))
    contract.assert_rows(t, schema, contract.ALL_TYPES_ROWS)
    assert t._spool_dir is not None and not list(t._spool_dir.iterdir())  # each file removed after its commit


def test_zero_date_in_a_key(target: SparkTarget, db: str) -> None:
    schema = TableSchema(db, "zkey", (ColumnDef("d", "date"), ColumnDef("v", "int")), ("d",))
    zero, real = RawTemporal("0000-00-00"), datetime.date(2020, 1, 1)
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(zero, 1)),
                                 contract.change(Op.INSERT, schema, after=(real, 2))]))
    target.apply(contract.flush([contract.change(Op.UPDATE, schema, before=(zero, 1), after=(zero, 10))]))
    contract.assert_rows(target, schema, [(zero, 10), (real, 2)])
    target.apply(contract.flush([contract.change(Op.DELETE, schema, before=(zero, 10))]))
    contract.assert_rows(target, schema, [(real, 2)])


def test_type_without_mapping_is_refused(target: SparkTarget, db: str) -> None:
    schema = TableSchema(db, "odd", (ColumnDef("id", "int"), ColumnDef("u", "uuid")), ("id",))
    with pytest.raises(TargetRejectedError, match=rf"{db}\.odd.*'u'.*uuid"):
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, "x"))]))


# --------------------------------------------------------------------------
# Exactly-once: the flush marker and the crash window between table commits
# --------------------------------------------------------------------------
class Crash(BaseException):
    """The process dies (no cleanup runs)."""


class CrashingTarget(SparkTarget):
    """Dies before committing table ``dies_at`` of its next flush; the
    flush's other tables commit (one after another, or at the same time
    from the commit threads: the same outcome either way)."""

    dies_at = "b"

    def _commit(self, plan: TablePlan, state: AppliedState, recorded: AppliedState | None) -> bool:
        if plan.schema.table == self.dies_at:
            raise Crash(f"killed before committing {plan.schema.name}")
        return super()._commit(plan, state, recorded)

    def _abort(self, done: list[TablePlan], producer_id: str, recorded: AppliedState | None) -> None:
        pass  # a dead process rolls nothing back


class CrashingBeforeA(CrashingTarget):
    dies_at = "a"


KEYED = ("id", "v")


def _tables(db: str) -> tuple[TableSchema, TableSchema]:
    a = TableSchema(db, "a", (ColumnDef("id", "int"), ColumnDef("v", "varchar(10)")), ("id",))
    b = TableSchema(db, "b", (ColumnDef("x", "int"), ColumnDef("s", "varchar(10)")), ())  # keyless
    return a, b


def test_snapshot_summary_carries_the_flush(target: SparkTarget, db: str) -> None:
    a, _ = _tables(db)
    _, b = _tables(db)
    st = contract.state(seq=41, pos=4100, producer=f"mark-{db}")
    fl = contract.flush([contract.change(Op.INSERT, a, after=(1, "x")), contract.change(Op.INSERT, b, after=(1, "x"))],
                        st)
    target.apply(fl)
    snap = target.iceberg.current(db, "a")
    assert snap is not None and snap.operation in ("append", "overwrite")
    assert marker_of(snap.summary, st.producer_id) == st
    assert target.applied(st.producer_id) == st
    # The same flush again (a replay) finds itself in every table: nothing is written twice.
    target.apply(fl)
    assert target.iceberg.current(db, "a") == snap
    contract.assert_rows(target, b, [(1, "x")])


@pytest.mark.parametrize("commit_threads", [1, 4])
def test_crash_between_table_commits_replays_once(factory: Factory, db: str, commit_threads: int) -> None:
    producer = f"crash-{db}"
    a, b = _tables(db)
    first = factory()
    s1 = contract.state(seq=1, producer=producer)
    first.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "a")),
                                contract.change(Op.INSERT, b, after=(1, "x")),
                                contract.change(Op.INSERT, b, after=(1, "x"))], s1))
    # Flush 2 commits table a, then the process dies before b and the state.
    s2 = contract.state(seq=2, producer=producer)
    fl = contract.flush([contract.change(Op.UPDATE, a, before=(1, "a"), after=(1, "A")),
                         contract.change(Op.INSERT, a, after=(2, "b")),
                         contract.change(Op.DELETE, b, before=(1, "x")),
                         contract.change(Op.INSERT, b, after=(2, "y"))], s2)
    crashing = factory(cls=CrashingTarget, spark={"commit_threads": commit_threads})
    with pytest.raises(Crash):
        crashing.apply(fl)
    crashing.close()
    a_snapshot = first.iceberg.current(db, "a")
    assert a_snapshot is not None and marker_of(a_snapshot.summary, producer) == s2
    contract.assert_rows(first, b, [(1, "x"), (1, "x")])
    # Restart: the state says flush 1, so the applier replays flush 2.
    restarted = factory()
    assert restarted.applied(producer) == s1
    restarted.apply(fl)
    after = restarted.iceberg.current(db, "a")
    assert after is not None and after.id == a_snapshot.id  # a was skipped, not written again
    contract.assert_rows(restarted, a, [(1, "A"), (2, "b")])
    contract.assert_rows(restarted, b, [(1, "x"), (2, "y")])  # b applied once: one copy deleted
    assert restarted.applied(producer) == s2


def test_crash_then_replay_cut_differently(factory: Factory, db: str) -> None:
    """The redelivered envelopes may be flushed at other boundaries: the
    table ahead of the state is rolled back, then each replayed flush applies
    exactly once (a keyless multiset shows any double application)."""
    producer = f"cut-{db}"
    a, b = _tables(db)
    first = factory()
    s1 = contract.state(seq=1, pos=100, producer=producer)
    first.apply(contract.flush([contract.change(Op.INSERT, b, after=r) for r in [(1, "x"), (1, "x"), (2, "y")]]
                               + [contract.change(Op.INSERT, a, after=(1, "a"))], s1))
    changes = [contract.change(Op.DELETE, b, before=(1, "x")), contract.change(Op.INSERT, b, after=(3, "z")),
               contract.change(Op.UPDATE, a, before=(1, "a"), after=(1, "A"))]
    s3 = contract.state(seq=3, pos=300, producer=producer)
    crashing = factory(cls=CrashingBeforeA)
    with pytest.raises(Crash):
        crashing.apply(contract.flush(changes, s3))  # b committed (one x deleted, z added), a not
    crashing.close()
    contract.assert_rows(first, b, [(1, "x"), (2, "y"), (3, "z")])
    restarted = factory()
    assert restarted.applied(producer) == s1
    s2 = contract.state(seq=2, pos=200, producer=producer)
    restarted.apply(contract.flush(changes[:1], s2))  # envelope 2 alone: b is rolled back first
    contract.assert_rows(restarted, b, [(1, "x"), (2, "y")])
    restarted.apply(contract.flush(changes[1:], s3))
    contract.assert_rows(restarted, b, [(1, "x"), (2, "y"), (3, "z")])
    contract.assert_rows(restarted, a, [(1, "A")])
    assert restarted.applied(producer) == s3


def _operations(target: SparkTarget, db: str, table: str) -> list[str]:
    return [r.operation for r in target.spark.sql(
        f"SELECT operation FROM {target.qualified(db, table)}.snapshots ORDER BY committed_at").collect()]


def test_insert_only_keyed_flush_is_appended_then_merged(target: SparkTarget, db: str) -> None:
    """New keys only: an append (no MERGE reads the table); a flush with
    an update or delete, or snapshot reads (upserts), MERGEs."""
    a, _ = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(i, f"v{i}")) for i in (1, 2, 3)]))
    assert _operations(target, db, "a") == ["append"]
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(4, "v4")),
                                 contract.change(Op.UPDATE, a, before=(1, "v1"), after=(1, "w1")),
                                 contract.change(Op.UPDATE, a, before=(2, "v2"), after=(5, "v2")),
                                 contract.change(Op.DELETE, a, before=(3, "v3"))]))
    target.apply(contract.flush([contract.change(Op.READ, a, after=(4, "r4")),
                                 contract.change(Op.READ, a, after=(6, "r6"))]))
    assert _operations(target, db, "a") == ["append", "overwrite", "overwrite"]
    contract.assert_rows(target, a, [(1, "w1"), (4, "r4"), (5, "v2"), (6, "r6")])


def test_scattered_keys_beside_a_dense_stretch_prune_to_themselves(target: SparkTarget, db: str) -> None:
    """A flush of a dense stretch of keys (a snapshot chunk) and updates and
    deletes spread over the table: the MERGE reads the stretch's range and
    the scattered keys, not the range from the smallest key to the largest;
    and every key still matches (an update missed by the condition would be
    inserted twice)."""
    a, _ = _tables(db)
    old = list(range(1, 3001, 3))  # 1000 keys over 1..3000
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(k, "old")) for k in old]))
    chunk = [contract.change(Op.READ, a, after=(k, "read")) for k in range(100_000, 100_400)]
    scattered = [contract.change(Op.UPDATE, a, before=(7, "old"), after=(7, "upd")),
                 contract.change(Op.UPDATE, a, before=(2998, "old"), after=(2998, "upd")),
                 contract.change(Op.DELETE, a, before=(1501, "old")),
                 contract.change(Op.INSERT, a, after=(500_000, "new"))]
    fl = contract.flush(chunk + scattered)
    (tf,) = fl.tables
    plan = target._plan(tf)
    assert plan is not None
    assert "(t.`id` BETWEEN 100000 AND 100399 OR t.`id` IN (7, 1501, 2998, 500000))" in plan.sql
    target.apply(fl)
    want = {k: "old" for k in old} | {7: "upd", 2998: "upd", 500_000: "new"} | {k: "read" for k in range(100_000, 100_400)}
    del want[1501]
    contract.assert_rows(target, a, sorted(want.items()))


# --------------------------------------------------------------------------
# Snapshot rows new to a table: a data file of their own (direct.py)
# --------------------------------------------------------------------------
def _reads(schema: TableSchema, rows: list[Row]) -> list[Change]:
    """READ changes as the applier decodes a snapshot chunk: one run."""
    from cynomys.core.model import Batch
    from cynomys.schemas import codec

    out = codec.decode_columnar(codec.encode(Batch("p", tuple(
        contract.change(Op.READ, schema, after=r) for r in rows), Position("f", 9)))).changes
    assert [(type(c), c.op) for c in out] == [(InsertRun, Op.READ)]
    return list(out)


def _direct_files(target: SparkTarget, db: str, table: str) -> list[int]:
    """Record counts of the table's live data files written by direct.py."""
    return [r.record_count for r in target.spark.sql(
        f"SELECT file_path, record_count FROM {target.qualified(db, table)}.files WHERE content = 0").collect()
        if "/cynomys-" in r.file_path]


class MergeOnlyTarget(SparkTarget):
    """Every snapshot row through the MERGE (the path before direct.py)."""

    direct_reads = False


def test_snapshot_rows_of_every_type_appended_directly_read_back_as_merged(factory: Factory, target: SparkTarget,
                                                                        db: str) -> None:
    """A data file written by pyarrow must read back exactly as Spark's own
    (field ids, decimals, timestamps with and without zone, binary, the
    zero-date companions), after a restart too."""
    rows = contract.ALL_TYPES_ROWS
    direct_schema, merged_schema = contract.all_types_schema(db, "direct"), contract.all_types_schema(db, "merged")
    with contract.compiled_path():
        # One envelope per row: a zero date makes its column mixed (not a run, so through the MERGE).
        direct = contract.column_wise([contract.change(Op.READ, direct_schema, after=r) for r in rows])
        merged = contract.column_wise([contract.change(Op.READ, merged_schema, after=r) for r in rows])
    assert any(type(c) is InsertRun and c.op is Op.READ for c in direct)
    target.apply(build_flush(direct, contract.state(), columnar=True))
    factory(cls=MergeOnlyTarget).apply(build_flush(merged, contract.state(), columnar=True))
    assert sum(_direct_files(target, db, "direct")) == sum(type(c) is InsertRun for c in direct)
    assert not _direct_files(target, db, "merged")
    contract.assert_rows(target, direct_schema, rows)
    fresh = factory()
    def by_id(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
        return sorted(rows, key=lambda r: r[0])  # type: ignore[arg-type,return-value]

    assert by_id(fresh.fetch_rows(db, "direct")) == by_id(fresh.fetch_rows(db, "merged"))
    cols = "zd, zd__cynomys_raw, tm, bi_u, dec, ts, dtt"
    assert target.spark.sql(f"SELECT {cols} FROM {target.qualified(db, 'direct')} ORDER BY id").collect() == \
        target.spark.sql(f"SELECT {cols} FROM {target.qualified(db, 'merged')} ORDER BY id").collect()


def test_snapshot_rows_the_table_or_the_flush_holds_keys_of_are_merged(target: SparkTarget, db: str) -> None:
    """Only keys the table lacks are appended: a key the log wrote before
    the chunk was read is replaced (not doubled); the flush's log changes
    and other rows stay as they were."""
    a, _ = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(k, "old")) for k in (1, 2, 3, 50, 60)]))
    with contract.compiled_path():
        reads = _reads(a, [(k, f"read {k}") for k in range(40, 80)])
    changes = [contract.change(Op.DELETE, a, before=(1, "old")),
               contract.change(Op.UPDATE, a, before=(2, "old"), after=(2, "upd")),
               *reads,
               contract.change(Op.INSERT, a, after=(100, "new"))]
    target.apply(build_flush(changes, contract.state(), columnar=True))
    want = {2: "upd", 3: "old"} | {k: f"read {k}" for k in range(40, 80)} | {100: "new"}
    contract.assert_rows(target, a, sorted(want.items()))
    # 40..79 less the held 50 and 60 (and the first flush's five new keys,
    # appended as a data file of their own too).
    assert sorted(_direct_files(target, db, "a")) == [5, 38]
    ops = _operations(target, db, "a")
    assert ops[-2:] == ["append", "overwrite"]  # the part, then the MERGE carrying the flush marker
    snap = target.iceberg.current(db, "a")
    assert snap is not None and marker_of(snap.summary, contract.PRODUCER) is not None


def test_a_chunk_of_new_keys_alone_is_one_append_with_the_flush_marker(target: SparkTarget, db: str) -> None:
    a, _ = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "old"))]))
    with contract.compiled_path():
        reads = _reads(a, [(k, "r") for k in range(10, 20)])
    st = contract.state()
    target.apply(build_flush(reads, st, columnar=True))
    assert _operations(target, db, "a") == ["append", "append"]
    snap = target.iceberg.current(db, "a")
    assert snap is not None and marker_of(snap.summary, contract.PRODUCER) == st
    contract.assert_rows(target, a, [(1, "old")] + [(k, "r") for k in range(10, 20)])
    # Rows of the file written outside Spark are updated and deleted like any
    # (a v3 table's MERGE reads their inherited row ids).
    target.apply(contract.flush([contract.change(Op.UPDATE, a, before=(12, "r"), after=(12, "u")),
                                 contract.change(Op.DELETE, a, before=(15, "r"))]))
    contract.assert_rows(target, a, [(1, "old")] + [(k, "u" if k == 12 else "r") for k in range(10, 20) if k != 15])
    rows = target.spark.sql(f"SELECT id, _row_id FROM {target.qualified(db, 'a')} ORDER BY id").collect()
    assert len({r._row_id for r in rows}) == len(rows) == 10 and all(r._row_id is not None for r in rows)


def test_a_merge_that_changes_nothing_after_the_part_still_marks_the_flush(target: SparkTarget, db: str) -> None:
    """The rest of the flush only deletes keys the table lacks (rows deleted
    before their chunk was read): the table still ends on the flush marker,
    and the replay finds itself there.  (Iceberg 1.10 commits a snapshot for
    a MERGE that changes nothing; were it to stop, the part would be the
    table's head and _commit would refuse the flush: this test says so.)"""
    a, _ = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "old"))]))
    with contract.compiled_path():
        reads = _reads(a, [(k, "r") for k in range(10, 20)])
    fl = build_flush([contract.change(Op.DELETE, a, before=(500, "gone")), *reads], contract.state(), columnar=True)
    target.apply(fl)
    snap = target.iceberg.current(db, "a")
    assert snap is not None and marker_of(snap.summary, contract.PRODUCER) == fl.state
    target.apply(fl)  # the replay: skipped, nothing doubled
    contract.assert_rows(target, a, [(1, "old")] + [(k, "r") for k in range(10, 20)])
    assert target.iceberg.current(db, "a") == snap


def test_a_table_partitioned_or_sorted_later_takes_snapshot_rows_through_the_merge(target: SparkTarget,
                                                                                  db: str) -> None:
    """A file written here has no partition values and no write order: once
    the table's layout evolves, its snapshot rows go back to the MERGE."""
    a, _ = _tables(db)
    with contract.compiled_path():
        first, second, third = (_reads(a, [(k, "r") for k in range(n, n + 10)]) for n in (10, 20, 30))
    target.apply(build_flush(first, contract.state(), columnar=True))
    assert _direct_files(target, db, "a") == [10]
    target.sql(f"ALTER TABLE {target.qualified(db, 'a')} ADD PARTITION FIELD bucket(4, id)")
    target.apply(build_flush(second, contract.state(), columnar=True))
    target.sql(f"ALTER TABLE {target.qualified(db, 'a')} DROP PARTITION FIELD bucket(4, id)")
    target.sql(f"ALTER TABLE {target.qualified(db, 'a')} WRITE LOCALLY ORDERED BY v")
    target.apply(build_flush(third, contract.state(), columnar=True))
    assert _direct_files(target, db, "a") == [10]
    contract.assert_rows(target, a, [(k, "r") for k in range(10, 40)])


class DiesAfterThePart(SparkTarget):
    """The process dies after a table's directly appended part committed,
    before the flush's MERGE of the same table: nothing cleans up."""

    def _write(self, plan: TablePlan, summary: dict[str, str]) -> None:
        raise Crash(f"killed before the MERGE of {plan.schema.name}")

    def undo_ahead(self, database: str, table: str, producer_id: str, recorded: AppliedState | None) -> None:
        pass

    def _abort(self, done: list[TablePlan], producer_id: str, recorded: AppliedState | None) -> None:
        pass


class FailsAfterThePart(SparkTarget):
    """The flush's MERGE of a table fails after its part committed."""

    def _write(self, plan: TablePlan, summary: dict[str, str]) -> None:
        raise TargetRejectedError(f"refusing the MERGE of {plan.schema.name}")


def _part_then_merge(factory: Factory, db: str, producer: str
                     ) -> tuple[SparkTarget, TableSchema, AppliedState, Flush, list[tuple[int, str]]]:
    """A target holding flush 1 (key 1), flush 2 (an update of key 1 and 20
    snapshot rows of new keys: a part, then the MERGE) and its rows."""
    good = factory()
    a, _ = _tables(db)
    s1 = contract.state(seq=1, producer=producer)
    good.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "old"))], s1))
    with contract.compiled_path():
        reads = _reads(a, [(k, f"r{k}") for k in range(10, 30)])
    fl = build_flush([contract.change(Op.UPDATE, a, before=(1, "old"), after=(1, "new")), *reads],
                     contract.state(seq=2, producer=producer), columnar=True)
    return good, a, s1, fl, [(1, "new")] + [(k, f"r{k}") for k in range(10, 30)]


def test_death_between_the_part_and_the_merge_is_rolled_back_then_applied_once(factory: Factory, db: str) -> None:
    producer = f"part-{db}"
    good, a, s1, fl, want = _part_then_merge(factory, db, producer)
    dying = factory(cls=DiesAfterThePart)
    with pytest.raises(Crash):
        dying.apply(fl)
    dying.close()
    # The part is in the table (the window a crash leaves, as between two tables' commits) ...
    assert len(good.fetch_rows(db, "a")) == 21 and good.applied(producer) == s1
    restarted = factory()
    restarted.apply(fl)  # ... and the replay rolls it back first: each row once
    contract.assert_rows(restarted, a, want)
    assert restarted.applied(producer) == fl.state
    # The 20 snapshot rows once (and flush 1's row, appended directly too).
    assert sorted(_direct_files(restarted, db, "a")) == [1, 20]


def test_death_between_the_part_and_the_merge_then_a_replay_cut_differently(factory: Factory, db: str) -> None:
    producer = f"partcut-{db}"
    _, a, _, fl, want = _part_then_merge(factory, db, producer)
    with pytest.raises(Crash):
        factory(cls=DiesAfterThePart).apply(fl)
    # The replay flushes the update alone first: the part goes, nothing of it stays.
    restarted = factory()
    restarted.apply(contract.flush([contract.change(Op.UPDATE, a, before=(1, "old"), after=(1, "new"))],
                                   contract.state(seq=2, pos=1500, producer=producer)))
    contract.assert_rows(restarted, a, [(1, "new")])
    with contract.compiled_path():
        reads = _reads(a, [(k, f"r{k}") for k in range(10, 30)])
    restarted.apply(build_flush(reads, contract.state(seq=3, producer=producer), columnar=True))
    contract.assert_rows(restarted, a, want)


def test_a_failed_merge_after_the_part_rolls_the_part_back_at_once(factory: Factory, db: str) -> None:
    producer = f"partfail-{db}"
    good, a, s1, fl, want = _part_then_merge(factory, db, producer)
    with pytest.raises(TargetRejectedError, match="refusing the MERGE"):
        factory(cls=FailsAfterThePart).apply(fl)
    contract.assert_rows(good, a, [(1, "old")])
    assert good.applied(producer) == s1
    good.apply(fl)
    contract.assert_rows(good, a, want)


def _direct_memory_mb(target: SparkTarget) -> float:
    jvm = target.spark._jvm
    pools = jvm.java.lang.management.ManagementFactory.getPlatformMXBeans(
        jvm.java.lang.Class.forName("java.lang.management.BufferPoolMXBean"))
    return next(p.getMemoryUsed() for p in pools if p.getName() == "direct") / 2**20


def test_merges_of_a_v3_table_do_not_leak_the_jvms_direct_memory(target: SparkTarget, db: str) -> None:
    """Iceberg 1.10's vectorized reader leaks a direct-memory vector per batch
    of a v3 table's row-lineage columns, which every MERGE reads: the
    applier's JVM died after 6M rows of an initial load.  Ten MERGEs that
    each read a 200k-row table grew it by 24-32 MB before the applier's
    session turned vectorized reads off; a pooled chunk (4 MB) is noise."""
    a, _ = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(k, "v")) for k in range(200_000)]))
    rnd = random.Random(3)

    def merge_spread_updates() -> None:
        keys = rnd.sample(range(200_000), 20)
        target.apply(contract.flush([contract.change(Op.UPDATE, a, before=(k, "v"), after=(k, "w")) for k in keys]))

    merge_spread_updates()  # the first MERGE allocates the reader's pools
    before = _direct_memory_mb(target)
    for _ in range(10):
        merge_spread_updates()
    assert _direct_memory_mb(target) - before < 8


def test_a_warm_flush_resolves_no_java_name_and_raises_no_java_exception(target: SparkTarget, db: str) -> None:
    """Py4J resolves ``jvm.a.b.C`` one segment at a time, the JVM trying
    each prefix as a class through every jar of Spark's class path, and a
    Java map iterated through Py4J ends in an exception PySpark converts
    with a dozen more lookups: 8% of the applier JVM's CPU on small flushes
    (JFR), ~10 exceptions per flush of four tables.  Once warm, a flush
    (MERGE, append, keyless MERGE, the state write) does neither."""
    a, b = _tables(db)
    flush_all = [contract.change(Op.INSERT, a, after=(k, "v")) for k in range(50)] \
        + [contract.change(Op.INSERT, b, after=(k, "s")) for k in range(5)]
    target.apply(contract.flush(flush_all))  # creates the tables; the session's classes are resolved once
    with spark_setup.counting_py4j() as (lookups, exceptions):
        target.apply(contract.flush([contract.change(Op.UPDATE, a, before=(k, "v"), after=(k, "w")) for k in (3, 30)]
                                    + [contract.change(Op.DELETE, b, before=(1, "s"))]))
        target.apply(contract.flush([contract.change(Op.INSERT, a, after=(k, "n")) for k in (100, 101)]))
    assert (exceptions, lookups) == ([], [])
    contract.assert_rows(target, a, [(k, "w" if k in (3, 30) else "v") for k in range(50)] + [(100, "n"), (101, "n")])


def test_maintenance_compacts_and_keeps_exactly_once(factory: Factory, db: str) -> None:
    """After maintenance (compaction, delete files gone, old snapshots
    expired) the rows are unchanged, a replayed flush is still recognised
    and a crash between table commits still replays exactly once."""
    producer = f"maint-{db}"
    a, b = _tables(db)
    settings = {"maintenance_commits": 4, "snapshots_kept": 1, "snapshot_retention_s": 0}
    t = factory(spark=settings)
    want_a: dict[int, str] = {}
    want_b: list[tuple[int, str]] = []
    states = []
    for seq in range(1, 5):
        changes = [contract.change(Op.INSERT, a, after=(10 * seq + i, "n")) for i in range(3)]
        changes += [contract.change(Op.INSERT, b, after=(seq, "x")), contract.change(Op.INSERT, b, after=(seq, "x"))]
        want_a.update({10 * seq + i: "n" for i in range(3)})
        want_b += [(seq, "x"), (seq, "x")]
        if seq > 1:  # updates and deletes: position-delete files
            changes += [contract.change(Op.UPDATE, a, before=(10 * (seq - 1), "n"), after=(10 * (seq - 1), f"u{seq}")),
                        contract.change(Op.DELETE, a, before=(10 * (seq - 1) + 1, "n")),
                        contract.change(Op.DELETE, b, before=(seq - 1, "x"))]
            want_a[10 * (seq - 1)] = f"u{seq}"
            del want_a[10 * (seq - 1) + 1]
            want_b.remove((seq - 1, "x"))
        states.append(contract.state(seq=seq, producer=producer))
        t.apply(contract.flush(changes, states[-1]))
    assert t.maintenance_report()["tables"] == {}  # not on the flush path: when the applier is idle
    t.idle()
    report = t.maintenance_report()
    assert report["enabled"] and report["every_commits"] == 4
    run = report["tables"][f"{db}.a"]  # the first table due; b at the next idle moment
    assert "error" not in run and run["rewritten_data_files"] >= 4 and run["added_data_files"] == 1, run
    assert run["files_after"].get("position_deletes", 0) == 0 and run["files_after"]["data"] == 1, run
    assert _operations(t, db, "a") == ["replace"]  # every flush snapshot expired
    contract.assert_rows(t, a, [(k, v) for k, v in want_a.items()])
    contract.assert_rows(t, b, want_b)
    # The markers of a are gone with its expired snapshots; the state (a
    # table property, untouched by maintenance) still says flush 4.
    assert t.applied(producer) == states[-1]
    # Flush 5 maintains b, then flush 6 dies after committing a: the
    # restarted applier replays it exactly once on compacted tables.
    s5 = contract.state(seq=5, producer=producer)
    t.apply(contract.flush([contract.change(Op.INSERT, b, after=(5, "x"))], s5))
    t.idle()
    want_b.append((5, "x"))
    assert "error" not in t.maintenance_report()["tables"][f"{db}.b"]
    s6 = contract.state(seq=6, producer=producer)
    fl = contract.flush([contract.change(Op.UPDATE, a, before=(40, "n"), after=(40, "six")),
                         contract.change(Op.DELETE, b, before=(4, "x"))], s6)
    crashing = factory(cls=CrashingTarget, spark=settings)
    with pytest.raises(Crash):
        crashing.apply(fl)
    crashing.close()
    restarted = factory(spark=settings)
    assert restarted.applied(producer) == s5
    restarted.apply(fl)
    want_a[40] = "six"
    want_b.remove((4, "x"))
    contract.assert_rows(restarted, a, [(k, v) for k, v in want_a.items()])
    contract.assert_rows(restarted, b, want_b)
    assert restarted.applied(producer) == s6


class FailingTarget(SparkTarget):
    """Its second table commit fails (Spark refuses it)."""

    def _commit(self, plan: TablePlan, state: AppliedState, recorded: AppliedState | None) -> bool:
        if plan.schema.table == "b":
            raise TargetRejectedError(f"refusing {plan.schema.name}")
        return super()._commit(plan, state, recorded)


def test_failure_after_a_commit_rolls_it_back(factory: Factory, db: str) -> None:
    producer = f"fail-{db}"
    a, b = _tables(db)
    good = factory()
    s1 = contract.state(seq=1, producer=producer)
    good.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "a")),
                               contract.change(Op.INSERT, b, after=(1, "x"))], s1))
    bad = factory(cls=FailingTarget)
    fl = contract.flush([contract.change(Op.UPDATE, a, before=(1, "a"), after=(1, "A")),
                         contract.change(Op.INSERT, b, after=(2, "y"))], contract.state(seq=2, producer=producer))
    with pytest.raises(TargetRejectedError, match="refusing"):
        bad.apply(fl)
    contract.assert_rows(good, a, [(1, "a")])
    assert good.applied(producer) == s1
    good.apply(fl)
    contract.assert_rows(good, a, [(1, "A")])
    contract.assert_rows(good, b, [(1, "x"), (2, "y")])


def test_state_lost_is_refused_not_rolled_back(factory: Factory, db: str) -> None:
    """Two unrecorded commits of one producer in a table cannot come from one
    crash: the target refuses instead of rolling back more than a flush."""
    producer = f"lost-{db}"
    a, _ = _tables(db)
    t = factory()
    for seq in (1, 2):
        t.apply(contract.flush([contract.change(Op.INSERT, a, after=(seq, "v"))],
                               contract.state(seq=seq, producer=producer)))
    t.iceberg.update_properties(t.state_namespace, t.state_table, {}, remove=(t.state_property_prefix + producer,))
    fresh = factory()
    with pytest.raises(TargetRejectedError, match="beyond the applier state"):
        fresh.apply(contract.flush([contract.change(Op.INSERT, a, after=(3, "v"))],
                                   contract.state(seq=3, producer=producer)))
    contract.assert_rows(fresh, a, [(1, "v"), (2, "v")])


# --------------------------------------------------------------------------
# DDL particular to Iceberg
# --------------------------------------------------------------------------
def test_modify_column_in_place_rewrite_or_refuse(target: SparkTarget, db: str) -> None:
    schema = TableSchema(db, "m", (ColumnDef("id", "int"), ColumnDef("n", "int"), ColumnDef("c", "decimal(10,2)"),
                                   ColumnDef("s", "varchar(5)")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, 7, Decimal("1.50"), "abc"))]))
    before = target.iceberg.current(db, "m")
    target.apply_ddl(contract.ddl(db, "ALTER TABLE m MODIFY n BIGINT, MODIFY s TEXT, MODIFY c DECIMAL(14,2)"),
                     contract.state())
    cols = _describe(target, db, "m")
    assert cols["n"] == ("bigint", "mysql:bigint") and cols["s"] == ("string", "mysql:text")
    assert cols["c"] == ("decimal(14,2)", "mysql:decimal(14,2)")
    assert target.iceberg.current(db, "m") == before  # promotions change metadata only
    target.apply_ddl(contract.ddl(db, "ALTER TABLE m MODIFY n INT UNSIGNED, MODIFY c DECIMAL(20,4)"), contract.state())
    assert _describe(target, db, "m")["c"][0] == "decimal(20,4)"
    assert target.fetch_rows(db, "m") == [(1, 7, Decimal("1.5000"), "abc")]
    assert _describe(target, db, "m")["s"] == ("string", "mysql:text")  # the rewrite keeps comments
    with pytest.raises(TargetRejectedError) as info:
        target.apply_ddl(contract.ddl(db, "ALTER TABLE m MODIFY s INT", pos=901), contract.state())
    assert "m.s" in str(info.value) and "skip_ddl" in str(info.value)
    # BIGINT -> INT rewrites under ANSI overflow checks: a value that does not fit fails.
    target.apply(contract.flush([contract.change(Op.INSERT, TableSchema(db, "m", (
        ColumnDef("id", "int"), ColumnDef("n", "bigint")), ("id",)), after=(2, 2**40))]))
    with pytest.raises(TargetRejectedError, match="overflow|CAST"):
        target.apply_ddl(contract.ddl(db, "ALTER TABLE m MODIFY n INT"), contract.state())


def test_add_column_interrupted_before_its_fill_is_filled_by_the_replay(target: SparkTarget, db: str) -> None:
    """ADD COLUMN ... DEFAULT is two Iceberg commits (the column, then the
    fill of the rows already there); a crash between them left the column
    NULL in every old row, and the replay found the column and did nothing
    (seen in test_mixed_workload_with_kills_into_iceberg).  The replay fills."""
    schema = TableSchema(db, "f", (ColumnDef("id", "int", False), ColumnDef("a", "int")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, 10)),
                                 contract.change(Op.INSERT, schema, after=(2, None))]))
    alter = "ALTER TABLE f ADD COLUMN region CHAR(2) NOT NULL DEFAULT 'eu'"
    # The first commit alone, as the applier made it before it was killed.
    target.sql(f"ALTER TABLE {target.qualified(db, 'f')} ADD COLUMN region string COMMENT 'mysql:char(2)'")
    assert sorted(target.fetch_rows(db, "f")) == [(1, 10, None), (2, None, None)]
    target.apply_ddl(contract.ddl(db, alter), contract.state())  # the replay
    assert sorted(target.fetch_rows(db, "f")) == [(1, 10, "eu"), (2, None, "eu")]
    target.apply_ddl(contract.ddl(db, alter), contract.state())  # again: nothing changes
    assert sorted(target.fetch_rows(db, "f")) == [(1, 10, "eu"), (2, None, "eu")]


def test_rename_copy_interrupted_before_drop(target: SparkTarget, db: str) -> None:
    """A Hadoop catalog renames by copying; a crash after the copy leaves
    both tables, and the replay only drops the old one."""
    from cynomys.applier.targets.spark import ddl as spark_ddl

    schema = TableSchema(db, "old", (ColumnDef("id", "int"), ColumnDef("v", "varchar(3)")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, "a"))]))
    target.apply_ddl(contract.ddl(db, "CREATE TABLE empty_old (k BIGINT UNSIGNED PRIMARY KEY)"), contract.state())
    for old, new, rows in (("old", "new", [(1, "a")]), ("empty_old", "empty_new", [])):
        st = contract.state()
        spark_ddl._copy_table(spark_ddl.Run(target, f"RENAME TABLE {old} TO {new}", st), db, old, db, new)
        assert target.table_exists(db, old) and target.table_exists(db, new)
        target.apply_ddl(contract.ddl(db, f"RENAME TABLE {old} TO {new}"), st)  # the replay
        assert not target.table_exists(db, old)
        assert target.fetch_rows(db, new) == rows
    # The copy keeps the source types (comments) and the primary key.
    k = _describe(target, db, "empty_new")["k"]
    assert k == ("decimal(20,0)", "unsigned 64-bit integer; mysql:bigint unsigned")
    assert target.iceberg.properties(db, "empty_new")["cynomys.primary-key"] == '["k"]'
    assert _describe(target, db, "new")["v"] == ("string", "mysql:varchar(3)")
    # A real name clash is not papered over.
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(2, "b"))]))
    with pytest.raises(TargetRejectedError, match="both"):
        target.apply_ddl(contract.ddl(db, "RENAME TABLE old TO new"), contract.state())


def test_drop_database(target: SparkTarget, db: str) -> None:
    a, b = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "a")),
                                 contract.change(Op.INSERT, b, after=(1, "x"))]))
    target.apply_ddl(contract.ddl(db, f"DROP DATABASE `{db}`"), contract.state())
    assert not target.table_exists(db, "a") and not target.table_exists(db, "b")
    target.apply_ddl(contract.ddl(db, f"DROP DATABASE IF EXISTS `{db}`"), contract.state())  # replay


def test_state_database_name_is_refused(target: SparkTarget) -> None:
    schema = TableSchema("cynomys_state", "x", (ColumnDef("id", "int"),), ("id",))
    with pytest.raises(TargetRejectedError, match="state database"):
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1,))]))


def test_flush_with_no_tables_moves_only_the_state(target: SparkTarget) -> None:
    st = contract.state(producer="only-state")
    target.apply(Flush([], st))
    assert target.applied("only-state") == st


# --------------------------------------------------------------------------
def test_warm_up_uses_a_scratch_table_once_per_session_and_leaves_nothing(factory: Factory, target: SparkTarget,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from cynomys.applier.targets.spark import warmup

    for made in factory.made:  # the session's own warm-up, started by its first connect, is over first
        if made._warming is not None:  # type: ignore[attr-defined]
            made._warming.join()  # type: ignore[attr-defined]

    # The module's first connect warmed this session: a second target of the
    # same session does not warm it again.
    assert target._generation in warmup._warmed
    assert warmup.start(target, target._generation) is None
    schema = TableSchema("warm_db", "t", (ColumnDef("id", "int"), ColumnDef("v", "varchar(5)")), ("id",))
    target.create_table("warm_db", "t", schema.columns, schema.key)
    before = target.fetch_rows("warm_db", "t")
    with caplog.at_level("INFO", logger="cynomys.applier.targets.spark.warmup"):
        warmup._run(target)  # what the thread runs, here in the foreground
    assert any("Spark warm-up (append, MERGE, DELETE" in r.getMessage() for r in caplog.records), caplog.text
    assert warmup.WARM_TABLE not in target.iceberg.list_tables(target.state_namespace)  # dropped after
    assert target.state_table in target.iceberg.list_tables(target.state_namespace)
    assert target.fetch_rows("warm_db", "t") == before


# --------------------------------------------------------------------------
# Small keyed flushes as row deltas, no Spark job (delta.py)
# --------------------------------------------------------------------------
def _jobs(target: SparkTarget) -> int:
    """Spark jobs run so far in the session (after the warm-up's: warmup.py),
    once the listener bus has delivered every event (it is asynchronous)."""
    for thread in threading.enumerate():
        if thread.name == "spark-warm-up":  # whichever target of the session started it
            thread.join()
    target.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    return len(target.spark.sparkContext.statusTracker().getJobIdsForGroup())


def _our_deletion_vectors(target: SparkTarget, db: str, table: str) -> int:
    """Live deletion vectors of the table written by delta.py."""
    return sum(1 for r in target.spark.sql(
        f"SELECT file_path FROM {target.qualified(db, table)}.delete_files").collect() if "/cynomys-" in r.file_path)


def _row_delta_tables(db: str) -> tuple[TableSchema, TableSchema]:
    # Composite keys of a string and an integer; a date and an unsigned
    # bigint (decimal(20,0) in Iceberg); values of other types beside them.
    t1 = TableSchema(db, "t1", (ColumnDef("k", "varchar(10)"), ColumnDef("n", "int"), ColumnDef("v", "varchar(20)"),
                                ColumnDef("d", "decimal(10,2)"), ColumnDef("ts", "datetime(6)")), ("k", "n"))
    t2 = TableSchema(db, "t2", (ColumnDef("day", "date"), ColumnDef("u", "bigint unsigned"),
                                ColumnDef("v", "int")), ("day", "u"))
    return t1, t2


def test_small_keyed_flushes_are_row_deltas_equal_to_the_merge(factory: Factory, target: SparkTarget, db: str) -> None:
    """Random inserts, updates, key changes and deletes on composite keys of
    several types, in 15 flushes: applied as row deltas (deletion vectors
    and a data file, committed without any Spark job) and, on tables of
    their own, through the MERGE statement: both equal to the model, and
    the row deltas really ran (their deletion vectors are the tables')."""
    merge_only = factory(cls=spark_setup.parquet_handoff_target())
    rng = random.Random(28)
    schemas = {name: _row_delta_tables(name) for name in (db, db + "_m")}
    models: list[dict[tuple[Any, ...], Row]] = [{}, {}]
    base = datetime.date(2024, 1, 1)

    def new_row(i: int, k: int) -> Row:
        if i == 0:
            key: tuple[Any, ...] = (rng.choice(["a", "b", "ü"]), k)
            return key + (f"v{rng.randrange(10**6)}", Decimal(rng.randrange(-10**6, 10**6)).scaleb(-2),
                          datetime.datetime(2024, 5, 1, 12) + datetime.timedelta(microseconds=rng.randrange(10**12)))
        return (base + datetime.timedelta(days=k % 40), 2**64 - 1 - k, rng.randrange(1000))

    keys = itertools.count(1)
    for round_ in range(15):
        changes: dict[str, list[Change]] = {name: [] for name in schemas}
        for i in range(2):
            model = models[i]
            for _ in range(rng.randrange(1, 12)):
                op = rng.random()
                old = rng.choice(list(model.values())) if model else None
                width = 2
                if old is None or op < 0.35:
                    row, before = new_row(i, next(keys)), None
                    kind = Op.INSERT
                elif op < 0.7:
                    row, before, kind = old[:width] + new_row(i, 0)[width:], old, Op.UPDATE
                elif op < 0.85:
                    row, before, kind = new_row(i, next(keys))[:width] + old[width:], old, Op.UPDATE
                else:
                    row, before, kind = None, old, Op.DELETE
                if before is not None:
                    del model[before[:width]]
                if row is not None:
                    model[row[:width]] = row
                for name, tables in schemas.items():
                    changes[name].append(contract.change(kind, tables[i], before=before, after=row))
        jobs = _jobs(target)
        # Folded per key first, as the applier does (build_flush takes net changes).
        target.apply(contract.flush(fold(changes[db])))
        if round_:  # the first flush creates the tables (DDL runs Spark jobs)
            assert _jobs(target) == jobs, f"flush {round_} ran a Spark job"
        merge_only.apply(contract.flush(fold(changes[db + "_m"]), contract.state(producer="merge-only")))
    for name, tables in schemas.items():
        for schema, model in zip(tables, models, strict=True):
            contract.assert_rows(target if name == db else merge_only, schema, list(model.values()))
    assert _our_deletion_vectors(target, db, "t1") and _our_deletion_vectors(target, db, "t2")
    assert not _our_deletion_vectors(merge_only, db + "_m", "t1")


def test_small_keyless_flushes_are_row_deltas_equal_to_the_merge(factory: Factory, target: SparkTarget,
                                                                  db: str) -> None:
    """A keyless table is a multiset: random inserts of a few values (so
    that copies pile up, NULLs among them) and deletes of one copy, in 12
    flushes, as row deltas -- each deleted value's copies found NULL-safe on
    every column, so many of them deleted -- and through the MERGE: both
    equal to the model, the row deltas without a Spark job."""
    merge_only = factory(cls=spark_setup.parquet_handoff_target())
    rng = random.Random(24)
    tables = {name: TableSchema(name, "k", (ColumnDef("x", "int"), ColumnDef("s", "varchar(5)"),
                                            ColumnDef("dt", "date")), ()) for name in (db, db + "_m")}
    model: Counter[Row] = Counter()
    for round_ in range(12):
        changes: dict[str, list[Change]] = {name: [] for name in tables}
        for _ in range(rng.randrange(1, 15)):
            if model.total() and rng.random() < 0.4:
                row = rng.choice(sorted(model.elements(), key=repr))
                model[row] -= 1
                kind, before, after = Op.DELETE, row, None
            else:
                row = (rng.choice([1, 2, None]), rng.choice(["a", "ü", None]),
                       rng.choice([datetime.date(2024, 1, 1), None]))
                model[row] += 1
                kind, before, after = Op.INSERT, None, row
            for name, schema in tables.items():
                changes[name].append(contract.change(kind, schema, before=before, after=after))
        jobs = _jobs(target)
        target.apply(contract.flush(fold(changes[db])))
        if round_:
            assert _jobs(target) == jobs, f"flush {round_} ran a Spark job"
        merge_only.apply(contract.flush(fold(changes[db + "_m"]), contract.state(producer="merge-only")))
    contract.assert_rows(target, tables[db], list(model.elements()))
    contract.assert_rows(merge_only, tables[db + "_m"], list(model.elements()))
    assert _our_deletion_vectors(target, db, "k")


def test_a_small_table_is_compacted_without_spark_keeping_rows_and_lineage(factory: Factory, db: str) -> None:
    """Maintenance of a small table (compact.py): one data file of the live
    rows, no deletion vector left, old snapshots expired, no Spark job --
    and every row keeps its ``_row_id`` and ``_last_updated_sequence_number``
    (v3 row lineage, as Spark's rewrite keeps them)."""
    t = factory(spark={"maintenance_commits": 3, "snapshots_kept": 1, "snapshot_retention_s": 0})
    a, _ = _tables(db)
    t.apply(contract.flush([contract.change(Op.INSERT, a, after=(k, "v")) for k in range(10)]))
    t.apply(contract.flush([contract.change(Op.UPDATE, a, before=(k, "v"), after=(k, "w")) for k in (2, 5)]
                           + [contract.change(Op.DELETE, a, before=(7, "v"))]))
    t.apply(contract.flush([contract.change(Op.UPDATE, a, before=(2, "w"), after=(2, "x")),
                            contract.change(Op.INSERT, a, after=(20, "n"))]))

    def lineage() -> dict[int, tuple[str, int, int]]:
        return {r.id: (r.v, r._row_id, r._last_updated_sequence_number) for r in t.spark.sql(
            f"SELECT id, v, _row_id, _last_updated_sequence_number FROM {t.qualified(db, 'a')}").collect()}

    before = lineage()
    jobs = _jobs(t)
    t.idle()
    assert _jobs(t) == jobs
    run = t.maintenance_report()["tables"][f"{db}.a"]
    assert run["how"] == "pyarrow" and "error" not in run, run
    assert run["rewritten_data_files"] == 3 and run["added_data_files"] == 1, run
    assert lineage() == before and len(before) == 10
    assert _operations(t, db, "a") == ["replace"]
    files = t.spark.sql(f"SELECT content, count(*) AS n FROM {t.qualified(db, 'a')}.files GROUP BY content").collect()
    assert {r.content: r.n for r in files} == {0: 1}
    # Flushes go on on the compacted table.
    t.apply(contract.flush([contract.change(Op.UPDATE, a, before=(5, "w"), after=(5, "y"))]))
    assert lineage()[5][1] == before[5][1]
    want = {k: "v" for k in range(10) if k != 7} | {2: "x", 5: "y", 20: "n"}
    contract.assert_rows(t, a, sorted(want.items()))


def test_readers_outside_spark_read_row_deltas_and_small_compactions(factory: Factory, db: str) -> None:
    """DuckDB's and pyiceberg's readers (``cynomys sql --engine duckdb``)
    read what row deltas and a compaction without Spark wrote -- deletion
    vectors, ``_row_id`` columns -- as Spark reads it, keyed and keyless."""
    from cynomys.applier.targets.spark import readers

    t = factory(spark={"maintenance_commits": 3, "snapshots_kept": 1, "snapshot_retention_s": 0})
    a, _ = _tables(db)
    k = TableSchema(db, "k", (ColumnDef("x", "int"), ColumnDef("s", "varchar(10)")), ())
    t.apply(contract.flush([contract.change(Op.INSERT, a, after=(i, "v")) for i in range(10)]
                           + [contract.change(Op.INSERT, k, after=(i % 3, None)) for i in range(9)]))
    t.apply(contract.flush([contract.change(Op.UPDATE, a, before=(2, "v"), after=(2, "w")),
                            contract.change(Op.DELETE, k, before=(1, None))]))
    t.apply(contract.flush([contract.change(Op.DELETE, a, before=(3, "v")),
                            contract.change(Op.DELETE, k, before=(2, None))]))
    want = {"a": sorted([(i, "w" if i == 2 else "v") for i in range(10) if i != 3]),
            "k": sorted([(0, None)] * 3 + [(1, None)] * 2 + [(2, None)] * 2)}
    for moment in ("after the row deltas", "after the compaction"):
        con = readers.duckdb_connection(t.cfg)
        for table, rows in want.items():
            assert sorted(con.execute(f'SELECT * FROM "{db}"."{table}"').fetchall()) == rows, (moment, table)
            got = readers.pyiceberg_table(t.cfg, db, table).scan().to_arrow().to_pylist()
            assert sorted(tuple(r.values()) for r in got) == rows, (moment, table)
        assert _our_deletion_vectors(t, db, "a") or moment != "after the row deltas"
        t.idle()
        t.idle()
    assert {r["how"] for r in t.maintenance_report()["tables"].values()} == {"pyarrow"}


def test_a_key_held_twice_or_a_float_key_goes_through_the_merge(target: SparkTarget, db: str) -> None:
    """What a row delta cannot decide as the MERGE would: two live rows
    with one key (a table written by something else) -- the MERGE updates
    both -- and a floating-point key (``=`` on doubles is not Arrow's)."""
    a, _ = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "one"))]))
    target.sql(f"INSERT INTO {target.qualified(db, 'a')} VALUES (1, 'twin')")
    target.apply(contract.flush([contract.change(Op.UPDATE, a, before=(1, "one"), after=(1, "new"))]))
    contract.assert_rows(target, a, [(1, "new"), (1, "new")])
    assert not _our_deletion_vectors(target, db, "a")
    f = TableSchema(db, "f", (ColumnDef("x", "double"), ColumnDef("v", "int")), ("x",))
    target.apply(contract.flush([contract.change(Op.INSERT, f, after=(0.5, 1)), contract.change(Op.INSERT, f, after=(2.0, 2))]))
    target.apply(contract.flush([contract.change(Op.UPDATE, f, before=(0.5, 1), after=(0.5, 3)),
                                 contract.change(Op.DELETE, f, before=(2.0, 2))]))
    contract.assert_rows(target, f, [(0.5, 3)])
    assert not _our_deletion_vectors(target, db, "f")


def test_a_row_delta_keeps_an_updated_rows_lineage_id(target: SparkTarget, db: str) -> None:
    """Format v3 row lineage, as Spark's MERGE keeps it: an updated row keeps
    its ``_row_id`` (from its file's first id and position, or the id its
    file holds after an earlier update) and takes the new sequence number;
    a new row gets a fresh id."""
    a, _ = _tables(db)
    target.apply(contract.flush([contract.change(Op.INSERT, a, after=(k, "v")) for k in range(5)]))

    def lineage() -> dict[int, tuple[int, int]]:
        return {r.id: (r._row_id, r._last_updated_sequence_number) for r in target.spark.sql(
            f"SELECT id, _row_id, _last_updated_sequence_number FROM {target.qualified(db, 'a')}").collect()}

    first = lineage()
    for value in ("w", "x"):  # the second update finds the id in the first one's file
        target.apply(contract.flush([contract.change(Op.UPDATE, a, before=(3, "v"), after=(3, value)),
                                     contract.change(Op.INSERT, a, after=(ord(value), value))]))
        now = lineage()
        assert now[3][0] == first[3][0] and now[3][1] > first[3][1]
        assert now[ord(value)][0] not in {ids for ids, _ in first.values()}
        assert {k: v for k, v in now.items() if k in first and k != 3} == {k: v for k, v in first.items() if k != 3}
    assert _our_deletion_vectors(target, db, "a")
    assert len({ids for ids, _ in lineage().values()}) == 7


# --------------------------------------------------------------------------
# Last: kills the module's JVM
# --------------------------------------------------------------------------
def test_jvm_death_is_transient_then_a_new_target_recovers(factory: Factory, db: str) -> None:
    from cynomys.core.errors import TargetUnavailableError

    a, _ = _tables(db)
    t = factory()
    t.apply(contract.flush([contract.change(Op.INSERT, a, after=(1, "a"))]))
    jvm = t.spark.sparkContext._gateway.proc  # type: ignore[attr-defined,union-attr]  # the JVM this process started
    jvm.kill()
    jvm.wait()
    fl = contract.flush([contract.change(Op.INSERT, a, after=(2, "b"))])
    with pytest.raises(TargetUnavailableError):
        t.apply(fl)
    t.close()  # what the applier loop does before it opens the target again
    again = factory()
    again.apply(fl)
    contract.assert_rows(again, a, [(1, "a"), (2, "b")])
