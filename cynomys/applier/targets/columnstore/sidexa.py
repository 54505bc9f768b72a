"""A keyless table's snapshot rows loaded on a second connection, inside an
XA transaction that commits with the source transaction applied in parts.

A keyless table's read (snapshot/keyless.py) is one logical transaction of
any size, applied in parts of one open target transaction: the target
server loads it with one ``LOAD DATA`` at a time, on one core (5M lineitem
rows with an index: 63 s of one core; two connections loading halves: 1.6x
the rate, measured here).  beside.py's side loads need a primary key (a
row loaded twice replaces itself); a keyless row loaded twice is two rows.
So a keyless table's READ rows go to a second connection in an XA
transaction of its own, and it commits exactly when the open transaction
does:

- Each part gives about half of its rows to the side, which loads them in
  its XA transaction (``XA START`` at the first part; it stays active across
  the parts).  A crash before the commit drops both connections: the server
  rolls back the open transaction and the active XA one alike.
- At the commit the side is prepared (``XA END`` + ``XA PREPARE``: durable,
  it survives a disconnect and a server restart), and the open transaction
  records its XID in ``cynomys_state.side_xa`` together with the applied
  state, then commits; then the side gets ``XA COMMIT``.
- Recovery (``recover``, when the applier starts): a prepared Cynomys XID
  no connection owns is committed when its row is in ``side_xa`` (the open
  transaction committed) and rolled back when it is not.  The server refuses
  another connection ``XA COMMIT``/``ROLLBACK`` of an XID whose connection is
  still there (XAER_NOTA): an applier that is alive finishes its own.

Why nothing else in the open transaction meets the side's rows: they are
visible to it only after the commit, so no statement of it may look for them
(a DELETE of such a row would not find it, and would wait for its lock).
Only READ runs of keyless tables whose part does nothing else to them go
beside, and a part that would delete from a table holding side rows stops
the applier rather than apply wrongly; the applier loop commits a
transaction that loaded beside as soon as its last fragment is in
(``Target.commits_parts_alone``), so no later change shares its commit.
"""
from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import replace
from typing import Any, Callable, Sequence

import pymysql

from cynomys.applier.targets.base import TableFlush
from cynomys.applier.targets.columnstore.beside import SideLoader, Split, prefix
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import Op

log = logging.getLogger(__name__)

#: Every XID Cynomys prepares starts with this, then the producer's hash.
PREFIX = "cynomys-side-"
#: The table of committed XIDs, beside the applied state.
TABLE = "side_xa"
TABLE_COLUMNS = "xid VARCHAR(64) NOT NULL PRIMARY KEY, written_at TIMESTAMP(6) NULL"
#: The server knows no such XID, or another connection still owns it.
XAER_NOTA = 1397


def producer_tag(producer_id: str) -> str:
    """The producer's part of its XIDs (an XID's global part is at most 64 bytes)."""
    return hashlib.sha1(producer_id.encode()).hexdigest()[:16]


def new_xid(producer_id: str) -> str:
    return f"{PREFIX}{producer_tag(producer_id)}-{uuid.uuid4().hex[:24]}"


def loads_beside(tf: TableFlush) -> bool:
    """A keyless table whose part only adds snapshot rows to it."""
    return (not tf.schema.key and not tf.delete_keys and not tf.delete_rows and not tf.inserts
            and bool(tf.runs) and all(r.op is Op.READ for r in tf.runs))


def split(tables: list[TableFlush], min_rows: int) -> Split:
    """About half of the part's rows to the side, from keyless tables the
    part only adds snapshot rows to (a table cut where the half ends: both
    connections insert into it, which InnoDB does without waiting)."""
    eligible = sum(tf.rows for tf in tables if loads_beside(tf))
    if min_rows <= 0 or eligible < min_rows:
        return Split(tables, [])
    want = sum(tf.rows for tf in tables) // 2
    taken = 0
    kept: list[TableFlush] = []
    side: list[TableFlush] = []
    for tf in tables:
        if taken >= want or not loads_beside(tf):
            kept.append(tf)
            continue
        away, stay = prefix(tf.runs, want - taken, set())  # (keyless: no key to compare)
        taken += sum(r.rows for r in away)
        side.append(TableFlush(tf.schema, runs=away))
        if stay:
            kept.append(replace(tf, runs=stay))
    return Split(kept, side)


class XaSide(SideLoader):
    """The second connection, its XA transaction and the thread that loads on it.

    ``start`` begins a load (the first one also the XA transaction) and
    returns at once; ``finish`` waits for it and returns its error, if any
    (the XA transaction is then gone: the caller rolls the open transaction
    back).  ``prepare`` before the open transaction commits, ``commit``
    after; ``abandon`` when it rolls back.  ``rows``: in the XA transaction."""

    thread_name = "cynomys-xa-side"
    rollback_on_drop = False  # (a prepared XA transaction must outlive the connection)

    def __init__(self, connect: Callable[[], Any], load: Callable[[Any, TableFlush], None]) -> None:
        super().__init__(connect, load)
        self.xid: str | None = None       # the XA transaction of the open transaction, if any
        self._begun = False                # XA START sent for it
        self.prepared = False
        self.tables: set[tuple[str, str]] = set()  # tables it holds rows of
        self.committed_rows = 0            # loaded beside and committed, in all

    @property
    def active(self) -> bool:
        return self.xid is not None

    def start_for(self, producer_id: str, tables: list[TableFlush]) -> None:
        assert not self.prepared, "no load into a prepared XA transaction"
        if self.xid is None:
            self.xid = new_xid(producer_id)
        self.tables.update((tf.schema.database, tf.schema.table) for tf in tables)
        self.start(tables)

    def _begin(self, conn: Any, cur: Any) -> None:
        if not self._begun:
            conn.commit()  # XA START needs a session outside any transaction
            cur.execute("XA START %s", (self.xid,))
            self._begun = True

    def _end(self, conn: Any) -> None:
        """The XA transaction stays active for the next parts."""

    def prepare(self) -> str:
        """End and prepare the XA transaction (durable from here); its XID,
        for the open transaction to record before it commits."""
        assert self.xid is not None and self._conn is not None and self._running is None
        with self._conn.cursor() as cur:
            cur.execute("XA END %s", (self.xid,))
            cur.execute("XA PREPARE %s", (self.xid,))
        self.prepared = True
        return self.xid

    def commit(self, table: str) -> None:
        """After the open transaction committed (its XID recorded in
        ``table``): commit the side, then forget its XID.  Raises the
        driver's error when the connection is lost: recovery commits it at
        the next start."""
        assert self.prepared and self._conn is not None
        xid = self.xid
        try:
            with self._conn.cursor() as cur:
                cur.execute("XA COMMIT %s", (xid,))
        except pymysql.err.Error as exc:
            if not (exc.args and exc.args[0] == XAER_NOTA):
                self._forget(drop=True)  # prepared, recorded: recovery commits it
                raise
            log.info("side load %s was committed by another applier's recovery", xid)
        self.committed_rows += self.rows
        self._forget(drop=False)
        try:
            with self._conn.cursor() as cur:
                cur.execute(f"DELETE FROM {table} WHERE xid = %s", (xid,))
            self._conn.commit()
        except pymysql.err.Error as exc:  # a row left behind means nothing: recovery clears it
            log.debug("clearing side load %s's record: %s", xid, exc)
            self._drop()

    def abandon(self) -> None:
        """The open transaction rolled back (or its commit's outcome is
        unknown): an active XA transaction goes with the connection; a
        prepared one stays for recovery, which looks at whether its XID was
        recorded."""
        if self.xid is not None:
            log.info("side load %s (%d rows) %s", self.xid, self.rows,
                     "left prepared for recovery" if self.prepared else "rolled back")
        self._forget(drop=True)

    def _forget(self, drop: bool) -> None:
        self.xid, self.prepared, self.rows = None, False, 0
        self.tables = set()
        if drop:
            self._drop()

    def _drop(self) -> None:
        self._begun = False  # the connection's XA transaction goes with it (a prepared one stays)
        super()._drop()

    def close(self) -> None:
        super().close()
        self.abandon()


def recover(cur: Any, other: Any, table: str, producer_id: str) -> tuple[int, int, list[str]]:
    """Finish the prepared side loads of ``producer_id`` that no connection
    owns: committed when their XID is in ``table`` (their open transaction
    committed), else rolled back.  ``cur`` holds the producer's state row
    locked (FOR UPDATE), so an open transaction committing right now is
    waited for; ``other`` (a second connection, outside any transaction)
    runs the XA statements.  Returns (committed, rolled back, XIDs a live
    connection still owns)."""
    tag = f"{PREFIX}{producer_tag(producer_id)}-"
    other.execute("XA RECOVER")
    xids = [bytes(r[3])[: int(r[1])].decode() for r in other.fetchall() if int(r[2]) == 0]
    committed = rolled_back = 0
    owned: list[str] = []
    for xid in (x for x in xids if x.startswith(tag)):
        cur.execute(f"SELECT 1 FROM {table} WHERE xid = %s", (xid,))
        recorded = cur.fetchone() is not None
        try:
            other.execute(f"XA {'COMMIT' if recorded else 'ROLLBACK'} %s", (xid,))
        except pymysql.err.Error as exc:
            if exc.args and exc.args[0] == XAER_NOTA:
                owned.append(xid)  # a live connection's: its applier finishes it
                continue
            raise
        if recorded:
            committed += 1
        else:
            rolled_back += 1
        log.warning("%s side load %s, left prepared by an applier that stopped between its two commits",
                    "committed" if recorded else "rolled back", xid)
    return committed, rolled_back, owned


def rejected_delete(where: str, names: Sequence[str]) -> TargetRejectedError:
    return TargetRejectedError(
        f"a part of a source transaction deletes from {', '.join(names)} on {where}, whose snapshot rows of the "
        "same transaction are loaded beside it and not visible to it", hint="set [target] side_load_rows = 0 and "
        "restart the applier (it applies the transaction again on one connection)")
