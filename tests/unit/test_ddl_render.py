"""Neutral DDL operations written back as SQL (parser/ddl_render.py): every
statement kind, every fill value and odd name comes back from ``parse_ddl``
as the same operations (the applier parses what the shaping stage wrote)."""
from __future__ import annotations

from decimal import Decimal

import pytest

from cynomys.core.model import ColumnDef
from cynomys.core.sourcetypes import BINARY_OF_SOURCE_TYPE
from cynomys.parser import ddl
from cynomys.parser.ddl_render import literal, render

STATEMENTS = [
    "CREATE DATABASE IF NOT EXISTS shop",
    "CREATE DATABASE shop",
    "DROP DATABASE IF EXISTS shop",
    "CREATE TABLE t (id BIGINT UNSIGNED NOT NULL, a VARCHAR(10), b DECIMAL(65,30), c ENUM('x','it''s'), "
    "d SET('p','q'), e DATETIME(6), f TIMESTAMP(3) NULL, g BIT(9), h YEAR, i JSON, j VARBINARY(40), "
    "k BINARY(16), l DOUBLE, m FLOAT, n TINYINT, o MEDIUMTEXT, p GEOMETRY, q TIME(2), r DATE, "
    "PRIMARY KEY (id, a))",
    "CREATE TABLE IF NOT EXISTS `odd{0}`.`t'x` (`c``d` INT)",
    "CREATE TABLE a LIKE b",
    "DROP TABLE IF EXISTS t, u",
    "RENAME TABLE a TO b, c TO d",
    "TRUNCATE TABLE t",
    "ALTER TABLE t ADD COLUMN x INT",
    "ALTER TABLE t ADD COLUMN IF NOT EXISTS x INT NOT NULL",
    "ALTER TABLE t ADD COLUMN x VARCHAR(5) NOT NULL DEFAULT 'it''s \\\\ \"q\"'",
    "ALTER TABLE t ADD COLUMN x DECIMAL(6,2) DEFAULT -1.50",
    "ALTER TABLE t ADD COLUMN x BIGINT NOT NULL DEFAULT -9223372036854775808",
    "ALTER TABLE t ADD COLUMN x ENUM('a','b') NOT NULL",
    "ALTER TABLE t ADD COLUMN x ENUM('a','b') NOT NULL DEFAULT 'b'",
    "ALTER TABLE t ADD COLUMN x DATE NOT NULL",
    "ALTER TABLE t ADD COLUMN x DATETIME NOT NULL DEFAULT '2020-01-02 03:04:05'",
    "ALTER TABLE t ADD COLUMN x TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP",
    "ALTER TABLE t ADD COLUMN x TIME NOT NULL",
    "ALTER TABLE t ADD COLUMN x BINARY(4) NOT NULL DEFAULT 'ab'",
    "ALTER TABLE t ADD COLUMN x VARBINARY(4) NOT NULL DEFAULT X'00ff'",
    "ALTER TABLE t ADD COLUMN x BLOB NOT NULL",
    "ALTER TABLE t ADD COLUMN x UUID NOT NULL DEFAULT '123e4567-e89b-12d3-a456-426614174000'",
    "ALTER TABLE t ADD COLUMN x DOUBLE NOT NULL",
    "ALTER TABLE t ADD COLUMN x BIT(3) NOT NULL DEFAULT 5",
    "ALTER TABLE t DROP COLUMN IF EXISTS x",
    "ALTER TABLE t MODIFY COLUMN x BIGINT NOT NULL",
    "ALTER TABLE t CHANGE a b VARCHAR(20)",
    "ALTER TABLE t RENAME COLUMN a TO `b c`",
    "ALTER TABLE t ADD PRIMARY KEY (a, b)",
    "ALTER TABLE t DROP PRIMARY KEY",
    "ALTER TABLE t ADD COLUMN a INT, DROP COLUMN b, ADD INDEX ix (a)",
    "CREATE TABLE bag (a INT, b VARCHAR(9), UNIQUE KEY (b), KEY (a, b), KEY p (b(3)))",
    "CREATE UNIQUE INDEX u ON t (a, `b c`)",
]


def _real(ops: list[ddl.DdlOp]) -> list[ddl.DdlOp]:
    return [op for op in ops if not isinstance(op, ddl.NoOp)]


@pytest.mark.parametrize("sql", STATEMENTS)
def test_round_trip(sql: str) -> None:
    ops = _real(ddl.parse_ddl(sql, "db"))
    text = render(ops)
    assert ddl.parse_ddl(text, "elsewhere") == ops, text


def test_fill_values_of_every_kind_come_back_typed() -> None:
    uuid_type = BINARY_OF_SOURCE_TYPE["uuid"]
    cases = [
        (ColumnDef("x", "varchar(10)", False), "a'b\\c\n"),
        (ColumnDef("x", "char(64)", False), "0" * 64),
        (ColumnDef("x", "bigint", False), -5),
        (ColumnDef("x", "decimal(10,3)", True), Decimal("-0.125")),
        (ColumnDef("x", uuid_type, False), bytes(range(240, 256))),  # not UTF-8
        (ColumnDef("x", "varbinary(3)", False), b""),
        (ColumnDef("x", "int", True), None),
        (ColumnDef("x", "date", False), "2024-02-29"),
    ]
    for col, fill in cases:
        op = ddl.AddColumn("d", "t", col, fill=fill)
        (back,) = ddl.parse_ddl(render([op]), "d")
        assert back == op and type(back.fill) is type(op.fill), (col, fill, back)  # type: ignore[attr-defined]


def test_no_op_and_renames_among_others_are_refused() -> None:
    with pytest.raises(ValueError):
        render([ddl.NoOp("x")])
    with pytest.raises(ValueError):
        render([ddl.RenameTable(((("a", "b"), ("a", "c")),)), ddl.Truncate("a", "c")])
    with pytest.raises(ValueError):
        render([])
    assert literal(True) == "1" and literal(None) == "NULL"
