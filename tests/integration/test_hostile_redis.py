"""Redis keys changed by an operator or an attacker under an HA producer,
with the real daemons: each ends with a one-line error naming the problem
and the fix, never with rows lost silently -- and the documented fix brings
the target back to equal.

* ``DEL S:state:P S:lease:P`` (the HA state lost): the next leader used to
  start as a new incarnation at ``[source] start = "current"``, numbering on,
  and everything between the old checkpoint and "current" was gone.
* ``DEL S:fence:P S:lease:P`` (the fencing counter reset): the next term got
  token 1 and a running applier dead-lettered every genuine envelope as
  ``fenced``.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis

from cynomys.core.config import load_config
from cynomys.transport.keys import generate_keys
from tests.helpers import wait_for, write_config
from tests.integration.test_e2e_columnstore import ROOT, MariaDBSide, _daemon
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration]


class Rig:
    """A source, a target, an HA producer and an applier on one Redis stream."""

    def __init__(self, tmp_path: Path, redis_url: str) -> None:
        self.tmp = tmp_path
        self.src = MariaDBServer(server_id=1).start()
        self.side = MariaDBSide(self.src)
        self.stream = f"hostile-{tmp_path.name}"
        self.r = redis.Redis.from_url(redis_url)
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.src.execute("CREATE DATABASE app", "CREATE TABLE app.t (id INT PRIMARY KEY, v INT)")
        here = "{}:{}".format(*self.src.execute("SHOW MASTER STATUS")[0][:2])
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        self.sections: dict[str, dict[str, Any]] = dict(
            source={"include_tables": ["app.*"], "start": here},
            producer={"id": "p1", "batch_max_events": 50, "batch_max_delay_ms": 50, "ha": True, "lease_ms": 1500},
            transport={"url": redis_url, "stream": self.stream},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 100, "max_delay_ms": 200, "consumer_name": "a1"},
            target=self.side.config)
        self.cfg = write_config(tmp_path / "c.toml", self.src, **self.sections)
        self.n = 0

    def start(self, name: str, *extra: str) -> None:
        cmd = "produce" if name == "producer" else "apply"
        if extra:
            log = (self.logs / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(self.cfg), *extra],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        else:
            self.procs[name] = _daemon(self.cfg, cmd, self.logs / f"{name}.log")

    def insert(self, count: int) -> None:
        for _ in range(count):
            self.n += 1
            self.src.execute(f"INSERT INTO app.t VALUES ({self.n}, {self.n})")

    def equal(self) -> bool:
        q = "SELECT id, v FROM app.t ORDER BY id"
        try:
            return self.src.execute(q) == self.side.tgt.execute(q)
        except Exception:
            return False

    def wait_equal(self, what: str) -> None:
        wait_for(self.equal, 90, what)

    def exited_with(self, name: str, timeout: float = 60) -> str:
        """Wait for daemon ``name`` to exit non-zero; its error line."""
        code = self.procs[name].wait(timeout)
        text = (self.logs / f"{name}.log").read_text()
        assert code != 0, f"{name} exited 0:\n{text[-3000:]}"
        errors = [line for line in text.splitlines() if "terminal error" in line or line.startswith("cynomys:")]
        assert errors, f"{name} exited {code} without an error line:\n{text[-3000:]}"
        return errors[-1]

    def applied_position(self) -> str:
        st = self.side.tgt.execute("SELECT file, pos FROM cynomys_state.applied WHERE producer_id = 'p1'")
        return "{}:{}".format(*st[0])

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        self.r.close()
        self.src.destroy()
        self.side.destroy()


@pytest.fixture
def rig(tmp_path: Path, redis_url: str) -> Iterator[Rig]:
    r = Rig(tmp_path, redis_url)
    try:
        yield r
    finally:
        r.close()


@pytest.mark.slow
def test_ha_state_deleted_stops_the_producer_and_a_fresh_start_where_the_target_is_ends_equal(rig: Rig) -> None:
    rig.start("producer")
    rig.start("applier")
    rig.insert(20)
    rig.wait_equal("the first rows to replicate")
    rig.r.delete(f"{rig.stream}:state:p1", f"{rig.stream}:lease:p1")
    rig.insert(10)  # written while the state is gone: must not be lost
    line = rig.exited_with("producer")
    assert "is empty, but the transport" in line and rig.stream in line, line
    assert not rig.equal()
    # The operator's fix: start anew where the target is.
    rig.sections["source"]["start"] = rig.applied_position()
    rig.cfg = write_config(rig.tmp / "c.toml", rig.src, **rig.sections)
    rig.start("producer", "--fresh-start")
    rig.insert(5)
    rig.wait_equal("the target to equal the source after --fresh-start")
    assert rig.procs["applier"].poll() is None
    assert "new incarnation" in (rig.logs / "applier.log").read_text()


@pytest.mark.slow
def test_ha_state_deleted_and_the_stream_too_a_fresh_producer_past_the_target_stops_the_applier(rig: Rig) -> None:
    """Everything of the producer in Redis gone: the new leader starts at
    "current" numbering from 1; the applier knows the old incarnation and
    position from the target and stops, naming both places."""
    rig.sections["source"]["start"] = "current"
    rig.cfg = write_config(rig.tmp / "c.toml", rig.src, **rig.sections)
    rig.start("producer")
    rig.start("applier")
    wait_for(lambda: rig.r.exists(f"{rig.stream}:state:p1") == 1, 60, "the producer's first state")
    rig.insert(20)
    rig.wait_equal("the first rows to replicate")
    rig.procs["producer"].send_signal(signal.SIGKILL)
    rig.procs["producer"].wait()
    rig.insert(10)  # while no producer runs: lost to a producer starting at "current"
    for key in rig.r.scan_iter(f"{rig.stream}*"):
        if not key.endswith(b":dead"):
            rig.r.delete(key)
    rig.start("producer")
    wait_for(lambda: "announced" in (rig.logs / "producer.log").read_text(), 60, "the new producer to start")
    rig.insert(5)
    line = rig.exited_with("applier", 90)
    assert "started anew" in line and "past what the target holds" in line, line
    assert rig.side.tgt.execute("SELECT COUNT(*) FROM app.t") == [(20,)]


@pytest.mark.slow
def test_fence_counter_reset_stops_the_producer_and_raising_it_ends_equal(rig: Rig) -> None:
    rig.start("producer")
    rig.start("applier")
    rig.insert(20)
    rig.wait_equal("the first rows to replicate")
    fence_key = f"{rig.stream}:fence:p1"
    token = int(rig.r.get(fence_key) or 0)
    assert token >= 1
    rig.r.delete(fence_key, f"{rig.stream}:lease:p1")
    rig.insert(10)
    line = rig.exited_with("producer")
    assert "fencing counter in Redis went backwards" in line, line
    assert rig.procs["applier"].poll() is None  # it dead-lettered nothing and waits
    dead = rig.r.xrange(f"{rig.stream}:dead")
    assert not dead, dead
    rig.r.set(fence_key, token + 5)  # the fix the error names
    rig.start("producer")
    rig.insert(5)
    rig.wait_equal("the target to equal the source after the counter was raised")
    status = json.loads(subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "--json", "-c", str(rig.cfg)],
                                       cwd=ROOT, capture_output=True, check=True).stdout)
    assert status["producer"]["ha"]["fencing_token"] > token + 5, status["producer"]["ha"]
    assert load_config(rig.cfg, env={}).producer.ha
