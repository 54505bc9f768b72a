"""Tables without a primary key: one consistent read, streamed, placed in the log.

DBLog's windows need keys (a changed key is dropped from its chunk), so a
keyless table is read whole, in one consistent read whose binlog position
``P`` is known exactly:

- MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and its
  ``Binlog_snapshot_file``/``Binlog_snapshot_position`` status (the binlog
  position matching the read view; no lock, SELECT only);
- MySQL: a short ``FLUSH TABLES WITH READ LOCK`` around the start of the
  consistent read and ``SHOW MASTER STATUS`` (the RELOAD privilege).

The producer opens it at a transaction boundary ``Q`` of the log it has
processed.  ``Q <= P`` always (the log cannot have been read past the binlog
end), so the read is emitted right there, at ``Q``, as one logical
transaction: a ``TRUNCATE`` of the table, then every row as a READ change
(an insert into the emptied table), then a Commit at ``Q``.  Binlog changes
of the table in transactions that begin before ``P`` are in the read: the
coordinator drops them (``DropRules``); those at or after ``P`` come after
the read in the stream, as on the source.

The rows come from a server-side cursor and the producer cuts the
transaction into fragments of a keyed chunk's rows (``fragment_rows``, at
least ``batch_max_events``), so its memory stays bounded whatever the
table's size; the applier applies them in parts of one target transaction
(``[applier] max_memory_mb``), so its memory does too.

Crash safety.  Each attempt starts with the TRUNCATE, so it replaces
whatever an earlier attempt left in the target, applied whole, in part or
not at all: a read that is not recorded as finished is simply done again,
at a new position.  The drop rule (table -> ``P``) is persisted before the
rows are handed over, so a log re-read after a crash drops exactly the same
changes (the producer counts the changes of a fragmented transaction it
already shipped).  A producer restarted inside an attempt's fragments sends
an empty envelope starting where that attempt started (``abandon_meta``):
the applier drops the fragments it buffered instead of waiting for their
end.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import pymysql
import pymysql.cursors

from cynomys.core.columnar import ManyRows
from cynomys.core.config import SourceConfig
from cynomys.core.errors import SourceUnavailableError, TransientError
from cynomys.core.flavour import flavour_of
from cynomys.core.model import Change, Op, Position, Row, TableSchema
from cynomys.parser.txn import Commit, Item
from cynomys.snapshot.chunker import build_chunk_query, quote_ident
from cynomys.snapshot.columns import TableInfo, convert_rows
from cynomys.snapshot.errors import SnapshotError, SnapshotRequestError
from cynomys.snapshot.source import (
    close_connection,
    connect,
    driver_error,
    driver_errors,
    fetch_all,
    mysqlclient_cursor,
    statement_text,
)

log = logging.getLogger(__name__)

#: Transaction ids of snapshot emissions start with this (never a GTID or file:pos).
SNAPSHOT_TID_PREFIX = "snapshot:"
#: Rows fetched from the server per round trip.
FETCH_ROWS = 1000
# The server gives up sending to a client that does not read for
# net_write_timeout seconds; the producer reads between its envelopes, and an
# envelope waits for the transport (a slow or restarting Redis).
_NET_WRITE_TIMEOUT_S = 3600


class KeylessReadInterrupted(TransientError):
    """The producer was asked to stop during a keyless read: the attempt is
    abandoned (it is done again after the restart)."""


def is_snapshot_tid(tid: str) -> bool:
    return tid.startswith(SNAPSHOT_TID_PREFIX)


def truncate_sql(database: str, table: str) -> str:
    return f"TRUNCATE TABLE {quote_ident(database)}.{quote_ident(table)}"


def check_keyless(info: TableInfo, *, initial: bool, where: str, allowed: bool) -> None:
    """May this keyless table be snapshotted?  The initial snapshot reads it
    by default (its target table is new); a requested snapshot clears and
    reloads the target table, so it must be asked for."""
    db, t = info.schema.database, info.schema.table
    if where:
        raise SnapshotRequestError(
            f"table {db}.{t} has no primary key: it is read whole and replaces the target table, so it cannot be "
            "read with --where (the target's rows outside the WHERE would be lost)",
            hint=f"snapshot {db}.{t} without --where, or give it a primary key")
    if not initial and not allowed:
        raise SnapshotRequestError(
            f"table {db}.{t} has no primary key: its rows cannot be told apart, so a snapshot of it clears the "
            "target table and loads it again from one consistent read",
            hint="set [snapshot] allow_no_primary_key = true to allow that, or give the table a primary key")


def abandon_meta(opened: dict[str, Any]) -> tuple[Position, dict[str, str]]:
    """For the producer restarted inside a keyless read's fragments: the
    position the attempt started at (everything before it was shipped) and
    the span of the empty envelope that makes the applier drop them."""
    begin = Position.from_dict(opened["begin"])
    return begin, {"from": f"{begin.file}:{begin.pos}", "from_n": "0", "abandoned": str(opened["tid"])}


@dataclass
class DropRules:
    """Per keyless table, the binlog position of its last consistent read:
    its binlog changes in transactions beginning before it are in the rows
    read and are dropped."""

    before: dict[tuple[str, str], Position] = field(default_factory=dict)

    def set(self, database: str, table: str, pos: Position) -> None:
        old = self.before.get((database, table))
        if old is None or old < pos:
            self.before[(database, table)] = pos

    def drops(self, change: Change) -> bool:
        if not self.before:
            return False
        p = self.before.get((change.database, change.table))
        return p is not None and change.txn < p


def _server_side_cursor(driver: str) -> Any:
    """The driver's streaming cursor class (rows fetched as they are read)."""
    if driver == "mysqlclient":
        return mysqlclient_cursor(streamed=True)
    return pymysql.cursors.SSCursor


class ConsistentRead:
    """One table read in a consistent snapshot on a connection of its own,
    streamed from a server-side cursor, with either driver of
    snapshot/source.py (the same values): mysqlclient parses a row in a
    quarter of pymysql's time, most of a keyless read's cost in the producer
    (bench/initial_load.py --keyless)."""

    def __init__(self, cfg: SourceConfig, info: TableInfo, where: str = "", driver: str = "pymysql") -> None:
        self.cfg = cfg
        self.info = info
        self.driver = driver
        self.conn: Any = None
        self.cur: Any = None
        self.conn = connect(cfg, driver)
        try:
            self.position = self._start()
            q = build_chunk_query(info.schema.database, info.schema.table, info.schema.columns, (), None, None, where)
            self._run(q.sql, q.params)
        except BaseException:
            self.close()
            raise

    def _exec(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        assert self.conn is not None
        return fetch_all(self.conn, self.cfg, sql, params)

    def _start(self) -> Position:
        assert self.conn is not None
        self._exec("SET time_zone = '+00:00'")
        self._exec("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        self._exec(f"SET SESSION net_write_timeout = {_NET_WRITE_TIMEOUT_S}")
        if "mariadb" in self.conn.get_server_info().lower():
            self._exec("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            status = dict((str(k).lower(), v) for k, v in self._exec("SHOW STATUS LIKE 'binlog_snapshot_%'"))
            file, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
            if not file:
                raise SnapshotError("the source reports no Binlog_snapshot_file for a consistent snapshot: its "
                                    "binlog is off", hint="enable log_bin on the source")
            return Position(str(file), int(pos or 0))
        # MySQL: its consistent snapshot has no binlog position of its own;
        # hold every commit back for the moment it takes to start the read.
        # SHOW BINARY LOG STATUS on MySQL 8.2+ (SHOW MASTER STATUS is gone in 8.4)
        statement = flavour_of(self.conn.get_server_info()).statements.binlog_status
        self._exec("FLUSH TABLES WITH READ LOCK")
        try:
            self._exec("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            rows = self._exec(statement)
        finally:
            self._exec("UNLOCK TABLES")
        if not rows:
            raise SnapshotError(f"{statement} is empty on the source: its binlog is off",
                                hint="enable log_bin on the source")
        return Position(str(rows[0][0]), int(rows[0][1]))

    def _run(self, sql: str, params: Sequence[Any]) -> None:
        assert self.conn is not None
        self.cur = self.conn.cursor(_server_side_cursor(self.driver))
        with driver_errors(self.cfg, statement_text(sql)):
            self.cur.execute(sql, tuple(params))  # a tuple, even empty: the driver then undoes the %% escapes

    def blocks(self, n: int = FETCH_ROWS) -> Iterator[Sequence[tuple[Any, ...]]]:
        """The rows, ``n`` at a time."""
        assert self.cur is not None
        name = self.info.name
        while True:
            try:
                rows = self.cur.fetchmany(n)
            except Exception as exc:
                if not driver_error(exc):
                    raise
                # Half a transaction is out: the producer must restart (and
                # read the table again), whatever the cause.
                raise SourceUnavailableError(f"snapshot: the read of {name} (no primary key) broke off: {exc}; "
                                             "it is done again after the restart") from None
            if not rows:
                return
            yield rows

    def close(self) -> None:
        if self.conn is None:
            return
        result = getattr(self.conn, "_result", None) if self.driver == "pymysql" else None
        if result is not None and getattr(result, "unbuffered_active", False):
            # pymysql's cursor and result would drain the unread rows when
            # collected, from the socket closed below ("Exception ignored").
            result.unbuffered_active = False
        close_connection(self.conn)  # ends the read transaction; unread rows are discarded with the connection
        self.conn = None
        self.cur = None


class KeylessRead:
    """The items of one keyless read at ``at`` (a boundary of the processed
    log): TRUNCATE, the rows as READ changes, a Commit at ``at``.  Iterated
    once, by the producer, which cuts it into fragments; ``done`` is called
    with the row count just before the Commit is handed over, ``progress``
    with the rows read so far after each fetched block (a read of a large
    table takes minutes: `cynomys status` shows how far it is)."""

    def __init__(self, read: ConsistentRead, schema: TableSchema, convert: Callable[[Sequence[Any]], Row],
                 at: Position, ts: int, tid: str, done: Callable[[int], None],
                 stop: threading.Event | None = None, progress: Callable[[int], None] | None = None,
                 fragment_rows: int = 0) -> None:
        self.read = read
        self.fragment_rows = fragment_rows  # rows an envelope of it holds (0: ``batch_max_events``)
        self.schema = schema
        self.convert = convert
        self.at = at
        self.ts = ts
        self.tid = tid
        self.done = done
        self.stop = stop
        self.progress = progress
        self.rows = 0
        self.reading = True  # until the read is over (done, failed or stopped)

    def __iter__(self) -> Iterator[Item]:
        db, t, at, ts, tid, schema, convert = (self.schema.database, self.schema.table, self.at, self.ts, self.tid,
                                               self.schema, self.convert)
        try:
            yield Change(Op.DDL, db, t, tid, at, ts, sql=truncate_sql(db, t))
            for block in self.read.blocks():
                if self.stop is not None and self.stop.is_set():
                    raise KeylessReadInterrupted(
                        f"stopping during the read of {db}.{t} (no primary key) after {self.rows} rows: it is "
                        "read again at the next start")
                # One ManyRows per fetched block, as a keyed chunk is one
                # (core/columnar.py): not a Change object per row, and the
                # applier gets the rows column-wise.  The producer cuts a
                # block where a fragment ends (producer/batching.py ``_cut``).
                yield ManyRows(Op.READ, db, t, tid, at, ts, schema, images=convert_rows(convert, block))
                self.rows += len(block)
                if self.progress is not None:
                    self.progress(self.rows)
            self.reading = False
            self.done(self.rows)
            yield Commit(at, at, ts, "")
        finally:
            self.reading = False
            self.read.close()
