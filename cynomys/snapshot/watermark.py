"""Watermarks around a chunk select, in the two flavours.

DBLog (default): the producer writes a fresh UUID into its row of a
watermark table before the select (low) and after it (high).  Both writes
are committed transactions, so they sit in the binlog exactly where they
happened relative to every other transaction: what precedes the low one
in the binlog was committed before the select began and is in the chunk
(MariaDB, and MySQL with binlog_order_commits, make transactions visible in
binlog order); what follows the high one is not.  The watermark table's
row events are swallowed by the producer and never shipped.

Read-only (Debezium, ``[snapshot] read_only = true``): no writes.  The
watermarks are the executed GTID sets before and after the select
(MariaDB ``@@gtid_binlog_pos``, MySQL ``@@gtid_executed``); on MariaDB the
select runs in START TRANSACTION WITH CONSISTENT SNAPSHOT, whose
``Binlog_snapshot_position`` is exactly where its view ends (see
``window.GtidMarks`` for why that matters).

``WindowOpener`` puts either flavour behind one call, for every chunked
task: ``select`` (a chunk select between the marks) or ``around`` (any read
view taken between them, e.g. a consistent snapshot a stream then reads
from), each returning the read's ``window.Window``.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from cynomys.core.gtid import GtidSet
from cynomys.core.model import Change, Position
from cynomys.snapshot.chunker import ChunkQuery, quote_ident
from cynomys.snapshot.errors import SnapshotError
from cynomys.snapshot.replica import LAST_WRITE_GTID, ReplicaReads
from cynomys.snapshot.source import SnapshotConnection
from cynomys.snapshot.window import GtidMarks, Phase, Window

log = logging.getLogger(__name__)

WATERMARK_TABLE = "watermark"


def watermark_ddl(schema: str) -> tuple[str, str]:
    """The two statements creating the watermark table.  Their text is
    fixed so the producer recognises them in the binlog and does not ship
    them (a target has no use for the table)."""
    s = quote_ident(schema)
    return (f"CREATE DATABASE IF NOT EXISTS {s}",
            f"CREATE TABLE IF NOT EXISTS {s}.{quote_ident(WATERMARK_TABLE)} ("
            "producer_id VARCHAR(64) NOT NULL PRIMARY KEY, uuid CHAR(36) NOT NULL, "
            "kind VARCHAR(4) NOT NULL, written DATETIME(6) NOT NULL) ENGINE=InnoDB")


def same_statement(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


@dataclass(frozen=True)
class Watermark:
    uuid: str
    kind: str  # "low" | "high"
    producer_id: str


def read_watermark(change: Change) -> Watermark | None:
    """The watermark a row change of the watermark table carries."""
    if change.schema is None:
        return None
    image = change.after if change.after is not None else change.before
    if image is None:
        return None
    row = dict(zip(change.schema.column_names, image))
    if "uuid" not in row:
        return None
    return Watermark(str(row["uuid"]), str(row.get("kind", "")), str(row.get("producer_id", "")))


class WatermarkTable:
    """DBLog watermarks: one row per producer in ``<schema>.watermark``."""

    def __init__(self, conn: SnapshotConnection, schema: str, producer_id: str) -> None:
        self.conn = conn
        self.schema = schema
        self.producer_id = producer_id
        self.ready = False

    def ensure(self) -> None:
        """Create the schema and table if missing, and check the source
        writes them to its binlog."""
        if self.ready:
            return
        do_db, ignore_db = self.conn.binlog_filters()
        if self.schema in ignore_db or (do_db and self.schema not in do_db):
            raise SnapshotError(
                f"the source does not write schema {self.schema} to its binlog (binlog_do_db={do_db}, "
                f"binlog_ignore_db={ignore_db}): snapshot watermarks would never be seen",
                hint=f"let the source log {self.schema}, or set [snapshot] watermark_schema to a logged schema")
        exists = self.conn.query("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                                 (self.schema, WATERMARK_TABLE))
        if not exists:
            log.info("creating the snapshot watermark table %s.%s on the source", self.schema, WATERMARK_TABLE)
            for sql in watermark_ddl(self.schema):
                self.conn.query(sql)  # no parameters: the text goes to the binlog unchanged
        self.ready = True

    def write(self, kind: str, mark: str = "") -> str:
        """Write watermark ``mark`` (a fresh UUID when empty) and return it."""
        mark = mark or str(uuid.uuid4())
        table = f"{quote_ident(self.schema)}.{quote_ident(WATERMARK_TABLE)}".replace("%", "%%")
        self.conn.query(
            f"INSERT INTO {table} (producer_id, uuid, kind, written) VALUES (%s, %s, %s, NOW(6)) "
            "ON DUPLICATE KEY UPDATE uuid = VALUES(uuid), kind = VALUES(kind), written = VALUES(written)",
            (self.producer_id, mark, kind))
        return mark


class GtidWatermarker:
    """Read-only watermarks: executed GTID sets around the select."""

    def __init__(self, conn: SnapshotConnection) -> None:
        self.conn = conn
        self.flavor = "mariadb" if conn.is_mariadb else "mysql"
        self.checked = False

    def check(self) -> None:
        if self.checked:
            return
        if self.flavor == "mysql":
            mode = str(self.conn.scalar("SELECT @@GLOBAL.gtid_mode") or "OFF").upper()
            if mode != "ON":
                raise SnapshotError(
                    f"read-only snapshots need GTIDs, and the source has gtid_mode={mode}",
                    hint="SET GLOBAL gtid_mode=ON (through OFF_PERMISSIVE, ON_PERMISSIVE) with enforce_gtid_consistency=ON, "
                         "or set [snapshot] read_only = false to use a watermark table")
        self.checked = True

    def _executed(self) -> GtidSet:
        var = "@@GLOBAL.gtid_binlog_pos" if self.flavor == "mariadb" else "@@GLOBAL.gtid_executed"
        return GtidSet.parse(self.flavor, str(self.conn.scalar(f"SELECT {var}") or ""))

    def around(self, take: Callable[[], Position | None]) -> GtidMarks:
        """Run ``take`` between the two GTID watermarks.  ``take`` takes the
        read view and returns the binlog position of its consistent
        snapshot where the server reports one (see ``GtidMarks``)."""
        self.check()
        low = self._executed()
        snapshot_pos = take()
        high = self._executed()
        return GtidMarks(low, high, self.conn.binlog_end(), snapshot_pos)

    def select(self, query: ChunkQuery, replica: ReplicaReads | None = None) -> tuple[list[tuple[Any, ...]], GtidMarks]:
        """Run the chunk select between the two GTID watermarks (MariaDB: in
        a consistent snapshot, whose binlog position makes the low set exact).
        On a ``replica``: once it has applied the low set, whose every
        transaction its select then sees (snapshot/replica.py)."""
        rows: list[tuple[Any, ...]] = []
        if replica is not None:
            self.check()
            low = self._executed()
            replica.wait(low.text)
            rows.extend(replica.conn.query(query.sql, query.params))
            return rows, GtidMarks(low, self._executed(), self.conn.binlog_end())

        def take() -> Position | None:
            if self.flavor != "mariadb":
                rows.extend(self.conn.query(query.sql, query.params))
                return None
            try:
                pos = self.conn.consistent_read()
                rows.extend(self.conn.query(query.sql, query.params))
            finally:
                self.conn.query("COMMIT")
            return pos

        return rows, self.around(take)


class WindowOpener:
    """Opens chunk windows on the source, in the flavour ``[snapshot]
    read_only`` picks: the watermark table (DBLog) or GTID sets (read-only).
    One per connection; snapshot and verify open theirs the same way."""

    def __init__(self, conn: SnapshotConnection, *, read_only: bool, schema: str, producer_id: str,
                 replica: Callable[[], ReplicaReads] | None = None) -> None:
        self.conn = conn
        # Where chunk selects run with ``[snapshot] read_from`` (opened at the
        # first select: a task that only reads around a view never needs it);
        # watermarks stay on ``conn``.
        self._open_replica = replica
        self.replica: ReplicaReads | None = None
        self.gtid = GtidWatermarker(conn) if read_only else None
        self.table = None if read_only else WatermarkTable(conn, schema, producer_id)

    def close(self) -> None:
        self.conn.close()
        if self.replica is not None:
            self.replica.close()

    def _on_replica(self) -> ReplicaReads | None:
        if self.replica is None and self._open_replica is not None:
            self.replica = self._open_replica()
        return self.replica

    def around(self, take: Callable[[], Position | None], processed: Position) -> Window:
        """Run ``take`` (it takes a read view: see ``GtidWatermarker.around``)
        between a low and a high watermark; the window, as seen from
        ``processed``, the end of the log the producer has handled."""
        if self.gtid is not None:
            return Window.of_gtid(self.gtid.around(take), processed)
        assert self.table is not None
        self.table.ensure()
        low = self.table.write("low")
        take()
        return Window(Phase.WAIT_LOW, low, self.table.write("high"))

    def read(self, query: ChunkQuery, low: str, high: str) -> tuple[list[tuple[Any, ...]], GtidMarks | None]:
        """One chunk select between watermarks, for a reader thread whose
        window the producer already watches (snapshot/readers.py): DBLog
        writes the given ``low`` and ``high`` UUIDs (known before the low
        one is written, so no event of it can be missed); read-only returns
        the GTID marks, which the producer then places in the log."""
        if self.gtid is not None:
            return self.gtid.select(query, self._on_replica())
        assert self.table is not None
        self.table.ensure()
        self.table.write("low", low)
        rows = self._select_after_low(query)
        self.table.write("high", high)
        return rows, None

    @property
    def reads(self) -> SnapshotConnection:
        """The connection chunk selects (and their boundary queries) run on."""
        replica = self._on_replica()
        return replica.conn if replica is not None else self.conn

    def _select_after_low(self, query: ChunkQuery) -> list[tuple[Any, ...]]:
        """A DBLog chunk select, its low watermark just written on ``conn``:
        there, or on the replica once it has applied that write."""
        replica = self._on_replica()
        if replica is None:
            return self.conn.query(query.sql, query.params)
        replica.wait(self._written_gtid())
        return replica.conn.query(query.sql, query.params)

    def _written_gtid(self) -> str:
        """The GTID of the low watermark just written (module replica.py)."""
        flavour = "mariadb" if self.conn.is_mariadb else "mysql"
        gtid = str(self.conn.scalar(LAST_WRITE_GTID[flavour]) or "")
        if not gtid:
            raise SnapshotError(
                f"[snapshot] read_from: the source {self.conn.cfg.host}:{self.conn.cfg.port} gave its watermark "
                "write no GTID, and a replica's read can only be matched to the binlog by GTID",
                hint="turn GTIDs on at the source (MySQL: gtid_mode = ON), or set [snapshot] read_from = \"\"")
        return gtid

    def select(self, query: ChunkQuery, processed: Position) -> tuple[list[tuple[Any, ...]], Window]:
        """One chunk select between watermarks: its rows and its window."""
        if self.gtid is not None:
            rows, marks = self.gtid.select(query, self._on_replica())
            return rows, Window.of_gtid(marks, processed)
        got: list[tuple[Any, ...]] = []

        def take() -> None:
            got.extend(self._select_after_low(query))

        return got, self.around(take, processed)
