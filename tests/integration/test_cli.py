"""The command line as a user runs it: keygen, config check, produce, tail,
status, and a clean exit on SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for, write_config
from tests.servers.mariadb import REPLICATION_ARGS, MariaDBServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "cynomys.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"cynomys {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def test_keygen_writes_private_keys_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = cli("keygen", "--out", str(tmp_path / "k"), "--bits", "2048").stdout
    assert "applier_private_key" in out and "producer_public_key" in out
    for name in ("applier_private.pem", "producer_private.pem"):
        assert stat.S_IMODE(os.stat(tmp_path / "k" / name).st_mode) == 0o600
    again = cli("keygen", "--out", str(tmp_path / "k"), check=False)
    assert again.returncode == 2 and "--force" in again.stderr + again.stdout


def test_config_check_names_the_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[producer]\nbatch_max_event = 5\n")
    p = cli("config", "check", "-c", str(bad), check=False)
    assert p.returncode == 2 and "unknown key [producer] batch_max_event" in p.stderr and str(bad) in p.stderr


def test_produce_tail_status_and_sigterm(mariadb: MariaDBServer, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    cli("keygen", "--out", str(keys), "--bits", "2048")
    start = "{}:{}".format(*mariadb.execute("SHOW MASTER STATUS")[0][:2])
    cfg = write_config(tmp_path / "c.toml", mariadb, source={"include_tables": ["clidb.*"], "start": start},
                       transport={"kind": "file", "path": str(tmp_path / "t.bin")},
                       security={k: str(keys / f"{k.replace('_key', '')}.pem") for k in
                                 ("applier_public_key", "producer_private_key", "applier_private_key",
                                  "producer_public_key")},
                       target={"kind": "columnstore", "url": "mysql://nobody:x@127.0.0.1:1/"})
    assert "OK" in cli("config", "check", "-c", str(cfg)).stdout
    mariadb.execute("CREATE DATABASE clidb", "CREATE TABLE clidb.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    "INSERT INTO clidb.t VALUES (1, 'it''s'), (2, 'b')", "DELETE FROM clidb.t WHERE id = 2")
    daemon = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "produce", "-c", str(cfg)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = tmp_path / "producer-state" / "producer.json"
    wait_for(lambda: state.exists() and json.loads(state.read_text())["seq"] >= 1, 60, "a batch to be shipped")
    time.sleep(0.5)
    daemon.send_signal(signal.SIGTERM)
    out, _ = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, out
    assert "peak RSS" in out
    tail = cli("tail", "-c", str(cfg), "-n", "10").stdout
    assert "INSERT INTO `clidb`.`t` (`id`, `v`) VALUES\n  (1, 'it''s')" in tail
    assert "CREATE TABLE clidb.t" in tail
    status = json.loads(cli("status", "-c", str(cfg), "--json").stdout)
    assert status["source"]["reachable"] is True
    assert status["producer"]["checkpoint"] and status["producer"]["sequence"] >= 1
    # status never opens the target (unreachable here): the applier's part is its own report file.
    assert status["applier"]["state"].startswith("no report yet") and "error" not in status["applier"]
    assert status["transport"]["kind"] == "file"


_KEY_NAMES = ("applier_public_key", "producer_private_key", "applier_private_key", "producer_public_key")


def _produce(tmp_path: Path, server: MariaDBServer, name: str, *args: str,
             **sections: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``cynomys produce`` on ``server`` with a state, a file transport and
    keys of its own (``name``); a target it never reaches."""
    keys = tmp_path / "keys"
    if not keys.exists():
        cli("keygen", "--out", str(keys), "--bits", "2048")
    cfg = write_config(tmp_path / f"{name}.toml", server, producer={"state_dir": str(tmp_path / f"{name}-state")},
                       transport={"kind": "file", "path": str(tmp_path / f"{name}.bin")},
                       security={k: str(keys / f"{k.replace('_key', '')}.pem") for k in _KEY_NAMES},
                       target={"kind": "columnstore", "url": "mysql://nobody:x@127.0.0.1:1/"}, **sections)
    return cli("produce", *args, "-c", str(cfg), check=False)


def _one_error(p: subprocess.CompletedProcess[str]) -> str:
    """The one ``cynomys:`` line of a daemon that stopped at start."""
    errors = [line for line in p.stderr.splitlines() if line.startswith("cynomys:")]
    assert p.returncode != 0 and "Traceback" not in p.stderr and len(errors) == 1, p.stderr
    return errors[0]


def _stopped_by(tmp_path: Path, cfg: Path, server: MariaDBServer, sql: str) -> str:
    """The one error line of a producer daemon (``cfg``) that ``sql``, run on
    the source once the daemon reads the log, stops."""
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", "produce", "-c",
                                   str(cfg)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
    try:
        # Past its start checks (which would judge the table by information_schema): reading the log.
        wait_for(lambda: "resuming from checkpoint" in log.read_text() or "no checkpoint" in log.read_text(), 60,
                 lambda: f"the producer to run: {log.read_text()}")
        server.execute(sql)
        daemon.wait(60)
    finally:
        daemon.kill()
    return _one_error(subprocess.CompletedProcess(daemon.args, daemon.returncode, "", log.read_text()))


@pytest.mark.parametrize("section", ["include_tables", "exclude_tables", "shape"])
def test_produce_refuses_a_table_pattern_in_another_case(mariadb: MariaDBServer, tmp_path: Path,
                                                          section: str) -> None:
    """``include_tables = ["casedb.Orders"]`` for a table the server spells
    ``orders`` (every name, with lower_case_table_names = 1) replicated
    nothing and said nothing; an exclude pattern so spelled replicated the
    table it meant to keep out, and a [shape.tables] entry so spelled did not
    apply.  The producer now stops at start with one line naming the spelling
    to write."""
    mariadb.execute("CREATE DATABASE IF NOT EXISTS casedb", "CREATE TABLE IF NOT EXISTS casedb.orders (id INT PRIMARY KEY)")
    patterns = {"include_tables": ["casedb.Orders"]} if section == "include_tables" else {
        "include_tables": ["casedb.*"], "exclude_tables": ["CaseDB.orders"] if section == "exclude_tables" else []}
    shape = {"tables": {"casedb.Orders": {"exclude": ["id"]}}} if section == "shape" else {}
    error = _one_error(_produce(tmp_path, mariadb, "c", source=patterns, shape=shape))
    assert section in error and "casedb.orders does in another case" in error, error
    assert "fix: write " in error and "casedb.orders" in error.split("fix: write ")[1], error
    assert not (tmp_path / "c.bin").exists() or (tmp_path / "c.bin").stat().st_size == 0


def test_produce_stops_when_a_table_a_pattern_names_in_another_case_is_created(mariadb: MariaDBServer,
                                                                               tmp_path: Path) -> None:
    """A pattern that matches no table at start is only warned about; the
    table created later in another case stops the producer then."""
    mariadb.execute("CREATE DATABASE IF NOT EXISTS laterdb")
    assert _produce(tmp_path, mariadb, "later", "--once", source={"include_tables": ["laterdb.Orders"]}).returncode == 0
    error = _stopped_by(tmp_path, tmp_path / "later.toml", mariadb, "CREATE TABLE laterdb.orders (id INT PRIMARY KEY)")
    assert "include_tables pattern 'laterdb.Orders' matches no table on the source, but laterdb.orders does" in error


def test_produce_refuses_a_replica_that_does_not_log_what_it_replicates(tmp_path: Path) -> None:
    """A MariaDB replica (log_slave_updates is OFF by default) pointed at as
    [source]: its binlog holds none of the primary's changes, and the
    producer replicated nothing, without a word.  It now stops at start
    naming the setting; the same replica with log_slave_updates=ON is read,
    and the primary's rows come through it."""
    primary = MariaDBServer(server_id=1, extra_args=REPLICATION_ARGS).start()
    replica = MariaDBServer(server_id=2, extra_args=("--gtid-strict-mode=ON",)).start()
    logging_replica = MariaDBServer(server_id=3, extra_args=REPLICATION_ARGS).start()
    try:
        replica.make_replica_of(primary)
        logging_replica.make_replica_of(primary)
        primary.execute("CREATE DATABASE repdb", "CREATE TABLE repdb.t (id INT PRIMARY KEY)",
                        "INSERT INTO repdb.t VALUES (1), (2)")
        for srv in (replica, logging_replica):
            wait_for(lambda s=srv: s.execute("SELECT COUNT(*) FROM information_schema.TABLES "
                                             "WHERE TABLE_SCHEMA = 'repdb'") == [(1,)] and
                     s.execute("SELECT COUNT(*) FROM repdb.t") == [(2,)], 60, "the replica to apply")
        source = {"include_tables": ["repdb.*"], "start": "earliest"}
        error = _one_error(_produce(tmp_path, replica, "off", "--once", source=source))
        assert "is a replica with log_slave_updates=OFF" in error
        assert "fix: set log_slave_updates=ON in the server's config file" in error, error
        ok = _produce(tmp_path, logging_replica, "on", "--once", source=source)
        assert ok.returncode == 0, ok.stderr
        tail = cli("tail", "-c", str(tmp_path / "on.toml"), "-n", "10").stdout
        assert "INSERT INTO `repdb`.`t`" in tail, tail
    finally:
        for srv in (primary, replica, logging_replica):
            srv.destroy()


def test_produce_refuses_a_source_whose_binlog_filters_leave_a_replicated_database_out(tmp_path: Path) -> None:
    """A source started with binlog-do-db = shop writes nothing of crm's
    tables to its binlog: with include_tables = crm.*, the producer read
    none of their changes and said nothing.  It now stops at start naming
    the option; with include_tables = shop.* it runs."""
    srv = MariaDBServer(server_id=1, extra_args=("--binlog-do-db=shop", "--binlog-do-db=cynomys_meta")).start()
    try:
        srv.execute("CREATE DATABASE shop", "CREATE DATABASE crm", "CREATE TABLE shop.o (id INT PRIMARY KEY)",
                    "CREATE TABLE crm.c (id INT PRIMARY KEY)")
        error = _one_error(_produce(tmp_path, srv, "crm", "--once", source={"include_tables": ["crm.*"]}))
        assert "does not write database crm to its binlog (binlog_do_db = shop,cynomys_meta)" in error, error
        ok = _produce(tmp_path, srv, "shop", "--once", source={"include_tables": ["shop.*"]})
        assert ok.returncode == 0, ok.stderr
    finally:
        srv.destroy()


def test_config_check_runs_the_producers_start_checks(mariadb: MariaDBServer, tmp_path: Path) -> None:
    """`cynomys config check` against a reachable source refuses what the
    producer would refuse at start (here a pattern in another case), and
    says it checked the source otherwise."""
    mariadb.execute("CREATE DATABASE IF NOT EXISTS casedb", "CREATE TABLE IF NOT EXISTS casedb.orders (id INT PRIMARY KEY)")
    bad = write_config(tmp_path / "bad.toml", mariadb, source={"include_tables": ["casedb.Orders"]})
    p = cli("config", "check", "-c", str(bad), check=False)
    assert p.returncode != 0 and "casedb.orders does in another case" in p.stderr, p.stderr
    good = write_config(tmp_path / "good.toml", mariadb, source={"include_tables": ["casedb.orders"]})
    out = cli("config", "check", "-c", str(good)).stdout
    assert "binlog settings and table patterns checked" in out, out
    assert "OK" in cli("config", "check", "--offline", "-c", str(bad)).stdout


def test_produce_refuses_a_replicated_table_whose_foreign_key_cascades(tmp_path: Path) -> None:
    """A child table ``ON DELETE CASCADE``: MariaDB writes only the parent's
    row event (checked below on this very server: the child's rows went, the
    binlog holds no event of them), so the target kept the child's rows.  The
    producer refuses such a table at start; allowed, it runs; a DDL that adds
    such a key while it runs stops it."""
    srv = MariaDBServer(server_id=1).start()
    try:
        srv.execute("CREATE DATABASE fk", "CREATE TABLE fk.p (id INT PRIMARY KEY)",
                    "CREATE TABLE fk.c (id INT PRIMARY KEY, pid INT, CONSTRAINT fk_p FOREIGN KEY (pid) "
                    "REFERENCES fk.p (id) ON DELETE CASCADE)", "INSERT INTO fk.p VALUES (1), (2)",
                    "INSERT INTO fk.c VALUES (10, 1), (11, 1), (20, 2)")
        binlog, pos = srv.execute("SHOW MASTER STATUS")[0][:2]
        srv.execute("DELETE FROM fk.p WHERE id = 1")
        assert srv.execute("SELECT id FROM fk.c") == [(20,)]
        kinds = [r[2] for r in srv.execute(f"SHOW BINLOG EVENTS IN '{binlog}' FROM {pos}")]
        assert kinds.count("Delete_rows_v1") == 1  # the parent's: the cascade wrote no row event

        error = _one_error(_produce(tmp_path, srv, "refused", "--once", source={"include_tables": ["fk.*"]}))
        assert "fk.c foreign key fk_p REFERENCES fk.p ON DELETE CASCADE: the source does not write" in error, error
        assert "cascading_foreign_keys = \"allow\"" in error
        # Only the parent replicated: nothing a cascade changes is replicated.
        assert _produce(tmp_path, srv, "parent", "--once", source={"include_tables": ["fk.p"]}).returncode == 0
        allowed = {"include_tables": ["fk.*"], "cascading_foreign_keys": "allow"}
        assert _produce(tmp_path, srv, "allowed", "--once", source=allowed).returncode == 0
        # A DDL adding one while the producer runs stops it at that statement.
        cfg = tmp_path / "parent.toml"
        text = cfg.read_text().replace('include_tables = ["fk.p"]', 'include_tables = ["fk.p", "fk.d"]')
        cfg.write_text(text.replace('start = "earliest"', 'start = "current"'))
        error = _stopped_by(tmp_path, cfg, srv, "CREATE TABLE fk.d (id INT PRIMARY KEY, cid INT, FOREIGN KEY (cid) "
                            "REFERENCES fk.c (id) ON UPDATE CASCADE)")
        assert "a DDL gives fk.d a foreign key with an ON DELETE/ON UPDATE action" in error, error
    finally:
        srv.destroy()
