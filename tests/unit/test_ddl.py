"""parser/ddl.py: one source DDL statement -> neutral operations."""
from __future__ import annotations

import decimal

import pytest

from cynomys.core.errors import TerminalError
from cynomys.core.model import ColumnDef, RawTemporal
from cynomys.parser.ddl import (
    AddColumn,
    AddIndex,
    AddPrimaryKey,
    CreateDatabase,
    CreateTable,
    CreateTableLike,
    DropColumn,
    DropDatabase,
    DropPrimaryKey,
    DropTable,
    ModifyColumn,
    NoOp,
    RenameColumn,
    RenameTable,
    Truncate,
    UnsupportedDdl,
    column_def,
    parse_ddl,
)


def one(sql: str, db: str = "app") -> object:
    ops = parse_ddl(sql, db)
    assert len(ops) == 1, ops
    return ops[0]


def not_noop(sql: str, db: str = "app") -> list[object]:
    return [op for op in parse_ddl(sql, db) if not isinstance(op, NoOp)]


# --------------------------------------------------------------------------
# Databases and tables
# --------------------------------------------------------------------------
def test_create_and_drop_database() -> None:
    assert one("CREATE DATABASE IF NOT EXISTS shop CHARACTER SET utf8mb4") == CreateDatabase("shop", True)
    assert one("create schema `we``ird`") == CreateDatabase("we`ird", False)
    assert one("DROP DATABASE IF EXISTS shop") == DropDatabase("shop", True)
    assert one("DROP SCHEMA shop") == DropDatabase("shop", False)
    assert isinstance(one("ALTER DATABASE shop CHARACTER SET latin1"), NoOp)


def test_create_table_columns_key_and_types() -> None:
    op = one("""CREATE TABLE IF NOT EXISTS `shop`.`order items` (
        `id` bigint(20) unsigned NOT NULL AUTO_INCREMENT,
        amount DECIMAL(65,30) NOT NULL DEFAULT 0,
        e ENUM('a','it''s','back\\\\slash') CHARACTER SET utf8mb4,
        s SET('x','y'), b BIT(64), y YEAR(4), ts TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6)
            ON UPDATE CURRENT_TIMESTAMP(6),
        t TIME(6), j JSON, bn BINARY(4), vb VARBINARY(10), tx LONGTEXT COLLATE utf8mb4_bin,
        z INT(11) ZEROFILL, f FLOAT, f2 FLOAT(30), dp DOUBLE PRECISION, r REAL, i8 INT8, lv LONG,
        n NUMERIC(5), d DEC, vc VARCHAR(10) CHARACTER SET binary, ch CHAR, bo BOOLEAN, dt DATETIME,
        sr SERIAL, tt TEXT(100), g GEOMETRY,
        PRIMARY KEY (`id`), KEY k (amount), UNIQUE KEY u (e),
        CONSTRAINT fk FOREIGN KEY (z) REFERENCES other(id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT='orders'""", db="ignored")
    assert isinstance(op, CreateTable)
    assert (op.database, op.table, op.key, op.if_not_exists) == ("shop", "order items", ("id",), True)
    assert [(c.name, c.type, c.nullable) for c in op.columns] == [
        ("id", "bigint unsigned", False), ("amount", "decimal(65,30)", False),
        ("e", "enum('a','it''s','back\\\\slash')", True), ("s", "set('x','y')", True), ("b", "bit(64)", True),
        ("y", "year", True), ("ts", "timestamp(6)", True), ("t", "time(6)", True), ("j", "json", True),
        ("bn", "binary(4)", True), ("vb", "varbinary(10)", True), ("tx", "longtext", True),
        ("z", "int unsigned", True), ("f", "float", True), ("f2", "double", True), ("dp", "double", True),
        ("r", "double", True), ("i8", "bigint", True), ("lv", "mediumtext", True), ("n", "decimal(5,0)", True),
        ("d", "decimal(10,0)", True), ("vc", "varbinary(10)", True), ("ch", "char(1)", True),
        ("bo", "tinyint", True), ("dt", "datetime", True), ("sr", "bigint unsigned", False),
        ("tt", "text", True), ("g", "geometry", True),
    ]


def test_column_types_match_the_parser_text() -> None:
    # The binlog parser writes these texts into ColumnDef.type; DDL must agree.
    for sql, text in [("TINYINT(4)", "tinyint"), ("SMALLINT UNSIGNED", "smallint unsigned"),
                      ("MEDIUMINT(9) UNSIGNED ZEROFILL", "mediumint unsigned"), ("DATETIME(3)", "datetime(3)"),
                      ("TIMESTAMP", "timestamp"), ("VARCHAR(255)", "varchar(255)"), ("CHAR(10)", "char(10)"),
                      ("TINYBLOB", "tinyblob"), ("MEDIUMBLOB", "mediumblob"), ("BLOB", "blob"),
                      ("DECIMAL(10,2) UNSIGNED", "decimal(10,2) unsigned"), ("DOUBLE(10,2)", "double(10,2)"),
                      ("BIT", "bit(1)"), ("TEXT CHARSET binary", "blob")]:
        assert column_def(sql).type == text, sql
    assert column_def("INT NOT NULL").nullable is False
    assert column_def("INT NULL").nullable is True


def test_primary_key_forms() -> None:
    assert one("CREATE TABLE t (a INT PRIMARY KEY, b INT)").key == ("a",)  # type: ignore[attr-defined]
    op = one("CREATE TABLE t (a INT, b VARCHAR(50), CONSTRAINT pk PRIMARY KEY (b(10), a) USING BTREE)")
    assert isinstance(op, CreateTable) and op.key == ("b", "a")
    assert all(not c.nullable for c in op.columns)  # key columns are NOT NULL
    op = one("CREATE TABLE t (a INT NOT NULL, UNIQUE KEY (a))")
    assert isinstance(op, CreateTable) and op.key == ()  # a unique key is not the primary key


def test_unqualified_names_take_the_default_database() -> None:
    assert one("CREATE TABLE t (a INT)", db="cur").database == "cur"  # type: ignore[attr-defined]
    assert one("CREATE TABLE other.t (a INT)", db="cur").database == "other"  # type: ignore[attr-defined]
    with pytest.raises(UnsupportedDdl, match="no database"):
        parse_ddl("CREATE TABLE t (a INT)", "")


def test_quoting_and_unicode_identifiers() -> None:
    op = one("CREATE TABLE `ta``b`.`spaced name` (`col``1` INT, `ünï` VARCHAR(3), `select` INT)")
    assert isinstance(op, CreateTable)
    assert (op.database, op.table) == ("ta`b", "spaced name")
    assert [c.name for c in op.columns] == ["col`1", "ünï", "select"]
    ops = parse_ddl("ALTER TABLE `ünï` ADD (`ä` INT, `b` INT)", "d")
    assert ops == [AddColumn("d", "ünï", ColumnDef("ä", "int")), AddColumn("d", "ünï", ColumnDef("b", "int"))]


def test_create_or_replace_and_like() -> None:
    assert parse_ddl("CREATE OR REPLACE TABLE t (a INT)", "d") == [
        DropTable((("d", "t"),), if_exists=True), CreateTable("d", "t", (ColumnDef("a", "int"),))]
    assert one("CREATE TABLE IF NOT EXISTS t2 LIKE other.t1", db="d") == CreateTableLike("d", "t2", "other", "t1", True)
    assert one("CREATE TABLE t2 (LIKE t1)", db="d") == CreateTableLike("d", "t2", "d", "t1", False)


def test_create_table_select_is_unsupported() -> None:
    with pytest.raises(UnsupportedDdl, match="SELECT"):
        parse_ddl("CREATE TABLE t AS SELECT 1 AS a", "d")


def test_partitioning_is_storage_only() -> None:
    ops = parse_ddl("CREATE TABLE t (a INT, b DATE) PARTITION BY RANGE (YEAR(b)) "
                    "(PARTITION p0 VALUES LESS THAN (2000), PARTITION p1 VALUES LESS THAN MAXVALUE)", "d")
    assert ops[0] == CreateTable("d", "t", (ColumnDef("a", "int"), ColumnDef("b", "date")))
    assert not_noop("CREATE TABLE t (a INT) PARTITION BY HASH(a) PARTITIONS 4", "d") == [
        CreateTable("d", "t", (ColumnDef("a", "int"),))]
    assert not_noop("ALTER TABLE t REMOVE PARTITIONING") == []
    assert not_noop("ALTER TABLE t ADD PARTITION (PARTITION p3 VALUES LESS THAN (3000))") == []
    # Names that merely look like partition words are names.
    assert parse_ddl("CREATE TABLE partitions (partitions INT, `partition` INT, partitioning INT)", "d") == [
        CreateTable("d", "partitions", (ColumnDef("partitions", "int"), ColumnDef("partition", "int"),
                                        ColumnDef("partitioning", "int")))]
    assert parse_ddl("ALTER TABLE partitions ADD partitions INT, ADD partitioning INT, DROP `partition`", "d") == [
        AddColumn("d", "partitions", ColumnDef("partitions", "int")),
        AddColumn("d", "partitions", ColumnDef("partitioning", "int")),
        DropColumn("d", "partitions", "partition")]
    for sql in ("ALTER TABLE t DROP PARTITION p0", "ALTER TABLE t TRUNCATE PARTITION p0, p1",
                "ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE t2", "ALTER TABLE t IMPORT TABLESPACE",
                "alter table d.t discard tablespace"):
        with pytest.raises(UnsupportedDdl, match="without logging"):
            parse_ddl(sql, "d")


def test_drop_rename_truncate() -> None:
    assert one("DROP TABLE IF EXISTS a, other.b /* generated by server */", db="d") == DropTable(
        (("d", "a"), ("other", "b")), True)
    assert isinstance(one("DROP TEMPORARY TABLE IF EXISTS tmp"), NoOp)
    assert isinstance(one("CREATE TEMPORARY TABLE tmp (a INT)"), NoOp)
    assert one("RENAME TABLE a TO b, other.c TO `x``y`.d", db="d") == RenameTable(
        ((("d", "a"), ("d", "b")), (("other", "c"), ("x`y", "d"))))
    assert one("/* c */ rename table if exists a to b", db="d") == RenameTable(((("d", "a"), ("d", "b")),))
    assert one("ALTER TABLE a RENAME TO other.b", db="d") == RenameTable(((("d", "a"), ("other", "b")),))
    assert one("ALTER TABLE a RENAME AS b", db="d") == RenameTable(((("d", "a"), ("d", "b")),))
    # MariaDB's forms: TABLES, WAIT n / NOWAIT after a name.
    assert one("RENAME TABLES a WAIT 3 TO b, c NOWAIT TO other.d", db="d") == RenameTable(
        ((("d", "a"), ("d", "b")), (("d", "c"), ("other", "d"))))
    assert one("DROP TABLES IF EXISTS a, other.b", db="d") == DropTable((("d", "a"), ("other", "b")), True)
    with pytest.raises(UnsupportedDdl, match="expected TO"):
        parse_ddl("RENAME TABLE a b", "d")
    assert one("TRUNCATE TABLE other.t") == Truncate("other", "t")
    assert one("truncate t", db="d") == Truncate("d", "t")


def test_quoted_names_and_strings_are_never_keywords() -> None:
    # A column named `rename` renamed to `as` was once read as RENAME AS
    # (the column became "TO" on the target), and `add` then `check` as ADD
    # CHECK (refused); a table named `nowait` as RENAME TABLE's NOWAIT, a
    # COMMENT 'drop' before PARTITION BY as DROP PARTITION (refused).
    assert parse_ddl("ALTER TABLE t CHANGE `rename` `as` INT", "d") == [
        RenameColumn("d", "t", "rename", "as"), ModifyColumn("d", "t", ColumnDef("as", "int", True))]
    assert parse_ddl("ALTER TABLE t CHANGE `add` `check` INT", "d")[0] == RenameColumn("d", "t", "add", "check")
    assert parse_ddl("ALTER TABLE t ADD COLUMN `column` INT", "d")[0].column.name == "column"  # type: ignore[union-attr]
    assert one("RENAME TABLE `nowait` TO b, `wait` TO c", db="d") == RenameTable(
        ((("d", "nowait"), ("d", "b")), (("d", "wait"), ("d", "c"))))
    ops = parse_ddl("CREATE TABLE t (a INT) COMMENT 'drop' PARTITION BY HASH(a) PARTITIONS 2", "d")
    assert [type(op) for op in ops] == [CreateTable, NoOp]
    # MariaDB's IF EXISTS after CHANGE/MODIFY [COLUMN], and NATIONAL text (a column may be named so).
    assert parse_ddl("ALTER TABLE t CHANGE COLUMN IF EXISTS a b INT, MODIFY IF EXISTS c BIGINT", "d") == [
        RenameColumn("d", "t", "a", "b"), ModifyColumn("d", "t", ColumnDef("b", "int", True)),
        ModifyColumn("d", "t", ColumnDef("c", "bigint", True))]
    assert parse_ddl("ALTER TABLE t CHANGE `if` `exists` INT", "d")[0] == RenameColumn("d", "t", "if", "exists")
    assert parse_ddl("CREATE TABLE t (n NATIONAL CHARACTER VARYING(5), `national` INT, c NATIONAL CHAR(2))", "d") == [
        CreateTable("d", "t", (ColumnDef("n", "varchar(5)"), ColumnDef("national", "int"), ColumnDef("c", "char(2)")))]
    # The keywords themselves still count, in any case.
    assert one("alter table a rename as b", db="d") == RenameTable(((("d", "a"), ("d", "b")),))
    assert [type(op) for op in parse_ddl("alter table t add (a INT, `b` INT)", "d")] == [AddColumn, AddColumn]


# --------------------------------------------------------------------------
# ALTER TABLE
# --------------------------------------------------------------------------
def test_alter_with_many_specs() -> None:
    ops = parse_ddl("ALTER TABLE `shop`.`t` ADD COLUMN c INT AFTER b, DROP COLUMN d, MODIFY COLUMN e VARCHAR(20) "
                    "NOT NULL FIRST, CHANGE COLUMN f g BIGINT UNSIGNED, CHANGE h h TINYINT, RENAME COLUMN i TO j, "
                    "ADD INDEX ix (a), DROP KEY k, DROP FOREIGN KEY fk, ALTER COLUMN a SET DEFAULT 5, "
                    "ENGINE=InnoDB, COMMENT='x', AUTO_INCREMENT=5, ALGORITHM=INPLACE, LOCK=NONE", "d")
    assert [op for op in ops if not isinstance(op, NoOp)] == [
        AddColumn("shop", "t", ColumnDef("c", "int")),
        DropColumn("shop", "t", "d"),
        ModifyColumn("shop", "t", ColumnDef("e", "varchar(20)", False)),
        RenameColumn("shop", "t", "f", "g"),
        ModifyColumn("shop", "t", ColumnDef("g", "bigint unsigned")),
        ModifyColumn("shop", "t", ColumnDef("h", "tinyint")),
        RenameColumn("shop", "t", "i", "j"),
        AddIndex("shop", "t", ("a",)),
    ]
    assert sum(isinstance(op, NoOp) for op in ops) >= 3


def test_alter_column_forms() -> None:
    assert parse_ddl("ALTER TABLE t ADD COLUMN IF NOT EXISTS c INT, DROP COLUMN IF EXISTS d", "d") == [
        AddColumn("d", "t", ColumnDef("c", "int"), True), DropColumn("d", "t", "d", True)]
    assert parse_ddl("alter table t add c int, drop c2", "d") == [
        AddColumn("d", "t", ColumnDef("c", "int")), DropColumn("d", "t", "c2")]
    assert not_noop("ALTER TABLE t ADD COLUMN (c INT, d DECIMAL(10,2) NOT NULL)", "d") == [
        AddColumn("d", "t", ColumnDef("c", "int")), AddColumn("d", "t", ColumnDef("d", "decimal(10,2)", False), fill=decimal.Decimal(0))]
    assert not_noop("ALTER ONLINE IGNORE TABLE t ADD c INT", "d") == [AddColumn("d", "t", ColumnDef("c", "int"))]
    assert not_noop("ALTER TABLE IF EXISTS t ADD c INT", "d") == [AddColumn("d", "t", ColumnDef("c", "int"))]
    # Adding a generated column fills existing rows with values no row event
    # carries: refused (test_added_column_with_per_row_values_is_refused).
    # A CHANGE that only changes the case of the name is still a rename.
    assert not_noop("ALTER TABLE t CHANGE a A INT", "d") == [
        RenameColumn("d", "t", "a", "A"), ModifyColumn("d", "t", ColumnDef("A", "int"))]


def test_primary_key_changes() -> None:
    assert parse_ddl("ALTER TABLE t ADD PRIMARY KEY (a, b), DROP PRIMARY KEY", "d") == [
        AddPrimaryKey("d", "t", ("a", "b")), DropPrimaryKey("d", "t")]
    assert one("ALTER TABLE t ADD CONSTRAINT pk PRIMARY KEY (a)", db="d") == AddPrimaryKey("d", "t", ("a",))
    assert one("ALTER TABLE t DROP INDEX `PRIMARY`", db="d") == DropPrimaryKey("d", "t")
    assert one("DROP INDEX `PRIMARY` ON t", db="d") == DropPrimaryKey("d", "t")
    assert one("DROP INDEX `PRIMARY` ON d2.t LOCK=NONE", db="d") == DropPrimaryKey("d2", "t")
    assert one("CREATE TABLE t (a INT, PRIMARY KEY USING HASH (a))", db="d").key == ("a",)  # type: ignore[attr-defined]
    assert parse_ddl("ALTER TABLE t ADD COLUMN id INT PRIMARY KEY", "d") == [
        AddColumn("d", "t", ColumnDef("id", "int", False), fill=0), AddPrimaryKey("d", "t", ("id",))]


@pytest.mark.parametrize("sql", [
    "CREATE UNIQUE INDEX ix ON t (a(10))", "DROP INDEX ix ON t", "CREATE FULLTEXT INDEX f ON t (a, b)",
    "CREATE SPATIAL INDEX g ON t (g)", "ALTER TABLE t ADD CHECK (a > 0)", "ALTER TABLE t ADD INDEX ((a + 1))",
    "ALTER TABLE t ADD FULLTEXT INDEX f (a)", "ALTER TABLE t DROP CHECK c",
    "ALTER TABLE t ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES o (id)", "ALTER TABLE t DROP CONSTRAINT c",
    "ALTER TABLE t RENAME INDEX a TO b", "ALTER TABLE t ENGINE=Aria", "ALTER TABLE t COMMENT 'x'",
    "ALTER TABLE t AUTO_INCREMENT=100", "ALTER TABLE t DEFAULT CHARSET=latin1", "ALTER TABLE t ROW_FORMAT=COMPRESSED",
    "ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci", "ALTER TABLE t FORCE",
    "ALTER TABLE t ALTER COLUMN a DROP DEFAULT", "ALTER TABLE t ORDER BY a", "CREATE VIEW v AS SELECT 1",
    "DROP INDEX i ON t ALGORITHM=INPLACE LOCK=NONE", "DROP INDEX IF EXISTS i ON `my t` WAIT 3",
    "CREATE INDEX i ON t (c(10)) LOCK=NONE", "CREATE FULLTEXT INDEX f ON t (c) WITH PARSER ngram",
    "ALTER TABLE t ALTER INDEX i IGNORED", "ALTER TABLE t ALTER INDEX i NOT IGNORED",
])
def test_statements_that_change_no_rows(sql: str) -> None:
    ops = parse_ddl(sql, "d")
    assert ops and all(isinstance(op, NoOp) and op.reason for op in ops), ops


@pytest.mark.parametrize("sql,types", [
    ("CREATE TABLE t (a INET4, b INET6 NOT NULL, uuid UUID, v VECTOR(4))",
     ["binary(4)", "binary(16)", "binary(16)", "varbinary(16)"]),
    ("ALTER TABLE t ADD COLUMN inet6 INET6", ["binary(16)"]),
])
def test_types_that_travel_as_their_binlog_bytes(sql: str, types: list[str]) -> None:
    """MariaDB's INET4/INET6/UUID and MySQL 9's VECTOR: the type the binlog's
    TABLE_MAP gives (core/sourcetypes.py BINARY_OF_SOURCE_TYPE, vector_type)."""
    (op,) = parse_ddl(sql, "d")
    cols = op.columns if hasattr(op, "columns") else (op.column,)  # type: ignore[attr-defined]
    assert [c.type for c in cols] == types


@pytest.mark.parametrize("sql", [
    "garbage here", "", "SELECT 1", "INSERT INTO t VALUES (1)", "GRANT ALL ON *.* TO 'a'@'b'",
    "CREATE TABLE t (a INT) WITH SYSTEM VERSIONING", "ALTER TABLE t IMPORT TABLESPACE",
    "ALTER TABLE t CONVERT TO CHARACTER SET binary", "CREATE SEQUENCE s", "CREATE TABLE (", "ALTER TABLE",
])
def test_untranslatable_statements_raise(sql: str) -> None:
    with pytest.raises(UnsupportedDdl) as info:
        parse_ddl(sql, "d")
    err = info.value
    assert isinstance(err, TerminalError) and not err.transient
    assert err.sql == sql and err.reason
    assert "skip_ddl" in str(err) and repr(" ".join(sql.split())) in str(err)


@pytest.mark.parametrize("sql,fill,now", [
    ("ALTER TABLE t ADD w INT DEFAULT 5", 5, False),
    ("ALTER TABLE t ADD w INT", None, False),
    ("ALTER TABLE t ADD w VARCHAR(5) NOT NULL", "", False),
    ("ALTER TABLE t ADD w ENUM('x','y') NOT NULL", "x", False),
    ("ALTER TABLE t ADD w DECIMAL(5,2) DEFAULT -1.5", decimal.Decimal("-1.5"), False),
    ("ALTER TABLE t ADD w DATE NOT NULL", RawTemporal("0000-00-00"), False),
    ("ALTER TABLE t ADD w TIMESTAMP NULL DEFAULT CURRENT_TIMESTAMP", None, True),
    ("ALTER TABLE t ADD w DATETIME DEFAULT NOW()", None, True),
    ("ALTER TABLE t ADD w TEXT DEFAULT 'it''s'", "it's", False),
])
def test_added_column_fills_existing_rows_like_the_source(sql: str, fill: object, now: bool) -> None:
    (op,) = parse_ddl(sql, "d")
    assert isinstance(op, AddColumn) and (op.fill, op.fill_now) == (fill, now)
    assert type(op.fill) is type(fill)


@pytest.mark.parametrize("sql", ["ALTER TABLE t ADD g INT AS (a + 1) STORED", "ALTER TABLE t ADD u CHAR(36) DEFAULT (UUID())"])
def test_added_column_with_per_row_values_is_refused(sql: str) -> None:
    with pytest.raises(UnsupportedDdl, match="re-snapshot"):
        parse_ddl(sql, "d")


@pytest.mark.parametrize("sql,fill", [
    ("ALTER TABLE t ADD COLUMN b BINARY(3) NOT NULL", b"\x00\x00\x00"),
    ("ALTER TABLE t ADD COLUMN b BINARY(4) NOT NULL DEFAULT 'ab'", b"ab\x00\x00"),
    ("ALTER TABLE t ADD COLUMN a INET6 NOT NULL", bytes(16)),
    ("ALTER TABLE t ADD COLUMN a INET6 DEFAULT '::1'", bytes(15) + b"\x01"),
    ("ALTER TABLE t ADD COLUMN a INET4 NOT NULL DEFAULT '192.0.2.1'", bytes([192, 0, 2, 1])),
    ("ALTER TABLE t ADD COLUMN u UUID DEFAULT '00000000-0000-0000-0000-0000000000ab'", bytes(15) + b"\xab"),
])
def test_added_binary_columns_fill_existing_rows_as_the_source_does(sql: str, fill: bytes) -> None:
    """BINARY(n) values are n bytes (zero-padded); INET/UUID defaults are
    written as text and held as their bytes."""
    (op,) = parse_ddl(sql, "d")
    assert op.fill == fill  # type: ignore[attr-defined]


def test_a_keyless_create_table_keeps_its_whole_column_indexes() -> None:
    # Unique ones first, each once; a prefix, an expression, FULLTEXT left
    # out (a target could not build them the same); none with a key.
    (op,) = parse_ddl("CREATE TABLE d.t (a INT, b VARCHAR(20), c TEXT, u INT UNIQUE, KEY by_a (a), INDEX (b, a), "
                      "UNIQUE KEY ub (b), KEY p (b(5)), FULLTEXT KEY f (c), INDEX e ((a + 1)), KEY again (a))", "d")
    assert isinstance(op, CreateTable) and op.indexes == (("u",), ("b",), ("a",), ("b", "a"))
    (keyed,) = parse_ddl("CREATE TABLE d.k (a INT PRIMARY KEY, b INT, KEY (b))", "d")
    assert isinstance(keyed, CreateTable) and keyed.key == ("a",) and keyed.indexes == ()


@pytest.mark.parametrize("sql,columns", [
    ("CREATE INDEX ix ON t (a)", [("a",)]), ("CREATE UNIQUE INDEX ix ON d.t (a, b)", [("a", "b")]),
    ("ALTER TABLE t ADD UNIQUE KEY u (a)", [("a",)]), ("ALTER TABLE t ADD INDEX (b, a), ADD KEY k (c)", [("b", "a"), ("c",)]),
    # Index options sqlglot cannot read: each stopped the applier as unparsable.
    ("CREATE INDEX i ON t (a) ALGORITHM=INPLACE LOCK=NONE", [("a",)]), ("CREATE INDEX i USING BTREE ON t (a)", [("a",)]),
    ("CREATE UNIQUE INDEX i ON d.t (a, b) WAIT 5 COMMENT 'c)' ALGORITHM = INPLACE", [("a", "b")]),
    ("CREATE OR REPLACE INDEX i ON t (a) NOWAIT USING HASH KEY_BLOCK_SIZE=8", [("a",)]),
    ("CREATE INDEX IF NOT EXISTS i ON t (a) USING BTREE", [("a",)]),
    ("ALTER TABLE t ADD INDEX i (a) IGNORED, ADD KEY j (b) NOT IGNORED", [("a",), ("b",)]),
    ("ALTER TABLE t ADD INDEX IF NOT EXISTS i (a), ADD UNIQUE KEY IF NOT EXISTS u (b)", [("a",), ("b",)]),
])
def test_an_index_on_whole_columns_is_an_add_index(sql: str, columns: list[tuple[str, ...]]) -> None:
    # Changes no rows; a keyless table's target can make it (targets/columnstore/ddl.py).
    assert parse_ddl(sql, "d") == [AddIndex("d", "t", c) for c in columns]


@pytest.mark.parametrize("sql,want", [
    # Words that change no rows and that sqlglot cannot read: each stopped the applier.
    ("CREATE TABLE t (a INT, b INT, PRIMARY KEY (a, b DESC), KEY (b ASC))",
     CreateTable("d", "t", (ColumnDef("a", "int", False), ColumnDef("b", "int", False)), ("a", "b"))),
    ("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10) COMPRESSED, w TEXT COMPRESSED=zlib NOT NULL) "
     "DATA DIRECTORY = '/x' INDEX DIRECTORY='/y'",
     CreateTable("d", "t", (ColumnDef("id", "int", False), ColumnDef("v", "varchar(10)"), ColumnDef("w", "text", False)),
                 ("id",))),
    ("CREATE TABLE t (id INT PRIMARY KEY, g POINT, h GEOMETRYCOLLECTION NOT NULL)",  # a TABLE_MAP says GEOMETRY too
     CreateTable("d", "t", (ColumnDef("id", "int", False), ColumnDef("g", "geometry"), ColumnDef("h", "geometry", False)),
                 ("id",))),
    ("ALTER TABLE t WAIT 5 ADD COLUMN w INT", AddColumn("d", "t", ColumnDef("w", "int"))),
    ("ALTER TABLE IF EXISTS d.t NOWAIT DROP COLUMN nowait", DropColumn("d", "t", "nowait")),
    ("ALTER TABLE t MODIFY p MULTIPOLYGON NULL SRID 4326", ModifyColumn("d", "t", ColumnDef("p", "geometry"))),
    ("DROP TABLE IF EXISTS t1, t2 WAIT 5", DropTable((("d", "t1"), ("d", "t2")), True)),
    ("TRUNCATE TABLE t NOWAIT", Truncate("d", "t")),
    ("ALTER TABLE t ADD COLUMN b BIT(8) NOT NULL DEFAULT b'101'", AddColumn("d", "t", ColumnDef("b", "bit(8)", False), fill=5)),
    ("ALTER TABLE t ADD COLUMN b BIT(8) NOT NULL DEFAULT 0x0A", AddColumn("d", "t", ColumnDef("b", "bit(8)", False), fill=10)),
    ("ALTER TABLE t DISABLE KEYS", NoOp("DISABLE/ENABLE KEYS changes no rows")),
])
def test_words_that_change_no_rows_are_read_past(sql: str, want: object) -> None:
    assert parse_ddl(sql, "d") == [want]


def test_create_or_replace_database_drops_its_tables_first() -> None:
    # The source drops the database's tables: so must the target (before, the
    # statement was not even classified as DDL and the old tables stayed).
    assert parse_ddl("CREATE OR REPLACE DATABASE d4", "d") == [DropDatabase("d4", True), CreateDatabase("d4")]


def test_index_options_leave_a_column_named_like_them_alone() -> None:
    (op,) = parse_ddl("CREATE TABLE t (id INT PRIMARY KEY, compressed INT, point INT, wait INT, d INT COMMENT 'DESC')", "d")
    assert isinstance(op, CreateTable) and [c.name for c in op.columns] == ["id", "compressed", "point", "wait", "d"]
    assert parse_ddl("ALTER TABLE t CHANGE point pt LINESTRING", "d")[1] == ModifyColumn("d", "t", ColumnDef("pt", "geometry"))
    assert parse_ddl("ALTER TABLE t CHANGE COLUMN a b POINT NOT NULL", "d")[1] == \
        ModifyColumn("d", "t", ColumnDef("b", "geometry", False))
    for sql in ("ALTER TABLE t CHANGE a point INT", "ALTER TABLE t CHANGE COLUMN a point INT"):
        assert parse_ddl(sql, "d") == [RenameColumn("d", "t", "a", "point"), ModifyColumn("d", "t", ColumnDef("point", "int"))]
    ops = parse_ddl("ALTER TABLE t ADD COLUMN ignored INT, ADD COLUMN `using` INT, ADD INDEX (ignored)", "d")
    assert ops == [AddColumn("d", "t", ColumnDef("ignored", "int")), AddColumn("d", "t", ColumnDef("using", "int")),
                   AddIndex("d", "t", ("ignored",))]
    (op,) = parse_ddl("CREATE TABLE t (ignored INT, KEY (ignored) IGNORED)", "d")
    assert isinstance(op, CreateTable) and op.indexes == (("ignored",),)


def test_a_check_beside_other_changes_is_left_out_and_they_are_kept() -> None:
    # sqlglot cannot read ADD CHECK unnamed: it read as unparsable, and the
    # applier stopped on a statement that changes no rows.
    ops = parse_ddl("ALTER TABLE t ADD CHECK (a > 0), ADD COLUMN z INT", "d")
    assert [type(op) for op in ops] == [NoOp, AddColumn] and ops[1] == AddColumn("d", "t", ColumnDef("z", "int"))
