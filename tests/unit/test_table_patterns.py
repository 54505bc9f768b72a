"""[source] include_tables/exclude_tables against the source's tables
(producer/table_patterns.py): a pattern that matches only in another case is
refused naming the spelling; one that matches nothing is warned about."""
from __future__ import annotations

import pytest

from cynomys.core.errors import SourceConfigError
from cynomys.producer.table_patterns import check_patterns

TABLES = [("shop", "orders"), ("shop", "order_lines"), ("hr", "salaries"), ("Legacy", "Users")]


def test_patterns_that_match_as_written_pass_silently() -> None:
    assert check_patterns(["shop.*", "hr.salaries", "Legacy.Users"], ["shop.order_?ines"], TABLES) == []
    assert check_patterns([], [], TABLES) == []  # the default: everything
    assert check_patterns(["*.*"], [], []) == []


def test_an_include_pattern_in_another_case_is_refused_naming_the_table() -> None:
    with pytest.raises(SourceConfigError) as e:
        check_patterns(["shop.Orders"], [], TABLES)
    msg = str(e.value)
    assert "include_tables pattern 'shop.Orders' matches no table" in msg and "shop.orders does" in msg
    assert "never be replicated" in msg and "fix: write 'shop.orders' in [source] include_tables" in msg


def test_an_exclude_pattern_in_another_case_is_refused_it_would_replicate_the_table() -> None:
    with pytest.raises(SourceConfigError) as e:
        check_patterns(["*.*"], ["HR.Salaries"], TABLES)
    assert "exclude_tables pattern 'HR.Salaries'" in str(e.value) and "would be replicated" in str(e.value)
    # A wildcard pattern: every table it would match in another case is named.
    with pytest.raises(SourceConfigError) as e:
        check_patterns(["SHOP.ORDER*"], [], TABLES)
    assert "shop.orders, shop.order_lines do in another case" in str(e.value)
    assert "spell the pattern as the server stores the names" in str(e.value)
    with pytest.raises(SourceConfigError):
        check_patterns(["legacy.users"], [], TABLES)  # a server that keeps case (lower_case_table_names = 0)


def test_an_include_pattern_matching_nothing_at_all_is_only_warned_about() -> None:
    warnings = check_patterns(["shop.invoices", "shop.orders"], ["tmp.*"], TABLES)
    assert warnings == ["[source] include_tables pattern 'shop.invoices' matches no table on the source (yet): "
                        "nothing is replicated for it until such a table is created"]


def test_a_shape_table_pattern_in_another_case_is_refused_its_masks_would_not_apply() -> None:
    with pytest.raises(SourceConfigError) as e:
        check_patterns(["*.*"], [], TABLES, shaped=["hr.Salaries"])
    msg = str(e.value)
    assert '[shape.tables."hr.Salaries"] matches no table on the source, but hr.salaries does' in msg
    assert "masks, filters and column lists would not apply" in msg
    assert 'fix: write [shape.tables."hr.salaries"]' in msg
    assert check_patterns(["*.*"], [], TABLES, shaped=["hr.salaries", "new.*"]) == []  # not there yet: no warning


def test_a_route_source_in_another_case_is_refused_and_a_regular_expression_is_left_alone() -> None:
    with pytest.raises(SourceConfigError) as e:
        check_patterns(["*.*"], [], TABLES, routes=["Shop.orders"])
    assert "[[shape.route]] source 'Shop.orders'" in str(e.value) and "land under their own names" in str(e.value)
    assert "fix: write source = 'shop.orders' in the route" in str(e.value)
    assert check_patterns(["*.*"], [], TABLES, routes=[r"re:Shop\.orders", "shop.*"]) == []


def test_a_replicated_database_the_source_does_not_binlog_is_refused() -> None:
    from cynomys.producer.table_patterns import check_binlog_filters

    check_binlog_filters([("shop", "orders"), ("hr", "salaries")], [], [], "db:3306")  # no filters
    check_binlog_filters([("shop", "orders")], ["shop", "crm"], ["tmp"], "db:3306")
    with pytest.raises(SourceConfigError) as e:
        check_binlog_filters([("shop", "orders"), ("hr", "salaries")], ["shop"], [], "db:3306")
    msg = str(e.value)
    assert "source db:3306 does not write database hr to its binlog (binlog_do_db = shop)" in msg
    assert "fix: remove binlog_do_db from the source's config file" in msg
    with pytest.raises(SourceConfigError) as e:
        check_binlog_filters([("shop", "orders"), ("hr", "salaries"), ("hr2", "x")], [], ["hr", "hr2"], "db:3306")
    assert "does not write databases hr, hr2 to its binlog (binlog_ignore_db = hr,hr2)" in str(e.value)


def test_a_table_created_later_that_a_pattern_names_in_another_case_is_refused_then() -> None:
    from cynomys.core.model import Change, Op, Position
    from cynomys.producer.table_patterns import PatternWatch, _groups

    def create(sql: str, db: str = "shop") -> Change:
        return Change(Op.DDL, db, "", "0-1-3", Position("b.000001", 4), 0, sql=sql)

    watch = PatternWatch(_groups(["shop.Orders", "shop.Line*"], ["hr.Secret"], [], []))
    watch.on_ddl(create("ALTER TABLE orders ADD COLUMN x INT"))      # not a CREATE: nothing to judge
    watch.on_ddl(create("CREATE TABLE shop.LineItems (id INT PRIMARY KEY)"))
    assert [g[1] for g in watch.groups] == ["shop.Orders", "hr.Secret"]  # matched as written: not watched
    watch.on_ddl(create("CREATE TABLE shop.lines (id INT)"))           # Line* matched already: no stop
    with pytest.raises(SourceConfigError, match="include_tables pattern 'shop.Orders' matches no table on the "
                                                "source, but shop.orders does in another case"):
        watch.on_ddl(create("CREATE TABLE IF NOT EXISTS `orders` (id INT PRIMARY KEY)"))
    with pytest.raises(SourceConfigError, match="exclude_tables pattern 'hr.Secret'"):
        watch.on_ddl(create("create table hr.secret (id int)", "other"))
