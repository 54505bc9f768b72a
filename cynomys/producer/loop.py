"""The producer's loop: binlog -> folded batches -> sink, checkpoint after accept.

The loop pulls batches of SourceEvents from the binlog, assembles
transactions, folds changes per batch and hands batches to the sink; while
it folds and seals, nothing is read (a slow sink stops the binlog read:
bounded memory).  The compiled reader (parser/creader.py) is read from the
loop's own thread, waiting at most until the loop's next poll; the
library's reader (the pure-Python path), which blocks without a timeout,
runs in a reader thread feeding a bounded queue, one event per item.  (A
reader thread for the compiled reader overlapped little -- making the
Python objects holds the GIL -- and on one core its hand-offs cost 12% of
the daemon's CPU on an OLTP binlog, measured with cynomys produce --once.)

Checkpoint discipline (Databus): the local checkpoint is a transaction
boundary; it advances only over transactions whose changes the sink has
accepted.  A batch normally ends at a commit.  A transaction with more than
``batch_max_events`` changes is cut into fragments (bounded memory): the
batch holding its first part also closes the transactions before it, so the
checkpoint moves to the last commit inside that batch, and the state records
the open transaction (``open``: its id, how many of its changes were shipped
and the next fragment number).  After a crash the binlog is read again from
the checkpoint -- the open transaction's start, where its table maps are --
and the changes already shipped are skipped, so the next envelope is the next
fragment.  Nothing the transport holds is ever sent again, and the batch
boundaries the applier has seen never shift.

Each envelope says which stretch of the source it covers (``meta``:
``from``/``from_n`` where it starts, ``open``/``open_n`` where an incomplete
one stops), so the applier can check that envelopes follow each other.

Snapshots and verify run inside this loop as plugged tasks (producer/tasks.py:
one protocol, one declared order): every assembled item passes through them
(``observe``; the snapshot task drops the watermark table's events); once per
loop turn each task's ``poll`` may run one chunk select between watermarks,
or hand back a finished chunk (READ changes, or a checksum record) plus a
Commit at the current transaction boundary, which are processed like any
other transaction.  ``set_checkpoint`` tells the tasks each time the
checkpoint moves: only then is a chunk recorded as finished.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from typing import Any, Protocol

from cynomys.core import compiled
from cynomys.core.config import Config
from cynomys.core.errors import CynomysError, LeaseLost, TerminalError
from cynomys.core.model import Batch, Change, EnvelopeMeta, Op, Position
from cynomys.metrics.events import ProducerTurn
from cynomys.metrics.monitor import ProducerMonitor
from cynomys.parser.files import ArchiveInspector
from cynomys.parser.stream import BinlogSource, SourceInspector, TableFilter, open_inspector
from cynomys.parser.txn import Assembler, Commit, Item, Progress
from cynomys.producer.batching import Batching
from cynomys.producer.state import FileStateStore, StateStore
from cynomys.producer.table_patterns import PatternWatch, check_source_scope
from cynomys.producer.tasks import ProducerTask, observe_in_order, plugged, watching, widen_filter
from cynomys.snapshot.keyless import KeylessRead, abandon_meta, is_snapshot_tid
from cynomys.snapshot.watermark import WATERMARK_TABLE

log = logging.getLogger(__name__)


class BatchSink(Protocol):
    def last_sequence(self) -> int: ...

    @property
    def bytes_sent(self) -> int:
        """Envelope bytes handed to the transport so far (for the metrics)."""

    @property
    def fence_token(self) -> int:
        """The HA lease term's fencing token sealed into envelopes (0: no HA)."""

    @property
    def fence_term(self) -> str:
        """That term's lease value ("token:owner"; "" without HA)."""

    def fence_holds(self) -> bool:
        """Whether the HA lease still holds this term's value (True without HA)."""

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        """Return once the batch is durably accepted downstream."""

    def describe(self) -> str:
        """Names the transport (for error messages)."""


_EOF = object()


# Events handled per turn of the producer's loop at most (see _loop): a
# turn takes batches until it holds this many.
_EVENTS_PER_TURN = 256
# Events the library's reader thread may read ahead (one per queue item).
_QUEUED_EVENTS = 256
# How long the loop blocks on the log with no task plugged in.
_IDLE_WAIT_S = 0.5


class Producer:
    def __init__(self, cfg: Config, sink: BatchSink, stop: threading.Event | None = None,
                 *, blocking: bool = True, monitor: ProducerMonitor | None = None,
                 store: StateStore | None = None, fresh_start: bool = False) -> None:
        self.cfg = cfg
        # `produce --fresh-start`: an empty state may start although the
        # transport shows this producer's history (the operator says so).
        self.fresh_start = fresh_start
        self.new_life = False  # this run created the incarnation (_recover_pending)
        self.monitor = monitor or ProducerMonitor(cfg)  # metrics/health (cynomys/metrics)
        self.sink = sink
        self.stop = stop or threading.Event()
        self.blocking = blocking
        self.state_path = cfg.resolve(cfg.producer.state_dir) / "producer.json"
        self.store: StateStore = store or FileStateStore(self.state_path)
        self.state = self.store.load()
        self.max_events = cfg.producer.batch_max_events
        self.max_delay = cfg.producer.batch_max_delay_ms / 1000.0
        self.stats = {"batches": 0, "changes_in": 0, "changes_out": 0, "transactions": 0}
        self.tasks: tuple[ProducerTask, ...] = ()  # plugged in by run (producer/tasks.py)
        # Table patterns no table matched at start (producer/table_patterns.py), set by run.
        self.pattern_watch: PatternWatch | None = None
        # While a task's items are being batched (_poll_tasks), checkpoints
        # are not reported to the tasks: the batching may ship what came
        # before those items first (a snapshot chunk starts an envelope of
        # its own) and move the checkpoint to the very position the items
        # were handed over at, while they are still unshipped.  Reported
        # then, the chunk would be recorded done, and lost by a crash
        # before its envelope.  The next report comes from a later flush.
        self._handing = False

    # ------------------------------------------------------------------
    def _start_position(self, inspector: SourceInspector | ArchiveInspector) -> Position:
        server = inspector.server_identity()
        if self.state.checkpoint is not None:
            pos = self._on_server(self.state.checkpoint, server)
            log.info("resuming from checkpoint %s", pos)
        else:
            pos = inspector.resolve_start(self.cfg.source.start)
            log.info("no checkpoint: starting at %s ([source] start = %r)", pos, self.cfg.source.start)
        self.state.server = server
        if self.cfg.source.use_gtid and pos.gtid:
            # Resuming by GTID: file names may differ on another server (after
            # a failover); a purged GTID is refused by the server (error 1236),
            # which becomes a PositionLostError.
            return pos
        inspector.ensure_available(pos)
        return pos

    def _on_server(self, checkpoint: Position, server: str) -> Position:
        """The checkpoint, as a place on ``server``.  A checkpoint written on
        another server (a failover moved [source]) holds a file:pos that
        means nothing here: only its GTID carries over."""
        was = self.state.server
        if not was or was == server:
            return checkpoint
        if self.cfg.source.use_gtid and checkpoint.gtid:
            log.warning("the source is another server (%s, the checkpoint was written on %s): resuming by GTID "
                        "%s; binlog positions of the two servers are never compared", server, was, checkpoint.gtid)
            # Before every position of the new server: the first commit read
            # there moves the checkpoint (file names of two servers do not order).
            rebased = Position("", 0, checkpoint.gtid)
            self.state.checkpoint = rebased
            return rebased
        raise TerminalError(
            f"the source is another server ({server}) than the one the checkpoint {checkpoint} was written on "
            f"({was}): binlog positions of two servers cannot be carried over",
            hint="after a failover, resume by GTID: enable GTIDs and set [source] use_gtid = true (the checkpoint "
                 "needs a GTID), or point [source] back at the old server; otherwise re-snapshot the target")

    def _recover_pending(self) -> None:
        """Settle the batch that was being published when we last stopped.

        The producer's own state is the authority on what it sent: the
        transport may hold at most the one envelope that was in flight.
        A transport claiming more was written by someone else (or belongs to
        another producer with the same id) -- trusting it would skip changes.
        """
        accepted = self.sink.last_sequence()
        pending = self.state.pending
        sent = self.state.seq + (1 if pending is not None else 0)
        # Empty: not even the envelope in flight recorded.  (A fresh producer
        # killed after publishing its first envelope, the announcement, and
        # before recording it accepted holds it as ``pending``: settled below.)
        if accepted and not self.state.seq and self.state.checkpoint is None and pending is None \
                and not self.fresh_start:
            raise TerminalError(
                f"the producer state {self.store.describe()} is empty, but the transport {self.sink.describe()} "
                f"holds envelopes up to {accepted} of producer {self.cfg.producer.id!r}: the state was lost, and "
                "starting at [source] start would lose or repeat changes",
                hint="restore the state (HA: the key in Redis, or the last state_dir/producer.json mirror; else "
                     "state_dir/producer.json from a backup); or, to start over on purpose, set [source] start to "
                     "the position the target holds (`cynomys status`) and run `cynomys produce --fresh-start`")
        token, term = self.sink.fence_token, self.sink.fence_term
        # The same term restarting its Producer (a transient error) finds its
        # own token; a token below ours, or ours taken by another holder (the
        # counter deleted and counted from 1 again), went backwards.
        if token and (token < self.state.fence or token == self.state.fence and self.state.term
                      and term != self.state.term):
            self._unless_deposed()
            raise TerminalError(
                f"this HA lease term has fencing token {token}, but producer {self.cfg.producer.id!r} already "
                f"worked under token {self.state.fence}: the fencing counter in Redis went backwards (deleted?)",
                hint=f"set the counter above {self.state.fence} (redis-cli SET <stream>:fence:<producer> "
                     f"{self.state.fence + 1}); the standby then takes the lease with a larger token")
        if token:
            self.state.fence, self.state.term = token, term
        if accepted > sent and (self.state.seq or self.state.checkpoint is not None):
            self._unless_deposed()
            raise TerminalError(
                f"the transport {self.sink.describe()} claims to hold envelope {accepted} of producer "
                f"{self.cfg.producer.id!r}, but this producer sent only up to {sent} "
                f"(state {self.store.describe()})",
                hint="another producer may be writing with the same [producer] id, or the transport's sequence "
                     "state was altered; find out which before going on (nothing was skipped)")
        if pending is not None:
            if accepted >= int(pending["seq"]):
                log.info("batch %s reached the transport before the last stop", pending["seq"])
                self.accepted(pending)
            else:
                log.info("batch %s did not reach the transport; it will be read again", pending["seq"])
            self.state.pending = None
        # A fresh state (no checkpoint) numbers on after what the transport holds.
        self.state.seq = max(self.state.seq, accepted)
        if not self.state.incarnation:
            self.state.incarnation = uuid.uuid4().hex[:16]
            self.new_life = True
            log.info("new producer incarnation %s", self.state.incarnation)
        self.save()

    def _unless_deposed(self) -> None:
        """Before an HA Producer stops on state that disagrees with its own
        term: raise LeaseLost instead when the lease is no longer this
        term's.  Deposed, not broken: while this term's Producer restarted
        (a transient error, e.g. Redis down longer than the lease), a standby
        took the lease and worked on, and the state or the transport read
        here is already its (seen under Redis host crashes: a state saved
        under a newer token).  Stand by, as a refused write does."""
        if self.sink.fence_token and not self.sink.fence_holds():
            raise LeaseLost(
                f"the HA lease of producer {self.cfg.producer.id!r} is no longer this term's (token "
                f"{self.sink.fence_token}): a standby took over",
                hint="nothing to do: this producer stands by again")

    def _abandon_snapshot_read(self) -> None:
        """We stopped inside the fragments of a keyless snapshot read
        (snapshot/keyless.py).  Nothing of the source lies inside it, so
        there is nothing to resume: the read is done again later, at a new
        position.  One empty envelope starting where the attempt started
        makes the applier drop the fragments it buffered; everything before
        that start was shipped, so the checkpoint moves there."""
        assert self.state.open is not None
        tid, shipped = str(self.state.open["tid"]), int(self.state.open.get("shipped", 0))
        begin, meta = abandon_meta(self.state.open)
        end = begin if self.state.checkpoint is None or self.state.checkpoint < begin else self.state.checkpoint
        seq = self.state.seq + 1
        self.state.pending = {"seq": seq, "checkpoint": end.to_dict(), "open": None}
        self.save()
        batch = Batch(self.cfg.producer.id, (), end, True, None, int(time.time() * 1e6), 0,
                      {**meta, "incarnation": self.state.incarnation, "server": self.state.server})
        self.sink.send(seq, batch, self.stop)
        self.accepted(self.state.pending)
        self.state.pending = None
        self.save()
        log.info("stopped inside snapshot read %s (%d changes sent): abandoned with envelope %d; the table is read "
                 "again", tid, shipped, seq)

    def _announce(self, start: Position) -> None:
        """A new incarnation's first envelope, empty, sent at once: it says
        where this producer begins (``after`` = ``start``), so an applier
        that holds an older incarnation's changes checks at once that
        nothing lies between -- not at the source's next write, which on a
        quiet source may be hours away."""
        seq = self.state.seq + 1
        self.state.pending = {"seq": seq, "checkpoint": start.to_dict(), "open": None}
        self.save()
        meta = EnvelopeMeta(start=start, incarnation=self.state.incarnation, server=self.state.server, after=start)
        self.sink.send(seq, Batch(self.cfg.producer.id, (), start, True, None, int(time.time() * 1e6), 0,
                                  meta.to_dict()), self.stop)
        self.accepted(self.state.pending)
        self.state.pending = None
        self.save()
        log.info("incarnation %s announced with envelope %d at %s", self.state.incarnation, seq, start)

    def accepted(self, pending: dict[str, Any]) -> None:
        """Make the state what it is once batch ``pending`` is accepted."""
        self.state.seq = int(pending["seq"])
        if "open" not in pending:  # written by an older version: {"seq", "end", "complete"}
            if pending.get("complete"):
                self.set_checkpoint(Position.from_dict(pending["end"]))
            return
        if pending.get("checkpoint"):
            self.set_checkpoint(Position.from_dict(pending["checkpoint"]))
        self.state.open = pending["open"]

    def run(self) -> None:
        """Read until stopped (or, non-blocking, until the binlog's end)."""
        compiled.announce()  # which hot path decodes rows (compiled or pure Python), once, at start
        self._recover_pending()
        if self.state.open is not None and is_snapshot_tid(str(self.state.open.get("tid", ""))):
            self._abandon_snapshot_read()
        # Archived binlog files ([source] binlog_files) are the history asked
        # for: no initial snapshot of the live tables.
        first_start = self.state.checkpoint is None and not self.cfg.source.binlog_files
        inspector = open_inspector(self.cfg.source)  # the server's, or [source] binlog_files'
        try:
            inspector.check_settings()
            self.pattern_watch = check_source_scope(self.cfg, inspector)
            start = self._start_position(inspector)
            mariadb = inspector.is_mariadb
        finally:
            inspector.close()
        if self.new_life and self.blocking:
            self._announce(start)
        # Chunks need the log to go on past their high watermark, so a
        # non-blocking run (--once) only records requests.
        self.tasks = plugged(self.cfg, start=start, first_start=first_start, enabled=self.blocking,
                             stop=self.stop)
        table_filter = TableFilter(self.cfg.source.include_tables, self.cfg.source.exclude_tables)
        source = BinlogSource(self.cfg.source, start, blocking=self.blocking, is_mariadb=mariadb,
                              table_filter=widen_filter(self.tasks, table_filter))
        if source.compiled:
            try:
                self._loop(_Direct(source), start)
            finally:
                source.close()
                for task in self.tasks:
                    task.close()
            return
        events: queue.Queue[Any] = queue.Queue(maxsize=_QUEUED_EVENTS)
        # Ends the reader with this run.  Not self.stop: that is the daemon's,
        # and run_with_retry reads it after a transient error (setting it here
        # made the daemon exit 0 on a source restart instead of retrying).
        halt = threading.Event()
        reader = threading.Thread(target=self._read, args=(source, events, halt), name="binlog-reader", daemon=True)
        reader.start()
        try:
            self._loop(events, start)
        finally:
            halt.set()
            source.close()
            reader.join(timeout=5)
            for task in self.tasks:
                task.close()

    def _read(self, source: BinlogSource, events: queue.Queue[Any], halt: threading.Event) -> None:
        try:
            for batch in source.batches():
                while not halt.is_set():
                    try:
                        events.put(batch, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if halt.is_set():
                    return
            events.put(_EOF)
        except BaseException as exc:  # handed to the main loop, which raises it
            if not halt.is_set():
                events.put(exc)

    # ------------------------------------------------------------------
    def set_checkpoint(self, pos: Position) -> None:
        self.state.checkpoint = pos
        if self._handing:
            return  # not yet: see __init__
        for task in self.tasks:
            task.checkpointed(pos)

    def _poll_tasks(self, run: Batching, asm: Assembler) -> None:
        """The tasks' work, between events: a chunk select, or a closed
        chunk's items (only between source transactions)."""
        for task in self.tasks:
            work = task.poll(at_boundary=not run.in_txn(asm))
            if isinstance(work, KeylessRead):
                run.stream(work, asm)  # a keyless table's whole read, in fragments (snapshot/keyless.py)
                continue
            self._handing = True
            try:
                for out in work:
                    run.handle(out, asm)
            finally:
                self._handing = False
            if work and task.flush_after:
                run.flush_if_idle(asm)

    def _loop(self, events: queue.Queue[Any] | _Direct, start: Position) -> None:
        asm = Assembler(start.gtid)
        run = Batching(self, start)
        last_save = 0.0
        # While no task watches, the last transaction end (or progress) the
        # tasks have not seen: with nothing in flight only the latest one
        # changes them (where the log is, for the next chunk's window), so it
        # reaches them once, before they next poll or observe anything.
        unseen: Item | None = None

        while True:
            self.monitor.turn(ProducerTurn(id(self), start, {**self.stats, "bytes": self.sink.bytes_sent},
                                           self.state.read, self.state.checkpoint, self.state.last_event_ts))
            if self.stop.is_set():
                # Ship what ends on a transaction boundary; a transaction still
                # open is dropped here and re-read after restart (not checkpointed).
                run.flush_if_idle(asm)
                self.save()
                return
            if unseen is not None:
                observe_in_order(self.tasks, unseen)
                unseen = None
            self._poll_tasks(run, asm)
            # No task watching ordinary row changes (no snapshot or verify
            # going on, the usual case): they and the transaction ends skip
            # the tasks' ``observe``, ~13% of the daemon on small OLTP
            # transactions (bench/producer_oltp.py).  Asked again after each
            # item that went through ``observe`` while none watched.
            watched = watching(self.tasks)
            timeout = min((task.wait_s() for task in self.tasks), default=_IDLE_WAIT_S)
            if run.at_boundary(asm):
                timeout = min(timeout, max(0.0, run.started + self.max_delay - time.monotonic()))
            try:
                batches = [events.get(timeout=timeout)]
            except queue.Empty:
                run.flush_if_idle(asm)
                if time.monotonic() - last_save > 1.0:  # idle: keep `cynomys status` current
                    self.save()
                    last_save = time.monotonic()
                continue
            # Whatever else the reader has queued is handled in this turn:
            # the polls above (stop, snapshot, verify, the delay timer) cost
            # more than an event of a small transaction, and a few hundred
            # events delay them by a millisecond or two.
            held = _size(batches[0])
            while held < _EVENTS_PER_TURN and type(batches[-1]) is list:  # nothing after the end or an error
                try:
                    batches.append(events.get_nowait())
                except queue.Empty:
                    break
                held += _size(batches[-1])
            for batch in batches:
                if batch is _EOF:
                    run.flush_if_idle(asm)
                    self.save()
                    return
                if isinstance(batch, BaseException):
                    raise batch
                for ev in batch:
                    self.state.read = ev.end
                    if ev.timestamp:
                        self.state.last_event_ts = ev.timestamp
                    for out in asm.feed(ev):
                        if not watched:
                            if isinstance(out, Change) and out.op is not Op.DDL \
                                    and out.table != WATERMARK_TABLE:  # (a Change or a ManyRows)
                                run.handle(out, asm)
                                continue
                            if type(out) in _ENDS:
                                unseen = out
                                run.handle(out, asm)
                                continue
                        if unseen is not None:
                            observe_in_order(self.tasks, unseen)
                            unseen = None
                        seen = observe_in_order(self.tasks, out)  # None: a task dropped it (the watermark table's)
                        if not watched and type(out) not in _ENDS:
                            # A DDL, a watermark seen while none watched: a task may
                            # watch now.  (Once one watches, it stays so until the
                            # next turn asks again: no scan of the jobs per change.)
                            watched = watching(self.tasks)
                        if seen is not None:
                            run.handle(seen, asm)
                    if run.txn_in_batch >= self.max_events and asm.begin is not None:
                        # A large transaction: ship what we have and keep reading, so
                        # memory stays bounded; the checkpoint waits for its commit.
                        # (Only the open transaction's own size cuts it: many small
                        # transactions wait for the next commit, so envelopes end on
                        # commits and the applier can flush after each of them.)
                        run.flush(False, ev.end, asm)
            if time.monotonic() - last_save > 1.0:
                self.save()
                last_save = time.monotonic()

    def save(self) -> None:
        self.state.stats = dict(self.stats)
        self.store.save(self.state)


#: Assembled items that end a transaction or move the reader: they never
#: make a task start watching (producer/tasks.py ``watches_rows``).
_ENDS = frozenset({Commit, Progress})


def _size(batch: Any) -> int:
    """Events in a queue item (a batch; 1 for the end or an error)."""
    return len(batch) if type(batch) is list else 1


class _Direct:
    """The compiled reader as the loop's queue: ``get`` reads on the loop's
    thread, waiting at most ``timeout`` (queue.Empty: nothing came);
    _EOF at the end of a non-blocking read; an error as an item."""

    def __init__(self, source: BinlogSource) -> None:
        self.source = source

    def get(self, timeout: float | None = None) -> Any:
        try:
            batch = self.source.next_batch(timeout)
        except Exception as exc:  # noqa: BLE001 -- an item, like the reader thread's: the loop raises it after
            return exc            # the batches it took before it in this turn (their events come first)
        if batch is None:
            return _EOF
        if not batch:
            raise queue.Empty
        return batch

    def get_nowait(self) -> Any:
        return self.get(0.0)


def run_with_retry(make: Any, stop: threading.Event, *, max_backoff: float = 30.0,
                   monitor: ProducerMonitor | None = None) -> None:
    """Run ``make().run()`` until stopped, retrying transient errors with
    backoff; terminal errors propagate."""
    delay = 0.5
    while not stop.is_set():
        try:
            make().run()
            return
        except CynomysError as exc:
            if monitor is not None:
                monitor.failed(exc)
            if not exc.transient:
                raise
            log.warning("transient error, retrying in %.1fs: %s", delay, exc)
        except (ConnectionError, OSError) as exc:
            if monitor is not None:
                monitor.failed(exc)
            log.warning("connection error, retrying in %.1fs: %s", delay, exc)
        stop.wait(delay)
        delay = min(max_backoff, delay * 2)
