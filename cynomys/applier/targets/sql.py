"""The shared base of targets reached through a DB-API driver (ColumnStore,
MonetDB, DuckDB).

What every such target does the same way lives here, driven by class data:
the connection (kept between flushes, or opened per transaction when
``hold_connection`` is False), one transaction per unit of work with
rollback, error translation to transient/terminal at the edge, statement
batching of multi-row INSERTs, naming what a target rejected, and where a
DDL statement's transaction goes (``Capabilities.transactional_ddl``).

A subclass supplies the driver (``_connect``, ``driver_errors``,
``is_transient``), its state table (``applied``, ``_write_state``), its flush
(``apply``) and its DDL (``ddl_handlers`` + ``ddl_run``).
"""
from __future__ import annotations

import contextlib
import logging
import re
import time
from abc import abstractmethod
from typing import Any, Callable, ClassVar, Iterator, Sequence

from cynomys.applier.targets.base import AppliedState, Flush, TableFlush, Target, short_sql, statement_batches
from cynomys.applier.targets.ddl_runner import DdlRun, Handlers, run_ops
from cynomys.core.config import Config
from cynomys.core.dialect import MONETDB, Dialect
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError
from cynomys.core.model import Change, ColumnDef, Position, Row, TableSchema
from cynomys.parser.ddl import SKIP_HINT

log = logging.getLogger(__name__)

Cursor = Any  # DB-API cursors are untyped in the drivers used here


class SqlTarget(Target):
    """A column store spoken to in SQL through a DB-API connection."""

    #: Keep one connection between flushes.  False: open it for each
    #: transaction and close it after (DuckDB: one writing process per file,
    #: so the file must be free for readers between flushes).
    hold_connection: ClassVar[bool] = True
    #: The driver's exceptions; anything else passes through untranslated.
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    #: Upper bound of one multi-row INSERT statement.
    statement_bytes: ClassVar[int] = 4 * 1024 * 1024
    #: Where the applier state lives on the target (schema/database, table).
    state_schema: ClassVar[str] = "cynomys_state"
    state_table: ClassVar[str] = "applied"
    #: DDL operation type -> handler (the target's ddl.py HANDLERS).
    ddl_handlers: ClassVar[Handlers] = {}
    #: What to do when the target is unreachable (said in transient errors).
    unavailable_hint: ClassVar[str] = "check that the target server is running and reachable; Cynomys retries"
    #: Finds the 1-based row a server error names, and the column it names.
    error_row_pattern: ClassVar[str] = r"(?:at row|line) (\d+)"
    error_column_pattern: ClassVar[str] = r"column '([^']+)'"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self._conn: Any = None
        # Tables known to match a schema (created, columns present); cleared by DDL.
        self._ready: dict[tuple[str, str], TableSchema] = {}
        # Source schemas seen (flushes, DDL), for fetch_rows to give values
        # their source type and order; kept in step by the DDL handlers.
        self.schemas: dict[tuple[str, str], TableSchema] = {}

    @property
    def declares_keys(self) -> bool:
        """Whether tables get their primary key declared (``supports_keys``;
        a target whose answer depends on its settings overrides this)."""
        return self.capabilities.supports_keys

    def key_clause(self, key: Sequence[str]) -> str:
        """', PRIMARY KEY (...)' for CREATE TABLE, or '' where keys are not declared."""
        if not key or not self.declares_keys:
            return ""
        return ",\n  PRIMARY KEY (" + ", ".join(self.ident(k) for k in key) + ")"

    #: How the target spells identifiers and literals (core/dialect.py).
    dialect: ClassVar[Dialect] = MONETDB

    def ident(self, name: str) -> str:
        return self.dialect.ident(name)

    def table_name(self, database: str, table: str) -> str:
        return self.dialect.table(database, table)

    # ------------------------------------------------------------------
    # What a driver supplies
    # ------------------------------------------------------------------
    @abstractmethod
    def _connect(self) -> Any:
        """A new, set-up driver connection (autocommit off)."""

    @abstractmethod
    def is_transient(self, exc: BaseException) -> bool:
        """Whether retrying later may help."""

    def describe(self, exc: BaseException) -> str:
        """A driver error as text for messages."""
        return str(exc) or type(exc).__name__

    def target_error(self, exc: BaseException, what: str,
                     hint: str | None = None) -> TargetUnavailableError | TargetRejectedError:
        """A driver error -> TargetUnavailableError (transient) or TargetRejectedError."""
        if self.is_transient(exc):
            return TargetUnavailableError(f"{what}: target unavailable ({self.describe(exc)})",
                                          hint=self.unavailable_hint)
        return TargetRejectedError(f"{what}: target refused it ({self.describe(exc)})", hint=hint)

    # ------------------------------------------------------------------
    # Connection and transactions
    # ------------------------------------------------------------------
    def _open(self) -> Any:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _discard(self, conn: Any = None) -> None:
        """Drop a connection (failed, or done with); the next call opens a new one."""
        conn = conn or self._conn
        if conn is self._conn:
            self._conn = None
        if conn is not None:
            try:
                conn.close()
            except self.driver_errors + (OSError,) as exc:  # already broken; nothing more to release
                log.debug("closing a connection to %s: %s", self.where, exc)

    def _rollback(self, conn: Any) -> None:
        try:
            conn.rollback()
        except self.driver_errors + (OSError,) as exc:
            # The connection is gone: the server rolls back on disconnect.
            log.warning("rollback on %s failed (%s); the server rolls back when the connection drops",
                        self.where, exc)
            self._discard(conn)

    @contextlib.contextmanager
    def _transaction(self, what: str, hint: str | None = None) -> Iterator[Cursor]:
        """One target transaction: commit on success; roll back, translate
        the driver error and raise on failure."""
        conn = self._open()
        cur = self._cursor(conn)
        try:
            yield cur
            conn.commit()
        except BaseException as exc:
            self._rollback(conn)
            if isinstance(exc, self.driver_errors + (OSError,)):
                err = self.target_error(exc, f"{what} on {self.where}", hint)
                if isinstance(err, TargetUnavailableError):
                    self._discard(conn)
                raise err from exc
            raise
        finally:
            with contextlib.suppress(*self.driver_errors, OSError):  # closing a cursor frees client memory only
                cur.close()
            if not self.hold_connection:
                self._discard(conn)

    def _cursor(self, conn: Any) -> Cursor:
        """Where a transaction's statements go (DuckDB: the connection itself)."""
        return conn.cursor()

    def query(self, fn: Callable[[Cursor], Any], what: str, hint: str | None = None) -> Any:
        """Run ``fn`` in a transaction of its own (DDL steps, tests, tools)."""
        with self._transaction(what, hint) as cur:
            return fn(cur)

    def ping(self) -> None:
        """Health checks: one round trip on the connection flushes use."""
        self.query(lambda cur: cur.execute("SELECT 1"), "a health check (SELECT 1)")

    def close(self) -> None:
        self._discard()

    # ------------------------------------------------------------------
    # A flush: tables prepared first, then one transaction with the state
    # ------------------------------------------------------------------
    @abstractmethod
    def _prepare(self, schema: TableSchema) -> None:
        """Make the table match ``schema`` (create it, add missing columns),
        before and outside the flush's transaction: a table that matches the
        source is right whether or not the flush commits."""

    @abstractmethod
    def _apply_table(self, cur: Cursor, tf: TableFlush) -> None:
        """Deletes, then the bulk insert of one table's net changes."""

    def _begin_flush(self, cur: Cursor, state: AppliedState) -> None:
        """Hook: the flush transaction's first statement (ColumnStore locks the state row)."""

    def apply(self, flush: Flush) -> None:
        t0 = time.monotonic()
        for tf in flush.tables:
            self._prepare(tf.schema)
        what = f"applying a flush of {len(flush.tables)} table(s) up to {flush.state.position}"
        try:
            with self._transaction(what) as cur:
                self._begin_flush(cur, flush.state)
                for tf in flush.tables:
                    self._apply_table(cur, tf)
                self._write_state(cur, flush.state)
        except BaseException:
            # Look at the catalog again on the retry: the failure may be a
            # table dropped or changed behind our back, or a restored server.
            for tf in flush.tables:
                self._ready.pop((tf.schema.database, tf.schema.table), None)
            raise
        log.debug("%s: %d rows in %.3fs", what, sum(tf.rows for tf in flush.tables), time.monotonic() - t0)

    # ------------------------------------------------------------------
    # Statements that touch rows
    # ------------------------------------------------------------------
    def _execute(self, cur: Cursor, sql: str, schema: TableSchema) -> None:
        """A statement on a table; a refusal names the table and the fix."""
        try:
            cur.execute(sql)
        except self.driver_errors as exc:
            if self.is_transient(exc):
                raise
            raise TargetRejectedError(
                f"table {schema.name} on {self.where}: target refused it ({self.describe(exc)})",
                hint=f"check that {schema.name} on the target has the source's columns and types; "
                     "fix it with ALTER TABLE on the target") from exc

    def _insert_values(self, cur: Cursor, schema: TableSchema, head: str, texts: list[str], rows: list[Row]) -> None:
        """``head`` + row literals as multi-row INSERTs bounded by rows and bytes."""
        for start, end in statement_batches(texts, self.capabilities.max_statement_rows, self.statement_bytes):
            self._run_rows(cur, schema, head + ", ".join(texts[start:end]), rows[start:end])

    def _run_rows(self, cur: Cursor, schema: TableSchema, sql: str, rows: list[Row]) -> None:
        """A statement that loads ``rows``; a refusal names table and column."""
        try:
            cur.execute(sql)
        except self.driver_errors as exc:
            if self.is_transient(exc):
                raise
            raise self.rejected(schema, rows, self.describe(exc)) from exc
        self._check_loaded(cur, schema, rows)

    def _check_loaded(self, cur: Cursor, schema: TableSchema, rows: list[Row]) -> None:
        """Hook: look for problems a load reports without failing (warnings)."""

    # ------------------------------------------------------------------
    # Naming what was rejected
    # ------------------------------------------------------------------
    def describe_column(self, col: ColumnDef) -> str:
        """The column's type on this target, for messages."""
        return col.type

    def row_detail(self, schema: TableSchema, row: Row | None) -> str:
        """Which row, for messages: its key, and only when ``[target]
        show_keys`` asks for it.  Never a whole row: a keyless table's row is
        its data, and messages end up in logs."""
        if row is None or not schema.key or not self.cfg.target.show_keys:
            return ""
        key = tuple(row[i] for i in schema.key_indexes())
        return f" in the row with key {short_sql(repr(key))}"

    def rejected(self, schema: TableSchema, rows: list[Row], message: str,
                 column: ColumnDef | None = None) -> TargetRejectedError:
        """Name the table, the column (the server's message or ``column``),
        the key when asked, and the fix."""
        row: Row | None = None
        m = re.search(self.error_row_pattern, message)
        if m and 0 < int(m.group(1)) <= len(rows):
            row = rows[int(m.group(1)) - 1]
        if column is None:
            named = re.search(self.error_column_pattern, message)
            by_name = {c.name: c for c in schema.columns}
            if named and named.group(1) in by_name:
                column = by_name[named.group(1)]
            else:
                column = next((c for c in schema.columns
                               if re.search(r"\b" + re.escape(c.name) + r"\b", message)), None)
        where_col = ""
        if column is not None:
            # The one value refused is what the user must fix; the rest of
            # the row (a keyless table's whole row) is never shown.
            value = ""
            if row is not None:
                value = f", value {short_sql(repr(row[schema.columns.index(column)]), 80)}"
            where_col = (f" (column {column.name}: source type {column.type}, target type "
                         f"{self.describe_column(column)}{value})")
        return TargetRejectedError(
            f"target table {schema.name} rejected a value: {short_sql(message, 400)}{where_col}"
            f"{self.row_detail(schema, row)}",
            hint="a value too wide: widen the column on the target or fix the value on the source; a duplicate "
                 "key: the target holds a row the source does not (re-snapshot the table: `cynomys snapshot`); "
                 "the flush was rolled back and will be retried from the same position")

    # ------------------------------------------------------------------
    # DDL: one runner; the transaction goes where the capabilities say
    # ------------------------------------------------------------------
    @abstractmethod
    def ddl_run(self, sql: str, commit_ts: int, cur: Cursor | None) -> DdlRun[Any]:
        """The per-statement context this target's handlers take; ``cur``
        is the open transaction's cursor when DDL is transactional."""

    @abstractmethod
    def _write_state(self, cur: Cursor, state: AppliedState) -> None: ...

    def _state_name(self) -> str:
        return self.table_name(self.state_schema, self.state_table)

    @abstractmethod
    def _read_state(self, cur: Cursor, producer_id: str) -> tuple[Any, ...] | None:
        """(seq, file, pos, gtid, commit_ts, lineage) of a producer, or None."""

    #: The state table's column added after its first version: created by
    #: ``connect`` on a table that lacks it (AppliedState.lineage_json).
    LINEAGE_COLUMN: ClassVar[str] = "lineage"

    def applied(self, producer_id: str) -> AppliedState | None:
        with self._transaction("reading the applier state") as cur:
            row = self._read_state(cur, producer_id)
        if row is None:
            return None
        seq, file, pos, gtid, commit_ts, lineage = row
        return AppliedState(producer_id, int(seq), Position(str(file), int(pos), str(gtid or "")), int(commit_ts),
                            **AppliedState.lineage_of(lineage))

    def apply_ddl(self, change: Change, state: AppliedState) -> None:
        sql = change.sql or ""
        position = f"{change.txn.file}:{change.txn.pos}"
        ops = self.ddl_ops(change) or []  # None: skipped on purpose, only the state moves
        schemas_before = dict(self.schemas)
        try:
            if self.capabilities.transactional_ddl:
                # The operations and the state commit together, or neither does.
                with self._transaction(f"DDL at {position}: {short_sql(sql)!r}",
                                       hint="fix the target by hand, or " + SKIP_HINT) as cur:
                    run_ops(self.ddl_handlers, self.ddl_run(sql, change.commit_ts, cur), ops)
                    self._write_state(cur, state)
            else:
                # Each step commits on its own and checks the target first,
                # so replaying the statement after a crash before the state
                # write changes nothing.
                run_ops(self.ddl_handlers, self.ddl_run(sql, change.commit_ts, None), ops)
                with self._transaction(f"recording the state after DDL at {position}") as cur:
                    self._write_state(cur, state)
        except BaseException:
            if self.capabilities.transactional_ddl:
                self.schemas.clear()
                self.schemas.update(schemas_before)  # nothing of the statement stayed
            raise
        finally:
            self._ready.clear()
            self._forget_caches()

    def _forget_caches(self) -> None:
        """Hook: drop what a target caches per table shape (after DDL)."""
