"""`cynomys verify --repair` on keys in a case-insensitive collation, end to
end: MariaDB -> producer -> Redis -> applier -> target, writers busy.

MariaDB's default utf8mb4_general_ci (and utf8mb4_unicode_ci) orders 'a' <
'B' < 'c' < 'D' and calls 'x' and 'x ' equal; the target (and the checksum)
order keys by their bytes: 'B' < 'D' < 'a' < 'c'.  A range cut in one order
and purged in the other deleted rows that should stay, and the repair still
reported success.  Here the target is damaged (rows deleted, changed, and
extra rows that differ from source keys only in case or a trailing space),
verify finds it, ``--repair`` mends it, and the target then equals the
source row by row: nothing that should stay was deleted.

And a verify job that cannot be done fails alone: the repair of a keyless
table too large for one envelope fails with the reason and the fix, while
replication goes on (before, the producer stopped on it at every start).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.helpers import wait_for
from tests.integration import verify_harness
from tests.integration.verify_harness import DuckDBSide, MariaDBSide, verify_run
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration]

TABLES = {
    "gci": "k VARCHAR(24) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci PRIMARY KEY, v INT, note VARCHAR(20)",
    "uci": "k VARCHAR(24) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci PRIMARY KEY, v INT, note VARCHAR(20)",
    "comp": "s VARCHAR(12) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci, n INT, v INT, PRIMARY KEY (s, n)",
    # ENUM sorts by member number ('z' < 'a' < 'M' < 'b'), its text in bytes 'M' < 'a' < 'b' < 'z'
    "en": "e ENUM('z', 'a', 'M', 'b') PRIMARY KEY, v INT",
}
#: Mixed case, accents (é without e: equal under both collations), a tab
#: (sorts before the space padding), trailing spaces (x without 'x ').
SPECIAL = ["a", "B", "c", "D", "é", "f", "b", "b\t", "x ", "Zz", "ñu", "Öl", "g  ", "H\t"]
CHUNK = 9


def _server(tmp_path: Path, server_id: int) -> MariaDBServer:
    """A MariaDB of this test with a temporary directory of its own: its
    sort files and internal temporary tables (the sorted read of a
    collated key, information_schema lookups) stay out of a /tmp that
    whatever else runs on the box may clean (a target once failed with
    "Error on delete of '/tmp/#sql-temptable-...MAI' (Errcode: 2)")."""
    tmp = tmp_path / f"server{server_id}-tmp"
    tmp.mkdir(exist_ok=True)
    return MariaDBServer(server_id=server_id, extra_args=(f"--tmpdir={tmp}",)).start()


class TargetServer(MariaDBSide):
    """The MariaDB target (ColumnStore code, engine InnoDB), with its own tmpdir."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, _server(tmp_path, 2))


def _keys(seed: int, n: int) -> list[str]:
    rnd = random.Random(seed)
    out = list(SPECIAL)
    letters = "aAbBcCdDéÉfFöÖxX"
    for _ in range(n):
        k = "".join(rnd.choice(letters) for _ in range(rnd.randrange(1, 5)))
        out.append(k + rnd.choice(["", "", "", " ", "\t", "  "]))
    return out  # duplicates under a collation are left out by INSERT IGNORE


def _lit(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "''") + "'"


def _source_rows(src: MariaDBServer, table: str) -> list[tuple[Any, ...]]:
    conn = src.connect("app")
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            return sorted(tuple(r) for r in cur.fetchall())
    finally:
        conn.close()


class Writers(verify_harness.Writers):
    """Two source clients changing keys of their own ('w…'/'W…', mixed case,
    padded) in gci and uci while verify runs: chunks are cut and repaired
    around changing neighbours."""

    seed = 100

    def txn(self, cur: Any, rnd: random.Random) -> None:
        table = rnd.choice(["gci", "uci"])
        k = rnd.choice("wW") + rnd.choice(["a", "B", "é", "c"]) + str(rnd.randrange(30)) + rnd.choice(["", " ", "\t"])
        if rnd.random() < 0.6:
            cur.execute(f"INSERT INTO {table} VALUES (%s, %s, 'w') ON DUPLICATE KEY UPDATE v = v + 1",
                        (k, rnd.randrange(1000)))
        else:
            cur.execute(f"DELETE FROM {table} WHERE k = %s", (k,))


def _damage(src: MariaDBServer) -> list[str]:
    """Statements damaging the target (same SQL on MariaDB and DuckDB):
    deletes, changes, and extra rows whose keys differ from source keys
    only in case or a trailing space (distinct in bytes, so the target,
    unlike the source, can hold both)."""
    out: list[str] = []
    for table in ("gci", "uci"):
        keys = [r[0] for r in _source_rows(src, table) if not r[0].startswith(("w", "W"))]
        rnd = random.Random(table)
        picked = rnd.sample(keys, 12)
        for k in picked[:4]:
            out.append(f"DELETE FROM app.{table} WHERE k = {_lit(k)}")
        for k in picked[4:8]:
            out.append(f"UPDATE app.{table} SET note = 'tampered' WHERE k = {_lit(k)}")
        extra = {"a "}  # 'a' is a source key
        for k in picked[8:]:
            extra.add(k.swapcase() if k.swapcase() != k else k + " ")
        extra -= set(keys)
        for variant in sorted(extra):
            out.append(f"INSERT INTO app.{table} VALUES ({_lit(variant)}, -1, 'extra')")
    out += ["DELETE FROM app.comp WHERE s = 'D' AND n = 1", "UPDATE app.comp SET v = -5 WHERE s = 'a' AND n = 2",
            "INSERT INTO app.comp VALUES ('A', 1, -1)", "DELETE FROM app.en WHERE e = 'M'",
            "UPDATE app.en SET v = -3 WHERE e = 'z'"]
    return out


def _equal(src: MariaDBServer, side: Any, tables: list[str]) -> Callable[[], bool]:
    return lambda: all(_source_rows(src, t) == side.rows(t) for t in tables)


def _collation_contract(tmp_path: Path, redis_url: str, side: Any, read_only: bool) -> None:
    src = _server(tmp_path, 1)
    with verify_run(tmp_path, src, side) as run:
        run.configure(redis_url, stream="vcoll", chunk=CHUNK, snapshot={"read_only": read_only})
        src.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()])
        conn = src.connect("app")
        with conn.cursor() as cur:
            for table, seed in (("gci", 1), ("uci", 2)):
                cur.executemany(f"INSERT IGNORE INTO {table} VALUES (%s, %s, %s)",
                                [(k, i, f"n{i}") for i, k in enumerate(_keys(seed, 140))])
            cur.executemany("INSERT IGNORE INTO comp VALUES (%s, %s, %s)",
                            [(k, n, i) for i, k in enumerate(_keys(3, 40)) for n in (1, 2)])
            cur.executemany("INSERT INTO en VALUES (%s, %s)", [(e, i) for i, e in enumerate(["z", "a", "M", "b"])])
        conn.commit()
        conn.close()
        run.start()
        tables = list(TABLES)
        wait_for(_equal(src, side, tables), timeout=120, what="the target to catch up")

        run.verify_equal()
        with Writers(src) as w:
            found = run.find_and_repair(lambda: side.execute(*_damage(src)))
            for t in tables:
                assert any(d.startswith(f"differs: app.{t} ") for d in found.differs), (t, found.report)
        assert not w.errors, w.errors
        # Row by row: what the repair deleted was put back, what it did not
        # delete was meant to stay (the old bug: rows of the collation's
        # range but outside the byte range were deleted and not read back).
        try:
            wait_for(_equal(src, side, tables), timeout=60, what="the target to equal the source")
        except AssertionError:
            for t in tables:
                s, r = set(_source_rows(src, t)), set(side.rows(t))
                print(f"{t}: missing on the target {sorted(s - r)}, extra {sorted(r - s)}")
            raise
        run.verify_equal(what="a verify after the repair")


SIDES: dict[str, Callable[[Path], Any]] = {"mariadb": TargetServer, "duckdb": DuckDBSide}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SIDES))
@pytest.mark.parametrize("read_only", [False, True], ids=["watermark-table", "gtid-watermarks"])
def test_repair_of_case_insensitive_keys_keeps_every_row(tmp_path: Path, redis_url: str, kind: str,
                                                         read_only: bool) -> None:
    _collation_contract(tmp_path, redis_url, SIDES[kind](tmp_path), read_only)


@pytest.mark.slow
def test_a_verify_job_that_cannot_be_done_fails_alone(tmp_path: Path, redis_url: str) -> None:
    """The repair of a keyless table is one transaction of all its rows; past
    [transport] max_envelope_bytes the producer used to stop on it at every
    start, and replication with it.  Now the job fails with the reason and
    the fix, leaves the pending jobs, and the stream goes on."""
    side = TargetServer(tmp_path)
    src = _server(tmp_path, 1)
    with verify_run(tmp_path, src, side) as run:
        run.configure(redis_url, stream="vcoll", chunk=CHUNK, transport={"max_envelope_bytes": 256 * 1024},
                      producer={"batch_max_events": 40})
        src.execute("CREATE DATABASE app", "CREATE TABLE app.blobs (who INT, body VARCHAR(1500))",
                    "CREATE TABLE app.kv (id INT PRIMARY KEY, v INT)")
        conn = src.connect("app")
        with conn.cursor() as cur:
            for t in range(20):  # 400 rows of 1 KB: 400 KB, in transactions of 20 KB
                cur.executemany("INSERT INTO blobs VALUES (%s, %s)", [(t * 20 + i, "b" * 1000) for i in range(20)])
                conn.commit()
        conn.close()
        run.start()
        wait_for(lambda: len(side.rows("blobs")) == 400, timeout=120, what="the target to catch up")
        side.execute("DELETE FROM app.blobs WHERE who = 7")

        rc, out = run.verify("--tables", "app.blobs", "--repair")
        assert rc == 2, f"the repair should have failed (rc {rc}):\n{out}\n{run.tails()}"
        assert "differs: app.blobs whole table" in out, out
        assert "no primary key" in out and "cynomys snapshot --tables app.blobs" in out, out
        state = json.loads((tmp_path / "producer-state" / "verify.json").read_text())
        assert not [j for j in state["jobs"] if j["status"] == "running"], state
        failed = [j for j in state["jobs"] if j["status"] == "failed"]
        assert len(failed) == 1 and failed[0]["repair_of"], state
        rc, out = run.verify("--status")
        assert "failed" in out and "no primary key" in out, out

        # Replication goes on, now and after a restart of the producer.
        src.execute("INSERT INTO app.kv VALUES (1, 1)")
        wait_for(lambda: len(side.rows("kv")) == 1, timeout=60, what="replication after the failed job")
        run.stop("producer")
        run.start("producer")
        src.execute("INSERT INTO app.kv VALUES (2, 2)")
        wait_for(lambda: side.tgt.execute("SELECT COUNT(*) FROM app.kv")[0][0] == 2, timeout=60,
                 what="replication after a restart")
        assert side.tgt.execute("SELECT COUNT(*) FROM app.blobs")[0][0] == 399  # left as it was
