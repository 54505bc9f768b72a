"""A real Prometheus for tests: its own process on a free loopback port, its
own config and data directory (Debian package ``prometheus``; the packaged
service is never used).  ``query`` asks its HTTP API."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Sequence

import pytest

from cynomys.sandbox.daemons import stop_daemons
from tests.servers.mariadb import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


class PrometheusServer:
    """Scrapes ``targets`` ({listen address: daemon label}) as job "cynomys"
    every ``scrape_s`` seconds and evaluates ``rule_files`` as often."""

    def __init__(self, targets: dict[str, str], *, rule_files: Sequence[Path] = (), scrape_s: float = 1.0) -> None:
        if not Path(PROMETHEUS).exists():
            pytest.skip(f"prometheus not installed ({PROMETHEUS}); apt-get install prometheus")
        self.dir = Path(tempfile.mkdtemp(prefix="cynomys-prometheus-"))
        self.port = free_port()
        rules = []
        for i, f in enumerate(rule_files):
            shutil.copy(f, self.dir / f"rules{i}.yml")
            rules.append(f"rules{i}.yml")
        ms = int(scrape_s * 1000)  # Prometheus durations are integers with a unit
        static = "\n".join(f"      - targets: [\"{t}\"]\n        labels: {{daemon: {d}}}" for t, d in targets.items())
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {ms}ms\n  evaluation_interval: {ms}ms\n"
            f"rule_files: {json.dumps(rules)}\n"
            f"scrape_configs:\n  - job_name: cynomys\n    static_configs:\n{static}\n")
        self.log = self.dir / "prometheus.log"
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=self.dir)
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout}s: {self.log.read_text()[-2000:]}")

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer."""
        qs = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{qs}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: [{"metric": {...}, "value": [ts, "text"]}]."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def stop(self) -> None:
        stop_daemons([self.proc], 30)
        shutil.rmtree(self.dir, ignore_errors=True)
