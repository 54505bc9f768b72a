"""A real redis-server for tests: own process, free loopback port, temp dir.

AOF with ``appendfsync always``: a write Redis acknowledged survives even a
SIGKILL, which is what the "Redis restarted mid-stream" tests rely on.

``RedisServer(replica_of=primary)`` starts a replica of ``primary``
(``--replicaof``); ``pause``/``resume`` stall a server (SIGSTOP/SIGCONT: a
replica stops taking the replication stream while its primary goes on),
``promote`` makes a replica a primary (``REPLICAOF NO ONE``), the way an
operator or Sentinel fails over.
"""
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
from typing import Any, Iterator, Sequence

import pytest
import redis

from tests.servers.tls import make_tls_files

log = logging.getLogger(__name__)

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """``redis-server`` on 127.0.0.1:<free port>, data in ``dir`` (a temp dir by default)."""

    def __init__(self, dir: Path | None = None, *, extra_args: Sequence[str] = (), password: str | None = None,
                 tls: bool = False, appendfsync: str = "always", replica_of: RedisServer | None = None) -> None:
        if not os.path.exists(REDIS_SERVER):
            pytest.skip(f"redis-server not installed ({REDIS_SERVER}); apt-get install redis-server")
        self._own_dir = dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="cynomys-redis-")) if dir is None else Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.password = password
        self.extra_args = list(extra_args)
        self.appendfsync = appendfsync
        # The primary this server follows; None once promoted (a restart must
        # not make it follow a primary that is gone).
        self.replica_of = replica_of
        self.paused = False
        # TLS only (no plain port): a CA, and a server certificate for 127.0.0.1.
        self.tls = make_tls_files(self.dir / "tls") if tls else None
        if replica_of is not None and (self.tls is not None or replica_of.tls is not None):
            raise ValueError("replicas over TLS are not supported here")  # would need --tls-replication
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls is not None:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls.ca_cert}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.server_cert),
                     "--tls-key-file", str(self.tls.server_key), "--tls-ca-cert-file", str(self.tls.ca_cert),
                     "--tls-auth-clients", "no"]
        args = [REDIS_SERVER, *ports, "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--appendfsync", self.appendfsync, "--dir", str(self.dir),
                "--logfile", str(self.dir / "redis.log"), "--daemonize", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
            if self.replica_of.password:
                args += ["--masterauth", self.replica_of.password]
        self.proc = subprocess.Popen(args + self.extra_args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()

    def client(self) -> redis.Redis:
        if self.tls is not None:
            return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5,
                               ssl=True, ssl_ca_certs=str(self.tls.ca_cert))
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def _wait_ready(self, timeout: float = 15.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err}\n{self._log_tail()}")
            try:
                with self.client() as c:
                    if c.ping():
                        return
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # includes "LOADING"
                last = exc
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} not ready after {timeout}s: {last}\n{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return (self.dir / "redis.log").read_text()[-2000:]
        except FileNotFoundError:
            return "(no log)"

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM: Redis flushes the AOF and exits)."""
        self.resume()  # a stopped process would not act on SIGTERM
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reap()

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        self.paused = False

    # -- replication ---------------------------------------------------------
    def pause(self) -> None:
        """SIGSTOP: the process stalls (a VM freeze, a long fork, swapping).
        A paused replica reads nothing more of its primary's stream: once
        the kernel's socket buffers are full it queues in the primary's
        output buffer, and what the replica has not read when the primary
        dies is lost to it (compare the replication offsets)."""
        assert self.proc is not None and self.proc.poll() is None, "redis-server is not running"
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause`` (nothing otherwise)."""
        if self.paused and self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def replication(self) -> dict[str, Any]:
        """``INFO replication`` (role, master_link_status, master_repl_offset, ...)."""
        with self.client() as c:
            return dict(c.info("replication"))

    def wait_in_sync(self, timeout: float = 30.0) -> int:
        """A replica: wait until its link is up and it holds everything its
        primary has written; returns that replication offset."""
        assert self.replica_of is not None, "not a replica"
        deadline = time.monotonic() + timeout
        mine: dict[str, Any] = {}
        while time.monotonic() < deadline:
            mine = self.replication()
            if mine.get("master_link_status") == "up":
                theirs = int(self.replica_of.replication()["master_repl_offset"])
                if int(mine.get("master_repl_offset", -1)) >= theirs:
                    return theirs
            time.sleep(0.1)
        raise RuntimeError(f"replica on port {self.port} not in sync after {timeout}s: {mine}\n{self._log_tail()}")

    def wait_offset_settled(self, quiet_s: float = 1.0, timeout: float = 30.0) -> int:
        """The replication offset once it stopped moving for ``quiet_s``
        (a replica whose primary died still applies what reached its socket)."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            off = int(self.replication().get("master_repl_offset", 0))
            if off != last:
                last, since = off, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return off
            time.sleep(0.1)
        raise RuntimeError(f"replication offset of port {self.port} still moving after {timeout}s")

    def replica_backlog_bytes(self) -> int:
        """On a primary: bytes of the replication stream written for its
        replicas but still in this process (not yet in a socket)."""
        with self.client() as c:
            return sum(int(r.get("omem", 0)) for r in c.client_list(_type="replica"))

    def promote(self) -> None:
        """``REPLICAOF NO ONE``: this replica becomes a primary with the data it has."""
        with self.client() as c:
            c.replicaof("NO", "ONE")
        self.replica_of = None

    def restart(self, *, kill: bool = False) -> None:
        """Same port, same dir: the AOF brings the data back."""
        self.kill() if kill else self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    # everysec: the shared server is for speed; tests about durability across
    # a crash start their own server with appendfsync always.
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendfsync="everysec")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()  # a test stopped it; bring it back for the next one
    with redis_server.client() as c:
        c.flushall()
    return redis_server.url
