"""The shared base of every target: the applied state and source DDL.

What SQL targets (targets/sql.py) and Spark (targets/spark/target.py) do
the same way, whatever their storage:

- the applied state's location (``state.NAMESPACE``/``state.TABLE``) and
  the refusal of a source database that would land on it;
- a source DDL statement: its neutral operations (``Target.ddl_ops``; a
  statement skipped on purpose runs none) go through the one DDL runner
  (targets/ddl_runner.py) with the target's handler table, then the state
  is recorded -- in the same transaction where the target's DDL is
  transactional (``Capabilities.transactional_ddl``), after it otherwise,
  each handler then checking the target first so that a replay after a
  crash between the two changes nothing;
- the source schemas remembered for reading rows back (``schemas``), kept
  in step by the DDL runner and restored when a transactional DDL fails;
- dropping what a target caches per table shape after any DDL.

A subclass says how to read and record the state (``applied``,
``record_state``), how to open the DDL's scope (``ddl_scope``: a
transaction's cursor, or None where each step commits on its own), and
gives its handlers' context (``ddl_run``).
"""
from __future__ import annotations

import contextlib
from abc import abstractmethod
from typing import Any, ClassVar, ContextManager

from cynomys.applier.targets import state as applied_state
from cynomys.applier.targets.base import Target, short_sql
from cynomys.applier.targets.ddl_runner import DdlRun, Handlers, run_ops
from cynomys.core.config import Config
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import AppliedState, Change, TableSchema
from cynomys.parser.ddl import SKIP_HINT


class StatefulTarget(Target):
    """A target that records the applied state and applies source DDL."""

    #: Where the applier state lives (schema/database/namespace, table).
    state_namespace: ClassVar[str] = applied_state.NAMESPACE
    state_table: ClassVar[str] = applied_state.TABLE
    #: DDL operation type -> handler (the target's ddl.py HANDLERS).
    ddl_handlers: ClassVar[Handlers] = {}
    #: Whether schema names differing only in case are different schemas
    #: (quoted names on MonetDB); elsewhere the state's name is refused in any case.
    case_sensitive_names: ClassVar[bool] = False

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        # Source schemas seen (flushes, DDL), for reading rows back with
        # their source type and order; kept in step by the DDL handlers.
        self.schemas: dict[tuple[str, str], TableSchema] = {}

    # ------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------
    @abstractmethod
    def record_state(self, state: AppliedState, scope: Any = None) -> None:
        """Record ``state``: inside ``scope`` (what ``ddl_scope`` yielded)
        when it is a transaction, else on its own."""

    def check_database(self, database: str) -> None:
        """Refuse a source database that would land on the state's namespace."""
        fold = (lambda n: n) if self.case_sensitive_names else str.lower
        if fold(database) == fold(self.state_namespace):
            raise TargetRejectedError(f"the source database {database!r} has the name of Cynomys' state database/schema",
                                      hint="exclude it in [source] exclude_tables")

    # ------------------------------------------------------------------
    # DDL
    # ------------------------------------------------------------------
    @abstractmethod
    def ddl_run(self, change: Change, state: AppliedState, scope: Any) -> DdlRun[Any]:
        """The per-statement context this target's handlers take; ``scope``
        is what ``ddl_scope`` yielded."""

    def ddl_scope(self, what: str, hint: str) -> ContextManager[Any]:
        """Where a DDL statement's operations run: a transaction (yielding
        its cursor) where the state commits with them, else None (each
        step commits on its own).  Errors leave it translated."""
        return contextlib.nullcontext()

    def forget_caches(self) -> None:
        """Hook: drop what the target caches per table shape (after DDL)."""

    def apply_ddl(self, change: Change, state: AppliedState) -> None:
        sql = change.sql or ""
        position = f"{change.txn.file}:{change.txn.pos}"
        ops = self.ddl_ops(change) or []  # None: skipped on purpose, only the state moves
        schemas_before = dict(self.schemas)
        try:
            with self.ddl_scope(f"DDL at {position}: {short_sql(sql)!r}",
                                "fix the target by hand, or " + SKIP_HINT) as scope:
                run_ops(self.ddl_handlers, self.ddl_run(change, state, scope), ops)
                if self.capabilities.transactional_ddl:
                    # The operations and the state commit together, or neither does.
                    self.record_state(state, scope)
            if not self.capabilities.transactional_ddl:
                self.record_state(state)
        except BaseException:
            if self.capabilities.transactional_ddl:
                self.schemas.clear()
                self.schemas.update(schemas_before)  # nothing of the statement stayed
            raise
        finally:
            self.forget_caches()
