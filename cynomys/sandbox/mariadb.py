"""A throwaway MariaDB server for the sample job and the tests.

Started as a plain process (no container engine here) in a temp datadir on a
free loopback port, with the binlog settings Cynomys needs.  ``kill()`` /
``start()`` simulate a crash of the source; the datadir survives."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pymysql

from cynomys.sandbox.daemons import stop_daemons

log = logging.getLogger(__name__)

ROOT_PASSWORD = "root-secret"
REPL_USER = "cynomys"
REPL_PASSWORD = "cynomys-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _find(binary: str, *candidates: str) -> str:
    for c in (shutil.which(binary), *candidates):
        if c and os.path.exists(c):
            return c
    raise RuntimeError(f"{binary} not found: install the Debian package mariadb-server")


#: Server options that make MariaDB compress every binlog event it can
#: (QUERY and ROWS events longer than 10 bytes: nearly all of them).
BINLOG_COMPRESS = ("--log-bin-compress=ON", "--log-bin-compress-min-len=10")


class MariaDBServer:
    """``binlog_compress``: write compressed binlog events (BINLOG_COMPRESS)."""

    def __init__(self, *, server_id: int = 1, base: str | None = None, extra_args: tuple[str, ...] = (),
                 binlog_compress: bool = False) -> None:
        if binlog_compress:
            extra_args = (*BINLOG_COMPRESS, *extra_args)
        self.server_id = server_id
        self.dir = Path(base or tempfile.mkdtemp(prefix="cynomys-mariadb-"))
        self.datadir = self.dir / "data"
        self.port = free_port()
        self.socket = str(self.dir / "mysqld.sock")
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle -------------------------------------------------------
    def start(self) -> MariaDBServer:
        fresh = not self.datadir.exists()
        if fresh:
            self._install_db()
        args = [
            _find("mariadbd", "/usr/sbin/mariadbd"), "--no-defaults", "--user=root",
            f"--datadir={self.datadir}", f"--socket={self.socket}", f"--port={self.port}",
            "--bind-address=127.0.0.1", f"--pid-file={self.dir / 'mysqld.pid'}",
            f"--log-error={self.dir / 'error.log'}",
            "--log-bin=mysql-bin", "--binlog-format=ROW", "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL", f"--server-id={self.server_id}",
            "--innodb-buffer-pool-size=256M", "--innodb-log-file-size=256M",
            "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0",
            "--skip-name-resolve", "--max-connections=200", "--local-infile=1",
            "--max-allowed-packet=256M", "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci", "--default-time-zone=+00:00",
            "--performance-schema=OFF", "--log-basename=mysql",
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()
        if fresh:
            self._bootstrap()
        return self

    def _install_db(self, attempts: int = 3) -> None:
        """mariadb-install-db, retried: on a loaded machine its bootstrap
        server now and then fails to start (seen when several servers start
        at once); a second try in a clean datadir succeeds."""
        for attempt in range(1, attempts + 1):
            if self.datadir.exists():
                shutil.rmtree(self.datadir)
            self.datadir.mkdir(parents=True)
            done = subprocess.run(
                [_find("mariadb-install-db", "/usr/bin/mariadb-install-db"), "--no-defaults",
                 f"--datadir={self.datadir}", "--user=root", "--auth-root-authentication-method=normal",
                 "--skip-test-db"],
                capture_output=True,
            )
            if done.returncode == 0:
                return
            output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
            log.warning("mariadb-install-db failed (attempt %d of %d, exit %d): %s", attempt, attempts,
                        done.returncode, output)
            time.sleep(attempt)
        raise RuntimeError(f"mariadb-install-db failed {attempts} times in {self.datadir}:\n{output}")

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited early; see {self.dir / 'error.log'}:\n" + self.error_log()[-3000:])
            try:
                pymysql.connect(unix_socket=self.socket, user="root", password=ROOT_PASSWORD, connect_timeout=1).close()
                return
            except pymysql.err.OperationalError as exc:
                if exc.args and exc.args[0] == 1045:  # fresh datadir: root has no password yet
                    try:
                        pymysql.connect(unix_socket=self.socket, user="root", connect_timeout=1).close()
                        return
                    except pymysql.err.OperationalError:
                        pass
            time.sleep(0.2)
        raise RuntimeError(f"mariadbd did not become ready in {timeout}s; see {self.dir / 'error.log'}")

    def _bootstrap(self) -> None:
        conn = pymysql.connect(unix_socket=self.socket, user="root", autocommit=True)
        with conn.cursor() as cur:
            for sql in (
                f"ALTER USER 'root'@'localhost' IDENTIFIED BY '{ROOT_PASSWORD}'",
                f"CREATE OR REPLACE USER 'root'@'127.0.0.1' IDENTIFIED BY '{ROOT_PASSWORD}'",
                "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
                f"CREATE OR REPLACE USER '{REPL_USER}'@'127.0.0.1' IDENTIFIED BY '{REPL_PASSWORD}'",
                f"GRANT ALL ON *.* TO '{REPL_USER}'@'127.0.0.1'",
                "FLUSH PRIVILEGES",
            ):
                cur.execute(sql)
        conn.close()

    def error_log(self) -> str:
        p = self.dir / "error.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self) -> None:
        if self.proc:
            stop_daemons([self.proc], 30)
        self.proc = None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------
    def connect(self, database: str | None = None, **kw: Any) -> pymysql.connections.Connection:
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", password=ROOT_PASSWORD,
                               database=database, autocommit=True, charset="utf8mb4", **kw)

    def execute(self, *sqls: str, database: str | None = None) -> list[tuple[Any, ...]]:
        """Run statements on one connection; returns the rows of the last."""
        conn = self.connect(database)
        try:
            rows: list[tuple[Any, ...]] = []
            with conn.cursor() as cur:
                for sql in sqls:
                    cur.execute(sql)
                    rows = list(cur.fetchall())
            return rows
        finally:
            conn.close()

    # -- replication (GTID) ----------------------------------------------
    def gtid_binlog_pos(self) -> str:
        """``@@gtid_binlog_pos``: the last GTID per domain in this server's binlog."""
        return str(self.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")

    def make_replica_of(self, primary: MariaDBServer, *, user: str = REPL_USER,
                        password: str = REPL_PASSWORD) -> None:
        """Replicate ``primary`` by GTID (MASTER_USE_GTID = slave_pos), from
        the primary's current GTID position.

        Meant for two servers provisioned alike (two fresh sandboxes, or this
        one restored from a copy of the primary taken at its current GTID):
        what the primary wrote before is taken to be here already.  This
        server's own binlog and GTID history are reset first -- each sandbox
        binlogs its own bootstrap (users, grants) under its own server id,
        and with gtid_strict_mode those GTIDs would clash with the primary's
        in domain 0 -- so after this its binlog starts again at file 1."""
        start = primary.gtid_binlog_pos()
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("STOP SLAVE")  # only a warning when none runs
                cur.execute("RESET SLAVE ALL")
                cur.execute("RESET MASTER")
                cur.execute("SET GLOBAL gtid_slave_pos = %s", (start,))
                cur.execute("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %s, MASTER_USER = %s, "
                            "MASTER_PASSWORD = %s, MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
                            (primary.port, user, password))
                cur.execute("START SLAVE")
        finally:
            conn.close()

    def slave_status(self) -> dict[str, Any]:
        """SHOW SLAVE STATUS as a dict ({} when this server replicates nothing)."""
        conn = self.connect()
        try:
            with conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute("SHOW SLAVE STATUS")
                row = cur.fetchone()
            return dict(row) if row else {}
        finally:
            conn.close()

    def wait_caught_up(self, primary: MariaDBServer, timeout: float = 60.0) -> str:
        """Wait until this replica has applied everything ``primary`` has
        binlogged so far; returns that GTID position.  Raises when the
        replica's threads stopped on an error or the timeout passed."""
        target = primary.gtid_binlog_pos()
        deadline = time.monotonic() + timeout
        while True:
            # MASTER_GTID_WAIT in short slices: a replication thread that
            # stopped on an error is reported at once, not after the timeout.
            conn = self.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT MASTER_GTID_WAIT(%s, 1)", (target,))
                    row = cur.fetchone()
            finally:
                conn.close()
            if row is not None and row[0] == 0:
                return target
            st = self.slave_status()
            if st and (st.get("Slave_IO_Running") == "No" or st.get("Slave_SQL_Running") == "No"):
                raise RuntimeError(f"replica {self.port} stopped replicating from {primary.port}: IO error "
                                   f"{st.get('Last_IO_Error')!r}, SQL error {st.get('Last_SQL_Error')!r}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"replica {self.port} did not reach GTID {target} of {primary.port} in "
                                   f"{timeout}s (it is at {self.execute('SELECT @@GLOBAL.gtid_slave_pos')[0][0]})")

    def promote(self) -> str:
        """Make this replica a primary (after its primary died): stop
        replicating, forget the primary, take writes.  Returns its GTID
        position, where the writes of its own begin."""
        self.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF")
        return self.gtid_binlog_pos()

    def source_settings(self) -> dict[str, Any]:
        """[source] keys for a Cynomys config pointing at this server."""
        return {"host": "127.0.0.1", "port": self.port, "user": REPL_USER, "password": REPL_PASSWORD}

    def binlog_end(self) -> str:
        """The binlog's end as a config ``start`` ("file:pos"): a config
        starting here sees only what is written after this call."""
        return "{}:{}".format(*self.execute("SHOW MASTER STATUS")[0][:2])

    def source_toml(self, include_tables: str, start: str, heartbeat_s: float | None = None) -> str:
        """The [source] section of a Cynomys config file replicating this
        server's ``include_tables`` (one pattern) from ``start``."""
        beat = "" if heartbeat_s is None else f"\nheartbeat_s = {heartbeat_s}"
        return (f'[source]\nhost = "127.0.0.1"\nport = {self.port}\nuser = "{REPL_USER}"\n'
                f'password = "{REPL_PASSWORD}"\ninclude_tables = ["{include_tables}"]\nstart = "{start}"{beat}')

    @property
    def url(self) -> str:
        return f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{self.port}/"
