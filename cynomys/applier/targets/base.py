"""The Target interface every column store implements, and its registry.

Shared code talks to a target only through this interface; what differs
between targets is data on the class (``Capabilities``) or code inside the
target's own module, never ``if kind == ...`` elsewhere.

A flush is *one target transaction* holding the net deletes, the bulk insert
of final images, and the applier state (per producer: sequence high-water
mark and source position).  Replaying envelopes after a crash therefore
changes nothing: the state read back at start says what is already in.
"""
from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol, runtime_checkable

from cynomys.core.columnar import InsertRun
from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, TargetRejectedError

# AppliedState lives in core.model; re-exported for code that still imports it from here.
from cynomys.core.model import AppliedState as AppliedState
from cynomys.core.model import Change, ColumnDef, Op, Row, TableSchema, Value
from cynomys.core.targets import TARGETS
from cynomys.parser.ddl import SKIP_HINT, DdlOp, UnsupportedDdl, parse_ddl
from cynomys.verify.checksum import Checksum, KeyRange, range_checksum

log = logging.getLogger(__name__)


def short_sql(text: str, limit: int = 200) -> str:
    """A statement on one line, cut for messages."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class Capabilities:
    """What a target can do; read by shared code instead of branching on names."""

    transactional_ddl: bool = False      # DDL and the state update commit together
    max_statement_rows: int = 1000       # rows per multi-row INSERT / keys per DELETE
    supports_keys: bool = True           # primary keys can be declared
    # Adaptive delay commit: how many x [applier] buffer_rows one flush may
    # take while a backlog waits.  Worth it where a commit costs far more
    # than its rows (Iceberg), or where each flush leaves the target idle
    # while the applier folds the next (ColumnStore-on-MariaDB during an
    # initial load: bench/README.md, 2026-12-01); 1 elsewhere.
    backlog_factor: int = 1
    # ... and at least this many net changes, whatever buffer_rows is: a
    # small buffer_rows (latency on a quiet source) must not multiply a dear
    # commit while catching up (issue #11: buffer_rows 2000 on Spark).
    backlog_rows: int = 0
    # The target loads ``TableFlush.runs`` (InsertRuns, column-wise) itself;
    # otherwise build_flush turns them into row images in ``inserts``.
    columnar_inserts: bool = False
    # ... a keyless table's runs too (a snapshot's read of it, a bulk
    # insert), when the flush deletes none of its rows: they are then
    # plain inserts of a multiset, with no key to upsert or fold on.
    # Otherwise their rows join the table's multiset (``delete_rows``).
    keyless_runs: bool = False
    # The target applies one source transaction in parts (``apply_part``,
    # ``commit_parts``, ``rollback_parts``), none of it visible before the
    # last: the applier then bounds its memory whatever a transaction's
    # size ([applier] max_memory_mb).  Without it a transaction is
    # buffered whole.
    applies_parts: bool = False


@dataclass
class TableFlush:
    """Net effect of a flush on one table.

    Keyed tables: ``delete_keys`` are primary-key tuples to remove, then
    ``inserts`` are final images to add (an update is delete + insert).
    Keyless tables: changes fold as a multiset of whole rows;
    ``delete_rows`` maps a row image to how many copies to remove.
    ``runs``: more final images to add, column-wise (core.columnar), for
    targets with ``Capabilities.columnar_inserts``.  A READ run (snapshot
    rows) is an upsert whose keys are *not* in ``delete_keys``: a target
    replaces by key where it can, else deletes ``read_keys()`` first (a
    key tuple per row is Python work a replacing target need not pay)."""

    schema: TableSchema
    delete_keys: list[tuple[Value, ...]] = field(default_factory=list)
    delete_rows: Counter[Row] = field(default_factory=Counter)
    inserts: list[Row] = field(default_factory=list)
    runs: list[InsertRun] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return (len(self.delete_keys) + sum(self.delete_rows.values()) + len(self.inserts)
                + sum(r.rows for r in self.runs))

    def read_keys(self) -> list[tuple[Value, ...]]:
        """Primary-key values of the READ runs' rows (snapshot upserts)."""
        return [k for run in self.runs if run.op is Op.READ for k in run_keys(run)]

    def insert_keys(self) -> list[tuple[Value, ...]]:
        """Primary-key values of every row to insert (``inserts``, then ``runs``)."""
        idx = self.schema.key_indexes()
        keys = [tuple(r[i] for i in idx) for r in self.inserts]
        for run in self.runs:
            keys += run_keys(run)
        return keys

    def all_inserts(self) -> list[Row]:
        """Every row to insert as a row image (``inserts``, then the runs')."""
        return self.inserts + [row for run in self.runs for row in run.images()]


@dataclass
class Flush:
    tables: list[TableFlush]
    state: AppliedState


def unify_shapes(changes: list[Change]) -> list[Change]:
    """``changes`` with one schema per table: where a table comes in more
    than one shape (sources merged into one table by [shape] routes, at
    different schema versions: an ALTER runs shard by shard), the union of
    their columns by name, in first-seen order (a column's last definition
    wins), each image given NULL for the columns its source lacks -- as an
    insert naming only its columns would.  The key must be the same."""
    shapes: dict[tuple[str, str], list[TableSchema]] = {}
    for c in changes:
        if c.schema is None:
            continue
        seen = shapes.setdefault((c.database, c.table), [])
        if not any(s is c.schema or s == c.schema for s in seen):
            seen.append(c.schema)
    mixed = {ident: seen for ident, seen in shapes.items() if len(seen) > 1}
    if not mixed:
        return changes
    unions: dict[tuple[str, str], TableSchema] = {}
    for ident, seen in mixed.items():
        cols: dict[str, ColumnDef] = {}
        for s in seen:
            if tuple(k.lower() for k in s.key) != tuple(k.lower() for k in seen[0].key):
                raise ValueError(f"table {s.name} changed its key inside one flush")
            for col in s.columns:
                cols[col.name.lower()] = col
        unions[ident] = TableSchema(ident[0], ident[1], tuple(cols.values()), seen[0].key,
                                    next((s.indexes for s in seen if s.indexes), ()))
    maps: dict[int, Callable[[Row | None], Row | None]] = {}
    out: list[Change] = []
    for c in changes:
        union = unions.get((c.database, c.table))
        if union is None or c.schema is None or c.schema == union:
            out.append(c)
            continue
        fn = maps.get(id(c.schema))
        if fn is None:
            where = {n.lower(): i for i, n in enumerate(c.schema.column_names)}
            picks = [where.get(n.lower()) for n in union.column_names]
            fn = maps[id(c.schema)] = lambda r, picks=picks: None if r is None else tuple(  # type: ignore[misc]
                None if i is None else r[i] for i in picks)
        for one in (c.as_changes() if type(c) is InsertRun else [c]):
            out.append(Change(one.op, one.database, one.table, one.tid, one.txn, one.commit_ts, union,
                              fn(one.before), fn(one.after), one.sql))
    return out


def build_flush(changes: list[Change], state: AppliedState, columnar: bool = False,
                keyless_runs: bool = False) -> Flush:
    """Net row changes (already folded per key) -> per-table deletes/inserts.
    ``columnar``: keep InsertRuns column-wise in ``TableFlush.runs`` (the
    target's ``Capabilities.columnar_inserts``), else as row images;
    ``keyless_runs``: a keyless table's too, unless the flush deletes rows
    of it (``Capabilities.keyless_runs``).  A table in several shapes is
    written in their union (``unify_shapes``)."""
    try:
        return _build_flush(changes, state, columnar, columnar and keyless_runs)
    except _MixedShapes:
        return _build_flush(unify_shapes(changes), state, columnar, columnar and keyless_runs)


class _MixedShapes(Exception):
    """A table comes in more than one shape: unify them first (the rare case)."""


def _build_flush(changes: list[Change], state: AppliedState, columnar: bool, keyless_runs: bool) -> Flush:
    by_table: dict[tuple[str, str], TableFlush] = {}
    keyless: dict[tuple[str, str], Counter[Row]] = {}
    keyless_deleted: set[tuple[str, str]] = set()  # keyless tables the flush deletes rows of
    runs_of_keyless: dict[tuple[str, str], list[InsertRun]] = {}
    for c in changes:
        if c.op is Op.DDL or c.schema is None:
            raise ValueError("build_flush takes row changes only")
        ident = (c.database, c.table)
        tf = by_table.get(ident)
        if tf is None or (tf.schema is not c.schema and tf.schema != c.schema):
            if tf is not None:
                raise _MixedShapes()
            tf = by_table[ident] = TableFlush(c.schema)
        if type(c) is InsertRun and not c.schema.key:  # a keyless table's inserts or snapshot read
            runs_of_keyless.setdefault(ident, []).append(c)
        elif type(c) is InsertRun:  # inserts of new keys, or snapshot reads
            if columnar:
                tf.runs.append(c)  # a READ run upserts: TableFlush.read_keys
            else:
                if c.op is Op.READ:
                    # READ is an upsert: the key's row the target may hold goes first.
                    tf.delete_keys.extend(run_keys(c))
                tf.inserts.extend(c.images())
        elif c.schema.key:
            idx = c.schema.key_indexes()
            if c.op is not Op.INSERT:  # UPDATE/DELETE remove the old key; READ is an upsert
                image = c.before if c.before is not None else c.after
                assert image is not None
                tf.delete_keys.append(tuple(image[i] for i in idx))
            if c.after is not None:
                tf.inserts.append(c.after)
        else:
            bag = keyless.setdefault(ident, Counter())
            if c.before is not None and c.op is not Op.READ:
                bag[c.before] -= 1
                keyless_deleted.add(ident)
            if c.after is not None:
                bag[c.after] += 1
    for ident, runs in runs_of_keyless.items():
        if keyless_runs and ident not in keyless_deleted:
            by_table[ident].runs.extend(runs)  # inserts of a multiset: nothing to net them against
        else:
            bag = keyless.setdefault(ident, Counter())
            for run in runs:
                bag.update(run.images())
    for ident, bag in keyless.items():
        tf = by_table[ident]
        for row, n in bag.items():
            if n < 0:
                tf.delete_rows[row] = -n
            elif n > 0:
                tf.inserts.extend([row] * n)
    return Flush(list(by_table.values()), state)


def run_keys(run: InsertRun) -> list[tuple[Value, ...]]:
    """The key of every row of ``run`` (without its excluded rows)."""
    keys = list(zip(*run.key_columns()))
    return [k for i, k in enumerate(keys) if i not in run.excluded] if run.excluded else keys


class Target(ABC):
    """A column store the applier loads."""

    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @abstractmethod
    def connect(self) -> None:
        """Open connections, create the state table if missing."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def applied(self, producer_id: str) -> AppliedState | None:
        """The state committed by the last flush for this producer."""

    def recover(self, producer_id: str) -> None:
        """At the applier's start, before ``applied``: finish what an applier
        of this producer left half-done between two commits it makes
        together (ColumnStore: side loads left prepared, columnstore/sidexa.py)."""

    @abstractmethod
    def apply(self, flush: Flush) -> None:
        """Apply one flush atomically with its state (one target transaction).
        Creates missing tables from their schema first."""

    def ping(self) -> None:
        """A cheap round trip proving the target answers (health checks);
        raises TargetUnavailableError when it does not.  The default reads
        the applier state; targets override it with something cheaper."""
        self.applied(self.cfg.producer.id)

    @property
    def where(self) -> str:
        """The target, for messages (targets name their server)."""
        return f"{self.cfg.target.kind} target"

    def ddl_ops(self, change: Change) -> list[DdlOp] | None:
        """The neutral operations of a source DDL statement, or None when
        ``[applier] skip_ddl`` names it (skipped on purpose, and logged)."""
        sql = change.sql or ""
        position = f"{change.txn.file}:{change.txn.pos}"
        norm = " ".join(sql.split())
        if any(s == position or " ".join(s.split()) == norm for s in self.cfg.applier.skip_ddl):
            log.warning("skipping DDL at %s on purpose ([applier] skip_ddl): %s", position, short_sql(sql))
            return None
        try:
            return parse_ddl(sql, change.database)
        except UnsupportedDdl as exc:
            raise TargetRejectedError(
                f"DDL at {position} cannot be applied to {self.where}: {short_sql(sql)!r}: {exc.reason}",
                hint=f"{SKIP_HINT} (e.g. skip_ddl = [\"{position}\"])") from exc

    @abstractmethod
    def apply_ddl(self, change: Change, state: AppliedState) -> None:
        """Run a source DDL statement translated to this target, then record
        ``state``.  Raises TargetRejectedError naming the statement and the
        reason when it cannot be translated."""

    @abstractmethod
    def table_exists(self, database: str, table: str) -> bool: ...

    def table_columns(self, database: str, table: str) -> tuple[ColumnDef, ...] | None:
        """A target table's columns, in order, as source columns (the source
        type the target keeps for each where it can tell, else its own type);
        None when the table does not exist.  Read by [shape] schema_changes
        "freeze" and "ignore_drops" (cynomys/applier/shaping.py), which fit
        rows to these columns (a column a row lacks is written NULL)."""
        raise TargetRejectedError(f"{self.where} cannot list the columns of {database}.{table}",
                                  hint='use another [shape] schema_changes than "freeze" for it')
    # -- one source transaction in parts (applier/spill.py) ---------------------
    # A transaction larger than the applier may buffer is applied in parts
    # as its fragments arrive, into one target transaction kept open (or,
    # where the target cannot keep one open across its jobs, staged where
    # no reader looks: Spark's branches).  Nothing of it is visible before
    # ``commit_parts``; a crash, ``close`` or ``rollback_parts`` leaves the
    # target as it was before the first part.  Each part's net changes are
    # folded within the part only, so a key changed in two parts is
    # deleted and inserted again by the later one: parts apply in order, on
    # top of each other.  Targets with ``Capabilities.applies_parts``
    # override all four.
    def apply_part(self, part: Flush) -> None:
        """Apply ``part`` into the open transaction (the first part opens
        it).  ``part.state`` names the producer; it is not recorded."""
        raise TargetRejectedError(f"{self.where} cannot apply a transaction in parts",
                                  hint="raise [applier] max_memory_mb to buffer the transaction whole")

    def commit_parts(self, flush: Flush) -> None:
        """Apply ``flush`` (the transaction's last part, and whole
        transactions after it) into the open transaction, record its state
        and make all of it visible at once (one commit)."""
        raise TargetRejectedError(f"{self.where} cannot apply a transaction in parts",
                                  hint="raise [applier] max_memory_mb to buffer the transaction whole")

    def rollback_parts(self) -> None:
        """Drop every part applied since the open transaction began (the
        producer sends the transaction again from its start)."""

    @property
    def commits_parts_alone(self) -> bool:
        """A transaction applied in parts commits as soon as its last
        fragment is in, with nothing after it in the same commit (ColumnStore:
        rows loaded beside it are not visible to later changes before then)."""
        return False

    @property
    def parts_open(self) -> bool:
        """Parts are applied and not yet committed or rolled back."""
        return False

    def housekeeping(self) -> dict[str, Any]:
        """What the target does to its tables on its own (Spark: maintenance
        settings and latest runs), for ``applier.json`` and ``cynomys
        status``; called after every flush, so it must be cheap."""
        return {}

    def visible_at(self) -> Mapping[str, float]:
        """Where a flush's tables become readable one by one (Spark/Iceberg:
        a commit per table, then the state), the moment (``time.time()``)
        each of the last flush's tables did, by "db.table"; {} when the
        whole flush became readable at once, at its commit.  Freshness
        counts a transaction readable when the last of its tables is."""
        return {}

    def after_commit(self) -> None:
        """Called once a flush is readable and counted (freshness, flush
        time): work the flush owes the target that readers need not wait
        for (Spark: maintenance of a table overdue for it).  Kept out of
        ``apply`` so the freshness metric is the moment rows became
        readable, not that moment plus a compaction."""

    def idle(self) -> None:
        """The applier has nothing buffered and nothing arrived: a moment
        for housekeeping off the critical path (Spark: table maintenance).
        Must be quick to return when there is nothing to do."""

    @abstractmethod
    def fetch_rows(self, database: str, table: str) -> list[Row]:
        """Every row, values in the Python domain of core.model (for checks)."""

    # -- `cynomys verify` (cynomys/verify/applier.py) ----------------------------
    # The defaults work on every target: the table read back and filtered in
    # Python.  Targets that can read or hash just the range in SQL override
    # them (targets/<kind>/verify.py).  A range is compared in byte order
    # (verify/checksum.py, "Key order"): so is ``KeyRange.contains`` here
    # (Python compares text by code points, the order of its UTF-8 bytes),
    # and the SQL of every override must be too, whatever collation a
    # target column has.
    def range_rows(self, schema: TableSchema, rng: KeyRange) -> list[Row]:
        """The rows of ``schema``'s table with their key in ``rng``, in the
        model's value domain and ``schema``'s column order."""
        if not self.table_exists(schema.database, schema.table):
            return []
        rows = self.fetch_rows(schema.database, schema.table)
        idx = schema.key_indexes()
        return rows if not idx else [r for r in rows if rng.contains(tuple(r[i] for i in idx))]

    def checksum_range(self, schema: TableSchema, rng: KeyRange) -> Checksum:
        """The canonical checksum (verify/checksum.py) of a key range."""
        return range_checksum(schema, rng, self.range_rows(schema, rng))

    def purge_into(self, flush: Flush, schema: TableSchema, rng: KeyRange) -> int:
        """Add to ``flush`` the deletion of every row the target holds in a
        key range (a table without a key: every row), before the flush's own
        inserts; returns how many rows that is.  Raises RepairRefused when
        the target cannot delete exactly those rows (``register_purge_check``)."""
        check = _PURGE_CHECKS.get(self.cfg.target.kind)
        if check is not None and schema.key:
            check(self, schema)
        rows = self.range_rows(schema, rng)
        tf = next((t for t in flush.tables if t.schema == schema), None)
        if tf is None:
            tf = TableFlush(schema)
            flush.tables.append(tf)
        idx = schema.key_indexes()
        if idx:
            tf.delete_keys.extend(tuple(r[i] for i in idx) for r in rows)
        else:
            tf.delete_rows.update(rows)
        return len(rows)


@runtime_checkable
class SqlConsole(Protocol):
    """A read-only SQL session on a target's data (``cynomys sql``): it
    writes nothing, not even the applier's state or warm-up tables."""

    def show_sql(self, statement: str, limit: int) -> None:
        """Run ``statement`` and print up to ``limit`` rows of its result."""

    def close(self) -> None:
        """Release the session."""


class SqlConsoles(Protocol):
    """A target class whose data ``cynomys sql`` can query without a client
    of its own (Spark/Iceberg: the session would otherwise have to be set up
    by hand).  Other targets have clients of their own.  Kept apart from
    ``Target`` (an ability of the class, not something every target does or
    ``PartitionTarget`` forwards)."""

    #: The engines ``cynomys sql --engine`` accepts; the first is the default.
    console_engines: ClassVar[tuple[str, ...]]

    @classmethod
    def open_console(cls, cfg: Config, engine: str) -> SqlConsole:
        """A read-only console on ``engine`` (one of ``console_engines``)."""


#: ``[target] kind`` -> a check run before a repair deletes a key range of a
#: keyed table: raises RepairRefused when the target would delete other rows
#: too (deleting a key matches every key its collation calls equal: 'a' and
#: 'A', 'a' and 'a ').  Registered by the target's own verify module
#: (targets/<kind>/verify.py), imported with the target class.
PurgeCheck = Callable[[Target, TableSchema], None]
_PURGE_CHECKS: dict[str, PurgeCheck] = {}


def register_purge_check(kind: str, check: PurgeCheck) -> None:
    _PURGE_CHECKS[kind] = check


_REGISTRY = TARGETS


def target_class(cfg: Config) -> type[Target]:
    """The class of the target named by ``[target] kind`` (its module
    imported: heavy drivers load only for the target in use)."""
    spec = _REGISTRY.get(cfg.target.kind)
    if spec is None:
        raise ConfigError(f"[target] kind = {cfg.target.kind!r} is unknown", hint="one of " + ", ".join(_REGISTRY))
    module, _, cls = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"[target] kind = {cfg.target.kind!r} needs a driver that is not installed: {exc}",
                          hint=f"pip install 'cynomys[{cfg.target.kind}]'") from None
    found: type[Target] = getattr(mod, cls)
    return found


def open_target(cfg: Config) -> Target:
    """The target named by ``[target] kind``, not connected yet."""
    return target_class(cfg)(cfg)
