"""`cynomys verify` on tables shaped by [shape] (DuckDB target): a table
routed one to one, filtered, cut and masked is checksummed as the target
holds it, so a clean replica verifies equal, damage is found and
``--repair`` mends it (the repair's rows shaped like any others); a table
merged with others is refused, naming why.  Initial rows come through the
snapshot, so snapshot READ rows are shaped too."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.integration.verify_harness import DuckDBSide, verify_run
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHAPE = {
    "mask_key": "verify-shape-key-0123456789",
    "route": [{"source": "app.people", "target": "app.persons"}, {"source": "app.ord_*", "target": "app.ord"}],
    "tables": {"app.people": {"exclude": ["notes"], "mask": {"email": "hash:16"}, "filter": "tenant < 3"}},
}


def test_verify_compares_shaped_rows_and_refuses_merged_tables(tmp_path: Path, redis_url: str) -> None:
    src = MariaDBServer(server_id=1).start()
    side = DuckDBSide(tmp_path)
    with verify_run(tmp_path, src, side) as run:
        src.execute("CREATE DATABASE app",
                    "CREATE TABLE app.people (id INT PRIMARY KEY, email VARCHAR(80), notes TEXT, tenant INT)",
                    "CREATE TABLE app.ord_1 (id INT PRIMARY KEY, v INT)", "CREATE TABLE app.ord_2 (id INT PRIMARY KEY, v INT)",
                    "INSERT INTO app.people SELECT seq, CONCAT('p', seq, '@x.org'), 'n', MOD(seq, 5) FROM app.seq_1_to_900",
                    "INSERT INTO app.ord_1 VALUES (1, 1), (2, 2)", "INSERT INTO app.ord_2 VALUES (1, 10)")
        # Start after the rows: the initial snapshot reads them (shaped like binlog rows).
        run.configure(redis_url, stream="verify-shape", chunk=200, shape=SHAPE,
                      source={"start": "current"})
        run.start()
        wait_for(lambda: len(side.rows("persons")) == 540 and len(side.rows("ord")) == 3, timeout=120,
                 what="the snapshot to land")
        src.execute("UPDATE app.people SET tenant = 4 WHERE id = 1", "UPDATE app.people SET tenant = 0 WHERE id = 3",
                    "DELETE FROM app.people WHERE id = 2", "UPDATE app.people SET email = 'new@x.org' WHERE id = 5")
        time.sleep(2.0)
        out = run.verify_equal("--tables", "app.people")
        # 540 rows pass the filter, one moves out, one in, one is deleted: the
        # source's rows counted as the target holds them.
        assert re.search(r"\d+ chunks, 539 source rows, 0 differ", out), out
        assert "new@x.org" not in str(side.rows("persons")) and "notes" not in out

        side.execute("DELETE FROM app.persons WHERE id = 10", "UPDATE app.persons SET tenant = 9 WHERE id = 20")
        rc, found = run.verify("--tables", "app.people")
        differs = [line for line in found.splitlines() if line.startswith("differs:")]
        assert rc == 1 and differs and all(d.startswith("differs: app.people") for d in differs), found
        rc, repair = run.verify("--tables", "app.people", "--repair")
        assert rc == 0, f"{repair}\n{run.tails()}"
        run.verify_equal("--tables", "app.people", what="a second verify after the repair")
        rows = {r[0]: r for r in side.rows("persons")}
        assert 10 in rows and rows[20][2] == 0 and 1 not in rows and 3 in rows
        rc, refused = run.verify("--tables", "app.ord_1")
        assert rc != 0 and "cannot be verified" in refused and "merged" in refused, refused
