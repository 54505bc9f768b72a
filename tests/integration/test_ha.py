"""HA producer (cynomys/producer/ha.py): lease, fencing, takeover, on real servers.

* the lease and the fenced writes against a real Redis (fast);
* the e2e harness of test_e2e_columnstore with a leader and a standby: the
  leader SIGKILLed 10 times while 4 clients write; each takeover within the
  bound, the target equal to the source, no transaction shipped twice;
* a leader SIGSTOPped past its lease: the standby takes over; SIGCONT: the
  old leader writes nothing (its state write is fenced), stands by again;
  an envelope of its term replayed into the stream is rejected by the
  applier as ``fenced``.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

from cynomys.core.config import TransportConfig, load_config
from cynomys.core.errors import LeaseLost
from cynomys.transport.envelope import peek_header
from cynomys.transport.keys import generate_keys
from cynomys.transport.lease import RedisLease
from cynomys.transport.redis_bus import RedisPubSubPublisher, RedisStreamPublisher
from tests.helpers import transport_batches, wait_for, write_config
from tests.integration.test_e2e_columnstore import (
    ROOT,
    TABLES,
    MariaDBSide,
    _reports_caught_up,
    _run,
    _small_txn,
    _write_loop,
)
from tests.servers.mariadb import MariaDBServer
from tests.servers.redis import free_port

pytestmark = [pytest.mark.integration]


def _paced_writer(src: MariaDBServer, stop: threading.Event, seed: int, done: list[int],
                  errors: list[BaseException]) -> None:
    """The busy-source workload (small transactions, a large one cut into
    fragments now and then) at up to ~100 transactions/s per writer: the
    takeovers are the point here, and at full speed the 2-core box spends
    minutes catching up after the writers stop."""
    def txn(cur: Any, rnd: random.Random, seed: int) -> None:
        time.sleep(0.01)  # right after BEGIN: no locks held yet
        _small_txn(cur, rnd, seed)

    _write_loop(src, stop, seed, done, errors, txn)


# -- lease and fencing against a real Redis ----------------------------------
def test_lease_terms_tokens_and_fenced_writes(redis_url: str) -> None:
    tcfg = TransportConfig(url=redis_url, stream="ha-unit")
    a = RedisLease(tcfg, "p1", "host:1:a", lease_ms=400)
    b = RedisLease(tcfg, "p1", "host:2:b", lease_ms=400)
    pub = RedisStreamPublisher(tcfg)
    try:
        assert a.acquire() == 1
        assert b.acquire() is None, "a held lease was handed out twice"
        assert b.holder() == "1:host:1:a"
        a.save_state({"seq": 1})
        pub.fence(a.key, a.value)
        pub.publish("p1", 1, b"env-1")
        assert a.renew()
        time.sleep(0.6)  # a "pauses" past its lease
        assert b.acquire() == 2, "the successor's token must be larger than every earlier one"
        assert not a.renew()
        with pytest.raises(LeaseLost):
            a.save_state({"seq": 99})
        with pytest.raises(LeaseLost):
            pub.publish("p1", 2, b"env-2-from-the-deposed-leader")
        assert b.load_state() == {"seq": 1}, "the deposed leader's state write went through"
        b.save_state({"seq": 1, "by": "b"})
        pub.fence(b.key, b.value)
        pub.publish("p1", 2, b"env-2")
        with redis.Redis.from_url(redis_url) as r:
            assert [f[b"env"] for _, f in r.xrange("ha-unit")] == [b"env-1", b"env-2"]
            assert int(r.hget("ha-unit:seq", "p1") or 0) == 2
        assert b.release() and a.acquire() == 3  # a clean release hands over at once
        assert not b.release(), "released someone else's lease"
        # pub/sub mode is fenced the same way
        ps = RedisPubSubPublisher(TransportConfig(url=redis_url, stream="ha-unit-ps", mode="pubsub"))
        try:
            ps.fence(b.key, b.value)
            with pytest.raises(LeaseLost):
                ps.publish("p1", 1, b"env-1")
            ps.fence(a.key, a.value)
            ps.publish("p1", 1, b"env-1")
            assert ps.last_sequence("p1") == 1
        finally:
            ps.close()
    finally:
        for x in (a, b, pub):
            x.close()


def test_state_in_redis_is_signed_and_a_forgery_is_refused(tmp_path: Path, redis_url: str) -> None:
    from cynomys.core.errors import TerminalError
    from cynomys.producer import ProducerState
    from cynomys.producer.ha import RedisStateStore
    from cynomys.transport.envelope import Sealer
    from cynomys.transport.keys import load_private_key, load_public_key

    k = generate_keys(tmp_path / "keys", rsa_bits=2048)
    sealer = Sealer("p1", "ha-sig", load_public_key(k["applier_public_key"]),
                    load_private_key(k["producer_private_key"]), rotate_envelopes=10, rotate_seconds=60)
    lease = RedisLease(TransportConfig(url=redis_url, stream="ha-sig"), "p1", "host:1:a", lease_ms=5000)
    try:
        assert lease.acquire() == 1
        store = RedisStateStore(lease, tmp_path / "state" / "producer.json", sealer)
        store.save(ProducerState(seq=41, incarnation="inc-1"))
        again = store.load()
        assert (again.seq, again.incarnation) == (41, "inc-1")
        with redis.Redis.from_url(redis_url) as r:
            stored = r.get(lease.state_key)
            assert stored is not None
            # A Redis writer moves the checkpoint on: the signature no longer fits.
            r.set(lease.state_key, stored.replace(b'\\"seq\\": 41', b'\\"seq\\": 4100'))
            assert r.get(lease.state_key) != stored
        with pytest.raises(TerminalError, match="not signed by this producer's key"):
            store.load()
        assert '"ha"' in (tmp_path / "state" / "producer.json").read_text()  # the mirror, marked
    finally:
        lease.close()


def test_a_deposed_leader_restarting_its_producer_stands_by_and_does_not_stop(tmp_path: Path,
                                                                             redis_url: str) -> None:
    """Seen under Redis host crashes: a leader's Producer hit a transient
    error (Redis down), its lease expired meanwhile, a standby took the next
    token and saved the state under it; the old term's Producer, restarted
    by run_with_retry, read that state.  Its token is lower than the state's
    -- not because the counter went backwards, but because it is deposed:
    it must stand by (LeaseLost), not stop the daemon.  With the lease still
    its own, a lower token is a counter that went backwards: terminal."""
    from types import SimpleNamespace

    from cynomys.core.errors import TerminalError
    from cynomys.core.model import Batch, Position
    from cynomys.producer import Producer, ProducerState
    from cynomys.producer.ha import RedisStateStore
    from cynomys.transport.channel import SealedSink

    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    no_source: Any = SimpleNamespace(port=1)  # _recover_pending runs before the source is opened
    cfg = load_config(write_config(tmp_path / "c.toml", no_source, producer={"id": "p1", "ha": True, "lease_ms": 300},
                                   transport={"url": redis_url, "stream": "ha-deposed"},
                                   security={k: str(v) for k, v in keys.items()}), env={})
    tcfg = cfg.transport
    a, b = (RedisLease(tcfg, "p1", f"host:{n}", lease_ms=300) for n in ("a", "b"))
    sinks: list[SealedSink] = []
    try:
        def term(lease: RedisLease) -> tuple[SealedSink, RedisStateStore]:
            token = lease.acquire()
            assert token is not None
            sink = SealedSink(cfg)
            sinks.append(sink)
            sink.fence(token, lease.key, lease.value)
            return sink, RedisStateStore(lease, tmp_path / "mirror.json", sink.sealer)

        sink_a, store_a = term(a)
        Producer(cfg, sink_a, store=store_a)._recover_pending()  # a leads, token 1, saves its state
        time.sleep(0.5)  # a's renewer is stuck (Redis down): the lease expires
        sink_b, store_b = term(b)
        assert sink_b.fence_token == 2
        Producer(cfg, sink_b, store=store_b)._recover_pending()  # b works under token 2
        assert store_a.load().fence == 2
        with pytest.raises(LeaseLost, match="no longer this term's"):
            Producer(cfg, sink_a, store=store_a)._recover_pending()  # a's term, restarted
        # The counter reset while b holds its lease: b's next term gets token 1.
        with redis.Redis.from_url(redis_url) as r:
            r.delete(b.fence_key, b.key)
        sink_b2, store_b2 = term(b)
        assert sink_b2.fence_token == 1
        with pytest.raises(TerminalError, match="fencing counter in Redis went backwards") as err:
            Producer(cfg, sink_b2, store=store_b2)._recover_pending()
        assert not isinstance(err.value, LeaseLost)
        # The race a moment earlier: a's restarted Producer read its own
        # term's state before the standby saved one, and the transport after
        # the standby published: the transport is ahead of the state.
        early = Producer(cfg, sink_a, store=store_a)
        early.state = ProducerState(seq=0, fence=1, term=sink_a.fence_term, checkpoint=Position("f", 4))
        sink_b2.send(1, Batch("p1", (), Position("f", 4)), threading.Event())
        with pytest.raises(LeaseLost, match="no longer this term's"):
            early._recover_pending()
    finally:
        for s in sinks:
            s.close()
        for x in (a, b):
            x.close()


# -- the HA pair for the e2e harness ----------------------------------------
class HaPair:
    """Two `cynomys produce` with the same config (``[producer] ha = true``).
    ``kill`` SIGKILLs the leader, measures the takeover -- from the kill to
    the first envelope the other one publishes -- and starts the killed one
    again as the standby.  Every process writes a log of its own."""

    def __init__(self, cfg: Path, logs: Path, redis_url: str) -> None:
        self.cfg, self.logs = cfg, logs
        c = load_config(cfg, env={})
        self.lease_key = f"{c.transport.stream}:lease:{c.producer.id}"
        self.seq_key, self.pid = f"{c.transport.stream}:seq", c.producer.id
        self.lease_s = c.producer.lease_ms / 1000
        self.r = redis.Redis.from_url(redis_url)
        self.started = 0
        self.p: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.takeovers: list[tuple[float, float]] = []  # (lease taken, first envelope) seconds after the kill
        self.p["a"] = self._start()
        wait_for(lambda: self.leader() == "a", 60, "the first producer to lead")
        self.p["b"] = self._start()
        wait_for(lambda: "standing by" in self.p["b"][1].read_text(), 60, "the second producer to stand by")

    def _start(self) -> tuple[subprocess.Popen[bytes], Path]:
        self.started += 1
        log = self.logs / f"producer-{self.started}.log"
        proc = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", "produce", "-c",
                                 str(self.cfg)], cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        return proc, log

    def holder_pid(self) -> int | None:
        v = self.r.get(self.lease_key)
        return int(v.decode().split(":")[2]) if v else None  # "token:host:pid:random"

    def leader(self) -> str | None:
        pid = self.holder_pid()
        return next((n for n, (p, _) in self.p.items() if p.pid == pid), None)

    def seq(self) -> int:
        return int(self.r.hget(self.seq_key, self.pid) or 0)

    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [p for p, _ in self.p.values()]

    def log_tail(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}" for _, log in self.p.values())

    def check(self) -> None:
        for name, (p, log) in self.p.items():
            assert p.poll() is None, f"producer {name} exited {p.returncode}:\n{log.read_text()[-3000:]}"

    def kill(self) -> None:
        self.check()
        wait_for(lambda: self.leader() is not None, 30, "a leader")
        name = self.leader()
        assert name is not None
        other = "b" if name == "a" else "a"
        seq = self.seq()
        t0 = time.monotonic()
        self.p[name][0].send_signal(signal.SIGKILL)
        self.p[name][0].wait()
        took: list[float] = []

        def taken_over() -> bool:
            if not took and self.leader() == other:
                took.append(time.monotonic() - t0)
            # Past the seq at the kill, plus one: the killed leader may have
            # had one envelope in flight that Redis accepted.
            return bool(took) and self.seq() > seq + 1

        wait_for(taken_over, 30, "the standby to take over and publish")
        self.takeovers.append((took[0], time.monotonic() - t0))
        self.p[name] = self._start()  # back as the standby
        log = self.p[name][1]
        wait_for(lambda: "standing by" in log.read_text(), 60, "the restarted producer to stand by")


def _takeover_bound(lease_s: float) -> float:
    """README: a standby takes over within lease_ms * 1.25 plus a producer
    start (here: plus its first envelope, with 2 s for a busy 2-core box)."""
    return lease_s * 1.25 + 2.0


def _check_stream(cfg: Path) -> dict[str, Any]:
    """Every envelope once, in order; every source transaction in one
    envelope (or in the consecutive fragments of one cut transaction)."""
    batches = transport_batches(load_config(cfg, env={}))
    seqs = [s for s, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "envelope numbers repeat or skip"
    where: dict[str, list[int]] = defaultdict(list)
    for seq, b in batches:
        for tid in {c.tid for c in b.changes}:
            where[tid].append(seq)
    twice = {tid: s for tid, s in where.items() if s != list(range(s[0], s[0] + len(s)))}
    assert not twice, f"transactions shipped twice: {dict(list(twice.items())[:5])}"
    incarnations = {b.meta.get("incarnation") for _, b in batches}
    assert len(incarnations) == 1, f"takeovers must keep the incarnation: {incarnations}"
    return {"envelopes": len(batches), "transactions": len(where)}


@pytest.mark.slow
def test_ha_leader_sigkilled_10_times_standby_takes_over(tmp_path: Path, redis_url: str) -> None:
    pair: list[HaPair] = []

    def producers(cfg: Path, logs: Path, url: str) -> HaPair:
        pair.append(HaPair(cfg, logs, url))
        return pair[0]

    # A 2 s lease keeps the ten takeovers (each waits for the lease to
    # expire) to about a minute of writing; the default's bound is checked
    # by the SIGSTOP test.  Kills come 0.75-2.25 s after the standby is up.
    lease_ms = 2000
    cfg = _run(tmp_path, redis_url, writer=_paced_writer, batch_max_events=50, kills=["producer"] * 10,
               alter_at=None, write_s=15, catch_up_s=300, producer={"ha": True, "lease_ms": lease_ms},
               producers=producers)
    ha = pair[0]
    assert len(ha.takeovers) == 10
    bound = _takeover_bound(lease_ms / 1000)
    late = [t for t in ha.takeovers if t[1] > bound]
    print(f"takeovers (lease taken, first envelope) in s: {[(round(a, 2), round(b, 2)) for a, b in ha.takeovers]}")
    assert not late, f"takeovers over the bound of {bound:.2f}s: {late}"
    print(_check_stream(cfg))


# -- SIGSTOP: a paused leader is deposed and fenced ---------------------------
def _metric(port: int, name: str, labels: str = "") -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return None


@pytest.mark.slow
def test_ha_leader_sigstopped_past_its_lease_is_fenced(tmp_path: Path, redis_url: str) -> None:
    src = MariaDBServer(server_id=1).start()
    side = MariaDBSide(src)
    procs: list[subprocess.Popen[bytes]] = []
    stream = f"ha-stop-{tmp_path.name}"
    try:
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(
            tmp_path / "c.toml", src,
            source={"include_tables": ["app.*"], "start": "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])},
            producer={"id": "p1", "batch_max_events": 50, "batch_max_delay_ms": 100, "ha": True},  # lease: 5 s default
            transport={"url": redis_url, "stream": stream},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 2000, "max_delay_ms": 300, "consumer_name": "a1"},
            target=side.config, metrics={"health_interval_s": 1.0},
        )
        logs = tmp_path / "logs"
        logs.mkdir()
        ports = {n: free_port() for n in ("a", "b", "applier")}

        def start(name: str, cmd: str) -> subprocess.Popen[bytes]:
            env = {**os.environ, "PYTHONFAULTHANDLER": "1", "CYNOMYS_METRICS_LISTEN": f"127.0.0.1:{ports[name]}"}
            p = subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(cfg)],
                                 cwd=ROOT, env=env, stdout=(logs / f"{name}.log").open("ab"), stderr=subprocess.STDOUT)
            procs.append(p)
            return p

        def leader_gauge(name: str) -> float | None:
            try:
                return _metric(ports[name], "cynomys_producer_leader")
            except OSError:
                return None

        r = redis.Redis.from_url(redis_url)
        a = start("a", "produce")
        wait_for(lambda: leader_gauge("a") == 1.0, 60, "producer a to lead")
        b = start("b", "produce")
        wait_for(lambda: leader_gauge("b") == 0.0, 60, "producer b to stand by")
        start("applier", "apply")
        src.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()])
        stop, done, errors = threading.Event(), [0], []
        writers = [threading.Thread(target=_paced_writer, args=(src, stop, s, done, errors)) for s in range(4)]
        for w in writers:
            w.start()
        try:
            time.sleep(3)
            seq_key = f"{stream}:seq"
            token_a = int(r.get(f"{stream}:fence:p1") or 0)
            a.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            seq_at_stop = int(r.hget(seq_key, "p1") or 0)
            try:
                wait_for(lambda: leader_gauge("b") == 1.0 and int(r.hget(seq_key, "p1") or 0) > seq_at_stop + 1,
                         30, "the standby to take over and publish")
            except AssertionError:
                print("no takeover: leader gauge of b", leader_gauge("b"), "seq", r.hget(seq_key, "p1"), "at stop", seq_at_stop,
                      "source threads", src.execute("SHOW PROCESSLIST"))  # b.log gets its threads' stacks
                b.send_signal(signal.SIGABRT)
                time.sleep(2)
                raise
            took = time.monotonic() - t0
            assert took <= _takeover_bound(5.0) <= 10.0, f"takeover took {took:.1f}s"
            time.sleep(2)
            a.send_signal(signal.SIGCONT)  # the deposed leader wakes up mid-work
            wait_for(lambda: leader_gauge("a") == 0.0, 30, "the old leader to stand by again")
            fenced_a = _metric(ports["a"], "cynomys_producer_fenced_total")
            time.sleep(2)
        finally:
            stop.set()
            for w in writers:
                w.join()
        assert not errors, errors
        assert a.poll() is None and b.poll() is None, "a producer exited"
        # Its way out wrote its state, or an envelope: Redis refused (fenced).
        assert fenced_a is not None and fenced_a >= 1, (logs / "a.log").read_text()[-3000:]
        assert "lost the HA lease" in (logs / "a.log").read_text() or "no longer ours" in (logs / "a.log").read_text()
        token_b = int(r.get(f"{stream}:fence:p1") or 0)
        assert token_b > token_a

        def caught_up() -> bool:
            return _reports_caught_up(tmp_path, src) and not any(side.diff(cfg).values())

        wait_for(caught_up, 120, "the target to equal the source")
        # In stream order the fencing tokens never go down: nothing of a's
        # term came in after b's began.
        tokens = [peek_header(f[b"env"]).fence for _, f in r.xrange(stream)]
        assert tokens == sorted(tokens) and tokens[0] >= 1 and tokens[-1] == token_b, tokens
        counts = _check_stream(cfg)
        status = json.loads(subprocess.run([sys.executable, "-m", "cynomys.cli", "status", "--json", "-c", str(cfg)],
                                           cwd=ROOT, capture_output=True, check=True).stdout)
        ha = status["producer"]["ha"]
        assert (ha["fencing_token"], ha["state"], ha["leader"].split(":")[1]) == (token_b, "redis", str(b.pid)), ha
        assert status["producer"]["sequence"] == int(r.hget(seq_key, "p1") or 0)
        # A replay of an envelope of a's term (as a writer without the
        # fencing script could bring in) is rejected by the applier.
        old = next(f for _, f in r.xrange(stream) if peek_header(f[b"env"]).fence < token_b)
        r.xadd(stream, {b"producer": b"p1", b"seq": old[b"seq"], b"env": old[b"env"]})
        wait_for(lambda: _metric(ports["applier"], "cynomys_applier_envelopes_rejected_total",
                                 'reason="fenced"') == 1.0, 30, "the applier to reject the replay as fenced")
        dead = r.xrange(f"{stream}:dead")
        assert len(dead) == 1 and dead[0][1][b"reason"].startswith(b"fenced"), dead
        assert not any(side.diff(cfg).values())
        print(f"\n{done[0]} source transactions; takeover after SIGSTOP in {took:.2f}s; tokens {token_a} -> "
              f"{token_b}; old leader's fenced writes {fenced_a}; stream {counts}")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
        src.destroy()
        side.destroy()
