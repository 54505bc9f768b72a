"""MariaDB ColumnStore target (and any MariaDB engine) over pymysql.

One flush is one transaction: deletes by key, deletes of keyless rows, a
bulk ``LOAD DATA LOCAL INFILE`` of the final images, and the applier state
row.  What differs between engines (keys, types, delete and ALTER
abilities) is an ``EngineProfile`` chosen by ``[target] engine``.

The state table is always InnoDB, even when data tables are ColumnStore,
because it must be transactional and ColumnStore has no keys to upsert on.
MariaDB commits a transaction that touches two engines with two-phase commit
only when every engine implements ``prepare``; ColumnStore's handlerton has
``commit``/``rollback`` but no ``prepare`` (mariadb-columnstore-engine
``ha_mcs.cpp``), so ``trans_register_ha`` sets ``no_2pc`` and
``commit_one_phase_2`` commits the engines one after the other, walking
``ha_list`` from its head, i.e. last-registered first.  An engine registers
at its first table lock (ColumnStore in ``ha_mcs::external_lock`` when
autocommit is off).  We touch the state row first in every flush
(``SELECT ... FOR UPDATE``), so InnoDB is registered first and commits last: a crash between the two commits leaves
the data committed and the state behind, and the flush is applied again on
restart.  The ColumnStore profile therefore deletes the keys of inserted
rows before loading them, which makes a replay harmless for tables with a
primary key; a keyless ColumnStore table can get duplicate rows in that
window.  On InnoDB/Aria everything is in one InnoDB transaction and exact.
(Read from the server and ColumnStore sources; not tested against a real
ColumnStore, which cannot be installed here.)

DDL is not transactional in MariaDB: each statement commits.  ``apply_ddl``
runs the translated operations, each made idempotent by checking the target
first, and then records the state; replaying a DDL after a crash between
the two changes nothing.
"""
from __future__ import annotations

import io
import logging
import ssl
import time
import uuid
from dataclasses import dataclass, replace
from typing import IO, Any, Callable, ClassVar, Mapping, Sequence
from urllib.parse import parse_qsl, unquote, urlsplit

import pymysql
from pymysql.constants import CR
from pymysql.cursors import Cursor
from pymysql.protocol import LoadLocalPacketWrapper

from cynomys.applier.targets import state as applied_state
from cynomys.applier.targets.base import Capabilities, Flush, TableFlush, run_keys
from cynomys.applier.targets.columnstore import beside, sidexa
from cynomys.applier.targets.columnstore import ddl as columnstore_ddl
from cynomys.applier.targets.columnstore import verify as columnstore_verify
from cynomys.applier.targets.columnstore.config import ENGINE_NAME, ColumnStoreConfig
from cynomys.applier.targets.columnstore.types import (
    FIELD_ENCODERS,
    INNODB,
    PROFILES,
    EngineProfile,
    encode_field,
    fetch_plan,
    literal,
    load_data_rows,
)
from cynomys.applier.targets.sql import SqlTarget
from cynomys.applier.targets.sql_client import statement_batches
from cynomys.core import columnar as core_columnar
from cynomys.core.columnar import InsertRun
from cynomys.core.config import Config
from cynomys.core.dialect import MARIADB, Dialect
from cynomys.core.errors import ConfigError, TargetRejectedError, TargetUnavailableError
from cynomys.core.model import AppliedState, Change, ColumnDef, Op, Row, TableSchema, Value
from cynomys.verify.checksum import Checksum, KeyRange

log = logging.getLogger(__name__)

#: A keyless row's DELETE that took longer than this was a scan of its table
#: worth telling the user about, once per table (``_delete_row``): finding a
#: row near the end of a 1.5M-row InnoDB table took 0.77 s here (an indexed
#: DELETE well under a millisecond), so a table whose rows change a few times
#: a second makes the applier fall behind without another sign.
SLOW_KEYLESS_DELETE_S = 0.1

#: Keyless rows deleted by one statement (``_delete_rows``), within
#: ``statement_bytes``: each statement costs two scans of the table however
#: many rows it names (the server looks each scanned row up in the sorted
#: IN list), so the fewer statements the better; 1000 (the key DELETEs'
#: bound) made the 3,359 updated rows of a 5M-row table 8 scans, 8 s.
KEYLESS_DELETE_ROWS = 50_000

#: Error codes that mean "the server or the connection is gone / busy":
#: retrying later may succeed.  Everything else is the target refusing.
TRANSIENT_CODES = frozenset({
    1040,  # too many connections
    1053,  # server shutdown in progress
    1205,  # lock wait timeout
    1213,  # deadlock
    1317,  # query interrupted (KILL QUERY)
    1927,  # connection killed
    2002, 2003, 2006, 2013, 2055,  # cannot connect / server gone / lost connection
})
#: The server refuses an index the source has (``index_keyless``): too long
#: a key, a TEXT/BLOB column, too many keys or parts, a name in use.  The
#: table stays as it is, found by scans, and the user is told.
INDEX_REFUSED = frozenset({1061, 1069, 1070, 1071, 1072, 1089, 1167, 1170, 1831})
#: Target column types an index cannot take whole (MariaDB needs a prefix).
_UNINDEXABLE = ("text", "blob", "json")
#: Targets (``where``) whose XA side load failed in this process: the
#: applier's next attempt (a new target object) loads on one connection.
_XA_OFF: set[str] = set()
#: XA RECOVER refused: the user lacks the privilege (1227) / access denied (1044, 1142).
XA_RECOVER_REFUSED = frozenset({1044, 1142, 1227})
#: The server (or client) refuses LOAD DATA LOCAL: fall back to INSERT.
LOCAL_INFILE_REFUSED = frozenset({1148, 2068, 3948, 4166})
#: A side load failing with these gives its rows back to the flush: a lock
#: wait timeout or deadlock (against the flush), or LOCAL INFILE refused.
GIVEN_BACK = frozenset({1205, 1213}) | LOCAL_INFILE_REFUSED

_MAX_STATEMENT_BYTES = 8 * 1024 * 1024  # keep multi-row INSERTs below max_allowed_packet


#: [target] url query options.
URL_OPTIONS = {
    "local_infile": "0|1 (default 1): bulk loads with LOAD DATA LOCAL INFILE",
    "ssl": "0|1: TLS (on by default when a ssl_* file is named)",
    "ssl_ca": "CA file that signs the server's certificate (default: the system's)",
    "ssl_cert": "client certificate file",
    "ssl_key": "client key file",
    "ssl_verify": "1|0 (default 1): verify the server's certificate and host name",
}


def _given_back(failed: BaseException) -> bool:
    """A side load's failure that gives its rows back (``GIVEN_BACK``)."""
    code = failed.args[0] if failed.args and isinstance(failed.args[0], int) else 0
    return isinstance(failed, pymysql.err.Error) and code in GIVEN_BACK


def _flag(options: dict[str, str], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    if value.lower() in ("1", "true", "on", "yes"):
        return True
    if value.lower() in ("0", "false", "off", "no"):
        return False
    raise ConfigError(f"[target] url option {key}={value!r} is not 0 or 1")


def _tls_context(options: dict[str, str]) -> ssl.SSLContext:
    """TLS for the target connection; the certificate and host name are
    verified unless ssl_verify=0 says otherwise."""
    try:
        ctx = ssl.create_default_context(cafile=options.get("ssl_ca") or None)
        if options.get("ssl_cert"):
            ctx.load_cert_chain(options["ssl_cert"], options.get("ssl_key") or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[target] url TLS files cannot be read: {exc}",
                          hint="check ssl_ca, ssl_cert and ssl_key in [target] url") from None
    if not _flag(options, "ssl_verify", True):
        log.warning("[target] url has ssl_verify=0: the target server's certificate is not checked")
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class ForeignFileRequest(pymysql.err.OperationalError):
    """The server asked for a local file Cynomys did not offer."""


class _GuardedResult(pymysql.connections.MySQLResult):
    def _read_load_local_packet(self, first_packet: Any) -> None:
        conn = self.connection
        wanted = LoadLocalPacketWrapper(first_packet).filename
        name = wanted.decode("utf-8", "replace") if isinstance(wanted, bytes) else str(wanted)
        offered: LocalInfile | None = getattr(conn, "infile", None)
        if offered is None or name != offered.name:
            # Send nothing (an empty file ends the request), then fail the
            # statement: a server that asks for other files is not to be trusted.
            conn.write_packet(b"")
            try:
                conn._read_packet()
            except pymysql.err.Error as exc:
                log.debug("the server's answer to a refused LOCAL INFILE request: %s", exc)
            raise ForeignFileRequest(0, f"the target server asked for the local file {name!r}, which Cynomys did "
                                        "not offer; refused (LOAD DATA LOCAL sends only the file written for it)")
        # pymysql's own handling, the file's bytes made as they are sent
        # (LocalInfile): an error while writing them still ends the upload,
        # and the statement fails with it.
        try:
            offered.write(_PacketStream(conn))
        finally:
            conn.write_packet(b"")
            ok_packet = conn._read_packet()
        if not ok_packet.is_ok_packet():
            raise pymysql.err.OperationalError(CR.CR_COMMANDS_OUT_OF_SYNC, "Commands Out of Sync")
        self._read_ok_packet(ok_packet)


@dataclass(frozen=True)
class LocalInfile:
    """The one file a statement offers the server (GuardedConnection.infile):
    its ``name`` in the statement, and ``write``, which writes its bytes
    into the upload as they are made (no file on disk)."""

    name: str
    write: Callable[[Any], None]


class _PacketStream:
    """A binary file-like ``write`` that sends what it is given as LOAD DATA
    LOCAL data packets (at most 1 MB each: the server's packet limit is
    never near)."""

    PACKET = 1 << 20

    def __init__(self, conn: pymysql.connections.Connection) -> None:
        self.conn = conn

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        for at in range(0, len(view), self.PACKET):
            self.conn.write_packet(view[at:at + self.PACKET].tobytes())
        return len(data)


class GuardedConnection(pymysql.connections.Connection):
    """A pymysql connection that answers a server's LOCAL INFILE request only
    for ``infile``, the file its statement offers: pymysql itself sends
    whatever file the server names, in answer to any statement."""

    infile: LocalInfile | None = None

    def _read_query_result(self, unbuffered: bool = False) -> int:
        # pymysql's own, with the guarded result reader (pymysql 1.1 / 2.x).
        self._result = None
        result = _GuardedResult(self)
        if unbuffered:
            result.init_unbuffered_query()
        else:
            result.read()
        self._result = result
        if result.server_status is not None:
            self.server_status = result.server_status
        return int(result.affected_rows or 0)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying later may help: the server or the connection is gone or busy."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    return isinstance(exc, pymysql.err.InterfaceError) or (isinstance(exc, pymysql.err.Error)
                                                           and code in TRANSIENT_CODES)


class ColumnStoreTarget(SqlTarget):
    """MariaDB ColumnStore (or InnoDB/Aria for tests and small replicas)."""

    #: MariaDB DDL commits on its own.  Keys: see ``declares_keys``.
    capabilities: ClassVar[Capabilities] = Capabilities(
        transactional_ddl=False, max_statement_rows=1000, supports_keys=True, columnar_inserts=True, applies_parts=True,
        # 50,000 net changes a flush while behind (buffer_rows 10,000): each
        # flush leaves the server idle while the applier folds the next; a
        # 10M-row initial load's tail after the read took 29.7 s instead of
        # 34.6 s, the server spent 69.5 instead of 74.9 CPU-s, the applier's
        # peak RSS 166 instead of 155 MB (bench/README.md, 2026-12-01).
        keyless_runs=True, backlog_factor=5)
    dialect: ClassVar[Dialect] = MARIADB
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (pymysql.err.Error,)
    ddl_handlers = columnstore_ddl.HANDLERS
    statement_bytes: ClassVar[int] = 8 * 1024 * 1024  # below max_allowed_packet
    #: The state table (targets/state.py): InnoDB whatever the engine of the data.
    state_types: ClassVar[Mapping[str, str]] = {
        "producer_id": "VARCHAR(191) NOT NULL PRIMARY KEY", "seq": "BIGINT NOT NULL", "file": "VARCHAR(255) NOT NULL",
        "pos": "BIGINT NOT NULL", "gtid": "TEXT NOT NULL", "commit_ts": "BIGINT NOT NULL",
        "updated_at": "TIMESTAMP(6) NULL", "lineage": "TEXT NULL"}
    state_table_options: ClassVar[str] = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
    state_grant_hint: ClassVar[str | None] = "grant CREATE on *.* to the target user"
    now_sql: ClassVar[str] = "CURRENT_TIMESTAMP(6)"
    create_schema_sql: ClassVar[str] = "CREATE DATABASE IF NOT EXISTS {}"
    #: [target] engine (lower case) -> profile; engines not listed use INNODB.
    profiles: ClassVar[dict[str, EngineProfile]] = PROFILES
    #: Session settings: UTC for TIMESTAMP, a sql_mode that keeps zero and
    #: partial dates ('0000-00-00', '2020-00-10') yet rejects bad values,
    #: no foreign key checks (the source checked), utf8mb4.
    session_sql: ClassVar[tuple[str, ...]] = (
        "SET SESSION time_zone = '+00:00'",
        "SET SESSION sql_mode = 'STRICT_ALL_TABLES,ALLOW_INVALID_DATES,NO_AUTO_VALUE_ON_ZERO,NO_ENGINE_SUBSTITUTION'",
        "SET SESSION foreign_key_checks = 0",
        "SET SESSION explicit_defaults_for_timestamp = 1",
        "SET NAMES utf8mb4 COLLATE utf8mb4_bin",
    )

    #: The transaction kept open for a source transaction's parts reads
    #: committed rows statement by statement: a table created (beside it,
    #: DDL commits on its own) after it began would otherwise be refused
    #: with 1412 "Table definition has changed" under REPEATABLE READ.  It is
    #: the only writer of its rows, so what it reads is the same either way.
    open_session_sql: ClassVar[tuple[str, ...]] = ("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",)

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.engine = cfg.target.of(ColumnStoreConfig).engine or "ColumnStore"
        if not ENGINE_NAME.fullmatch(self.engine):
            raise ConfigError(f"[target] engine = {self.engine!r} is not a storage engine name",
                              hint="e.g. 'ColumnStore', 'InnoDB' or 'Aria'")
        self.profile = self.profiles.get(self.engine.lower(), INNODB)
        self._dsn, self.use_load_data = self._parse_url(cfg.target.url)
        # Snapshot rows loaded beside a flush with at least this many (0: never).
        self.beside_rows = cfg.target.of(ColumnStoreConfig).side_load_rows if self.profile.loads_beside else 0
        self.side = beside.SideLoader(self._connect, self._load_beside)
        # A keyless table's snapshot rows beside a transaction applied in parts (sidexa.py).
        self.xa = sidexa.XaSide(self._connect, self._load_beside)
        self._xa_recovers = True  # XA RECOVER allowed (else no XA side loads: nothing could finish them)
        # (db, table, key) -> the target table's primary key is that key (READ runs load with REPLACE)
        self._pk_matches: dict[tuple[str, str, tuple[str, ...]], bool] = {}
        self._slow_keyless: set[tuple[str, str]] = set()  # tables warned of (``_delete_row``)
        # Keyless tables whose source indexes were looked at (``_prepare``).
        self._indexed: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {}

    # ------------------------------------------------------------------
    # Connection
    # ------------------------------------------------------------------
    @staticmethod
    def _parse_url(url: str) -> tuple[dict[str, Any], bool]:
        """'mysql://user:pass@host:port/?local_infile=0' -> (connect kwargs, use LOAD DATA)."""
        if not url:
            raise ConfigError("[target] url is empty", hint="set it to mysql://user:password@host:3306/")
        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb", "columnstore"):
            raise ConfigError(f"[target] url scheme {parts.scheme!r} is not mysql://",
                              hint="write it as mysql://user:password@host:3306/")
        if parts.path not in ("", "/"):
            raise ConfigError("[target] url names a database; Cynomys writes each source database under its own name",
                              hint="end the url with the port: mysql://user:password@host:3306/")
        options = dict(parse_qsl(parts.query))
        unknown = set(options) - set(URL_OPTIONS)
        if unknown:
            raise ConfigError(f"[target] url has unknown options {sorted(unknown)}",
                              hint="known: " + ", ".join(URL_OPTIONS))
        try:
            port = parts.port or 3306
        except ValueError:
            raise ConfigError("[target] url has a bad port", hint="write it as mysql://user:password@host:3306/") from None
        dsn: dict[str, Any] = {"host": parts.hostname or "127.0.0.1", "port": port,
                               "user": unquote(parts.username or ""), "password": unquote(parts.password or "")}
        use_load_data = _flag(options, "local_infile", True)
        # The client flag is what the URL says; even with it on, only the
        # file Cynomys just wrote for a LOAD DATA is ever sent (GuardedConnection).
        dsn["local_infile"] = use_load_data
        tls = _flag(options, "ssl", any(k in options for k in ("ssl_ca", "ssl_cert", "ssl_key")))
        if tls:
            dsn["ssl"] = _tls_context(options)
        else:
            dsn["ssl_disabled"] = True
        return dsn, use_load_data

    @property
    def declares_keys(self) -> bool:
        # MariaDB engines have keys; the ColumnStore engine has none.
        return self.profile.declare_keys

    @property
    def where(self) -> str:
        return f"MariaDB target {self._dsn['host']}:{self._dsn['port']}"

    def _connect(self) -> pymysql.connections.Connection:
        try:
            conn = GuardedConnection(**self._dsn, charset="utf8mb4", autocommit=False, connect_timeout=10)
        except pymysql.err.Error as exc:
            raise self.target_error(exc, f"cannot connect to {self.where}",
                               hint="check [target] url (user, password, host, port)") from exc
        try:
            with conn.cursor() as cur:
                for sql in self.session_sql + self.profile.session_sql:
                    cur.execute(sql)
                if self.beside_rows and self._reads_committed(cur):
                    cur.execute(beside.ISOLATION_SQL)
        except pymysql.err.Error as exc:
            self._discard(conn)
            raise self.target_error(exc, f"cannot set up a session on {self.where}") from exc
        return conn

    def _reads_committed(self, cur: Cursor) -> bool:
        """Whether sessions may run READ COMMITTED, as side loads need
        (beside.py): a server writing a STATEMENT binlog refuses InnoDB
        writes at that level (1665), so side loads stay off there."""
        cur.execute("SELECT @@log_bin, @@binlog_format")
        row = cur.fetchone()
        if row is None:  # not a MariaDB answer: nothing is loaded beside
            log.info("%s did not say its binlog format: snapshot rows are not loaded beside flushes", self.where)
            self.beside_rows = 0
            return False
        log_bin, fmt = row
        if int(log_bin) and str(fmt).upper() == "STATEMENT":
            log.warning("%s writes a STATEMENT binlog: snapshot rows are not loaded beside flushes "
                        "([target] side_load_rows needs binlog_format MIXED or ROW there)", self.where)
            self.beside_rows = 0
            return False
        return True

    def is_transient(self, exc: BaseException) -> bool:
        return is_transient(exc)

    def describe(self, exc: BaseException) -> str:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
        text = exc.args[1] if len(exc.args) > 1 else str(exc)
        return f"{code} {text}"

    def connect_note(self) -> str:
        return f" (engine {self.engine})"

    # ------------------------------------------------------------------
    # State: always InnoDB (see the module docstring)
    # ------------------------------------------------------------------
    def _begin_flush(self, cur: Cursor, state: AppliedState) -> None:
        # First statement of every flush: registers InnoDB first in the
        # transaction (so it commits last, after ColumnStore) and keeps a
        # second applier of the same producer out until we commit.
        cur.execute(f"SELECT seq FROM {self._state_name()} WHERE producer_id = %s FOR UPDATE", (state.producer_id,))
        cur.fetchall()

    def _write_state(self, cur: Cursor, state: AppliedState) -> None:
        if self.xa.active and cur.connection is self._open_conn:
            # The open transaction commits with the XID of the rows loaded
            # beside it (sidexa.py): recovery commits them if, and only if,
            # this commit happened.
            xid = self.xa.prepare()
            cur.execute(f"INSERT INTO {self._side_xa_name()} (xid, written_at) VALUES (%s, {self.now_sql})", (xid,))
        # An upsert on the key: the row stays (and stays locked by
        # _begin_flush) instead of going and coming back.
        names = [applied_state.KEY, *applied_state.FIELDS]
        cur.execute(
            f"INSERT INTO {self._state_name()} ({', '.join(names)}, {applied_state.WRITTEN_AT}) VALUES ("
            + ", ".join(["%s"] * len(names)) + f", {self.now_sql}) ON DUPLICATE KEY UPDATE "
            + ", ".join(f"{c} = VALUES({c})" for c in [*applied_state.FIELDS, applied_state.WRITTEN_AT]),
            (state.producer_id, *applied_state.encode(state)))

    # ------------------------------------------------------------------
    # Tables
    # ------------------------------------------------------------------
    def table_exists(self, database: str, table: str) -> bool:
        with self.transaction(f"looking up {database}.{table}") as cur:
            return self.exists(cur, database, table)

    def table_columns(self, database: str, table: str) -> tuple[ColumnDef, ...] | None:
        with self.transaction(f"looking up the columns of {database}.{table}") as cur:
            have = self.target_columns(cur, database, table)
        # The source's types when the schema loaded with has these columns (as fetch_rows reads them).
        known = {c.name.lower(): c for c in self.schemas[(database, table)].columns} \
            if (database, table) in self.schemas else {}
        return tuple(known.get(n.lower(), ColumnDef(n, t, nullable)) for n, t, nullable in have) or None

    @staticmethod
    def exists(cur: Cursor, database: str, table: str) -> bool:
        cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (database, table))
        return cur.fetchone() is not None

    @staticmethod
    def target_columns(cur: Cursor, database: str, table: str) -> list[tuple[str, str, bool]]:
        """(name, COLUMN_TYPE, nullable) of a target table, in order; [] if missing."""
        cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS"
                    " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (database, table))
        return [(str(n), str(t), v == "YES") for n, t, v in cur.fetchall()]

    def column_sql(self, col: ColumnDef, key: Sequence[str] = ()) -> str:
        """A column definition for this engine: mapped type; NOT NULL only
        for key columns (rows come from the source, which enforced the rest)."""
        in_key = self.declares_keys and col.name.lower() in {k.lower() for k in key}
        return f"{MARIADB.ident(col.name)} {self.profile.target_type(col)} {'NOT NULL' if in_key else 'NULL'}"

    def create_table_sql(self, database: str, table: str, columns: Sequence[ColumnDef], key: Sequence[str]) -> str:
        defs = [self.column_sql(c, key) for c in columns]
        return (f"CREATE TABLE IF NOT EXISTS {MARIADB.table(database, table)} (\n  " + ",\n  ".join(defs)
                + self.key_clause(key) + f"\n) ENGINE={self.engine} {self.profile.table_options}")

    def _prepare(self, schema: TableSchema) -> None:
        """Create the table, or add columns the schema has and the target
        lacks (a DDL that was skipped or arrived late).  DDL commits on its
        own in MariaDB, so this runs before the flush's transaction."""
        ident = (schema.database, schema.table)
        # A keyless table's source indexes come with its snapshot read, often
        # after the log's changes (no indexes in a TABLE_MAP) have made the
        # table: looked at once per table and set of indexes.
        indexes = self._indexes_to_make(schema)
        if self._ready.get(ident) == schema and self._indexed.get(ident, ()) == indexes:
            return
        self.check_database(schema.database)
        self.schemas[ident] = schema
        with self.transaction(f"preparing table {schema.name}") as cur:
            have = {n.lower() for n, _, _ in self.target_columns(cur, *ident)}
            if not have:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(schema.database)}")
                cur.execute(self.create_table_sql(schema.database, schema.table, schema.columns, schema.key))
                log.info("created table %s on %s", schema.name, self.where)
            for col in schema.columns:
                if have and col.name.lower() not in have:
                    cur.execute(f"ALTER TABLE {MARIADB.table(*ident)} ADD COLUMN {self.column_sql(col)}")
                    log.warning("added column %s.%s (%s): the target lacked it", schema.name, col.name, col.type)
            if indexes and self._indexed.get(ident) != indexes:
                # Only while the table is empty (new, or emptied by the
                # keyless read's TRUNCATE): building an index over rows the
                # table holds would stop the applier for as long.
                cur.execute(f"SELECT 1 FROM {MARIADB.table(*ident)} LIMIT 1")
                if cur.fetchone() is None:
                    self.index_keyless(cur, schema)
        self._ready[ident] = schema
        self._indexed[ident] = indexes

    def forget_caches(self) -> None:
        super().forget_caches()
        self._indexed.clear()  # a table dropped and made again is looked at again

    def _indexes_to_make(self, schema: TableSchema) -> tuple[tuple[str, ...], ...]:
        """The source's indexes this target makes: a keyless table's, on an
        engine with indexes (a keyed table's rows are found by its key)."""
        return () if schema.key or not self.declares_keys else schema.indexes

    def index_keyless(self, cur: Cursor, schema: TableSchema) -> None:
        """Give a new keyless table the source's indexes (``TableSchema.indexes``),
        on an engine that has indexes: an updated or deleted row of it is
        found by all its values (``_delete_rows``), which without an index is
        a scan of the table per statement -- with the source's own index it
        is a lookup.  Made while the table is empty (no load pays for a
        build); one the server refuses (a key too long for the engine, a TEXT
        column) is left out with a warning: the rows are still found, by scans."""
        wanted = self._indexes_to_make(schema)
        if not wanted:
            return
        tbl = MARIADB.table(schema.database, schema.table)
        types = {c.name.lower(): self.profile.target_type(c).lower() for c in schema.columns}
        cur.execute("SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX", (schema.database, schema.table))
        present: dict[str, list[str]] = {}
        for index, column in cur.fetchall():
            present.setdefault(str(index), []).append(str(column).lower())
        for cols in wanted:
            if [c.lower() for c in cols] in present.values():
                continue  # the user's own, or made before
            name = ("cynomys_" + "_".join(cols))[:64]
            if any(t in types.get(c.lower(), "text") for c in cols for t in _UNINDEXABLE):
                log.warning("index (%s) of keyless table %s is not made on %s: a %s column cannot be indexed whole",
                            ", ".join(cols), schema.name, self.where, "/".join(_UNINDEXABLE).upper())
                continue
            try:
                cur.execute(f"CREATE INDEX IF NOT EXISTS {MARIADB.ident(name)} ON {tbl} "
                            f"({', '.join(MARIADB.ident(c) for c in cols)})")
            except pymysql.err.MySQLError as exc:
                if not (exc.args and exc.args[0] in INDEX_REFUSED):
                    raise
                log.warning("index (%s) of keyless table %s is not made on %s: %s", ", ".join(cols), schema.name,
                            self.where, exc.args[-1])
                continue
            log.info("indexed keyless table %s on %s by (%s), as the source is", schema.name, self.where,
                     ", ".join(cols))

    # ------------------------------------------------------------------
    # Flush
    # ------------------------------------------------------------------
    def _apply_table(self, cur: Cursor, tf: TableFlush) -> None:
        schema = tf.schema
        keys = list(tf.delete_keys)
        runs, upserts = tf.runs, self._replacing(cur, tf)
        # Updates that keep their key: the new image loads with REPLACE over
        # the old row instead of a DELETE of its key first (InnoDB turns such
        # a REPLACE into an update in place).
        replaced = self._replaced_keys(cur, tf)
        if replaced:
            keys = [k for k in keys if k not in replaced]
        if upserts:
            # Snapshot rows (READ runs) go in with LOAD DATA ... REPLACE: the
            # primary key replaces whatever the target holds for them, so their
            # keys need no DELETE first (one DELETE of 1000 keys cost ~90 ms on
            # this loaded box: more than loading the rows).  A key deleted
            # by the log and read again in the same flush: the read row wins.
            # (A key the log deleted and a chunk read again is deleted
            # first all the same: the replacing load puts the read row back.
            # Sorting those keys out cost a set of every read key per flush.)
            runs = [r for r in tf.runs if r.op is not Op.READ]
        else:
            keys += tf.read_keys()  # READ is an upsert: the row the target may hold goes first
        if self.profile.delete_inserted_keys and schema.key:
            keys += tf.insert_keys()
        self._delete_keys(cur, schema, list(dict.fromkeys(keys)))  # one pass, each key once
        inserts = list(tf.inserts) + self._delete_rows(cur, schema, tf.delete_rows)
        if replaced:
            if not self._loaded(cur, schema, inserts, runs, replace=True):  # LOAD DATA refused: as before
                self._delete_keys(cur, schema, list(replaced))
                self._insert_values_of(cur, schema, inserts + [r for run in runs for r in run.images()])
        elif inserts or runs:
            self._insert(cur, schema, inserts, runs)
        if upserts:
            self._upsert_reads(cur, schema, upserts)

    def _upsert_reads(self, cur: Cursor, schema: TableSchema, upserts: list[InsertRun]) -> None:
        """READ runs into a table whose primary key is the source's: LOAD
        DATA ... REPLACE, or delete their keys and INSERT where the server
        refuses LOAD DATA LOCAL."""
        if not self._loaded(cur, schema, [], upserts, replace=True):
            self._delete_keys(cur, schema, [k for run in upserts for k in run_keys(run)])
            self._insert_values_of(cur, schema, [r for run in upserts for r in run.images()])

    # -- snapshot rows beside the flush (columnstore/beside.py) -------------
    def _apply_tables(self, cur: Cursor, flush: Flush) -> None:
        if not (self.beside_rows and self.use_load_data):
            return super()._apply_tables(cur, flush)
        plan = beside.split(flush.tables, lambda tf: bool(self._replacing(cur, tf)), self.beside_rows)
        if not plan.side:
            return super()._apply_tables(cur, flush)
        self.side.start(plan.side)
        try:
            for tf in plan.kept:
                self._apply_table(cur, tf)
        finally:
            failed = self.side.finish()  # committed before the flush writes its state, or failed
        if failed is None:
            log.debug("loaded %d snapshot rows beside the flush", plan.side_rows)
            return
        if not _given_back(failed):
            raise failed
        # Locked out (by this flush, which waits for it) or refused LOCAL
        # INFILE: the flush loads the rows itself.
        log.info("the side load gave its %d snapshot rows back to the flush (%s)", plan.side_rows,
                 self.describe(failed))
        for tf in plan.side:
            self._upsert_reads(cur, tf.schema, tf.runs)

    def _load_beside(self, cur: Cursor, tf: TableFlush) -> None:
        self._load_data(cur, tf.schema, [], tf.runs, replace=bool(tf.schema.key))

    # -- a keyless table's snapshot rows beside a transaction in parts (columnstore/sidexa.py)
    @property
    def commits_parts_alone(self) -> bool:
        return self._xa_on

    @property
    def _xa_on(self) -> bool:
        return bool(self.beside_rows and self.use_load_data and self._xa_recovers and self.where not in _XA_OFF)

    def _side_xa_name(self) -> str:
        return self.table_name(self.state_namespace, sidexa.TABLE)

    def connect(self) -> None:
        super().connect()
        with self.transaction("creating the side load table", hint=self.state_grant_hint) as cur:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self._side_xa_name()} ({sidexa.TABLE_COLUMNS}) ENGINE=InnoDB")

    def recover(self, producer_id: str) -> None:
        """Finish the side loads an applier of this producer left prepared
        (sidexa.py ``recover``), under the producer's state row lock."""
        with self.transaction("recovering side loads left prepared") as cur:
            cur.execute(f"SELECT seq FROM {self._state_name()} WHERE producer_id = %s FOR UPDATE", (producer_id,))
            cur.fetchall()
            other = self._connect()
            other.autocommit(True)  # XA COMMIT/ROLLBACK of another session's XID: outside any transaction
            try:
                with other.cursor() as xa:
                    committed, rolled_back, owned = sidexa.recover(cur, xa, self._side_xa_name(), producer_id)
            except pymysql.err.OperationalError as exc:
                if not (exc.args and exc.args[0] in XA_RECOVER_REFUSED):
                    raise
                log.warning("%s refuses XA RECOVER (%s): a keyless table's snapshot rows load on one connection "
                            "(let the target user run XA RECOVER for two)", self.where, exc.args[1])
                self._xa_recovers = False
                return
            finally:
                other.close()
            tag = sidexa.PREFIX + sidexa.producer_tag(producer_id) + "-%"
            cur.execute(f"DELETE FROM {self._side_xa_name()} WHERE xid LIKE %s"
                        + "".join(" AND xid <> %s" for _ in owned), (tag, *owned))
        if committed or rolled_back:
            log.warning("recovered side loads of producer %s: %d committed, %d rolled back", producer_id,
                        committed, rolled_back)

    def _part_tables(self, cur: Cursor, flush: Flush) -> None:
        if self.xa.tables:
            busy = [tf.schema.name for tf in flush.tables if (tf.schema.database, tf.schema.table) in self.xa.tables
                    and (tf.delete_rows or tf.delete_keys)]
            if busy:
                raise sidexa.rejected_delete(self.where, busy)
        plan = sidexa.split(flush.tables, self.beside_rows) if self._xa_on else None
        if not plan or not plan.side:
            return super()._part_tables(cur, flush)
        self.xa.start_for(flush.state.producer_id, plan.side)
        try:
            super()._part_tables(cur, replace(flush, tables=plan.kept))
        finally:
            failed = self.xa.finish()
        if failed is None:
            log.debug("loaded %d snapshot rows beside the part (XA %s)", plan.side_rows, self.xa.xid)
            return
        if not _given_back(failed):
            raise failed
        # Locked out or refused LOCAL INFILE: the rows of the earlier parts
        # went with the side's XA transaction, so the whole transaction is
        # applied again, on one connection (this process remembers it).
        _XA_OFF.add(self.where)
        raise TargetUnavailableError(
            f"the side load of a transaction applied in parts on {self.where} failed ({self.describe(failed)}); "
            "it was rolled back with the transaction", hint="the applier applies the transaction again on one "
            "connection") from failed

    def commit_parts(self, flush: Flush) -> None:
        super().commit_parts(flush)
        if not self.xa.prepared:
            return
        rows = self.xa.rows
        try:
            self.xa.commit(self._side_xa_name())
        except pymysql.err.Error as exc:
            raise self.target_error(exc, f"committing the side load of the transaction just committed on "
                                         f"{self.where} (recovery commits it when the applier starts again)") from exc
        log.info("committed %d snapshot rows loaded beside the transaction", rows)

    def rollback_open(self) -> None:
        super().rollback_open()
        self.xa.abandon()  # active: rolled back with its connection; prepared: recovery decides

    def close(self) -> None:
        self.side.close()
        self.xa.close()
        super().close()

    def _replacing(self, cur: Cursor, tf: TableFlush) -> list[InsertRun]:
        """The flush's READ runs when the target table replaces rows by the
        source's primary key (``_replaces_by_key``); else [] (their keys are
        deleted first)."""
        upserts = [r for r in tf.runs if r.op is Op.READ]
        return upserts if upserts and self._replaces_by_key(cur, tf.schema) else []

    def _replaced_keys(self, cur: Cursor, tf: TableFlush) -> set[tuple[Value, ...]]:
        """Keys the flush deletes and inserts again (an update keeping its
        key), when the table replaces rows by the source's primary key: a
        LOAD DATA ... REPLACE of the new images removes the old rows."""
        if not (tf.delete_keys and tf.inserts) or not self._replaces_by_key(cur, tf.schema):
            return set()
        idx = tf.schema.key_indexes()
        inserted = {tuple(r[i] for i in idx) for r in tf.inserts}
        return {k for k in tf.delete_keys if k in inserted}

    def _replaces_by_key(self, cur: Cursor, schema: TableSchema) -> bool:
        """The engine declares keys, the target table's primary key is the
        source's, and LOAD DATA is on."""
        if not (self.use_load_data and self.profile.declare_keys and schema.key):
            return False
        ident = (schema.database, schema.table, schema.key)
        ok = self._pk_matches.get(ident)
        if ok is None:
            cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND "
                        "TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (schema.database, schema.table))
            ok = self._pk_matches[ident] = [str(r[0]).lower() for r in cur.fetchall()] == [k.lower() for k in schema.key]
        return ok

    def _delete_keys(self, cur: Cursor, schema: TableSchema, keys: Sequence[tuple[Value, ...]]) -> None:
        if not keys:
            return
        tbl = MARIADB.table(schema.database, schema.table)
        step = self.capabilities.max_statement_rows
        for i in range(0, len(keys), step):
            self._execute(cur, f"DELETE FROM {tbl} WHERE {MARIADB.keys_in(schema.key, keys[i:i + step], literal)}", schema)

    def _delete_rows(self, cur: Cursor, schema: TableSchema, rows: Mapping[Row, int]) -> list[Row]:
        """Remove a flush's keyless rows (``rows``: a row image -> copies to
        remove); returns copies to insert back.  Finding a keyless row is a
        scan of the table (the target has no index to find it by), so the
        rows go by statements of up to ``KEYLESS_DELETE_ROWS`` rows and
        ``statement_bytes``, two scans each (``_deleted_together``), not a
        scan per row: at 100 single-row updates a second of a 5M-row table,
        a scan each took 0.8 s a row and the applier could not keep up."""
        together = [r for r in rows if None not in r] if self.profile.delete_limit else []
        alone = [r for r in rows if None in r] if together else list(rows)
        if together:
            texts = ["(" + ", ".join(literal(v) for v in r) + ")" for r in together]
            for start, end in statement_batches(texts, KEYLESS_DELETE_ROWS, self.statement_bytes):
                if end - start < 2 or not self._deleted_together(cur, schema, texts[start:end]):
                    alone.extend(together[start:end])
        back: list[Row] = []
        for row in alone:
            back.extend(self._delete_row(cur, schema, row, rows[row]))
        return back

    def _deleted_together(self, cur: Cursor, schema: TableSchema, texts: Sequence[str]) -> bool:
        """Delete the rows written as ``texts`` in one statement when the
        table holds at most one copy of each: then deleting every match
        removes exactly what a ``DELETE ... LIMIT n`` per row would.  A row
        with copies (or rows GROUP BY takes for one: the same first
        ``max_sort_length`` bytes of a long value) sends the batch row by
        row.  Rows holding NULL never come here: ``IN`` matches no NULL."""
        tbl = MARIADB.table(schema.database, schema.table)
        cols = ", ".join(MARIADB.ident(c.name) for c in schema.columns)
        where = f"({cols}) IN ({', '.join(texts)})"
        t0 = time.monotonic()
        self._execute(cur, f"SELECT 1 FROM {tbl} WHERE {where} GROUP BY {cols} HAVING COUNT(*) > 1 LIMIT 1", schema)
        if cur.fetchone() is not None:
            return False
        self._execute(cur, f"DELETE FROM {tbl} WHERE {where}", schema)
        self._slow_keyless_delete(schema, time.monotonic() - t0)
        return True

    def _delete_row(self, cur: Cursor, schema: TableSchema, row: Row, n: int) -> list[Row]:
        """Remove n copies of a whole row; returns copies to insert back
        (engines without DELETE ... LIMIT delete every copy)."""
        tbl = MARIADB.table(schema.database, schema.table)
        # '= literal' / 'IS NULL' rather than '<=>': ColumnStore has no NULL-safe equality.
        where = " AND ".join(f"{MARIADB.ident(c.name)} " + ("IS NULL" if v is None else f"= {literal(v)}")
                             for c, v in zip(schema.columns, row))
        t0 = time.monotonic()
        if self.profile.delete_limit:
            self._execute(cur, f"DELETE FROM {tbl} WHERE {where} LIMIT {n}", schema)
            self._slow_keyless_delete(schema, time.monotonic() - t0)
            return []
        cur.execute(f"SELECT COUNT(*) FROM {tbl} WHERE {where}")
        (present,) = cur.fetchone()
        self._execute(cur, f"DELETE FROM {tbl} WHERE {where}", schema)
        self._slow_keyless_delete(schema, time.monotonic() - t0)
        return [row] * max(int(present) - n, 0)

    def _slow_keyless_delete(self, schema: TableSchema, seconds: float) -> None:
        """Warn, once per table, when finding a keyless row by its values
        took a scan (``SLOW_KEYLESS_DELETE_S``): what to do about it."""
        ident = (schema.database, schema.table)
        if seconds < SLOW_KEYLESS_DELETE_S or ident in self._slow_keyless:
            return
        self._slow_keyless.add(ident)
        fix = (f"add an index to the target table that these values can use (ALTER TABLE {schema.name} ADD INDEX "
               "(<a selective column>)), or give the source table a primary key") if self.profile.declare_keys else \
            "give the source table a primary key"
        log.warning("target table %s has no primary key: the applier finds each updated or deleted row of it by "
                    "all its values, and that DELETE took %.2f s (a scan of the table); the applier falls behind "
                    "if its rows change often: %s", schema.name, seconds, fix)

    # -- bulk insert -------------------------------------------------------
    def _insert(self, cur: Cursor, schema: TableSchema, rows: list[Row], runs: list[InsertRun] | None = None) -> None:
        runs = runs or []
        if self.use_load_data and self._loaded(cur, schema, rows, runs):
            return
        self._insert_values_of(cur, schema, rows + [r for run in runs for r in run.images()])

    def _loaded(self, cur: Cursor, schema: TableSchema, rows: list[Row], runs: list[InsertRun],
                replace: bool = False) -> bool:
        """LOAD DATA of ``rows`` and ``runs``; False (nothing written) when
        the server refuses LOAD DATA LOCAL INFILE, which turns it off for
        good: the caller writes them with multi-row INSERTs instead."""
        try:
            self._load_data(cur, schema, rows, runs, replace=replace)
            return True
        except pymysql.err.Error as exc:
            if not (exc.args and exc.args[0] in LOCAL_INFILE_REFUSED):
                raise
            log.warning("%s refuses LOAD DATA LOCAL INFILE (%s); using multi-row INSERT from now on "
                        "(enable local_infile on the server for faster loads)", self.where, exc.args[1])
            self.use_load_data = False
            return False

    @staticmethod
    def write_load_data(out: IO[bytes], schema: TableSchema, rows: list[Row],
                        runs: list[InsertRun] | None = None) -> None:
        """Write the LOAD DATA file: ``rows`` with the field encoders
        (types.py ``load_data_rows``: compiled, or value by value), then ``runs`` column-wise (columnstore/loaddata.py,
        the same bytes for the same values).  In pieces of ``core.columnar.PIECE_ROWS``
        rows: the whole file is never one bytes object (the applier's peak
        memory, issue #12)."""
        encoders = [FIELD_ENCODERS.get(c.base_type, encode_field) for c in schema.columns]
        piece = core_columnar.PIECE_ROWS
        for at in range(0, len(rows), piece):
            out.write(load_data_rows(rows[at:at + piece], encoders))
        if runs:
            # Imported here: pyarrow is needed only by runs, which only the
            # compiled reader makes; the pure-Python applier never loads it.
            from cynomys.applier.targets.columnstore.loaddata import write_load_data

            write_load_data(out, schema, runs)

    @classmethod
    def load_data_bytes(cls, schema: TableSchema, rows: list[Row], runs: list[InsertRun] | None = None) -> bytes:
        """The LOAD DATA file ``write_load_data`` writes, as bytes (tests, benchmarks)."""
        buf = io.BytesIO()
        cls.write_load_data(buf, schema, rows, runs)
        return buf.getvalue()

    def _load_data(self, cur: Cursor, schema: TableSchema, rows: list[Row], runs: list[InsertRun],
                   replace: bool = False) -> None:
        targets, sets = [], []
        for i, col in enumerate(schema.columns):
            ident = MARIADB.ident(col.name)
            if ColumnDef(col.name, self.profile.target_type(col)).base_type == "bit":
                # LOAD DATA would store the digits' bytes in a BIT column.
                targets.append(f"@v{i}")
                sets.append(f"{ident} = CAST(@v{i} AS UNSIGNED)")
            else:
                targets.append(ident)
        # The file is made while it is uploaded (LocalInfile): the server
        # parses and inserts one piece while the next is written, instead of
        # waiting for the whole file, and nothing goes to disk.
        name = f"cynomys-{uuid.uuid4().hex}.tsv"
        sql = (f"LOAD DATA LOCAL INFILE '{name}'{' REPLACE' if replace else ''} INTO TABLE "
               f"{MARIADB.table(schema.database, schema.table)}"
               " CHARACTER SET binary FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n'"
               f" ({', '.join(targets)})" + (" SET " + ", ".join(sets) if sets else ""))
        conn = cur.connection
        # The one file the server may ask for, for this statement only.
        conn.infile = LocalInfile(name, lambda out: self.write_load_data(out, schema, rows, runs))
        try:
            cur.execute(sql)
        except pymysql.err.Error as exc:
            if isinstance(exc, ForeignFileRequest) or self.is_transient(exc):
                raise  # (a lost connection or a lock wait is no value refused: retried, not a stop)
            if exc.args and exc.args[0] in LOCAL_INFILE_REFUSED:
                raise
            raise self.rejected(schema, rows + [r for run in runs for r in run.images()],
                                self.describe(exc)) from exc
        finally:
            conn.infile = None
        # LOAD DATA LOCAL turns bad values into warnings (the server
        # cannot stop the client's upload), clamping or truncating them.
        # (Row images of the runs are made only to name a refused row.)
        if cur.warning_count:
            self._check_loaded(cur, schema, rows + [r for run in runs for r in run.images()])

    def _insert_values_of(self, cur: Cursor, schema: TableSchema, rows: list[Row]) -> None:
        head = (f"INSERT INTO {MARIADB.table(schema.database, schema.table)} ("
                + ", ".join(MARIADB.ident(c) for c in schema.column_names) + ") VALUES ")
        texts = ["(" + ", ".join(literal(v) for v in row) + ")" for row in rows]
        self._insert_values(cur, schema, head, texts, rows)

    def _check_loaded(self, cur: Cursor, schema: TableSchema, rows: list[Row]) -> None:
        if not cur.warning_count:
            return
        cur.execute("SHOW WARNINGS")
        # Notes count too: a DECIMAL rounded to fewer digits is only a Note.
        problems = [str(msg) for _level, _code, msg in cur.fetchall()]
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise self.rejected(schema, rows, problems[0] + more)

    def describe_column(self, col: ColumnDef) -> str:
        return self.profile.target_type(col)

    # ------------------------------------------------------------------
    # DDL
    # ------------------------------------------------------------------
    def ddl_run(self, change: Change, state: AppliedState, scope: Cursor | None) -> columnstore_ddl.Run:
        return columnstore_ddl.Run(self, change.sql or "", self.where, self.schemas, change.commit_ts)

    # ------------------------------------------------------------------
    # Reading back
    # ------------------------------------------------------------------
    def checksum_range(self, schema: TableSchema, rng: KeyRange) -> Checksum:
        """`cynomys verify`: in SQL where the column types allow (columnstore/verify.py)."""
        got = columnstore_verify.checksum_range(self, schema, rng)
        return super().checksum_range(schema, rng) if got is None else got

    def range_rows(self, schema: TableSchema, rng: KeyRange) -> list[Row]:
        """`cynomys verify`: the key range read in SQL (columnstore/verify.py)."""
        rows = columnstore_verify.range_rows(self, schema, rng)
        return super().range_rows(schema, rng) if rows is None else rows

    def fetch_rows(self, database: str, table: str) -> list[Row]:
        with self.transaction(f"reading {database}.{table}") as cur:
            have = self.target_columns(cur, database, table)
            if not have:
                raise TargetRejectedError(f"table {database}.{table} does not exist on {self.where}")
            # Give values their *source* type and order when the schema we
            # loaded with still has the same columns (ColumnStore stores YEAR
            # as SMALLINT, BIT as a number, and a type change by copy moves
            # the column last); otherwise the target's own types and order.
            known = self.schemas.get((database, table))
            names = sorted(n.lower() for n, _, _ in have)
            if known is not None and sorted(c.lower() for c in known.column_names) == names:
                columns = list(known.columns)
            else:
                columns = [ColumnDef(n, t, nullable) for n, t, nullable in have]
            exprs, convs = fetch_plan(columns)
            cur.execute(f"SELECT {', '.join(exprs)} FROM {MARIADB.table(database, table)}")
            return [tuple(conv(v) for conv, v in zip(convs, row)) for row in cur.fetchall()]


