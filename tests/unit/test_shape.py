"""The producer's shaping (cynomys/shape): routing rules, masks, row filters
with their in/out transitions, DDL on shaped tables, and the checks of
``[shape]`` -- pure logic, no server."""
from __future__ import annotations

import datetime
import hashlib
import hmac
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cynomys.core.config import Config, RouteRule, ShapeConfig, TableRule, load_config
from cynomys.core.errors import ConfigError
from cynomys.core.model import Change, ColumnDef, Op, Position, Row, TableSchema
from cynomys.parser import ddl
from cynomys.shape import Shaper, compile_rules
from cynomys.shape.filters import parse_filter
from cynomys.shape.masks import parse_mask, value_bytes
from cynomys.shape.tables import ShapeError

KEY = "k" * 32
AT = Position("mysql-bin.000001", 100)


def shaper(**kw: Any) -> Shaper:
    return Shaper(compile_rules(ShapeConfig(mask_key=KEY, **kw), producer=True))


def schema(db: str = "shop_1", table: str = "orders", cols: str = "id:int;cust:varchar(40);amount:decimal(10,2)",
           key: tuple[str, ...] = ("id",)) -> TableSchema:
    columns = tuple(ColumnDef(n, t, n not in key) for n, t in (c.split(":") for c in cols.split(";")))
    return TableSchema(db, table, columns, key)


def change(op: Op, s: TableSchema, before: Row | None = None, after: Row | None = None, ts: int = 0) -> Change:
    return Change(op, s.database, s.table, "0-1-5", AT, ts, s, before, after)


def ddl_change(sql: str, db: str = "shop_1", pos: int = 200) -> Change:
    return Change(Op.DDL, db, "", "0-1-6", Position("mysql-bin.000001", pos), 1_700_000_000, sql=sql)


# --------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------
def test_glob_route_merges_shards_with_source_columns_in_the_key() -> None:
    sh = shaper(route=[RouteRule("shop_*.orders", "all.orders")])
    s1, s2 = schema("shop_1"), schema("shop_2")
    a = sh.change(change(Op.INSERT, s1, after=(7, "c", Decimal("1.00"))))
    b = sh.change(change(Op.INSERT, s2, after=(7, "d", Decimal("2.00"))))
    assert a is not None and b is not None
    assert (a.database, a.table) == (b.database, b.table) == ("all", "orders")
    assert a.schema is not None and a.schema.key == ("source_db", "source_table", "id")
    assert a.schema.column_names[:2] == ("source_db", "source_table")
    assert a.after == ("shop_1", "orders", 7, "c", Decimal("1.00"))
    # The same source key in two shards is two target keys: they never fold together.
    assert a.key() != b.key()
    assert a.schema == b.schema  # shards of one shape share the target's schema


def test_route_with_every_group_used_is_one_to_one_and_adds_no_column() -> None:
    rules = compile_rules(ShapeConfig(route=[RouteRule("shop_*.orders", "shop.orders_\\1"),
                                             RouteRule(r"re:(?P<db>\w+)\.t(\d+)", "x_\\g<db>.t\\2")]))
    assert rules.target_of("shop_7", "orders") == ("shop", "orders_7")
    assert not rules.route("shop_7", "orders").merge  # type: ignore[union-attr]
    assert rules.target_of("a", "t12") == ("x_a", "t12")
    assert rules.target_of("other", "thing") == ("other", "thing")  # no rule: stays where it is
    sh = Shaper(rules)
    c = sh.change(change(Op.INSERT, schema("shop_7"), after=(1, "c", Decimal("1.00"))))
    assert c is not None and c.schema is not None and c.schema.column_names == ("id", "cust", "amount")


def test_first_matching_route_wins_and_names_are_configurable() -> None:
    rules = compile_rules(ShapeConfig(route=[
        RouteRule("shop_1.*", "one.\\1"),
        RouteRule("re:shop_\\d+\\.orders", "all.orders", database_column="shard", table_column=""),
    ]))
    assert rules.target_of("shop_1", "orders") == ("one", "orders")
    route = rules.route("shop_2", "orders")
    assert route is not None and route.merge and route.shard_columns == ("shard",)


@pytest.mark.parametrize("route,match", [
    (RouteRule("a.*", "b"), "expected 'db.table'"),
    (RouteRule("a_*.t", "b.t_\\2"), "names no capture group"),
    (RouteRule("re:a(.", "b.t"), "not a regular expression"),
    (RouteRule("a_*.t", "b.t", database_column="", table_column=""), "cannot both be empty"),
    (RouteRule("a_*.t", "b.t", database_column="s", table_column="S"), "both 's'"),
])
def test_bad_routes_are_refused_naming_the_rule(route: RouteRule, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        compile_rules(ShapeConfig(route=[route]))
    assert "[[shape.route]] 1" in str(info.value)


def test_merging_a_keyless_table_is_refused() -> None:
    sh = shaper(route=[RouteRule("shop_*.log", "all.log")])
    with pytest.raises(ShapeError, match="no primary key"):
        sh.change(change(Op.INSERT, schema("shop_1", "log", "a:int;b:int", ()), after=(1, 2)))


# --------------------------------------------------------------------------
# Columns and masks
# --------------------------------------------------------------------------
def test_columns_kept_renamed_and_masked() -> None:
    sh = shaper(tables={"shop_*.customers": TableRule(exclude=["notes"], rename={"mail": "email_hash"},
                                                       mask={"mail": "hash", "name": "const:***",
                                                             "phone": "null", "city": "truncate:3"})})
    s = schema("shop_1", "customers", "id:int;mail:varchar(100);name:varchar(40);phone:varchar(20);"
                                      "city:varchar(40);notes:text")
    c = sh.change(change(Op.INSERT, s, after=(1, "a@b.c", "Ann", "555", "Berlin", "secret")))
    assert c is not None and c.schema is not None and c.after is not None
    assert c.schema.column_names == ("id", "email_hash", "name", "phone", "city")
    types = {col.name: col.type for col in c.schema.columns}
    assert types == {"id": "int", "email_hash": "char(64)", "name": "varchar(3)", "phone": "varchar(20)",
                     "city": "varchar(40)"}
    want = hmac.new(KEY.encode(), b"a@b.c", hashlib.sha256).hexdigest()
    assert c.after == (1, want, "***", None, "Ber")
    assert "a@b.c" not in repr(c) and "secret" not in repr(c)


def test_a_keyless_tables_indexes_follow_its_shape() -> None:
    # Routed, a column renamed, one left out: each index keeps its leading
    # columns the shape keeps, by their target names (the target finds a
    # changed row through them, session 27); one led by a left-out column goes.
    sh = shaper(route=[RouteRule("shop_1.log", "dw.events")],
                tables={"shop_1.log": TableRule(exclude=["note"], rename={"who": "actor"}, mask={"ip": "hash"})})
    s = TableSchema("shop_1", "log", (ColumnDef("who", "int"), ColumnDef("ip", "varchar(40)"),
                                      ColumnDef("note", "text"), ColumnDef("n", "int")), (),
                    (("who", "n"), ("note",), ("ip",), ("who", "note", "n")))
    c = sh.change(change(Op.READ, s, after=(1, "10.0.0.1", "x", 2)))
    assert c is not None and c.schema is not None
    assert (c.schema.database, c.schema.table, c.schema.key) == ("dw", "events", ())
    assert c.schema.indexes == (("actor", "n"), ("ip",), ("actor",))


def test_hash_masks_are_deterministic_and_keyed() -> None:
    m = parse_mask("hash:16").masker(b"key-one-0123456789")
    assert m("x") == m("x") != m("y") and len(str(m("x"))) == 16 and m(None) is None
    assert m("x") != parse_mask("hash:16").masker(b"key-two-0123456789")("x")
    i = parse_mask("hash_int").masker(b"key-one-0123456789")
    assert isinstance(i(42), int) and 0 <= i(42) < 2**63 and i(42) == i(42)  # type: ignore[operator]
    assert value_bytes(42) == b"42" and value_bytes(datetime.date(2024, 1, 2)) == b"2024-01-02"
    aware = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert value_bytes(aware) == value_bytes(aware.replace(tzinfo=None))


def test_masked_key_keeps_updates_and_deletes_on_their_row() -> None:
    sh = shaper(tables={"crm.people": TableRule(mask={"email": "hash"})})
    s = schema("crm", "people", "email:varchar(100);name:varchar(40)", ("email",))
    ins = sh.change(change(Op.INSERT, s, after=("p@x.org", "a")))
    upd = sh.change(change(Op.UPDATE, s, before=("p@x.org", "a"), after=("p@x.org", "b")))
    dele = sh.change(change(Op.DELETE, s, before=("p@x.org", "b")))
    assert ins is not None and upd is not None and dele is not None
    assert ins.key() == upd.key() == upd.key(upd.before) == dele.key()
    assert "p@x.org" not in repr((ins, upd, dele))


@pytest.mark.parametrize("spec,match", [("hash:4", "8 to 64"), ("sha1", "unknown mask"), ("truncate", "needs a length"),
                                        ("null:3", "takes no argument"), ("const", "needs its text")])
def test_bad_masks_are_refused(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        compile_rules(ShapeConfig(tables={"a.b": TableRule(mask={"c": spec})}))
    assert '[shape.tables."a.b"] mask c' in str(info.value)


def test_key_columns_cannot_be_left_out_or_masked_to_equal_values() -> None:
    with pytest.raises(ShapeError, match="primary-key column id is left out"):
        shaper(tables={"a.b": TableRule(exclude=["id"])}).change(
            change(Op.INSERT, schema("a", "b"), after=(1, "c", Decimal(1))))
    with pytest.raises(ShapeError, match="masked with null"):
        shaper(tables={"a.b": TableRule(mask={"id": "null"})}).change(
            change(Op.INSERT, schema("a", "b"), after=(1, "c", Decimal(1))))


def test_hash_masks_need_the_key_on_the_producer_only() -> None:
    cfg = ShapeConfig(tables={"a.b": TableRule(mask={"c": "hash"})})
    compile_rules(cfg)  # the applier: no key needed
    with pytest.raises(ConfigError, match="mask_key"):
        compile_rules(cfg, producer=True)


# --------------------------------------------------------------------------
# Row filters
# --------------------------------------------------------------------------
FILTERED = {"t.o": TableRule(filter="tenant = 42")}


def _f(before: Row | None, after: Row | None, op: Op) -> Change | None:
    s = schema("t", "o", "id:int;tenant:int")
    return shaper(tables=FILTERED).change(change(op, s, before, after))


@pytest.mark.parametrize("before,after,op", [
    ((1, 42), (1, 42), Op.UPDATE),     # in -> in: an update
    ((1, 42), (1, 7), Op.DELETE),      # in -> out: the row leaves
    ((1, 7), (1, 42), Op.INSERT),      # out -> in: the row arrives
    ((1, 7), (1, 8), None),            # out -> out: nothing
])
def test_filter_transitions_of_an_update(before: Row, after: Row, op: Op | None) -> None:
    got = _f(before, after, Op.UPDATE)
    if op is None:
        assert got is None
        return
    assert got is not None and got.op is op
    assert got.before == (before if op is not Op.INSERT else None)
    assert got.after == (after if op is not Op.DELETE else None)


def test_filter_on_inserts_deletes_and_snapshot_reads() -> None:
    assert _f(None, (1, 42), Op.INSERT) is not None and _f(None, (1, 7), Op.INSERT) is None
    assert _f((1, 42), None, Op.DELETE) is not None and _f((1, 7), None, Op.DELETE) is None
    assert _f(None, (1, 42), Op.READ) is not None and _f(None, (1, None), Op.READ) is None  # NULL: unknown, out


def test_filter_logic_is_sql_three_valued() -> None:
    f = parse_filter("a IN (1, NULL) OR NOT (b BETWEEN 2 AND 4) AND s LIKE 'x\\_%' AND d >= '2024-01-01'")
    keep = f.bind(["a", "b", "s", "d"])
    assert keep((1, None, None, None))                                   # a IN (1, ..): true
    assert not keep((2, 3, "x_y", datetime.date(2024, 5, 1)))            # a IN (1, NULL): unknown; NOT true: false
    assert keep((2, 9, "x_y", datetime.date(2024, 5, 1)))
    assert not keep((2, 9, "xy", datetime.date(2024, 5, 1)))             # the escaped _ is a plain _
    assert not keep((2, 9, "x_y", datetime.date(2023, 5, 1)))
    assert parse_filter("amount * 2 > 10.5").bind(["amount"])((Decimal("5.26"),))
    assert not parse_filter("x / 0 > 1").bind(["x"])((5,))               # NULL: out


def test_filter_errors_name_the_key_and_the_column() -> None:
    with pytest.raises(ConfigError, match=r'\[shape.tables."a.b"\] filter: .*not supported'):
        compile_rules(ShapeConfig(tables={"a.b": TableRule(filter="lower(c) = 'x'")}))
    with pytest.raises(ShapeError, match="names column.*tenant"):
        shaper(tables={"a.b": TableRule(filter="tenant = 1")}).change(
            change(Op.INSERT, schema("a", "b"), after=(1, "c", Decimal(1))))


# --------------------------------------------------------------------------
# Verify records and checksummed rows
# --------------------------------------------------------------------------
def test_verify_rows_and_records_are_shaped_like_changes() -> None:
    sh = shaper(tables={"t.o": TableRule(filter="tenant = 42", rename={"tenant": "t_id"})})
    s = schema("t", "o", "id:int;tenant:int")
    target, rows = sh.rows(s, [(1, 42), (2, 7), (3, 42)])
    assert target.column_names == ("id", "t_id") and rows == [(1, 42), (3, 42)]
    rec = sh.change(Change(Op.CHECKSUM, "t", "o", "verify:x", AT, 0, s, sql='{"range": {}}'))
    assert rec is not None and rec.schema == target and rec.sql == '{"range": {}}'
    rules = compile_rules(ShapeConfig(route=[RouteRule("s_*.o", "all.o")], tables={"m.k": TableRule(mask={"id": "hash"})}))
    assert "merged" in rules.verify_refusal("s_1", "o") and rules.verify_refusal("t", "o") == ""


# --------------------------------------------------------------------------
# DDL on shaped tables
# --------------------------------------------------------------------------
def _ops(c: Change | None) -> list[ddl.DdlOp]:
    assert c is not None and c.sql is not None
    return ddl.parse_ddl(c.sql, c.database)


def test_create_table_of_a_shard_creates_the_merged_table_once() -> None:
    sh = shaper(route=[RouteRule("shop_*.orders", "all.orders")], tables={"shop_*.orders": TableRule(exclude=["note"])})
    (op,) = _ops(sh.change(ddl_change("CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(10,2), note TEXT)")))
    assert op == ddl.CreateTable("all", "orders", (
        ColumnDef("source_db", "varchar(64)", False), ColumnDef("source_table", "varchar(64)", False),
        ColumnDef("id", "int", False), ColumnDef("amount", "decimal(10,2)")), ("source_db", "source_table", "id"),
        if_not_exists=True)


def test_alter_of_shaped_columns() -> None:
    sh = shaper(tables={"shop_1.c": TableRule(exclude=["notes"], rename={"mail": "m"}, mask={"mail": "hash:16"})})
    assert sh.change(ddl_change("ALTER TABLE c ADD COLUMN notes TEXT")) is None       # left out: not shipped
    ops = _ops(sh.change(ddl_change("ALTER TABLE c ADD COLUMN mail VARCHAR(50) NOT NULL DEFAULT 'x@y', "
                                    "ADD COLUMN z INT, DROP COLUMN notes")))
    hashed = hmac.new(KEY.encode(), b"x@y", hashlib.sha256).hexdigest()[:16]
    assert ops == [ddl.AddColumn("shop_1", "c", ColumnDef("m", "char(16)", False), fill=hashed),
                   ddl.AddColumn("shop_1", "c", ColumnDef("z", "int"))]
    same = ddl_change("ALTER TABLE c ADD COLUMN z2 INT")
    assert sh.change(same) is same  # nothing shaped in it: the source's own text goes


def test_index_ddl_of_a_shaped_keyless_table() -> None:
    sh = shaper(route=[RouteRule("shop_1.log", "dw.events")],
                tables={"shop_1.log": TableRule(exclude=["note"], rename={"who": "actor"})})
    (op,) = _ops(sh.change(ddl_change("CREATE TABLE log (who INT, note TEXT, n INT, KEY (who, n), KEY (note))")))
    assert op == ddl.CreateTable("dw", "events", (ColumnDef("actor", "int"), ColumnDef("n", "int")), (),
                                 indexes=(("actor", "n"),))
    assert _ops(sh.change(ddl_change("CREATE INDEX i ON log (who, note)"))) == [ddl.AddIndex("dw", "events", ("actor",))]
    assert _ops(sh.change(ddl_change("ALTER TABLE log ADD KEY (n)"))) == [ddl.AddIndex("dw", "events", ("n",))]
    assert sh.change(ddl_change("CREATE INDEX j ON log (note)")) is None  # led by a left-out column: nothing to make


def test_ddl_that_would_lose_a_shards_rows_stops_unless_skipped() -> None:
    route = [RouteRule("shop_*.orders", "all.orders")]
    for sql in ("DROP TABLE orders", "TRUNCATE orders", "RENAME TABLE orders TO o2", "ALTER TABLE orders DROP PRIMARY KEY"):
        with pytest.raises(ShapeError, match="skip_ddl") as info:
            shaper(route=route).change(ddl_change(sql, pos=300))
        assert "mysql-bin.000001:300" in str(info.value)
    assert shaper(route=route, skip_ddl=["mysql-bin.000001:300"]).change(ddl_change("DROP TABLE orders", pos=300)) is None
    one_to_one = shaper(route=[RouteRule("shop_*.orders", "shop.orders_\\1")])
    assert _ops(one_to_one.change(ddl_change("DROP TABLE orders"))) == [ddl.DropTable((("shop", "orders_1"),))]


def test_rename_of_a_column_a_rule_names_stops() -> None:
    sh = shaper(tables={"shop_1.c": TableRule(mask={"mail": "hash"})})
    with pytest.raises(ShapeError, match="names source columns"):
        sh.change(ddl_change("ALTER TABLE c RENAME COLUMN mail TO email"))
    assert _ops(sh.change(ddl_change("ALTER TABLE c RENAME COLUMN a TO b"))) == [ddl.RenameColumn("shop_1", "c", "a", "b")]


def test_unparsable_or_unshaped_ddl_passes_unchanged() -> None:
    sh = shaper(route=[RouteRule("shop_*.orders", "all.orders")])
    for sql in ("ALTER TABLE orders DROP PARTITION p0", "CREATE TABLE other (id INT)", "CREATE DATABASE shop_9"):
        c = ddl_change(sql)
        assert sh.change(c) is c


# --------------------------------------------------------------------------
# [shape] in the file
# --------------------------------------------------------------------------
def test_shape_sections_load_and_reject_unknown_keys(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[shape]\nschema_changes = "freeze"\n[[shape.route]]\nsource = "s_*.o"\ntarget = "a.o"\n'
                 '[shape.tables."s_*.c"]\nmask = { mail = "hash" }\nfilter = "t = 1"\n'
                 '[shape.targets."a.o"]\nmode = "history"\n')
    cfg = load_config(p, env={"CYNOMYS_SHAPE_MASK_KEY": KEY})
    assert cfg.shape.route[0].target == "a.o" and cfg.shape.tables["s_*.c"].mask == {"mail": "hash"}
    assert KEY not in repr(cfg)
    rules = compile_rules(cfg, producer=True)
    assert rules.target("a", "o").mode == "history" and rules.target("a", "x").schema_changes == "freeze"
    p.write_text('[shape.targets."a.o"]\nmode = "append"\n')
    with pytest.raises(ConfigError, match=r'\[shape.targets."a.o"\] mode'):
        load_config(p, env={})
    p.write_text('[[shape.route]]\nsource = "x.*"\ntarget = "y.\\\\1"\nmerge = true\n')
    with pytest.raises(ConfigError, match=r"unknown key \[shape.route.1\] merge"):
        load_config(p, env={})
    assert not Config().shape.active
