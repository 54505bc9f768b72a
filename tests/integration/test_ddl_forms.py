"""DDL forms a real MariaDB takes and logs, each of which stopped the applier
as unparsable before (sqlglot cannot read them): run on a real source between
writes, read back from its binlog files by the producer, applied to a real
MariaDB target (the ColumnStore target code, engine InnoDB); the applier runs
to its end and the target equals the source, table by table.

Index options (``USING``, ``ALGORITHM``/``LOCK``, ``WAIT``, ``IGNORED``, ``IF
NOT EXISTS``), descending key parts, spatial subtypes, ``WAIT``/``NOWAIT``
after a table, ``DISABLE KEYS``, a ``BIT`` column added with a ``b'...'``
default, and ``CREATE OR REPLACE DATABASE`` (which drops the database's
tables first: the target must too).  ``RENAME TABLES`` and ``DROP TABLES``
(read as statements that change nothing, skipped), a DDL behind MariaDB's
``SET STATEMENT ... FOR`` (read as a SET, skipped), quoted column names that
spell keywords (`` CHANGE `rename` `as` `` made a column ``TO``); ``CHANGE|MODIFY
[COLUMN] IF EXISTS`` and ``NATIONAL VARCHAR`` (refused as unparsable); a DDL in
an executable comment the server ran (``/*!50100 ALTER ... */``: skipped).  A
DDL the parser cannot read on a table nobody replicates (a system-versioned
table in another database) is dropped by the producer: it stopped the applier.

MariaDB's ``COMPRESSED`` columns: a table with one made the library raise a
ValueError from inside its TABLE_MAP parse -- the producer died with a
traceback, whether the table was replicated or not.  Now their values are
inflated (stored as they are, raw deflate, zlib-wrapped; text and bytes)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cynomys.transport.keys import generate_keys
from tests.helpers import write_config
from tests.integration.test_binlog_files import _archive, _run_statements, cli
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration]

STATEMENTS = [
    "CREATE DATABASE app",
    "CREATE TABLE app.k (id INT NOT NULL, b INT, c VARCHAR(20), w TEXT, g POINT NULL, PRIMARY KEY (id DESC), "
    "KEY (b ASC))",
    # MariaDB column compression: short values are stored as they are (under
    # column_compression_threshold, 100 bytes), long ones zlib-compressed, raw
    # deflate or wrapped (column_compression_zlib_wrap); 1- and 2-byte length
    # prefixes, text in utf8mb4 and latin1, bytes.
    "CREATE DATABASE other",
    "CREATE TABLE other.z (id INT PRIMARY KEY, c VARCHAR(20) COMPRESSED, w TEXT COMPRESSED=zlib, "
    "v VARCHAR(300) CHARACTER SET latin1 COMPRESSED, b BLOB COMPRESSED, vb VARBINARY(500) COMPRESSED)",
    "INSERT INTO other.z VALUES (1, 'x', REPEAT('y', 500), REPEAT('ä', 150), REPEAT(x'00ff', 300), x'0102'), "
    "(2, '', '', '', '', ''), (3, NULL, NULL, NULL, NULL, NULL), "
    "(4, 'żółw🐢', CONCAT(REPEAT('żółw🐢 ', 40), 'end'), 'short', x'00', REPEAT(x'ab', 400))",
    "SET SESSION column_compression_zlib_wrap = ON",
    "INSERT INTO other.z VALUES (5, 'wrapped', REPEAT('wrapped ', 100), REPEAT('w', 250), REPEAT('b', 2000), "
    "REPEAT('vb', 200))",
    "SET SESSION column_compression_zlib_wrap = OFF",
    "UPDATE other.z SET w = REPEAT('updated ', 60) WHERE id = 1",
    "DELETE FROM other.z WHERE id = 2",
    "CREATE TABLE app.t2 (id INT PRIMARY KEY, v INT)",
    "INSERT INTO app.k (id, b, c, w) SELECT seq, seq % 7, CONCAT('c', seq), REPEAT('w', seq % 50) FROM app.seq_1_to_200",
    "INSERT INTO app.t2 SELECT seq, seq FROM app.seq_1_to_50",
    # DDL the parser cannot read, on a table nobody replicates: the producer
    # drops it (it stopped the applier, holding every replicated table back).
    "CREATE DATABASE skipme",
    "CREATE TABLE skipme.v (id INT PRIMARY KEY, x INT) WITH SYSTEM VERSIONING",
    "INSERT INTO skipme.v VALUES (1, 1)",
    "CREATE INDEX by_b USING BTREE ON app.k (b) WAIT 5 ALGORITHM=INPLACE LOCK=NONE",
    "ALTER TABLE app.k WAIT 5 ADD COLUMN f BIT(4) NOT NULL DEFAULT b'101', ADD INDEX IF NOT EXISTS by_f (f) IGNORED",
    "ALTER TABLE app.k NOWAIT ADD COLUMN p LINESTRING NULL, ALGORITHM=INPLACE, LOCK=NONE",
    "UPDATE app.k SET b = b + 1, f = b'11' WHERE id % 3 = 0",
    "ALTER TABLE app.k DISABLE KEYS",
    "ALTER TABLE app.k ENABLE KEYS",
    "ALTER TABLE app.k ALTER INDEX by_f NOT IGNORED",
    "DROP INDEX by_b ON app.k WAIT 3",
    "CREATE OR REPLACE INDEX by_b ON app.k (b, id) NOWAIT",
    "DELETE FROM app.k WHERE id > 180",
    "TRUNCATE TABLE app.t2 WAIT 2",
    "INSERT INTO app.t2 VALUES (1000, 1)",
    "CREATE TABLE app.gone (id INT PRIMARY KEY)",
    "INSERT INTO app.gone VALUES (1)",
    "DROP TABLE app.gone NOWAIT",
    "CREATE DATABASE scratch",
    "CREATE TABLE scratch.s (id INT PRIMARY KEY)",
    "INSERT INTO scratch.s VALUES (1), (2)",
    "CREATE OR REPLACE DATABASE scratch",
    "CREATE TABLE scratch.s (id INT PRIMARY KEY, v INT)",
    "INSERT INTO scratch.s VALUES (3, 30)",
    # Quoted names that spell keywords, and the plural forms: `rename` renamed
    # to `as` once became a column "TO" on the target; RENAME TABLES and DROP
    # TABLES were skipped as if they changed nothing.
    "CREATE TABLE app.r1 (id INT PRIMARY KEY, `rename` INT, `add` INT)",
    "INSERT INTO app.r1 VALUES (1, 10, 100), (2, 20, 200)",
    "ALTER TABLE app.r1 CHANGE `rename` `as` INT, CHANGE `add` `check` INT",
    "INSERT INTO app.r1 VALUES (3, 30, 300)",
    "RENAME TABLES app.r1 WAIT 3 TO app.r2",
    "UPDATE app.r2 SET `as` = `as` + 1 WHERE id = 1",
    # MariaDB logs the SET STATEMENT prefix with the statement (read as a SET
    # and skipped once: the column never came to the target).
    "SET STATEMENT lock_wait_timeout = 5, max_statement_time = 0 FOR ALTER TABLE app.r2 ADD COLUMN z INT DEFAULT 7",
    "INSERT INTO app.r2 VALUES (4, 40, 400, 8)",
    # MariaDB's IF EXISTS after CHANGE/MODIFY, and NATIONAL text types (refused as unparsable before).
    "ALTER TABLE app.r2 CHANGE COLUMN IF EXISTS `check` chk BIGINT, MODIFY IF EXISTS z INT DEFAULT 7, "
    "ADD COLUMN n NATIONAL VARCHAR(10)",
    "INSERT INTO app.r2 (id, `as`, chk, z, n) VALUES (5, 50, 500, 9, 'ñ')",
    # Executable comments the server ran (logged as typed; read as comments,
    # skipped, before), and one it did not (MySQL 8 only: stays a comment).
    "/*!50100 ALTER TABLE app.r2 ADD COLUMN ec INT DEFAULT 3 */",
    "ALTER TABLE app.r2 /*! ADD COLUMN ed INT DEFAULT 4 */",
    "/*!40000 ALTER TABLE app.r2 DISABLE KEYS */",
    "/*!40000 ALTER TABLE app.r2 ENABLE KEYS */",
    "ALTER TABLE app.r2 ADD COLUMN ee INT DEFAULT 5 /*!80000 , ADD COLUMN ef INT */",
    "INSERT INTO app.r2 (id, `as`) VALUES (6, 60)",
    "CREATE TABLE app.gone2 (id INT PRIMARY KEY) COMMENT 'drop' PARTITION BY HASH(id) PARTITIONS 2",
    "INSERT INTO app.gone2 VALUES (1)",
    "DROP TABLES app.gone2",
]

QUERIES = {
    "app.k": "SELECT id, b, c, w, f + 0, g IS NULL, p IS NULL FROM app.k ORDER BY id",
    "app.t2": "SELECT id, v FROM app.t2 ORDER BY id",
    "scratch.s": "SELECT * FROM scratch.s ORDER BY id",
    "other.z": "SELECT * FROM other.z ORDER BY id",
    "app.r2": "SELECT id, `as`, chk, z, n, ec, ed, ee FROM app.r2 ORDER BY id",
}


def test_ddl_forms_the_parser_could_not_read_replicate(tmp_path: Path) -> None:
    src = MariaDBServer(server_id=1).start()
    tgt = MariaDBServer(server_id=2).start()
    try:
        src.execute("FLUSH BINARY LOGS")
        first = src.execute("SHOW MASTER STATUS")[0][0]
        _run_statements(src, STATEMENTS)
        src.execute("FLUSH BINARY LOGS")
        archive = tmp_path / "archive"
        _archive(src, archive)
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(tmp_path / "c.toml", src,
                           source={"binlog_files": "archive/mysql-bin.[0-9]*", "include_tables": ["app.*", "scratch.*", "other.*"],
                                   "start": f"{first}:4", "host": "127.0.0.1", "port": 1},
                           producer={"id": "forms", "batch_max_events": 300},
                           transport={"kind": "file", "path": str(tmp_path / "t.bin")},
                           security={k: str(v) for k, v in keys.items()},
                           target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"})
        # The compressed table's schema as its TABLE_MAP gives it: the source's
        # types (a COMPRESSED VARCHAR's length counts a header byte, not said).
        from cynomys.cli.decode import decode

        z = next(i for i in decode(sorted(str(f) for f in archive.glob("mysql-bin.[0-9]*")), 4)
                 if getattr(i, "table", "") == "z" and getattr(i, "schema", None) is not None)
        assert [c.type for c in z.schema.columns] == ["int", "varchar(20)", "text", "varchar(300)", "blob",
                                                      "varbinary(500)"]
        produced = cli("produce", "-c", str(cfg))
        assert produced.returncode == 0, produced.stderr[-3000:]
        assert "dropping a DDL on skipme.v, which is not replicated" in produced.stderr
        applied = cli("apply", "-c", str(cfg), "--until-idle", "3")
        assert applied.returncode == 0, applied.stderr[-3000:]
        for table, query in QUERIES.items():
            want = src.execute(query)
            assert want, f"{table}: the source holds no rows"
            assert tgt.execute(query) == want, table
        # The old scratch.s went with its database: only the new table's row.
        assert tgt.execute("SELECT id FROM scratch.s") == [(3,)]
        columns = ("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'app' AND "
                   "TABLE_NAME = 'r2' ORDER BY COLUMN_NAME")
        assert tgt.execute(columns) == src.execute(columns)  # no ef: the source never ran its comment
        assert tgt.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_NAME IN "
                           "('gone', 'gone2', 'r1')") == []
    finally:
        src.destroy()
        tgt.destroy()
