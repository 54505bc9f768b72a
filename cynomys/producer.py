"""The producer daemon: binlog -> folded batches -> sink, checkpoint after accept.

A reader thread pulls SourceEvents into a bounded queue (so a slow sink
stops the binlog read: bounded memory); the main loop assembles
transactions, folds changes per batch and hands batches to the sink.

Checkpoint discipline (Databus): the local checkpoint advances only to the
end of a transaction whose batch the sink has accepted.  After a crash the
producer re-reads from there; the applier recognises transactions it already
applied by their start position, so replays change nothing.  A transaction
larger than ``batch_max_events`` is sent in several batches (all but the
last marked incomplete) so memory stays bounded; the checkpoint still moves
only at its end.

Snapshots (cynomys/snapshot) run inside this loop: every assembled item
passes through the SnapshotCoordinator (``observe``), which drops the
watermark table's events; once per loop turn ``poll`` may run one chunk
select between watermarks, or hand back a finished chunk as READ changes
plus a Commit at the current transaction boundary, which are processed like
any other transaction.  ``_set_checkpoint`` tells the coordinator each time
the checkpoint moves: only then is a chunk recorded as finished.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from cynomys.core.checkpoint import read_json, write_json_atomic
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, CynomysError
from cynomys.core.model import Batch, Change, Op, Position
from cynomys.parser.stream import BinlogSource, SourceInspector, TableFilter
from cynomys.parser.txn import Assembler, Commit, Item, Progress
from cynomys.reducer.fold import Folder
from cynomys.reducer.sql import MARIADB, render_one
from cynomys.snapshot.coordinator import SnapshotCoordinator

log = logging.getLogger(__name__)


class BatchSink(Protocol):
    def last_sequence(self) -> int: ...

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        """Return once the batch is durably accepted downstream."""


@dataclass
class ProducerState:
    """What ``state_dir/producer.json`` holds."""

    checkpoint: Position | None = None
    seq: int = 0
    # The batch being published: written *before* publish, so after a crash
    # we can ask the transport whether it got there and, if so, resume right
    # after it.  Resuming exactly at a batch end keeps every batch boundary
    # the applier has seen intact: a re-read never re-folds changes already
    # applied together with new ones.
    pending: dict[str, Any] | None = None
    read: Position | None = None        # last position read (for status)
    last_event_ts: int = 0              # source time of the last event read
    updated: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ProducerState:
        d = read_json(path)
        if d is None:
            return cls()
        return cls(
            checkpoint=Position.from_dict(d["checkpoint"]) if d.get("checkpoint") else None,
            seq=int(d.get("seq", 0)), pending=d.get("pending"),
            read=Position.from_dict(d["read"]) if d.get("read") else None,
            last_event_ts=int(d.get("last_event_ts", 0)), updated=float(d.get("updated", 0)),
            stats=dict(d.get("stats", {})),
        )

    def save(self, path: Path) -> None:
        write_json_atomic(path, {
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None, "seq": self.seq,
            "pending": self.pending,
            "read": self.read.to_dict() if self.read else None, "last_event_ts": self.last_event_ts,
            "updated": time.time(), "stats": self.stats,
        })


_EOF = object()


class Producer:
    def __init__(self, cfg: Config, sink: BatchSink, stop: threading.Event | None = None,
                 *, blocking: bool = True) -> None:
        self.cfg = cfg
        self.sink = sink
        self.stop = stop or threading.Event()
        self.blocking = blocking
        self.state_path = cfg.resolve(cfg.producer.state_dir) / "producer.json"
        self.state = ProducerState.load(self.state_path)
        self.max_events = cfg.producer.batch_max_events
        self.max_delay = cfg.producer.batch_max_delay_ms / 1000.0
        self.stats = {"batches": 0, "changes_in": 0, "changes_out": 0, "transactions": 0}
        self.snap: SnapshotCoordinator | None = None

    # ------------------------------------------------------------------
    def _start_position(self, inspector: SourceInspector) -> Position:
        if self.state.checkpoint is not None:
            pos = self.state.checkpoint
            log.info("resuming from checkpoint %s", pos)
        else:
            pos = inspector.resolve_start(self.cfg.source.start)
            log.info("no checkpoint: starting at %s ([source] start = %r)", pos, self.cfg.source.start)
        if self.cfg.source.use_gtid and pos.gtid:
            # Resuming by GTID: file names may differ on another server (after
            # a failover); a purged GTID is refused by the server (error 1236),
            # which becomes a PositionLostError.
            return pos
        inspector.ensure_available(pos)
        return pos

    def _recover_pending(self) -> None:
        """Settle the batch that was being published when we last stopped."""
        accepted = self.sink.last_sequence()
        pending = self.state.pending
        if pending is not None:
            if accepted >= int(pending["seq"]):
                log.info("batch %s reached the transport before the last stop", pending["seq"])
                if pending["complete"]:
                    self.state.checkpoint = Position.from_dict(pending["end"])
            else:
                log.info("batch %s did not reach the transport; it will be read again", pending["seq"])
            self.state.pending = None
        self.state.seq = max(self.state.seq, accepted)
        self._save()

    def run(self) -> None:
        """Read until stopped (or, non-blocking, until the binlog's end)."""
        self._recover_pending()
        first_start = self.state.checkpoint is None
        inspector = SourceInspector(self.cfg.source)
        try:
            inspector.check_settings()
            start = self._start_position(inspector)
            mariadb = inspector.is_mariadb
        finally:
            inspector.close()
        # Snapshot chunks need the log to go on past their high watermark, so
        # a non-blocking run (--once) only records snapshot requests.
        self.snap = SnapshotCoordinator(self.cfg, start=start, first_start=first_start, enabled=self.blocking)
        table_filter = TableFilter(self.cfg.source.include_tables, self.cfg.source.exclude_tables)
        source = BinlogSource(self.cfg.source, start, blocking=self.blocking, is_mariadb=mariadb,
                              table_filter=self.snap.table_filter(table_filter))
        events: queue.Queue[Any] = queue.Queue(maxsize=256)
        reader = threading.Thread(target=self._read, args=(source, events), name="binlog-reader", daemon=True)
        reader.start()
        try:
            self._loop(events, self.snap, start)
        finally:
            self.stop.set()
            source.close()
            reader.join(timeout=5)
            self.snap.close()

    def _read(self, source: BinlogSource, events: queue.Queue[Any]) -> None:
        try:
            for ev in source:
                while not self.stop.is_set():
                    try:
                        events.put(ev, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
            events.put(_EOF)
        except BaseException as exc:  # handed to the main loop, which raises it
            if not self.stop.is_set():
                events.put(exc)

    # ------------------------------------------------------------------
    def _set_checkpoint(self, pos: Position) -> None:
        self.state.checkpoint = pos
        if self.snap is not None:
            self.snap.checkpointed(pos)

    def _loop(self, events: queue.Queue[Any], snap: SnapshotCoordinator, start: Position) -> None:
        asm = Assembler(start.gtid)
        folder = Folder()
        raw_in_batch = 0
        batch_started = 0.0
        frag = 0                     # index of the next batch within an open transaction
        last_commit: Commit | None = None
        last_save = 0.0
        emit_sql = self.cfg.producer.emit_sql

        def flush(complete: bool, end: Position) -> None:
            nonlocal folder, raw_in_batch, frag, last_commit
            changes = folder.changes()
            if emit_sql:
                changes = [c if c.sql else _with_sql(c) for c in changes]
            if not changes and not complete:
                return
            first = changes[0].txn if changes else None
            batch = Batch(self.cfg.producer.id, tuple(changes), end, complete, first,
                          int(time.time() * 1e6), last_commit.commit_ts if last_commit else 0,
                          {"frag": str(frag)} if (frag or not complete) else {})
            seq = self.state.seq + 1
            self.state.pending = {"seq": seq, "end": end.to_dict(), "complete": complete}
            self._save()
            self.sink.send(seq, batch, self.stop)
            self.state.seq = seq
            self.state.pending = None
            self.stats["batches"] += 1
            self.stats["changes_in"] += raw_in_batch
            self.stats["changes_out"] += len(changes)
            frag = 0 if complete else frag + 1
            if complete:
                self._set_checkpoint(end)
            folder = Folder()
            raw_in_batch = 0

        def at_boundary() -> bool:
            return asm.begin is None and raw_in_batch > 0 and last_commit is not None

        def handle(out: Item) -> None:
            nonlocal raw_in_batch, batch_started, last_commit
            if isinstance(out, Change):
                if not raw_in_batch:
                    batch_started = time.monotonic()
                folder.add(out)
                raw_in_batch += 1
            elif isinstance(out, Commit):
                last_commit = out
                self.stats["transactions"] += 1
                if raw_in_batch == 0 and frag == 0:
                    # Nothing to ship (filtered or empty): the checkpoint
                    # may still move, so a restart does not re-read it.
                    self._set_checkpoint(out.end)
                elif frag or raw_in_batch >= self.max_events or \
                        time.monotonic() - batch_started >= self.max_delay:
                    flush(True, out.end)
            elif isinstance(out, Progress) and asm.begin is None and raw_in_batch == 0 and frag == 0:
                self._set_checkpoint(out.end)

        while True:
            if self.stop.is_set():
                # Ship what ends on a transaction boundary; a transaction still
                # open is dropped here and re-read after restart (not checkpointed).
                if at_boundary() and frag == 0:
                    assert last_commit is not None
                    flush(True, last_commit.end)
                self._save()
                return
            # Snapshot work happens here, between events: a chunk select, or
            # a closed chunk's READ rows (only between source transactions).
            for out in snap.poll(at_boundary=asm.begin is None):
                handle(out)
            timeout = snap.wait_s()
            if at_boundary():
                timeout = min(timeout, max(0.0, batch_started + self.max_delay - time.monotonic()))
            try:
                item = events.get(timeout=timeout)
            except queue.Empty:
                if at_boundary() and frag == 0:
                    assert last_commit is not None
                    flush(True, last_commit.end)
                if time.monotonic() - last_save > 1.0:  # idle: keep `cynomys status` current
                    self._save()
                    last_save = time.monotonic()
                continue
            if item is _EOF:
                if at_boundary() and frag == 0:
                    assert last_commit is not None
                    flush(True, last_commit.end)
                self._save()
                return
            if isinstance(item, BaseException):
                raise item
            ev = item
            self.state.read = ev.end
            if ev.timestamp:
                self.state.last_event_ts = ev.timestamp
            for out in asm.feed(ev):
                seen = snap.observe(out)  # None: a watermark-table event, never shipped
                if seen is not None:
                    handle(seen)
            if raw_in_batch >= self.max_events and asm.begin is not None:
                # A large transaction: ship what we have and keep reading, so
                # memory stays bounded; the checkpoint waits for its commit.
                flush(False, ev.end)
            if time.monotonic() - last_save > 1.0:
                self._save()
                last_save = time.monotonic()

    def _save(self) -> None:
        self.state.stats = dict(self.stats)
        self.state.save(self.state_path)


def _with_sql(c: Change) -> Change:
    return replace(c, sql=render_one(c, MARIADB)) if c.op is not Op.DDL else c


def run_with_retry(make: Any, stop: threading.Event, *, max_backoff: float = 30.0) -> None:
    """Run ``make().run()`` until stopped, retrying transient errors with
    backoff; terminal errors propagate."""
    delay = 0.5
    while not stop.is_set():
        try:
            make().run()
            return
        except CynomysError as exc:
            if not exc.transient:
                raise
            log.warning("transient error, retrying in %.1fs: %s", delay, exc)
        except (ConnectionError, OSError) as exc:
            log.warning("connection error, retrying in %.1fs: %s", delay, exc)
        stop.wait(delay)
        delay = min(max_backoff, delay * 2)


class SealedSink:
    """Batch -> Avro -> sealed envelope -> transport (the producer's side of
    the wire).  ``send`` returns once the transport accepted the envelope."""

    def __init__(self, cfg: Config) -> None:
        from cynomys.schemas import codec
        from cynomys.transport.bus import open_publisher
        from cynomys.transport.envelope import Sealer
        from cynomys.transport.keys import load_private_key, load_public_key

        sec = cfg.security
        if not sec.applier_public_key or not sec.producer_private_key:
            raise ConfigError(
                f"[security] applier_public_key and producer_private_key must be set in {cfg.path}",
                hint="run `cynomys keygen --out DIR` and point [security] at the files it writes")
        self._encode = codec.encode
        self.producer_id = cfg.producer.id
        self.sealer = Sealer(
            cfg.producer.id, cfg.transport.stream,
            load_public_key(cfg.resolve(sec.applier_public_key), config_key="applier_public_key"),
            load_private_key(cfg.resolve(sec.producer_private_key), sec.passphrase or None,
                             config_key="producer_private_key", allow_readable=sec.allow_readable_private_keys),
            rotate_envelopes=cfg.transport.key_rotate_envelopes, rotate_seconds=cfg.transport.key_rotate_seconds)
        tcfg = cfg.transport
        if tcfg.kind == "file":
            tcfg = replace(tcfg, path=str(cfg.resolve(tcfg.path)))
        self.publisher = open_publisher(tcfg)

    def last_sequence(self) -> int:
        return self.publisher.last_sequence(self.producer_id)

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        self.publisher.publish(self.producer_id, seq, self.sealer.seal(self._encode(batch), seq), stop)

    def close(self) -> None:
        self.publisher.close()
