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

import contextlib
import logging
import os
import re
import tempfile
import time
from typing import Any, Callable, ClassVar, Iterator, Sequence
from urllib.parse import parse_qsl, unquote, urlsplit

import pymysql
from pymysql.cursors import Cursor

from cynomys.applier.targets.columnstore import ddl as ddl_ops
from cynomys.applier.targets.base import (
    short_sql,
    statement_batches,
    AppliedState,
    Capabilities,
    Flush,
    TableFlush,
    Target,
)
from cynomys.applier.targets.columnstore.types import (
    FIELD_ENCODERS,
    INNODB,
    PROFILES,
    EngineProfile,
    encode_field,
    fetch_plan,
    literal,
)
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, TargetRejectedError, TargetUnavailableError
from cynomys.core.model import Change, ColumnDef, Position, Row, TableSchema, Value
from cynomys.reducer.sql import MARIADB

log = logging.getLogger(__name__)


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
#: The server (or client) refuses LOAD DATA LOCAL: fall back to INSERT.
LOCAL_INFILE_REFUSED = frozenset({1148, 2068, 3948, 4166})

_MAX_STATEMENT_BYTES = 8 * 1024 * 1024  # keep multi-row INSERTs below max_allowed_packet


def target_error(exc: pymysql.err.Error, what: str,
                 hint: str | None = None) -> TargetUnavailableError | TargetRejectedError:
    """A pymysql error -> TargetUnavailableError (transient) or TargetRejectedError."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    text = exc.args[1] if len(exc.args) > 1 else str(exc)
    if isinstance(exc, pymysql.err.InterfaceError) or code in TRANSIENT_CODES:
        return TargetUnavailableError(f"{what}: target unavailable ({code} {text})",
                                      hint="check that the target server is running and reachable; Cynomys retries")
    return TargetRejectedError(f"{what}: target refused it ({code} {text})", hint=hint)


class ColumnStoreTarget(Target):
    """MariaDB ColumnStore (or InnoDB/Aria for tests and small replicas)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        transactional_ddl=False, max_statement_rows=1000, supports_keys=False)
    #: Where the applier state lives on the target.
    state_database: ClassVar[str] = "cynomys_state"
    state_table: ClassVar[str] = "applied"
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

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.engine = cfg.target.engine or "ColumnStore"
        if not re.fullmatch(r"\w+", self.engine):
            raise ConfigError(f"[target] engine = {self.engine!r} is not a storage engine name",
                              hint="e.g. 'ColumnStore', 'InnoDB' or 'Aria'")
        self.profile = self.profiles.get(self.engine.lower(), INNODB)
        self._dsn, self.use_load_data = self._parse_url(cfg.target.url)
        self._conn: pymysql.connections.Connection | None = None
        # Tables known to match a schema (created, columns present); cleared by DDL.
        self._ready: dict[tuple[str, str], TableSchema] = {}
        # Source schemas seen (flushes, DDL), for fetch_rows to give values
        # their source type; kept in step by columnstore_ddl.
        self.schemas: dict[tuple[str, str], TableSchema] = {}

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
        unknown = set(options) - {"local_infile"}
        if unknown:
            raise ConfigError(f"[target] url has unknown options {sorted(unknown)}", hint="known: local_infile=0|1")
        try:
            port = parts.port or 3306
        except ValueError:
            raise ConfigError("[target] url has a bad port", hint="write it as mysql://user:password@host:3306/") from None
        dsn = {"host": parts.hostname or "127.0.0.1", "port": port,
               "user": unquote(parts.username or ""), "password": unquote(parts.password or "")}
        return dsn, options.get("local_infile", "1") not in ("0", "false", "off")

    @property
    def where(self) -> str:
        return f"MariaDB target {self._dsn['host']}:{self._dsn['port']}"

    def _open(self) -> pymysql.connections.Connection:
        if self._conn is not None:
            return self._conn
        try:
            conn = pymysql.connect(**self._dsn, charset="utf8mb4", autocommit=False, local_infile=True,
                                   connect_timeout=10)
        except pymysql.err.Error as exc:
            raise target_error(exc, f"cannot connect to {self.where}",
                               hint="check [target] url (user, password, host, port)") from exc
        try:
            with conn.cursor() as cur:
                for sql in self.session_sql + self.profile.session_sql:
                    cur.execute(sql)
        except pymysql.err.Error as exc:
            self._discard(conn)
            raise target_error(exc, f"cannot set up a session on {self.where}") from exc
        self._conn = conn
        return conn

    def _discard(self, conn: pymysql.connections.Connection | None = None) -> None:
        """Drop a connection that failed; the next call opens a new one."""
        conn = conn or self._conn
        if conn is self._conn:
            self._conn = None
        if conn is not None and conn.open:
            try:
                conn.close()
            except pymysql.err.Error as exc:  # already broken; nothing more to release
                log.debug("closing a failed connection to %s: %s", self.where, exc)

    @contextlib.contextmanager
    def _transaction(self, what: str, hint: str | None = None) -> Iterator[Cursor]:
        """One target transaction: commit on success; roll back, translate
        the driver error and raise on failure."""
        conn = self._open()
        try:
            with conn.cursor() as cur:
                yield cur
            conn.commit()
        except BaseException as exc:
            self._rollback(conn)
            if isinstance(exc, pymysql.err.Error):
                err = target_error(exc, f"{what} on {self.where}", hint)
                if isinstance(err, TargetUnavailableError):
                    self._discard(conn)
                raise err from exc
            raise

    def _rollback(self, conn: pymysql.connections.Connection) -> None:
        try:
            conn.rollback()
        except pymysql.err.Error as exc:
            # The connection is gone: the server rolls back on disconnect.
            log.warning("rollback on %s failed (%s); the server rolls back when the connection drops", self.where, exc)
            self._discard(conn)

    def connect(self) -> None:
        with self._transaction("creating the state table", hint="grant CREATE on *.* to the target user") as cur:
            db, tbl = MARIADB.ident(self.state_database), MARIADB.ident(self.state_table)
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {db}")
            # Always InnoDB: see the module docstring.
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {db}.{tbl} ("
                "producer_id VARCHAR(191) NOT NULL PRIMARY KEY, seq BIGINT NOT NULL, file VARCHAR(255) NOT NULL,"
                " pos BIGINT NOT NULL, gtid TEXT NOT NULL, commit_ts BIGINT NOT NULL, updated_at TIMESTAMP(6) NULL"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
        log.info("connected to %s (engine %s)", self.where, self.engine)

    def close(self) -> None:
        self._discard()

    # ------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------
    def _state_name(self) -> str:
        return MARIADB.table(self.state_database, self.state_table)

    def applied(self, producer_id: str) -> AppliedState | None:
        with self._transaction("reading the applier state") as cur:
            cur.execute(f"SELECT seq, file, pos, gtid, commit_ts FROM {self._state_name()} WHERE producer_id = %s",
                        (producer_id,))
            row = cur.fetchone()
        if row is None:
            return None
        seq, file, pos, gtid, commit_ts = row
        return AppliedState(producer_id, int(seq), Position(file, int(pos), gtid), int(commit_ts))

    def _lock_state(self, cur: Cursor, producer_id: str) -> None:
        # First statement of every flush: registers InnoDB first in the
        # transaction (so it commits last, after ColumnStore) and keeps a
        # second applier of the same producer out until we commit.
        cur.execute(f"SELECT seq FROM {self._state_name()} WHERE producer_id = %s FOR UPDATE", (producer_id,))
        cur.fetchall()

    def _write_state(self, cur: Cursor, state: AppliedState) -> None:
        p = state.position
        cur.execute(
            f"INSERT INTO {self._state_name()} (producer_id, seq, file, pos, gtid, commit_ts, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, CURRENT_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE seq = VALUES(seq),"
            " file = VALUES(file), pos = VALUES(pos), gtid = VALUES(gtid), commit_ts = VALUES(commit_ts),"
            " updated_at = VALUES(updated_at)",
            (state.producer_id, state.seq, p.file, p.pos, p.gtid, state.commit_ts))

    # ------------------------------------------------------------------
    # Tables
    # ------------------------------------------------------------------
    def table_exists(self, database: str, table: str) -> bool:
        with self._transaction(f"looking up {database}.{table}") as cur:
            return self.exists(cur, database, table)

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
        in_key = self.profile.declare_keys and col.name.lower() in {k.lower() for k in key}
        return f"{MARIADB.ident(col.name)} {self.profile.target_type(col)} {'NOT NULL' if in_key else 'NULL'}"

    def create_table_sql(self, database: str, table: str, columns: Sequence[ColumnDef], key: Sequence[str]) -> str:
        defs = [self.column_sql(c, key) for c in columns]
        if key and self.profile.declare_keys:
            defs.append("PRIMARY KEY (" + ", ".join(MARIADB.ident(k) for k in key) + ")")
        return (f"CREATE TABLE IF NOT EXISTS {MARIADB.table(database, table)} (\n  " + ",\n  ".join(defs)
                + f"\n) ENGINE={self.engine} {self.profile.table_options}")

    def check_database(self, database: str) -> None:
        if database.lower() == self.state_database.lower():
            raise TargetRejectedError(f"the source database {database!r} has the name of Cynomys' state database",
                                      hint="exclude it in [source] exclude_tables")

    def _ensure_table(self, schema: TableSchema) -> None:
        """Create the table, or add columns the schema has and the target
        lacks (a DDL that was skipped or arrived late).  DDL commits on its
        own in MariaDB, so this runs before the flush's transaction."""
        ident = (schema.database, schema.table)
        if self._ready.get(ident) == schema:
            return
        self.check_database(schema.database)
        self.schemas[ident] = schema
        with self._transaction(f"preparing table {schema.name}") as cur:
            have = {n.lower() for n, _, _ in self.target_columns(cur, *ident)}
            if not have:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {MARIADB.ident(schema.database)}")
                cur.execute(self.create_table_sql(schema.database, schema.table, schema.columns, schema.key))
                log.info("created table %s on %s", schema.name, self.where)
            for col in schema.columns:
                if have and col.name.lower() not in have:
                    cur.execute(f"ALTER TABLE {MARIADB.table(*ident)} ADD COLUMN {self.column_sql(col)}")
                    log.warning("added column %s.%s (%s): the target lacked it", schema.name, col.name, col.type)
        self._ready[ident] = schema

    # ------------------------------------------------------------------
    # Flush
    # ------------------------------------------------------------------
    def apply(self, flush: Flush) -> None:
        t0 = time.monotonic()
        for tf in flush.tables:
            self._ensure_table(tf.schema)
        what = f"applying a flush of {len(flush.tables)} table(s) up to {flush.state.position}"
        with self._transaction(what) as cur:
            self._lock_state(cur, flush.state.producer_id)
            for tf in flush.tables:
                self._apply_table(cur, tf)
            self._write_state(cur, flush.state)
        log.debug("%s: %d rows in %.3fs", what, sum(tf.rows for tf in flush.tables), time.monotonic() - t0)

    def _apply_table(self, cur: Cursor, tf: TableFlush) -> None:
        schema = tf.schema
        keys = list(tf.delete_keys)
        if self.profile.delete_inserted_keys and schema.key:
            idx = schema.key_indexes()
            keys += [tuple(r[i] for i in idx) for r in tf.inserts]
        self._delete_keys(cur, schema, list(dict.fromkeys(keys)))  # one pass, each key once
        inserts = list(tf.inserts)
        for row, n in tf.delete_rows.items():
            inserts.extend(self._delete_row(cur, schema, row, n))
        if inserts:
            self._insert(cur, schema, inserts)

    def _delete_keys(self, cur: Cursor, schema: TableSchema, keys: Sequence[tuple[Value, ...]]) -> None:
        if not keys:
            return
        tbl = MARIADB.table(schema.database, schema.table)
        step = self.capabilities.max_statement_rows
        cols = [MARIADB.ident(k) for k in schema.key]
        for i in range(0, len(keys), step):
            chunk = keys[i:i + step]
            if len(cols) == 1:
                where = f"{cols[0]} IN (" + ", ".join(literal(k[0]) for k in chunk) + ")"
            else:
                where = ("(" + ", ".join(cols) + ") IN ("
                         + ", ".join("(" + ", ".join(literal(v) for v in k) + ")" for k in chunk) + ")")
            self._execute(cur, f"DELETE FROM {tbl} WHERE {where}", schema)

    def _delete_row(self, cur: Cursor, schema: TableSchema, row: Row, n: int) -> list[Row]:
        """Remove n copies of a whole row; returns copies to insert back
        (engines without DELETE ... LIMIT delete every copy)."""
        tbl = MARIADB.table(schema.database, schema.table)
        # '= literal' / 'IS NULL' rather than '<=>': ColumnStore has no NULL-safe equality.
        where = " AND ".join(f"{MARIADB.ident(c.name)} " + ("IS NULL" if v is None else f"= {literal(v)}")
                             for c, v in zip(schema.columns, row))
        if self.profile.delete_limit:
            self._execute(cur, f"DELETE FROM {tbl} WHERE {where} LIMIT {n}", schema)
            return []
        cur.execute(f"SELECT COUNT(*) FROM {tbl} WHERE {where}")
        (present,) = cur.fetchone()
        self._execute(cur, f"DELETE FROM {tbl} WHERE {where}", schema)
        return [row] * max(int(present) - n, 0)

    def _execute(self, cur: Cursor, sql: str, schema: TableSchema) -> None:
        try:
            cur.execute(sql)
        except pymysql.err.Error as exc:
            if _transient(exc):
                raise
            raise TargetRejectedError(
                str(target_error(exc, f"table {schema.name}").message),
                hint=f"check that {schema.name} on the target has the source's columns and types; "
                     "fix it with ALTER TABLE on the target") from exc

    # -- bulk insert -------------------------------------------------------
    def _insert(self, cur: Cursor, schema: TableSchema, rows: list[Row]) -> None:
        if self.use_load_data:
            try:
                self._load_data(cur, schema, rows)
                return
            except pymysql.err.Error as exc:
                if not (exc.args and exc.args[0] in LOCAL_INFILE_REFUSED):
                    raise
                log.warning("%s refuses LOAD DATA LOCAL INFILE (%s); using multi-row INSERT from now on "
                            "(enable local_infile on the server for faster loads)", self.where, exc.args[1])
                self.use_load_data = False
        self._insert_values(cur, schema, rows)

    def _load_data(self, cur: Cursor, schema: TableSchema, rows: list[Row]) -> None:
        targets, sets = [], []
        for i, col in enumerate(schema.columns):
            ident = MARIADB.ident(col.name)
            if ColumnDef(col.name, self.profile.target_type(col)).base_type == "bit":
                # LOAD DATA would store the digits' bytes in a BIT column.
                targets.append(f"@v{i}")
                sets.append(f"{ident} = CAST(@v{i} AS UNSIGNED)")
            else:
                targets.append(ident)
        encoders = [FIELD_ENCODERS.get(c.base_type, encode_field) for c in schema.columns]
        fd, path = tempfile.mkstemp(prefix="cynomys-", suffix=".tsv")  # 0600: only we read it
        try:
            with os.fdopen(fd, "wb") as fh:
                for row in rows:
                    fh.write(b"\t".join([enc(v) for enc, v in zip(encoders, row)]) + b"\n")
            quoted = path.replace("\\", "\\\\").replace("'", "\\'")
            sql = (f"LOAD DATA LOCAL INFILE '{quoted}' INTO TABLE {MARIADB.table(schema.database, schema.table)}"
                   " CHARACTER SET binary FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n'"
                   f" ({', '.join(targets)})" + (" SET " + ", ".join(sets) if sets else ""))
            try:
                cur.execute(sql)
            except pymysql.err.Error as exc:
                if exc.args and exc.args[0] in LOCAL_INFILE_REFUSED:
                    raise
                raise self._rejected(schema, rows, exc.args[1] if len(exc.args) > 1 else str(exc)) from exc
            # LOAD DATA LOCAL turns bad values into warnings (the server
            # cannot stop the client's upload), clamping or truncating them.
            self._check_warnings(cur, schema, rows)
        finally:
            os.unlink(path)

    def _insert_values(self, cur: Cursor, schema: TableSchema, rows: list[Row]) -> None:
        head = (f"INSERT INTO {MARIADB.table(schema.database, schema.table)} ("
                + ", ".join(MARIADB.ident(c) for c in schema.column_names) + ") VALUES ")
        texts = ["(" + ", ".join(literal(v) for v in row) + ")" for row in rows]
        for start, end in statement_batches(texts, self.capabilities.max_statement_rows, _MAX_STATEMENT_BYTES):
            self._run_insert(cur, schema, head + ", ".join(texts[start:end]), rows[start:end])

    def _run_insert(self, cur: Cursor, schema: TableSchema, sql: str, rows: list[Row]) -> None:
        try:
            cur.execute(sql)
        except pymysql.err.Error as exc:
            if _transient(exc):
                raise
            raise self._rejected(schema, rows, exc.args[1] if len(exc.args) > 1 else str(exc)) from exc
        self._check_warnings(cur, schema, rows)

    def _check_warnings(self, cur: Cursor, schema: TableSchema, rows: list[Row]) -> None:
        if not cur.warning_count:
            return
        cur.execute("SHOW WARNINGS")
        # Notes count too: a DECIMAL rounded to fewer digits is only a Note.
        problems = [str(msg) for _level, _code, msg in cur.fetchall()]
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise self._rejected(schema, rows, problems[0] + more)

    def _rejected(self, schema: TableSchema, rows: list[Row], message: str) -> TargetRejectedError:
        """Name the table, the column/row the server named, and the fix."""
        detail = ""
        m = re.search(r"at row (\d+)", message)
        if m and 0 < int(m.group(1)) <= len(rows):
            row = rows[int(m.group(1)) - 1]
            shown = tuple(row[i] for i in schema.key_indexes()) if schema.key else row
            detail = f"; the row {'with key ' if schema.key else ''}{short_sql(repr(shown))}"
        col = re.search(r"column '([^']+)'", message)
        target_type = ""
        if col:
            for i, c in enumerate(schema.columns):
                if c.name == col.group(1):
                    value = f", value {short_sql(repr(rows[int(m.group(1)) - 1][i]))}" if detail and m else ""
                    target_type = f" (source type {c.type}, mapped to {self.profile.target_type(c)}{value})"
        return TargetRejectedError(
            f"target table {schema.name} rejected a value: {message}{target_type}{detail}",
            hint="widen the column on the target (ALTER TABLE ... MODIFY) or fix the value on the source; "
                 "the flush was rolled back and will be retried from the same position")

    # ------------------------------------------------------------------
    # DDL
    # ------------------------------------------------------------------
    def apply_ddl(self, change: Change, state: AppliedState) -> None:
        sql = change.sql or ""
        position = f"{change.txn.file}:{change.txn.pos}"
        ops = self.ddl_ops(change)
        if ops is not None:
            for op in ops:
                ddl_ops.run(self, op, sql, change.commit_ts)
            self._ready.clear()
        with self._transaction(f"recording the state after DDL at {position}") as cur:
            self._write_state(cur, state)

    # ------------------------------------------------------------------
    # Reading back
    # ------------------------------------------------------------------
    def fetch_rows(self, database: str, table: str) -> list[Row]:
        with self._transaction(f"reading {database}.{table}") as cur:
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

    # Used by columnstore_ddl: a DDL statement in its own (auto-committed) step.
    def ddl_step(self, what: str, sql: str, hint: str | None = None) -> None:
        with self._transaction(what, hint) as cur:
            cur.execute(sql)

    def ping(self) -> None:
        self.query(lambda cur: cur.execute("SELECT 1"), "a health check (SELECT 1)")

    def query(self, fn: Callable[[Cursor], Any], what: str) -> Any:
        with self._transaction(what) as cur:
            return fn(cur)


def _transient(exc: pymysql.err.Error) -> bool:
    return isinstance(target_error(exc, ""), TargetUnavailableError)


