"""What every `cynomys verify` end-to-end test sets up: a source MariaDB, a
target side, one config, the producer and applier daemons, and the round
of damage behind the applier's back, found by verify and mended by
``--repair`` (tests/integration/test_verify.py, test_verify_collation.py).

A *side* is the target as the test reaches it: ``config`` (the [target]
section), ``extra`` (more sections), ``execute(*sql)`` behind the
applier's back, ``rows(table)`` (sorted, [] before the table exists) and
``destroy()``.
"""
from __future__ import annotations

import io
import random
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Self

import pymysql
import pytest

from cynomys.cli import main as cli_main
from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.servers.mariadb import MariaDBServer

ROOT = Path(__file__).parents[2]
#: The daemons of a run and their commands.
DAEMONS = {"producer": "produce", "applier": "apply"}


# -- the source's writers ------------------------------------------------------------
class Writers:
    """``clients`` source clients in a loop of small transactions (``txn``)
    while verify runs; every transaction's (start, seconds) is kept.  A
    deadlock, lock wait timeout or duplicate key rolls the transaction back
    and the loop goes on; any other error ends the client and is kept in
    ``errors`` for the test to surface."""

    clients = 2
    seed = 0
    pause_s = 0.01

    def __init__(self, src: MariaDBServer) -> None:
        self.src = src
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.lat: list[tuple[float, float]] = []
        self.threads = [threading.Thread(target=self._loop, args=(self.seed + n,), daemon=True)
                        for n in range(self.clients)]

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def txn(self, cur: Any, rnd: random.Random) -> None:
        """The statements of one transaction."""
        raise NotImplementedError

    def _loop(self, seed: int) -> None:
        rnd = random.Random(seed)
        conn = self.src.connect("app")
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    t0 = time.monotonic()
                    try:
                        cur.execute("BEGIN")
                        self.txn(cur, rnd)
                        cur.execute("COMMIT")
                        self.lat.append((t0, time.monotonic() - t0))
                    except (pymysql.err.OperationalError, pymysql.err.IntegrityError) as exc:
                        if exc.args[0] not in (1213, 1205, 1062):
                            raise
                        cur.execute("ROLLBACK")
                    time.sleep(self.pause_s)
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)
        finally:
            conn.close()


# -- the targets ----------------------------------------------------------------------
class MariaDBSide:
    """A second MariaDB with the ColumnStore target code (engine InnoDB)."""

    def __init__(self, tmp_path: Path, server: MariaDBServer | None = None) -> None:
        self.tgt = server or MariaDBServer(server_id=2).start()
        self.config: dict[str, Any] = {"kind": "columnstore", "url": self.tgt.url, "engine": "InnoDB"}
        self.extra: dict[str, Any] = {}

    def execute(self, *sql: str) -> None:
        self.tgt.execute(*sql)

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        try:
            return sorted(tuple(r) for r in self.tgt.execute(f"SELECT * FROM app.{table}"))
        except pymysql.err.ProgrammingError:
            return []  # not created yet

    def destroy(self) -> None:
        self.tgt.destroy()


class DuckDBSide:
    """A DuckDB file; the applier holds it only during a flush."""

    def __init__(self, tmp_path: Path) -> None:
        self.duckdb = pytest.importorskip("duckdb", reason="the duckdb extra is not installed")
        self.path = tmp_path / "replica.duckdb"
        self.config = {"kind": "duckdb", "url": str(self.path)}
        self.extra: dict[str, Any] = {}

    def _with(self, use: Callable[[Any], None], read_only: bool = False) -> None:
        def once() -> bool:
            try:
                conn = self.duckdb.connect(str(self.path), read_only=read_only)
            except self.duckdb.Error:
                return False  # the applier holds the file for a flush
            try:
                use(conn)
            finally:
                conn.close()
            return True

        wait_for(once, timeout=60, what="the DuckDB file to be free")

    def execute(self, *sql: str) -> None:
        def run(conn: Any) -> None:
            for s in sql:
                conn.execute(s)

        self._with(run)

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []

        def read(conn: Any) -> None:
            try:
                got[:] = [tuple(r) for r in conn.execute(f"SELECT * FROM app.{table}").fetchall()]
            except self.duckdb.CatalogException:
                got[:] = []  # not created yet

        self._with(read, read_only=True)
        return sorted(got)

    def destroy(self) -> None:
        pass


# -- a run ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """What a verify found and what its repair said."""

    report: str          # the verify's output
    differs: list[str]   # its `differs:` lines
    repair: str          # the repair's output


class VerifyRun:
    """The config and the daemons of one test; see ``verify_run``."""

    def __init__(self, tmp_path: Path, src: MariaDBServer, side: Any) -> None:
        self.tmp_path = tmp_path
        self.src = src
        self.side = side
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cfg = tmp_path / "c.toml"

    def configure(self, redis_url: str, *, stream: str, chunk: int, **overrides: dict[str, Any]) -> None:
        """The one config file of both daemons and the command (``overrides``:
        more keys per section)."""
        keys = generate_keys(self.tmp_path / "keys", rsa_bits=2048)
        start = "{}:{}".format(*self.src.execute("SHOW MASTER STATUS")[0][:2])
        sections: dict[str, dict[str, Any]] = {
            "source": {"include_tables": ["app.*"], "start": start},
            "producer": {"id": "p1", "batch_max_events": 500, "batch_max_delay_ms": 100},
            "transport": {"url": redis_url, "stream": f"{stream}-{self.tmp_path.name}"},
            "security": {k: str(v) for k, v in keys.items()},
            "applier": {"buffer_rows": 2000, "max_delay_ms": 300, "consumer_name": "a1"},
            "snapshot": {"chunk_size": chunk},
            "target": self.side.config, **self.side.extra,
        }
        for name, keys_ in overrides.items():
            sections.setdefault(name, {}).update(keys_)
        write_config(self.cfg, self.src, **sections)
        if hasattr(self.side, "cfg_path"):
            self.side.cfg_path = self.cfg

    def start(self, *names: str) -> None:
        """Start daemons (default: both), logging to logs/<name>.log."""
        for name in names or tuple(DAEMONS):
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", DAEMONS[name], "-c", str(self.cfg)],
                cwd=ROOT, stdout=(self.logs / f"{name}.log").open("ab"), stderr=subprocess.STDOUT)

    def stop(self, *names: str) -> None:
        """Each daemon (default: all) is still running, and exits 0 on SIGTERM."""
        for name in names or tuple(self.procs):
            p = self.procs[name]
            assert p.poll() is None, f"{name} exited:\n{self.tails()}"
            p.send_signal(signal.SIGTERM)
            assert p.wait(120) == 0, self.tails()

    def tails(self) -> str:
        return "\n".join(f"--- {n}:\n{(self.logs / f'{n}.log').read_text()[-6000:]}" for n in self.procs)

    def verify(self, *extra: str) -> tuple[int, str]:
        """`cynomys verify` (exit code, output)."""
        out = io.StringIO()
        with redirect_stdout(out):
            rc = cli_main(["verify", "-c", str(self.cfg), "--no-progress", "--timeout", "240", *extra])
        print(f"$ cynomys verify {' '.join(extra)} -> {rc}\n{out.getvalue()}")
        return rc, out.getvalue()

    def verify_equal(self, *extra: str, what: str = "a clean replica") -> str:
        rc, out = self.verify(*extra)
        assert rc == 0, f"{what} did not verify equal (rc {rc}):\n{out}\n{self.tails()}"
        return out

    def find_and_repair(self, damage: Callable[[], None]) -> Found:
        """``damage`` the target behind the applier's back: verify finds it
        (exit 1), ``--repair`` mends it (exit 0)."""
        damage()
        rc, out = self.verify()
        assert rc == 1, f"the damage was not found (rc {rc}):\n{out}\n{self.tails()}"
        differs = [line for line in out.splitlines() if line.startswith("differs:")]
        rc, repair = self.verify("--repair")
        assert rc == 0, f"--repair did not end equal (rc {rc}):\n{repair}\n{self.tails()}"
        return Found(out, differs, repair)

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()


@contextmanager
def verify_run(tmp_path: Path, src: MariaDBServer, side: Any) -> Iterator[VerifyRun]:
    """A run on ``src`` and ``side``: the daemons stop cleanly at the end of
    the block (each still running, exit 0 on SIGTERM); whatever happens,
    nothing is left running and both servers go."""
    run: VerifyRun | None = None
    try:
        run = VerifyRun(tmp_path, src, side)
        yield run
        run.stop()
    finally:
        if run is not None:
            run.kill()
        src.destroy()
        side.destroy()
