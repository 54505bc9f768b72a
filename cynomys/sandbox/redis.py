"""A throwaway redis-server on a free loopback port (sample job)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from cynomys.sandbox.mariadb import free_port


class RedisProcess:
    def __init__(self, base: str | None = None) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise RuntimeError("redis-server not found: install the Debian package redis-server")
        self.binary = binary
        self.dir = Path(base or tempfile.mkdtemp(prefix="cynomys-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server did not start; see {self.dir / 'redis.log'}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.proc = None
