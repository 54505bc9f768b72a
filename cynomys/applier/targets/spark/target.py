"""Spark target: Apache Iceberg tables written by PySpark 3.5.

Each source table becomes the Iceberg table ``<catalog>.<source db>.<table>``
(format v3 by default: ``[target.spark] format_version``); column types follow ``spark_types``.  A flush writes each table
with ONE DataFrame built from Arrow and ONE Iceberg commit:

- tables with a primary key: ``MERGE INTO`` on the key.  The source rows are
  the final images (op 'U': update when matched, insert when not) and the
  keys deleted without a new image (op 'D': delete when matched).  Keys
  match with ``=`` plus the source's key range (Iceberg skips the files
  outside it).  A flush of inserts only is a plain append: it needs no read
  of the table, because the table is an exact replica as of the previous
  flush (a partial flush ahead of the state is rolled back first, below);
- tables without one: whole rows are a multiset (``TableFlush.delete_rows``).
  MERGE cannot tell identical rows apart, so one MERGE deletes *every* copy of
  each deleted row value and inserts back the copies that must stay, plus the
  new rows; the surplus count comes from the target inside the same statement
  (one snapshot read).  Cost: two scans of the table (count, then match) and
  the deleted values' copies are rewritten; insert-only flushes are a plain
  append.  (The alternative, INSERT OVERWRITE of the multiset difference,
  rewrites the whole table on every flush with a delete.)

Row-level changes are **merge-on-read**: a commit writes small position-delete
files next to new data files, so its cost follows the size of the change.
Copy-on-write rewrites every data file holding a deleted or updated row; CDC
updates and deletes land all over a table, so that is most of the table on
every flush.  Measured (bench/bench_spark_merge.py, 2 shared cores, 1000-row
flushes, two runs): on a 2M-row table merge-on-read took 4.5-5.3 s, copy-on-
write 9.2-19 s; on 200k rows, a few small files, copy-on-write can be ahead
(1.6 s vs 2.4 s in the quieter run).  The rewrite grows with the table, the
delete files with the change.  The price is paid by readers, and by later
MERGEs, until compaction: 30 flushes without it made a 1000-row flush 2.2-2.6x
slower (62 data + 59 delete files).  So the target maintains each table
itself, between flushes (``maintenance.py``: compaction, then snapshot
expiry; ``[target.spark] maintenance``).  The MERGE writes without a shuffle
(``write.merge.distribution-mode = none``): a flush is small.

Exactly-once without multi-table transactions
---------------------------------------------
Iceberg commits one table at a time.  Every commit a flush makes carries the
flush's (producer, seq, position) in its *snapshot summary*
(``cynomys.producer``, ``cynomys.seq``, ``cynomys.file``, ``cynomys.pos``,
``cynomys.gtid``, ``cynomys.commit-ts``); after the tables, the applier state
is written as the table property ``cynomys.applied.<producer>`` of
``<catalog>.cynomys_state.applied`` (a metadata-only Iceberg commit: no Spark
job, tens of milliseconds, atomic, and kept by the catalog next to the data
whatever the catalog type; a JSON file would only work on a local warehouse).

A crash between table commits leaves some tables one flush ahead of the
state.  On the next flush of such a table:

- if its latest Cynomys snapshot carries exactly the flush's (seq, position),
  the replay is the same flush: the table is skipped;
- otherwise the replay was cut differently (the applier batches redelivered
  envelopes as they come), so the ahead snapshot is rolled back (Iceberg
  rollback to its parent, metadata only) and the flush applied.  Keyed
  upserts would survive a double application, but keyless multisets would
  not: rollback keeps both exact.

Small flushes run no Spark job: a table's flush of at most ``row_delta_rows``
net changes (keyed or keyless) is committed as an Iceberg row delta
(deletion vectors and a data file, ``delta.py``) and an append as a data
file (``direct.py``), each one commit carrying the marker like the statement
it replaces, where the table allows it (``_fast``); otherwise the statement
runs.  Small tables are maintained without Spark too (``compact.py``).

Snapshot rows new to a table (``direct.py``) are appended as a data file
written by pyarrow, in a commit of their own *before* the flush's MERGE of
the rest of the table: that commit carries ``cynomys.part-of`` and the
flush under ``cynomys.part.*`` (not the marker: the replay must not take
the table for done), the MERGE the marker.  A crash between the two leaves
the part as the table's newest snapshot above the last flush: ``_ahead``
counts such parts ahead, so the next flush of the table rolls them back
first (a failure between them rolls back at once), and when the rest is
empty the append itself carries the marker.

A failure inside ``apply`` rolls back the tables this flush already
committed the same way, so a rejected flush leaves nothing behind.  This
assumes Cynomys is the only writer of its tables (maintenance jobs that
rewrite files are fine: rolling back past one loses no rows).

DDL runs through ``spark_ddl``; each operation checks the table first, so a
replay after a crash between the DDL and the state write changes nothing.

A source transaction in parts (applier/spill.py)
------------------------------------------------
Spark cannot keep a transaction open across its jobs, so a transaction too
large for the applier's memory is *staged* (write-audit-publish): each part
is MERGEd into a branch ``cynomys_stage_<producer>`` of each table it
touches, made from main when the transaction first touches the table (main
rolled back first if it is ahead of the state; a stale branch left by a
crash dropped).  Part commits carry ``cynomys.part-of = <producer>`` in
their summary, the last commit on every staged branch the flush marker.  At
the end (``commit_parts``) main is fast-forwarded to the branch head of
each table (a metadata-only commit each), the state is written, and the
branches are dropped.  Readers of main see nothing of the transaction
before the fast-forwards, which take milliseconds per table: the same
window between tables as any multi-table flush here.  A crash after some
fast-forwards leaves those tables ahead of the state, as a crash between
table commits does; the rollback then goes back past the part commits too
(``_ahead`` counts them with the flush that follows them), to main as it
was before the transaction.

Why branches rather than data files written per part and committed in one
Iceberg commit at the end: the parts of one transaction change the same
keys again (a row updated in one part is updated or deleted in a later
one; a keyless row inserted in one part is deleted in the next), so a part
must read what the parts before it wrote.  MERGE on a branch does exactly
that with Iceberg's own reads and delete files, the same statement as a
flush; files written aside are invisible to Spark's MERGE until committed,
so Cynomys would have to find and delete rows across uncommitted files
itself.  The price: one metadata commit per table to make and drop the
branch and one to publish it (tens of milliseconds each), and the parts'
snapshots stay in main's history (expired by maintenance like any other).
Measured (bench/bigtxn.py, bench/results/bigtxn.json, a shared 2-core box):
a 1,000,000-row lineitem UPDATE staged in 14 parts and published with the
applier at 424 MB peak RSS, where buffering it whole took the applier to
3,570 MB for 2,000,000 rows (issue #24); a reader polling main during such
a transaction saw only the state before or after it
(tests/integration/test_bigtxn.py).  The alternative was not built, so
there is no side-by-side time.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, ContextManager, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from cynomys.applier.targets import state as applied_state
from cynomys.applier.targets.base import Capabilities, Flush, SqlConsole, TableFlush
from cynomys.applier.targets.spark import console as spark_console
from cynomys.applier.targets.spark import ddl as spark_ddl
from cynomys.applier.targets.spark import layout as spark_layout
from cynomys.applier.targets.spark import session as spark_session
from cynomys.applier.targets.spark import types as st
from cynomys.applier.targets.spark import verify as spark_verify
from cynomys.applier.targets.spark import warmup as spark_warmup
from cynomys.applier.targets.spark.compact import SmallCompaction
from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.applier.targets.spark.delta import RowDelta
from cynomys.applier.targets.spark.direct import DirectAppend
from cynomys.applier.targets.spark.iceberg import IcebergApi, Snapshot
from cynomys.applier.targets.spark.maintenance import Maintenance
from cynomys.applier.targets.spark.merge import (
    COUNT_COLUMN,
    OP_COLUMN,
    PART_MARK,
    Columns,
    Layout,
    TablePlan,
    append,
    key_prune,
    key_values,
    keyed_merge,
    keyed_rows,
    keyless_merge,
    keyless_rows,
    lit,
    marker,
    marker_of,
    order,
    part_marker,
    part_state,
    q,
    same_flush,
)
from cynomys.applier.targets.spark.runs import run_columns, run_images
from cynomys.applier.targets.spark.session import CATALOGS, CatalogProfile
from cynomys.applier.targets.stateful import StatefulTarget
from cynomys.core.columnar import InsertRun
from cynomys.core.config import Config
from cynomys.core.errors import CynomysError, TargetRejectedError, TargetUnavailableError
from cynomys.core.model import AppliedState, Change, ColumnDef, Op, Position, RawTemporal, Row, TableSchema, Value
from cynomys.verify.checksum import KeyRange

log = logging.getLogger(__name__)

OVERDUE = 3  # x maintenance_commits: maintain between flushes even when never idle

class SparkTarget(StatefulTarget):
    """Apache Iceberg tables through PySpark (local mode or a Spark cluster)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        transactional_ddl=False, max_statement_rows=1_000_000, supports_keys=False, backlog_factor=3,
        backlog_rows=400_000, columnar_inserts=True, applies_parts=True)
    #: The branch a transaction applied in parts is staged on (+ the producer).
    stage_prefix: ClassVar[str] = "cynomys_stage_"
    #: Where the applier state lives: a table property of the Iceberg table
    #: ``state_namespace.state_table`` per producer (targets/state.py's JSON).
    state_property_prefix: ClassVar[str] = "cynomys.applied."
    #: State table property per table: its latest maintenance run (JSON).
    maintenance_property_prefix: ClassVar[str] = "cynomys.maintenance."
    #: Table property holding the source primary key (JSON list); Iceberg
    #: does not enforce keys, MERGE uses the flush's schema.
    key_property: ClassVar[str] = "cynomys.primary-key"
    #: Properties of every table Cynomys creates (see the module docstring).
    #: The format version, partition spec, sort order and further
    #: properties come from [target.spark] (``layout.py``; ``properties_for``).
    table_properties: ClassVar[dict[str, str]] = {
        "write.delete.mode": "merge-on-read",
        "write.update.mode": "merge-on-read",
        "write.merge.mode": "merge-on-read",
        "write.merge.distribution-mode": "none",
        # Appends too: a partitioned or sorted table would otherwise shuffle
        # every flush (Iceberg's default there is hash); the writer sorts
        # each task's rows by partition and sort order locally instead.
        "write.distribution-mode": "none",
        # Every flush writes a metadata file; keep the last few only.
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "20",
    }
    catalogs: ClassVar[dict[str, CatalogProfile]] = CATALOGS
    ddl_handlers = spark_ddl.HANDLERS
    #: Keyed flushes of inserts only are appended, not merged (see _plan).
    append_new_keys: ClassVar[bool] = True
    #: A keyed MERGE also matches on the source's key range, so Iceberg can
    #: skip the files outside it (recent rows of an auto-increment key).
    prune_key_range: ClassVar[bool] = True
    #: ... as ranges of its dense stretches plus up to this many single keys
    #: (merge.key_spans), so a few scattered updates do not widen the range
    #: to the whole table.
    prune_key_values: ClassVar[int] = 5_000
    #: A keyed MERGE on a table partitioned by a transform of a key column
    #: also matches ``key IN (the flush's keys)`` up to this many keys, so
    #: Iceberg reads only their partitions (merge.key_values); 0 turns it off.
    prune_partition_keys: ClassVar[int] = 20_000
    #: Match keys with ``<=>`` (the behaviour before issue #11; benchmarks).
    null_safe_keys: ClassVar[bool] = False
    #: Sources of at least this many rows go to Spark as a Parquet file on a
    #: local master (see _spool); 0 turns it off.
    parquet_handoff_rows: ClassVar[int] = 2000
    #: A flush's snapshot rows whose keys the table does not hold go to it
    #: as a data file written by pyarrow (``direct.py``), not through the MERGE.
    direct_reads: ClassVar[bool] = True
    #: ... unless the table holds more than this share of their keys (a
    #: snapshot of a table already loaded): then all of them are MERGEd.
    direct_reads_present: ClassVar[float] = 0.1
    #: Appends (keyed flushes of new keys only, keyless inserts) go to the
    #: table as a data file written by pyarrow (``direct.py``), not through
    #: a Spark job, where the table's layout allows it.
    fast_appends: ClassVar[bool] = True
    #: Flushes of a table with at most this many net changes are tried as a
    #: row delta (``delta.py``: deletion vectors and a data file, no Spark
    #: job) before the MERGE; 0 turns it off.
    row_delta_rows: ClassVar[int] = 100_000
    #: Maintenance compacts and expires a small table without Spark (``compact.py``).
    small_compaction: ClassVar[bool] = True

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        # Validate the configuration (and find the Iceberg jar) before any JVM starts.
        self.conf = spark_session.WRITER_CONF | spark_session.session_conf(cfg)
        self.settings = cfg.target.of(SparkConfig)  # [target.spark]
        self.catalog = self.settings.catalog
        self.profile = self.catalogs[self.settings.catalog_type]
        self._spark: SparkSession | None = None
        self._generation = 0
        self._iceberg: IcebergApi | None = None
        self._direct: DirectAppend | None = None
        self._row_delta: RowDelta | None = None
        self._compaction: SmallCompaction | None = None
        # Tables known to match a schema: (db, table) -> (schema, layout); cleared by DDL and errors.
        self._ready: dict[tuple[str, str], tuple[TableSchema, Layout]] = {}
        self._views = itertools.count(1)  # source view names
        self._spool_lock = threading.Lock()
        self.maintenance = Maintenance(self.settings)
        self._housekeeping: dict[str, Any] | None = None
        self._last_state: AppliedState | None = None  # what the last flush committed (maintenance checks it)
        # "db.table" -> when the last flush's commit of it ended (readable): base.Target.visible_at
        self._visible: dict[str, float] = {}
        self._spool_dir: Path | None = None
        self._warming: threading.Thread | None = None  # warmup.py, started by connect
        # A transaction staged in parts: its producer, the state recorded when
        # it began, and the tables with a staging branch.
        self._stage_pid: str | None = None
        self._stage_recorded: AppliedState | None = None
        self._staged: set[tuple[str, str]] = set()

    @property
    def where(self) -> str:
        return f"Spark target (master {self.conf['spark.master']}, catalog {self.catalog})"

    # ------------------------------------------------------------------
    # Session
    # ------------------------------------------------------------------
    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self.connect()
        assert self._spark is not None
        return self._spark

    @property
    def iceberg(self) -> IcebergApi:
        if self._iceberg is None:
            self.connect()
        assert self._iceberg is not None
        return self._iceberg

    @property
    def direct(self) -> DirectAppend:
        if self._direct is None:
            self.connect()
        assert self._direct is not None
        return self._direct

    @property
    def compaction(self) -> SmallCompaction:
        if self._compaction is None:
            self.connect()
        assert self._compaction is not None
        return self._compaction

    @property
    def row_delta(self) -> RowDelta:
        if self._row_delta is None:
            self.connect()
        assert self._row_delta is not None
        return self._row_delta

    @contextlib.contextmanager
    def edge(self, what: str, hint: str | None = None) -> Iterator[None]:
        """Translate Py4J/Spark errors raised inside into Cynomys errors."""
        try:
            yield
        except CynomysError:
            self._ready.clear()
            raise
        except Exception as exc:
            if not spark_session.is_spark_error(exc):
                raise
            self._ready.clear()
            raise spark_session.translate(exc, what, hint) from exc

    def connect(self) -> None:
        if self._spark is not None:
            return
        try:
            spark, self._generation = spark_session.acquire(self.conf)
        except CynomysError:
            raise
        except Exception as exc:  # the JVM did not start, the master is unreachable...
            raise TargetUnavailableError(f"cannot start Spark for {self.where}: {spark_session.first_line(exc)}",
                                         hint="check [target.spark] master and that Java 17 is installed") from exc
        self._spark, self._iceberg = spark, IcebergApi(spark, self.catalog)
        self._direct = DirectAppend(self._iceberg)
        self._row_delta = RowDelta(self._iceberg, self._direct)
        self._compaction = SmallCompaction(self._direct, self._row_delta)
        try:
            with self.edge(f"creating the state table on {self.where}"):
                self.sql(f"CREATE NAMESPACE IF NOT EXISTS {self.qualified(self.state_namespace)}")
                props = {k: v for k, v in self.table_properties.items() if k.startswith("write.metadata")}
                self.sql(f"CREATE TABLE IF NOT EXISTS {self.qualified(self.state_namespace, self.state_table)} "
                         "(note STRING) USING iceberg COMMENT " + lit(
                             f"Cynomys applier state: table properties {self.state_property_prefix}<producer>")
                         + " TBLPROPERTIES (" + ", ".join(f"{lit(k)} = {lit(v)}" for k, v in props.items()) + ")")
        except BaseException:
            self.close()
            raise
        log.info("connected to %s", self.where)
        if self.settings.warm_up:
            self._warming = spark_warmup.start(self, self._generation)

    def close(self) -> None:
        if self._spark is None:
            return
        if self._stage_pid is not None:
            self.rollback_parts()  # nothing of it was visible; the branches go (else: dropped at the next use)
        if self._warming is not None:
            # Let a warm-up finish its statement (seconds) before the session may go.
            self._warming.join(timeout=15)
            self._warming = None
        self._spark, self._iceberg, self._direct, self._row_delta, self._compaction = None, None, None, None, None
        self._ready.clear()
        if self._spool_dir is not None:
            shutil.rmtree(self._spool_dir, ignore_errors=True)
            self._spool_dir = None
        spark_session.release(self._generation)

    def qualified(self, database: str, table: str | None = None) -> str:
        name = f"{q(self.catalog)}.{q(database)}"
        return name if table is None else f"{name}.{q(table)}"

    def sql(self, statement: str) -> None:
        """Run a statement for its effect.  The JVM session's own ``sql``:
        PySpark's wraps it with a Py4J name lookup and an argument array
        per call (iceberg.py's module doc says what a lookup costs)."""
        log.debug("Spark SQL: %s", statement)
        self.spark._jsparkSession.sql(statement)

    # ------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------
    def applied(self, producer_id: str) -> AppliedState | None:
        with self.edge(f"reading the applier state on {self.where}"):
            props = self.iceberg.properties(self.state_namespace, self.state_table)
        raw = props.get(self.state_property_prefix + producer_id)
        return None if raw is None else applied_state.from_json(producer_id, raw, self.where)

    def record_state(self, state: AppliedState, scope: Any = None) -> None:
        """The state as a table property (a metadata-only Iceberg commit; see the module docstring)."""
        with self.edge(f"recording the applier state on {self.where}"):
            self.iceberg.update_properties(self.state_namespace, self.state_table,
                                           {self.state_property_prefix + state.producer_id: applied_state.to_json(state)})

    # ------------------------------------------------------------------
    # Tables
    # ------------------------------------------------------------------
    def table_exists(self, database: str, table: str) -> bool:
        with self.edge(f"looking up {database}.{table} on {self.where}"):
            return self.iceberg.exists(database, table)

    def table_columns(self, database: str, table: str) -> tuple[ColumnDef, ...] | None:
        with self.edge(f"looking up the columns of {database}.{table} on {self.where}"):
            layout = self.layout(database, table)
        return None if layout is None else tuple(col for _, col in self.source_columns(layout))

    def layout(self, database: str, table: str) -> Layout | None:
        """The target table's columns, or None when it does not exist."""
        if not self.iceberg.exists(database, table):
            return None
        return Layout.of(self.spark.table(self.qualified(database, table)).schema)

    def mapping(self, schema_name: str, col: ColumnDef) -> st.Mapping:
        try:
            return st.mapping(col)
        except ValueError as exc:
            raise TargetRejectedError(
                f"table {schema_name}: {exc}",
                hint="exclude the table in [source] exclude_tables, or change the column on the source to a type "
                     "listed in cynomys/applier/targets/spark/types.py") from None

    def column_sql(self, schema_name: str, col: ColumnDef) -> str:
        m = self.mapping(schema_name, col)
        return f"{q(col.name)} {m.sql} COMMENT {lit(st.comment(col, m))}"

    def companion_sql(self, col: ColumnDef) -> str:
        return (f"{q(col.name + st.COMPANION_SUFFIX)} string COMMENT "
                + lit(f"MySQL text of {col.name} when it is a zero or partial date ({col.name} is NULL then)"))

    def create_table(self, database: str, table: str, columns: Sequence[ColumnDef], key: Sequence[str]) -> None:
        """CREATE TABLE IF NOT EXISTS with the mapped columns (all optional:
        the source enforced NOT NULL; Iceberg cannot relax a required column
        later if the source does), and the layout [target.spark] asks for."""
        self.check_database(database)
        name = f"{database}.{table}"
        for col in columns:
            if col.name.endswith(st.COMPANION_SUFFIX) or col.name in (OP_COLUMN, COUNT_COLUMN):
                raise TargetRejectedError(f"table {name}: column {col.name!r} has a name Cynomys reserves",
                                          hint="exclude the table in [source] exclude_tables")
        want = self.table_layout(database, table, [c.name for c in columns])
        defs = ",\n  ".join(self.column_sql(name, c) for c in columns)
        props = {**self.properties_for(want), self.key_property: json.dumps(list(key))}
        self.sql(f"CREATE NAMESPACE IF NOT EXISTS {self.qualified(database)}")
        self.sql(f"CREATE TABLE IF NOT EXISTS {self.qualified(database, table)} (\n  {defs}\n) USING iceberg"
                 + want.partition_sql() + " TBLPROPERTIES ("
                 + ", ".join(f"{lit(k)} = {lit(v)}" for k, v in props.items()) + ")")
        if want.sort:
            # Iceberg's CREATE TABLE cannot say it: a metadata commit (a crash
            # before it is mended by check_layout, on a table still empty).
            self.sql(f"ALTER TABLE {self.qualified(database, table)} {want.sort_sql()}")
        log.info("created Iceberg table %s on %s (format v%d%s%s)", self.qualified(database, table), self.where,
                 want.format_version, want.partition_sql(), f", {want.sort_sql()}" if want.sort else "")

    # ------------------------------------------------------------------
    # Layout from [target.spark] (layout.py)
    # ------------------------------------------------------------------
    def table_layout(self, database: str, table: str, columns: Sequence[str] | None = None
                     ) -> spark_layout.TableLayout:
        """The layout the config asks for ``database.table``; ``columns``
        (when known) must hold every column it names."""
        want = spark_layout.of(self.settings, database, table)
        if columns is not None:
            have = {c.lower() for c in columns}
            missing = sorted(want.columns() - have)
            if missing:
                raise TargetRejectedError(
                    f"table {database}.{table}: [target.spark] partition_by/sort_by name column(s) "
                    f"{', '.join(missing)}, which the table does not have",
                    hint="name columns of the source table in partition_by/sort_by for this table or pattern")
        return want

    def properties_for(self, want: spark_layout.TableLayout) -> dict[str, str]:
        """The table properties of a new table: the config's, then Cynomys's own."""
        return {"format-version": str(want.format_version), **want.properties, **self.table_properties}

    def _partition_key(self, schema: TableSchema) -> str | None:
        """The key column whose values pick partitions (bucket, identity or
        truncate of it in the spec [target.spark] asks for), if any."""
        keys = {k.lower(): k for k in schema.key}
        for p in spark_layout.of(self.settings, schema.database, schema.table).partition:
            if p.transform in ("bucket", "identity", "truncate") and p.column.lower() in keys:
                return keys[p.column.lower()]
        return None

    def check_layout(self, database: str, table: str) -> None:
        """Compare an existing table with the layout the config asks for:
        refuse the difference (``layout_changes = "refuse"``) or change the
        table in place (``"evolve"``; metadata commits, no marker needed:
        they change no rows).  An empty table (no snapshot: created just
        before a crash) is always brought in line."""
        want = self.table_layout(database, table)
        have = self.iceberg.layout(database, table)
        diffs = spark_layout.differences(want, have)
        if not diffs:
            return
        name = f"{database}.{table}"
        empty = self.iceberg.current(database, table) is None
        if want.format_pinned and want.format_version < have.format_version:
            raise TargetRejectedError(
                f"table {name} is Iceberg format v{have.format_version}; [target.spark] asks for "
                f"v{want.format_version}, and a format version cannot go down",
                hint=f"set format-version = \"{have.format_version}\" for {name} in [target.spark] "
                     "table_properties, or drop the target table and re-snapshot it")
        if self.settings.layout_changes != "evolve" and not empty:
            raise TargetRejectedError(
                f"table {name}: its layout differs from [target.spark]: " + "; ".join(diffs),
                hint="set [target.spark] layout_changes = 'evolve' to change it in place (files already written "
                     "keep their layout until compaction), or put the config back for this table")
        tbl = self.qualified(database, table)
        spec = {p.iceberg for p in want.partition}
        for old in have.partition:
            if old not in spec:
                self.sql(f"ALTER TABLE {tbl} DROP PARTITION FIELD {spark_layout.PartitionField.of_iceberg(old).sql}")
        for p in want.partition:
            if p.iceberg not in have.partition:
                self.sql(f"ALTER TABLE {tbl} ADD PARTITION FIELD {p.sql}")
        if tuple(s.iceberg for s in want.sort) != have.sort:
            self.sql(f"ALTER TABLE {tbl} {want.sort_sql()}")
        props = {k: v for k, v in want.properties.items() if have.properties.get(k) != v}
        if want.format_pinned and want.format_version != have.format_version:
            props["format-version"] = str(want.format_version)
        if props:
            self.sql(f"ALTER TABLE {tbl} SET TBLPROPERTIES ("
                     + ", ".join(f"{lit(k)} = {lit(v)}" for k, v in props.items()) + ")")
        log.warning("table %s: layout changed in place to match [target.spark]: %s", name, "; ".join(diffs))

    def _ensure_table(self, schema: TableSchema) -> Layout:
        """Create the table, or add the columns the schema has and the table
        lacks (a DDL that was skipped or arrived late)."""
        ident = (schema.database, schema.table)
        ready = self._ready.get(ident)
        if ready is not None and ready[0] == schema:
            return ready[1]
        self.check_database(schema.database)
        layout = self.layout(*ident)
        if layout is None:
            self.create_table(schema.database, schema.table, schema.columns, schema.key)
        else:
            self.check_layout(*ident)
            missing = [c for c in schema.columns if not layout.has(c.name)]
            if missing:
                self.sql(f"ALTER TABLE {self.qualified(*ident)} ADD COLUMNS ("
                         + ", ".join(self.column_sql(schema.name, c) for c in missing) + ")")
                log.warning("added column(s) %s to %s: the target lacked them",
                            ", ".join(f"{c.name} ({c.type})" for c in missing), schema.name)
        layout = self.layout(*ident)
        assert layout is not None
        for col in schema.columns:
            have = layout.get(col.name)
            m = self.mapping(schema.name, col)
            assert have is not None
            if have.dataType != m.spark and not st.promotable(m.spark, have.dataType):
                raise TargetRejectedError(
                    f"table {schema.name}: column {col.name} is {have.dataType.simpleString()} on the target but "
                    f"the source's {col.type} maps to {m.sql} (was a MODIFY COLUMN skipped?)",
                    hint=f"change the column on the target (ALTER TABLE ... ALTER COLUMN {col.name} TYPE {m.sql}), "
                         "or drop the target table and re-snapshot it")
        self._ready[ident] = (schema, layout)
        return layout

    def _add_companions(self, schema: TableSchema, layout: Layout, cols: list[ColumnDef]) -> Layout:
        self.sql(f"ALTER TABLE {self.qualified(schema.database, schema.table)} ADD COLUMNS ("
                 + ", ".join(self.companion_sql(c) for c in cols) + ")")
        log.warning("table %s: zero or partial dates in %s: added companion column(s) %s holding their MySQL text",
                    schema.name, ", ".join(c.name for c in cols),
                    ", ".join(c.name + st.COMPANION_SUFFIX for c in cols))
        new = self.layout(schema.database, schema.table)
        assert new is not None
        self._ready[(schema.database, schema.table)] = (schema, new)
        return new

    # ------------------------------------------------------------------
    # Flush
    # ------------------------------------------------------------------
    def visible_at(self) -> Mapping[str, float]:
        return self._visible

    def apply(self, flush: Flush) -> None:
        t0 = time.monotonic()
        state = flush.state
        self._visible = {}
        what = f"applying a flush of {len(flush.tables)} table(s) up to {state.position} on {self.where}"
        with self.edge(what):
            # Read, not cached: what the tables are compared with must be what
            # the target holds (a property read, milliseconds).
            recorded = self.applied(state.producer_id)
            # Every table is created and every value encoded (and checked)
            # before the first commit: a value the target refuses stops the
            # flush before it has changed anything.
            plans = [p for p in (self._plan(tf) for tf in flush.tables) if p is not None]
            t_plan = time.monotonic()
            done: list[TablePlan] = []
            spent: list[str] = []
            try:
                self._commit_all(plans, state, recorded, done, spent)
                t1 = time.monotonic()
                self.record_state(state)
            except BaseException:
                self._abort(done, state.producer_id, recorded)
                raise
        for plan in done:
            self.maintenance.committed(plan.schema.database, plan.schema.table)
        end = time.monotonic()
        # Where a flush's time goes (the catch-up profile of issue #11).
        log.info("flush seq %d: %d net changes in %.2fs (plan %.2fs; %s; state %.2fs)", state.seq,
                 sum(p.rows for p in plans), end - t0, t_plan - t0, "; ".join(spent) or "no rows", end - t1)
        self._last_state = state

    def after_commit(self) -> None:
        """Maintenance runs when the applier is idle (``idle``); an applier
        that is never idle still maintains a table once it is overdue, here,
        after the flush was counted readable (base.Target.after_commit)."""
        if self._last_state is not None and self._stage_pid is None:
            self._maintain(self._last_state, self.maintenance.due(OVERDUE))

    def idle(self) -> None:
        """Nothing to flush: maintain one due table off the critical path."""
        if self._stage_pid is not None:
            return  # a compaction of main now would stop the staged branches' fast-forward
        due = self.maintenance.due()
        if due and self._last_state is not None:
            self._maintain(self._last_state, due)

    def _maintain(self, state: AppliedState, due: list[tuple[str, str]]) -> None:
        """Maintain one due table (one at a time bounds the pause it adds),
        after the state write: every table then holds exactly the state."""
        for database, table in due[:1]:
            try:
                _, _, ahead = self._ahead(database, table, state.producer_id, state)
                if ahead:  # cannot happen after a state write; never compact what may be rolled back
                    log.warning("table %s.%s holds a commit beyond the applier state: maintenance postponed",
                                database, table)
                    continue
                self._housekeeping = None
                run = self.maintenance.run(self, database, table)
                self.iceberg.update_properties(self.state_namespace, self.state_table, {
                    self.maintenance_property_prefix + f"{database}.{table}": json.dumps(run.as_dict())})
            except Exception as exc:  # the flush committed; maintenance is retried later
                log.warning("maintenance of %s.%s skipped: %s", database, table, spark_session.first_line(exc))

    def housekeeping(self) -> dict[str, Any]:
        """The maintenance report, read again only after a run."""
        if self._housekeeping is None:
            self._housekeeping = self.maintenance_report()
        return self._housekeeping

    def maintenance_report(self) -> dict[str, Any]:
        """Settings and each table's latest maintenance (kept as properties
        of the state table, so ``cynomys status`` sees them from any process)."""
        with self.edge(f"reading the maintenance log on {self.where}"):
            props = self.iceberg.properties(self.state_namespace, self.state_table)
        latest = {k[len(self.maintenance_property_prefix):]: json.loads(v) for k, v in sorted(props.items())
                  if k.startswith(self.maintenance_property_prefix)}
        cfg = self.settings
        return {"enabled": cfg.maintenance, "every_commits": cfg.maintenance_commits,
                "snapshot_retention_s": cfg.snapshot_retention_s, "snapshots_kept": cfg.snapshots_kept,
                "tables": latest}

    def _plan(self, tf: TableFlush, branch: str | None = None) -> TablePlan | None:
        """The table's source rows and statement (on ``branch`` when given)."""
        schema = tf.schema
        layout = self._ensure_table(schema)
        if schema.key:
            rows, ops, counts = keyed_rows(tf)
        else:
            rows, ops, counts = keyless_rows(tf)
        # InsertRuns (keyed tables only: keyless_runs is off here): new keys, unique in the flush (the
        # fold took out rows a later change replaced), after the rows.
        # READ runs last: from ``reads_from`` on, the rows may be appended directly (_commit).
        runs = [r for r in tf.runs if r.op is not Op.READ] + [r for r in tf.runs if r.op is Op.READ]
        n_reads = sum(r.rows for r in runs if r.op is Op.READ)
        if not rows and not runs:
            return None
        mappings = [self.mapping(schema.name, c) for c in schema.columns]
        run_arrays, run_raws = self._run_columns(schema, mappings, runs) if runs else ([], {})
        n_runs = sum(r.rows for r in runs)
        ops += ["U"] * n_runs
        cols = Columns()
        raws: dict[str, list[str | None]] = {}
        for i, (col, m) in enumerate(zip(schema.columns, mappings, strict=True)):
            try:
                array, raw = st.encode_column(m, [r[i] for r in rows])
            except st.ValueRejected as exc:
                raise self._rejected(schema, col, m, rows[exc.row] if exc.row is not None else None,
                                     str(exc)) from None
            if runs:
                # Chunks, not a copy (runs.run_columns): the rows first, then the runs.
                chunks = ([array] if rows else []) + list(run_arrays[i].chunks)
                array = pa.chunked_array(chunks, type=chunks[0].type)
                if raw is not None or i in run_raws:
                    raw = (raw or [None] * len(rows)) + run_raws.get(i, [None] * n_runs)
            cols.add(col.name, array, m.spark)
            if raw is not None:
                raws[col.name] = raw
        rows_total = len(rows) + n_runs
        # Zero/partial dates: companion columns, added to the table on first use.
        needed = [c for c in schema.columns if c.name in raws and not layout.has(c.name + st.COMPANION_SUFFIX)]
        if needed:
            layout = self._add_companions(schema, layout, needed)
        companions = [c for c in schema.columns if layout.has(c.name + st.COMPANION_SUFFIX)]
        for c in companions:
            texts = raws.get(c.name, [None] * rows_total)
            cols.add(c.name + st.COMPANION_SUFFIX, pa.array(texts, type=pa.string()), T.StringType())
        cols.add(OP_COLUMN, pa.array(ops, type=pa.string()), T.StringType())
        if not schema.key:
            cols.add(COUNT_COLUMN, pa.array(counts, type=pa.int64()), T.LongType())
        data = pa.Table.from_arrays(cols.arrays, names=cols.names)
        name = self.qualified(schema.database, schema.table) + (f".{q('branch_' + branch)}" if branch else "")
        written = [c.name for c in schema.columns] + [c.name + st.COMPANION_SUFFIX for c in companions]
        match = list(schema.key) + [k + st.COMPANION_SUFFIX for k in schema.key
                                    if any(c.name == k for c in companions)]
        have = {c.lower() for c in written}
        absent = {f.name: f.dataType.simpleString() for f in layout.fields.values() if f.name.lower() not in have}
        if schema.key and not tf.delete_keys and self.append_new_keys \
                and not any(r.op is Op.READ for r in runs):
            # Only inserts: every key is new to the source, and the table is
            # an exact replica at the previous flush (the markers roll back
            # anything ahead), so none of them can be there.  No MERGE, no
            # scan of the table.  (Updates come with a delete key, and
            # snapshot reads are upserts: they never take this path.)
            sql = append(name, written, absent)
            fast = "append" if branch is None and self.fast_appends else ""
        elif schema.key:
            null_safe = frozenset(match) if self.null_safe_keys else frozenset(
                k for k in schema.key if layout.has(k + st.COMPANION_SUFFIX)) | frozenset(match[len(schema.key):])
            first = schema.key[0]
            prune = "" if first in null_safe or not self.prune_key_range else key_prune(
                first, data.column(cols.names.index(first)), self.prune_key_values)
            # -- layout (issue #27): partitions of a key column pruned by the flush's keys
            by = self._partition_key(schema)
            if by is not None and by not in null_safe and self.prune_partition_keys:
                prune = " AND ".join(c for c in (prune, key_values(
                    by, data.column(cols.names.index(by)), self.prune_partition_keys)) if c)
            # -- end layout
            sql = keyed_merge(name, written, match, null_safe, prune)
            fast = "upsert" if branch is None and not null_safe and not n_reads \
                and rows_total <= self.row_delta_rows else ""
            if n_reads and branch is None and by is None and first not in null_safe and self.direct_reads \
                    and _exact_key(data.column(cols.names.index(first)).type):
                return TablePlan(schema, name, data, T.StructType(cols.fields), sql, tf.rows,
                                 rows_total - n_reads, written, match, null_safe)
        elif tf.delete_rows:
            sql = keyless_merge(name, written)
            fast = "multiset" if branch is None and rows_total <= self.row_delta_rows else ""
        else:
            sql = append(name, written, absent)
            fast = "append" if branch is None and self.fast_appends else ""
        return TablePlan(schema, name, data, T.StructType(cols.fields), sql, tf.rows, written=written, fast=fast)

    def _run_columns(self, schema: TableSchema, mappings: list[st.Mapping], runs: list[InsertRun]
                     ) -> tuple[list[pa.ChunkedArray], dict[int, list[str | None]]]:
        try:
            return run_columns(schema, mappings, runs)
        except st.ValueRejected as exc:
            assert exc.column is not None
            row = run_images(runs)[exc.row] if exc.row is not None else None
            raise self._rejected(schema, schema.columns[exc.column], mappings[exc.column], row, str(exc)) from None

    def _rejected(self, schema: TableSchema, col: ColumnDef, m: st.Mapping, row: Row | None,
                  message: str) -> TargetRejectedError:
        """The table, the column and the one value refused -- never a whole
        row (a keyless table's row is its data, and messages end up in
        logs); the key only when ``[target] show_keys`` asks for it."""
        detail = ""
        if row is not None:
            value = repr(row[schema.columns.index(col)])
            detail = f"; value {value[:80] + '...' if len(value) > 80 else value}"
            if schema.key and self.cfg.target.show_keys:
                detail += f" in the row with key {tuple(row[i] for i in schema.key_indexes())!r}"
        return TargetRejectedError(
            f"target table {schema.name} rejected a value of column {col.name} (source type {col.type}, "
            f"Iceberg type {m.sql}): {message}{detail}",
            hint="fix the value on the source (it does not fit the column's MySQL type), or the column type; "
                 "nothing of this flush was committed and it will be retried from the same position")

    def _commit_all(self, plans: list[TablePlan], state: AppliedState, recorded: AppliedState | None,
                    done: list[TablePlan], spent: list[str]) -> None:
        """Commit every table of a flush, several at once (``commit_threads``):
        each is its own Iceberg commit carrying the flush marker, so the
        order does not matter, and a crash between them leaves tables ahead
        of the state exactly as one after another would (rolled back or
        skipped at the next flush).  Every commit runs to its end before a
        failure is raised, so ``done`` names all that committed (``_abort``
        rolls them back).  The marker reaches the commit because PySpark
        pins each Python thread to its own JVM thread (checked in _commit)."""
        def one(plan: TablePlan) -> tuple[bool, float]:
            t0 = time.monotonic()
            committed = self._commit(plan, state, recorded)
            # Readable from the commit's end on (each table is its own Iceberg
            # commit), not from after the marker check; several threads: one
            # dict store each.
            self._visible[plan.schema.name] = plan.committed_at or time.time()
            return committed, time.monotonic() - t0

        def record(plan: TablePlan, committed: bool, seconds: float) -> None:
            if committed:
                done.append(plan)
            spent.append(f"{plan.schema.table} {plan.data.num_rows} rows {seconds:.2f}s{plan.note}")

        threads = min(self.settings.commit_threads, len(plans))
        if threads <= 1:
            for plan in plans:
                record(plan, *one(plan))
            return
        errors: list[BaseException] = []
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cynomys-commit") as pool:
            futures: list[tuple[TablePlan, Future[tuple[bool, float]]]] = [(p, pool.submit(one, p)) for p in plans]
            for plan, fut in futures:
                try:
                    record(plan, *fut.result())
                except BaseException as exc:  # the others still finish; raised below
                    errors.append(exc)
        if errors:
            raise errors[0]

    def _commit(self, plan: TablePlan, state: AppliedState, recorded: AppliedState | None) -> bool:
        """Commit one table's plan; False when the table already holds it."""
        db, table = plan.schema.database, plan.schema.table
        current, latest, ahead = self._ahead(db, table, state.producer_id, recorded)
        if latest is not None and same_flush(latest, state):
            log.info("table %s already holds flush seq %d (%s), committed before a crash: skipped",
                     plan.schema.name, state.seq, state.position)
            return False
        if ahead:
            self._undo(db, table, ahead, recorded)
            current = self.iceberg.current(db, table)
        split = self._split_reads(plan) if plan.reads_from is not None else None
        if split is None:
            if not self._fast(plan, marker(state)):
                self._write(plan, marker(state))
        else:
            reads, keep, rest = split
            t0 = time.monotonic()
            n = self.direct.append(db, table, reads, keep, marker(state) if rest is None else part_marker(state))
            plan.note += f"; {n} appended directly in {time.monotonic() - t0:.2f}s)"
            if rest is not None:
                try:
                    self._write(rest, marker(state))
                except BaseException:
                    # The part alone is not the flush: roll it back now (the
                    # next flush of the table would, _ahead), not leave it visible.
                    with contextlib.suppress(Exception):
                        self.undo_ahead(db, table, state.producer_id, recorded)
                    raise
        plan.committed_at = time.time()
        after = self.iceberg.current(db, table)
        if after is not None and (current is None or after.id != current.id) \
                and marker_of(after.summary, state.producer_id) is None:
            # The commit properties did not reach the commit (the JVM thread
            # is not the one PySpark pins to ours): exactly-once is gone.
            raise TargetRejectedError(f"table {plan.schema.name}: the commit lacks its flush marker",
                                      hint="run the applier with PYSPARK_PIN_THREAD unset or 'true'")
        return True

    def _fast(self, plan: TablePlan, summary: dict[str, str]) -> bool:
        """Commit ``plan`` without a Spark job where it can be (``plan.fast``):
        an append as a data file written by pyarrow (``direct.py``), a small
        MERGE (keyed or keyless) as a row delta (``delta.py``).  False, with nothing
        written, when the statement must do it."""
        db, table = plan.schema.database, plan.schema.table
        t0 = time.monotonic()
        if plan.fast == "append":
            tbl = self.iceberg.load(db, table)  # once, for the check and the append
            layout = self.direct.layout(db, table, tbl)
            if layout is None or not layout.takes(plan.written):
                return False
            n = self.direct.append(db, table, plan.data.select(plan.written), None, summary, tbl)
            plan.note += f" (appended directly: {n} rows in {time.monotonic() - t0:.2f}s)"
            return True
        note = None
        if plan.fast == "upsert":
            note = self.row_delta.upsert(db, table, plan.data.select(plan.written + [OP_COLUMN]),
                                         plan.schema.key, summary)
        elif plan.fast == "multiset":
            note = self.row_delta.multiset(db, table, plan.data.select(plan.written + [OP_COLUMN, COUNT_COLUMN]),
                                           summary)
        if note is None:
            return False
        plan.note += note
        return True

    def _split_reads(self, plan: TablePlan) -> tuple[pa.Table, pa.ChunkedArray, TablePlan | None] | None:
        """A plan's snapshot rows with the mask of those the table holds no
        key of, to append as a data file (``direct.py``; a mask, not a copy:
        the file is written piece by piece), and the plan of the rest (None:
        nothing left); None when all of it goes through the MERGE.  Read
        after any rollback (_commit): the keys are the table's as of the state.

        A READ row goes to the MERGE when the table holds a row with its
        first key column's value (a change the log applied before the chunk
        was read) or the flush's other rows have one (they must not be
        applied after it); per first-column value, not per whole key:
        conservative, and the MERGE is right for any row."""
        db, table = plan.schema.database, plan.schema.table
        assert plan.reads_from is not None
        data, n = plan.data, plan.reads_from
        reads, others = data.slice(n), data.slice(0, n)
        columns = [c for c in data.column_names if c != OP_COLUMN]
        layout = self.direct.layout(db, table)
        if layout is None or not layout.takes(columns):
            return None
        first = plan.schema.key[0]
        prune = key_prune(first, reads.column(first), self.prune_key_values)
        if not prune:
            return None
        cap = max(100, int(reads.num_rows * self.direct_reads_present))
        t0 = time.monotonic()
        held = DataFrame(self.spark._jsparkSession.sql(
            f"SELECT t.{q(first)} FROM {plan.name} t WHERE {prune} LIMIT {cap + 1}"), self.spark).collect()
        if len(held) > cap:
            plan.note = f" (the table holds more than {cap} of its {reads.num_rows} snapshot rows' keys: all MERGEd)"
            return None
        key_type = reads.column(first).type
        blocked = pa.concat_arrays([pa.array([r[0] for r in held], type=key_type),
                                    others.column(first).combine_chunks().cast(key_type)])
        to_merge = pc.is_in(reads.column(first), value_set=blocked)
        n_merge = pc.sum(to_merge).as_py() or 0
        if n_merge == reads.num_rows:
            plan.note = " (the table or the flush holds every snapshot row's key: all MERGEd)"
            return None
        merged = pa.concat_tables([others, reads.filter(to_merge)])
        # Closed by _commit with what the append took.
        plan.note = f" ({len(held)} table rows in the snapshot rows' key ranges, {time.monotonic() - t0:.2f}s; " \
                    f"{merged.num_rows} rows MERGEd"
        keep = pc.invert(to_merge)
        if merged.num_rows == 0:
            return reads.select(columns), keep, None
        sql = keyed_merge(plan.name, plan.written, plan.match, plan.null_safe,
                          key_prune(first, merged.column(first), self.prune_key_values))
        return reads.select(columns), keep, TablePlan(plan.schema, plan.name, merged, plan.spark_schema, sql,
                                                      merged.num_rows)

    def _write(self, plan: TablePlan, summary: dict[str, str]) -> None:
        """Run a plan's statement, its commit carrying ``summary``."""
        n = next(self._views)  # atomic: tables commit from several threads
        view = f"cynomys_src_{n}"
        spool = self._spool(plan, n)
        if spool is not None:
            # CORRECTED: pyarrow writes proleptic Gregorian dates, as Spark 3
            # does (the default refuses dates before 1582 in a foreign file).
            self.spark.read.schema(plan.spark_schema).option("datetimeRebaseMode", "CORRECTED") \
                .option("int96RebaseMode", "CORRECTED").parquet(str(spool)).createOrReplaceTempView(view)
        else:
            self.iceberg.dataframe(plan.data, plan.spark_schema).createOrReplaceTempView(view)
        try:
            with self.iceberg.commit_properties(summary):
                self.sql(plan.sql.replace("{src}", q(view)))
        finally:
            self.spark.catalog.dropTempView(view)
            if spool is not None:
                spool.unlink(missing_ok=True)

    # ------------------------------------------------------------------
    # A transaction in parts: staged on branches (module docstring)
    # ------------------------------------------------------------------
    def stage_branch(self, producer_id: str) -> str:
        return self.stage_prefix + re.sub(r"[^A-Za-z0-9_]", "_", producer_id)

    @property
    def parts_open(self) -> bool:
        return self._stage_pid is not None

    def apply_part(self, part: Flush) -> None:
        t0 = time.monotonic()
        pid = part.state.producer_id
        with self.edge(f"staging part of a source transaction ({len(part.tables)} table(s)) on {self.where}"):
            if self._stage_pid is None:
                self._stage_recorded = self.applied(pid)  # read, not cached (see apply)
                self._stage_pid = pid
            branch = self.stage_branch(pid)
            plans = [p for p in (self._plan(tf, branch) for tf in part.tables) if p is not None]
            for plan in plans:
                self._stage(plan, {PART_MARK: pid})
        log.info("staged a part of %d net changes on branch %s of %d table(s) in %.2fs",
                 sum(p.rows for p in plans), branch, len(plans), time.monotonic() - t0)

    def _stage(self, plan: TablePlan, summary: dict[str, str]) -> None:
        ident = (plan.schema.database, plan.schema.table)
        if ident not in self._staged:
            self._open_branch(*ident)
            self._staged.add(ident)
        self._write(plan, summary)

    def _open_branch(self, database: str, table: str) -> None:
        """The staging branch of a table, made from main as the state
        records it (a flush ahead of the state is rolled back first)."""
        assert self._stage_pid is not None
        branch = self.stage_branch(self._stage_pid)
        self.undo_ahead(database, table, self._stage_pid, self._stage_recorded)
        if branch in self.iceberg.branches(database, table):
            log.warning("table %s.%s has a staging branch %s left by an applier that stopped inside a large "
                        "transaction: dropped (nothing of it was published)", database, table, branch)
            self.iceberg.remove_branch(database, table, branch)
        if self.iceberg.current(database, table) is None:
            self.iceberg.commit_empty(database, table, {})  # a branch starts at a snapshot: an empty one
        self.iceberg.create_branch(database, table, branch)

    def commit_parts(self, flush: Flush) -> None:
        if self._stage_pid is None:
            # Publishing the last part alone would apply part of a transaction.
            raise TargetUnavailableError(f"the transaction staged in parts on {self.where} is gone (the target "
                                         "was closed)", hint="the applier restarts and applies it again")
        t0 = time.monotonic()
        state = flush.state
        branch = self.stage_branch(state.producer_id)
        published: list[tuple[str, str]] = []
        with self.edge(f"publishing a source transaction staged in parts up to {state.position} on {self.where}"):
            try:
                plans = [p for p in (self._plan(tf, branch) for tf in flush.tables) if p is not None]
                for plan in plans:
                    self._stage(plan, marker(state))
                # Every staged branch ends with the flush marker, so a table
                # published before a crash is seen ahead of the state.
                written = {(p.schema.database, p.schema.table) for p in plans}
                for database, table in sorted(self._staged - written):
                    self.iceberg.commit_empty(database, table, marker(state), branch)
                self._visible = {}
                for database, table in sorted(self._staged):
                    self.iceberg.fast_forward(database, table, branch)
                    self._visible[f"{database}.{table}"] = time.time()
                    published.append((database, table))
                self.record_state(state)
            except BaseException:
                for database, table in published:  # best effort; else the next flush of the table does it
                    with contextlib.suppress(Exception):
                        self.undo_ahead(database, table, state.producer_id, self._stage_recorded)
                self.rollback_parts()
                raise
        tables = sorted(self._staged)
        self._drop_branches()
        for database, table in tables:
            self.maintenance.committed(database, table)
        self._last_state = state
        log.info("published a source transaction staged in parts: %d table(s) fast-forwarded, flush seq %d, "
                 "%.2fs", len(tables), state.seq, time.monotonic() - t0)

    def rollback_parts(self) -> None:
        if self._stage_pid is not None:
            self._drop_branches()

    def _drop_branches(self) -> None:
        """Forget the staged transaction and drop its branches (best effort:
        a branch left is dropped when the table is staged again)."""
        if self._stage_pid is None:
            return
        branch = self.stage_branch(self._stage_pid)
        for database, table in sorted(self._staged):
            try:
                self.iceberg.remove_branch(database, table, branch)
            except Exception as exc:
                log.warning("could not drop branch %s of %s.%s (%s); it is dropped at its next use",
                            branch, database, table, spark_session.first_line(exc))
        self._stage_pid, self._stage_recorded = None, None
        self._staged = set()

    def _spool(self, plan: TablePlan, n: int) -> Path | None:
        """Large sources on a local master go to Spark as a Parquet file
        written by pyarrow (Spark's own reader) instead of an Arrow stream
        through Py4J: 2.7x the rows/s (DESIGN.md, measured on this box).  A
        cluster's executors could not read the driver's temp folder."""
        if not self.parquet_handoff_rows or plan.data.num_rows < self.parquet_handoff_rows \
                or not self.conf["spark.master"].startswith("local"):
            return None
        with self._spool_lock:
            if self._spool_dir is None:
                self._spool_dir = Path(tempfile.mkdtemp(prefix="cynomys-spark-src-"))
        path = self._spool_dir / f"src-{n}.parquet"
        pq.write_table(plan.data, path, compression="none")  # read once, at once: compression is wasted work
        return path

    def _ahead(self, database: str, table: str, producer_id: str, recorded: AppliedState | None
               ) -> tuple[Snapshot | None, AppliedState | None, list[tuple[Snapshot, AppliedState]]]:
        """The current snapshot, the latest flush of this producer in the
        table, and the snapshots (newest first) carrying a flush the applier
        state does not record."""
        current: Snapshot | None = None
        latest: AppliedState | None = None
        ahead: list[tuple[Snapshot, AppliedState]] = []
        # Parts newer than any flush of the producer: a flush that stopped
        # between a table's part commit and its own (direct snapshot rows).
        orphans: list[tuple[Snapshot, AppliedState]] = []
        for snap in self.iceberg.ancestry(database, table):
            current = current or snap
            found = marker_of(snap.summary, producer_id)
            if found is None:
                if snap.summary.get(PART_MARK) == producer_id:
                    if ahead:
                        # A part of the flush just found ahead (or of the
                        # transaction published with it): rolled back with it.
                        ahead.append((snap, ahead[-1][1]))
                    elif latest is None:
                        orphans.append((snap, part_state(snap.summary) or recorded
                                        or AppliedState(producer_id, 0, Position("", 0))))
                continue
            if latest is None:
                ahead += orphans
                orphans = []
            latest = latest or found
            if recorded is not None and order(found) <= order(recorded):
                break
            ahead.append((snap, found))
        return current, latest, ahead + orphans

    def undo_ahead(self, database: str, table: str, producer_id: str, recorded: AppliedState | None) -> None:
        """Roll back the commit of a flush the state does not record (a crash
        or failure between table commits)."""
        _, _, ahead = self._ahead(database, table, producer_id, recorded)
        if ahead:
            self._undo(database, table, ahead, recorded)

    def _undo(self, database: str, table: str, ahead: list[tuple[Snapshot, AppliedState]],
              recorded: AppliedState | None) -> None:
        # At most one flush can be ahead (the state is written after every
        # flush); more means the state and the table disagree beyond a crash.
        name = f"{database}.{table}"
        producer_id = ahead[0][1].producer_id
        if len({(m.seq, m.position) for _, m in ahead}) > 1:
            raise TargetRejectedError(
                f"table {name} holds {len(ahead)} commits of producer {producer_id} beyond the applier state "
                f"(seq {recorded.seq if recorded else 'none'}); the state was lost or another applier writes it",
                hint=f"stop other appliers of this producer; restore the property {self.state_property_prefix}"
                     f"{producer_id} of {self.state_namespace}.{self.state_table}, or re-snapshot the table")
        oldest, m = ahead[-1]
        if oldest.parent is not None:
            self.iceberg.rollback_to(database, table, oldest.parent)
        elif self.iceberg.first_in_log(database, table, oldest.id):
            self.sql(f"DELETE FROM {self.qualified(database, table)}")  # it was empty before
        else:
            raise TargetRejectedError(
                f"table {name}: commit {oldest.id} of flush seq {m.seq} is beyond the applier state but has no "
                "parent snapshot to roll back to (the table was replaced)",
                hint="re-snapshot the table")
        log.warning("table %s held flush seq %d (%s) that the applier state does not record (a crash or failure "
                    "between table commits): rolled back snapshot %d", name, m.seq, m.position, oldest.id)

    def _abort(self, done: list[TablePlan], producer_id: str, recorded: AppliedState | None) -> None:
        """Best effort: undo this flush's commits after a failure.  What is
        left (the target went away) is undone at the next flush instead."""
        for plan in done:
            try:
                self.undo_ahead(plan.schema.database, plan.schema.table, producer_id, recorded)
            except Exception as exc:
                log.warning("could not roll back %s after a failed flush (%s); the next flush of it will",
                            plan.schema.name, exc)

    # ------------------------------------------------------------------
    # DDL
    # ------------------------------------------------------------------
    def ddl_scope(self, what: str, hint: str) -> ContextManager[Any]:
        # Each Iceberg DDL step commits on its own; errors translated here.
        return self.edge(f"{what} on {self.where}", hint=hint)

    def ddl_run(self, change: Change, state: AppliedState, scope: Any) -> spark_ddl.Run:
        return spark_ddl.Run(self, change.sql or "", state)

    def forget_caches(self) -> None:
        self._ready.clear()

    # ------------------------------------------------------------------
    # Reading back
    # ------------------------------------------------------------------
    def source_columns(self, layout: Layout) -> list[tuple[T.StructField, ColumnDef]]:
        """Target fields (companions left out) and the source column each stands for."""
        out = []
        for f in layout.fields.values():
            if f.name.endswith(st.COMPANION_SUFFIX) and layout.has(f.name[:-len(st.COMPANION_SUFFIX)]):
                continue
            out.append((f, st.column_for(f.name, f.dataType, f.metadata.get("comment"))))
        return out

    def range_rows(self, schema: TableSchema, rng: KeyRange) -> list[Row]:
        """`cynomys verify`: only the key range read (spark/verify.py)."""
        return spark_verify.range_rows(self, schema, rng)

    #: ``cynomys sql`` engines (base.SqlConsoles; console.py): read-only, no warm-up.
    console_engines: ClassVar[tuple[str, ...]] = spark_console.ENGINES

    @classmethod
    def open_console(cls, cfg: Config, engine: str) -> SqlConsole:
        return spark_console.open_console(cfg, engine)

    def fetch_rows(self, database: str, table: str, where: str = "", args: dict[str, Any] | None = None) -> list[Row]:
        """``where``/``args``: a condition with named parameters (``:p0``)."""
        with self.edge(f"reading {database}.{table} on {self.where}"):
            layout = self.layout(database, table)
            if layout is None:
                raise TargetRejectedError(f"table {database}.{table} does not exist on {self.where}")
            exprs: list[str] = []
            plan: list[tuple[Any, int | None]] = []  # (decoder, index of its companion or None)
            for f, col in self.source_columns(layout):
                try:
                    m = st.mapping(col)
                    exprs.append(m.select.format(c=q(f.name)))
                    dec = st.decoder(m)
                except ValueError:
                    exprs.append(q(f.name))
                    dec = _identity
                companion = layout.get(f.name + st.COMPANION_SUFFIX)
                if companion is not None:
                    exprs.append(q(companion.name))
                plan.append((dec, len(exprs) - 1 if companion is not None else None))
            sql = f"SELECT {', '.join(exprs)} FROM {self.qualified(database, table)}" + (f" WHERE {where}" if where else "")
            result = self.spark.sql(sql, args=args or None).collect()
        rows: list[Row] = []
        for r in result:
            values: list[Value] = []
            i = 0
            for dec, raw_at in plan:
                raw = r[raw_at] if raw_at is not None else None
                values.append(RawTemporal(raw) if raw is not None else dec(r[i]))
                i += 2 if raw_at is not None else 1
            rows.append(tuple(values))
        return rows


def _exact_key(t: pa.DataType) -> bool:
    """A key column whose values Spark returns as the same Python values
    Arrow holds (snapshot rows appended directly match the table's keys on
    it, ``_split_reads``)."""
    return bool(pa.types.is_integer(t) or pa.types.is_string(t))


def _identity(v: Any) -> Value:
    return v  # type: ignore[no-any-return]

