"""The shape and fold/batch stages: one producer run's batch under construction.

Each change is shaped first (cynomys/shape/stage.py: routed, its columns
kept and masked, filtered), then folded per (target table, shaped key)
-- the shape stage runs here so that what it drops still counts as one of
its transaction's changes (a resume point never depends on the rules).
Changes are folded per (table, key) with the producer's rules (reducer.fold
PRODUCER_RULES: exact for an applier holding any prefix of an envelope's
transactions).  A batch ends at a commit; a transaction with more than
``batch_max_events`` changes of its own is cut into fragments.  Each
envelope's metadata (core.model.EnvelopeMeta) says what stretch of the
source it covers and where the producer resumed before it (``after``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from cynomys.core.columnar import ManyRows
from cynomys.core.dialect import MARIADB
from cynomys.core.errors import TerminalError
from cynomys.core.model import Batch, Change, EnvelopeMeta, Op, Position
from cynomys.parser.stream import TableFilter
from cynomys.parser.txn import Assembler, Commit, Item, Progress
from cynomys.producer.ddl_scope import unreadable_elsewhere
from cynomys.producer.foreign_keys import check_ddl
from cynomys.reducer.fold import PRODUCER_RULES, Folder
from cynomys.reducer.sql import render_one
from cynomys.shape import Shaper, compile_rules
from cynomys.snapshot.keyless import KeylessRead

if TYPE_CHECKING:
    from cynomys.producer.loop import Producer

log = logging.getLogger(__name__)


class Batching:
    """One producer run's batch under construction and its place in the
    source: which transaction is open, how many of its changes were seen and
    shipped, and which changes to skip after a restart inside it."""

    def __init__(self, producer: Producer, start: Position) -> None:
        self.p = producer
        self.start = start  # where this run began reading
        # The shape stage (cynomys/shape): routes, columns, masks, filters,
        # on every change before it folds; None when [shape] asks for nothing.
        rules = compile_rules(producer.cfg, producer=True)
        self.shaper: Shaper | None = Shaper(rules) if rules.producer_active else None
        src = producer.cfg.source
        self.replicated = TableFilter(src.include_tables, src.exclude_tables)
        self.folder = self._folder()
        self.raw_in_batch = 0
        self.txn_in_batch = 0         # changes of the open transaction in this batch
        self.started = 0.0
        self.last_commit: Commit | None = None
        self.batch_from: tuple[Position, int] | None = None
        self.cur_tid: str | None = None
        self.cur_begin: Position | None = None
        self.txn_seen = 0             # changes of the open transaction read so far
        opened = producer.state.open
        self.frag = int(opened["frag"]) if opened else 0   # next fragment number of the open transaction
        # After a restart inside a transaction: its changes already shipped.
        self.skip_tid: str | None = opened["tid"] if opened else None
        self.skip_n = int(opened["shipped"]) if opened else 0
        if opened:
            log.info("resuming inside transaction %s: %d of its changes were sent in %d envelope(s); "
                     "skipping them", opened["tid"], self.skip_n, self.frag)

    def _folder(self) -> Folder:
        # Target tables keeping their history need every change: not folded.
        return Folder(PRODUCER_RULES, self.shaper.unfolded if self.shaper is not None else None)

    def in_txn(self, asm: Assembler) -> bool:
        """Inside a source transaction (or resuming inside one)."""
        return asm.begin is not None or self.frag > 0

    def at_boundary(self, asm: Assembler) -> bool:
        return not self.in_txn(asm) and self.raw_in_batch > 0 and self.last_commit is not None

    def flush_if_idle(self, asm: Assembler) -> None:
        if self.at_boundary(asm):
            assert self.last_commit is not None
            self.flush(True, self.last_commit.end, asm)

    def handle(self, out: Item, asm: Assembler) -> None:
        p = self.p
        if isinstance(out, Change):
            if out.tid != self.cur_tid:
                if type(out) is ManyRows and out.op is Op.READ and self.raw_in_batch and self.last_commit is not None \
                        and not self.in_txn(asm):
                    # Snapshot chunks start an envelope of their own (the task
                    # ends it after them: flush_after), so the applier decodes
                    # their READ records column-wise; next to the log's updates
                    # the whole envelope takes the reference decoder (~60 us a row).
                    self.flush(True, self.last_commit.end, asm)
                self._enter(out)
            # A ManyRows (a snapshot chunk, a bulk insert) counts its rows
            # (the wire has a record per row); counted as the source sent them, whatever
            # the shape rules keep, as resuming inside a transaction counts.
            n = len(out.images) if type(out) is ManyRows else 1
            if self.skip_tid is not None:
                if self.txn_seen < self.skip_n:
                    self.txn_seen += n
                    return  # in an envelope the transport already holds
                self.skip_tid = None
            p.monitor.change_in(out, n)
            shaped = self.shaper.change(out) if self.shaper is not None else out
            if out.op is Op.DDL and p.pattern_watch is not None:
                p.pattern_watch.on_ddl(out)  # a table created that a pattern names in another case
            if out.op is Op.DDL and shaped is not None:
                if unreadable_elsewhere(out, self.replicated):
                    shaped = None  # would stop the applier for a table nobody replicates
                else:
                    check_ddl(out, self.replicated, p.cfg.source.cascading_foreign_keys)
            if shaped is None:
                # Nothing of it goes (filtered, a column left out by a DDL):
                # still one of its transaction's changes, as counted when
                # resuming inside a transaction, whatever the rules are then.
                self.txn_seen += n
                return
            if not self.raw_in_batch:
                self.started = time.monotonic()
                if self.batch_from is None:
                    self.batch_from = (out.txn, self.txn_seen)
            self.folder.add(shaped)
            self.raw_in_batch += n
            self.txn_in_batch += n
            self.txn_seen += n
        elif isinstance(out, Commit):
            if self.skip_tid is not None:
                if self.cur_tid == self.skip_tid and self.txn_seen == self.skip_n:
                    self.skip_tid = None  # every change was shipped; only its end was not
            if self.skip_tid is not None:
                raise TerminalError(
                    f"producer state {p.store.describe()} says transaction {self.skip_tid} was partly sent "
                    f"({self.skip_n} changes), but reading from {p.state.checkpoint} ended a transaction "
                    f"at {out.end} first",
                    hint="the binlog at the checkpoint is not what was read before (a restored or different "
                         "source?); re-snapshot the target")
            self.last_commit = out
            p.stats["transactions"] += 1
            if self.raw_in_batch == 0 and self.frag == 0:
                # Nothing to ship (filtered or empty): the checkpoint
                # may still move, so a restart does not re-read it.
                p.set_checkpoint(out.end)
            elif self.frag or self.raw_in_batch >= p.max_events or \
                    time.monotonic() - self.started >= p.max_delay:
                self.flush(True, out.end, asm)
            self.cur_tid, self.cur_begin, self.txn_seen, self.txn_in_batch = None, None, 0, 0
        elif isinstance(out, Progress) and not self.in_txn(asm) and self.raw_in_batch == 0:
            p.set_checkpoint(out.end)

    def stream(self, read: KeylessRead, asm: Assembler) -> None:
        """A keyless table's read (snapshot/keyless.py): one transaction of
        any size, cut into fragments of ``read.fragment_rows`` rows (a keyed
        chunk's rows, sized by ``chunk_bytes``), at least ``batch_max_events``.
        It starts an envelope of its own, so an abandoned attempt can be
        dropped by the applier from where it starts."""
        # A fragment as large as a keyed table's chunk envelope, not one of
        # 5,000 rows: each envelope costs the producer a state save (fsync),
        # a signature and a Redis call -- 17% of its CPU in a 3M-row keyless
        # read at 5,000 rows (py-spy, session 28).  Memory: one chunk's rows.
        size = max(self.p.max_events, read.fragment_rows)
        self.flush_if_idle(asm)
        for item in read:
            for out in self._cut(item, size):
                self.handle(out, asm)
                if isinstance(out, Change) and self.txn_in_batch >= size:
                    self.flush(False, out.txn, asm)

    def _cut(self, item: Item, size: int) -> Sequence[Item]:
        """A ManyRows (a block of the read) cut where fragments end, so each
        holds at most ``size`` rows."""
        if type(item) is not ManyRows:
            return (item,)
        room, rows = size - self.txn_in_batch, item.images
        if len(rows) <= room:
            return (item,)
        cuts = [0, *range(max(room, 0), len(rows), size), len(rows)]
        return [replace(item, images=rows[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]

    def _enter(self, change: Change) -> None:
        """The first change of another transaction."""
        if self.skip_tid is not None and change.tid != self.skip_tid:
            raise TerminalError(
                f"producer state {self.p.store.describe()} says transaction {self.skip_tid} was partly sent "
                f"({self.skip_n} changes), but reading from {self.p.state.checkpoint} found transaction "
                f"{change.tid} first",
                hint="the binlog at the checkpoint is not what was read before (a restored or different "
                     "source?); re-snapshot the target")
        self.cur_tid, self.cur_begin = change.tid, change.txn
        self.txn_seen = 0
        self.txn_in_batch = 0

    def flush(self, complete: bool, end: Position, asm: Assembler) -> None:
        p = self.p
        changes = self.folder.changes()
        if p.cfg.producer.emit_sql:
            changes = [c if c.sql else _with_sql(c) for c in _rows_of(changes)]
        if not changes and not complete:
            return
        opened = p.state.open
        start = self.batch_from or (
            (Position.from_dict(opened["begin"]), int(opened["shipped"])) if opened else (end, 0))
        # ``after``: the checkpoint now, before this envelope is accepted --
        # everything between it and the envelope's first change was nothing
        # to ship (the checkpoint only moves over such transactions while the
        # batch is empty), so an applier holding ``after`` misses nothing.
        meta = EnvelopeMeta(start=start[0], start_n=start[1], incarnation=p.state.incarnation,
                            server=p.state.server, after=p.state.checkpoint or self.start,
                            frag=self.frag if self.frag or not complete else None)
        if complete:
            after_open = None
            checkpoint: Position | None = end
        else:
            assert self.cur_begin is not None and self.cur_tid is not None
            meta = replace(meta, stop=self.cur_begin, stop_n=self.txn_seen)
            after_open = {"tid": self.cur_tid, "begin": self.cur_begin.to_dict(), "shipped": self.txn_seen,
                          "frag": self.frag + 1}
            # Every transaction before the open one is in this batch or an
            # earlier one: the checkpoint moves to the last commit.
            last = self.last_commit.end if self.last_commit else None
            checkpoint = last if last is not None and (p.state.checkpoint is None or p.state.checkpoint < last) \
                else None
        first = changes[0].txn if changes else None
        batch = Batch(p.cfg.producer.id, tuple(changes), end, complete, first,
                      int(time.time() * 1e6), self.last_commit.commit_ts if self.last_commit else 0, meta.to_dict())
        seq = p.state.seq + 1
        p.state.pending = {"seq": seq, "checkpoint": checkpoint.to_dict() if checkpoint else None,
                           "open": after_open}
        p.save()
        p.sink.send(seq, batch, p.stop)
        p.monitor.batch_out(changes)
        p.accepted(p.state.pending)
        p.state.pending = None
        p.stats["batches"] += 1
        p.stats["changes_in"] += self.raw_in_batch
        p.stats["changes_out"] += len(changes)
        self.frag = 0 if complete else self.frag + 1
        self.folder = self._folder()
        self.raw_in_batch = 0
        self.txn_in_batch = 0
        self.batch_from = None


def _rows_of(changes: list[Change]) -> list[Change]:
    """``changes`` with each ManyRows as its Changes (one SQL text each)."""
    return [x for c in changes for x in (c.as_changes() if type(c) is ManyRows else (c,))]


def _with_sql(c: Change) -> Change:
    return replace(c, sql=render_one(c, MARIADB)) if c.op is not Op.DDL else c
