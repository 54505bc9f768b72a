"""The one DDL runner: a source statement's neutral operations
(``cynomys.parser.ddl``) applied through a target's table of handlers.

A target's ``ddl.py`` holds only what differs: a ``DdlRun`` subclass that
knows how to read its catalog and run a statement, and ``HANDLERS``, one
function per operation type.  What every target does the same way lives
here: naming the statement in messages, skipping an ALTER of a table the
target does not have (the next flush creates it from the source schema),
the value ``ADD COLUMN`` gives existing rows, and keeping the remembered
source schemas in step.  Where the transaction goes is not decided here:
``StatefulTarget.apply_ddl`` (targets/stateful.py), shared by every
target, reads ``Capabilities.transactional_ddl``.
"""
from __future__ import annotations

import datetime
import logging
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import TableSchema, Value
from cynomys.parser import ddl

log = logging.getLogger(__name__)

#: Suffix of the helper column a type change by copy goes through.
TMP_SUFFIX = "__cynomys_tmp"

TargetT = TypeVar("TargetT")
Schemas = dict[tuple[str, str], TableSchema]


@dataclass
class DdlRun(Generic[TargetT]):
    """One source DDL statement being applied to ``target``.

    ``schemas`` is the target's memory of source schemas (for reading rows
    back with their source types and order), kept in step by the handlers."""

    target: TargetT
    sql: str
    where: str                       # the target, for messages
    schemas: Schemas = field(default_factory=dict)
    commit_ts: int = 0               # source time of the statement (DEFAULT CURRENT_TIMESTAMP fills)

    def what(self, action: str) -> str:
        text = " ".join(self.sql.split())
        return f"DDL {text[:200]!r}: {action}"

    def reject(self, action: str, reason: str, hint: str) -> TargetRejectedError:
        return TargetRejectedError(f"{self.what(action)} cannot be applied to {self.where}: {reason}", hint=hint)

    def skip_missing(self, database: str, table: str, action: str) -> None:
        log.warning("%s: table %s.%s is not on the target; skipped (its next flush creates it from the source "
                    "schema)", self.what(action), database, table)

    def fill_value(self, op: ddl.AddColumn) -> Value:
        """What the source gave the rows already there (no row events carry it)."""
        if not op.fill_now:
            return op.fill
        value = datetime.datetime.fromtimestamp(self.commit_ts, datetime.timezone.utc)
        if op.column.base_type != "timestamp":
            log.warning("%s: DEFAULT CURRENT_TIMESTAMP on a %s column filled with the statement time in UTC; "
                        "the source used its session time zone", self.what("add column"), op.column.type)
            return value.replace(tzinfo=None)
        return value

    def evolve(self, database: str, table: str, fn: Callable[[TableSchema], TableSchema | None]) -> None:
        """Apply ``fn`` to the remembered source schema of a table, if any."""
        known = self.schemas.get((database, table))
        if known is not None:
            new = fn(known)
            if new is None:
                self.schemas.pop((database, table), None)
            else:
                self.schemas[(database, table)] = new

    def rename_table_wanted(self, src: tuple[str, str], dst: tuple[str, str], old_there: bool, new_there: bool,
                            new_is_ours: Callable[[], bool] = lambda: False) -> bool:
        """Whether a table rename must run.  Done already (only the new name
        is there) or nothing to rename (neither is: the next flush creates
        it) is logged and False; both there is refused unless
        ``new_is_ours`` says the new one is this statement's own work."""
        if not old_there:
            if new_there:
                log.info("%s: already renamed to %s.%s", self.what("rename table"), *dst)
            else:
                self.skip_missing(src[0], src[1], "rename table")
            return False
        if new_there and not new_is_ours():
            raise self.reject("rename table", f"both {src[0]}.{src[1]} and {dst[0]}.{dst[1]} exist",
                              "drop the stale one on the target, or " + ddl.SKIP_HINT)
        return True

    def column_there(self, database: str, table: str, cols: Mapping[str, Any], name: str, action: str) -> bool:
        """Whether ``name`` is among the target's ``cols`` (lower-case keys);
        a missing table is logged and skipped."""
        if not cols:
            self.skip_missing(database, table, action)
            return False
        return name.lower() in cols

    def rename_column_wanted(self, database: str, table: str, cols: Mapping[str, Any], old: str, new: str) -> bool:
        """Whether a column rename must run (False when the table is missing
        or the rename is done already); both names there is refused."""
        if not self.column_there(database, table, cols, old, "rename column"):
            if cols:
                log.info("%s: no column %s on the target (already renamed?)", self.what("rename column"), old)
            return False
        if new.lower() in cols and new.lower() != old.lower():
            raise self.reject("rename column", f"both {old} and {new} exist in {database}.{table}",
                              "drop the stale column on the target, or " + ddl.SKIP_HINT)
        return True

    def add_column_wanted(self, database: str, table: str, cols: Mapping[str, Any], name: str) -> bool:
        """Whether ADD COLUMN must run: the table is there (else skipped and
        logged) and the column is not (a replay finds it)."""
        if not cols:
            self.skip_missing(database, table, "add column")
            return False
        return name.lower() not in cols

    def column_to_modify(self, database: str, table: str, cols: Mapping[str, Any], name: str) -> Any:
        """The target's entry for the column MODIFY COLUMN changes, or None
        when table or column is missing (skipped, logged)."""
        if not self.column_there(database, table, cols, name, "modify column"):
            if cols:
                log.warning("%s: column %s is not on the target; skipped", self.what("modify column"), name)
            return None
        return cols[name.lower()]

    # A target's Run supplies these two for the shared DROP TABLE handler.
    def check_database(self, database: str) -> None:
        raise NotImplementedError

    def drop_table(self, database: str, table: str) -> None:
        raise NotImplementedError

    def forget_database(self, database: str) -> None:
        for ident in [k for k in self.schemas if k[0] == database]:
            self.schemas.pop(ident)


Handler = Callable[[Any, Any], None]
Handlers = Mapping[type[ddl.DdlOp], Handler]


def drop_tables(r: DdlRun[Any], op: ddl.DropTable) -> None:
    """DROP TABLE, one table at a time: refuse Cynomys' or the target's own
    schemas, then the target's own statement (``Run.drop_table``)."""
    for db, t in op.tables:
        r.check_database(db)
        r.drop_table(db, t)


def noop(r: DdlRun[Any], op: ddl.NoOp) -> None:
    log.debug("%s: nothing to do on the target (%s)", r.what("no-op"), op.reason)


def no_index(r: DdlRun[Any], op: ddl.AddIndex) -> None:
    """An index: rows are found by the key, or by the target's own means
    (the default; a target that makes a keyless table's indexes overrides it)."""
    log.debug("%s: the target keeps no secondary indexes", r.what("add index"))


def missing_ops(handlers: Handlers) -> list[str]:
    """Operation types a handler table does not cover (empty when complete)."""
    return [op.__name__ for op in ddl.ALL_OPS if op not in handlers]


def handler_table(namespace: Mapping[str, Any]) -> dict[type[ddl.DdlOp], Handler]:
    """A ddl.py's handlers by name: ``_add_column`` runs ``AddColumn``
    (``NoOp`` defaults to ``noop``, ``AddIndex`` to ``no_index``).  Ops
    without a function are left out,
    which tests/unit/test_ddl_handlers.py reports."""
    table: dict[type[ddl.DdlOp], Handler] = {ddl.NoOp: noop, ddl.DropTable: drop_tables, ddl.AddIndex: no_index}
    for op in ddl.ALL_OPS:
        fn = namespace.get("_" + re.sub(r"(?<!^)(?=[A-Z])", "_", op.__name__).lower())
        if callable(fn):
            table[op] = fn
    return table


# -- what each operation does to the remembered source schemas --------------------
def _moved(schemas: Schemas, src: tuple[str, str], dst: tuple[str, str]) -> None:
    known = schemas.pop(src, None)
    if known is not None:
        schemas[dst] = replace(known, database=dst[0], table=dst[1])


def _has(s: TableSchema, name: str) -> bool:
    return name.lower() in {c.lower() for c in s.column_names}


def _remember_one(run: DdlRun[Any], op: ddl.DdlOp) -> None:
    schemas, ev = run.schemas, run.evolve
    if isinstance(op, ddl.CreateTable):
        schemas[(op.database, op.table)] = TableSchema(op.database, op.table, op.columns, op.key, op.indexes)
    elif isinstance(op, ddl.CreateTableLike):
        like = schemas.get((op.like_database, op.like_table))
        if like is not None:
            schemas[(op.database, op.table)] = replace(like, database=op.database, table=op.table)
    elif isinstance(op, ddl.DropTable):
        for ident in op.tables:
            schemas.pop(ident, None)
    elif isinstance(op, ddl.DropDatabase):
        run.forget_database(op.database)
    elif isinstance(op, ddl.RenameTable):
        for src, dst in op.pairs:
            _moved(schemas, src, dst)
    elif isinstance(op, ddl.AddColumn):
        ev(op.database, op.table, lambda s: s if _has(s, op.column.name) else replace(s, columns=s.columns + (op.column,)))
    elif isinstance(op, ddl.DropColumn):
        gone = op.column.lower()
        ev(op.database, op.table, lambda s: replace(s, columns=tuple(c for c in s.columns if c.name.lower() != gone),
                                                   key=tuple(k for k in s.key if k.lower() != gone)))
    elif isinstance(op, ddl.ModifyColumn):
        col = op.column
        ev(op.database, op.table, lambda s: replace(s, columns=tuple(
            replace(col, name=c.name) if c.name.lower() == col.name.lower() else c for c in s.columns)))
    elif isinstance(op, ddl.RenameColumn):
        old, new = op.old.lower(), op.new
        ev(op.database, op.table, lambda s: replace(
            s, columns=tuple(replace(c, name=new) if c.name.lower() == old else c for c in s.columns),
            key=tuple(new if k.lower() == old else k for k in s.key)))
    elif isinstance(op, ddl.AddPrimaryKey):
        ev(op.database, op.table, lambda s: replace(s, key=op.columns))
    elif isinstance(op, ddl.DropPrimaryKey):
        ev(op.database, op.table, lambda s: replace(s, key=()))


def run_ops(handlers: Handlers, run: DdlRun[Any], ops: Iterable[ddl.DdlOp]) -> None:
    """Apply each operation with its handler, then keep the remembered
    source schemas in step (the same for every target)."""
    for op in ops:
        handler = handlers.get(type(op))
        if handler is None:  # a new op type nobody taught this target: refuse, never ignore
            raise run.reject(type(op).__name__, "this target has no handler for the operation", ddl.SKIP_HINT)
        handler(run, op)
        _remember_one(run, op)
