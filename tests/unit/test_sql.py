"""Minimal SQL rendering of net changes."""
from __future__ import annotations

import datetime as dt
import decimal

from cynomys.core.dialect import MONETDB
from cynomys.core.model import Change, ColumnDef, Op, Position, RawTemporal, TableSchema
from cynomys.reducer.sql import render

S = TableSchema("shop", "order", (ColumnDef("id", "int"), ColumnDef("note", "text"), ColumnDef("at", "datetime")), ("id",))
S2 = TableSchema("shop", "pair", (ColumnDef("a", "int"), ColumnDef("b", "int"), ColumnDef("v", "text")), ("a", "b"))
N = TableSchema("shop", "log", (ColumnDef("msg", "text"), ColumnDef("n", "int")), ())
P = Position("b.000001", 4)


def c(op: Op, before, after, schema=S) -> Change:
    return Change(op, schema.database, schema.table, "t", P, 0, schema, before, after)


def test_inserts_become_one_multirow_insert() -> None:
    out = render([c(Op.INSERT, None, (1, "it's", dt.datetime(2020, 1, 2, 3, 4, 5))),
                  c(Op.INSERT, None, (2, "a\\b", RawTemporal("0000-00-00 00:00:00")))])
    assert out == ["INSERT INTO `shop`.`order` (`id`, `note`, `at`) VALUES\n"
                   "  (1, 'it''s', '2020-01-02 03:04:05'),\n  (2, 'a\\\\b', '0000-00-00 00:00:00')"]


def test_deletes_become_in_lists() -> None:
    assert render([c(Op.DELETE, (1, "x", None), None), c(Op.DELETE, (2, "y", None), None)]) == \
        ["DELETE FROM `shop`.`order` WHERE `id` IN (1, 2)"]
    assert render([c(Op.DELETE, (1, 2, "x"), None, S2)]) == ["DELETE FROM `shop`.`pair` WHERE `a` = 1 AND `b` = 2"]


def test_update_sets_only_changed_columns() -> None:
    out = render([c(Op.UPDATE, (1, "a", None), (1, "b", None))])
    assert out == ["UPDATE `shop`.`order` SET `note` = 'b' WHERE `id` = 1"]


def test_keyless_rows_match_all_columns_null_safe() -> None:
    out = render([c(Op.DELETE, ("m", None), None, N)])
    assert out == ["DELETE FROM `shop`.`log` WHERE `msg` <=> 'm' AND `n` <=> NULL LIMIT 1"]


def test_ddl_keeps_its_text_and_other_dialect_quotes() -> None:
    ddl = Change(Op.DDL, "shop", "", "t", P, 0, sql="ALTER TABLE x ADD y int")
    assert render([ddl]) == ["ALTER TABLE x ADD y int"]
    assert render([c(Op.INSERT, None, (1, b"\x00\xff", decimal.Decimal("1.50")))], MONETDB)[0].startswith(
        'INSERT INTO "shop"."order"')


def test_read_is_an_upsert() -> None:
    assert render([c(Op.READ, None, (1, "r", None))])[0].startswith("REPLACE INTO `shop`.`order`")
    out = render([c(Op.READ, None, (1, "r", None))], MONETDB)
    assert out[0] == 'DELETE FROM "shop"."order" WHERE "id" IN (1)' and out[1].startswith("INSERT INTO")


def test_statement_batches_bound_rows_and_bytes() -> None:
    from cynomys.applier.targets.sql_client import statement_batches

    texts = ["(1)"] * 5 + ["(" + "x" * 50 + ")"] + ["(2)"] * 3
    assert statement_batches(texts, max_rows=2, max_bytes=1000) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 9)]
    assert statement_batches(texts, max_rows=100, max_bytes=20) == [(0, 5), (5, 6), (6, 9)]
    assert statement_batches([], 10, 10) == []


def test_small_and_large_decimals_render_without_exponent() -> None:
    """str(Decimal) writes 1.23456789012345678901234E-7, which a server
    reads as an inexact DOUBLE: a DECIMAL(65,30) key would not match."""
    import decimal

    from cynomys.core.dialect import MARIADB, MONETDB, SPARK

    for d in (MARIADB, MONETDB, SPARK):
        assert d.literal(decimal.Decimal("0.000000123456789012345678901234")) == "0.000000123456789012345678901234"
        assert d.literal(decimal.Decimal("1E+40")) == "1" + "0" * 40
        assert d.literal(decimal.Decimal("-0.000")) == "-0.000"


def test_several_keys_of_a_composite_key_are_a_row_value_in() -> None:
    out = render([c(Op.DELETE, (1, 2, "x"), None, S2), c(Op.DELETE, (3, 4, "y"), None, S2)])
    assert out == ["DELETE FROM `shop`.`pair` WHERE (`a`, `b`) IN ((1, 2), (3, 4))"]
