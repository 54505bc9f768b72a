"""The dialect and source-type catalog (core/dialect.py, core/sourcetypes.py)."""
from __future__ import annotations

import datetime
import decimal

import pytest

from cynomys.core.dialect import DIALECTS, DUCKDB, MARIADB, MONETDB, SPARK
from cynomys.core.sourcetypes import (
    BINARY_OF_TEXT,
    INT_FAMILIES,
    int_family,
    lob_type,
    members,
    members_text,
    smallest_lob,
    time_text,
    type_params,
)


@pytest.mark.parametrize("family", list(INT_FAMILIES.values()), ids=list(INT_FAMILIES))
def test_integer_ranges_are_the_widths(family) -> None:
    assert family.signed == (-(2 ** (family.bits - 1)), 2 ** (family.bits - 1) - 1)
    assert family.unsigned == (0, 2 ** family.bits - 1)
    assert family.size * 8 == family.bits


def test_integer_synonyms() -> None:
    assert int_family("integer") is INT_FAMILIES["int"]
    assert int_family("varchar") is None


@pytest.mark.parametrize("dialect,name,quoted", [
    (MARIADB, "a`b", "`a``b`"), (SPARK, "a`b", "`a``b`"),
    (MONETDB, 'a"b', '"a""b"'), (DUCKDB, 'a"b', '"a""b"'),
])
def test_identifiers(dialect, name, quoted) -> None:
    assert dialect.ident(name) == quoted
    assert dialect.table(name, "t") == quoted + "." + dialect.ident("t")


@pytest.mark.parametrize("dialect,text,literal", [
    (MARIADB, "it's a \\", "'it''s a \\\\'"),
    (MONETDB, "it's a \\", "'it''s a \\\\'"),
    (SPARK, "it's a \\", "'it\\'s a \\\\'"),
    (DUCKDB, "it's a \\", "'it''s a \\'"),
])
def test_string_literals(dialect, text, literal) -> None:
    assert dialect.literal(text) == literal


def test_literals_of_every_value_kind() -> None:
    assert MARIADB.literal(None) == "NULL"
    assert MARIADB.literal(True) == "1"
    assert MARIADB.literal(decimal.Decimal("1.23E-7")) == "0.000000123"  # never scientific
    assert MARIADB.literal(b"") == "''" and MARIADB.literal(b"\x01") == "X'01'"
    assert MONETDB.literal(b"\x01") == "BLOB '01'"
    assert DUCKDB.literal(b"\x01\xff") == "'\\x01\\xFF'::BLOB"
    aware = datetime.datetime(2026, 1, 1, 3, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert MARIADB.literal(aware) == "'2026-01-01 01:00:00'"  # TIMESTAMP in UTC
    assert MARIADB.literal(datetime.timedelta(hours=-838, minutes=-59, seconds=-59)) == "'-838:59:59'"
    with pytest.raises(TypeError):
        MARIADB.literal(object())  # type: ignore[arg-type]
    assert set(DIALECTS) == {"mariadb", "monetdb", "spark", "duckdb"}


def test_type_text_helpers() -> None:
    assert type_params("decimal(65,30)") == [65, 30] and type_params("int") == []
    ms = ["a", "it's", "back\\slash"]
    assert members(f"enum({members_text(ms)})") == ms
    assert lob_type("blob", 3) == "mediumblob" and smallest_lob("text", 70000) == "mediumtext"
    assert smallest_lob("blob", 256) == "blob" and smallest_lob("blob", 255) == "tinyblob"
    assert BINARY_OF_TEXT["varchar"] == "varbinary"
    assert time_text(datetime.timedelta(microseconds=-1)) == "-00:00:00.000001"
