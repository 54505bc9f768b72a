"""Admit: the applier stage that decides what of each envelope the target needs.

Every integrity rule of the applier lives here, in the order they run
(``Admission.judge``), so that "what is applied" has one answer:

1. **Fence** (HA producers): an envelope sealed under an older lease term
   than one already taken.  At the next expected number it is not a replay
   but the producer's own work under a fencing counter that went backwards
   (reset in Redis): stop, unacknowledged.  At a number already taken it is
   a deposed leader's envelope: dead-letter it.
2. **Sequence chain**: envelopes of one producer are numbered without holes.
   A number past the next one is a gap (stop).  The chain is kept in memory
   (transport.sequence.SequenceTracker); the target keeps the highest number taken (``hwm``), so that
   state never moves backwards.
3. **Continuity**: an envelope that does not simply follow the last one --
   a number already taken (a producer whose state was rolled back re-sends
   under old numbers, batched differently) or a new producer incarnation --
   is admitted only if it says where its producer resumed (``after``, the
   producer's checkpoint when the envelope began) and that place is inside
   what the target holds.  Otherwise changes between what the target holds
   and where the producer resumed would be lost: stop, naming both places.
4. **Content**: a change is applied unless the target already holds its
   transaction.  Same server: by binlog position.  Another server (a
   failover): by GTID -- positions of two servers are never ordered by file
   name or number (the new primary numbers its files its own way).  Without
   GTIDs such a change cannot be placed: stop.

Admitting by content rather than by envelope number is exact because every
net change the producer folds carries a full final image or a delete and the
transaction of its last change, and the fold never lets a row vanish across
transactions (reducer/fold.py keeps a delete), so applying the changes whose
transactions the target lacks takes it from the state it holds to the state
at the envelope's end, whatever the envelope's boundaries.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable

from cynomys.core.errors import TerminalError
from cynomys.core.gtid import GtidSet, flavor_of, parse_any
from cynomys.core.model import AppliedState, Batch, Change, EnvelopeMeta, Position
from cynomys.transport.sequence import SequenceTracker

log = logging.getLogger(__name__)

RESNAPSHOT_HINT = ("if the producer's state was lost or rolled back, restore it (HA: S:state:P; else state_dir/"
                   "producer.json) and restart it; or set [source] start to the position the target holds and "
                   "start the producer with --fresh-start; or re-snapshot the target")


class Verdict(Enum):
    TAKE = "take"            # apply ``batch`` (held changes already dropped)
    DUPLICATE = "duplicate"  # everything in it is held: acknowledge, apply nothing
    DEAD = "dead"            # a deposed leader's envelope: dead-letter it
    FLUSH_FIRST = "flush"    # commit the buffer, then judge the envelope again


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    batch: Batch | None = None
    reason: str = ""


@dataclass
class Lineage:
    """What the applier knows of one producer."""

    held: AppliedState | None = None   # committed in the target
    hwm: int = 0                       # highest number taken: what the target records
    incarnation: str = ""
    server: str = ""
    fence: int = 0


@dataclass(frozen=True)
class BufferView:
    """What admission needs to know of the delay buffer."""

    envelopes: int       # envelopes taken since the last flush
    complete: bool       # it ends on a source transaction boundary


def _gtids(text: str) -> GtidSet | None:
    try:
        return parse_any(text)
    except TerminalError:
        return None


class Admission:
    """The admit stage for one applier (all producers it reads)."""

    def __init__(self) -> None:
        self.lineages: dict[str, Lineage] = {}
        # The chain: per producer, the number of the last envelope taken.  It
        # moves back when a re-sent number is taken (the producer renumbers
        # from there), unlike the recorded ``hwm``.
        self.chain = SequenceTracker()

    def _chain_to(self, pid: str, seq: int) -> None:
        self.chain.restore({**self.chain.snapshot(), pid: seq})

    # -- state ---------------------------------------------------------------
    def restore(self, state: AppliedState) -> None:
        """The target's committed state for a producer, read at start."""
        self.lineages[state.producer_id] = Lineage(
            held=state, hwm=state.seq, incarnation=state.incarnation, server=state.server, fence=state.fence)
        if state.seq >= 1:
            self._chain_to(state.producer_id, state.seq)

    def lineage(self, pid: str) -> Lineage:
        return self.lineages.setdefault(pid, Lineage())

    def held(self, pid: str) -> AppliedState | None:
        return self.lineages[pid].held if pid in self.lineages else None

    def committed(self, state: AppliedState) -> None:
        """A flush committed ``state``."""
        self.lineage(state.producer_id).held = state

    def state(self, pid: str, seq: int, position: Position, commit_ts: int, server: str = "") -> AppliedState:
        """The state to commit for producer ``pid`` at ``position``: it
        records the highest envelope number taken, never a lower one (a
        re-sent number does not move the recorded chain back), and who
        wrote it (server, incarnation, fence)."""
        lin = self.lineage(pid)
        server = server or lin.server
        held = lin.held
        if held is not None and self._behind(position, server, held):
            # A producer whose state was rolled back re-batches what it sends
            # again: its numbers can pass the highest taken while its
            # positions are still inside what the target holds.  Recording
            # such an envelope's end would move the target's position back,
            # and the changes between would then be admitted a second time.
            position, commit_ts = held.position, max(commit_ts, held.commit_ts)
        return AppliedState(pid, max(seq, lin.hwm), position, commit_ts,
                            server=server, incarnation=lin.incarnation, fence=lin.fence)

    def _behind(self, position: Position, server: str, held: AppliedState) -> bool:
        """``position`` lies strictly before what the target holds."""
        if self._same_server(server, held):
            return position.sort_key() < held.position.sort_key()
        mine, theirs = _gtids(held.position.gtid), _gtids(position.gtid)
        return mine is not None and theirs is not None and mine.covers(theirs) and not theirs.covers(mine)

    def adopt(self, pid: str, meta: EnvelopeMeta, fence: int) -> None:
        """An admitted envelope is being taken: the states committed from now
        on name its producer incarnation, source server and fencing token."""
        lin = self.lineage(pid)
        if meta.incarnation:
            lin.incarnation = meta.incarnation
        if meta.server:
            lin.server = meta.server
        if fence > lin.fence:
            if lin.fence:
                log.info("producer %s: new HA lease term (fencing token %d, was %d)", pid, fence, lin.fence)
            lin.fence = fence

    def advance(self, pid: str, seq: int) -> None:
        """Envelope ``seq`` is taken: it is the chain's last.  (A DDL inside
        it committed states before this, as of the envelope before it.)"""
        lin = self.lineage(pid)
        self._chain_to(pid, seq)
        lin.hwm = max(lin.hwm, seq)

    # -- the rules -----------------------------------------------------------
    def judge(self, pid: str, seq: int, fence: int, batch: Batch, buffer: BufferView) -> Decision:
        if seq < 1:
            raise TerminalError(f"envelope of producer {pid!r} has sequence number {seq}, below 1")
        lin = self.lineage(pid)
        meta = EnvelopeMeta.of(batch.meta)
        last = self.chain.hwm(pid)
        nxt = self.chain.classify(pid, seq) == "new"  # a gap raises SequenceGapError
        first_contact = lin.held is None and last is None
        if first_contact:
            return Decision(Verdict.TAKE, batch)
        new_life = bool(meta.incarnation and lin.incarnation and meta.incarnation != lin.incarnation)
        kept, all_held = self._content(pid, seq, batch, meta, lin)
        if 0 < fence < lin.fence:
            return self._fenced(pid, seq, fence, lin, nxt, all_held)
        if nxt and not new_life:
            return Decision(Verdict.TAKE, kept)  # even when empty: it moves the chain on
        # Not the plain successor: a number taken before, or a new incarnation.
        if all_held and not new_life:
            return Decision(Verdict.DUPLICATE, reason="the target holds all of it")  # delivered again
        if buffer.envelopes:
            if buffer.complete:
                return Decision(Verdict.FLUSH_FIRST)  # then compare with committed state only
            raise TerminalError(
                f"envelope {seq} of producer {pid!r} "
                + ("re-sends a number already taken" if not nxt else f"comes from a new incarnation {meta.incarnation}")
                + " while a transaction cut into fragments is buffered: the two attempts cannot be told apart; "
                  "nothing of either was applied",
                hint="restart the applier (the buffered fragments are delivered again); " + RESNAPSHOT_HINT)
        self._continuity(pid, seq, meta, lin, new_life)
        if new_life:
            log.warning("producer %s is a new incarnation %s (was %s) resuming at %s, inside what the target "
                        "holds: admitted", pid, meta.incarnation, lin.incarnation, meta.after)
        else:
            log.warning("producer %s sends envelope %d again (taken up to %s) with changes the target lacks, "
                        "resuming at %s inside what the target holds (its state was rolled back): applying "
                        "what the target lacks", pid, seq, last, meta.after)
        return Decision(Verdict.TAKE, kept)

    def _fenced(self, pid: str, seq: int, fence: int, lin: Lineage, nxt: bool, all_held: bool) -> Decision:
        """An envelope sealed under an older lease term than one taken.  A
        deposed leader's envelope at a number already taken, holding nothing
        the target lacks, is dead-lettered.  At the next number, or carrying
        changes the target lacks, it is not a stale copy: the fencing
        counter went backwards (reset, or a Redis that lost its increments)
        -- stop, unacknowledged, rather than drop changes."""
        if not nxt and all_held:
            return Decision(Verdict.DEAD, reason=f"fenced: token {fence} < newest {lin.fence} of producer {pid!r}")
        raise TerminalError(
            f"envelope {seq} of producer {pid!r}"
            + (", the next expected," if nxt else ", carrying changes the target lacks,")
            + f" has HA fencing token {fence}, older than token {lin.fence} already taken: the fencing counter went "
              f"backwards (S:fence:{pid} reset or lost in Redis?) or a deposed leader's envelope got past the "
              "transport; not applied, not acknowledged",
            hint=f"if the counter was reset, set it above {lin.fence} (redis-cli SET <stream>:fence:{pid} "
                 f"{lin.fence + 1}) and restart the producer; the envelopes are delivered again")

    def _continuity(self, pid: str, seq: int, meta: EnvelopeMeta, lin: Lineage, new_life: bool) -> None:
        held = lin.held
        what = (f"producer {pid!r} started anew (incarnation {meta.incarnation}, was {lin.incarnation})"
                if new_life else f"envelope {seq} of producer {pid!r} re-sends a number already taken "
                                 f"(up to {self.chain.hwm(pid)}) with changes the target lacks")
        if held is None:
            raise TerminalError(f"{what}, and the target records no position to compare with",
                                hint=RESNAPSHOT_HINT)
        if meta.after is None or meta.start_n:
            raise TerminalError(
                f"{what}, but it does not say where its producer resumed"
                + (" (it continues a transaction cut into fragments)" if meta.start_n else "")
                + f": changes after {held.position} could be lost", hint=RESNAPSHOT_HINT)
        if not self._within(meta.after, meta.server, held):
            raise TerminalError(
                f"{what}: it resumes at {meta.after}"
                + (f" on server {meta.server}" if meta.server and meta.server != held.server else "")
                + f", past what the target holds ({held.position}); the changes between would be lost",
                hint=RESNAPSHOT_HINT)

    def _within(self, after: Position, server: str, held: AppliedState) -> bool:
        """``after`` is at or before what the target holds."""
        if self._same_server(server, held):
            return after.sort_key() <= held.position.sort_key()
        mine, theirs = _gtids(held.position.gtid), _gtids(after.gtid)
        return mine is not None and theirs is not None and mine.covers(theirs)

    @staticmethod
    def _same_server(server: str, held: AppliedState) -> bool:
        # A state or envelope from before servers were recorded: one server.
        return not server or not held.server or server == held.server

    def _content(self, pid: str, seq: int, batch: Batch, meta: EnvelopeMeta, lin: Lineage) -> tuple[Batch, bool]:
        """The envelope without the changes whose transactions the target
        holds, and whether the target holds all of it."""
        held = lin.held
        if held is None:
            return batch, False
        if not batch.changes:
            return batch, self._all_held_end(batch, meta, lin)
        holds = self._holder(pid, seq, meta, held)
        kept = tuple(c for c in batch.changes if not holds(c))
        if len(kept) == len(batch.changes):
            return batch, False
        return replace(batch, changes=kept), not kept and self._all_held_end(batch, meta, lin)

    def _all_held_end(self, batch: Batch, meta: EnvelopeMeta, lin: Lineage) -> bool:
        """The envelope ends at or before what the target holds."""
        held = lin.held
        if held is None:
            return False
        if not batch.complete:
            return True  # it ends inside a transaction: held only if its changes are
        if self._same_server(meta.server, held):
            return batch.end.sort_key() <= held.position.sort_key()
        mine, theirs = _gtids(held.position.gtid), _gtids(batch.end.gtid)
        return mine is not None and theirs is not None and mine.covers(theirs)

    def _holder(self, pid: str, seq: int, meta: EnvelopeMeta, held: AppliedState) -> Callable[[Change], bool]:
        if self._same_server(meta.server, held):
            at = held.position.sort_key()
            return lambda c: c.txn.sort_key() < at
        gtids = _gtids(held.position.gtid)
        if gtids is None:
            raise TerminalError(
                f"envelope {seq} of producer {pid!r} comes from source server {meta.server}, the target holds "
                f"changes of server {held.server} up to {held.position}, and without GTIDs positions of two "
                "servers cannot be ordered: its changes cannot be placed; nothing was applied",
                hint="enable GTIDs on the source and [source] use_gtid = true before moving the producer to "
                     "another server; now re-snapshot the target")

        def holds(c: Change) -> bool:
            if flavor_of(c.tid) != gtids.flavor:
                raise TerminalError(
                    f"envelope {seq} of producer {pid!r} comes from source server {meta.server} (the target holds "
                    f"server {held.server}'s changes up to {held.position}), and its transaction {c.tid} has no "
                    "GTID: it cannot be placed; nothing was applied",
                    hint="enable GTIDs on the source ([source] use_gtid = true); re-snapshot the target")
            return gtids.contains(c.tid)
        return holds
