"""A real PostgreSQL server for tests: own process, free loopback port, temp dir.

It holds the Iceberg JDBC catalog (the tables of catalog metadata pointers)
that Spark writes through Iceberg's ``JdbcCatalog`` and pyiceberg's
``SqlCatalog`` reads.  ``initdb`` + ``pg_ctl`` in a temp dir, as the other
servers of tests/servers: no system service is used.  Debian's
``postgresql`` package puts the binaries under /usr/lib/postgresql/<major>/bin,
off the PATH; the JDBC driver (``libpostgresql-jdbc-java``) is a jar under
/usr/share/java.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.servers.redis import free_port

USER = "cynomys"
PASSWORD = "catalog-secret"
#: Where Debian's libpostgresql-jdbc-java puts the driver.
JDBC_JAR = "/usr/share/java/postgresql.jar"


def _bin_dir() -> Path | None:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name))
    if dirs:
        return Path(dirs[-1])
    found = shutil.which("initdb")  # another layout: the binaries on the PATH
    return Path(os.path.realpath(found)).parent if found else None


class PostgresServer:
    """``postgres`` on 127.0.0.1:<free port>, password authentication."""

    def __init__(self, dir: Path | None = None) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None or not (bin_dir / "initdb").exists():
            pytest.skip("PostgreSQL is not installed; apt-get install postgresql")
        self.bin = bin_dir
        self._own_dir = dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="cynomys-pg-")) if dir is None else Path(dir)
        self.data = self.dir / "data"
        self.port = free_port()
        self._run_as: list[str] = []
        if os.geteuid() == 0:
            # initdb and postgres refuse to run as root: run them as a plain user.
            self._run_as = ["runuser", "-u", "postgres" if _has_user("postgres") else "nobody", "--"]
            shutil.chown(self.dir, *(("postgres", "postgres") if _has_user("postgres") else ("nobody", "nogroup")))
        self.start()

    def _cmd(self, *args: str) -> list[str]:
        return [*self._run_as, *args]

    def start(self) -> None:
        if not self.data.exists():
            pw = self.dir / "pw"
            pw.write_text(PASSWORD + "\n")
            if self._run_as:
                shutil.chown(pw, *self._owner())
            subprocess.run(self._cmd(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "-A", "scram-sha-256",
                                     f"--pwfile={pw}", "-E", "UTF8", "--no-sync"),
                           check=True, capture_output=True)
        subprocess.run(self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "pg.log"), "-w",
                                 "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                                       "-c max_connections=100", "start"),
                       check=True, capture_output=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                               capture_output=True)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL on port {self.port} not ready:\n{self.log_tail()}")

    def _owner(self) -> tuple[str, str]:
        return ("postgres", "postgres") if _has_user("postgres") else ("nobody", "nogroup")

    def create_database(self, name: str) -> str:
        """A new database; its ``jdbc:postgresql://`` URL."""
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        subprocess.run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name],
                       check=True, capture_output=True, env=env)
        return self.jdbc_url(name)

    def jdbc_url(self, database: str) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/{database}"

    def sqlalchemy_url(self, database: str) -> str:
        """For pyiceberg's SqlCatalog (SQLAlchemy with psycopg2)."""
        return f"postgresql+psycopg2://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def log_tail(self) -> str:
        try:
            return (self.dir / "pg.log").read_text()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"),
                           capture_output=True)

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session; tests make databases of their own."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()
