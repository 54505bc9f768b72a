"""Contract bodies of [shape] (cynomys/shape, cynomys/applier/shaping.py),
run on every target like those of target_contract.py (test_target_contract.py
runs both).  Each shapes source changes as the producer does (``Shaper``),
passes them through the applier's shaping stage (``Shaping``: modes and the
schema-change policy, on the target under test) and lands them the way the
applier does (folded per key, one flush per stretch between DDL statements,
DDL through ``Target.apply_ddl``); then reads the target back."""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
from decimal import Decimal
from typing import Callable

import pytest

from cynomys.applier.shaping import Shaping
from cynomys.applier.targets.base import Target, build_flush
from cynomys.core.config import RouteRule, ShapeConfig, TableRule, TargetRule
from cynomys.core.errors import TerminalError
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, Row, TableSchema
from cynomys.reducer.fold import Folder
from cynomys.shape import Shaper, compile_rules
from tests.integration.target_contract import TargetFactory, assert_rows, state

KEY = "contract-mask-key-0123456789"
UTC = datetime.timezone.utc
_pos = iter(range(1000, 10**9, 100))


def _shape(target: Target, shape: ShapeConfig) -> tuple[Shaper, Shaping]:
    cfg = dataclasses.replace(target.cfg, shape=dataclasses.replace(shape, mask_key=KEY))
    return Shaper(compile_rules(cfg, producer=True)), Shaping(cfg, target)


class Source:
    """Source transactions, each a list of changes, with their own positions."""

    def __init__(self) -> None:
        self.n = 0

    def txn(self, *ops: tuple[Op, TableSchema, Row | None, Row | None]) -> list[Change]:
        self.n += 1
        at = Position("mysql-bin.000001", next(_pos))
        return [Change(op, s.database, s.table, f"0-1-{self.n}", at, 1_700_000_000 + self.n, s, b, a)
                for op, s, b, a in ops]

    def ddl(self, db: str, sql: str) -> list[Change]:
        self.n += 1
        return [Change(Op.DDL, db, "", f"0-1-{self.n}", Position("mysql-bin.000001", next(_pos)),
                       1_700_000_000 + self.n, sql=sql)]


def land(target: Target, shaper: Shaper, stage: Shaping, *txns: list[Change]) -> None:
    """Source transactions through both stages onto the target, as the daemons do."""
    shipped: list[Change] = []
    for txn in txns:
        shipped.extend(x for x in (shaper.change(c) for c in txn) if x is not None)
    batch = stage.batch(Batch("p", tuple(shipped), Position("mysql-bin.000001", 4)))
    folder = Folder()
    for c in batch.changes:
        if c.op is Op.DDL:
            if len(folder):
                target.apply(build_flush(folder.changes(), state()))
                folder = Folder()
            target.apply_ddl(c, state())
        else:
            folder.add(c)
    if len(folder):
        target.apply(build_flush(folder.changes(), state()))


def _t(db: str, table: str, cols: str, key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(db, table, tuple(ColumnDef(n, t, n not in key) for n, t in
                                        (c.split(":") for c in cols.split(";"))), key)


I, U, D, R = Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ  # noqa: E741  (the fold table's names)


# --------------------------------------------------------------------------
# Producer side: routes, masks, filters, DDL
# --------------------------------------------------------------------------
def check_shape_merge_route(factory: TargetFactory, db: str) -> None:
    """Shards with overlapping keys into one table: the source database and
    table lead the key, so each shard's rows stay apart through updates
    and deletes; shards at two schema versions share one flush."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(route=[RouteRule(f"{db}_s*.orders", f"{db}.orders")]))
    s1 = _t(f"{db}_s1", "orders", "id:int;amount:decimal(10,2)")
    s2 = _t(f"{db}_s2", "orders", "id:int;amount:decimal(10,2)")
    src = Source()
    land(target, shaper, stage,
         src.txn((I, s1, None, (1, Decimal("1.00"))), (I, s2, None, (1, Decimal("2.00"))), (I, s2, None, (2, Decimal("3.00")))),
         src.txn((U, s1, (1, Decimal("1.00")), (1, Decimal("1.50"))), (D, s2, (2, Decimal("3.00")), None)))
    merged = _t(db, "orders", "source_db:varchar(64);source_table:varchar(64);id:int;amount:decimal(10,2)",
                ("source_db", "source_table", "id"))
    assert_rows(target, merged, [(f"{db}_s1", "orders", 1, Decimal("1.50")), (f"{db}_s2", "orders", 1, Decimal("2.00"))])
    # Shard 1 got a column shard 2 has not yet: one flush holds both shapes.
    s1b = _t(f"{db}_s1", "orders", "id:int;amount:decimal(10,2);note:varchar(10)")
    land(target, shaper, stage, src.txn((I, s1b, None, (5, Decimal("5.00"), "n")), (I, s2, None, (5, Decimal("6.00")))))
    wide = dataclasses.replace(merged, columns=merged.columns + (ColumnDef("note", "varchar(10)"),))
    assert_rows(target, wide, [(f"{db}_s1", "orders", 1, Decimal("1.50"), None), (f"{db}_s2", "orders", 1, Decimal("2.00"), None),
                               (f"{db}_s1", "orders", 5, Decimal("5.00"), "n"), (f"{db}_s2", "orders", 5, Decimal("6.00"), None)])


def check_shape_masks(factory: TargetFactory, db: str) -> None:
    """Masked values land as their masks (types changed where the mask says)
    and rows keyed by a hashed key are updated and deleted by it; the plain
    values are nowhere on the target."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(tables={f"{db}.people": TableRule(
        exclude=["notes"], rename={"email": "email_h"},
        mask={"email": "hash", "name": "const:***", "phone": "null", "city": "truncate:2", "ext": "hash_int"})}))
    s = _t(db, "people", "email:varchar(80);name:varchar(40);phone:varchar(20);city:varchar(40);ext:int;notes:text",
           ("email",))
    src = Source()
    rows = [("ann@x.org", "Ann", "555-1", "Berlin", 7, "n1"), ("bob@x.org", "Bob", "555-2", "Paris", None, "n2"),
            ("cy@x.org", "Cy", None, "Oslo", 9, "n3")]
    land(target, shaper, stage, src.txn(*((I, s, None, r) for r in rows)),
         src.txn((U, s, rows[0], ("ann@x.org", "Anna", "555-9", "Bern", 7, "n9")), (D, s, rows[1], None)))

    def h(v: str) -> str:
        return hmac.new(KEY.encode(), v.encode(), hashlib.sha256).hexdigest()

    def hi(v: int) -> int:
        return int.from_bytes(hmac.new(KEY.encode(), str(v).encode(), hashlib.sha256).digest()[:8], "big") & (2**63 - 1)

    shaped = TableSchema(db, "people", (ColumnDef("email_h", "char(64)", False), ColumnDef("name", "varchar(3)"),
                                        ColumnDef("phone", "varchar(20)"), ColumnDef("city", "varchar(40)"),
                                        ColumnDef("ext", "bigint")), ("email_h",))
    assert_rows(target, shaped, [(h("ann@x.org"), "***", None, "Be", hi(7)), (h("cy@x.org"), "***", None, "Os", hi(9))])
    held = repr(target.fetch_rows(db, "people"))
    for plain in ("ann@x.org", "Anna", "555-9", "Bern", "n9", "bob@x.org", "Oslo"):
        assert plain not in held


def check_shape_row_filter(factory: TargetFactory, db: str) -> None:
    """A row moving into the filter arrives, one moving out leaves, one
    staying out never lands."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(tables={f"{db}.o": TableRule(filter="tenant = 42 AND amount > 0")}))
    s = _t(db, "o", "id:int;tenant:int;amount:int")
    src = Source()
    land(target, shaper, stage,
         src.txn((I, s, None, (1, 42, 5)), (I, s, None, (2, 7, 5)), (I, s, None, (3, 42, 5)), (I, s, None, (4, 42, 0))),
         src.txn((U, s, (1, 42, 5), (1, 7, 5)),       # in -> out: deleted on the target
                 (U, s, (2, 7, 5), (2, 42, 6)),       # out -> in: inserted
                 (U, s, (3, 42, 5), (3, 42, 8)),      # in -> in: updated
                 (U, s, (4, 42, 0), (4, 43, 0))))     # out -> out: nothing
    assert_rows(target, s, [(2, 42, 6), (3, 42, 8)])


def check_shape_ddl(factory: TargetFactory, db: str) -> None:
    """DDL on shaped tables: each shard's CREATE TABLE makes the merged
    table once, a column left out is never added, a masked column comes
    with its mask's type and the existing rows get the masked default."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(route=[RouteRule(f"{db}_s*.t", f"{db}.t")],
                                               tables={f"{db}_s*.t": TableRule(exclude=["secret"],
                                                                              mask={"mail": "hash:16"})}))
    src = Source()
    land(target, shaper, stage, src.ddl("", f"CREATE DATABASE IF NOT EXISTS `{db}`"),
         *(src.ddl(f"{db}_s{i}", "CREATE TABLE t (id INT PRIMARY KEY, v INT, secret TEXT)") for i in (1, 2)))
    s1 = _t(f"{db}_s1", "t", "id:int;v:int;secret:text")
    land(target, shaper, stage, src.txn((I, s1, None, (1, 10, "x"))),
         src.ddl(f"{db}_s1", "ALTER TABLE t ADD COLUMN mail VARCHAR(50) NOT NULL DEFAULT 'a@b', ADD COLUMN secret2 INT, "
                             "DROP COLUMN secret"))
    hashed = hmac.new(KEY.encode(), b"a@b", hashlib.sha256).hexdigest()[:16]
    merged = _t(db, "t", "source_db:varchar(64);source_table:varchar(64);id:int;v:int;mail:char(16);secret2:int",
                ("source_db", "source_table", "id"))
    assert_rows(target, merged, [(f"{db}_s1", "t", 1, 10, hashed, None)])


# --------------------------------------------------------------------------
# Applier side: modes and schema-change policies
# --------------------------------------------------------------------------
def _when(n: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(1_700_000_000 + n, UTC)


def check_mode_soft_delete(factory: TargetFactory, db: str) -> None:
    """Deleted rows stay, flagged, with the commit time of their last change;
    a key inserted again is live again."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(targets={f"{db}.sd": TargetRule(mode="soft_delete")}))
    s = _t(db, "sd", "id:int;v:varchar(10)")
    src = Source()
    land(target, shaper, stage, src.txn((I, s, None, (1, "a")), (I, s, None, (2, "b")), (I, s, None, (3, "c"))),
         src.txn((D, s, (1, "a"), None), (U, s, (2, "b"), (20, "b"))),
         src.txn((I, s, None, (1, "again"))))
    flagged = _t(db, "sd", "id:int;v:varchar(10);_cdc_deleted:tinyint;_cdc_commit_time:timestamp(6)")
    assert_rows(target, flagged, [(1, "again", 0, _when(3)), (2, "b", 1, _when(2)), (20, "b", 0, _when(2)),
                                  (3, "c", 0, _when(1))])


def check_mode_history(factory: TargetFactory, db: str) -> None:
    """Every change a row of the changelog, keyed by transaction and number;
    a CREATE TABLE makes the changelog's layout."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(targets={f"{db}.h": TargetRule(mode="history")}))
    s = _t(db, "h", "id:int;v:varchar(10)")
    src = Source()
    land(target, shaper, stage, src.ddl("", f"CREATE DATABASE IF NOT EXISTS `{db}`"),
         src.ddl(db, "CREATE TABLE h (id INT PRIMARY KEY, v VARCHAR(10))"))
    t1 = src.txn((I, s, None, (1, "a")), (U, s, (1, "a"), (1, "b")), (I, s, None, (2, "c")))
    t2 = src.txn((D, s, (1, "b"), None), (U, s, (2, "c"), (3, "c")))
    land(target, shaper, stage, t1, t2)
    log = _t(db, "h", "_cdc_op:varchar(8);_cdc_commit_time:timestamp(6);_cdc_txn:varchar(255);_cdc_binlog_file:varchar(255);"
                      "_cdc_binlog_pos:bigint unsigned;_cdc_seq:int unsigned;id:int;v:varchar(10);_cdc_before_id:int;"
                      "_cdc_before_v:varchar(10)", ("_cdc_txn", "_cdc_seq"))
    f1, p1, f2, p2 = t1[0].txn.file, t1[0].txn.pos, t2[0].txn.file, t2[0].txn.pos
    tx1, tx2 = t1[0].tid, t2[0].tid
    assert_rows(target, log, [
        ("INSERT", _when(3), tx1, f1, p1, 0, 1, "a", None, None),
        ("UPDATE", _when(3), tx1, f1, p1, 1, 1, "b", 1, "a"),
        ("INSERT", _when(3), tx1, f1, p1, 2, 2, "c", None, None),
        ("DELETE", _when(4), tx2, f2, p2, 0, 1, "b", 1, "b"),
        ("UPDATE", _when(4), tx2, f2, p2, 1, 3, "c", 2, "c"),
    ])


def check_schema_changes_ignore_drops(factory: TargetFactory, db: str) -> None:
    """A dropped column stays with its values (NULL in rows written after);
    a renamed one stays beside its new name."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(schema_changes="ignore_drops"))
    src = Source()
    land(target, shaper, stage, src.ddl("", f"CREATE DATABASE IF NOT EXISTS `{db}`"),
         src.ddl(db, "CREATE TABLE k (id INT PRIMARY KEY, a INT, b VARCHAR(5))"))
    v1 = _t(db, "k", "id:int;a:int;b:varchar(5)")
    land(target, shaper, stage, src.txn((I, v1, None, (1, 10, "x")), (I, v1, None, (2, 20, "y"))),
         src.ddl(db, "ALTER TABLE k DROP COLUMN a"), src.ddl(db, "ALTER TABLE k CHANGE b c VARCHAR(5)"))
    v2 = _t(db, "k", "id:int;c:varchar(5)")
    land(target, shaper, stage, src.txn((I, v2, None, (3, "z")), (U, v2, (2, "y"), (2, "y2"))))
    kept = _t(db, "k", "id:int;a:int;b:varchar(5);c:varchar(5)")
    assert_rows(target, kept, [(1, 10, "x", None), (2, None, None, "y2"), (3, None, None, "z")])


def check_schema_changes_freeze(factory: TargetFactory, db: str) -> None:
    """Nothing changes the target's columns; rows keep only those."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(targets={f"{db}.*": TargetRule(schema_changes="freeze")}))
    src = Source()
    land(target, shaper, stage, src.ddl("", f"CREATE DATABASE IF NOT EXISTS `{db}`"),
         src.ddl(db, "CREATE TABLE z (id INT PRIMARY KEY, a INT)"))
    v1 = _t(db, "z", "id:int;a:int")
    land(target, shaper, stage, src.txn((I, v1, None, (1, 10))),
         src.ddl(db, "ALTER TABLE z ADD COLUMN extra VARCHAR(5), MODIFY COLUMN a BIGINT, RENAME COLUMN a TO a2"))
    v2 = _t(db, "z", "id:int;extra:varchar(5);a2:bigint")
    land(target, shaper, stage, src.txn((I, v2, None, (2, "e", 5)), (U, v2, (1, None, 10), (1, "f", 11))))
    assert [c.name for c in target.table_columns(db, "z") or ()] == ["id", "a"]
    assert_rows(target, v1, [(1, None), (2, None)])


def check_schema_changes_stop(factory: TargetFactory, db: str) -> None:
    """The statement is refused before anything of it runs, naming it and the fix."""
    target = factory()
    shaper, stage = _shape(target, ShapeConfig(schema_changes="stop"))
    src = Source()
    land(target, shaper, stage, src.ddl("", f"CREATE DATABASE IF NOT EXISTS `{db}`"),
         src.ddl(db, "CREATE TABLE st (id INT PRIMARY KEY)"))
    with pytest.raises(TerminalError, match="skip_ddl") as info:
        land(target, shaper, stage, src.ddl(db, "ALTER TABLE st ADD COLUMN x INT"))
    assert "ALTER TABLE st ADD COLUMN x INT" in str(info.value)
    assert [c.name for c in target.table_columns(db, "st") or ()] == ["id"]


CONTRACT: dict[str, Callable[[TargetFactory, str], None]] = {
    "shape_merge_route": check_shape_merge_route,
    "shape_masks": check_shape_masks,
    "shape_row_filter": check_shape_row_filter,
    "shape_ddl": check_shape_ddl,
    "mode_soft_delete": check_mode_soft_delete,
    "mode_history": check_mode_history,
    "schema_changes_ignore_drops": check_schema_changes_ignore_drops,
    "schema_changes_freeze": check_schema_changes_freeze,
    "schema_changes_stop": check_schema_changes_stop,
}
