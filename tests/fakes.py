"""In-memory fakes of the applier's surroundings: a target, a transport
subscriber and a source with its producer, for fast tests of exactly-once
delivery, fragments and admission without servers.

* ``FakeTarget`` implements ``Target`` (cynomys/applier/targets/base.py) on
  a ``FakeStore`` that outlives it, as a server outlives the applier: keyed
  tables are dicts by primary key, keyless ones multisets, and the applied
  state per producer commits in the same step as the data.  It is strict
  where a real target is: an INSERT of a key it holds raises
  TargetRejectedError (a wrongly admitted duplicate is caught, not
  overwritten), and so does deleting a keyless row it does not hold.  A
  crash is ``FakeStore.crash_at``: that commit raises ``Crash`` and keeps
  nothing.
* ``FakeStream`` is a Redis stream with the applier's consumer group;
  ``FakeSubscriber`` (its ``subscriber()``) implements ``Subscriber``
  (cynomys/transport/bus.py).  A new subscriber on the same stream is a
  restarted applier: it gets the entries read but not acknowledged first.
* ``FakeSource`` is a binlog of transactions with the tables they leave
  (the oracle: ``rows_at(position)``), and ``FakeProducer`` cuts it into
  batches the way cynomys/producer/batching.py does -- folded with the
  producer's rules, transactions larger than ``max_events`` cut into
  fragments, and the envelope meta (from/from_n, to/to_n, frag, after,
  incarnation, server) written from the same state -- so tests can replay,
  duplicate, reorder, lose and re-batch streams.  ``Wire`` seals batches
  into real envelopes (Avro, AES-GCM, RSA-OAEP, Ed25519) with keys made in
  memory, so the applier's own opener and codec run too.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import random
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from cynomys.applier.loop import Applier
from cynomys.applier.targets.base import Capabilities, Flush, TableFlush, Target
from cynomys.core.config import ApplierConfig, Config, ProducerConfig
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError
from cynomys.core.model import AppliedState, Batch, Change, ColumnDef, EnvelopeMeta, Op, Position, Row, TableSchema, Value
from cynomys.parser import ddl
from cynomys.reducer.fold import PRODUCER_RULES, Folder
from cynomys.schemas import codec
from cynomys.transport.bus import Delivery
from cynomys.transport.envelope import Opener, Sealer

PRODUCER = "p"
STREAM = "fake-stream"
SERVER = "server_id=1"
FILE = "binlog.000001"


class Crash(BaseException):
    """The process dies here: nothing after it runs (not an error the
    applier could catch and retry: a BaseException, like SystemExit)."""


# --------------------------------------------------------------------------
# The wire: real envelopes, keys made in memory
# --------------------------------------------------------------------------
@functools.cache
def _keys() -> tuple[rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey]:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048), ed25519.Ed25519PrivateKey.generate()


class Wire:
    """Seals batches as producer ``producer_id`` does and opens them as the
    applier does (one data key per Wire, like one producer process)."""

    def __init__(self, producer_id: str = PRODUCER, stream: str = STREAM) -> None:
        applier_key, producer_key = _keys()
        self.sealer = Sealer(producer_id, stream, applier_key.public_key(), producer_key,
                             rotate_envelopes=1000, rotate_seconds=3600.0)
        self.producer_id, self.stream = producer_id, stream

    def seal(self, seq: int, batch: Batch, fence: int = 0) -> bytes:
        return self.sealer.seal(codec.encode(batch), seq, fence)

    def opener(self) -> Opener:
        applier_key, producer_key = _keys()
        return Opener(applier_key, {self.producer_id: producer_key.public_key()}, self.stream)


# --------------------------------------------------------------------------
# The target
# --------------------------------------------------------------------------
@dataclass
class FakeTable:
    schema: TableSchema                                      # the target's columns (names, order) and key
    keyed: dict[tuple[Value, ...], Row] = field(default_factory=dict)
    bag: Counter[Row] = field(default_factory=Counter)       # keyless tables: row -> copies

    def rows(self) -> list[Row]:
        return list(self.keyed.values()) if self.schema.key else list(self.bag.elements())


@dataclass
class FakeStore:
    """What a target server keeps across applier restarts.  ``crash_at``:
    the number of the commit (flush or DDL, counted from 1 over the store's
    life) that dies instead of committing.  ``on_commit``: called after
    every commit (a test checks an invariant at each)."""

    tables: dict[tuple[str, str], FakeTable] = field(default_factory=dict)
    states: dict[str, AppliedState] = field(default_factory=dict)
    commits: int = 0
    crash_at: int | None = None
    # Parts of large transactions applied in open transactions (counted
    # over the store's life), and the number of the part that dies instead.
    parts: int = 0
    crash_at_part: int | None = None
    rollbacks: int = 0    # open transactions rolled back on purpose (rollback_parts)
    history: list[AppliedState] = field(default_factory=list)   # every state committed, in order
    on_commit: Callable[[FakeStore], None] | None = None

    def rows(self, database: str, table: str) -> list[Row]:
        t = self.tables.get((database, table))
        return t.rows() if t is not None else []

    def part(self) -> None:
        """A part applied into an open transaction (nothing visible)."""
        if self.crash_at_part is not None and self.parts + 1 == self.crash_at_part:
            self.crash_at_part = None
            raise Crash(f"part {self.parts + 1} dies inside the open target transaction")
        self.parts += 1

    def commit(self, tables: dict[tuple[str, str], FakeTable], state: AppliedState) -> None:
        """The end of one target transaction: all of it, or (a crash) none."""
        if self.crash_at is not None and self.commits + 1 == self.crash_at:
            self.crash_at = None
            raise Crash(f"target transaction {self.commits + 1} dies before its commit")
        self.tables = tables
        self.states = {**self.states, state.producer_id: state}
        self.commits += 1
        self.history.append(state)
        if self.on_commit is not None:
            self.on_commit(self)


def fake_config(state_dir: Path, producer_id: str = PRODUCER, **applier: Any) -> Config:
    """A config for an applier on the fakes: flushes as soon as the buffer
    is whole (``max_delay_ms`` 0), each committed in the loop
    (``overlap_commits`` off: with commits on the worker, where one flush
    ends follows thread timing, and tests that die at the k-th commit need
    the same commits in every run), unless ``applier`` says otherwise."""
    return Config(producer=ProducerConfig(id=producer_id),
                  applier=ApplierConfig(**{"state_dir": str(state_dir), "max_delay_ms": 0,
                                           "overlap_commits": False, **applier}))


class FakeTarget(Target):
    """A column store in memory (see the module docstring)."""

    capabilities = Capabilities(transactional_ddl=True, applies_parts=True)

    def __init__(self, cfg: Config, store: FakeStore | None = None, *, strict: bool = True) -> None:
        super().__init__(cfg)
        self.store = store if store is not None else FakeStore()
        self.strict = strict
        self.connected = False
        # The transaction kept open for parts: a private copy of the tables,
        # lost with the process (a crash) like a server's open transaction.
        self.open: dict[tuple[str, str], FakeTable] | None = None

    @property
    def where(self) -> str:
        return "the fake target"

    def connect(self) -> None:
        self.connected = True

    def close(self) -> None:
        self.connected = False
        self.open = None  # the server rolls back an open transaction when its connection drops

    def _check(self) -> None:
        if not self.connected:
            raise TargetUnavailableError(f"{self.where} is not connected")

    def applied(self, producer_id: str) -> AppliedState | None:
        self._check()
        return self.store.states.get(producer_id)

    def table_exists(self, database: str, table: str) -> bool:
        self._check()
        return (database, table) in self.store.tables

    def table_columns(self, database: str, table: str) -> tuple[ColumnDef, ...] | None:
        self._check()
        t = self.store.tables.get((database, table))
        return None if t is None else t.schema.columns

    def fetch_rows(self, database: str, table: str) -> list[Row]:
        self._check()
        return self.store.rows(database, table)

    # -- writes: on a copy, committed whole ------------------------------------
    def _copy(self) -> dict[tuple[str, str], FakeTable]:
        return copy.deepcopy(self.store.tables)

    def apply(self, flush: Flush) -> None:
        self._check()
        tables = self._copy()
        for tf in flush.tables:
            self._apply_table(tables, tf)
        self.store.commit(tables, flush.state)

    # -- a transaction in parts: one private copy until commit_parts ------------
    def apply_part(self, part: Flush) -> None:
        self._check()
        tables = self.open if self.open is not None else self._copy()
        for tf in part.tables:
            self._apply_table(tables, tf)
        self.store.part()
        self.open = tables

    def commit_parts(self, flush: Flush) -> None:
        self._check()
        assert self.open is not None, "commit_parts without parts"
        tables, self.open = self.open, None
        for tf in flush.tables:
            self._apply_table(tables, tf)
        self.store.commit(tables, flush.state)

    def rollback_parts(self) -> None:
        if self.open is not None:
            self.store.rollbacks += 1
        self.open = None

    @property
    def parts_open(self) -> bool:
        return self.open is not None

    def _apply_table(self, tables: dict[tuple[str, str], FakeTable], tf: TableFlush) -> None:
        s = tf.schema
        table = tables.get((s.database, s.table))
        if table is None:
            table = tables[(s.database, s.table)] = FakeTable(s)
        _add_missing_columns(table, s)
        names = table.schema.column_names
        src = s.column_names

        def shaped(row: Row) -> Row:  # the flush's column order -> the table's (absent: NULL)
            by_name = dict(zip(src, row))
            return tuple(by_name.get(n) for n in names)

        if table.schema.key:
            if s.key != table.schema.key:
                raise TargetRejectedError(f"{s.name}: the flush's key {s.key} is not the table's {table.schema.key}")
            for k in tf.delete_keys:
                table.keyed.pop(tuple(k), None)   # deleting an absent key deletes nothing, as in SQL
            idx = table.schema.key_indexes()
            for row in tf.all_inserts():
                r = shaped(row)
                k = tuple(r[i] for i in idx)
                if k in table.keyed:
                    raise TargetRejectedError(f"{s.name}: duplicate primary key {k} (the row is there already)",
                                              hint="a change was applied twice")
                table.keyed[k] = r
        else:
            for row, n in tf.delete_rows.items():
                r = shaped(row)
                if self.strict and table.bag[r] < n:
                    raise TargetRejectedError(f"{s.name}: {n} copies of a row to delete, {table.bag[r]} held",
                                              hint="a change was applied twice")
                table.bag[r] -= min(n, table.bag[r])
                if not table.bag[r]:
                    del table.bag[r]
            for row in tf.all_inserts():
                table.bag[shaped(row)] += 1

    def apply_ddl(self, change: Change, state: AppliedState) -> None:
        self._check()
        ops = self.ddl_ops(change)
        tables = self._copy()
        for op in ops or []:
            _DDL.get(type(op), _refuse)(tables, op)
        self.store.commit(tables, state)


def _add_missing_columns(table: FakeTable, schema: TableSchema) -> None:
    """Columns the flush has and the table lacks are added (schema drift:
    a skipped ADD COLUMN), NULL in the rows already there."""
    have = set(table.schema.column_names)
    extra = tuple(c for c in schema.columns if c.name not in have)
    if extra:
        _widen(table, extra, [None] * len(extra))


def _widen(table: FakeTable, columns: tuple[ColumnDef, ...], fill: list[Value]) -> None:
    table.schema = dataclasses.replace(table.schema, columns=table.schema.columns + columns)
    add = tuple(fill)
    table.keyed = {k: r + add for k, r in table.keyed.items()}
    table.bag = Counter({r + add: n for r, n in table.bag.items()})


Tables = dict[tuple[str, str], FakeTable]


def _refuse(tables: Tables, op: ddl.DdlOp) -> None:
    raise TargetRejectedError(f"the fake target does not run {type(op).__name__}",
                              hint="teach tests/fakes.py the operation")


def _create_table(tables: Tables, op: ddl.DdlOp) -> None:
    assert isinstance(op, ddl.CreateTable)
    tables.setdefault((op.database, op.table), FakeTable(TableSchema(op.database, op.table, op.columns, op.key)))


def _add_column(tables: Tables, op: ddl.DdlOp) -> None:
    assert isinstance(op, ddl.AddColumn)
    table = tables.get((op.database, op.table))
    if table is None or op.column.name in table.schema.column_names:
        return  # a table the target lacks (its next flush creates it), or a replay
    if op.fill_now:
        _refuse(tables, op)
    _widen(table, (op.column,), [op.fill])


def _drop_table(tables: Tables, op: ddl.DdlOp) -> None:
    assert isinstance(op, ddl.DropTable)
    for ref in op.tables:
        tables.pop((ref[0], ref[1]), None)


def _truncate(tables: Tables, op: ddl.DdlOp) -> None:
    assert isinstance(op, ddl.Truncate)
    table = tables.get((op.database, op.table))
    if table is not None:
        table.keyed, table.bag = {}, Counter()


def _nothing(tables: Tables, op: ddl.DdlOp) -> None:
    pass


_DDL: dict[type[ddl.DdlOp], Callable[[Tables, ddl.DdlOp], None]] = {
    ddl.NoOp: _nothing, ddl.CreateDatabase: _nothing, ddl.CreateTable: _create_table, ddl.AddColumn: _add_column,
    ddl.DropTable: _drop_table, ddl.Truncate: _truncate,
}


# --------------------------------------------------------------------------
# The transport
# --------------------------------------------------------------------------
class FakeStream:
    """A Redis stream and the applier's consumer group, in memory.

    ``crash_at_read``: the read (counted from 1 over the stream's life) that
    raises ``Crash`` instead of delivering -- the applier dies between two
    deliveries, whatever it has buffered."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, bytes]] = []
        self.cursor = 0                       # next entry never delivered to the group
        self.pending: dict[str, bytes] = {}   # delivered, not acknowledged (in entry order)
        self.acked: list[str] = []
        self.dead: list[tuple[str, str]] = []
        self.reads = 0
        self.counts: list[int] = []           # the count each read asked for
        self.crash_at_read: int | None = None

    def publish(self, envelope: bytes) -> str:
        entry_id = f"{len(self.entries) + 1}-0"
        self.entries.append((entry_id, envelope))
        return entry_id

    def subscriber(self, per_read: int | None = None) -> FakeSubscriber:
        """The subscriber of a (re)started applier."""
        return FakeSubscriber(self, per_read)

    def settled(self) -> bool:
        """Everything published was delivered and acknowledged."""
        return self.cursor == len(self.entries) and not self.pending


class FakeSubscriber:
    """``Subscriber`` on a FakeStream: first the entries this consumer had
    read but not acknowledged (redelivered), then new ones.  ``per_read``
    caps a read below the applier's ``count`` (smaller reads: more, smaller
    flushes).  Never blocks: an empty read returns at once, and a loop that
    keeps reading nothing is stopped (a test must not hang)."""

    MAX_EMPTY_READS = 10_000

    def __init__(self, stream: FakeStream, per_read: int | None = None) -> None:
        self.stream = stream
        self.per_read = per_read
        self.redeliver = list(stream.pending)
        self.empty_reads = 0
        self.closed = False

    def read(self, count: int, block_ms: int) -> list[Delivery]:
        s = self.stream
        s.reads += 1
        s.counts.append(count)
        if s.crash_at_read is not None and s.reads == s.crash_at_read:
            s.crash_at_read = None
            raise Crash(f"the applier dies at read {s.reads}")
        n = min(count, self.per_read or count)
        out: list[Delivery] = []
        while self.redeliver and len(out) < n:
            entry_id = self.redeliver.pop(0)
            if entry_id in s.pending:
                out.append(Delivery(entry_id, s.pending[entry_id], redelivered=True))
        while s.cursor < len(s.entries) and len(out) < n:
            entry_id, envelope = s.entries[s.cursor]
            s.cursor += 1
            s.pending[entry_id] = envelope
            out.append(Delivery(entry_id, envelope))
        self.empty_reads = 0 if out else self.empty_reads + 1
        if self.empty_reads > self.MAX_EMPTY_READS:
            raise AssertionError("the applier keeps reading an empty stream without finishing "
                                 f"({len(s.pending)} envelopes unacknowledged)")
        return out

    def ack(self, ids: Sequence[str]) -> None:
        for entry_id in ids:
            if self.stream.pending.pop(entry_id, None) is not None:
                self.stream.acked.append(entry_id)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.stream.dead.append((delivery.id, reason))
        self.ack([delivery.id])

    def close(self) -> None:
        self.closed = True


# --------------------------------------------------------------------------
# The source and the producer
# --------------------------------------------------------------------------
KEYED = TableSchema("d", "t", (ColumnDef("id", "int(11)", False), ColumnDef("v", "varchar(20)")), ("id",))
KEYLESS = TableSchema("d", "bag", (ColumnDef("a", "int(11)"), ColumnDef("s", "varchar(20)")), ())
EVENT = 100  # bytes of binlog one row event (or a commit) takes here


@dataclass(frozen=True)
class SourceTxn:
    tid: str
    begin: Position
    end: Position      # after its commit: where the next transaction begins
    commit_ts: int
    changes: tuple[Change, ...]

    def event_end(self, i: int) -> Position:
        """Where the event of change ``i`` ends (inside the transaction)."""
        return Position(self.begin.file, self.begin.pos + EVENT * (i + 1))


class TxnBuilder:
    """Changes of one source transaction; the source's tables follow each."""

    def __init__(self, source: FakeSource) -> None:
        self.source = source
        self.ops: list[tuple[Op, TableSchema, Row | None, Row | None, str | None]] = []

    def insert(self, schema: TableSchema, row: Row) -> None:
        self.ops.append((Op.INSERT, schema, None, row, None))
        self.source._apply(schema, None, row)

    def update(self, schema: TableSchema, before: Row, after: Row) -> None:
        self.ops.append((Op.UPDATE, schema, before, after, None))
        self.source._apply(schema, before, after)

    def delete(self, schema: TableSchema, before: Row) -> None:
        self.ops.append((Op.DELETE, schema, before, None, None))
        self.source._apply(schema, before, None)

    def ddl(self, schema: TableSchema, sql: str) -> None:
        """A statement (alone in its transaction, as on the source); the
        table's rows are kept, widened by the columns ``schema`` adds."""
        self.ops.append((Op.DDL, schema, None, None, sql))
        self.source._reshape(schema)


class FakeSource:
    """A binlog of transactions in one file of one server, and the tables
    they leave.  ``rows_at(position)`` is the oracle: the tables after every
    transaction that ends at or before ``position``, replayed from the
    changes (independently of the fold and the applier)."""

    def __init__(self, server: str = SERVER, file: str = FILE, start: int = 4, gtid_domain: str = "") -> None:
        self.server, self.file = server, file
        self.start = Position(file, start)
        self.gtid_domain = gtid_domain  # "0-1": transactions get GTIDs 0-1-N
        self.txns: list[SourceTxn] = []
        self._tables: dict[tuple[str, str], dict[Any, Any]] = {}
        self.reshapes: dict[str, TableSchema] = {}  # transaction id of a DDL -> the table's shape after it

    @property
    def end(self) -> Position:
        return self.txns[-1].end if self.txns else self.start

    @contextmanager
    def txn(self) -> Iterator[TxnBuilder]:
        b = TxnBuilder(self)
        yield b
        self._commit(b)

    def _commit(self, b: TxnBuilder) -> None:
        begin = self.end
        n = len(self.txns) + 1
        gtid = f"{self.gtid_domain}-{n}" if self.gtid_domain else ""
        tid = gtid or f"{begin.file}:{begin.pos}"
        txn_at = Position(begin.file, begin.pos)
        changes = tuple(Change(op, s.database, "" if op is Op.DDL else s.table, tid, txn_at, n,
                               None if op is Op.DDL else s, before, after, sql)
                        for op, s, before, after, sql in b.ops)
        end = Position(begin.file, begin.pos + EVENT * (len(changes) + 1), gtid)
        for op, s, *_ in b.ops:
            if op is Op.DDL:
                self.reshapes[tid] = s  # the oracle widens the rows there (rows_at)
        self.txns.append(SourceTxn(tid, Position(begin.file, begin.pos, begin.gtid), end, n, changes))

    def _apply(self, schema: TableSchema, before: Row | None, after: Row | None) -> None:
        _replay(self._tables, schema, before, after)

    def _reshape(self, schema: TableSchema) -> None:
        table = self._tables.get((schema.database, schema.table))
        if table is not None:
            table["schema"] = schema

    def rows(self, database: str, table: str) -> list[Row]:
        return self.rows_at(self.end).get((database, table), [])

    def rows_at(self, position: Position) -> dict[tuple[str, str], list[Row]]:
        """Every table as of ``position`` (a transaction boundary)."""
        tables: dict[tuple[str, str], dict[Any, Any]] = {}
        for t in self.txns:
            if t.end.sort_key() > position.sort_key():
                break
            for c in t.changes:
                if c.op is Op.DDL:
                    _reshape_rows(tables, self.reshapes.get(c.tid))
                    continue
                assert c.schema is not None
                _replay(tables, c.schema, c.before, c.after)
        return {ident: _table_rows(t) for ident, t in tables.items()}

    def index_at(self, position: Position) -> int:
        """The index of the first transaction at or after ``position``."""
        return next((i for i, t in enumerate(self.txns) if t.begin.sort_key() >= position.sort_key()), len(self.txns))


def _reshape_rows(tables: dict[tuple[str, str], dict[Any, Any]], schema: TableSchema | None) -> None:
    """A DDL that adds columns at the end: the rows there get NULL in them."""
    table = tables.get((schema.database, schema.table)) if schema is not None else None
    if schema is None or table is None:
        return
    pad = (None,) * (len(schema.columns) - len(table["schema"].columns))
    table["schema"] = schema
    table["keyed"] = {k: r + pad for k, r in table["keyed"].items()}
    table["bag"] = Counter({r + pad: n for r, n in table["bag"].items()})


def _replay(tables: dict[tuple[str, str], dict[Any, Any]], schema: TableSchema, before: Row | None,
            after: Row | None) -> None:
    table = tables.setdefault((schema.database, schema.table), {"schema": schema, "keyed": {}, "bag": Counter()})
    width = len(schema.columns)
    if schema.key:
        idx = schema.key_indexes()
        if before is not None:
            k = tuple(before[i] for i in idx)
            if k not in table["keyed"]:
                raise AssertionError(f"the source has no row {before} to change")
            del table["keyed"][k]
        if after is not None:
            k = tuple(after[i] for i in idx)
            if k in table["keyed"]:
                raise AssertionError(f"the source holds key {k} already")
            table["keyed"][k] = after
    else:
        if before is not None:
            if table["bag"][before] < 1:
                raise AssertionError(f"the source has no row {before} to change")
            table["bag"][before] -= 1
            if not table["bag"][before]:
                del table["bag"][before]
        if after is not None:
            table["bag"][after] += 1
    assert all(len(r) == width for r in ([before] if before else []) + ([after] if after else []))


def _table_rows(table: dict[str, Any]) -> list[Row]:
    return list(table["keyed"].values()) if table["schema"].key else list(table["bag"].elements())


def same_rows(got: list[Row], want: list[Row]) -> bool:
    """Equal as multisets (targets keep no row order)."""
    return Counter(got) == Counter(want)


def assert_target_at(store: FakeStore, source: FakeSource, producer_id: str = PRODUCER) -> AppliedState | None:
    """The store holds exactly the source's tables as of the position it
    records: every transaction up to it once, nothing after it."""
    state = store.states.get(producer_id)
    want = source.rows_at(state.position if state is not None else source.start)
    for ident in set(want) | set(store.tables):
        got = store.rows(*ident)
        if not same_rows(got, want.get(ident, [])):
            extra = Counter(got) - Counter(want.get(ident, []))
            missing = Counter(want.get(ident, [])) - Counter(got)
            raise AssertionError(f"{ident[0]}.{ident[1]} at {state.position if state else 'the start'}: "
                                 f"extra {sorted(extra.elements(), key=repr)}, "
                                 f"missing {sorted(missing.elements(), key=repr)}")
    return state


def random_workload(source: FakeSource, seed: int, txns: int = 30, *, big: int = 12, big_every: int = 7,
                    empty_every: int = 0) -> FakeSource:
    """``txns`` transactions of random inserts, updates (some changing the
    key) and deletes on a keyed and a keyless table; every ``big_every``-th
    holds ``big`` changes (cut into fragments by a small ``max_events``),
    every ``empty_every``-th none (nothing to ship, the checkpoint moves)."""
    rng = random.Random(seed)
    keys: dict[int, Row] = {}
    bag: list[Row] = []
    next_key = 1
    for n in range(1, txns + 1):
        size = 0 if empty_every and n % empty_every == 0 else big if n % big_every == 0 else rng.randint(1, 4)
        with source.txn() as t:
            for _ in range(size):
                roll = rng.random()
                if roll < 0.35 or not keys:
                    row: Row = (next_key, f"v{n}")
                    next_key += 1
                    t.insert(KEYED, row)
                    keys[int(row[0])] = row  # type: ignore[arg-type]
                elif roll < 0.55:
                    k = rng.choice(sorted(keys))
                    new = (k, f"u{n}-{rng.randint(0, 9)}") if rng.random() < 0.8 else (next_key, keys[k][1])
                    if new == keys[k]:
                        continue
                    if new[0] != k:
                        next_key += 1
                    t.update(KEYED, keys.pop(k), new)
                    keys[int(new[0])] = new  # type: ignore[arg-type]
                elif roll < 0.65:
                    k = rng.choice(sorted(keys))
                    t.delete(KEYED, keys.pop(k))
                elif roll < 0.85 or not bag:
                    row = (rng.randint(1, 3), rng.choice(["x", "y"]))  # duplicates on purpose
                    t.insert(KEYLESS, row)
                    bag.append(row)
                elif roll < 0.93:
                    t.delete(KEYLESS, bag.pop(rng.randrange(len(bag))))
                else:
                    i = rng.randrange(len(bag))
                    new = (rng.randint(1, 3), "z")
                    t.update(KEYLESS, bag[i], new)
                    bag[i] = new
    return source


@dataclass(frozen=True)
class OpenTxn:
    """A transaction partly shipped (the producer state's ``open``)."""

    index: int       # in FakeSource.txns
    shipped: int     # its changes in envelopes already
    frag: int        # the next fragment's number


@dataclass(frozen=True)
class ProducerState:
    """What the producer keeps (producer/state.py): the last envelope
    number, where to resume, the transaction partly shipped."""

    seq: int = 0
    checkpoint: Position | None = None
    open: OpenTxn | None = None
    incarnation: str = "i1"


@dataclass(frozen=True)
class Sent:
    seq: int
    batch: Batch
    state: ProducerState    # the producer's state once the envelope was accepted


class FakeProducer:
    """Reads a FakeSource from ``state`` and cuts batches the way
    producer/batching.py does (that module, not this one, is the truth:
    keep them in step; ``unfolded`` is its shape stage's ``unfolded``).
    A batch ends at a commit once it holds
    ``max_events`` changes, or where ``cut`` says (the producer's delay
    timer); a transaction's ``max_events``-th change of a batch ends a
    fragment.  ``start``: where a producer without a checkpoint begins."""

    def __init__(self, source: FakeSource, state: ProducerState | None = None, *, max_events: int = 4,
                 cut: Callable[[], bool] = lambda: False, producer_id: str = PRODUCER,
                 start: Position | None = None, server: str | None = None,
                 unfolded: Callable[[str, str], bool] | None = None) -> None:
        self.source = source
        self.unfolded = unfolded  # tables shipped unfolded (mode history: Shaper.unfolded)
        self.state = state or ProducerState()
        self.max_events = max_events
        self.cut = cut
        self.producer_id = producer_id
        self.start = self.state.checkpoint or start or source.start
        self.server = source.server if server is None else server

    def run(self) -> list[Sent]:
        """Everything from the state to the source's end."""
        out: list[Sent] = []
        st = self.state
        folder = Folder(PRODUCER_RULES, self.unfolded)
        raw = txn_in_batch = 0
        batch_from: tuple[Position, int] | None = None
        last_commit: SourceTxn | None = None
        frag = st.open.frag if st.open else 0
        skip = st.open
        first = skip.index if skip else self.source.index_at(self.start)
        cur: SourceTxn | None = None
        cur_index = txn_seen = 0

        def flush(complete: bool, end: Position) -> None:
            nonlocal folder, raw, txn_in_batch, batch_from, frag
            st = self.state
            changes = folder.changes()
            if not changes and not complete:
                return
            opened = st.open
            start = batch_from or ((self.source.txns[opened.index].begin, opened.shipped) if opened else (end, 0))
            meta = EnvelopeMeta(start=start[0], start_n=start[1], incarnation=st.incarnation, server=self.server,
                                after=st.checkpoint or self.start, frag=frag if frag or not complete else None)
            if complete:
                checkpoint: Position | None = end
                after_open = None
            else:
                assert cur is not None
                meta = dataclasses.replace(meta, stop=cur.begin, stop_n=txn_seen)
                after_open = OpenTxn(cur_index, txn_seen, frag + 1)
                last = last_commit.end if last_commit else None
                checkpoint = last if last is not None and (st.checkpoint is None or st.checkpoint < last) \
                    else st.checkpoint
            batch = Batch(self.producer_id, tuple(changes), end, complete, changes[0].txn if changes else None, 0,
                          last_commit.commit_ts if last_commit else 0, meta.to_dict())
            self.state = dataclasses.replace(st, seq=st.seq + 1, checkpoint=checkpoint, open=after_open)
            out.append(Sent(self.state.seq, batch, self.state))
            frag = 0 if complete else frag + 1
            folder = Folder(PRODUCER_RULES, self.unfolded)
            raw = txn_in_batch = 0
            batch_from = None

        for i in range(first, len(self.source.txns)):
            cur, cur_index = self.source.txns[i], i
            txn_seen = txn_in_batch = 0
            for j, c in enumerate(cur.changes):
                if skip is not None and i == skip.index and txn_seen < skip.shipped:
                    txn_seen += 1
                    continue  # in an envelope the transport already holds
                if not raw and batch_from is None:
                    batch_from = (c.txn, txn_seen)
                folder.add(c)
                raw += 1
                txn_in_batch += 1
                txn_seen += 1
                if txn_in_batch >= self.max_events:
                    flush(False, cur.event_end(j))  # a large transaction: a fragment, the commit is still to come
            skip = None
            last_commit = cur
            if raw == 0 and frag == 0:
                self.state = dataclasses.replace(self.state, checkpoint=cur.end)  # nothing to ship
            elif frag or raw >= self.max_events or self.cut():
                flush(True, cur.end)
        if raw and last_commit is not None:
            flush(True, last_commit.end)  # idle at the end of the binlog
        return out


def publish(stream: FakeStream, wire: Wire, sent: Sequence[Sent], fence: int = 0) -> list[str]:
    return [stream.publish(wire.seal(s.seq, s.batch, fence)) for s in sent]


def make_applier(cfg: Config, target: Target, stream: FakeStream, wire: Wire, per_read: int | None = None,
                 budget: int | None = None) -> Applier:
    """An applier process on the fakes (``run`` starts it).  ``budget``:
    the estimated bytes its buffer may hold (applier/spill.py), to make it
    apply large transactions in parts with the fakes' small envelopes."""
    app = Applier(cfg, target, stream.subscriber(per_read), wire.opener())
    if budget is not None:
        app.budget = budget
    return app


def cutter(seed: int, p: float) -> Callable[[], bool]:
    """A producer delay timer that fires at a commit with probability ``p``."""
    rng = random.Random(seed)
    return lambda: rng.random() < p


def checked_store(source: FakeSource) -> FakeStore:
    """A store that checks the guarantee after every commit: the target holds
    exactly ``source`` as of the position it records."""
    return FakeStore(on_commit=lambda store: assert_target_at(store, source))


def run_until_settled(cfg: Config, store: FakeStore, stream: FakeStream, wire: Wire, *, per_read: int | None = None,
                      budget: int | None = None, max_restarts: int | None = 200) -> int:
    """Run applier processes until the stream is settled; each Crash is a
    process death followed by a restart on the same store and stream
    (at most ``max_restarts``; None: no limit).  Returns how many times it died."""
    deaths = 0
    while True:
        app = make_applier(cfg, FakeTarget(cfg, store), stream, wire, per_read, budget=budget)
        try:
            app.run(until_idle_s=1e-6)
        except Crash:
            deaths += 1
            assert max_restarts is None or deaths <= max_restarts
            continue
        if stream.settled():
            return deaths
