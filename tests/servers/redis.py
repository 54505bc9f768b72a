"""A real redis-server for tests: own process, free loopback port, temp dir.

AOF with ``appendfsync always``: a write Redis acknowledged survives even a
SIGKILL, which is what the "Redis restarted mid-stream" tests rely on.
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
from typing import Iterator, Sequence

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
                 tls: bool = False, appendfsync: str = "always") -> None:
        if not os.path.exists(REDIS_SERVER):
            pytest.skip(f"redis-server not installed ({REDIS_SERVER}); apt-get install redis-server")
        self._own_dir = dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="cynomys-redis-")) if dir is None else Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.password = password
        self.extra_args = list(extra_args)
        self.appendfsync = appendfsync
        # TLS only (no plain port): a CA, and a server certificate for 127.0.0.1.
        self.tls = make_tls_files(self.dir / "tls") if tls else None
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
