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


class MariaDBServer:
    def __init__(self, *, server_id: int = 1, base: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
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
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
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

    def source_settings(self) -> dict[str, Any]:
        """[source] keys for a Cynomys config pointing at this server."""
        return {"host": "127.0.0.1", "port": self.port, "user": REPL_USER, "password": REPL_PASSWORD}

    @property
    def url(self) -> str:
        return f"mysql://root:{ROOT_PASSWORD}@127.0.0.1:{self.port}/"
