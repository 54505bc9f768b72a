"""TABLE_MAP events parsed once per distinct body (cynomys/parser/tablemap.py):
reading a binlog with the cache gives exactly the events the library's own
parse gives, across ALTERs (a new body, a new table id) and on every type."""
from __future__ import annotations

import random
import uuid
from typing import Iterator

import pytest

from cynomys.core.config import SourceConfig
from cynomys.core.model import Position
from cynomys.parser import tablemap
from cynomys.parser.stream import BinlogSource, SourceEvent
from tests.integration.test_producer import ALL_TYPES, ROWS
from tests.servers.mariadb import REPL_PASSWORD, REPL_USER, MariaDBServer

pytestmark = [pytest.mark.integration]


@pytest.fixture
def cache_restored() -> Iterator[None]:
    yield
    tablemap.install(True)


def _events(server: MariaDBServer, db: str, start: Position, *, cached: bool) -> list[SourceEvent]:
    tablemap.install(cached)
    cfg = SourceConfig(host="127.0.0.1", port=server.port, user=REPL_USER, password=REPL_PASSWORD,
                       include_tables=[f"{db}.*"])
    src = BinlogSource(cfg, start, blocking=False, is_mariadb=True)
    try:
        return [ev for ev in src]
    finally:
        src.close()


def test_cached_table_maps_give_the_same_events_across_alters(mariadb: MariaDBServer,
                                                              cache_restored: None) -> None:
    db = "tm_" + uuid.uuid4().hex[:8]
    cols = ", ".join(f"`{n}` {t}" for n, t in ALL_TYPES)
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(20), n INT)",
                    f"CREATE TABLE {db}.all_types ({cols})")
    f, p = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    rnd = random.Random(7)
    conn = mariadb.connect(db)
    with conn.cursor() as cur:
        for step in range(3):
            for i in range(60):  # one small transaction each: a TABLE_MAP before every ROWS event
                k = rnd.randrange(40)
                cur.execute("INSERT INTO t (id, v, n) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE n = n + 1",
                            (k, f"v{k}", i))
                conn.commit()
                if rnd.random() < 0.3:
                    cur.execute("DELETE FROM t WHERE id = %s", (rnd.randrange(40),))
                    conn.commit()
            # The same table with other columns: the TABLE_MAP body changes.
            cur.execute(["ALTER TABLE t ADD COLUMN extra INT DEFAULT 5",
                         "ALTER TABLE t MODIFY v VARCHAR(30)", "ALTER TABLE t DROP COLUMN n"][step])
        cur.execute("ALTER TABLE t ADD COLUMN n BIGINT UNSIGNED DEFAULT 1")
        for k in range(5):
            cur.execute("UPDATE t SET n = n + %s WHERE id = %s", (k, k))
            conn.commit()
        cur.execute("SET SESSION sql_mode=''")
        for row in ROWS:
            cur.execute(f"INSERT INTO all_types VALUES {row}")
            conn.commit()
        cur.execute("UPDATE all_types SET ti = 1")
        conn.commit()
    conn.close()

    library = _events(mariadb, db, Position(f, p), cached=False)
    cached = _events(mariadb, db, Position(f, p), cached=True)
    bodies = len(tablemap.CachedTableMapEvent._cache)
    assert cached == library
    rows_events = [ev for ev in cached if ev.rows]
    assert len(rows_events) > 200
    # Each table definition was parsed once, not once per transaction.
    assert 2 <= bodies <= 8, bodies
    # The ALTERs reached the decoded rows: the last definition's columns.
    last_t = [ev for ev in rows_events if ev.table == "t"][-1]
    assert [c.name for c in last_t.schema.columns] == ["id", "v", "extra", "n"]
