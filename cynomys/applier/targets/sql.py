"""The shared base of targets spoken to in SQL (ColumnStore, MonetDB, DuckDB).

It joins the SQL client (targets/sql_client.py: connection, transactions,
error translation, statement batches) and the state/DDL base every target
shares (targets/stateful.py), and adds what only SQL targets do, driven by
class data:

- a flush: tables prepared first, each in a transaction of its own, then
  one transaction holding every table's deletes and inserts and the state
  row;
- the applied state as a row of ``cynomys_state.applied``: its columns are
  ``state.COLUMNS`` with this target's types (``state_types``), its values
  ``state.encode``'s;
- where a DDL statement's transaction goes (``Capabilities.transactional_ddl``);
- naming what a target rejected: the table, the column, the one value, and
  the key only when ``[target] show_keys`` asks for it.

A subclass supplies the driver (``_connect``, ``driver_errors``,
``is_transient``), its state types (and ``_write_state`` where a plain
DELETE + INSERT is not the best upsert), its flush (``_prepare``,
``_apply_table``) and its DDL (``ddl_handlers`` + ``ddl_run``).
"""
from __future__ import annotations

import logging
import re
import time
from abc import abstractmethod
from typing import Any, ClassVar, ContextManager, Mapping, Sequence

from cynomys.applier.targets import state as applied_state
from cynomys.applier.targets.base import Flush, TableFlush, short_sql
from cynomys.applier.targets.ddl_runner import DdlRun
from cynomys.applier.targets.sql_client import Cursor, SqlClient
from cynomys.applier.targets.stateful import StatefulTarget
from cynomys.core.config import Config
from cynomys.core.dialect import MONETDB, Dialect
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError
from cynomys.core.model import AppliedState, Change, ColumnDef, Row, TableSchema

log = logging.getLogger(__name__)


class SqlTarget(SqlClient, StatefulTarget):
    """A column store spoken to in SQL through a DB-API connection."""

    #: Finds the 1-based row a server error names, and the column it names.
    error_row_pattern: ClassVar[str] = r"(?:at row|line) (\d+)"
    error_column_pattern: ClassVar[str] = r"column '([^']+)'"
    #: How the target spells identifiers and literals (core/dialect.py).
    dialect: ClassVar[Dialect] = MONETDB
    #: A bound parameter in a statement ('%s', '?'); '' = values written as
    #: literals (``sql_literal``).
    placeholder: ClassVar[str] = "%s"
    #: The state table's column types: one for each of ``state.COLUMNS``.
    state_types: ClassVar[Mapping[str, str]] = {}
    #: After the state table's column list (ColumnStore: its engine).
    state_table_options: ClassVar[str] = ""
    #: What to do when the state table cannot be created.
    state_grant_hint: ClassVar[str | None] = None
    #: The time of a state write, in SQL.
    now_sql: ClassVar[str] = "CURRENT_TIMESTAMP"
    #: How a schema (the state's namespace) is created when missing.
    create_schema_sql: ClassVar[str] = "CREATE SCHEMA IF NOT EXISTS {}"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        # Tables known to match a schema (created, columns present); cleared by DDL.
        self._ready: dict[tuple[str, str], TableSchema] = {}
        # Tables made ready inside the transaction kept open for parts.
        self._in_parts: set[tuple[str, str]] = set()

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

    def ident(self, name: str) -> str:
        return self.dialect.ident(name)

    def table_name(self, database: str, table: str) -> str:
        return self.dialect.table(database, table)

    def sql_literal(self, value: Any) -> str:
        """A value as a literal in this target's SQL (where ``placeholder`` is '')."""
        return self.dialect.literal(value)

    def bind(self, values: Sequence[Any]) -> tuple[list[str], list[Any] | None]:
        """What stands for each value in a statement, and the parameters to
        pass with it (None where they are written as literals)."""
        if self.placeholder:
            return [self.placeholder] * len(values), list(values)
        return [self.sql_literal(v) for v in values], None

    # ------------------------------------------------------------------
    # The applied state: a row of cynomys_state.applied
    # ------------------------------------------------------------------
    def _state_name(self) -> str:
        return self.table_name(self.state_namespace, self.state_table)

    def state_table_sql(self) -> str:
        """CREATE TABLE of the state table (``state.COLUMNS``, this target's types)."""
        cols = ", ".join(f"{c} {self.state_types[c]}" for c in applied_state.COLUMNS)
        return f"CREATE TABLE IF NOT EXISTS {self._state_name()} ({cols}){self.state_table_options}"

    def _create_state_table(self, cur: Cursor) -> None:
        """Create the state table, or add the columns an older one lacks."""
        cur.execute(self.create_schema_sql.format(self.ident(self.state_namespace)))
        cur.execute(self.state_table_sql())
        for col in applied_state.ADDED_LATER:
            cur.execute(f"ALTER TABLE {self._state_name()} ADD COLUMN IF NOT EXISTS {col} {self.state_types[col]}")

    def connect_note(self) -> str:
        """What ``connect`` adds to its log line (an engine, a version)."""
        return ""

    def connect(self) -> None:
        with self.transaction("creating the state table", hint=self.state_grant_hint) as cur:
            self._create_state_table(cur)
        log.info("connected to %s%s", self.where, self.connect_note())

    def _read_state(self, cur: Cursor, producer_id: str) -> Sequence[Any] | None:
        """The stored values (``state.FIELDS``) of a producer, or None."""
        (mark,), params = self.bind([producer_id])
        cur.execute(f"SELECT {', '.join(applied_state.FIELDS)} FROM {self._state_name()} "
                    f"WHERE {applied_state.KEY} = {mark}", params)
        row = cur.fetchone()
        return None if row is None else tuple(row)

    def _write_state(self, cur: Cursor, state: AppliedState) -> None:
        """Replace the producer's state row (DELETE + INSERT, inside the
        caller's transaction)."""
        names = [applied_state.KEY, *applied_state.FIELDS]
        marks, params = self.bind([state.producer_id, *applied_state.encode(state)])
        tbl = self._state_name()
        cur.execute(f"DELETE FROM {tbl} WHERE {applied_state.KEY} = {marks[0]}", params[:1] if params else None)
        cur.execute(f"INSERT INTO {tbl} ({', '.join(names)}, {applied_state.WRITTEN_AT}) "
                    f"VALUES ({', '.join(marks)}, {self.now_sql})", params)

    def applied(self, producer_id: str) -> AppliedState | None:
        with self.transaction("reading the applier state") as cur:
            row = self._read_state(cur, producer_id)
        return None if row is None else applied_state.decode(producer_id, row)

    def record_state(self, state: AppliedState, scope: Any = None) -> None:
        if scope is not None:
            self._write_state(scope, state)
            return
        with self.transaction(f"recording the applier state at {state.position}") as cur:
            self._write_state(cur, state)

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

    def _apply_tables(self, cur: Cursor, flush: Flush) -> None:
        """Every table's changes, inside the flush's transaction, before its
        state (ColumnStore loads snapshot rows beside: columnstore/beside.py)."""
        for tf in flush.tables:
            self._apply_table(cur, tf)

    def apply(self, flush: Flush) -> None:
        t0 = time.monotonic()
        for tf in flush.tables:
            self._prepare(tf.schema)
        what = f"applying a flush of {len(flush.tables)} table(s) up to {flush.state.position}"
        try:
            with self.transaction(what) as cur:
                self._begin_flush(cur, flush.state)
                self._apply_tables(cur, flush)
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
        self.execute(cur, sql, lambda message: TargetRejectedError(
            f"table {schema.name} on {self.where}: target refused it ({message})",
            hint=f"check that {schema.name} on the target has the source's columns and types; "
                 "fix it with ALTER TABLE on the target"))

    def _insert_values(self, cur: Cursor, schema: TableSchema, head: str, texts: list[str], rows: list[Row]) -> None:
        """``head`` + row literals as multi-row INSERTs bounded by rows and bytes."""
        self.execute_batched(head, texts, self.capabilities.max_statement_rows,
                             lambda sql, start, end: self._run_rows(cur, schema, sql, rows[start:end]))

    def _run_rows(self, cur: Cursor, schema: TableSchema, sql: str, rows: list[Row]) -> None:
        """A statement that loads ``rows``; a refusal names table and column."""
        self.execute(cur, sql, lambda message: self.rejected(schema, rows, message))
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
    # DDL: the shared runner (stateful.py); the transaction goes where
    # the capabilities say
    # ------------------------------------------------------------------
    def ddl_scope(self, what: str, hint: str) -> ContextManager[Any]:
        if self.capabilities.transactional_ddl:
            return self.transaction(what, hint)
        return super().ddl_scope(what, hint)

    @abstractmethod
    def ddl_run(self, change: Change, state: AppliedState, scope: Cursor | None) -> DdlRun[Any]:
        """The per-statement context this target's handlers take; ``scope``
        is the open transaction's cursor when DDL is transactional."""

    def forget_caches(self) -> None:
        self._ready.clear()

    # ------------------------------------------------------------------
    # One source transaction in parts (targets/base.py ``apply_part``): one
    # driver transaction on a connection of its own, kept open from the
    # first part to ``commit_parts``
    # ------------------------------------------------------------------
    def _prepare_in(self, cur: Cursor, schema: TableSchema) -> bool:
        """Hook: make the table match ``schema`` inside the open
        transaction (``cur``), for targets whose DDL is transactional: a
        transaction does not see a table another one created after it
        began (MonetDB, DuckDB).  False: not done here; ``_prepare`` runs
        beside it (MariaDB, whose DDL commits on its own)."""
        return False

    def _part_tables(self, cur: Cursor, flush: Flush) -> None:
        for tf in flush.tables:
            ident = (tf.schema.database, tf.schema.table)
            if self._ready.get(ident) != tf.schema and self._prepare_in(cur, tf.schema):
                self._in_parts.add(ident)  # created or changed inside: gone again if the parts roll back
            self._apply_table(cur, tf)

    def _forget_parts(self, flush: Flush | None = None) -> None:
        for ident in self._in_parts | {(tf.schema.database, tf.schema.table) for tf in (flush.tables if flush else [])}:
            self._ready.pop(ident, None)
        self._in_parts = set()

    def apply_part(self, part: Flush) -> None:
        t0 = time.monotonic()
        if not self.capabilities.transactional_ddl:
            for tf in part.tables:
                self._prepare(tf.schema)
        first = not self.open_transaction
        if first:
            self._in_parts = set()

        def run(cur: Cursor) -> None:
            if first:
                self._begin_flush(cur, part.state)
            self._part_tables(cur, part)
        try:
            self.in_open(f"applying part of a source transaction ({len(part.tables)} table(s))", run)
        except BaseException:
            self._forget_parts(part)
            raise
        log.debug("applied a part of %d rows in %.3fs (transaction kept open)",
                  sum(tf.rows for tf in part.tables), time.monotonic() - t0)

    def commit_parts(self, flush: Flush) -> None:
        if not self.open_transaction:
            # Committing the last part alone would apply part of a transaction.
            raise TargetUnavailableError(f"the transaction applied in parts on {self.where} is gone (its "
                                         "connection was closed)", hint="the applier restarts and applies it again")
        if not self.capabilities.transactional_ddl:
            for tf in flush.tables:
                self._prepare(tf.schema)

        def run(cur: Cursor) -> None:
            self._part_tables(cur, flush)
            self._write_state(cur, flush.state)
        try:
            self.in_open(f"committing a source transaction applied in parts up to {flush.state.position}", run,
                         commit=True)
        except BaseException:
            self._forget_parts(flush)
            raise
        self._in_parts = set()

    def rollback_parts(self) -> None:
        self.rollback_open()
        self._forget_parts()

    @property
    def parts_open(self) -> bool:
        return self.open_transaction
