"""An online schema change's swap (gh-ost, pt-online-schema-change) with
``include_tables`` naming only the table, on a real source, producer, applier
and MariaDB target.

The tool copies the rows into a shadow table (``_t_gho``), which the producer
does not replicate, then renames it over the table.  Every DDL reached the
target, so the target renamed its empty copy of the shadow into place: it
kept 1 row of the source's 501, without a word.  Now a table renamed into the
replicated tables is cleared on the target and read whole, once the log is
past the RENAME (snapshot/coordinator.py ``_snapshot_renamed_in``)."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from cynomys.snapshot.state import FINISHED, SnapshotStore
from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.integration.test_e2e_columnstore import _daemon
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration]

SWAP = [
    "CREATE TABLE app._t_gho LIKE app.t",
    "ALTER TABLE app._t_gho ADD COLUMN w INT DEFAULT 1",
    "INSERT INTO app._t_gho (id, v) SELECT id, v FROM app.t",
    # A change the tool copies into the shadow while it works.
    "UPDATE app.t SET v = v + 1 WHERE id <= 10",
    "UPDATE app._t_gho SET v = v + 1 WHERE id <= 10",
    "RENAME TABLE app.t TO app._t_del, app._t_gho TO app.t",
    "DROP TABLE app._t_del",
    "INSERT INTO app.t VALUES (1000, 1000, 2)",
    "UPDATE app.t SET w = 5 WHERE id = 3",
    # A keyless table, swapped the same way (ALTER TABLE ... RENAME this time).
    "CREATE TABLE app._k_new LIKE app.k",
    "INSERT INTO app._k_new SELECT * FROM app.k",
    "ALTER TABLE app.k RENAME TO app._k_old",
    "ALTER TABLE app._k_new RENAME TO app.k",
    "DROP TABLE app._k_old",
    "INSERT INTO app.k VALUES (99, 99)",
]
DIGESTS = {
    "app.t": "SELECT COUNT(*), SUM(v), SUM(w), SUM(id * v) FROM app.t",
    "app.k": "SELECT COUNT(*), SUM(a), SUM(b) FROM app.k",
}


def _digests(srv: MariaDBServer) -> dict[str, list[tuple[object, ...]]]:
    out = {}
    for table, sql in DIGESTS.items():
        try:
            out[table] = [tuple(r) for r in srv.execute(sql)]
        except Exception as exc:  # a table (or column) not there yet
            out[table] = [("missing", str(exc)[:80])]
    return out


def _tear_down(procs: list[subprocess.Popen[bytes]], *servers: MariaDBServer) -> None:
    for p in procs:
        p.kill()
        p.wait(10)
    for srv in servers:
        srv.destroy()


@pytest.mark.parametrize("kill", [None, "at-once", "after-request"])
def test_a_table_swapped_in_by_an_online_schema_change_is_snapshotted(tmp_path: Path, redis_url: str,
                                                                      kill: str | None) -> None:
    """``kill``: the producer SIGKILLed right after the swap ran on the source
    (it may not have read it yet), or as soon as it logged the request for
    app.t (the request written, perhaps not yet taken); then started again."""
    src = MariaDBServer(server_id=1).start()
    tgt = MariaDBServer(server_id=2).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        src.execute("CREATE DATABASE app", "CREATE TABLE app.t (id INT PRIMARY KEY, v INT)",
                    "INSERT INTO app.t SELECT seq, seq FROM app.seq_1_to_500",
                    "CREATE TABLE app.k (a INT, b INT)", "INSERT INTO app.k SELECT seq, seq % 7 FROM app.seq_1_to_50")
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(tmp_path / "c.toml", src,
                           source={"include_tables": ["app.t", "app.k"]},
                           producer={"id": "osc"},
                           transport={"kind": "redis", "url": redis_url, "stream": f"osc-{tmp_path.name}"},
                           security={k: str(v) for k, v in keys.items()},
                           target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"})
        procs = [_daemon(cfg, "produce", tmp_path / "producer.log"), _daemon(cfg, "apply", tmp_path / "applier.log")]
        wait_for(lambda: _digests(tgt) == _digests(src), timeout=90, what="the target to hold the tables")
        for sql in SWAP:
            src.execute(sql)
        want = _digests(src)
        assert want["app.t"][0][0] == 501 and want["app.k"][0][0] == 51
        if kill is not None:
            if kill == "after-request":
                wait_for(lambda: "app.t renamed into" in (tmp_path / "producer.log").read_text(), timeout=60,
                         what="the producer to ask for the snapshot")
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            procs[0] = _daemon(cfg, "produce", tmp_path / "producer.log")
        wait_for(lambda: _digests(tgt) == want, timeout=120,
                 what=lambda: f"the swapped-in tables on the target ({_digests(tgt)} against {want})")
        produced = (tmp_path / "producer.log").read_text()
        assert "app.t renamed into the replicated tables" in produced
        assert "app.k renamed into the replicated tables" in produced
        # Each swap snapshotted once, whatever the kill (a request asked again is the same job).
        jobs = SnapshotStore(tmp_path / "producer-state").load()
        assert sorted(j.tables[0].name for j in jobs if j.origin == "rename") == ["app.k", "app.t"]
        assert all(j.status == FINISHED for j in jobs), [(j.id, j.status, j.error) for j in jobs]
        # The shadow tables went with the source's DROPs.
        assert tgt.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'app' "
                           "ORDER BY TABLE_NAME") == [("k",), ("t",)]
    finally:
        _tear_down(procs, src, tgt)


def test_a_table_renamed_out_and_back_is_read_again_whole(tmp_path: Path, redis_url: str) -> None:
    """A keyed table renamed to a name nobody replicates, changed there, and
    renamed back: its changes meanwhile were never read from the log, and the
    snapshot of a keyed table only upserts -- the rows deleted while it was
    out stayed on the target (601 rows for the source's 401).  A keyed table
    renamed in is cleared before its first chunk, as a keyless one is."""
    src = MariaDBServer(server_id=1).start()
    tgt = MariaDBServer(server_id=2).start()
    procs: list[subprocess.Popen[bytes]] = []
    digest = "SELECT COUNT(*), SUM(v), SUM(id * v) FROM app.t"

    def on(srv: MariaDBServer) -> list[tuple[object, ...]]:
        try:
            return [tuple(r) for r in srv.execute(digest)]
        except Exception as exc:  # not created yet
            return [("missing", str(exc)[:80])]
    try:
        src.execute("CREATE DATABASE app", "CREATE TABLE app.t (id INT PRIMARY KEY, v INT)",
                    "INSERT INTO app.t SELECT seq, seq FROM app.seq_1_to_500")
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(tmp_path / "c.toml", src,
                           source={"include_tables": ["app.t"]},
                           producer={"id": "back"},
                           snapshot={"chunk_size": 100},
                           transport={"kind": "redis", "url": redis_url, "stream": f"back-{tmp_path.name}"},
                           security={k: str(v) for k, v in keys.items()},
                           target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"})
        procs = [_daemon(cfg, "produce", tmp_path / "producer.log"), _daemon(cfg, "apply", tmp_path / "applier.log")]
        wait_for(lambda: on(tgt) == on(src), timeout=90, what="the target to hold app.t")
        src.execute("RENAME TABLE app.t TO app.t_hold",
                    "DELETE FROM app.t_hold WHERE id <= 100",
                    "UPDATE app.t_hold SET v = -v WHERE id > 400",
                    "INSERT INTO app.t_hold VALUES (1001, 1)",
                    "RENAME TABLE app.t_hold TO app.t",
                    "UPDATE app.t SET v = v * 3 WHERE id BETWEEN 200 AND 210")
        want = on(src)
        assert want[0][0] == 401
        wait_for(lambda: on(tgt) == want, timeout=120, what=lambda: f"app.t on the target ({on(tgt)} against {want})")
        assert "app.t renamed into the replicated tables" in (tmp_path / "producer.log").read_text()
        jobs = SnapshotStore(tmp_path / "producer-state").load()
        assert [j.status for j in jobs if j.origin == "rename"] == [FINISHED]
    finally:
        _tear_down(procs, src, tgt)
