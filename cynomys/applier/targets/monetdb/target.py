"""MonetDB target over pymonetdb.

Each source database becomes a MonetDB schema of the same name; each table
keeps its name and primary key; column types follow ``monetdb_types``
(MonetDB has no unsigned types, keeps each integer type's minimum as NULL,
has a 0-24h TIME, and no zero dates, so the mapping is a table of its own).

One flush is one MonetDB transaction: deletes by key (``IN`` lists of up to
1000 keys; composite keys through a temporary table and one semijoin),
keyless deletes (no DELETE ... LIMIT: count the copies, delete them all,
insert the surplus back; a flush's rows together, through a temporary
table), a bulk ``COPY n RECORDS INTO ... FROM STDIN`` of
the final images (or multi-row INSERTs with ``?bulk=insert``), the
column-wise runs' records by the same COPY (``runs.py``; streamed ``FROM
'...' ON CLIENT`` by the upload handler where the server has it), and the
applier state row.  A missing table is created just before, in a
transaction of its own.  A DDL statement and its state row commit together
(MonetDB DDL is transactional: ``transactional_ddl``), so a crash never
leaves the two apart; DDL operations still check the catalog first, so
applying one twice changes nothing.

Works with MonetDB 11.33 (Apr2019) and later: no MERGE, no IF [NOT] EXISTS,
no IS [NOT] DISTINCT FROM; existence is read from the catalog (sys.schemas,
sys.tables, sys.columns, sys.keys, sys.comments).  What differs between
releases (HUGEINT, microsecond timestamps, the NULL of REAL/DOUBLE, backslash
escapes in literals, JSON text, ALTER COLUMN type) is probed once per
connection into ``ServerFeatures``.  Tested against servers built from
source: 11.53.15 (Mar2025) and 11.45.17 (Sep2022-SP3).

MonetDB runs optimistic concurrency control: a transaction that conflicts
with another one fails (at the statement or at COMMIT); that is reported as
transient (TargetUnavailableError) and the flush is retried.

[target] url: ``monetdb://user:password@host:port/database`` (``monetdbs://``
for TLS), options ``bulk=copy|insert`` and ``integers=widen|native``.
"""
from __future__ import annotations

import logging
import re
import socket
import ssl
import uuid
from typing import Any, ClassVar, Mapping, Sequence
from urllib.parse import parse_qsl, unquote, urlsplit

import pymonetdb

from cynomys.applier.targets import state as applied_state
from cynomys.applier.targets.base import Capabilities, TableFlush
from cynomys.applier.targets.monetdb import ddl as monetdb_ddl
from cynomys.applier.targets.monetdb.ddl import TargetColumn
from cynomys.applier.targets.monetdb.types import (
    Codec,
    ServerFeatures,
    Unstorable,
    codec,
    comment_for,
    qualified,
    quote_ident,
    string_literal,
)
from cynomys.applier.targets.sql import SqlTarget
from cynomys.core.columnar import InsertRun
from cynomys.core.config import Config
from cynomys.core.dialect import MONETDB, Dialect
from cynomys.core.errors import ConfigError, TargetRejectedError
from cynomys.core.model import AppliedState, Change, ColumnDef, Row, TableSchema, Value

log = logging.getLogger(__name__)

Cursor = Any  # pymonetdb.sql.cursors.Cursor (untyped)

#: Words in a MonetDB error that mean "the server or the connection is gone
#: or busy, or another transaction won": retrying later may succeed.
TRANSIENT_MESSAGES = (
    "concurrency conflict",        # optimistic concurrency control lost at COMMIT (SQLSTATE 40000/40001)
    "transaction is aborted because of concurrency",
    "conflict with another transaction",  # ... or at the statement (11.41+: "Update failed due to conflict")
    "server closed connection",
    "not connected",
    "connection refused",
    "connection reset",
    "broken pipe",
    "timed out",
    "under maintenance",           # monetdbd: database being locked / started
    "starting up",
    "shutting down",
    "no more client slots",
    "too many clients",
)
_STATEMENT_BYTES = 4 * 1024 * 1024  # per multi-row INSERT
#: Keyless rows deleted together (``_delete_rows``): one temporary table,
#: a join and a semijoin however many rows it holds; the bound keeps that
#: table (and the server's hash of it) small beside a huge flush.
KEYLESS_DELETE_ROWS = 50_000


def _sqlstate(message: str) -> str:
    m = re.match(r"\s*([0-9A-Z]{5})!", message)
    return m.group(1) if m else ""


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return re.sub(r"^[0-9A-Z]{5}!", "", text)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying later may help (the marker TargetUnavailableError carries)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return False  # a certificate that does not verify stays so: fix the url
    if isinstance(exc, (OSError, socket.timeout, EOFError)):
        return True
    if isinstance(exc, pymonetdb.Error):
        text = str(exc).lower()
        return any(m in text for m in TRANSIENT_MESSAGES) or _sqlstate(str(exc)) == "40001"
    return False


class RecordUploader(pymonetdb.Uploader):
    """Serves the records of the one ``COPY ... FROM '<name>' ON CLIENT`` in
    flight on its connection, straight from Arrow's buffer (the request
    body of ``FROM STDIN`` would be a str built from a decoded copy), and
    nothing else: a request for another name is refused."""

    def __init__(self) -> None:
        self.name = ""
        self.data = memoryview(b"")

    def serve(self, name: str, data: memoryview) -> None:
        self.name, self.data = name, data

    def handle_upload(self, upload: Any, filename: str, text_mode: bool, skip_amount: int) -> None:
        if not self.name or filename != self.name or skip_amount:
            upload.send_error(f"cynomys serves no file {filename!r}")
            return
        data, self.name, self.data = self.data, "", memoryview(b"")
        upload.binary_writer().write(data)


class MonetDBTarget(SqlTarget):
    """MonetDB over pymonetdb; see the module docstring."""

    dialect: ClassVar[Dialect] = MONETDB

    capabilities: ClassVar[Capabilities] = Capabilities(
        transactional_ddl=True, max_statement_rows=1000, supports_keys=True, columnar_inserts=True,
        applies_parts=True)
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (pymonetdb.Error,)
    ddl_handlers = monetdb_ddl.HANDLERS
    unavailable_hint: ClassVar[str] = "check that the MonetDB server is running and reachable; Cynomys retries"
    case_sensitive_names: ClassVar[bool] = True
    placeholder: ClassVar[str] = ""  # literals: how strings are escaped depends on the server (ServerFeatures)
    #: The state table (targets/state.py).
    state_types: ClassVar[Mapping[str, str]] = {
        "producer_id": "VARCHAR(255) NOT NULL PRIMARY KEY", "seq": "BIGINT NOT NULL", "file": "VARCHAR(255) NOT NULL",
        "pos": "BIGINT NOT NULL", "gtid": "CLOB NOT NULL", "commit_ts": "BIGINT NOT NULL", "updated_at": "TIMESTAMP",
        "lineage": "CLOB"}
    state_grant_hint: ClassVar[str | None] = "grant the target user the right to create schemas"
    error_row_pattern: ClassVar[str] = r"line (\d+)"
    #: [target] url query options and their allowed values.
    #: bulk: COPY INTO ... FROM STDIN or multi-row INSERT; integers: signed
    #: integers one size wider (lossless) or at the source width (the type's
    #: minimum, MonetDB's NULL, refused).
    url_options: ClassVar[dict[str, tuple[str, ...]]] = {"bulk": ("copy", "insert"), "integers": ("widen", "native")}
    #: Rows per COPY INTO statement (bounds the request held in memory).
    copy_rows: ClassVar[int] = 20_000
    #: The name COPY ... ON CLIENT asks the upload handler for.
    copy_file: ClassVar[str] = "cynomys-records"
    #: Session-local temporary table that holds composite keys (or keyless
    #: rows) to delete.
    key_table: ClassVar[str] = "cynomys_delete_keys"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self._dsn, options = self._parse_url(cfg.target.url)
        self.use_copy = options.get("bulk", "copy") == "copy"
        self.native_integers = options.get("integers", "widen") == "native"
        self.features = ServerFeatures()
        # self.schemas gives fetch_rows the column order; types come from
        # column comments.
        self._codecs: dict[TableSchema, list[Codec]] = {}
        self._uploader = RecordUploader()

    # ------------------------------------------------------------------
    # Connection
    # ------------------------------------------------------------------
    @classmethod
    def _parse_url(cls, url: str) -> tuple[dict[str, Any], dict[str, str]]:
        """'monetdb://user:pass@host:port/database?bulk=insert' -> (connect kwargs, options)."""
        example = "monetdb://monetdb:monetdb@127.0.0.1:50000/demo"
        if not url:
            raise ConfigError("[target] url is empty", hint=f"set it to {example}")
        parts = urlsplit(url)
        if parts.scheme not in ("monetdb", "monetdbs"):
            raise ConfigError(f"[target] url scheme {parts.scheme!r} is not monetdb://", hint=f"write it as {example}")
        database = unquote(parts.path.lstrip("/"))
        if not database or "/" in database:
            raise ConfigError("[target] url names no MonetDB database", hint=f"end the url with the database: {example}")
        options = dict(parse_qsl(parts.query))
        for key, value in options.items():
            allowed = cls.url_options.get(key)
            if allowed is None:
                raise ConfigError(f"[target] url has an unknown option {key!r}",
                                  hint="known: " + ", ".join(f"{k}={'|'.join(v)}" for k, v in cls.url_options.items()))
            if value not in allowed:
                raise ConfigError(f"[target] url option {key}={value!r} is not one of {'|'.join(allowed)}")
        try:
            port = parts.port or 50000
        except ValueError:
            raise ConfigError("[target] url has a bad port", hint=f"write it as {example}") from None
        dsn: dict[str, Any] = {
            "database": database, "hostname": parts.hostname or "127.0.0.1", "port": port,
            "username": unquote(parts.username or "monetdb"), "password": unquote(parts.password or "monetdb"),
        }
        if parts.scheme == "monetdbs":
            dsn["tls"] = True
        return dsn, options

    @property
    def where(self) -> str:
        return f"MonetDB target {self._dsn['hostname']}:{self._dsn['port']}/{self._dsn['database']}"

    def _connect(self) -> Any:
        try:
            # timezone=0: the session runs in UTC, so TIMESTAMP WITH TIME
            # ZONE values are written and read as UTC instants.
            conn = pymonetdb.connect(**self._dsn, autocommit=False, timezone=0, connect_timeout=10,
                                     replysize="10000", maxprefetch="100000")
        except (pymonetdb.Error, OSError) as exc:
            raise self.target_error(exc, f"cannot connect to {self.where}",
                               hint="check [target] url (user, password, host, port, database)") from exc
        try:
            self.features = self._probe(conn)
        except (pymonetdb.Error, OSError) as exc:
            self._discard(conn)
            raise self.target_error(exc, f"cannot read the server's abilities on {self.where}") from exc
        self._codecs.clear()
        self._uploader = RecordUploader()
        conn.set_uploader(self._uploader)
        return conn

    def is_transient(self, exc: BaseException) -> bool:
        return is_transient(exc)

    def describe(self, exc: BaseException) -> str:
        return _message(exc) or type(exc).__name__

    def _probe(self, conn: Any) -> ServerFeatures:
        """What this server can do (see ServerFeatures); leaves nothing behind.
        A probe the server refuses takes the conservative answer."""
        cur = conn.cursor()
        try:
            def one(sql: str, default: Any) -> Any:
                try:
                    cur.execute(sql)
                    row = cur.fetchone()
                    return row[0] if row else default
                except pymonetdb.Error as exc:
                    if is_transient(exc):
                        raise
                    log.debug("probe %r refused: %s", sql, exc)
                    conn.rollback()
                    return default

            version = str(one("SELECT value FROM sys.environment WHERE name = 'monet_version'", None)
                          or one("SELECT value FROM sys.env() WHERE name = 'monet_version'", "unknown"))
            hugeint = bool(one("SELECT COUNT(*) FROM sys.types WHERE sqlname = 'hugeint'", 0))
            # Two backslashes: 3 characters where '...' reads escapes, else 4.
            backslash = one("SELECT LENGTH('a\\\\b')", 3) == 3
            micro = "123456" in str(one("SELECT CAST(TIMESTAMP '2000-01-01 00:00:00.123456' AS VARCHAR(40))", ""))
            float_nil = bool(one("SELECT CAST(-1.7976931348623157e308 AS DOUBLE) IS NULL", True))
            json_text = one("SELECT CAST(CAST('{\"a\": 1}' AS JSON) AS CLOB)", None) == '{"a": 1}'
            conn.rollback()
            alter = self._probe_alter_column(conn, cur)
            on_client = self._probe_copy_on_client(conn, cur)
        finally:
            cur.close()
        features = ServerFeatures(version, hugeint, micro, float_nil, backslash, json_text, alter, on_client)
        log.info("%s runs MonetDB %s: %s", self.where, version, features)
        return features

    @staticmethod
    def _probe_alter_column(conn: Any, cur: Cursor) -> bool:
        """Whether ALTER TABLE ... ALTER COLUMN c <type> works, tried in a
        throwaway schema inside a transaction that is rolled back."""
        probe = quote_ident("cynomys_probe_" + uuid.uuid4().hex[:12])
        try:
            cur.execute(f"CREATE SCHEMA {probe}")
            cur.execute(f'CREATE TABLE {probe}."t" ("c" INT)')
            cur.execute(f'INSERT INTO {probe}."t" VALUES (1)')
            cur.execute(f'ALTER TABLE {probe}."t" ALTER COLUMN "c" BIGINT')
            return True
        except pymonetdb.Error as exc:
            if is_transient(exc):
                raise
            log.debug("ALTER COLUMN <type> is not supported here: %s", exc)
            return False
        finally:
            conn.rollback()

    @staticmethod
    def _probe_copy_on_client(conn: Any, cur: Cursor) -> bool:
        """Whether COPY INTO ... ON CLIENT works: one record into a
        temporary table, in a transaction that is rolled back."""
        uploader = RecordUploader()
        conn.set_uploader(uploader)
        try:
            cur.execute('CREATE LOCAL TEMPORARY TABLE "cynomys_probe_copy" ("c" INT) ON COMMIT DROP')
            uploader.serve("cynomys-probe", memoryview(b"7\n"))
            cur.execute('COPY 1 RECORDS INTO "cynomys_probe_copy" FROM \'cynomys-probe\' ON CLIENT')
            cur.execute('SELECT "c" FROM "cynomys_probe_copy"')
            return bool(cur.fetchall() == [(7,)])
        except pymonetdb.Error as exc:
            if is_transient(exc):
                raise
            log.debug("COPY ... ON CLIENT is not supported here: %s", exc)
            return False
        finally:
            conn.set_uploader(None)
            conn.rollback()

    def connect_note(self) -> str:
        return f" (MonetDB {self.features.version})"

    def _create_state_table(self, cur: Cursor) -> None:
        # No IF [NOT] EXISTS before 11.35: the catalog says what is there.
        if self.schema_info(cur, self.state_namespace) is None:
            cur.execute(f"CREATE SCHEMA {quote_ident(self.state_namespace)}")
        if self.table_id(cur, self.state_namespace, self.state_table) is None:
            cur.execute(self.state_table_sql().replace(" IF NOT EXISTS", "", 1))
            return
        have = {c.name for c in self.target_columns(cur, self.state_namespace, self.state_table)}
        for col in applied_state.ADDED_LATER:
            if col not in have:
                cur.execute(f"ALTER TABLE {self._state_name()} ADD COLUMN {col} {self.state_types[col]}")

    # ------------------------------------------------------------------
    # Catalog
    # ------------------------------------------------------------------
    def lit(self, text: str) -> str:
        """A string literal for this server."""
        return string_literal(text, self.features)

    def schema_info(self, cur: Cursor, schema: str) -> tuple[int, bool] | None:
        """(id, is a system schema) of a schema, None when missing."""
        cur.execute(f"SELECT id, system FROM sys.schemas WHERE name = {self.lit(schema)}")
        row = cur.fetchone()
        return None if row is None else (int(row[0]), bool(row[1]))

    def table_id(self, cur: Cursor, schema: str, table: str) -> int | None:
        cur.execute("SELECT t.id FROM sys.tables t JOIN sys.schemas s ON t.schema_id = s.id "
                    f"WHERE s.name = {self.lit(schema)} AND t.name = {self.lit(table)} AND t.query IS NULL")
        row = cur.fetchone()
        return None if row is None else int(row[0])

    def target_columns(self, cur: Cursor, schema: str, table: str) -> list[TargetColumn]:
        """The table's columns in catalog order; [] when the table is missing."""
        tid = self.table_id(cur, schema, table)
        if tid is None:
            return []
        cur.execute('SELECT c.name, c.type, c.type_digits, c.type_scale, c."null", r.remark FROM sys.columns c '
                    f"LEFT JOIN sys.comments r ON r.id = c.id WHERE c.table_id = {tid} ORDER BY c.number")
        return [TargetColumn(str(n), str(t), int(d), int(s), bool(null), r) for n, t, d, s, null, r in cur.fetchall()]

    def primary_key(self, cur: Cursor, schema: str, table: str) -> tuple[str, tuple[str, ...]] | None:
        """(constraint name, columns) of the table's primary key, or None."""
        tid = self.table_id(cur, schema, table)
        if tid is None:
            return None
        # sys.keys.type 0 = PRIMARY KEY; sys.objects lists its columns by nr.
        cur.execute(f"SELECT k.name, o.name FROM sys.keys k JOIN sys.objects o ON o.id = k.id "
                    f"WHERE k.table_id = {tid} AND k.type = 0 ORDER BY o.nr")
        rows = cur.fetchall()
        return (str(rows[0][0]), tuple(str(r[1]) for r in rows)) if rows else None

    def table_exists(self, database: str, table: str) -> bool:
        with self.transaction(f"looking up {database}.{table}") as cur:
            return self.table_id(cur, database, table) is not None

    def table_columns(self, database: str, table: str) -> tuple[ColumnDef, ...] | None:
        with self.transaction(f"looking up the columns of {database}.{table}") as cur:
            have = self.target_columns(cur, database, table)
        return tuple(ColumnDef(c.name, c.source_type, c.nullable) for c in have) or None

    def check_schema(self, cur: Cursor, database: str) -> None:
        """Refuse a source database that would land on Cynomys' state schema
        or one of MonetDB's own schemas (sys, tmp, json, ...)."""
        self.check_database(database)
        info = self.schema_info(cur, database)
        if info is not None and info[1]:
            raise TargetRejectedError(f"the source database {database!r} has the name of a MonetDB system schema",
                                      hint="exclude it in [source] exclude_tables")

    def ensure_schema(self, cur: Cursor, database: str) -> None:
        self.check_schema(cur, database)
        if self.schema_info(cur, database) is None:
            cur.execute(f"CREATE SCHEMA {quote_ident(database)}")

    # ------------------------------------------------------------------
    # Tables
    # ------------------------------------------------------------------
    def codecs(self, schema: TableSchema) -> list[Codec]:
        got = self._codecs.get(schema)
        if got is None:
            try:
                got = [self.codec(c) for c in schema.columns]
            except TypeError as exc:
                raise TargetRejectedError(f"table {schema.name}: {exc}",
                                          hint="exclude the table in [source] exclude_tables") from exc
            self._codecs[schema] = got
        return got

    def codec(self, col: ColumnDef) -> Codec:
        """How a source column lives here (TypeError for an unknown type)."""
        return codec(col, self.features, self.native_integers)

    def column_sql(self, col: ColumnDef, key: Sequence[str] = ()) -> str:
        """A column definition: mapped type; NOT NULL only for key columns
        (rows come from the source, which enforced the rest)."""
        c = self.codec(col)
        in_key = col.name.lower() in {k.lower() for k in key}
        return f"{quote_ident(col.name)} {c.sql_type}" + (" NOT NULL" if in_key else "")

    def comment_sql(self, database: str, table: str, col: ColumnDef) -> str:
        return (f"COMMENT ON COLUMN {qualified(database, table)}.{quote_ident(col.name)} "
                f"IS {self.lit(comment_for(col))}")

    def create_table(self, cur: Cursor, database: str, table: str, columns: Sequence[ColumnDef],
                     key: Sequence[str]) -> None:
        try:
            defs = [self.column_sql(c, key) for c in columns]
        except TypeError as exc:
            raise TargetRejectedError(f"table {database}.{table}: {exc}",
                                      hint="exclude the table in [source] exclude_tables") from exc
        if key:
            defs.append("PRIMARY KEY (" + ", ".join(quote_ident(k) for k in key) + ")")
        cur.execute(f"CREATE TABLE {qualified(database, table)} (\n  " + ",\n  ".join(defs) + "\n)")
        for col in columns:
            cur.execute(self.comment_sql(database, table, col))
        log.info("created table %s.%s on %s", database, table, self.where)

    def add_column(self, cur: Cursor, database: str, table: str, col: ColumnDef) -> None:
        cur.execute(f"ALTER TABLE {qualified(database, table)} ADD COLUMN {self.column_sql(col)}")
        cur.execute(self.comment_sql(database, table, col))

    def _ensure_table(self, cur: Cursor, schema: TableSchema) -> None:
        """Create the table, or add columns the schema has and the target
        lacks (a DDL that was skipped or arrived late)."""
        ident = (schema.database, schema.table)
        self.ensure_schema(cur, schema.database)
        have = {c.name.lower() for c in self.target_columns(cur, *ident)}
        if not have:
            self.create_table(cur, schema.database, schema.table, schema.columns, schema.key)
        for col in schema.columns:
            if have and col.name.lower() not in have:
                self.add_column(cur, schema.database, schema.table, col)
                log.warning("added column %s.%s (%s): the target lacked it", schema.name, col.name, col.type)

    # ------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------
    def sql_literal(self, value: Any) -> str:
        return self.lit(value) if isinstance(value, str) else super().sql_literal(value)

    def _write_state(self, cur: Cursor, state: AppliedState) -> None:
        # No MERGE before 11.37 (and no upsert at all): UPDATE, then INSERT
        # when no row was there (a DELETE would conflict more often under
        # MonetDB's optimistic concurrency control).
        tbl = self._state_name()
        values = dict(zip(applied_state.FIELDS, map(self.sql_literal, applied_state.encode(state))))
        key = self.sql_literal(state.producer_id)
        cur.execute(f"UPDATE {tbl} SET " + ", ".join(f"{c} = {v}" for c, v in values.items())
                    + f", {applied_state.WRITTEN_AT} = {self.now_sql} WHERE {applied_state.KEY} = {key}")
        if cur.rowcount == 0:
            cur.execute(f"INSERT INTO {tbl} ({applied_state.KEY}, {', '.join(values)}, {applied_state.WRITTEN_AT}) "
                        f"VALUES ({key}, {', '.join(values.values())}, {self.now_sql})")

    # ------------------------------------------------------------------
    # Flush
    # ------------------------------------------------------------------
    def _prepare(self, schema: TableSchema) -> None:
        """Create a missing table (or add missing columns) in a transaction
        before the flush's: a table that matches the source schema is right
        whether or not the flush that needed it commits, and a rejected
        flush then leaves an empty table to look at, as on other targets."""
        ident = (schema.database, schema.table)
        if self._ready.get(ident) == schema:
            return
        with self.transaction(f"preparing table {schema.name}") as cur:
            self._ensure_table(cur, schema)
        self._ready[ident] = schema
        self.schemas[ident] = schema

    def _prepare_in(self, cur: Cursor, schema: TableSchema) -> bool:
        # A transaction kept open for parts would not see a table created
        # by another after it began: prepare it inside (DDL is transactional).
        self._ensure_table(cur, schema)
        self._ready[(schema.database, schema.table)] = schema
        self.schemas[(schema.database, schema.table)] = schema
        return True

    def _apply_table(self, cur: Cursor, tf: TableFlush) -> None:
        schema = tf.schema
        codecs = self.codecs(schema)
        # READ runs upsert: the rows the target may hold for their keys go first.
        self._delete_keys(cur, schema, codecs, list(dict.fromkeys(tf.delete_keys + tf.read_keys())))  # each key once
        inserts = list(tf.inserts)
        inserts.extend(self._delete_rows(cur, schema, codecs, tf.delete_rows))
        if inserts:
            if self.use_copy:
                self._copy(cur, schema, codecs, inserts)
            else:
                self._insert_rows(cur, schema, codecs, inserts)
        if tf.runs:
            # Column-wise (InsertRuns; READ runs' keys were deleted above).
            if self.use_copy:
                self._copy_runs(cur, schema, codecs, tf.runs)
            else:
                self._insert_rows(cur, schema, codecs, [r for run in tf.runs for r in run.images()])

    def _literal(self, schema: TableSchema, c: Codec, v: Value, row: Row | None = None) -> str:
        if v is None:
            return "NULL"
        try:
            return c.literal(v)
        except Unstorable as exc:
            raise self._unstorable(schema, c, v, exc, row) from None

    def _delete_keys(self, cur: Cursor, schema: TableSchema, codecs: list[Codec],
                     keys: Sequence[tuple[Value, ...]]) -> None:
        if not keys:
            return
        tbl = qualified(schema.database, schema.table)
        kc = [codecs[i] for i in schema.key_indexes()]
        cols = [quote_ident(k) for k in schema.key]
        if len(cols) == 1:
            step = self.capabilities.max_statement_rows
            for i in range(0, len(keys), step):
                chunk = keys[i:i + step]
                values = ", ".join(self._literal(schema, kc[0], k[0]) for k in chunk)
                self._execute(cur, f"DELETE FROM {tbl} WHERE {cols[0]} IN ({values})", schema)
            return
        # Composite keys: no row-value IN on old releases, and an OR of ANDs
        # costs MonetDB ~3 ms per key to plan.  The keys go into a temporary
        # table instead, and one semijoin deletes them (5000 keys: 16 ms).
        tmp = self._temporary(cur, schema, kc, list(keys))
        alias = quote_ident("cynomys_k")
        match = " AND ".join(f"{alias}.{col} = {quote_ident(schema.table)}.{col}" for col in cols)
        self._execute(cur, f"DELETE FROM {tbl} WHERE EXISTS (SELECT 1 FROM {tmp} AS {alias} WHERE {match})", schema)
        self._execute(cur, f"DROP TABLE {tmp}", schema)

    def _temporary(self, cur: Cursor, schema: TableSchema, codecs: list[Codec], rows: list[Row]) -> str:
        """``rows`` (of ``codecs``' columns) in the session's temporary
        table ``key_table``, loaded like a flush's rows; its qualified name.
        Dropped by the caller (a flush may need it again for another table)."""
        tmp = TableSchema("tmp", self.key_table, tuple(c.source for c in codecs), ())
        defs = ", ".join(f"{quote_ident(c.source.name)} {c.sql_type}" for c in codecs)
        self._execute(cur, f"CREATE LOCAL TEMPORARY TABLE {quote_ident(tmp.table)} ({defs}) ON COMMIT DROP", schema)
        if self.use_copy:
            self._copy(cur, tmp, codecs, rows)
        else:
            self._insert_rows(cur, tmp, codecs, rows)
        return qualified(tmp.database, tmp.table)

    def _eq(self, schema: TableSchema, c: Codec, ident: str, v: Value) -> str:
        # '= literal' / 'IS NULL': IS NOT DISTINCT FROM is missing in old releases.
        return f"{ident} IS NULL" if v is None else f"{ident} = {self._literal(schema, c, v)}"

    def _delete_rows(self, cur: Cursor, schema: TableSchema, codecs: list[Codec], rows: Mapping[Row, int]) -> list[Row]:
        """Remove a flush's keyless rows (``rows``: a row image -> copies to
        remove); returns the copies to insert back.  Each row alone is two
        scans of the table (7.4 ms a row at 1M rows of 5 columns: 100
        updates a second of a keyless table kept a core busy), so the rows
        go together, ``KEYLESS_DELETE_ROWS`` at a time, through a temporary
        table (``_deleted_together``).  Rows holding NULL go alone: '='
        matches no NULL, and old releases lack IS NOT DISTINCT FROM."""
        together = [r for r in rows if None not in r]
        if len(together) < 2:  # one row alone costs no more, without a temporary table
            together = []
        alone = [r for r in rows if None in r] if together else list(rows)
        back: list[Row] = []
        for start in range(0, len(together), KEYLESS_DELETE_ROWS):
            back.extend(self._deleted_together(cur, schema, codecs, together[start:start + KEYLESS_DELETE_ROWS], rows))
        for row in alone:
            back.extend(self._delete_row(cur, schema, codecs, row, rows[row]))
        return back

    def _deleted_together(self, cur: Cursor, schema: TableSchema, codecs: list[Codec], batch: Sequence[Row],
                          wanted: Mapping[Row, int]) -> list[Row]:
        """What ``_delete_row`` does for each row of ``batch``, in four
        statements: the rows (numbered) into a temporary table, the copies
        the table holds of each counted by one join, every copy deleted by
        one semijoin; the surplus over ``wanted`` comes back to be inserted."""
        names = {c.name.lower() for c in schema.columns}
        number = next(n for n in (f"cynomys_row{i or ''}" for i in range(len(names) + 1)) if n not in names)
        tmp_tbl = self._temporary(cur, schema, codecs + [self.codec(ColumnDef(number, "int"))],
                                  [row + (i,) for i, row in enumerate(batch)])
        tbl, alias = qualified(schema.database, schema.table), quote_ident("cynomys_k")

        def match(table: str) -> str:
            return " AND ".join(f"{alias}.{quote_ident(c.name)} = {table}.{quote_ident(c.name)}"
                                for c in schema.columns)

        counted = quote_ident("cynomys_t")
        self._execute(cur, f"SELECT {alias}.{quote_ident(number)}, COUNT(*) FROM {tbl} AS {counted} "
                           f"JOIN {tmp_tbl} AS {alias} ON {match(counted)} GROUP BY {alias}.{quote_ident(number)}",
                      schema)
        present = {int(i): int(n) for i, n in cur.fetchall()}
        if present:
            self._execute(cur, f"DELETE FROM {tbl} WHERE EXISTS (SELECT 1 FROM {tmp_tbl} AS {alias} "
                               f"WHERE {match(quote_ident(schema.table))})", schema)
        self._execute(cur, f"DROP TABLE {tmp_tbl}", schema)
        return [batch[i] for i, n in present.items() for _ in range(max(n - wanted[batch[i]], 0))]

    def _delete_row(self, cur: Cursor, schema: TableSchema, codecs: list[Codec], row: Row, n: int) -> list[Row]:
        """Remove n copies of a whole row.  MonetDB has no DELETE ... LIMIT:
        count the copies, delete them all, and return the surplus to insert back."""
        tbl = qualified(schema.database, schema.table)
        where = " AND ".join(self._eq(schema, c, quote_ident(col.name), v)
                             for c, col, v in zip(codecs, schema.columns, row))
        cur.execute(f"SELECT COUNT(*) FROM {tbl} WHERE {where}")
        (present,) = cur.fetchone()
        if int(present):
            self._execute(cur, f"DELETE FROM {tbl} WHERE {where}", schema)
        return [row] * max(int(present) - n, 0)

    # -- bulk insert -------------------------------------------------------
    def _copy_into(self, schema: TableSchema, on_client: bool = False) -> str:
        """What follows 'COPY n' for ``schema``'s records from STDIN (the
        records follow), or ``on_client`` from the upload handler's file."""
        # The newline is written '\n': read as an escape by the scanner where
        # '...' reads escapes, and by the COPY code (GDKstrFromStr) in old
        # releases that kept literals raw; E'\n' where the server runs with
        # raw_strings.
        newline = "'\\n'" if self.features.literal_backslash else "E'\\n'"
        # The statement is put together by concatenation: names may hold
        # '{' and '}', so nothing after them may go through str.format.
        # The column list twice: the table's columns to fill, and the
        # records' own (without it MonetDB wants a field for every column of
        # the table, and rows narrower than it -- a column kept by [shape]
        # schema_changes, a DROP COLUMN skipped -- were refused).
        names = "(" + ", ".join(quote_ident(c) for c in schema.column_names) + ")"
        source = f"{self.lit(self.copy_file)} {names} ON CLIENT" if on_client else f"STDIN {names}"
        return (f" RECORDS INTO {qualified(schema.database, schema.table)} {names} FROM {source} "
                f"USING DELIMITERS '|', {newline}, '\"'" + ("" if on_client else ";\n"))

    def _copy(self, cur: Cursor, schema: TableSchema, codecs: list[Codec], rows: list[Row]) -> None:
        """COPY n RECORDS INTO ... FROM STDIN: the records follow the
        statement in the same request.  Fields end at '|', records at a
        newline, text is quoted with '"' (there is no default quote), NULL
        is the unquoted default marker null."""
        into = self._copy_into(schema)
        fields = [c.field for c in codecs]
        join = "|".join
        step = self.copy_rows
        for start in range(0, len(rows), step):
            chunk = rows[start:start + step]
            try:
                # Column by column with map(): the per-value work stays in
                # the codecs' fast paths (this loop is the applier's hot spot).
                columns = [list(map(f, col)) for f, col in zip(fields, zip(*chunk))]
            except Unstorable as exc:
                raise self._unstorable_in(schema, codecs, chunk, exc) from None
            self._run_copy(cur, schema, into, list(map(join, zip(*columns))), rows, start)

    def _run_copy(self, cur: Cursor, schema: TableSchema, into: str, lines: list[str], rows: list[Row],
                  start: int) -> None:
        try:
            cur.execute("COPY " + str(len(lines)) + into + "\n".join(lines) + "\n")
        except pymonetdb.Error as exc:
            if is_transient(exc):
                raise
            raise self.rejected(schema, rows[start:start + len(lines)], _message(exc)) from exc

    def _copy_runs(self, cur: Cursor, schema: TableSchema, codecs: list[Codec], runs: list[InsertRun]) -> None:
        """The runs' rows by the same COPY, their records written column-wise
        (monetdb/runs.py: pyarrow kernels, the codecs' checks on whole columns)."""
        from cynomys.applier.targets.arrow import buffer_of
        from cynomys.applier.targets.monetdb.runs import copy_lines

        into = self._copy_into(schema, on_client=self.features.copy_on_client)
        try:
            for n, lines in copy_lines(codecs, self.features, runs, self.copy_rows):
                self._run_copy_bytes(cur, schema, into, n, buffer_of(lines), runs)
        except Unstorable:
            # Name the row and column: the reference finds them.
            raise self._unstorable_in(schema, codecs, [r for run in runs for r in run.images()],
                                      Unstorable("a value cannot be stored", "")) from None

    def _run_copy_bytes(self, cur: Cursor, schema: TableSchema, into: str, n: int, data: memoryview,
                        runs: list[InsertRun]) -> None:
        try:
            if self.features.copy_on_client:
                # Measured on lineitem (200,000 rows, tests' box): 0.68-0.75 s
                # to load, against 0.76-0.95 s with the records in the request.
                self._uploader.serve(self.copy_file, data)
                cur.execute("COPY " + str(n) + into)
            else:
                cur.execute("COPY " + str(n) + into + bytes(data).decode("utf-8"))
        except pymonetdb.Error as exc:
            if is_transient(exc):
                raise
            raise self.rejected(schema, [r for run in runs for r in run.images()], _message(exc)) from exc

    def _insert_rows(self, cur: Cursor, schema: TableSchema, codecs: list[Codec], rows: list[Row]) -> None:
        head = (f"INSERT INTO {qualified(schema.database, schema.table)} ("
                + ", ".join(quote_ident(c) for c in schema.column_names) + ") VALUES ")
        texts = ["(" + ", ".join(self._literal(schema, c, v, row) for c, v in zip(codecs, row)) + ")" for row in rows]
        self._insert_values(cur, schema, head, texts, rows)

    # -- naming what was rejected -----------------------------------------
    def _unstorable(self, schema: TableSchema, c: Codec, v: Value, exc: Unstorable,
                    row: Row | None = None) -> TargetRejectedError:
        return TargetRejectedError(
            f"target table {schema.name} cannot store a value of column {c.source.name} (source type "
            f"{c.source.type}, MonetDB {c.sql_type}){self.row_detail(schema, row)}: {exc.reason}",
            hint=exc.hint + "; the flush was rolled back and will be retried from the same position")

    def _unstorable_in(self, schema: TableSchema, codecs: list[Codec], rows: list[Row],
                       exc: Unstorable) -> TargetRejectedError:
        for row in rows:  # find the row and column (encoding stopped at one)
            for c, v in zip(codecs, row):
                try:
                    c.field(v)
                except Unstorable as inner:
                    return self._unstorable(schema, c, v, inner, row)
        return TargetRejectedError(f"target table {schema.name} cannot store a value: {exc.reason}", hint=exc.hint)

    def describe_column(self, col: ColumnDef) -> str:
        try:
            return f"MonetDB {self.codec(col).sql_type}"
        except TypeError:
            return "none (unknown source type)"

    # ------------------------------------------------------------------
    # DDL
    # ------------------------------------------------------------------
    def ddl_run(self, change: Change, state: AppliedState, scope: Cursor | None) -> monetdb_ddl.Run:
        return monetdb_ddl.Run(self, change.sql or "", self.where, self.schemas, change.commit_ts, scope)

    def forget_caches(self) -> None:
        super().forget_caches()
        self._codecs.clear()

    # ------------------------------------------------------------------
    # Reading back
    # ------------------------------------------------------------------
    def fetch_rows(self, database: str, table: str) -> list[Row]:
        with self.transaction(f"reading {database}.{table}") as cur:
            have = self.target_columns(cur, database, table)
            if not have:
                raise TargetRejectedError(f"table {database}.{table} does not exist on {self.where}")
            # Each column decodes by the source type in its comment.  The
            # order is the source schema's when we know it with the same
            # columns (a type change by copy moves a column last), else the
            # catalog's.
            by_name = {c.name.lower(): c for c in have}
            known = self.schemas.get((database, table))
            if known is not None and sorted(c.lower() for c in known.column_names) == sorted(by_name):
                ordered = [by_name[n.lower()] for n in known.column_names]
            else:
                ordered = have
            codecs = [self.codec(ColumnDef(c.name, c.source_type, c.nullable)) for c in ordered]
            exprs = [c.select.format(c=quote_ident(t.name)) for c, t in zip(codecs, ordered)]
            cur.execute(f"SELECT {', '.join(exprs)} FROM {qualified(database, table)}")
            decoders = [c.decode for c in codecs]
            return [tuple(None if v is None else d(v) for d, v in zip(decoders, row)) for row in cur.fetchall()]
