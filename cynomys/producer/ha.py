"""High availability for the producer: one leader, any number of standbys.

With ``[producer] ha = true`` every ``cynomys produce`` with the same config
runs this loop.  It tries to take the lease (cynomys/transport/lease.py);
the process that gets it leads -- runs the usual Producer -- and a thread
renews the lease every ``lease_ms / 3``; the others stand by and try again
every ``lease_ms / 4``.  A leader that dies or stalls stops renewing, its
lease expires after at most ``lease_ms``, and a standby takes over: at most
``lease_ms * 1.25`` plus a producer start after the last renewal.

What makes a takeover safe:

* the producer's state (checkpoint, sequence, open transaction, pending
  envelope, incarnation) lives in Redis (``S:state:P``), not in the
  leader's ``state_dir``: the new leader resumes exactly where the old one
  left off, through the same ``_recover_pending`` a restarted producer runs.
  It keeps the incarnation id: it is the same logical producer, numbering
  its envelopes on, so the applier sees no new incarnation;
* every term has a fencing token (larger than every earlier one), sealed
  into each envelope's signed header; the lease value ("token:owner") is
  checked by the very Lua scripts that write the state and publish, so a
  deposed leader that wakes up writes nothing (LeaseLost) and stands by;
  the applier also refuses envelopes whose token is older than the newest
  it has seen (reason ``fenced``);
* a leader that loses its lease (renewal refused, or not renewed for a
  whole lease) stops its Producer at once -- no further read, no publish --
  and goes back to standby; it never exits on that.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Protocol

from cynomys.core.checkpoint import read_json, write_json_atomic
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, CynomysError, LeaseLost, TerminalError
from cynomys.metrics.monitor import ProducerMonitor
from cynomys.producer import Producer, ProducerState, StateStore, run_with_retry
from cynomys.transport.channel import SealedSink
from cynomys.transport.lease import RedisLease

log = logging.getLogger(__name__)

# The renewer's own clock tick: how fast it notices the daemon's stop.
_TICK_S = 0.1
# Each lease term reads the binlog as replica server_id + token % this.  A
# paused leader's binlog connection stays on the source (its dump thread
# blocked writing to the full socket) until net_write_timeout, and MariaDB
# makes a new connection with the same server_id wait for it: measured, a
# takeover hung for the whole 60 s.  Distinct ids per term do not wait.
SERVER_IDS_PER_PRODUCER = 64


class Signer(Protocol):
    def sign_detached(self, context: bytes, data: bytes) -> bytes: ...

    def verify_detached(self, context: bytes, data: bytes, signature: bytes) -> bool: ...


# Signature context: a state signature never verifies as anything else.
_STATE_CONTEXT = b"cynomys-producer-state-v1\0"


class RedisStateStore:
    """The producer state in Redis, written only while our lease holds
    (compare-and-SET in one script), and signed with the producer's key: a
    Redis writer could otherwise move the checkpoint and make the producer
    skip changes, which a single producer's local file rules out.  Each
    save is mirrored, best effort, to ``state_dir/producer.json`` on the
    leader's host, for `cynomys status`; the mirror is marked as such and
    never read back as the truth."""

    def __init__(self, lease: RedisLease, mirror: Path, signer: Signer) -> None:
        self.lease = lease
        self.mirror = mirror
        self.signer = signer

    def load(self) -> ProducerState:
        stored = self.lease.load_state()
        if stored is not None:
            return ProducerState.from_dict(self._verified(stored))
        local = read_json(self.mirror)
        if local is not None and "ha" not in local:
            # Switching HA on: the single producer's own checkpoint file is
            # the truth to start from (a mirror is not: it may be stale).
            log.info("no producer state in Redis yet: starting from %s (written by a producer without HA)",
                     self.mirror)
            return ProducerState.from_dict(local)
        if local is not None:
            log.warning("no producer state in Redis (%s), only this host's mirror %s, which may be stale and is "
                        "not used: starting as a new producer", self.lease.describe(), self.mirror)
        return ProducerState()

    def _verified(self, stored: dict[str, Any]) -> dict[str, Any]:
        text, sig = stored.get("state"), stored.get("sig")
        ok = isinstance(text, str) and isinstance(sig, str)
        try:
            ok = ok and self.signer.verify_detached(_STATE_CONTEXT, str(text).encode(), bytes.fromhex(str(sig)))
        except ValueError:
            ok = False
        data = json.loads(str(text)) if ok else None
        if not isinstance(data, dict):
            raise TerminalError(
                f"the producer state in {self.lease.describe()} is not signed by this producer's key "
                "(altered in Redis, or written with another [security] producer_private_key); not used",
                hint="find out who wrote it; to start over, delete the key (the producer then starts at "
                     "[source] start) and re-snapshot the target")
        return data

    def save(self, state: ProducerState) -> None:
        data = state.to_dict()
        text = json.dumps(data, sort_keys=True)
        sig = self.signer.sign_detached(_STATE_CONTEXT, text.encode())
        self.lease.save_state({"state": text, "sig": sig.hex()})
        try:
            write_json_atomic(self.mirror, {**data, "ha": {"owner": self.lease.owner, "token": self.lease.token,
                                                           "truth": self.lease.describe()}}, durable=False)
        except OSError as exc:  # a report, never a reason to stop
            log.warning("cannot write the state mirror %s: %s", self.mirror, exc)

    def describe(self) -> str:
        return self.lease.describe()


class _Term:
    """One leadership term: renews the lease and sets ``halt`` (the
    Producer's stop event) when the daemon stops or the lease is lost."""

    def __init__(self, lease: RedisLease, stop: threading.Event) -> None:
        self.lease = lease
        self.stop = stop
        self.halt = threading.Event()
        self.lost = threading.Event()
        self.reason = ""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
        self._thread.start()

    def _lose(self, reason: str) -> None:
        self.reason = reason
        self.lost.set()
        self.halt.set()
        log.warning("lost the HA lease %s (token %d): %s; stopping work", self.lease.key, self.lease.token, reason)

    def _run(self) -> None:
        lease_s = self.lease.lease_ms / 1000.0
        interval = lease_s / 3
        last_ok = time.monotonic()  # the term began with the acquisition
        next_renew = last_ok + interval
        while not self._done.is_set():
            if self.stop.is_set():
                self.halt.set()
                return
            now = time.monotonic()
            if now >= next_renew:
                try:
                    ok: bool | None = self.lease.renew()
                except CynomysError as exc:
                    ok = None
                    log.warning("could not renew the HA lease %s: %s", self.lease.key, exc.message)
                if ok:
                    last_ok = now  # the time the request left: the lease runs at least from then
                elif ok is False:
                    self._lose("the lease is held by another producer or expired")
                    return
                after = time.monotonic()
                if after - last_ok >= lease_s:
                    # Redis unreachable for a whole lease: a standby may hold
                    # it by now.  Fencing would refuse our writes anyway; stop
                    # before trying.
                    self._lose(f"not renewed for {self.lease.lease_ms} ms")
                    return
                next_renew = after + (interval if ok else interval / 3)
            self._done.wait(_TICK_S)

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def run_ha(cfg: Config, sink: SealedSink, stop: threading.Event, monitor: ProducerMonitor,
           make: Callable[[threading.Event, StateStore], Producer] | None = None, *,
           fresh_start: bool = False) -> None:
    """Stand by, lead when the lease is free, stand by again when it is
    lost; return once ``stop`` is set (releasing the lease if held)."""
    if cfg.transport.kind != "redis":
        raise ConfigError(f"[producer] ha = true needs [transport] kind = \"redis\" in {cfg.path} "
                          f"(the lease and the shared checkpoint live in Redis)",
                          hint="set [transport] kind = \"redis\", or [producer] ha = false")
    if make is None:
        def make(halt: threading.Event, store: StateStore) -> Producer:
            return Producer(term_config(cfg, lease.token), sink, halt, monitor=monitor, store=store,
                            fresh_start=fresh_start)
    lease = RedisLease(cfg.transport, cfg.producer.id, _owner(), cfg.producer.lease_ms)
    mirror = cfg.resolve(cfg.producer.state_dir) / "producer.json"
    poll_s = cfg.producer.lease_ms / 4000.0
    holder_seen: str | None = None
    log.info("HA producer %s: owner %s, lease %s of %d ms", cfg.producer.id, lease.owner, lease.key,
             cfg.producer.lease_ms)
    try:
        while not stop.is_set():
            try:
                token = lease.acquire()
            except CynomysError as exc:
                if not exc.transient:
                    raise
                monitor.failed(exc)
                log.warning("cannot reach the HA lease: %s", exc.message)
                stop.wait(poll_s)
                continue
            if token is None:
                monitor.standing_by()
                holder = _holder(lease)
                if holder != holder_seen:
                    log.info("standing by: the lease %s is held by %s", lease.key, holder)
                    holder_seen = holder
                stop.wait(poll_s)
                continue
            holder_seen = None
            log.info("leading: acquired the HA lease %s with fencing token %d", lease.key, token)
            monitor.leading(token)
            sink.fence(token, lease.key, lease.value)
            term = _Term(lease, stop)
            store = RedisStateStore(lease, mirror, sink.sealer)
            try:
                run_with_retry(lambda: make(term.halt, store), term.halt, monitor=monitor)
            except LeaseLost as exc:
                monitor.fenced()
                term.halt.set()
                log.warning("%s: standing by", exc.message)
            finally:
                term.close()
                monitor.standing_by()
            if stop.is_set() and not term.lost.is_set():
                try:
                    if lease.release():
                        log.info("released the HA lease %s: a standby takes over now", lease.key)
                except CynomysError as exc:  # it expires by itself
                    log.warning("could not release the HA lease %s: %s", lease.key, exc.message)
    finally:
        lease.close()


def term_config(cfg: Config, token: int) -> Config:
    """``cfg`` with the replica server id of lease term ``token``."""
    server_id = cfg.source.server_id + token % SERVER_IDS_PER_PRODUCER
    return dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, server_id=server_id))


def _holder(lease: RedisLease) -> str | None:
    try:
        return lease.holder()
    except CynomysError:
        return None
