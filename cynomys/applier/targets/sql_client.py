"""A SQL client over a DB-API driver: connection, transactions, errors, batches.

What every target reached through a DB-API driver (ColumnStore/MariaDB,
MonetDB, DuckDB) does the same way with its connection, and nothing about
tables, flushes, the applied state or DDL (targets/sql.py builds those on
it):

- the connection, kept between transactions or opened for each one
  (``hold_connection``), dropped when it fails;
- one transaction per unit of work (``transaction``): commit on success,
  roll back on failure, and the driver's error translated at this edge into
  TargetUnavailableError (transient: the server or connection is gone or
  busy, Cynomys retries) or TargetRejectedError (the server refused the
  work);
- a statement whose refusal the caller names (``execute``), and multi-row
  statements bounded by rows and bytes (``execute_batched``).

The client is a mixin: a driver's target supplies ``_connect`` and
``is_transient`` (and may refine ``describe``), and the ``where`` it names
itself by in messages.  Helpers of a target (its verify and DDL modules)
run their statements through ``transaction`` or ``query``.
"""
from __future__ import annotations

import contextlib
import logging
from abc import abstractmethod
from typing import Any, Callable, ClassVar, Iterator

from cynomys.core.errors import TargetRejectedError, TargetUnavailableError

log = logging.getLogger(__name__)

Cursor = Any  # DB-API cursors are untyped in the drivers used here


def statement_batches(texts: list[str], max_rows: int, max_bytes: int) -> list[tuple[int, int]]:
    """Split row literals into multi-row statements bounded by rows and bytes;
    (start, end) index ranges, so a rejected statement can name its rows."""
    out: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, text in enumerate(texts):
        if i > start and (i - start >= max_rows or size + len(text) > max_bytes):
            out.append((start, i))
            start, size = i, 0
        size += len(text)
    if start < len(texts):
        out.append((start, len(texts)))
    return out


class SqlClient:
    """One DB-API connection to a server and transactions on it (a mixin)."""

    #: Keep one connection between transactions.  False: open it for each
    #: transaction and close it after (DuckDB: one writing process per file,
    #: so the file must be free for readers between flushes).
    hold_connection: ClassVar[bool] = True
    #: The driver's exceptions; anything else passes through untranslated.
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    #: Upper bound of one multi-row statement.
    statement_bytes: ClassVar[int] = 4 * 1024 * 1024
    #: Statements that set up the connection of a transaction kept open
    #: across calls (``in_open``), before its first statement.
    open_session_sql: ClassVar[tuple[str, ...]] = ()
    #: What to do when the server is unreachable (said in transient errors).
    unavailable_hint: ClassVar[str] = "check that the target server is running and reachable; Cynomys retries"

    _conn: Any = None  # the connection held between transactions, if any
    #: The connection of the transaction kept open across calls (``in_open``),
    #: apart from ``_conn`` so that the client's other transactions (tables
    #: prepared, state read, health checks) never commit it early.
    _open_conn: Any = None

    @property
    @abstractmethod
    def where(self) -> str:
        """The server, for messages."""

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

    def _cursor(self, conn: Any) -> Cursor:
        """Where a transaction's statements go (DuckDB: the connection itself)."""
        return conn.cursor()

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
    def transaction(self, what: str, hint: str | None = None) -> Iterator[Cursor]:
        """One transaction: commit on success; roll back, translate the
        driver error and raise on failure.  ``what`` names the work in
        messages (the server is added)."""
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
            self._close_cursor(cur)
            if not self.hold_connection:
                self._discard(conn)

    def _close_cursor(self, cur: Cursor) -> None:
        with contextlib.suppress(*self.driver_errors, OSError):  # closing a cursor frees client memory only
            cur.close()

    # ------------------------------------------------------------------
    # A transaction kept open across calls (a source transaction applied
    # in parts: targets/base.py ``apply_part``)
    # ------------------------------------------------------------------
    @property
    def open_transaction(self) -> bool:
        return self._open_conn is not None

    def in_open(self, what: str, fn: Callable[[Cursor], Any], *, commit: bool = False) -> Any:
        """Run ``fn`` inside the transaction kept open on a connection of
        its own (the first call opens it), and commit it at the end when
        ``commit``.  A failure rolls all of it back, closes that
        connection and raises translated, like ``transaction``."""
        if self._open_conn is None:
            self._open_conn = self._connect()
            self.in_open(f"setting up the open transaction's session on {self.where}",
                         lambda cur: [cur.execute(sql) for sql in self.open_session_sql])
        conn = self._open_conn
        cur = self._cursor(conn)
        try:
            result = fn(cur)
            if commit:
                conn.commit()
        except BaseException as exc:
            self.rollback_open()
            if isinstance(exc, self.driver_errors + (OSError,)):
                raise self.target_error(exc, f"{what} on {self.where}") from exc
            raise
        finally:
            if cur is not conn:
                self._close_cursor(cur)
        if commit:
            self._drop_open()
        return result

    def rollback_open(self) -> None:
        """Roll the open transaction back and close its connection (the
        server rolls back on disconnect too, whatever happens here)."""
        conn = self._open_conn
        if conn is None:
            return
        try:
            conn.rollback()
        except self.driver_errors + (OSError,) as exc:
            log.warning("rollback of the open transaction on %s failed (%s); the server rolls back when the "
                        "connection drops", self.where, exc)
        self._drop_open()

    def _drop_open(self) -> None:
        conn, self._open_conn = self._open_conn, None
        if conn is not None:
            try:
                conn.close()
            except self.driver_errors + (OSError,) as exc:
                log.debug("closing the open transaction's connection to %s: %s", self.where, exc)

    def query(self, fn: Callable[[Cursor], Any], what: str, hint: str | None = None) -> Any:
        """Run ``fn`` in a transaction of its own (DDL steps, tests, tools)."""
        with self.transaction(what, hint) as cur:
            return fn(cur)

    def ping(self) -> None:
        """Health checks: one round trip on the connection transactions use."""
        self.query(lambda cur: cur.execute("SELECT 1"), "a health check (SELECT 1)")

    def close(self) -> None:
        self.rollback_open()  # a transaction applied in parts and never committed leaves nothing
        self._discard()

    # ------------------------------------------------------------------
    # Statements inside a transaction
    # ------------------------------------------------------------------
    def execute(self, cur: Cursor, sql: str, refused: Callable[[str], BaseException]) -> None:
        """Run one statement.  A refusal becomes ``refused(the server's
        message)``, which names what was refused; a transient error passes
        through for ``transaction`` to translate."""
        try:
            cur.execute(sql)
        except self.driver_errors as exc:
            if self.is_transient(exc):
                raise
            raise refused(self.describe(exc)) from exc

    def execute_batched(self, head: str, texts: list[str], max_rows: int,
                        run: Callable[[str, int, int], None]) -> None:
        """``head`` + the row literals ``texts`` as multi-row statements of
        at most ``max_rows`` rows and ``statement_bytes``: ``run(statement,
        start, end)`` for each, ``start:end`` being its rows."""
        for start, end in statement_batches(texts, max_rows, self.statement_bytes):
            run(head + ", ".join(texts[start:end]), start, end)
