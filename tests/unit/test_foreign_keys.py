"""Cascading foreign keys of replicated tables (producer/foreign_keys.py):
the rows their actions change never reach the binlog, so they are refused
unless allowed."""
from __future__ import annotations

import pytest

from cynomys.core.errors import SourceConfigError
from cynomys.core.model import Change, Op, Position
from cynomys.parser.stream import TableFilter
from cynomys.producer.foreign_keys import ALLOW, REFUSE, CascadingKey, check_ddl, check_keys

SHOP = TableFilter(["shop.*"], [])
LINES = CascadingKey.from_row(("shop", "lines", "fk_order", "shop", "orders", "CASCADE", "RESTRICT"))
AUDIT = CascadingKey.from_row(("audit", "log", "fk_user", "shop", "users", "SET NULL", "CASCADE"))


def _ddl(sql: str, database: str = "shop") -> Change:
    return Change(Op.DDL, database, "", "0-1-7", Position("b.000001", 4), 0, sql=sql)


def test_a_replicated_child_with_a_cascade_is_refused_naming_the_key_and_the_fixes() -> None:
    with pytest.raises(SourceConfigError) as e:
        check_keys([AUDIT, LINES], SHOP, REFUSE)
    msg = str(e.value)
    assert msg.startswith("shop.lines foreign key fk_order REFERENCES shop.orders ON DELETE CASCADE: the source "
                          "does not write the rows a cascade deletes or updates to its binlog")
    assert "cascading_foreign_keys = \"allow\"" in msg and "cynomys verify --repair" in msg
    assert AUDIT.describe() == "audit.log foreign key fk_user REFERENCES shop.users ON DELETE SET NULL ON UPDATE CASCADE"


def test_children_not_replicated_or_allowed_pass() -> None:
    check_keys([AUDIT], SHOP, REFUSE)             # audit.log is not replicated: its rows do not matter here
    check_keys([LINES], SHOP, ALLOW)
    check_keys([], SHOP, REFUSE)


def test_a_ddl_that_adds_a_cascade_to_a_replicated_table_is_refused() -> None:
    add = "ALTER TABLE lines ADD CONSTRAINT fk FOREIGN KEY (oid) REFERENCES orders (id) ON DELETE CASCADE"
    with pytest.raises(SourceConfigError, match="a DDL gives shop.lines a foreign key with an ON DELETE/ON UPDATE"):
        check_ddl(_ddl(add), SHOP, REFUSE)
    with pytest.raises(SourceConfigError):
        check_ddl(_ddl("CREATE TABLE shop.x (id INT PRIMARY KEY, p INT, FOREIGN KEY (p) REFERENCES shop.y (id) "
                       "on update set null)", "other"), SHOP, REFUSE)
    check_ddl(_ddl(add), SHOP, ALLOW)
    check_ddl(_ddl(add, "tmp"), SHOP, REFUSE)      # tmp.lines: not replicated
    check_ddl(_ddl("ALTER TABLE lines ADD FOREIGN KEY (oid) REFERENCES orders (id) ON DELETE RESTRICT"), SHOP, REFUSE)
    check_ddl(_ddl("ALTER TABLE lines ADD COLUMN note VARCHAR(20)"), SHOP, REFUSE)
