"""VerifyCoordinator: in-stream checksums of key-range chunks (`cynomys verify`).

A chunked task (snapshot/task.py: the lifecycle, the producer's protocol,
the resume invariant), like the SnapshotCoordinator and with the same
DBLog windows, so it never locks the source and works while writes go on:

1. ``poll`` writes a low watermark, selects the next chunk (``chunk_size``
   rows in key order after the last chunk's end), writes a high watermark.
   The chunk covers the key range ``lo < key <= hi`` (hi: its last key; the
   last chunk of a table runs to the end).  Where the source computes the
   canonical row hash in SQL (MariaDB, every column type in
   verify/sqlhash.py; not a repair, which ships rows), the select returns
   (key, row hash) pairs instead of rows: nothing is hashed in Python.
2. ``observe`` sees the log go on.  A row change of the chunk's table inside
   the window may or may not be in the select, so it is *applied* to the
   chunk instead: a before image in the range removes its key, an after
   image in the range sets the row (full row images make each one the row's
   whole state).  That is the same whether the select saw the change or not,
   so once the log is past the high watermark the chunk holds the range
   exactly as the source had it at the stream's current position.
3. At the next transaction boundary the chunk leaves as one CHECKSUM record
   (row count + canonical multiset hash, verify/checksum.py) in a
   transaction of its own; the producer ships it at once, and the applier
   computes the same checksum over the same range on the target once
   everything before it is committed.

Key order.  A range means the same keys on both sides only if both compare
keys alike: byte order (verify/checksum.py, "Key order").  A key whose
columns MariaDB already compares that way (numbers, temporals, binary
strings, text in ``utf8mb4_nopad_bin``) is read as above, one indexed
``key > lo ORDER BY key LIMIT n`` select per chunk.  A key with a text
column in a collation (MariaDB's default utf8mb4_general_ci: ``'a' < 'B'``,
``'a' = 'a '``), or an ENUM/SET (sorted by member number), cannot be cut
that way: the index is in the collation's order, and ``CAST(k AS BINARY) >
x`` cannot use it, so a select per chunk would scan the whole table for
every chunk (quadratic).  Such a table is *streamed* instead (``_Stream``):
one select of the remaining range ``ORDER BY CAST(k AS BINARY)`` (one scan
and one sort on the server, whatever the table's size) inside one window --
low watermark, ``START TRANSACTION WITH CONSISTENT SNAPSHOT``, high
watermark -- read through a server-side cursor; each chunk is the next
``chunk_size`` rows of it.  The window stays open until the last chunk, so
every row change of the table after the low watermark is kept (the latest
image per key, ``pending``, for keys not emitted yet) and applied to the
chunk it falls in when that chunk is emitted: full row images make the
chunk the range's state at its emission, read early or not.  The cost is
one long consistent read (InnoDB keeps old row versions for it, as for a
keyless snapshot) and ``pending``'s memory, bounded: past ``_PENDING_MAX``
keys the stream starts again from the next chunk.  Repairs of such a table
use the same stream over the damaged range (a bounded scan).

A table without a primary key is one chunk (the whole table), streamed the
same way and hashed while it is read, so it never sits in memory (a repair
keeps its rows: they are shipped).  A change to it inside the window cannot
be placed (rows have no identity), so the read is done again, as the
snapshot does.

Repair (``cynomys verify --repair``) reads a mismatching range the same way,
in chunks of at most ``chunk_size`` rows, and emits for each at one
boundary: PURGE (delete the chunk's range on the target), the range's rows
as READ changes, and a CHECKSUM of them, so the repaired range is verified
again in the same go.  Each chunk must fit in one envelope (the producer
stops on a larger one): a keyed chunk too large is cut shorter; a keyless
table's repair is one transaction of all its rows, and when it does not fit
the task fails alone, naming the fix (a keyless snapshot streams it in
fragments).  As a last guard, a repair chunk the producer stopped on
``_SHIP_ATTEMPTS`` times without getting past it fails its task instead of
stopping replication at every restart.

State: ``<producer state_dir>/verify.json`` (verify/state.py: jobs, and per
task the end of the last chunk the checkpoint has passed: a producer
restarted after a crash reads a chunk again rather than lose it); requests
in ``<producer state_dir>/verify-requests/`` (written by `cynomys verify`).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import pymysql
import pymysql.cursors

from cynomys.core.config import Config
from cynomys.core.model import Batch, Change, Op, Position, Row, TableSchema, Value
from cynomys.parser.txn import Commit, Item
from cynomys.shape import Shaper, compile_rules
from cynomys.snapshot.chunker import (
    COLUMN_ORDER_SQL,
    ChunkQuery,
    byte_key_param,
    byte_key_sql,
    decode_key,
    encode_key,
    key_condition,
    quote_ident,
    select_list,
    unordered_columns,
)
from cynomys.snapshot.columns import TableInfo, row_converter
from cynomys.snapshot.errors import SnapshotError
from cynomys.snapshot.keyless import KeylessRead
from cynomys.snapshot.source import SnapshotConnection, translate
from cynomys.snapshot.task import POLL_S, ChunkedTask, Emitted
from cynomys.snapshot.window import Window
from cynomys.verify.checksum import MASK, Checksum, KeyRange, RowHasher, key_of, key_predicate, sort_key
from cynomys.verify.sqlhash import row_hash_sql
from cynomys.verify.state import CANCELLED, FAILED, RUNNING, VerifyJob, VerifyTask, store_for

log = logging.getLogger(__name__)

#: Rows per verify chunk unless --chunk-size or [snapshot] chunk_size say
#: otherwise.  A chunk costs two watermarks, an envelope and a target
#: transaction whatever its rows, and with row hashes computed by the source
#: its rows cost a few bytes each: 20000 (5000 before the hashes).
VERIFY_CHUNK_ROWS = 20_000
_KEYLESS_ATTEMPTS = 20
_KEEP_FINISHED = 20
#: Repair chunks shipped without the checkpoint getting past them before
#: the task gives up (the producer stopped on each: see the module doc).
_SHIP_ATTEMPTS = 3
#: Keys changed since a stream's low watermark kept at most; beyond, the
#: stream starts again from its next chunk (a new, short window).
_PENDING_MAX = 200_000
#: Rows fetched from a stream per round trip.
_FETCH_ROWS = 1000
#: A keyless table is read and hashed across polls, this long per poll, so
#: the producer's loop goes on shipping the log meanwhile.
_READ_SLICE_S = 0.2
# The server gives up on a client that does not read for net_write_timeout
# seconds; a stream is read between the producer's envelopes.
_NET_WRITE_TIMEOUT_S = 3600


@dataclass
class _Active:
    """One chunk of a table whose key MariaDB compares in byte order: one
    indexed select between its own watermarks.

    ``rows`` maps each key to its row, or (``hasher`` set: the select
    returned each row's hash, computed by the source in SQL) to its row
    hash: a change in the window then sets the hash of its image."""

    job_id: str
    part: int
    info: TableInfo
    rng: KeyRange
    window: Window
    rows: dict[tuple[Value, ...], Any] = field(default_factory=dict)
    exhausted: bool = True
    hasher: RowHasher | None = None

    def apply(self, change: Change) -> bool:
        """A change inside the window: its images, in the chunk's range, set
        the chunk's rows (the select may or may not have seen it)."""
        idx = change.schema.key_indexes() if change.schema is not None else ()
        if not idx:
            return False
        if change.before is not None:
            k = tuple(change.before[i] for i in idx)
            if self.rng.contains(k):
                self.rows.pop(k, None)
        if change.after is not None:
            k = tuple(change.after[i] for i in idx)
            if self.rng.contains(k):
                self.rows[k] = change.after if self.hasher is None else self.hasher.row(change.after)
        return False

    def checksum(self) -> Checksum | None:
        """The chunk's checksum, when it holds hashes (None: rows)."""
        if self.hasher is None:
            return None
        return Checksum(len(self.rows), sum(self.rows.values()) & MASK)


@dataclass
class _Stream:
    """One select of a task's remaining range, in byte order of the key (or
    a keyless table, whole), read chunk by chunk inside one window (see
    the module doc)."""

    job_id: str
    part: int
    info: TableInfo
    conn: SnapshotConnection | None     # its own connection, in a consistent-snapshot transaction
    cursor: Any                         # a pymysql SSCursor on it
    window: Window
    lo: tuple[Value, ...] | None = None   # the next chunk starts after it
    hi: tuple[Value, ...] | None = None   # the task's end (None: the table's)
    # keyed: the latest image (None: deleted) of each key > lo changed since
    # the low watermark; rows read past a chunk cut short (already current)
    pending: dict[tuple[Value, ...], Row | None] = field(default_factory=dict)
    carry: list[Row] = field(default_factory=list)
    eof: bool = False
    # keyless: changed in the window; the checksum so far; a repair's rows
    dirty: bool = False
    count: int = 0
    total: int = 0
    rows: list[Row] = field(default_factory=list)
    size: int = 0

    @property
    def keyed(self) -> bool:
        return bool(self.info.schema.key)

    @property
    def remaining(self) -> KeyRange:
        return KeyRange(self.lo, self.hi)

    def apply(self, change: Change) -> bool:
        """A change inside the window: kept for the chunk its key falls in
        (a keyless table: the read is spoilt).  True: more keys changed than
        ``_PENDING_MAX``, the stream must start again."""
        idx = change.schema.key_indexes() if change.schema is not None else None
        if idx is None:
            return False
        if not idx or not self.keyed:
            self.dirty = True
            return False
        rest = self.remaining
        # Before then after: an UPDATE that keeps its key ends with its image.
        if change.before is not None:
            k = tuple(change.before[i] for i in idx)
            if rest.contains(k):
                self.pending[k] = None
        if change.after is not None:
            k = tuple(change.after[i] for i in idx)
            if rest.contains(k):
                self.pending[k] = change.after
        return len(self.pending) > _PENDING_MAX

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()  # ends the read transaction; unread rows go with the connection
            self.conn = None
        self.cursor = None


@dataclass(frozen=True)
class _Emitted(Emitted):
    chunk: dict[str, Any]      # {"id", "table", "range"}: what the job records once it is confirmed


def chunk_id(job_id: str, task: VerifyTask, n: int) -> str:
    return f"{job_id}/{task.name}/{n}"


def range_sql(key: tuple[str, ...], rng: KeyRange) -> tuple[str, tuple[Any, ...]]:
    """``lo < key <= hi`` as MariaDB SQL (``%s`` parameters), '' when whole.
    For a key MariaDB compares in byte order only (``byte_ordered``): the
    condition the range optimizer turns into an index range."""
    conds: list[str] = []
    params: list[Any] = []
    if rng.lo is not None:
        c, p = key_condition(key, [sql_param(v) for v in rng.lo])
        conds.append(c)
        params.extend(p)
    if rng.hi is not None:
        c, p = key_condition(key, [sql_param(v) for v in rng.hi])
        conds.append(f"NOT ({c})")
        params.extend(p)
    return " AND ".join(conds), tuple(params)


def stream_sql(info: TableInfo, unordered: dict[str, str] | frozenset[str],
               rng: KeyRange) -> tuple[str, tuple[Any, ...]]:
    """The select of a stream: the rows of ``rng``, in byte order of the key,
    the ``unordered`` key columns compared and sorted as their UTF-8 bytes
    (no index serves it: one scan and one sort of the range, which is why a
    table is streamed once rather than selected per chunk).  A keyless
    table: every row, in no order."""
    schema = info.schema

    def q(name: str) -> str:
        return quote_ident(name).replace("%", "%%")

    def expr(name: str, quoted: str) -> str:
        return byte_key_sql(quoted) if name in unordered else quoted

    def param(name: str, v: Value) -> Any:
        return byte_key_param(v) if name in unordered else sql_param(v)

    sql = f"SELECT {select_list(schema.columns)} FROM {q(schema.database)}.{q(schema.table)}"
    if not schema.key:
        return sql, ()
    where, params = key_predicate(schema.key, rng, q, lambda i: "%s", expr=expr, param=param)
    if where:
        sql += " WHERE " + where
    sql += " ORDER BY " + ", ".join(expr(k, q(k)) for k in schema.key)
    return sql, tuple(params)


def sql_param(v: Value) -> Any:
    """A model key value as a driver parameter (TIMESTAMP keys: naive UTC,
    as the session (time_zone +00:00) compares them)."""
    import datetime

    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return v


def _row_bytes(row: Row) -> int:
    """A cheap upper-ish estimate of a row's size on the wire."""
    return 16 + sum(len(v) if isinstance(v, (str, bytes, bytearray)) else 9 for v in row if v is not None)


class VerifyCoordinator(ChunkedTask[VerifyJob, _Active | _Stream, _Emitted]):
    kind = "verify"
    # A verification record ends its batch: the applier checks it once it
    # has committed everything up to it, so it should not wait in a batch
    # for more changes.
    flush_after = True

    def __init__(self, cfg: Config, *, start: Position, enabled: bool = True) -> None:
        super().__init__(cfg, store_for(cfg), start=start, enabled=enabled)
        self._keyless_attempts: dict[tuple[str, int], int] = {}
        self._described: dict[str, tuple[TableInfo, dict[str, str]]] = {}
        # A repair chunk's records must fit one envelope next to whatever
        # the producer batched before them (less than a batch of changes):
        # half the limit leaves room for that.
        self.ship_budget = max(1, cfg.transport.max_envelope_bytes // 2)
        # Checksums are of the rows as the target holds them: shaped (verify stays exact).
        self.shaper = Shaper(compile_rules(cfg, producer=enabled))

    # -- shaped tables ([shape]: the target holds rows as the shape stage makes them)
    def _shaped_refusal(self, schema: TableSchema) -> str:
        """Why a table's target cannot be compared range by range, or ''."""
        why = self.shaper.rules.verify_refusal(schema.database, schema.table)
        if not why and self.shaper.rules.shaped(schema.database, schema.table) and \
                self.shaper.shape_of(schema).key_masked:
            why = "its primary key is masked: a key range of the source is no key range of the hashed keys"
        return why

    def _hashing(self, schema: TableSchema) -> tuple[RowHasher, Callable[[Row], Row | None]]:
        """The hasher of the rows as the target holds them, and the view of a
        source row there (None: the row filter leaves it out)."""
        if not self.shaper.rules.shaped(schema.database, schema.table):
            return RowHasher(schema.columns), lambda r: r
        shape = self.shaper.shape_of(schema)
        keep, row = shape.keep, shape.row
        return RowHasher(shape.schema.columns), lambda r: row(r) if keep is None or keep(r) else None

    def wait_s(self) -> float:
        a, s = self._flight()
        if a is not None and a.window.closing:
            return 0.0
        if s is not None and (s.window.closing or (not s.keyed and not s.eof)):
            return 0.0  # chunks to emit, or a keyless table being read
        if a is None and s is None and self.enabled:
            return self._next_chunk_due_s()  # the next chunk may start now
        return POLL_S

    def _flight(self) -> tuple[_Active | None, _Stream | None]:
        """The read in flight (``_reading``) as what it is: a chunk, or a stream."""
        r = self._reading
        return (r, None) if isinstance(r, _Active) else (None, r)

    # -- the log -----------------------------------------------------------------

    def _on_ddl(self, change: Change) -> None:
        self._described.clear()
        a, s = self._flight()
        if a is not None and change.database == a.info.schema.database:
            log.info("verify: DDL inside the window of a chunk of %s: reading that chunk again", a.info.name)
            self._reading = None
        if s is not None and change.database == s.info.schema.database:
            log.info("verify: DDL while reading %s: reading it again from its next chunk", s.info.name)
            self._drop_stream()

    def _on_change(self, f: _Active | _Stream, change: Change) -> None:
        if f.apply(change):
            log.info("verify %s: more than %d keys of %s changed while it was read: reading it again from its "
                     "next chunk", f.job_id, _PENDING_MAX, f.info.name)
            self._drop_stream()

    def _drop_work(self, job_id: str | None, part: int | None = None) -> None:
        if self._concerns(self._reading, job_id, part):
            self._drop_stream()
            self._reading = None

    # -- chunks ------------------------------------------------------------------
    def _chunk_size(self, job: VerifyJob) -> int:
        return int(job.chunk_size or self.scfg.chunk_size or VERIFY_CHUNK_ROWS)

    def _start(self, job: VerifyJob, i: int) -> bool:
        t = job.tasks[i]
        if t.attempts >= _SHIP_ATTEMPTS:
            self._fail(job.id, i, (
                f"the producer stopped {t.attempts} times while shipping a repair chunk of this range and never got "
                "past it, so the repair was given up and the range left as it is (fix: see the producer's log for "
                "why, e.g. an envelope over [transport] max_envelope_bytes)"))
            return False
        info, unordered = self._describe(t)
        key = info.schema.key
        if key and not unordered:
            self._start_chunk(job, i, info)
            return True
        if unordered and (job.id, i) not in self._cursors:
            log.info("verify %s: %s: key column(s) %s compared in byte order, not in their SQL order "
                     "(%s): the table is read in one sorted pass", job.id, t.name, ", ".join(unordered),
                     "; ".join(f"{k}: {why}" for k, why in unordered.items()))
        self._start_stream(job, i, info, unordered)
        return True

    def _describe(self, t: VerifyTask) -> tuple[TableInfo, dict[str, str]]:
        """The table and its key columns not compared in byte order; kept
        until a DDL (four information_schema queries per chunk otherwise)."""
        got = self._described.get(t.name)
        if got is None:
            conn = self._connection()
            info = conn.describe(t.database, t.table)
            key = info.schema.key
            unordered = unordered_columns(conn.query(COLUMN_ORDER_SQL, (t.database, t.table)), key) if key else {}
            got = self._described[t.name] = (info, unordered)
        return got

    def _row_hash_sql(self, info: TableInfo, t: VerifyTask) -> str | None:
        """The SQL hash of a row when the source can compute it exactly
        (verify/sqlhash.py) and the chunk needs no rows (not a repair).
        MariaDB only: MySQL's text of a JSON value is untested here."""
        if t.repair or not self._connection().is_mariadb:
            return None
        if self.shaper.rules.shaped(t.database, t.table):
            # The target holds the rows shaped (filtered, cut, masked,
            # renamed): hashed as the shape stage makes them, in Python.
            return None
        expr = row_hash_sql(info.schema.columns)
        return None if expr is None else expr.replace("%", "%%")  # the driver formats the statement with %

    def _start_chunk(self, job: VerifyJob, i: int, info: TableInfo) -> None:
        t = job.tasks[i]
        key = info.schema.key
        lo = decode_key(self._cursor(job.id, i, t).after)
        hi = decode_key(t.hi)
        rng = KeyRange(lo, hi)
        cond, params = range_sql(key, rng)
        table = f"{quote_ident(t.database)}.{quote_ident(t.table)}".replace("%", "%%")
        # Each row's hash computed by the source where it can: the key and
        # one number a row cross the wire, and nothing is rendered or hashed
        # in Python (the producer's side ran at ~64k rows/s hashing rows).
        row_hash = self._row_hash_sql(info, t)
        key_cols = [c for c in info.schema.columns if c.name in key]
        key_cols.sort(key=lambda c: key.index(c.name))
        if row_hash is None:
            sql = f"SELECT {select_list(info.schema.columns)} FROM {table}"
        else:
            sql = f"SELECT {select_list(key_cols)}, {row_hash} FROM {table}"
        if cond:
            sql += " WHERE " + cond
        # A repair range is read in chunks too: each is shipped with its rows,
        # and an envelope has a size limit.
        size = self._chunk_size(job)
        sql += " ORDER BY " + ", ".join(quote_ident(k).replace("%", "%%") for k in key) + f" LIMIT {size}"
        raw, window = self._watermarks().select(ChunkQuery(sql, params), self._last_end)
        exhausted = len(raw) < size
        if row_hash is None:
            convert = row_converter(info.schema.columns)
            keyf = key_of(info.schema)
            rows = [convert(r) for r in raw]
            if not exhausted:
                rng = KeyRange(lo, keyf(rows[-1]))
            self._reading = _Active(job.id, i, info, rng, window, {keyf(r): r for r in rows}, exhausted)
            return
        convert_key = row_converter(key_cols)
        n = len(key_cols)
        hashed = {convert_key(r[:n]): int(r[n]) for r in raw}
        if not exhausted:
            rng = KeyRange(lo, convert_key(raw[-1][:n]))
        self._reading = _Active(job.id, i, info, rng, window, hashed, exhausted, RowHasher(info.schema.columns))

    def _start_stream(self, job: VerifyJob, i: int, info: TableInfo, unordered: dict[str, str]) -> None:
        t = job.tasks[i]
        keyed = bool(info.schema.key)
        lo = decode_key(self._cursor(job.id, i, t).after) if keyed else None
        hi = decode_key(t.hi) if keyed else None
        sql, params = stream_sql(info, unordered, KeyRange(lo, hi))
        opener = self._watermarks()
        read = SnapshotConnection(self.cfg.source)
        try:
            read.query(f"SET SESSION net_write_timeout = {_NET_WRITE_TIMEOUT_S}")
            # The read view is taken between the two watermarks, on the
            # stream's own connection; the select below (however long its
            # sort) reads from it.
            window = opener.around(read.consistent_read, self._last_end)
            cursor = read.conn.cursor(pymysql.cursors.SSCursor)
            try:
                cursor.execute(sql, params)
            except pymysql.err.MySQLError as exc:
                raise translate(exc, self.cfg.source, " ".join(sql.split())[:300]) from None
        except BaseException:
            read.close()
            raise
        self._reading = _Stream(job.id, i, info, read, cursor, window, lo, hi)

    def _work(self, at_boundary: bool) -> Sequence[Item] | KeylessRead:
        a, s = self._flight()
        if a is not None and a.window.closing and at_boundary:
            return self._emit(a)
        if s is not None:
            try:
                return self._pump(s, at_boundary)
            except SnapshotError as exc:
                self._fail(s.job_id, s.part, exc.one_line())
        return []

    def _drop_stream(self) -> None:
        _, s = self._flight()
        if s is not None:
            s.close()
            self._reading = None

    def _fetch(self, s: _Stream, n: int) -> list[Row]:
        """Up to ``n`` more rows of the stream ([] at its end)."""
        if s.eof or s.cursor is None:
            s.eof = True
            return []
        try:
            raw = s.cursor.fetchmany(n)
        except pymysql.err.MySQLError as exc:
            raise translate(exc, self.cfg.source, f"reading {s.info.name}") from None
        if not raw:
            s.eof = True
            s.close()  # the read is over: end its transaction now
            return []
        convert = row_converter(s.info.schema.columns)
        return [convert(r) for r in raw]

    def _pump(self, s: _Stream, at_boundary: bool) -> list[Item]:
        job = self._job(s.job_id)
        if job is None or not job.active or job.tasks[s.part].over:
            self._drop_stream()
            return []
        if not s.keyed:
            return self._pump_keyless(s, job, at_boundary)
        if s.window.closing and at_boundary:
            return self._emit_stream_chunk(s, job)
        return []

    def _pump_keyless(self, s: _Stream, job: VerifyJob, at_boundary: bool) -> list[Item]:
        key = (s.job_id, s.part)
        if s.dirty:
            # Its rows cannot be told apart, so a change in the window cannot
            # be placed: read it again (a new window), as the snapshot does.
            self._drop_stream()
            n = self._keyless_attempts[key] = self._keyless_attempts.get(key, 0) + 1
            if n >= _KEYLESS_ATTEMPTS:
                self._fail(s.job_id, s.part, (
                    f"the table (no primary key) changed during each of {n} whole-table reads (fix: verify it "
                    "while writes to it pause, or give it a primary key)"))
            return []
        t = job.tasks[s.part]
        hasher, view = self._hashing(s.info.schema)
        deadline = time.monotonic() + _READ_SLICE_S
        while not s.eof and time.monotonic() < deadline:
            for row in self._fetch(s, _FETCH_ROWS):
                seen = view(row)
                if seen is not None:
                    s.count += 1
                    s.total += hasher.row(seen)
                if t.repair:
                    s.rows.append(row)
                    s.size += _row_bytes(row)
            if t.repair and s.size > self.ship_budget:
                self._drop_stream()
                self._fail(s.job_id, s.part, self._keyless_too_large(t))
                return []
        if not (s.eof and s.window.closing and at_boundary):
            return []
        self._drop_stream()
        schema = self._schema_for(s.info)
        if t.repair and self._fits(schema, s.rows) < len(s.rows):
            self._fail(s.job_id, s.part, self._keyless_too_large(t))
            return []
        return self._ship(s.job_id, s.part, schema, KeyRange(), s.rows, Checksum(s.count, s.total & MASK), True)

    def _keyless_too_large(self, t: VerifyTask) -> str:
        return (f"the table has no primary key, so its repair is one transaction of all its rows, and they do not "
                f"fit in one envelope (half of [transport] max_envelope_bytes = {self.cfg.transport.max_envelope_bytes}"
                f" bytes); nothing was changed (fix: `cynomys snapshot --tables {t.name}` with [snapshot] "
                "allow_no_primary_key = true reloads it in fragments, or give the table a primary key)")

    def _emit_stream_chunk(self, s: _Stream, job: VerifyJob) -> list[Item]:
        t = job.tasks[s.part]
        size = self._chunk_size(job)
        rows, s.carry = s.carry[:size], s.carry[size:]
        while len(rows) < size and not s.eof:
            rows.extend(self._fetch(s, min(_FETCH_ROWS, size - len(rows))))
        keyf = key_of(s.info.schema)
        exhausted = len(rows) < size
        rng = KeyRange(s.lo, s.hi) if exhausted else KeyRange(s.lo, keyf(rows[-1]))
        chunk = {keyf(r): r for r in rows}
        for k in [k for k in s.pending if rng.contains(k)]:
            image = s.pending.pop(k)
            if image is None:
                chunk.pop(k, None)
            else:
                chunk[k] = image
        out = list(chunk.values())
        if t.repair:
            out.sort(key=lambda r: sort_key(keyf(r)))
            kept = self._fits(self._schema_for(s.info), out)
            if out and kept == 0:
                self._drop_stream()
                self._fail(s.job_id, s.part, self._row_too_large(t, keyf(out[0])))
                return []
            if kept < len(out):
                # Cut short: the rest (current as of now) opens the next chunk.
                rng, s.carry, out, exhausted = KeyRange(s.lo, keyf(out[kept - 1])), out[kept:], out[:kept], False
        if exhausted:
            self._drop_stream()
        else:
            s.lo = rng.hi
        return self._ship(s.job_id, s.part, self._schema_for(s.info), rng, out, None, exhausted)

    def _row_too_large(self, t: VerifyTask, key: tuple[Value, ...]) -> str:
        return (f"the row with key {key!r} does not fit in one envelope with its repair records (half of [transport] "
                f"max_envelope_bytes = {self.cfg.transport.max_envelope_bytes} bytes); the range was left as it is "
                "(fix: raise [transport] max_envelope_bytes on the producer and the applier)")

    def _fits(self, schema: TableSchema, rows: list[Row]) -> int:
        """How many leading ``rows`` fit in one envelope with their PURGE and
        CHECKSUM records (``ship_budget``), measured as the producer encodes
        them."""
        n = len(rows)
        while True:
            size = self._encoded_size(schema, rows[:n])
            if size <= self.ship_budget:
                return n
            if n <= 1:
                return 0
            n = max(1, min(n - 1, int(n * self.ship_budget * 0.9 / size)))

    def _encoded_size(self, schema: TableSchema, rows: list[Row]) -> int:
        from cynomys.schemas import codec

        at = self._last_end
        db, table = schema.database, schema.table
        record = "x" * 1024  # stands for the PURGE/CHECKSUM payload (a few hundred bytes)
        changes = [Change(Op.PURGE, db, table, "verify:size", at, 0, schema, sql=record),
                   *(Change(Op.READ, db, table, "verify:size", at, 0, schema, None, r) for r in rows),
                   Change(Op.CHECKSUM, db, table, "verify:size", at, 0, schema, sql=record)]
        return len(codec.encode(Batch(self.cfg.producer.id, tuple(changes), at, True, at, 0, 0, {})))

    def _emit(self, a: _Active) -> list[Item]:
        self._reading = None
        job = self._job(a.job_id)
        if job is None or not job.active:
            return []
        t = job.tasks[a.part]
        schema = self._schema_for(a.info)
        cs = a.checksum()
        if cs is not None:  # row hashes (never a repair: it ships rows)
            return self._ship(a.job_id, a.part, schema, a.rng, [], cs, a.exhausted)
        rows = list(a.rows.values())
        rng, exhausted = a.rng, a.exhausted
        if t.repair:
            keyf = key_of(schema)
            rows.sort(key=lambda r: sort_key(keyf(r)))
            kept = self._fits(schema, rows)
            if rows and kept == 0:
                self._fail(a.job_id, a.part, self._row_too_large(t, keyf(rows[0])))
                return []
            if kept < len(rows):  # cut short: the next chunk is read from the cut
                rng, rows, exhausted = KeyRange(rng.lo, keyf(rows[kept - 1])), rows[:kept], False
        return self._ship(a.job_id, a.part, schema, rng, rows, None, exhausted)

    def _ship(self, job_id: str, i: int, schema: TableSchema, rng: KeyRange, rows: list[Row],
              cs: Checksum | None, exhausted: bool) -> list[Item]:
        """One chunk's records: [PURGE, READ rows (a repair),] CHECKSUM, Commit."""
        job = self._job(job_id)
        assert job is not None
        t = job.tasks[i]
        if cs is None:
            target, shaped = self.shaper.rows(schema, rows)  # the rows as the target holds them
            cs = RowHasher(target.columns).rows(shaped)
        at, ts = self._emission()
        n = t.chunks + sum(1 for e in self._emitted if e.job_id == job_id and e.part == i)
        cid = chunk_id(job_id, t, n)
        chunk = {"id": cid, "table": t.name, "range": rng.to_dict()}
        payload = json.dumps({"job": job_id, "chunk": cid, "range": rng.to_dict(), **cs.to_dict(),
                              "repair": t.repair, "source": t.name}, separators=(",", ":"))
        tid = f"verify:{cid}"
        db, table = schema.database, schema.table
        out: list[Item] = []
        if t.repair:
            out.append(Change(Op.PURGE, db, table, tid, at, ts, schema, sql=payload))
            out.extend(Change(Op.READ, db, table, tid, at, ts, schema, None, r) for r in rows)
        out.append(Change(Op.CHECKSUM, db, table, tid, at, ts, schema, sql=payload))
        out.append(Commit(at, at, ts, ""))
        next_lo = encode_key(rng.hi) if rng.hi is not None else t.lo
        self._hand_over(_Emitted(job_id, i, at, next_lo, exhausted, cs.count, chunk))
        if t.repair:
            # Durable before the producer ships it: a producer that stops on
            # it every time (see _SHIP_ATTEMPTS) shows up here after restarts.
            self._replace(job.with_task(i, replace(t, attempts=t.attempts + 1)).settle())
            self._save()
        log.debug("verify %s: chunk %s (%s): %d rows, emitted at %s", job_id, cid, rng.describe(schema.key),
                  cs.count, at)
        return out

    def _confirmed(self, job: VerifyJob, e: _Emitted) -> VerifyJob:
        t = job.tasks[e.part]
        t = replace(t, lo=e.after, chunks=t.chunks + 1, rows=t.rows + e.rows, done=e.exhausted, attempts=0)
        job = replace(job.with_task(e.part, t), chunks=job.chunks + (e.chunk,)).settle()
        if job.status != RUNNING:
            log.info("verify %s: every chunk emitted (%d)", job.id, len(job.chunks))
        return job

    # -- jobs and requests -------------------------------------------------------
    def _live(self) -> dict[str, Any] | None:
        a, s = self._flight()
        if a is not None:
            return {"job": a.job_id, "table": a.info.name, "phase": a.window.phase.value,
                    "range": a.rng.describe(a.info.schema.key)}
        if s is not None:
            return {"job": s.job_id, "table": s.info.name, "phase": s.window.phase.value,
                    "range": s.remaining.describe(s.info.schema.key), "streamed": True}
        return None

    def _refused(self, req: dict[str, Any], reason: str) -> VerifyJob | None:
        return VerifyJob(str(req["id"]), FAILED, created=time.time(), finished=time.time(), error=reason)

    def _apply_request(self, req: dict[str, Any]) -> None:
        action = req.get("action")
        ident = str(req.get("id") or "")
        if action in ("start", "repair"):
            if self._job(ident) is not None:
                return  # applied before a crash; the request file outlived it
            conn = self._connection()
            tasks = []
            if action == "start":
                for name in req.get("tables") or []:
                    db, _, t = str(name).partition(".")
                    if not self.filter(db, t):
                        tasks.append(VerifyTask(str(name), error=(
                            "not replicated ([source] include_tables/exclude_tables leave it out): there is no "
                            "replica of it to verify")))
                        continue
                    info = conn.describe(db, t)
                    why = self._shaped_refusal(info.schema)
                    if why:
                        tasks.append(VerifyTask(str(name), error=f"cannot be verified: {why}"))
                        continue
                    tasks.append(VerifyTask(str(name), estimate=info.rows_estimate))
            else:
                for r in req.get("ranges") or []:
                    rng = r.get("range") or {}
                    tasks.append(VerifyTask(str(r["table"]), repair=True, lo=rng.get("lo"), hi=rng.get("hi")))
            job = VerifyJob(ident, RUNNING, tuple(tasks), int(req.get("chunk_size") or 0),
                            repair_of=str(req.get("repair_of") or ""), created=time.time()).settle()
            log.info("verify %s requested: %s", ident, ", ".join(
                t.name + (" " + KeyRange.from_dict({"lo": t.lo, "hi": t.hi}).describe() if t.repair else "")
                for t in tasks))
            # Keep the running jobs and the last finished ones (the file is rewritten per chunk).
            done = [j for j in self.jobs if j.status != RUNNING]
            self._set_jobs([j for j in self.jobs if j.status == RUNNING or j in done[-_KEEP_FINISHED:]] + [job])
        elif action == "cancel":
            for job in self.jobs:
                if ident in ("*", job.id) and job.status == RUNNING:
                    self._replace(replace(job, status=CANCELLED, finished=time.time()))
                    self._drop_work(job.id)
        else:
            log.warning("ignoring an unknown verify request: %r", req)
