"""producer/ddl_scope.py: which unreadable DDL the producer drops (pure logic)."""
from __future__ import annotations

import pytest

from cynomys.core.model import Change, Op, Position
from cynomys.parser.stream import TableFilter
from cynomys.producer.ddl_scope import one_table, unreadable_elsewhere


@pytest.mark.parametrize("sql,table", [
    ("CREATE TABLE skipme.v (id INT) WITH SYSTEM VERSIONING", ("skipme", "v")),
    ("ALTER TABLE v ADD PERIOD FOR SYSTEM_TIME(s, e)", ("db", "v")),
    ("alter online ignore table `a`.`b``c` add x vector(3)", ("a", "b`c")),
    ("/* c */ CREATE OR REPLACE TABLE IF NOT EXISTS t (a int)", ("db", "t")),
    ("CREATE UNIQUE INDEX IF NOT EXISTS i ON d.t (v)", ("d", "t")),
    ("SET STATEMENT x=1 FOR ALTER TABLE q.r ADD y INT", ("q", "r")),
    ("/*!50100 ALTER TABLE q.r ADD y INT */", ("q", "r")),
    ("DROP TABLE a, b", None),  # several tables: not decided here
    ("RENAME TABLE a TO b", None),
    ("TRUNCATE t", None),
])
def test_one_table(sql: str, table: tuple[str, str] | None) -> None:
    assert one_table(sql, "db") == table


def _ddl(sql: str, db: str = "app") -> Change:
    return Change(Op.DDL, db, "", "0-1-5", Position("mysql-bin.000001", 4), 0, sql=sql)


def test_only_unreadable_ddl_on_a_table_not_replicated_is_dropped() -> None:
    replicated = TableFilter(["app.*"], ["app.secret"])
    versioned = "CREATE TABLE {} (id INT PRIMARY KEY) WITH SYSTEM VERSIONING"
    assert unreadable_elsewhere(_ddl(versioned.format("other.v")), replicated)
    assert unreadable_elsewhere(_ddl(versioned.format("secret")), replicated)  # excluded
    # On a replicated table it goes, and stops the applier naming it.
    assert not unreadable_elsewhere(_ddl(versioned.format("app.v")), replicated)
    assert not unreadable_elsewhere(_ddl(versioned.format("v")), replicated)
    # A statement the parser reads goes wherever it points (a shadow table's
    # DDL: the target follows it, for a rename into the replicated tables).
    assert not unreadable_elsewhere(_ddl("CREATE TABLE other.x (id INT PRIMARY KEY)"), replicated)
    # Unreadable, but its table not told by its head: it goes.
    assert not unreadable_elsewhere(_ddl("DROP TABLE other.a, app.b WITH SYSTEM VERSIONING"), replicated)
