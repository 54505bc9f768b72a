"""Test bodies every Target must pass, written against the Target interface.

Each body takes a ``TargetFactory`` (keyword overrides -> a connected
Target) and a fresh database name; test_target_contract.py runs every body
on every kind of the target registry (their setups: target_setups/).  Rows are compared as
multisets of *typed* values: ``Decimal('1.0')`` and ``1`` or a naive and an
aware datetime do not pass for each other.
"""
from __future__ import annotations

import contextlib
import datetime
import struct
from collections import Counter
from decimal import Decimal
from typing import Any, Callable, Iterable, Iterator, Protocol

import pytest

from cynomys.applier.targets.base import Flush, Target, build_flush
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError
from cynomys.core.model import (
    AppliedState,
    Change,
    ColumnDef,
    Op,
    Position,
    RawTemporal,
    Row,
    TableSchema,
    Value,
)


class TargetFactory(Protocol):
    def __call__(self, **overrides: Any) -> Target: ...


UTC = datetime.timezone.utc
PRODUCER = "contract-producer"


def f32(x: float) -> float:
    """The single-precision value a FLOAT column holds."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def typed(rows: Iterable[Row]) -> Counter[tuple[tuple[str, Value], ...]]:
    # Decimals compare by text too: Decimal('25') == Decimal('25.00'), but a
    # target that drops the scale has not kept the value exactly.
    return Counter(tuple((type(v).__name__, str(v) if isinstance(v, Decimal) else v) for v in row) for row in rows)


def assert_rows(target: Target, schema: TableSchema, expected: Iterable[Row]) -> None:
    got, want = typed(target.fetch_rows(schema.database, schema.table)), typed(expected)
    if got != want:
        extra, missing = list((got - want).elements()), list((want - got).elements())
        lines = [f"{schema.name}: {len(extra)} unexpected row(s), {len(missing)} missing"]
        for e, m in zip(extra, missing):  # name the differing columns of paired rows
            lines += [f"  {c.name}: got {ev!r}, want {mv!r}" for c, ev, mv in zip(schema.columns, e, m) if ev != mv]
        lines += [f"  unexpected {r}" for r in extra[len(missing):]] + [f"  missing {r}" for r in missing[len(extra):]]
        raise AssertionError("\n".join(lines))


_seq = iter(range(1, 10**9))


def state(seq: int | None = None, pos: int | None = None, producer: str = PRODUCER) -> AppliedState:
    n = next(_seq) if seq is None else seq
    return AppliedState(producer, n, Position("mysql-bin.000001", pos if pos is not None else 1000 + n), commit_ts=n)


def change(op: Op, schema: TableSchema, before: Row | None = None, after: Row | None = None) -> Change:
    return Change(op, schema.database, schema.table, "tid", Position("mysql-bin.000001", 4), 0, schema, before, after)


def flush(changes: list[Change], st: AppliedState | None = None) -> Flush:
    return build_flush(changes, st or state())


def ddl(db: str, sql: str, pos: int = 500) -> Change:
    return Change(Op.DDL, db, "", "tid", Position("mysql-bin.000001", pos), 0, sql=sql)


# --------------------------------------------------------------------------
# One row of every MySQL type
# --------------------------------------------------------------------------
ALL_TYPES = (
    ("id", "int"), ("ti", "tinyint"), ("ti_u", "tinyint unsigned"), ("si", "smallint"),
    ("si_u", "smallint unsigned"), ("mi", "mediumint"), ("mi_u", "mediumint unsigned"), ("i", "int"),
    ("i_u", "int unsigned"), ("bi", "bigint"), ("bi_u", "bigint unsigned"), ("dec", "decimal(65,30)"),
    ("f", "float"), ("d", "double"), ("b", "bit(64)"), ("b1", "bit(1)"), ("dt", "date"), ("dtt", "datetime(6)"),
    ("dt0", "datetime"), ("ts", "timestamp(6)"), ("tm", "time(6)"), ("yr", "year"), ("zd", "date"),
    ("zdt", "datetime(6)"), ("zts", "timestamp(6)"), ("s", "varchar(100)"), ("c", "char(10)"),
    ("bn", "binary(4)"), ("vb", "varbinary(300)"), ("bl", "blob"), ("e", "enum('a','b','it''s')"),
    ("st", "set('x','y','z')"), ("j", "json"), ("tx", "longtext"),
)


def all_types_schema(db: str, table: str = "all_types") -> TableSchema:
    return TableSchema(db, table, tuple(ColumnDef(n, t) for n, t in ALL_TYPES), ("id",))


ALL_TYPES_ROWS: list[Row] = [
    (1, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807,
     18446744073709551615, Decimal("12345678901234567890123456789012345.123456789012345678901234567890"),
     f32(3.4028234663852886e38), 1.7976931348623157e308, 2**64 - 1, 1, datetime.date(9999, 12, 31),
     datetime.datetime(9999, 12, 31, 23, 59, 59, 999999), datetime.datetime(2024, 2, 29, 12, 0, 1),
     datetime.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC),
     datetime.timedelta(hours=838, minutes=59, seconds=59), 2155, RawTemporal("0000-00-00"),
     RawTemporal("2020-00-10 00:00:00.000000"), RawTemporal("0000-00-00 00:00:00.000000"),
     "😀 tab\there\nnew line \\ back\\Nslash 'q' \"dq\"", "abc", b"A\x00\x00\x00",
     bytes(range(256)) + b"\\N\t\n", bytes(range(256)) * 3, "it's", "", '{"k": [1, 2, {"x": null}]}',
     "ünïcødé ✓ " * 10),
    (2, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
     Decimal("-0.000000000000000000000000000001"), f32(-1.1), 5e-324, 0, 0, datetime.date(1000, 1, 1),
     datetime.datetime(1000, 1, 1, 0, 0, 0), datetime.datetime(1970, 1, 1),
     datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), -datetime.timedelta(hours=838, minutes=59, seconds=59),
     0, RawTemporal("2020-02-31"), RawTemporal("0000-00-00 00:00:00.000000"),
     datetime.datetime(2001, 9, 9, 1, 46, 40, 123456, tzinfo=UTC), "", "", b"\x00\x00\x00\x00", b"", b"", "a",
     "x,z", "[]", ""),
    (3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, Decimal("0E-30"), 0.0, -0.5, 5, 1, datetime.date(2020, 2, 29),
     datetime.datetime(2020, 2, 29, 23, 59, 59, 1), datetime.datetime(2020, 1, 1, 0, 0, 0),
     datetime.datetime(2020, 6, 1, 12, 30, tzinfo=UTC), datetime.timedelta(seconds=-1.5), 1901,
     datetime.date(2020, 1, 1), datetime.datetime(2020, 1, 1, 0, 0, 0, 500000),
     datetime.datetime(2020, 1, 1, tzinfo=UTC), "NULL", "c", b"\t\n\\\x00", b"\\", b"\x00", "b", "x,y,z",
     '"s"', "\\N"),
    (4,) + (None,) * (len(ALL_TYPES) - 1),
]

#: Targets whose DATE/TIMESTAMP cannot hold zero or partial dates (DuckDB,
#: MonetDB: they refuse them) get real dates at the edges of the range in
#: the contract rows instead.
_REAL_DATES = {
    RawTemporal("0000-00-00"): datetime.date(1, 1, 1),
    RawTemporal("2020-02-31"): datetime.date(2020, 2, 28),
    RawTemporal("2020-00-10 00:00:00.000000"): datetime.datetime(1, 1, 1, 0, 0, 0, 1),
}


def real_dated_rows() -> list[Row]:
    """ALL_TYPES_ROWS with every zero or partial date replaced by a real one."""
    rows = []
    for r in ALL_TYPES_ROWS:
        fixed = []
        for (_, type_text), v in zip(ALL_TYPES, r):
            if isinstance(v, RawTemporal):
                v = _REAL_DATES.get(v) or (datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC) if type_text.startswith(
                    "timestamp") else datetime.datetime(9999, 12, 31, 23, 59, 59, 999999))
            fixed.append(v)
        rows.append(tuple(fixed))
    return rows


def all_types_rows(factory: TargetFactory) -> list[Row]:
    """The rows a target is tested with: ALL_TYPES_ROWS unless its factory
    declares (``all_types_rows``) which values the target can hold."""
    rows: list[Row] = getattr(factory, "all_types_rows", ALL_TYPES_ROWS)
    return rows


def check_all_types_round_trip(factory: TargetFactory, db: str) -> None:
    target = factory()
    schema = all_types_schema(db)
    rows = all_types_rows(factory)
    target.apply(flush([change(Op.INSERT, schema, after=r) for r in rows]))
    assert target.table_exists(db, "all_types")
    assert_rows(target, schema, rows)
    # Delete rows by key: the key literals of each value must match.
    target.apply(flush([change(Op.DELETE, schema, before=r) for r in rows[:2]]))
    assert_rows(target, schema, rows[2:])


def check_keyless_all_types(factory: TargetFactory, db: str) -> None:
    """Whole-row deletes must match every value type exactly (NULLs too)."""
    target = factory()
    schema = TableSchema(db, "all_types_keyless", all_types_schema(db).columns, ())
    rows = all_types_rows(factory)
    target.apply(flush([change(Op.INSERT, schema, after=r) for r in rows + rows[:2]]))
    assert_rows(target, schema, rows + rows[:2])
    target.apply(flush([change(Op.DELETE, schema, before=r) for r in rows]))
    assert_rows(target, schema, rows[:2])
    # One copy of each left: deleted in one statement where the target
    # batches a flush's keyless deletes (ColumnStore-on-InnoDB).
    target.apply(flush([change(Op.DELETE, schema, before=r) for r in rows[:2]]))
    assert_rows(target, schema, [])


# --------------------------------------------------------------------------
# Deletes and updates
# --------------------------------------------------------------------------
def column_wise(changes: list[Change]) -> list[Change]:
    """``changes`` (inserts) as the applier's compiled path decodes them:
    InsertRuns, one envelope per insert (a zero date makes its column mixed,
    the reference path, only in its own envelope).  Call inside
    ``compiled_path()``."""
    from cynomys.core.model import Batch
    from cynomys.schemas import codec

    out: list[Change] = []
    for c in changes:
        out.extend(codec.decode_columnar(codec.encode(Batch("p", (c,), Position("f", 9)))).changes)
    return out


@contextlib.contextmanager
def compiled_path() -> Iterator[None]:
    from cynomys.core import compiled

    if not compiled.available():
        pytest.skip("cynomys._speedups is not built: the column-wise path needs it")
    was = compiled.ext is not None
    compiled.use_compiled(True)
    try:
        yield
    finally:
        compiled.use_compiled(was)


def check_all_types_column_wise(factory: TargetFactory, db: str) -> None:
    """The applier's compiled path: envelopes decoded column-wise
    (InsertRuns) reach the target as ``TableFlush.runs`` where it takes them
    (``Capabilities.columnar_inserts``), as rows elsewhere; the rows land
    the same either way -- alone (an append) and beside deletes and
    updates in one flush (a MERGE on Spark)."""
    from cynomys.core.columnar import InsertRun

    with compiled_path():
        target = factory()
        schema = all_types_schema(db)
        rows = all_types_rows(factory)
        first = column_wise([change(Op.INSERT, schema, after=r) for r in rows])
        assert any(type(c) is InsertRun for c in first)
        target.apply(build_flush(first, state(), target.capabilities.columnar_inserts))
        assert_rows(target, schema, rows)
        more = [(int(r[0]) + 10,) + r[1:] for r in rows]  # type: ignore[arg-type]
        updated = (rows[1][0],) + rows[2][1:]
        second = [change(Op.DELETE, schema, before=rows[0]), change(Op.UPDATE, schema, before=rows[1], after=updated)]
        target.apply(build_flush(second + column_wise([change(Op.INSERT, schema, after=r) for r in more]), state(),
                                 target.capabilities.columnar_inserts))
        assert_rows(target, schema, [updated, *rows[2:], *more])


def check_snapshot_reads_column_wise(factory: TargetFactory, db: str) -> None:
    """A snapshot chunk's READ rows decoded column-wise (one run of READs,
    core/columnar.py) are upserts on every target: a row the target holds
    for one of their keys is replaced (ColumnStore-on-MariaDB: LOAD DATA
    REPLACE; elsewhere its key is deleted first), new keys are added, other
    rows stay; beside a DELETE of another key in the same flush too."""
    from cynomys.core.columnar import InsertRun
    from cynomys.core.model import Batch
    from cynomys.schemas import codec

    schema = TableSchema(db, "reads", (ColumnDef("id", "int"), ColumnDef("v", "varchar(20)"),
                                       ColumnDef("d", "decimal(10,2)")), ("id",))
    held = [(i, f"old {i}", Decimal(f"{i}.25")) for i in range(1, 11)]
    chunk = [(i, f"read {i}", Decimal(f"{i}.50")) for i in range(5, 16)]
    with compiled_path():
        target = factory()
        target.apply(flush([change(Op.INSERT, schema, after=r) for r in held]))
        reads = codec.decode_columnar(codec.encode(Batch("p", tuple(
            change(Op.READ, schema, after=r) for r in chunk), Position("f", 9)))).changes
        assert [(type(c), c.op) for c in reads] == [(InsertRun, Op.READ)]
        target.apply(build_flush(list(reads), state(), target.capabilities.columnar_inserts))
        assert_rows(target, schema, held[:4] + chunk)
        again = [(i, f"again {i}", Decimal(f"{i}.00")) for i in range(14, 18)]
        reads = codec.decode_columnar(codec.encode(Batch("p", tuple(
            change(Op.READ, schema, after=r) for r in again), Position("f", 10)))).changes
        target.apply(build_flush([change(Op.DELETE, schema, before=held[0]), *reads], state(),
                                 target.capabilities.columnar_inserts))
        assert_rows(target, schema, held[1:4] + chunk[:-2] + again)


def check_delete_by_key(factory: TargetFactory, db: str) -> None:
    target = factory()
    schema = TableSchema(db, "single", (ColumnDef("id", "bigint"), ColumnDef("v", "varchar(20)")), ("id",))
    rows = [(i, f"v{i}") for i in range(1, 2501)]  # more keys than one DELETE statement holds
    target.apply(flush([change(Op.INSERT, schema, after=r) for r in rows]))
    gone = [r for r in rows if r[0] % 2 == 0]
    target.apply(flush([change(Op.DELETE, schema, before=r) for r in gone]))
    assert_rows(target, schema, [r for r in rows if r[0] % 2 == 1])


def check_delete_by_composite_key(factory: TargetFactory, db: str) -> None:
    target = factory()
    schema = TableSchema(db, "composite", (ColumnDef("a", "int"), ColumnDef("b", "varchar(10)"),
                                           ColumnDef("v", "double")), ("a", "b"))
    rows = [(a, b, a * 1.5) for a in range(3) for b in ("x", "y", "X", "x ")]
    target.apply(flush([change(Op.INSERT, schema, after=r) for r in rows]))
    gone = [(1, "x", 1.5), (2, "X", 3.0), (0, "x ", 0.0)]
    target.apply(flush([change(Op.DELETE, schema, before=r) for r in gone]))
    assert_rows(target, schema, [r for r in rows if r not in gone])


def check_update_as_delete_insert(factory: TargetFactory, db: str) -> None:
    target = factory()
    schema = TableSchema(db, "upd", (ColumnDef("id", "int"), ColumnDef("v", "varchar(10)")), ("id",))
    target.apply(flush([change(Op.INSERT, schema, after=(i, "old")) for i in (1, 2, 3)]))
    target.apply(flush([
        change(Op.UPDATE, schema, before=(1, "old"), after=(1, "new")),     # value change
        change(Op.UPDATE, schema, before=(2, "old"), after=(20, "moved")),  # key change
        change(Op.READ, schema, after=(3, "snap")),                         # snapshot upsert
        change(Op.READ, schema, after=(4, "snap")),
    ]))
    assert_rows(target, schema, [(1, "new"), (20, "moved"), (3, "snap"), (4, "snap")])


def check_keyless_multiset(factory: TargetFactory, db: str) -> None:
    target = factory()
    schema = TableSchema(db, "bag", (ColumnDef("a", "int"), ColumnDef("s", "varchar(10)"),
                                     ColumnDef("f", "float")), ())
    r1, r2, r3, r4 = (1, "x", f32(0.1)), (2, None, None), (1, "X", f32(0.1)), (1, "x ", f32(0.1))
    target.apply(flush([change(Op.INSERT, schema, after=r) for r in [r1, r1, r1, r2, r2, r3, r4]]))
    target.apply(flush([change(Op.DELETE, schema, before=r1), change(Op.DELETE, schema, before=r1),
                        change(Op.DELETE, schema, before=r2),
                        change(Op.UPDATE, schema, before=r3, after=(3, "X", f32(0.1)))]))
    assert_rows(target, schema, [r1, r2, (3, "X", f32(0.1)), r4])


# --------------------------------------------------------------------------
# State committed with the data
# --------------------------------------------------------------------------
def check_state_committed_with_data(factory: TargetFactory, db: str) -> None:
    target = factory()
    producer = f"p-{db}"
    assert target.applied(producer) is None
    good = TableSchema(db, "good", (ColumnDef("id", "int"), ColumnDef("v", "int")), ("id",))
    st1 = state(seq=1, producer=producer)
    target.apply(flush([change(Op.INSERT, good, after=(1, 1))], st1))
    assert target.applied(producer) == st1
    # A flush whose second table holds a value the target cannot store:
    # nothing of it may stay, and the state must not move.
    bad = TableSchema(db, "bad", (ColumnDef("id", "int"), ColumnDef("v", "tinyint")), ("id",))
    with pytest.raises(TargetRejectedError) as info:
        target.apply(flush([change(Op.DELETE, good, before=(1, 1)), change(Op.INSERT, good, after=(2, 2)),
                            change(Op.INSERT, bad, after=(1, 1000))], state(seq=2, producer=producer)))
    assert f"{db}.bad" in str(info.value)
    assert_rows(target, good, [(1, 1)])
    assert target.applied(producer) == st1
    # The target works again after the rejection; state-only flushes move the state.
    st3 = state(seq=3, producer=producer)
    target.apply(Flush([], st3))
    assert target.applied(producer) == st3


def check_value_out_of_range(factory: TargetFactory, db: str) -> None:
    target = factory()
    schema = TableSchema(db, "narrow", (ColumnDef("id", "int"), ColumnDef("small", "tinyint unsigned")), ("id",))
    with pytest.raises(TargetRejectedError) as info:
        target.apply(flush([change(Op.INSERT, schema, after=(1, 1)), change(Op.INSERT, schema, after=(2, 256))]))
    text = str(info.value)
    assert f"{db}.narrow" in text and "small" in text
    assert target.fetch_rows(db, "narrow") == []


# --------------------------------------------------------------------------
# DDL
# --------------------------------------------------------------------------
def check_ddl(factory: TargetFactory, db: str) -> None:
    target = factory()
    producer = PRODUCER
    target.apply_ddl(ddl("", f"CREATE DATABASE IF NOT EXISTS `{db}`"), state(producer=producer))
    st = state(producer=producer)
    target.apply_ddl(ddl(db, "CREATE TABLE `t1` (id INT NOT NULL PRIMARY KEY, a VARCHAR(10), b INT, "
                             "c DECIMAL(10,2), KEY (a)) ENGINE=InnoDB DEFAULT CHARSET=latin1"), st)
    assert target.applied(producer) == st
    assert target.table_exists(db, "t1")
    schema = TableSchema(db, "t1", (ColumnDef("id", "int"), ColumnDef("a", "varchar(10)"), ColumnDef("b", "int"),
                                    ColumnDef("c", "decimal(10,2)")), ("id",))
    target.apply(flush([change(Op.INSERT, schema, after=(1, "x", 2, Decimal("3.50")))]))

    target.apply_ddl(ddl(db, "ALTER TABLE t1 ADD COLUMN d DATETIME(6) AFTER a, DROP COLUMN b, "
                             "MODIFY COLUMN c DECIMAL(12,3), ADD INDEX ix (a)"), state(producer=producer))
    target.apply_ddl(ddl(db, "ALTER TABLE t1 CHANGE a a2 VARCHAR(20), RENAME COLUMN c TO c2"), state(producer=producer))
    assert sorted(target.fetch_rows(db, "t1")) == [(1, "x", Decimal("3.500"), None)]

    target.apply_ddl(ddl(db, "RENAME TABLE t1 TO t2"), state(producer=producer))
    assert not target.table_exists(db, "t1") and target.table_exists(db, "t2")
    target.apply_ddl(ddl(db, "ALTER TABLE t2 RENAME TO t3"), state(producer=producer))
    assert target.table_exists(db, "t3")
    target.apply_ddl(ddl(db, "TRUNCATE TABLE t3"), state(producer=producer))
    assert target.fetch_rows(db, "t3") == []
    target.apply_ddl(ddl(db, "CREATE TABLE t4 LIKE t3"), state(producer=producer))
    assert target.table_exists(db, "t4")
    target.apply_ddl(ddl(db, "DROP TABLE t3, t4 /* generated by server */"), state(producer=producer))
    assert not target.table_exists(db, "t3") and not target.table_exists(db, "t4")


def check_add_column_fills_existing_rows(factory: TargetFactory, db: str) -> None:
    """ALTER TABLE ... ADD COLUMN with a DEFAULT (or NOT NULL) fills the rows
    already there on the source, and no row event says so."""
    target = factory()
    target.apply_ddl(ddl("", f"CREATE DATABASE IF NOT EXISTS `{db}`"), state())
    target.apply_ddl(ddl(db, "CREATE TABLE f (id INT PRIMARY KEY, a INT)"), state())
    schema = TableSchema(db, "f", (ColumnDef("id", "int", False), ColumnDef("a", "int")), ("id",))
    target.apply(flush([change(Op.INSERT, schema, after=(1, 10)), change(Op.INSERT, schema, after=(2, None))]))
    target.apply_ddl(ddl(db, "ALTER TABLE f ADD COLUMN region CHAR(2) NOT NULL DEFAULT 'eu', "
                             "ADD COLUMN n INT NOT NULL, ADD COLUMN d DECIMAL(6,2) DEFAULT -1.50, ADD COLUMN z INT"),
                     state())
    assert_rows(target, TableSchema(db, "f", schema.columns + (ColumnDef("region", "char(2)"), ColumnDef("n", "int"),
                                                               ColumnDef("d", "decimal(6,2)"), ColumnDef("z", "int")),
                                    ("id",)),
                [(1, 10, "eu", 0, Decimal("-1.50"), None), (2, None, "eu", 0, Decimal("-1.50"), None)])


def check_ddl_replay_is_harmless(factory: TargetFactory, db: str) -> None:
    """The state is written after a DDL; a crash in between replays it."""
    target = factory()
    statements = [
        f"CREATE DATABASE `{db}`",
        f"CREATE TABLE `{db}`.r (id INT PRIMARY KEY, a INT)",
        f"ALTER TABLE `{db}`.r ADD COLUMN b INT, DROP COLUMN a",
        f"ALTER TABLE `{db}`.r CHANGE b c BIGINT",
        f"RENAME TABLE `{db}`.r TO `{db}`.r2",
        f"ALTER TABLE `{db}`.r2 ADD COLUMN d VARCHAR(5)",
    ]
    for sql in statements:
        target.apply_ddl(ddl("", sql), state())
        target.apply_ddl(ddl("", sql), state())  # the replay
    schema = TableSchema(db, "r2", (ColumnDef("id", "int"), ColumnDef("c", "bigint"), ColumnDef("d", "varchar(5)")),
                         ("id",))
    target.apply(flush([change(Op.INSERT, schema, after=(1, 2, "x"))]))
    assert_rows(target, schema, [(1, 2, "x")])


def check_unsupported_ddl(factory: TargetFactory, db: str) -> None:
    sql = "ALTER TABLE t DROP PARTITION p0"
    target = factory()
    before = target.applied(PRODUCER)
    with pytest.raises(TargetRejectedError) as info:
        target.apply_ddl(ddl(db, sql, pos=777), state())
    text = str(info.value)
    assert sql in text and "skip_ddl" in text and "mysql-bin.000001:777" in text
    assert target.applied(PRODUCER) == before
    # Skipped on purpose, by text or by position: only the state moves.
    for skip in (sql, "mysql-bin.000001:777"):
        skipping = factory(skip_ddl=[skip])
        st = state()
        skipping.apply_ddl(ddl(db, sql, pos=777), st)
        assert skipping.applied(PRODUCER) == st


def check_schema_drift(factory: TargetFactory, db: str) -> None:
    """Rows with a column the target lacks (a skipped ADD COLUMN) add it."""
    target = factory()
    v1 = TableSchema(db, "drift", (ColumnDef("id", "int"), ColumnDef("a", "int")), ("id",))
    target.apply(flush([change(Op.INSERT, v1, after=(1, 1))]))
    v2 = TableSchema(db, "drift", v1.columns + (ColumnDef("b", "varchar(5)"),), ("id",))
    target.apply(flush([change(Op.INSERT, v2, after=(2, 2, "x"))]))
    assert_rows(target, v2, [(1, 1, None), (2, 2, "x")])


#: Source names a target must carry through untouched: braces (str.format
#: once loaded 't{n}' into another table and crashed on 't{0}'), quotes,
#: backslashes and backticks.
ODD_TABLES = ("t{n}", "t{0}'q\"d\\b`k")
ODD_COLUMN = "c{0}\"'\\x`"


def check_odd_names(factory: TargetFactory, db: str) -> None:
    target = factory()
    for name in ODD_TABLES:
        schema = TableSchema(db, name, (ColumnDef("id", "int"), ColumnDef(ODD_COLUMN, "varchar(10)")), ("id",))
        rows: list[Row] = [(1, "a{0}"), (2, None), (3, "'\\\"")]
        target.apply(flush([change(Op.INSERT, schema, after=r) for r in rows]))
        target.apply(flush([change(Op.DELETE, schema, before=rows[0])]))
        assert_rows(target, schema, rows[1:])
    assert target.table_exists(db, "t{n}") and not target.table_exists(db, "t")
    bag = TableSchema(db, "bag{1}", (ColumnDef(ODD_COLUMN, "int"),), ())
    target.apply(flush([change(Op.INSERT, bag, after=(5,)), change(Op.INSERT, bag, after=(5,))]))
    target.apply(flush([change(Op.DELETE, bag, before=(5,))]))
    assert_rows(target, bag, [(5,)])
    # DDL on such names: the statement text quotes them with backticks.
    target.apply_ddl(ddl(db, "ALTER TABLE `t{n}` ADD COLUMN `x{y}` INT, RENAME COLUMN `x{y}` TO `z{0}`"), state())
    target.apply_ddl(ddl(db, "RENAME TABLE `t{n}` TO `u{n}`"), state())
    assert target.table_exists(db, "u{n}") and not target.table_exists(db, "t{n}")


def check_rejection_shows_no_row(factory: TargetFactory, db: str) -> None:
    """A refused value names the table and column; the rest of a keyless
    row (its data) stays out of the message, which ends up in logs."""
    target = factory()
    schema = TableSchema(db, "private", (ColumnDef("note", "varchar(40)"), ColumnDef("small", "tinyint unsigned")), ())
    with pytest.raises(TargetRejectedError) as info:
        target.apply(flush([change(Op.INSERT, schema, after=("s3cr3t note", 1000))]))
    text = str(info.value)
    assert f"{db}.private" in text and "small" in text
    assert "s3cr3t" not in text


def check_verify_checksum(factory: TargetFactory, db: str) -> None:
    """`cynomys verify`: the target's checksum of a key range (in SQL or
    read back) equals the producer's over the rows loaded, every type; a
    purged range is gone and nothing else."""
    from cynomys.verify.checksum import KeyRange, RowHasher

    target = factory()
    schema = all_types_schema(db)
    rows = all_types_rows(factory)
    hasher = RowHasher(schema.columns)
    assert target.checksum_range(schema, KeyRange()) == hasher.rows([]), "a missing table has no rows"
    target.apply(flush([change(Op.INSERT, schema, after=r) for r in rows]))
    assert target.checksum_range(schema, KeyRange()) == hasher.rows(rows)
    for i, r in enumerate(rows):  # one row at a time: a mismatch names the row
        rng = KeyRange((r[0] - 1,), (r[0],))
        assert target.checksum_range(schema, rng) == hasher.rows([r]), f"row {i}: {r!r}"
    middle = KeyRange((1,), (3,))
    assert target.checksum_range(schema, middle) == hasher.rows(rows[1:3])
    assert target.checksum_range(schema, middle) != hasher.rows(rows[1:2])
    # A repair: the range's target rows go and the source's come, in one flush with the state.
    fl = flush([change(Op.READ, schema, after=rows[2])])
    assert target.purge_into(fl, schema, middle) == 2
    target.apply(fl)
    assert_rows(target, schema, [rows[0], rows[2], *rows[3:]])
    assert target.applied(PRODUCER) == fl.state
    # Without FLOAT/DOUBLE every type has an exact SQL text: targets that
    # checksum in SQL (ColumnStore/MariaDB, DuckDB) take that path here.
    keep = [i for i, c in enumerate(schema.columns) if c.base_type not in ("float", "double")]
    exact = TableSchema(db, "exact_types", tuple(schema.columns[i] for i in keep), schema.key)
    exact_rows = [tuple(r[i] for i in keep) for r in rows]
    hasher = RowHasher(exact.columns)
    target.apply(flush([change(Op.INSERT, exact, after=r) for r in exact_rows]))
    assert target.checksum_range(exact, KeyRange()) == hasher.rows(exact_rows)
    for i, r in enumerate(exact_rows):
        rng = KeyRange((r[0] - 1,), (r[0],))
        assert target.checksum_range(exact, rng) == hasher.rows([r]), f"row {i}: {r!r}"


# --------------------------------------------------------------------------
# One source transaction in parts (applier/spill.py)
# --------------------------------------------------------------------------
def check_transaction_in_parts(factory: TargetFactory, db: str) -> None:
    """Parts apply on top of each other (a key changed in two parts, rows
    of a keyless multiset inserted in one and deleted in the next, a table
    first touched in a later part); nothing is visible, to the writing
    target itself or another one, before ``commit_parts``, which records
    the state with all of it; ``rollback_parts`` and ``close`` leave the
    target as it was."""
    target, reader = factory(), factory()
    producer = f"parts-{db}"
    keyed = TableSchema(db, "pk", (ColumnDef("id", "int"), ColumnDef("v", "varchar(10)")), ("id",))
    bag = TableSchema(db, "bag", (ColumnDef("a", "int"), ColumnDef("s", "varchar(10)")), ())
    late = TableSchema(db, "late", (ColumnDef("id", "int"), ColumnDef("v", "varchar(10)")), ("id",))
    st0 = state(producer=producer)
    target.apply(flush([change(Op.INSERT, keyed, after=(i, "v0")) for i in (1, 2, 3, 4)]
                       + [change(Op.INSERT, bag, after=r) for r in [(1, "x"), (1, "x"), (2, "y")]], st0))
    before_keyed, before_bag = [(i, "v0") for i in (1, 2, 3, 4)], [(1, "x"), (1, "x"), (2, "y")]

    def unchanged() -> None:
        for t in (target, reader):
            assert_rows(t, keyed, before_keyed)
            assert_rows(t, bag, before_bag)
            assert t.applied(producer) == st0
    # Committing "the last part" with no parts open would apply part of a transaction.
    with pytest.raises(TargetUnavailableError):
        target.commit_parts(flush([change(Op.INSERT, keyed, after=(99, "lone"))], state(producer=producer)))
    unchanged()
    target.apply_part(flush([change(Op.UPDATE, keyed, (1, "v0"), (1, "p1")), change(Op.DELETE, keyed, (2, "v0")),
                             change(Op.INSERT, keyed, after=(5, "p1")),
                             change(Op.DELETE, bag, before=(1, "x")), change(Op.INSERT, bag, after=(3, "z"))], st0))
    assert target.parts_open
    unchanged()
    target.apply_part(flush([change(Op.UPDATE, keyed, (1, "p1"), (1, "p2")), change(Op.INSERT, keyed, after=(2, "p2")),
                             change(Op.DELETE, keyed, (5, "p1")), change(Op.UPDATE, keyed, (3, "v0"), (30, "p2")),
                             change(Op.DELETE, bag, before=(3, "z")), change(Op.UPDATE, bag, (2, "y"), (1, "x")),
                             change(Op.INSERT, late, after=(1, "late"))], st0))
    unchanged()
    assert not reader.table_exists(db, "late") or not reader.fetch_rows(db, "late")
    st1 = state(producer=producer)
    target.commit_parts(flush([change(Op.UPDATE, keyed, (2, "p2"), (2, "end")), change(Op.INSERT, bag, after=(9, "w"))],
                              st1))
    assert not target.parts_open
    after_keyed, after_bag = [(1, "p2"), (2, "end"), (30, "p2"), (4, "v0")], [(1, "x"), (1, "x"), (9, "w")]
    for t in (target, reader):
        assert_rows(t, keyed, after_keyed)
        assert_rows(t, bag, after_bag)
        assert_rows(t, late, [(1, "late")])
        assert t.applied(producer) == st1
    # A producer sending the transaction again from its start: the parts go.
    target.apply_part(flush([change(Op.DELETE, keyed, (1, "p2")), change(Op.INSERT, bag, after=(7, "r"))], st1))
    target.rollback_parts()
    assert not target.parts_open
    # A process that stops (or dies) with parts applied: nothing stays.
    target.apply_part(flush([change(Op.DELETE, keyed, (4, "v0")), change(Op.DELETE, bag, before=(9, "w"))], st1))
    target.close()
    again = factory()
    for t in (again, reader):
        assert_rows(t, keyed, after_keyed)
        assert_rows(t, bag, after_bag)
        assert t.applied(producer) == st1
    # ... and the target takes flushes and parts as before.
    st2 = state(producer=producer)
    again.apply_part(flush([change(Op.DELETE, keyed, (4, "v0"))], st1))
    again.commit_parts(flush([], st2))
    assert_rows(reader, keyed, after_keyed[:3])
    assert reader.applied(producer) == st2


CONTRACT: dict[str, Callable[[TargetFactory, str], None]] = {
    "transaction_in_parts": check_transaction_in_parts,
    "verify_checksum": check_verify_checksum,
    "odd_names": check_odd_names,
    "all_types_round_trip": check_all_types_round_trip,
    "all_types_column_wise": check_all_types_column_wise,
    "snapshot_reads_column_wise": check_snapshot_reads_column_wise,
    "keyless_all_types": check_keyless_all_types,
    "delete_by_key": check_delete_by_key,
    "delete_by_composite_key": check_delete_by_composite_key,
    "update_as_delete_insert": check_update_as_delete_insert,
    "keyless_multiset": check_keyless_multiset,
    "state_committed_with_data": check_state_committed_with_data,
    "value_out_of_range": check_value_out_of_range,
    "ddl": check_ddl,
    "ddl_replay_is_harmless": check_ddl_replay_is_harmless,
    "add_column_fills_existing_rows": check_add_column_fills_existing_rows,
    "unsupported_ddl": check_unsupported_ddl,
    "schema_drift": check_schema_drift,
    "rejection_shows_no_row": check_rejection_shows_no_row,
}


