"""Chunk readers: snapshot chunk selects on their own threads and connections.

The producer's loop must not wait for a chunk select (the log keeps flowing
while chunks load), and one select at a time leaves the source idle while
the producer converts, folds and ships the previous chunk.  So the snapshot
task (snapshot/coordinator.py) hands each chunk to a pool of
``[snapshot] max_connections`` reader threads, each with its own source
connection (the chunk driver, snapshot/source.py), and several chunks of a
table are read at once, each between its own watermarks.

Where chunks end.  A chunk is ``after < key <= end``; ``Plan`` says where the
next chunk of a table starts.  With one reader a chunk is the next ``rows``
rows after ``after`` (``LIMIT``) and ends at the last key read, as before.
With several, a reader first asks the source where the chunk ends
(``build_boundary_query``: the key ``rows`` rows on, found without sending
the rows), moves the plan past it and lets go of the plan, so the next
reader can start the next chunk while this one reads its range
(``build_range_query``: a fixed range, so rows inserted into it meanwhile
are read or come through the log, never lost to a LIMIT).  The last chunk of
a table (no boundary: fewer rows left) reads with ``LIMIT`` while holding
the plan; if it comes back full (rows appended meanwhile) the plan goes on
after its last key.  Each chunk gets a sequence number from its plan
in key order; the producer hands chunks over in that order, so the key it
records as done only grows.

Watermarks.  The producer creates each chunk's ``Window`` before the read is
queued: with DBLog it picks the two UUIDs (``ReadRequest.low/high``) and the
reader writes exactly those, so no watermark event can come by before the
producer watches for it.  Read-only reads return their GTID marks, which the
producer places in the log when the result arrives (changes of the table seen
meanwhile are kept and classified then).

With ``[snapshot] read_from`` each reader also holds a connection to that
replica of the source: its boundary queries and chunk selects run there,
each select once the replica has applied the chunk's low watermark, and the
watermarks stay on the source (snapshot/replica.py says why that is exact).
A replica that lags past ``replica_wait_s`` gives the chunk back
(``ReadResult.lagging``): a chunk read with ``LIMIT`` under the plan's lock
leaves the plan as it found it, a planned range comes back with its number
and bounds, and the producer asks for it again (``ReadRequest.fixed``) with
new watermarks.  The log goes on meanwhile, and no window stays open longer
than one wait (a window keeps every key the log changes in it).

Threads share nothing with the producer but the two queues and the plans
(each under its own lock); a reader's error goes back in its result and is
raised by the producer's thread (a lost source is transient: the producer
restarts and the snapshot resumes after its last recorded chunk).
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from cynomys.core.config import Config
from cynomys.core.model import Row
from cynomys.snapshot.chunker import build_boundary_query, build_chunk_query, build_range_query
from cynomys.snapshot.columns import TableInfo, convert_rows, row_converter
from cynomys.snapshot.replica import ReplicaLagging, replica_opener
from cynomys.snapshot.source import MODEL_TYPES, SnapshotConnection, chunk_driver
from cynomys.snapshot.watermark import WindowOpener
from cynomys.snapshot.window import GtidMarks

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """Where the next chunk of one table (a job's part) starts, shared by
    the readers (under ``lock``): ``after`` in driver key values (None:
    the table's start), ``done`` once the last chunk is planned, ``seq`` the
    next chunk's number."""

    after: tuple[Any, ...] | None
    done: bool = False
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass(frozen=True)
class ReadRequest:
    flight: int            # the producer's id of the chunk
    plan: Plan
    info: TableInfo
    where: str
    rows: int              # rows per chunk
    low: str = ""          # DBLog watermark UUIDs ("" read-only)
    high: str = ""
    # A planned range read again (the replica lagged): (seq, start, end) in driver key values.
    fixed: tuple[int, tuple[Any, ...] | None, tuple[Any, ...]] | None = None


@dataclass(frozen=True)
class ReadResult:
    flight: int
    seq: int = -1                          # -1: nothing was left to read
    start: tuple[Any, ...] | None = None   # driver key the chunk starts after (None: the table's start)
    rows: tuple[Row, ...] = ()             # model values, key order
    end: tuple[Any, ...] | None = None     # driver key the chunk ends at (its range's end, or its last row)
    exhausted: bool = False                # the table's last chunk
    marks: GtidMarks | None = None         # read-only windows
    error: BaseException | None = None
    # Not read: the replica lagged.  seq >= 0: a planned range to ask for again (start, end).
    lagging: ReplicaLagging | None = None


class ChunkReaders:
    """``size`` reader threads with their own connections (module doc)."""

    def __init__(self, cfg: Config, size: int) -> None:
        self.cfg = cfg
        self.size = max(1, size)
        self.driver = chunk_driver(cfg.source, cfg.snapshot.driver)
        self.requests: queue.Queue[ReadRequest | None] = queue.Queue()
        self.results: queue.Queue[ReadResult] = queue.Queue()
        self.busy = 0                      # requests not answered yet (the producer's count)
        self._threads = [threading.Thread(target=self._run, name=f"snapshot-reader-{i}", daemon=True)
                         for i in range(self.size)]
        for t in self._threads:
            t.start()
        log.info("snapshot: %d chunk reader(s), driver %s%s", self.size, self.driver,
                 f", reading chunks from the replica {cfg.snapshot.read_from}" if cfg.snapshot.read_from else "")

    def submit(self, req: ReadRequest) -> None:
        self.busy += 1
        self.requests.put(req)

    def collect(self) -> list[ReadResult]:
        out = []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                break
        self.busy -= len(out)
        return out

    def close(self) -> None:
        for _ in self._threads:
            self.requests.put(None)
        for t in self._threads:
            t.join(timeout=5)

    # -- the reader threads ----------------------------------------------------
    def _run(self) -> None:
        opener: WindowOpener | None = None
        try:
            while True:
                req = self.requests.get()
                if req is None:
                    return
                try:
                    if opener is None:
                        opener = self._opener()
                    res = self._read(opener, req)
                except BaseException as exc:  # raised in the producer's thread
                    res = ReadResult(req.flight, error=exc)
                    if opener is not None:
                        opener.close()  # a session may be inside a transaction: start afresh
                    opener = None
                self.results.put(res)
        finally:
            if opener is not None:
                opener.close()

    def _opener(self) -> WindowOpener:
        """A reader's connections: the source (watermarks), and the replica
        chunks are read from when ``[snapshot] read_from`` names one."""
        scfg = self.cfg.snapshot
        return WindowOpener(SnapshotConnection(self.cfg.source, self.driver), read_only=scfg.read_only,
                            schema=scfg.watermark_schema, producer_id=self.cfg.producer.id,
                            replica=replica_opener(self.cfg, self.driver))

    def _read(self, opener: WindowOpener, req: ReadRequest) -> ReadResult:
        s = req.info.schema
        if req.fixed is not None:
            return self._range(opener, req, *req.fixed)
        conn = opener.reads
        key, idx = s.key, s.key_indexes()
        plan = req.plan
        with plan.lock:
            if plan.done:
                return ReadResult(req.flight)
            after, seq = plan.after, plan.seq
            plan.seq += 1
            end: tuple[Any, ...] | None = None
            if self.size > 1:
                # Where this chunk ends, so the next reader may start after it now.
                got = conn.query(*_args(build_boundary_query(s.database, s.table, s.columns, key, after, req.rows,
                                                             req.where)))
                end = tuple(got[0]) if got else None
            if end is not None:
                plan.after = end
            else:
                # One reader, or the last chunk: it reads while holding the
                # plan (its end is its last row); the plan moves past it.
                query = build_chunk_query(s.database, s.table, s.columns, key, after, req.rows, req.where)
                try:
                    raw, marks = opener.read(query, req.low, req.high)
                except ReplicaLagging as exc:
                    plan.seq -= 1  # the plan was held: no other chunk took a number meanwhile
                    return ReadResult(req.flight, lagging=exc)
                full = len(raw) >= req.rows
                if raw:
                    end = tuple(raw[-1][i] for i in idx)  # driver values, as the next select takes them
                    plan.after = end
                plan.done = not full
                return ReadResult(req.flight, seq, after, _converted(req.info, raw, self.driver), end, not full, marks)
        assert end is not None
        return self._range(opener, req, seq, after, end)

    def _range(self, opener: WindowOpener, req: ReadRequest, seq: int, after: tuple[Any, ...] | None,
               end: tuple[Any, ...]) -> ReadResult:
        """A planned chunk, ``after < key <= end``, read outside the plan's lock."""
        s = req.info.schema
        query = build_range_query(s.database, s.table, s.columns, s.key, after, end, req.where)
        try:
            raw, marks = opener.read(query, req.low, req.high)
        except ReplicaLagging as exc:
            return ReadResult(req.flight, seq, after, end=end, lagging=exc)
        return ReadResult(req.flight, seq, after, _converted(req.info, raw, self.driver), end, False, marks)


def _args(q: Any) -> tuple[str, tuple[Any, ...]]:
    return q.sql, q.params


def _converted(info: TableInfo, raw: list[tuple[Any, ...]], driver: str) -> tuple[Row, ...]:
    return convert_rows(row_converter(info.schema.columns, MODEL_TYPES[driver]), raw)

