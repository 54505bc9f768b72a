"""Redis losing writes it acknowledged, under an HA producer, on real processes.

With ``[producer] ha = true`` the producer's checkpoint lives in Redis next
to the stream (cynomys/producer/ha.py).  A Redis that loses its last writes rolls the
producer's state, the stream, its sequence hash and the applier's consumer
group back together -- but not the target, where the applier already
committed envelopes Redis no longer knows.  The producer then reads that
stretch of the binlog again, cuts it into batches differently (batches are
cut by time) and sends them under envelope numbers the applier already took.

Two ways Redis loses acknowledged writes, each driven here on real MariaDB,
Redis and daemon processes while 4 clients write:

* the host of a Redis with ``appendfsync everysec`` crashes: what was not
  fsynced yet (up to about a second) is gone.  A SIGKILL of the process
  alone loses nothing -- Redis write()s the AOF before it replies, and the
  kernel's page cache outlives the process (measured: the first kill below
  is a plain SIGKILL and rolls nothing back).  The host crash is emulated by
  cutting the AOF back to the size it had ``lose_s`` before the kill, which
  is what the last fsync had made durable;
* a failover to a replica that lags: the replica stalls (SIGSTOP) while the
  primary goes on, until its link is full and the replication stream queues
  in the primary's memory; the primary dies (SIGKILL) and what the replica
  had not read dies with it (the replication offsets say how much); the
  replica is promoted (``REPLICAOF NO ONE``) and the operator repoints the
  daemons at it (new ``[transport] url``, daemons restarted).

Pass: every target table equals its source table row by row, OR a daemon
stopped (exit code not 0) with a one-line error naming the problem (the
envelopes it is about, with their numbers).  A difference while both daemons run and report that
they caught up is a silent loss: the failure this file is about.  Each test
prints ``OUTCOME: ...`` (run with ``-s``) and the evidence that the fault
really rolled Redis back.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cynomys.transport.keys import generate_keys
from tests.helpers import write_config
from tests.integration.test_e2e_columnstore import (
    TABLES,
    MariaDBSide,
    _daemon,
    _keep_artifacts,
    _reports_caught_up,
)
from tests.integration.test_ha import HaPair, _paced_writer
from tests.servers.mariadb import MariaDBServer
from tests.servers.redis import RedisServer

pytestmark = [pytest.mark.integration]

PID = "p1"
# A short lease keeps a lost term (Redis down longer than the lease) to
# seconds; test_ha checks the default's bound.
LEASE_MS = 2000
# Batches cut by time while the writers write (30 ms: a few transactions
# each), by size when the producer reads a stretch of the binlog again after
# a rollback (200 events, often inside a transaction): the envelopes sent
# again under taken numbers then span other changes than the ones the
# applier took under those numbers -- the case of the bug report.
BATCHING = {"batch_max_events": 200, "batch_max_delay_ms": 30}
# Both daemons running, their reports caught up, and the same difference for
# this long: nothing is going to repair it -- a silent loss.
SILENT_S = 15.0
# The last line `cynomys` prints before exiting on an error (cynomys/cli.py).
_ERROR_LINE = re.compile(r"^cynomys: (?:terminal|configuration|transient) error: .+$", re.M)
# "Specific": names the envelopes (or the lease term) it is about, with their
# numbers -- "envelopes 7..9 of producer 'p1' are missing", "envelope 141
# ... re-sends a number already taken ... resumes at <position>".  A target
# refusing a row (a duplicate key) is a symptom, and its hint ("widen the
# column") sends the operator the wrong way: not specific.
_NAMES_PROBLEM = re.compile(r"\benvelopes?\b[^.;(]*\d|\bfencing token \d", re.I)


# -- the rig: source, target, daemons, writers --------------------------------
class Rig:
    """A source MariaDB, the target (MariaDBSide: ColumnStore code, InnoDB),
    an HA producer pair (leader and standby, tests/integration/test_ha.py)
    and one applier as subprocesses, and 4 paced writers on the source.
    ``start_daemons`` may run again with another Redis URL (a failover): each
    generation writes its logs into a folder of its own."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.src = MariaDBServer(server_id=1).start()
        try:
            self.side = MariaDBSide(self.src)
        except BaseException:
            self.src.destroy()
            raise
        try:
            self.keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
            self.start_at = "{}:{}".format(*self.src.execute("SHOW MASTER STATUS")[0][:2])
        except BaseException:
            self.src.destroy()
            self.side.destroy()
            raise
        self.stream = f"rf-{tmp_path.name}"
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.generation = 0
        self.cfg = tmp_path / "c.toml"
        self.log_dir = self.logs
        self.producers: HaPair | None = None
        self.applier: subprocess.Popen[bytes] | None = None
        self.stop_writes = threading.Event()
        self.done = [0]
        self.errors: list[BaseException] = []
        self.writers: list[threading.Thread] = []

    def start_daemons(self, redis_url: str) -> None:
        """Write a config for ``redis_url`` and start the producers (leader
        first, then the standby) and the applier on it."""
        self.generation += 1
        self.cfg = self.tmp_path / ("c.toml" if self.generation == 1 else f"c{self.generation}.toml")
        self.log_dir = self.logs if self.generation == 1 else self.logs / f"gen{self.generation}"
        self.log_dir.mkdir(exist_ok=True)
        write_config(
            self.cfg, self.src,
            source={"include_tables": ["app.*"], "start": self.start_at},
            producer={"id": PID, **BATCHING, "ha": True, "lease_ms": LEASE_MS},
            transport={"url": redis_url, "stream": self.stream},
            security={k: str(v) for k, v in self.keys.items()},
            applier={"buffer_rows": 2000, "max_delay_ms": 300, "consumer_name": "a1"},
            target=self.side.config,
        )
        self.producers = HaPair(self.cfg, self.log_dir, redis_url)
        self.applier = _daemon(self.cfg, "apply", self.log_dir / "applier.log")

    def daemons(self) -> dict[str, tuple[subprocess.Popen[bytes], Path]]:
        """This generation's daemons: name -> (process, log)."""
        out: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        if self.producers is not None:
            out.update({f"producer-{n}": pl for n, pl in self.producers.p.items()})
        if self.applier is not None:
            out["applier"] = (self.applier, self.log_dir / "applier.log")
        return out

    def stop_daemons(self, grace: float) -> dict[str, int | str]:
        """SIGTERM, then SIGKILL after ``grace``; each daemon's exit code."""
        procs = self.daemons()
        for p, _ in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes: dict[str, int | str] = {}
        deadline = time.monotonic() + grace
        for name, (p, _) in procs.items():
            try:
                codes[name] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes[name] = f"SIGKILLed after {grace:.0f}s"
        if self.producers is not None:
            self.producers.r.close()
        return codes

    def start_writers(self) -> None:
        self.src.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()])
        self.writers = [threading.Thread(target=_paced_writer, args=(self.src, self.stop_writes, s, self.done,
                                                                     self.errors)) for s in range(4)]
        for w in self.writers:
            w.start()

    def stop_writers(self) -> None:
        self.stop_writes.set()
        for w in self.writers:
            w.join()

    def writes_done(self) -> int:
        """Transactions the writers committed; fails on a writer's error."""
        assert not self.errors, self.errors
        assert self.done[0] > 200, "the workload did not run"
        return self.done[0]

    def applied_seq(self) -> int:
        """The last envelope the applier committed to the target (its report)."""
        try:
            return int(json.loads((self.tmp_path / "applier-state" / "applier.json").read_text()).get("seq", 0))
        except (OSError, ValueError):
            return 0

    def close(self) -> None:
        self.stop_writers()
        for p, _ in self.daemons().values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.producers is not None:
            self.producers.r.close()
        self.src.destroy()
        self.side.destroy()


def _redis_view(server: RedisServer, stream: str) -> dict[str, Any]:
    """What Redis holds of producer PID: the stream's sequence hash (the
    last envelope number it accepted), the HA state's sequence and
    checkpoint, the stream's length and the fencing counter."""
    with server.client() as c:
        raw = c.get(f"{stream}:state:{PID}")
        state = json.loads(json.loads(raw)["state"]) if raw else {}
        return {"stream_seq": int(c.hget(f"{stream}:seq", PID) or 0), "state_seq": int(state.get("seq", 0)),
                "pending": (state.get("pending") or {}).get("seq"), "checkpoint": state.get("checkpoint"),
                "entries": int(c.xlen(stream)), "fence": int(c.get(f"{stream}:fence:{PID}") or 0)}


# -- how a run ends --------------------------------------------------------------
@dataclass
class Outcome:
    kind: str  # "equal", "stopped" (a daemon exited), "silent-loss", "timeout"
    after_s: float  # seconds after the writers stopped
    diff: dict[str, Any]
    rows: dict[str, dict[str, Any]]  # per table: rows only in the source / only in the target
    stopped: dict[str, tuple[int | None, list[str]]] = field(default_factory=dict)  # daemon -> (exit code, error lines)


def _row_sets(rig: Rig) -> dict[str, dict[str, Any]]:
    """Per table: how many rows only the source has, and only the target."""
    out: dict[str, dict[str, Any]] = {}
    for t in TABLES:
        q = f"SELECT * FROM app.{t}"
        try:
            a, b = set(rig.src.execute(q)), set(rig.side.tgt.execute(q))
        except Exception as exc:  # a report; the outcome is decided elsewhere
            out[t] = {"error": str(exc)}
            continue
        if a != b:
            out[t] = {"source": len(a), "target": len(b), "only_source": len(a - b), "only_target": len(b - a)}
    return out


def _settle(rig: Rig, timeout: float) -> Outcome:
    """After the writers stopped: wait until the target equals the source,
    a daemon exits, or the difference stays put while both daemons run and
    report they took everything (a silent loss)."""
    t0 = time.monotonic()
    last: dict[str, Any] | None = None
    since = 0.0
    diff: dict[str, Any] = {}
    while time.monotonic() - t0 < timeout:
        if any(p.poll() is not None for p, _ in rig.daemons().values()):
            time.sleep(2)  # the other daemon may stop on the same cause: let it have its say too
            stopped = {n: (p.poll(), _ERROR_LINE.findall(log.read_text(errors="replace")))
                       for n, (p, log) in rig.daemons().items() if p.poll() is not None}
            return Outcome("stopped", time.monotonic() - t0, rig.side.diff(rig.cfg), _row_sets(rig), stopped)
        if not _reports_caught_up(rig.tmp_path, rig.src):
            last = None
            time.sleep(0.5)
            continue
        diff = rig.side.diff(rig.cfg)
        if not any(diff.values()):
            return Outcome("equal", time.monotonic() - t0, diff, {})
        if diff != last:
            last, since = diff, time.monotonic()
        elif time.monotonic() - since >= SILENT_S:
            return Outcome("silent-loss", time.monotonic() - t0, diff, _row_sets(rig))
        time.sleep(1.0)
    return Outcome("timeout", timeout, rig.side.diff(rig.cfg), _row_sets(rig))


def _log_counts(rig: Rig) -> dict[str, int]:
    """Lines in all daemons' logs (every generation) that tell what the
    daemons made of the rollback."""
    text = {"producer": "", "applier": ""}
    for log in rig.logs.rglob("*.log"):
        text["applier" if log.name.startswith("applier") else "producer"] += log.read_text(errors="replace")
    wanted = {
        "producer": ["resuming from checkpoint", "leading: acquired", "lost the HA lease",
                     "did not reach the transport", "reached the transport before", "already holds envelope",
                     "transient error"],
        "applier": ["delivered again", "sends envelope", "sends again", "new incarnation", "dead-lettered",
                    "rejected envelope", "transient error", "new HA lease term"],
    }
    return {f"{side}: {w}": text[side].count(w) for side, ws in wanted.items() for w in ws}


def _judge(rig: Rig, outcome: Outcome, done: int, *, fence_went_back: bool) -> None:
    """The pass criterion: equal, or a daemon stopped with a specific error
    line.  ``fence_went_back``: whether Redis came back with a lower fencing
    counter (an error saying so is right only then)."""
    counts = _log_counts(rig)
    print(f"{done} source transactions; daemons' log lines: {counts}")
    if outcome.kind == "equal":
        print(f"OUTCOME: equal -- every target table equals the source {outcome.after_s:.1f}s after the writers "
              "stopped")
        codes = rig.stop_daemons(grace=60)
        assert all(c == 0 for c in codes.values()), f"daemons did not stop cleanly on SIGTERM: {codes}"
        return
    if outcome.kind == "stopped":
        print(f"OUTCOME: a daemon stopped {outcome.after_s:.1f}s after the writers stopped: "
              f"{json.dumps(outcome.stopped)}; target vs source then: {outcome.rows} {outcome.diff}")
        wrong = []
        for name, (code, lines) in outcome.stopped.items():
            tail = "\n".join((rig.daemons()[name][1]).read_text(errors="replace").splitlines()[-30:])
            if code in (0, None):
                wrong.append(f"{name} exited 0 without being asked to:\n{tail}")
            elif not lines:
                wrong.append(f"{name} exited {code} without an error line:\n{tail}")
            elif not any(_NAMES_PROBLEM.search(li) for li in lines):
                wrong.append(f"{name} stopped with an error that does not name the problem: {lines}\n{tail}")
            elif not fence_went_back and any("went backwards" in li for li in lines):
                wrong.append(f"{name} stopped saying the fencing counter went backwards, which it did not (the "
                             f"counter is the same before and after every fault): {lines}\n{tail}")
        if wrong:
            kept = _keep_artifacts(rig.tmp_path, rig.cfg, outcome.diff)
            print(f"OUTCOME is a FAILURE: a stop that does not name the problem; artifacts in {kept}")
            raise AssertionError("\n".join(wrong) + f"\nartifacts kept in {kept}")
        return
    kept = _keep_artifacts(rig.tmp_path, rig.cfg, outcome.diff)
    tails = "".join(f"--- {n}:\n{log.read_text(errors='replace')[-3000:]}\n" for n, (_, log) in rig.daemons().items())
    what = ("SILENT LOSS: both daemons run and report they caught up, and the target differs from the source"
            if outcome.kind == "silent-loss" else "TIMEOUT: the target never caught up and no daemon stopped")
    print(f"OUTCOME: {what}: rows {outcome.rows}; {outcome.diff}; artifacts in {kept}")
    raise AssertionError(f"{what}\nrows: {outcome.rows}\ndiff: {outcome.diff}\nartifacts kept in {kept}\n{tails}")


# -- 1: the host of Redis crashes, losing what was not fsynced ----------------------
class AofTail:
    """Samples, every 20 ms, the size of the AOF's incremental file, so that
    after a SIGKILL the file can be cut back to the size it had at an
    earlier moment: the emulated page cache a host crash takes with it.
    (The AOF is never rewritten meanwhile: --auto-aof-rewrite-percentage 0.)"""

    def __init__(self, server: RedisServer) -> None:
        self.dir = server.dir / "appendonlydir"
        self.samples: deque[tuple[float, str, int]] = deque(maxlen=1000)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aof-sampler", daemon=True)
        self._thread.start()

    def incr_file(self) -> Path:
        """The incremental file Redis appends to (the manifest's last ``type i``)."""
        lines = (self.dir / "appendonly.aof.manifest").read_text().split("\n")
        return self.dir / [ln.split()[1] for ln in lines if ln.endswith("type i")][-1]

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                f = self.incr_file()
                self.samples.append((time.monotonic(), f.name, f.stat().st_size))
            except (OSError, IndexError):
                continue  # between a kill and a restart

    def cut(self, at: float) -> tuple[int, int]:
        """Truncate the file (Redis is dead) to its size at monotonic ``at``;
        returns (size at the kill, size kept)."""
        f = self.incr_file()
        size = f.stat().st_size
        older = [s for t, name, s in self.samples if t <= at and name == f.name]
        keep = older[-1] if older else size
        os.truncate(f, keep)
        return size, keep

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Crash:
    n: int
    lose_s: float  # the un-fsynced window lost (0: a plain SIGKILL)
    down_s: float
    applied: int  # the applier's committed envelope at the kill
    before: dict[str, Any]
    after: dict[str, Any]
    aof: tuple[int, int] | None  # (bytes at the kill, bytes kept)

    @property
    def rolled_back(self) -> bool:
        return (self.after["stream_seq"] < self.before["stream_seq"]
                or self.after["state_seq"] < self.before["state_seq"])

    @property
    def forgotten(self) -> int:
        """Envelope numbers the applier committed that Redis no longer knows:
        the producer sends other changes under them again."""
        return max(0, self.applied - self.after["stream_seq"])

    def line(self) -> str:
        kind = "plain SIGKILL" if not self.lose_s else f"host crash, last {self.lose_s:.2f}s of the AOF lost"
        aof = f", AOF {self.aof[0]} -> {self.aof[1]} bytes" if self.aof else ""
        return (f"crash {self.n} ({kind}{aof}, down {self.down_s:.1f}s): stream seq {self.before['stream_seq']} -> "
                f"{self.after['stream_seq']}, state seq {self.before['state_seq']} -> {self.after['state_seq']}, "
                f"entries {self.before['entries']} -> {self.after['entries']}, fence {self.before['fence']} -> "
                f"{self.after['fence']}; applier had committed {self.applied}: "
                f"{'ROLLED BACK' if self.rolled_back else 'nothing lost'}"
                + (f", {self.forgotten} committed envelope numbers forgotten" if self.forgotten else ""))


@pytest.mark.slow
def test_redis_host_crashes_4_times_and_comes_back_from_its_aof(tmp_path: Path) -> None:
    """Redis (AOF, appendfsync everysec) SIGKILLed 4 times, a few seconds
    apart, and restarted from its AOF on the same port and dir after 0.5-3 s
    (both daemons ride through: transient errors).  The first kill is a
    plain SIGKILL; the next three lose the AOF's last 0.5-1 s, as a host
    crash does with everysec."""
    redis_srv = RedisServer(tmp_path / "redis", appendfsync="everysec",
                            extra_args=["--auto-aof-rewrite-percentage", "0"])
    rig: Rig | None = None
    tail: AofTail | None = None
    try:
        rig = Rig(tmp_path)
        rig.start_daemons(redis_srv.url)
        tail = AofTail(redis_srv)
        rig.start_writers()
        rnd = random.Random(int(os.environ.get("CYNOMYS_FAULT_SEED", "7")))
        crashes: list[Crash] = []
        started = time.monotonic()
        try:
            for n, lose in enumerate([False, True, True, True], 1):
                time.sleep(rnd.uniform(4.0, 7.0))
                if any(p.poll() is not None for p, _ in rig.daemons().values()):
                    break  # a daemon stopped on an earlier crash: judged below
                applied, before = rig.applied_seq(), _redis_view(redis_srv, rig.stream)
                killed_at = time.monotonic()
                redis_srv.kill()
                lose_s = rnd.uniform(0.5, 1.0) if lose else 0.0
                aof = tail.cut(killed_at - lose_s) if lose else None
                time.sleep(rnd.uniform(0.5, 3.0))  # a crashed host takes a moment to come back
                redis_srv.start()  # same port, same dir: the AOF is loaded
                down = time.monotonic() - killed_at
                crashes.append(Crash(n, lose_s, down, applied, before, _redis_view(redis_srv, rig.stream), aof))
                print(crashes[-1].line())
            time.sleep(5)  # writes go on after the last crash
        finally:
            rig.stop_writers()
        done = rig.writes_done()
        write_s = time.monotonic() - started
        outcome = _settle(rig, timeout=110)
        print(f"\n{write_s:.0f}s of writing, {len(crashes)} Redis crashes:\n" + "\n".join(c.line() for c in crashes))
        assert crashes, f"a daemon stopped before the first crash: {outcome.stopped}"
        assert not crashes[0].rolled_back, \
            "a plain SIGKILL lost acknowledged writes (expected: the page cache keeps them)"
        if outcome.kind == "stopped" and not any(c.rolled_back for c in crashes):
            # Redis down and back with everything it acknowledged: the
            # daemons must ride through that (transient errors), not stop.
            kept = _keep_artifacts(rig.tmp_path, rig.cfg, outcome.diff)
            print(f"OUTCOME: a daemon stopped after an outage that lost nothing: {json.dumps(outcome.stopped)}; "
                  f"artifacts in {kept}")
            raise AssertionError(f"a daemon stopped on a Redis outage that lost nothing (it must ride through): "
                                 f"{outcome.stopped}\n" + "\n".join(c.line() for c in crashes)
                                 + f"\nartifacts kept in {kept}")
        # The fault happened: Redis came back without writes it had
        # acknowledged, and the producer's state with it.
        assert any(c.rolled_back for c in crashes), "no crash rolled Redis back: the test did not test that"
        _judge(rig, outcome, done, fence_went_back=any(c.after["fence"] < c.before["fence"] for c in crashes))
    finally:
        if tail is not None:
            tail.close()
        if rig is not None:
            rig.close()
        redis_srv.close()


# -- 2: failover to a replica that lags --------------------------------------------
def _fill_replica_link(primary: RedisServer) -> int:
    """While the replica is paused: write unrelated 1 MB values (another
    tenant's bulk load) until the kernel's socket buffers towards the
    replica are full and the stream queues in the primary's memory; from
    then on every write (the daemons') waits there.  Returns MB written."""
    with primary.client() as c:
        for mb in range(64):
            if primary.replica_backlog_bytes() > 1 << 20:
                return mb
            c.set(f"ballast:{mb}", os.urandom(1 << 20))
            time.sleep(0.02)
    raise AssertionError("64 MB written and the link to the paused replica is still not full")


@pytest.mark.slow
def test_failover_to_a_replica_that_lags(tmp_path: Path) -> None:
    """The daemons use a primary with a replica.  The replica stalls
    (SIGSTOP) while the writes flow; the primary dies (SIGKILL) with the
    replication stream the replica had not taken; the replica resumes, is
    promoted, and the daemons are restarted with its URL.  Writes go on."""
    primary = RedisServer(tmp_path / "redis-primary", appendfsync="everysec")
    replica = RedisServer(tmp_path / "redis-replica", appendfsync="everysec", replica_of=primary)
    rig: Rig | None = None
    try:
        replica.wait_in_sync()
        rig = Rig(tmp_path)
        rig.start_daemons(primary.url)
        rig.start_writers()
        started = time.monotonic()
        try:
            time.sleep(6)
            offset_at_pause = int(primary.replication()["master_repl_offset"])
            replica.pause()
            ballast_mb = _fill_replica_link(primary)
            time.sleep(3)  # the daemons' writes of these seconds reach only the primary
            for name, (p, log) in rig.daemons().items():
                assert p.poll() is None, f"{name} exited {p.returncode} before the failover:\n{log.read_text()[-3000:]}"
            applied, before = rig.applied_seq(), _redis_view(primary, rig.stream)
            offset_at_kill = int(primary.replication()["master_repl_offset"])
            queued = primary.replica_backlog_bytes()
            primary.kill()
            replica.resume()
            offset_promoted = replica.wait_offset_settled()  # it still applies what reached its socket
            replica.promote()
            after = _redis_view(replica, rig.stream)
            # The operator repoints the daemons: they were retrying the dead
            # primary; stop them and start them on the promoted replica.
            codes = rig.stop_daemons(grace=30)
            rig.start_daemons(replica.url)
            time.sleep(10)  # writes go on against the new primary
        finally:
            rig.stop_writers()
        done = rig.writes_done()
        write_s = time.monotonic() - started
        evidence = (f"replica paused at replication offset {offset_at_pause}, {ballast_mb} MB of another tenant's "
                    f"writes and 3 s of the daemons' after it ({queued} bytes queued in the primary at the kill); "
                    f"replication offset {offset_at_kill} on the primary at the kill, {offset_promoted} on the "
                    f"promoted replica ({offset_at_kill - offset_promoted} bytes lost); "
                    f"stream seq {before['stream_seq']} -> "
                    f"{after['stream_seq']}, state seq {before['state_seq']} -> {after['state_seq']}, entries "
                    f"{before['entries']} -> {after['entries']}, fence {before['fence']} -> {after['fence']}; "
                    f"applier had committed {applied} "
                    f"({max(0, applied - after['stream_seq'])} committed envelope numbers forgotten); "
                    f"daemons stopped for the repointing with {codes}")
        outcome = _settle(rig, timeout=110)
        print(f"\n{write_s:.0f}s of writing; {evidence}")
        assert offset_promoted < offset_at_kill and after["stream_seq"] < before["stream_seq"], \
            f"the promoted replica did not lag: the test did not test that ({evidence})"
        _judge(rig, outcome, done, fence_went_back=after["fence"] < before["fence"])
    finally:
        if rig is not None:
            rig.close()
        replica.close()
        primary.close()
