"""The applier daemon: envelopes -> verified batches -> delay-commit flushes.

Exactly-once effect, by construction:
- every flush is one target transaction holding the data and, per producer,
  the applied sequence number, source position and the producer's identity
  (AppliedState);
- deliveries are acknowledged to the transport only after that commit;
- at start the state is read back from the target, and every envelope goes
  through the admit stage (applier/admit.py), which applies exactly the
  changes whose transactions the target lacks, or stops;
- a source transaction too large for ``[applier] max_memory_mb`` is
  applied in parts into one target transaction kept open until its end
  (applier/spill.py): the same flush, spread over time;
- a flush commits on a worker thread as the loop folds the next one
  (applier/committer.py): its envelopes are acknowledged once it
  committed, and every other use of the target waits for it.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, cast

from cynomys.applier import spill
from cynomys.applier.admit import Admission, BufferView, Decision, Verdict
from cynomys.applier.batcher import DelayBuffer, Span
from cynomys.applier.committer import Committer, Guarded
from cynomys.applier.opening import AHEAD, OpenAhead, Unsealed, unseal
from cynomys.applier.partition import Partitioning, PartitionTarget
from cynomys.applier.receive import make_subscriber
from cynomys.applier.shaping import Shaping
from cynomys.applier.targets.base import Capabilities, Flush, Target, build_flush, open_target
from cynomys.core.checkpoint import write_json_atomic
from cynomys.core.columnar import row_count
from cynomys.core.config import Config
from cynomys.core.errors import CynomysError, EnvelopeRejected, SchemaError, TerminalError
from cynomys.core.model import AppliedState, Batch, Change, EnvelopeMeta, Op, Position
from cynomys.metrics.events import ApplierTurn
from cynomys.metrics.monitor import ApplierMonitor
from cynomys.transport.bus import Delivery, Subscriber
from cynomys.transport.channel import make_opener
from cynomys.transport.envelope import Opener
from cynomys.verify.applier import VERIFY_OPS, Verifier

log = logging.getLogger(__name__)

READ_COUNT = 200  # envelopes per transport read, at most (spill.read_count)
#: How long a transport read waits, at most, while a flush is in flight.
IN_FLIGHT_POLL_S = 0.02
#: A first read's envelopes, before their size is known (then spill.read_count).
FIRST_READ_COUNT = 20
RAW_FACTOR = 10  # x max_buffer_rows raw changes also end a backlog flush (bounds the replay after a crash)


def backlog_cap(caps: Capabilities, buffer_rows: int) -> int:
    """The default [applier] max_buffer_rows: the target's backlog_factor x
    buffer_rows, and at least its backlog_rows."""
    return max(caps.backlog_factor * buffer_rows, caps.backlog_rows)


@dataclass
class ApplierStats:
    envelopes: int = 0
    duplicates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    flushes: int = 0
    rows_in: int = 0
    rows_out: int = 0
    ddl: int = 0
    parts: int = 0  # parts of large source transactions applied ahead of their commit (spill.py)


class Applier:
    def __init__(self, cfg: Config, target: Target, subscriber: Subscriber, opener: Opener,
                 stop: threading.Event | None = None, monitor: ApplierMonitor | None = None) -> None:
        self.cfg = cfg
        self.monitor = monitor or ApplierMonitor(cfg)  # metrics/health (cynomys/metrics)
        self.partitioning = Partitioning.of(cfg)  # which tables are ours (all, unpartitioned)
        # The commit stage (applier/committer.py): the loop reaches the target
        # only through ``Guarded``, which waits for a flush in flight first;
        # the worker thread commits through ``inner``.
        self.committer = Committer()
        self.inner: Target = PartitionTarget(target, self.partitioning)
        self.target: Target = cast(Target, Guarded(self.inner, self.committer))
        self.sub = subscriber
        self.opener = opener
        self.stop = stop or threading.Event()
        self.buffer = DelayBuffer(cfg.applier.buffer_rows, cfg.applier.max_delay_ms / 1000.0,
                                  progress_delay_s=cfg.applier.progress_interval_ms / 1000.0
                                  if self.partitioning.active else None)
        self.max_buffer_rows = cfg.applier.max_buffer_rows or backlog_cap(target.capabilities, cfg.applier.buffer_rows)
        self.admit = Admission()  # the admit stage: what of each envelope the target needs
        self.unacked: list[str] = []
        # While a flush commits on the worker: what the target held before it
        # (in a 1-tuple), shown as applied instead of what the admit stage
        # already counts (_turn); None when no flush is in flight.
        self.shown: tuple[AppliedState | None] | None = None
        self.stats = ApplierStats()
        self.producer_id = cfg.producer.id
        self.buffer_server = ""  # the source server of the buffered envelopes' positions
        # State to commit with the next flush: the last *complete* envelope taken.
        self.pending_state: AppliedState | None = None
        self.last_delivery = time.monotonic()
        self.report_path = cfg.resolve(cfg.applier.state_dir) / self.partitioning.file_name("applier")
        self.verifier = Verifier(cfg, self.target)
        self.shaping = Shaping(cfg, self.target)  # modes and schema-change policy ([shape.targets])
        # The memory bound (applier/spill.py): estimated bytes the buffer may hold.
        self.budget = spill.budget(cfg.applier.max_memory_mb)
        self.envelope_bytes = 0.0  # the recent envelopes' size, largest first (spill.read_count)
        self.parts = 0            # parts of the open source transaction applied into the target
        self.open_pid = ""        # the producer whose transaction is open
        self.sealed_acks = 0      # unacknowledged envelopes of the sealed part (whole transactions)
        self._warned_whole = False
        # The open stage, ahead of the loop (applier/opening.py).
        self.ahead = OpenAhead(opener, AHEAD)
        self.reading = False  # inside run(): a flush may read ahead
        self.behind = False   # the last read came back full

    # ------------------------------------------------------------------
    def start(self) -> None:
        self.target.connect()
        self.target.recover(self.producer_id)
        st = self.target.applied(self.producer_id)
        if st is not None:
            self.admit.restore(st)
            log.info("target holds producer %s up to envelope %d, source position %s%s", st.producer_id, st.seq,
                     st.position, f" on server {st.server}" if st.server else "")

    def run(self, until_idle_s: float = 0.0) -> None:
        self.start()
        self.reading = True
        try:
            self._run(until_idle_s)
        finally:
            self.reading = False
            self.committer.close()  # after an error: the flush in flight ends before the target closes
            self.ahead.close()

    def _run(self, until_idle_s: float) -> None:
        while not self.stop.is_set():
            if not self.ahead:
                count = self._read_count()
                # A flush in flight: look again soon, to acknowledge it once done.
                wait_s = min(self.buffer.wait_s(), IN_FLIGHT_POLL_S) if self.committer else self.buffer.wait_s()
                deliveries = self.sub.read(count, int(wait_s * 1000))
                self.ahead.add(deliveries)
                # Behind (the read came back full: more is waiting): take the
                # backlog into this flush rather than commit once per buffer_rows.
                self.behind = len(deliveries) >= count
            # What was read before this turn (a flush may read ahead: that is
            # handled in the next turn, after this one's acknowledgements).
            delivered = len(self.ahead)
            if delivered:
                self.last_delivery = time.monotonic()
            for _ in range(delivered):
                self.handle(*self.ahead.take())
                if self.buffer.due() and self._full():
                    self.flush()  # the backlog cap, checked per envelope
                elif self._over_budget():
                    self.relieve()  # the memory bound, likewise
            self.committer.settle(block=False)  # a flush in flight that is done: acknowledged now
            if self.buffer.due() and not self.behind and not self.committer:
                # (With a flush in flight, the buffer goes on taking envelopes
                # until it is done: group commit, up to the backlog cap.)
                self.flush()
            self._ack()  # envelopes seen again after a restart: nothing to commit for them
            self.monitor.turn(self._turn(delivered))
            if not delivered and not self.buffer.envelopes:
                self.target.idle()
            if until_idle_s and not delivered and not self.buffer.envelopes \
                    and time.monotonic() - self.last_delivery >= until_idle_s:
                log.info("idle for %.1fs: exiting", until_idle_s)
                break
        self.reading = False  # the last flush reads nothing ahead: it would wait unacknowledged
        self.committer.settle()
        if self.buffer.complete:
            if self.buffer.envelopes:
                self.flush()
            self._ack()
        else:
            if self.parts:
                self.target.rollback_parts()
            log.info("stopping inside a source transaction: its envelopes stay unacknowledged "
                     "and are delivered again at the next start%s",
                     f" (its {self.parts} part(s) applied were rolled back)" if self.parts else "")

    def _read_count(self) -> int:
        return spill.read_count(self.cfg.applier.max_memory_mb, self.envelope_bytes, READ_COUNT) \
            if self.envelope_bytes else FIRST_READ_COUNT

    def _read_ahead(self) -> None:
        """Before the target works on a flush: what is already waiting is
        read (without waiting), so the open stage opens it meanwhile."""
        if self.reading and not self.ahead and not self.stop.is_set():
            count = self._read_count()
            try:
                deliveries = self.sub.read(count, 0)
            except CynomysError as exc:
                # A transport fault must not keep this flush from its commit:
                # the loop's next read meets it again, after the commit.
                log.debug("reading ahead failed (%s); the next read retries it", exc)
                return
            self.ahead.add(deliveries)
            self.behind = len(deliveries) >= count

    def _turn(self, delivered: int) -> ApplierTurn:
        s = self.stats
        held = self.shown[0] if self.shown is not None else self.admit.held(self.producer_id)
        return ApplierTurn(id(self), delivered, {"envelopes": s.envelopes, "duplicates": s.duplicates,
                                                 "flushes": s.flushes, "ddl": s.ddl},
                           dict(s.rejected), len(self.buffer), self.buffer.envelopes,
                           held.position if held else None, held.commit_ts if held else 0, self.target.ping)

    def _full(self) -> bool:
        """The backlog cap: max_buffer_rows net changes (folded: the memory a
        buffer costs and the rows a flush writes), or RAW_FACTOR times as many
        raw ones (what a crash makes the applier read again).  Counting net
        changes lets a backlog of updates to hot keys go into one flush: on
        Spark a flush costs about the same whatever its size (issue #11)."""
        return self.buffer.held() >= self.max_buffer_rows or len(self.buffer) >= RAW_FACTOR * self.max_buffer_rows

    # ------------------------------------------------------------------
    # The memory bound (applier/spill.py)
    # ------------------------------------------------------------------
    def _over_budget(self) -> bool:
        """The buffer is past its memory share.  A flush or part in flight
        holds memory too until it commits: past the share together, the
        loop waits for it.  Parts that may overlap each take half the share,
        so one in flight and the next one buffered stay within it."""
        share = self.budget // 2 if self._may_overlap_parts() else self.budget
        if self.buffer.cost > share:
            return True
        if self.committer and self.buffer.cost + self.committer.cost > self.budget:
            self.committer.settle()
        return False

    def _may_overlap_parts(self) -> bool:
        return (self.reading and self.behind and self.cfg.applier.overlap_commits and not self.buffer.complete
                and self.target.capabilities.applies_parts)

    def relieve(self) -> None:
        """The buffer is past its memory share: flush it when it ends on a
        transaction boundary, else apply its open part ahead of the
        transaction's commit."""
        if self.buffer.complete:
            self.flush()
        elif self.target.capabilities.applies_parts:
            self.spill()
        elif not self._warned_whole:
            self._warned_whole = True
            log.warning("a source transaction is past [applier] max_memory_mb, and %s cannot apply one in "
                        "parts: it is buffered whole", self.target.where)

    def spill(self) -> None:
        """Commit the whole transactions buffered before the open one, then
        apply what the buffer holds of the open one as a part of it, into
        the target transaction kept open until its end."""
        buf = self.buffer
        if buf.sealed is not None:
            state = self.pending_state
            assert state is not None, "a sealed part ends with a complete envelope"
            self._commit(buf.take_sealed(), state)
            self.admit.committed(state)
            n, self.sealed_acks = self.sealed_acks, 0
            if n:
                self.sub.ack(self.unacked[:n])
                self.unacked = self.unacked[n:]
            self._report(state)
        overlap, cost = self._may_overlap_parts(), buf.cost
        changes = buf.take_open()
        if not changes:
            return
        pid = self.open_pid or self.producer_id
        held = self.admit.held(pid) or AppliedState(pid, 0, Position("", 0))
        self._read_ahead()
        self.parts += 1
        self.stats.parts += 1
        part, target, caps = self.parts, self.inner, self.inner.capabilities

        def work() -> float:
            t0 = time.monotonic()
            target.apply_part(build_flush(changes, held, caps.columnar_inserts, caps.keyless_runs))
            return time.monotonic() - t0

        def done(seconds: float) -> None:
            self.stats.rows_out += row_count(changes)
            self.monitor.flushed(changes, seconds, readable=[])  # rows written, not readable before the commit
            log.info("applied part %d of a source transaction (%d net changes, %.2fs%s); it commits at its last "
                     "fragment", part, len(changes), seconds, ", overlapped" if overlap else "")

        if overlap:  # applied on the worker while the loop takes the next fragments (applier/committer.py)
            self.committer.submit(work, done, cost)
        else:
            self.committer.settle()
            done(work())

    def _commit(self, changes: list[Change], state: AppliedState, amend: Callable[[Flush], None] | None = None,
                *, overlap: bool = False, cost: int = 0, acks: list[Any] | None = None) -> None:
        """One flush: with the parts applied before it (committing them) or
        alone; on the commit stage's worker while the loop goes on
        (``overlap``, applier/committer.py) or here.  ``acks``: the envelopes
        to acknowledge, and the state file to write, once it committed --
        the caller's to do when None."""
        self._read_ahead()  # opened while the target works on this flush
        self.committer.settle()
        parts, target, caps = self.parts, self.inner, self.inner.capabilities
        readable = self.monitor.committing()  # not what the loop takes while this commits

        def work() -> tuple[float, Any, float]:
            flush = build_flush(changes, state, caps.columnar_inserts, caps.keyless_runs)
            if amend is not None:
                amend(flush)
            t0 = time.monotonic()
            (target.commit_parts if parts else target.apply)(flush)
            return time.monotonic() - t0, target.visible_at(), time.time()

        def done(result: tuple[float, Any, float]) -> None:
            seconds, visible, committed_at = result
            self.parts, self.shown = 0, None
            self.stats.flushes += 1
            self.stats.rows_out += row_count(changes)
            self.monitor.flushed(changes, seconds, visible, committed_at, readable)
            if parts:
                log.info("committed a source transaction applied in %d part(s) and a flush of %d net changes "
                         "in %.2fs", parts, len(changes), seconds)
            log.debug("flushed %d net changes in %.3fs up to %s%s", len(changes), seconds, state.position,
                      " (overlapped)" if overlap else "")
            # After the flush is counted readable (Spark's maintenance of an
            # overdue table must not delay its freshness).
            target.after_commit()
            if acks is not None:
                if acks:
                    self.sub.ack(acks)
                self._report(state)

        if overlap:
            self.committer.submit(work, done, cost)
        else:
            done(work())

    # ------------------------------------------------------------------
    def handle(self, d: Delivery, unsealed: Callable[[], Unsealed] | None = None) -> None:
        """One delivery, opened by the open stage (``unsealed``) or here."""
        self.monitor.envelope(len(d.envelope))
        # Up at once, down slowly: the first snapshot envelopes after small
        # ones shrink the next read, and one small envelope does not widen it.
        self.envelope_bytes = max(float(len(d.envelope)), 0.9 * self.envelope_bytes)
        try:
            got = unsealed() if unsealed is not None else unseal(self.opener, d.envelope)
            opened, batch = got.opened, got.batch
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
        verdict = self.offer(pid, seq, batch, opened.fence, spill.cost(len(opened.payload), batch.changes))
        if verdict.verdict is Verdict.DEAD:
            self.stats.rejected["fenced"] += 1
            log.error("rejected envelope %s (seq %d of %s): %s; moved to the dead-letter stream", d.id, seq, pid,
                      verdict.reason)
            self.sub.dead_letter(d, verdict.reason)
            return
        self.unacked.append(d.id)

    def offer(self, pid: str, seq: int, batch: Batch, fence: int = 0, cost: int = 0) -> Decision:
        """Pass one opened envelope through the admit stage, and take what
        it admits into the buffer (``cost``: its estimated memory there)."""
        decision = self.admit.judge(pid, seq, fence, batch, self._view())
        if decision.verdict is Verdict.FLUSH_FIRST:
            self.flush()  # what the buffer holds is committed: judge against the target alone
            decision = self.admit.judge(pid, seq, fence, batch, self._view())
        if decision.verdict is Verdict.DUPLICATE:
            self.stats.duplicates += 1
            log.info("envelope %d from %s delivered again (%s): skipped", seq, pid, decision.reason)
        elif decision.verdict is Verdict.TAKE:
            assert decision.batch is not None
            # A partition takes only its tables' changes, but every envelope's
            # number and position (cynomys/applier/partition.py); then each
            # table's changes as its mode needs them (cynomys/applier/shaping.py).
            self.take(pid, seq, self.shaping.batch(self.partitioning.select(decision.batch)), fence, cost)
        return decision

    def _view(self) -> BufferView:
        return BufferView(self.buffer.envelopes, self.buffer.complete)

    def take(self, pid: str, seq: int, batch: Batch, fence: int = 0, cost: int = 0) -> None:
        """Buffer one admitted envelope; DDL flushes what precedes it and runs alone."""
        meta = EnvelopeMeta.of(batch.meta)
        if meta.server and self.buffer_server and meta.server != self.buffer_server \
                and self.buffer.envelopes and self.buffer.complete:
            self.flush()  # positions of two servers never share a buffer (they cannot be ordered)
        span = Span.of(batch)
        if not batch.complete and self.buffer.complete and self.buffer.envelopes:
            # A transaction cut into fragments starts: set apart the whole
            # transactions before it, so dropping an obsolete attempt of it
            # never drops them, and so they can commit alone before it is
            # applied in parts (spill).
            self.buffer.seal()
            self.sealed_acks = len(self.unacked)
        if span is not None and (not meta.server or not self.buffer_server or meta.server == self.buffer_server):
            self._check_overlap(pid, seq, span)
        elif batch.meta.get("frag") == "0" and not self.buffer.complete:
            # (Envelopes without a span, from older producers.)  The producer
            # restarted inside a large transaction and sends it again.
            log.warning("producer %s restarted a large transaction at envelope %d: dropping %d buffered "
                        "changes of its earlier attempt", pid, seq, len(self.buffer))
            self._discard_attempt()
        # A DDL or verification record below commits states that must name
        # this envelope's producer identity (the chain moves at the end).
        self.admit.adopt(pid, meta, fence)
        if meta.server:
            self.buffer_server = meta.server
        segment: list[Change] = []
        for c in batch.changes:  # the admit stage dropped what the target holds
            if c.op is Op.DDL:
                self.buffer.add(segment)
                segment = []
                self._apply_ddl(pid, c, batch, seq)
            elif c.op in VERIFY_OPS:
                self.buffer.add(segment)
                segment = []
                self._verify(pid, c, batch, seq)
            else:
                segment.append(c)
        self.buffer.add(segment)
        self.buffer.charge(cost)
        if not batch.complete:
            self.open_pid = pid
        self.stats.rows_in += row_count(batch.changes)
        self.buffer.mark(batch.end, batch.complete, batch.last_commit_ts)
        if span is not None:
            self.buffer.cover(span)
        self.admit.advance(pid, seq)
        self.monitor.taken(batch)
        if batch.complete:
            self.pending_state = self.admit.state(pid, seq, batch.end, batch.last_commit_ts)
            if self.parts and self.inner.commits_parts_alone:
                self.flush()  # (the producer ends an envelope where a fragmented transaction ends)

    def _check_overlap(self, pid: str, seq: int, span: Span) -> None:
        """Never apply two attempts of the same changes.  Envelopes of one
        producer follow each other: each starts where the previous one
        stopped or later.  One that starts earlier carries changes the buffer
        already holds (the producer sent them again): when it covers all the
        buffer holds, the earlier attempt is dropped; otherwise the two
        cannot be told apart inside folded envelopes, and the applier stops
        before applying either."""
        buf = self.buffer
        if buf.covered is None or span.start >= buf.covered:
            return  # follows on: the usual case
        if buf.base is None and buf.sealed_stop is None:
            return  # nothing buffered: what the target holds is filtered change by change
        sealed_ok = buf.sealed_stop is None or span.start >= buf.sealed_stop
        if buf.base is not None and span.start <= buf.base and sealed_ok:
            log.warning("producer %s sends again, in envelope %d from %s, changes the buffer holds from %s: "
                        "dropping the %d buffered changes of the earlier attempt",
                        pid, seq, span.describe_start(), Span.describe(buf.base), len(buf) - buf.sealed_rows)
            self._discard_attempt()
            return
        raise TerminalError(
            f"envelope {seq} of producer {pid!r} starts at {span.describe_start()}, inside what the buffer "
            f"holds (up to {Span.describe(buf.covered)}): the producer sent changes "
            f"again and the two attempts cannot be separated; nothing of either was applied",
            hint="see the producer's log for why it sent them again; re-snapshot the tables it names, then "
                 "restart the applier with a new consumer group")

    def _discard_attempt(self) -> None:
        """Drop the buffered part of an obsolete attempt of a large
        transaction, and the parts of it already applied (rolled back)."""
        self.buffer.discard()
        if self.parts:
            log.warning("rolling back the %d part(s) of the earlier attempt applied in the open target "
                        "transaction", self.parts)
            self.target.rollback_parts()
            self.parts = 0

    def _apply_ddl(self, pid: str, ddl: Change, batch: Batch, seq: int) -> None:
        # Flush everything before the DDL at the DDL's start (a transaction
        # boundary), recorded as the previous envelope: this one is not done.
        prev_seq = seq - 1 if seq > 1 else 0
        self.buffer.complete = True  # a DDL starts its own transaction: what precedes it is whole
        if self.buffer.envelopes or len(self.buffer):
            self._flush_with(self.admit.state(pid, prev_seq, ddl.txn, ddl.commit_ts))
        after = _after_ddl(ddl, batch)
        state = self.admit.state(pid, prev_seq, after, ddl.commit_ts)
        log.info("applying DDL at %s: %s", ddl.txn, (ddl.sql or "")[:200])
        self.target.apply_ddl(ddl, state)
        self.admit.committed(state)
        self.stats.ddl += 1

    def _verify(self, pid: str, change: Change, batch: Batch, seq: int) -> None:
        """A CHECKSUM or PURGE record (verify/applier.py): commit everything
        before it first (with a PURGE's deletions, at its CHECKSUM), then
        check.  The producer ends the envelope with the CHECKSUM, so that
        commit records the envelope's own state; a PURGE's flush-before is
        recorded at its position as the previous envelope, as before a DDL."""
        self.buffer.complete = True
        if change.op is Op.PURGE:
            state = self.admit.state(pid, seq - 1 if seq > 1 else 0, change.txn, change.commit_ts)
            if self.buffer.envelopes or len(self.buffer):
                self._flush_with(state)
            self.verifier.purge_later(change)
            return
        if batch.complete and change is batch.changes[-1]:
            state = self.admit.state(pid, seq, batch.end, batch.last_commit_ts)
        else:  # not from this version's producer: at its position, as the previous envelope
            state = self.admit.state(pid, seq - 1 if seq > 1 else 0, change.txn, change.commit_ts)
        if self.buffer.envelopes or len(self.buffer) or self.verifier.purges:
            self._flush_with(state, self.verifier.amend)
        self.verifier.check(change)

    # ------------------------------------------------------------------
    def flush(self) -> None:
        state = self.pending_state
        if state is None:
            self._ack()
            return
        self._flush_with(state)

    def _flush_with(self, state: AppliedState, amend: Callable[[Flush], None] | None = None) -> None:
        """``amend``: adds to the flush before it is applied (verify's purges)."""
        overlap = self._may_overlap(amend)
        cost = self.buffer.cost
        changes = self.buffer.take()
        if changes or amend is not None or self.parts or self.admit.held(state.producer_id) != state:
            if overlap:
                # Handed to the commit stage: its envelopes are acknowledged,
                # and the state file written, once it committed.  The admit
                # stage counts it committed now: if it fails, the error stops
                # the loop at the next settle and the applier restarts from
                # the target.
                acks, self.unacked, self.sealed_acks = self.unacked, [], 0
                self._commit(changes, state, overlap=True, cost=cost, acks=acks)
                self.shown = (self.admit.held(self.producer_id),)
                self.admit.committed(state)
                return
            self._commit(changes, state, amend)
        self.admit.committed(state)
        self._ack()
        self._report(state)

    def _may_overlap(self, amend: Callable[[Flush], None] | None) -> bool:
        """A flush of the loop commits on the worker while the loop goes on
        when it is a plain one: whole transactions, no parts to commit with
        it, no verification's purges.  The next flush then starts when this
        one is done (or the buffer is full): its size follows the target's
        pace -- a slow commit gathers a larger next flush, as on a backlog."""
        return (self.reading and self.cfg.applier.overlap_commits and amend is None
                and not self.parts and self.buffer.complete)

    def _report(self, state: AppliedState) -> None:
        """``state_dir/applier.json``: what the target holds, for `cynomys
        status` and monitoring without a target connection.  The truth is
        the state committed in the target; this file only mirrors it."""
        report: dict[str, Any] = {
            "producer_id": state.producer_id, "seq": state.seq, "position": state.position.to_dict(),
            "commit_ts": state.commit_ts, "flushed_at": time.time(),
            "stats": {**dataclasses.asdict(self.stats), "rejected": dict(self.stats.rejected)},
        }
        try:
            housekeeping = self.target.housekeeping()
        except CynomysError as exc:  # a report, never a reason to stop
            housekeeping = {"error": str(exc).splitlines()[0]}
        if housekeeping:
            report["target_maintenance"] = housekeeping
        write_json_atomic(self.report_path, report, durable=False)

    def _ack(self) -> None:
        if self.unacked and self.buffer.complete and not self.buffer.envelopes:
            self.committer.settle()  # acknowledgements in order: the flush in flight's first
            self.sub.ack(self.unacked)
            self.unacked = []
            self.sealed_acks = 0


def _after_ddl(ddl: Change, batch: Batch) -> Position:
    """How far the source is applied once the DDL ran: up to the earliest
    transaction among the changes after it, or the batch end when none
    follows.  The earliest, not the next in the list: a net change sits
    where its key was first changed but carries the transaction of its last
    change, and the state must not claim transactions whose other changes
    (keyless rows, other keys) are still only in the buffer."""
    at = next(i for i, c in enumerate(batch.changes) if c is ddl)
    after = [c.txn for c in batch.changes[at + 1:]]
    return min(after, key=Position.sort_key) if after else batch.end


def run_applier(cfg: Config, stop: threading.Event, *, until_idle_s: float = 0.0,
                monitor: ApplierMonitor | None = None) -> ApplierStats:
    """Run the applier daemon, retrying transient errors with backoff."""
    delay = 0.5
    while True:
        target = open_target(cfg)
        sub = make_subscriber(cfg)
        app = Applier(cfg, target, sub, make_opener(cfg), stop, monitor)
        began = time.monotonic()
        try:
            app.run(until_idle_s)
            return app.stats
        except CynomysError as exc:
            if monitor is not None:
                monitor.failed(exc)
            if not exc.transient or stop.is_set():
                raise
            if time.monotonic() - began > 60:
                delay = 0.5  # it had been running well: a new outage starts a new backoff
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
