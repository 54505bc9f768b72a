"""The applier daemon: envelopes -> verified batches -> delay-commit flushes.

Exactly-once effect, by construction:
- every flush is one target transaction holding the data and, per producer,
  the applied sequence number and source position (AppliedState);
- deliveries are acknowledged to the transport only after that commit;
- at start the state is read back from the target, so envelopes delivered
  again after a crash are recognised: a sequence at or below the applied one
  is a duplicate; inside the next envelope, changes of transactions that
  start before the applied position were applied by a flush that split the
  envelope at a DDL, and are skipped.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from cynomys.applier.batcher import DelayBuffer
from cynomys.core.checkpoint import write_json_atomic
from cynomys.applier.targets.base import AppliedState, Target, build_flush, open_target
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, CynomysError, EnvelopeRejected, SchemaError
from cynomys.core.model import Batch, Change, Op, Position
from cynomys.schemas import codec
from cynomys.transport.bus import Delivery, Subscriber, open_subscriber
from cynomys.transport.envelope import Opener
from cynomys.transport.keys import load_private_key, load_public_key
from cynomys.transport.sequence import SequenceTracker

log = logging.getLogger(__name__)


@dataclass
class ApplierStats:
    envelopes: int = 0
    duplicates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    flushes: int = 0
    rows_in: int = 0
    rows_out: int = 0
    ddl: int = 0


def make_opener(cfg: Config) -> Opener:
    sec = cfg.security
    if not sec.applier_private_key or not sec.producer_public_key:
        raise ConfigError(f"[security] applier_private_key and producer_public_key must be set in {cfg.path}",
                          hint="copy the files written by `cynomys keygen` and point [security] at them")
    priv = load_private_key(cfg.resolve(sec.applier_private_key), sec.passphrase or None,
                            config_key="applier_private_key", allow_readable=sec.allow_readable_private_keys)
    pub = load_public_key(cfg.resolve(sec.producer_public_key), config_key="producer_public_key")
    return Opener(priv, {cfg.producer.id: pub}, cfg.transport.stream,
                  max_payload_bytes=cfg.transport.max_envelope_bytes)


def make_subscriber(cfg: Config) -> Subscriber:
    tcfg = cfg.transport
    if tcfg.kind == "file":
        tcfg = replace(tcfg, path=str(cfg.resolve(tcfg.path)))
    return open_subscriber(tcfg, cfg.applier.consumer_name)


class Applier:
    def __init__(self, cfg: Config, target: Target, subscriber: Subscriber, opener: Opener,
                 stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.target = target
        self.sub = subscriber
        self.opener = opener
        self.stop = stop or threading.Event()
        self.buffer = DelayBuffer(cfg.applier.buffer_rows, cfg.applier.max_delay_ms / 1000.0)
        self.tracker = SequenceTracker()
        self.applied: dict[str, AppliedState] = {}
        self.unacked: list[str] = []
        self.stats = ApplierStats()
        self.producer_id = cfg.producer.id
        # State to commit with the next flush: the last *complete* envelope taken.
        self.pending_state: AppliedState | None = None
        self.last_delivery = time.monotonic()
        self.report_path = cfg.resolve(cfg.applier.state_dir) / "applier.json"

    # ------------------------------------------------------------------
    def start(self) -> None:
        self.target.connect()
        st = self.target.applied(self.producer_id)
        if st is not None:
            self.applied[st.producer_id] = st
            if st.seq >= 1:
                self.tracker.restore({st.producer_id: st.seq})
            log.info("target holds producer %s up to envelope %d, source position %s", st.producer_id, st.seq, st.position)

    def run(self, until_idle_s: float = 0.0) -> None:
        self.start()
        while not self.stop.is_set():
            deliveries = self.sub.read(200, int(self.buffer.wait_s() * 1000))
            if deliveries:
                self.last_delivery = time.monotonic()
            for d in deliveries:
                self.handle(d)
                if self.buffer.due():  # checked per envelope: a read brings up to 200 of them
                    self.flush()
            if self.buffer.due():
                self.flush()
            self._ack()  # envelopes seen again after a restart: nothing to commit for them
            if until_idle_s and not deliveries and not self.buffer.envelopes \
                    and time.monotonic() - self.last_delivery >= until_idle_s:
                log.info("idle for %.1fs: exiting", until_idle_s)
                break
        if self.buffer.complete:
            if self.buffer.envelopes:
                self.flush()
            self._ack()
        else:
            log.info("stopping inside a source transaction: its envelopes stay unacknowledged "
                     "and are delivered again at the next start")

    # ------------------------------------------------------------------
    def handle(self, d: Delivery) -> None:
        try:
            opened = self.opener.open(d.envelope)
            batch = codec.decode(opened.payload)
        except (EnvelopeRejected, SchemaError) as exc:
            reason = getattr(exc, "reason", "undecodable")
            self.stats.rejected[reason] += 1
            log.error("rejected envelope %s (%s): %s; moved to the dead-letter stream", d.id, reason, exc)
            self.sub.dead_letter(d, f"{reason}: {exc}")
            return
        pid, seq = opened.producer_id, opened.seq
        self.stats.envelopes += 1
        if batch.producer_id != pid:
            self.stats.rejected["producer-mismatch"] += 1
            self.sub.dead_letter(d, f"payload names producer {batch.producer_id!r}, envelope {pid!r}")
            return
        # The tracker's high-water mark is the last envelope *taken* (buffered
        # or committed); at start it is restored from the target's state.
        if self.tracker.classify(pid, seq) == "duplicate":
            # Already in the target or in the buffer: its effect is (or will
            # be) committed by that envelope's own flush.
            self.stats.duplicates += 1
            log.info("envelope %d from %s delivered again: skipped", seq, pid)
            self.unacked.append(d.id)
            return
        self.take(pid, seq, batch)
        self.unacked.append(d.id)

    def take(self, pid: str, seq: int, batch: Batch) -> None:
        """Buffer one new envelope; DDL flushes what precedes it and runs alone."""
        if batch.meta.get("frag") == "0":
            if not self.buffer.complete:
                # The producer restarted inside a large transaction and sends
                # it again from its start: the fragments we hold are obsolete.
                log.warning("producer %s restarted a large transaction at envelope %d: dropping %d buffered "
                            "changes of its earlier attempt", pid, seq, len(self.buffer))
                self.buffer.discard()
            elif self.buffer.envelopes:
                # Keep a large transaction alone in the buffer, so dropping
                # an obsolete attempt never drops complete transactions.
                self.flush()
        applied = self.applied.get(pid)
        segment: list[Change] = []
        for c in batch.changes:
            if applied is not None and c.txn < applied.position:
                continue  # applied before a DDL split this envelope
            if c.op is Op.DDL:
                self.buffer.add(segment)
                segment = []
                self._apply_ddl(pid, c, batch, seq)
            else:
                segment.append(c)
        self.buffer.add(segment)
        self.stats.rows_in += len(batch.changes)
        self.buffer.mark(batch.end, batch.complete, batch.last_commit_ts)
        self.tracker.advance(pid, seq)
        if batch.complete:
            self.pending_state = AppliedState(pid, seq, batch.end, batch.last_commit_ts)

    def _apply_ddl(self, pid: str, ddl: Change, batch: Batch, seq: int) -> None:
        # Flush everything before the DDL at the DDL's start (a transaction
        # boundary), recorded as the previous envelope: this one is not done.
        prev_seq = seq - 1 if seq > 1 else 0
        self.buffer.complete = True  # a DDL starts its own transaction: what precedes it is whole
        if self.buffer.envelopes or len(self.buffer):
            self._flush_with(AppliedState(pid, prev_seq, ddl.txn, ddl.commit_ts))
        after = _after_ddl(ddl, batch)
        state = AppliedState(pid, prev_seq, after, ddl.commit_ts)
        log.info("applying DDL at %s: %s", ddl.txn, (ddl.sql or "")[:200])
        self.target.apply_ddl(ddl, state)
        self.applied[pid] = state
        self.stats.ddl += 1

    # ------------------------------------------------------------------
    def flush(self) -> None:
        state = self.pending_state
        if state is None:
            self._ack()
            return
        self._flush_with(state)

    def _flush_with(self, state: AppliedState) -> None:
        changes = self.buffer.take()
        if changes or self.applied.get(state.producer_id) != state:
            flush = build_flush(changes, state)
            t0 = time.monotonic()
            self.target.apply(flush)
            self.stats.flushes += 1
            self.stats.rows_out += len(changes)
            log.debug("flushed %d net changes in %.3fs up to %s", len(changes), time.monotonic() - t0, state.position)
        self.applied[state.producer_id] = state
        self._ack()
        self._report(state)

    def _report(self, state: AppliedState) -> None:
        """``state_dir/applier.json``: what the target holds, for `cynomys
        status` and monitoring without a target connection.  The truth is
        the state committed in the target; this file only mirrors it."""
        write_json_atomic(self.report_path, {
            "producer_id": state.producer_id, "seq": state.seq, "position": state.position.to_dict(),
            "commit_ts": state.commit_ts, "flushed_at": time.time(),
            "stats": {**dataclasses.asdict(self.stats), "rejected": dict(self.stats.rejected)},
        }, durable=False)

    def _ack(self) -> None:
        if self.unacked and self.buffer.complete and not self.buffer.envelopes:
            self.sub.ack(self.unacked)
            self.unacked = []


def _after_ddl(ddl: Change, batch: Batch) -> Position:
    """Where the DDL's transaction ends: the next change's start, or the
    batch end when the DDL is its last change."""
    seen = False
    for c in batch.changes:
        if seen:
            return c.txn
        if c is ddl:
            seen = True
    return batch.end


def run_applier(cfg: Config, stop: threading.Event, *, until_idle_s: float = 0.0) -> ApplierStats:
    """Run the applier daemon, retrying transient errors with backoff."""
    delay = 0.5
    while True:
        target = open_target(cfg)
        sub = make_subscriber(cfg)
        app = Applier(cfg, target, sub, make_opener(cfg), stop)
        try:
            app.run(until_idle_s)
            return app.stats
        except CynomysError as exc:
            if not exc.transient or stop.is_set():
                raise
            log.warning("transient error, restarting the applier loop in %.1fs: %s", delay, exc)
        finally:
            _close(sub, target)
        stop.wait(delay)
        delay = min(30.0, delay * 2)
        if stop.is_set():
            return app.stats


def _close(*things: Any) -> None:
    for t in things:
        try:
            t.close()
        except Exception as exc:  # closing after a failure must not hide the failure
            log.debug("close failed: %s", exc)
