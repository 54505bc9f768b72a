"""Chunk selects on a replica of the source (``[snapshot] read_from``).

A snapshot of a big table reads every row once; on a busy primary that
read competes with the application.  With ``read_from = "host:port"`` the
chunk readers (snapshot/readers.py) run their selects on that replica, with
the source's user, password and TLS settings, while the watermarks stay on
the source: they must be in the binlog the producer reads.

Why a chunk read there is still exact.  A chunk's rows must show the table
as it was at some point of the source's binlog between the chunk's low and
high watermark (watermark.py).  The reader writes the low watermark on the
source and takes the GTID it got (MariaDB ``@@last_gtid``; MySQL the
executed set, which holds it), then waits on the replica until it has
applied that GTID (``MASTER_GTID_WAIT`` / ``WAIT_FOR_EXECUTED_GTID_SET``),
and only then selects: the select's read view holds everything up to the
low watermark.  A replica commits the source's transactions in the source's
order (MariaDB's parallel replication keeps commit order; MySQL needs
``replica_preserve_commit_order``, its default since 8.0.27), so that view
is a prefix of the source's binlog, and it ends before the high watermark,
which is written after the select.  Read-only snapshots wait for the low
GTID set the same way; every transaction in it is committed on the replica
before the read, so the low set alone says what the chunk holds (no
``Binlog_snapshot_position``, which would be the replica's own binlog).

A replica that has not applied the low watermark within
``[snapshot] replica_wait_s`` is lagging (``ReplicaLagging``, named with how
far behind it is): a snapshot chunk gives its window up and is read again
with new watermarks, the log flowing meanwhile (snapshot/readers.py), so a
replica held back for maintenance pauses the snapshot with a warning every
``replica_wait_s`` instead of holding a window open without bound or
restarting the producer; elsewhere (verify) it is transient as any lost
source.  A replica whose replication stopped on an
error, or a server that replicates nothing, is a terminal error: waiting
would never end.  Verify's chunk selects read there the same way (their
window opener, snapshot/task.py); keyless tables' whole-table reads, by a
snapshot or a verify, stay on the source.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from cynomys.core.config import Config, SourceConfig
from cynomys.core.errors import SourceUnavailableError
from cynomys.core.flavour import flavour_of
from cynomys.snapshot.errors import SnapshotError
from cynomys.snapshot.source import DENIED, SnapshotConnection, driver_error

log = logging.getLogger(__name__)

#: flavour -> (the GTID a session's last write got, the wait on the replica:
#: it returns ``WAIT_REACHED`` once that is applied).
LAST_WRITE_GTID = {"mariadb": "SELECT @@SESSION.last_gtid", "mysql": "SELECT @@GLOBAL.gtid_executed"}
WAIT_SQL = {"mariadb": "SELECT MASTER_GTID_WAIT(%s, %s)", "mysql": "SELECT WAIT_FOR_EXECUTED_GTID_SET(%s, %s)"}
WAIT_REACHED = 0
#: The status of a replica's replication, per flavour (MySQL renamed it in 8.0.22).
STATUS_SQL = {"mariadb": "SHOW ALL SLAVES STATUS", "mysql": "SHOW REPLICA STATUS", "mysql-old": "SHOW SLAVE STATUS"}
#: Status columns (MariaDB / MySQL before 8.0.22 names, then MySQL's new ones).
_SQL_RUNNING = ("Slave_SQL_Running", "Replica_SQL_Running")
_SQL_ERRNO = ("Last_SQL_Errno",)
_SQL_ERROR = ("Last_SQL_Error",)
_IO_ERROR = ("Last_IO_Error",)
_BEHIND = ("Seconds_Behind_Master", "Seconds_Behind_Source")


def parse_read_from(text: str) -> tuple[str, int]:
    """'host:port' (an IPv6 host in brackets) -> (host, port)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def replica_source(cfg: SourceConfig, read_from: str) -> SourceConfig:
    """The [source] settings with the replica's address."""
    host, port = parse_read_from(read_from)
    return dataclasses.replace(cfg, host=host, port=port)


def replica_opener(cfg: Config, driver: str) -> Callable[[], ReplicaReads] | None:
    """How a window opener connects to ``[snapshot] read_from`` (None: chunks
    are read on the source)."""
    scfg = cfg.snapshot
    if not scfg.read_from:
        return None
    return lambda: ReplicaReads(cfg.source, scfg.read_from, driver, scfg.replica_wait_s)


class ReplicaLagging(SourceUnavailableError):
    """The replica has not applied a GTID within ``replica_wait_s``."""


def _pick(status: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((status[n] for n in names if n in status), None)


class ReplicaReads:
    """One reader thread's connection to the replica, and the wait for a
    source GTID (module doc)."""

    def __init__(self, source: SourceConfig, read_from: str, driver: str, wait_s: float) -> None:
        self.cfg = replica_source(source, read_from)
        self.where = f"{self.cfg.host}:{self.cfg.port}"
        self.wait_s = wait_s
        self.conn = SnapshotConnection(self.cfg, driver)
        flavour = flavour_of(self.conn.conn.get_server_info())
        self.flavour = flavour.name
        old_mysql = flavour.name == "mysql" and flavour.version < (8, 0, 22)
        self._status_sql = STATUS_SQL["mysql-old" if old_mysql else flavour.name]
        try:
            self._check_replicates(read_from)
        except BaseException:
            self.conn.close()  # the caller never gets this object to close
            raise

    def _check_replicates(self, read_from: str) -> None:
        status = self.status()
        if status is not None and not status:
            raise SnapshotError(
                f"[snapshot] read_from = \"{read_from}\": the server {self.where} replicates nothing "
                f"({self._status_sql} is empty), so its rows cannot be matched to the source's binlog",
                hint="point read_from at a replica of the source, or set read_from = \"\" to read chunks from "
                     "the source")
        self.check(status)

    def close(self) -> None:
        self.conn.close()

    def status(self) -> dict[str, Any] | None:
        """The replica's replication status ({} when it replicates nothing;
        None when the user may not see it: the wait still guards)."""
        try:
            cur = self.conn.conn.cursor()
            try:
                cur.execute(self._status_sql)
                names = [d[0] for d in cur.description or ()]
                row = cur.fetchone()
            finally:
                cur.close()
        except Exception as exc:
            if not driver_error(exc) or (exc.args[0] if exc.args else 0) not in DENIED:
                raise
            log.warning("snapshot: cannot read the replication status of %s (%s): %s; chunk reads there "
                        "still wait for each low watermark", self.where, self._status_sql, exc.args[-1])
            return None
        return dict(zip(names, row)) if row else {}

    def check(self, status: dict[str, Any] | None) -> None:
        """A replica whose replication stopped on an error: terminal."""
        if not status:
            return
        errno = _pick(status, _SQL_ERRNO)
        if str(_pick(status, _SQL_RUNNING)) == "No" and errno:
            raise SnapshotError(
                f"[snapshot] read_from: the replica {self.where} stopped replicating on error {errno}: "
                f"{_pick(status, _SQL_ERROR)}; the snapshot cannot read chunks there",
                hint=f"repair replication on {self.where} (SHOW SLAVE STATUS), or set [snapshot] read_from = \"\" "
                     "to read chunks from the source; then ask for the table again (cynomys snapshot --tables)")

    def wait(self, gtid: str) -> None:
        """Return once the replica has applied ``gtid`` (a GTID or a set of
        the source's); raise when it has not within ``wait_s``."""
        if not gtid:
            return
        got = self.conn.query(WAIT_SQL[self.flavour], (gtid, self.wait_s))[0][0]
        if got is not None and int(got) == WAIT_REACHED:
            return
        status = self.status()
        self.check(status)
        state = "" if not status else (
            f"{_pick(status, _BEHIND)} s behind, SQL thread running: {_pick(status, _SQL_RUNNING)}"
            + (f", IO error: {_pick(status, _IO_ERROR)}" if _pick(status, _IO_ERROR) else ""))
        raise ReplicaLagging(
            f"snapshot: the replica {self.where} ([snapshot] read_from) has not applied the source's GTID "
            f"{gtid} within {self.wait_s:g} s ({state or 'its replication status is not readable'}): it lags; "
            "chunk reads there are retried until it catches up (start its replication if it was stopped, raise "
            "[snapshot] replica_wait_s, or set read_from = \"\" to read chunks from the source)")
