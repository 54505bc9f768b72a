"""Iceberg's Java API and Spark internals through Py4J, for what Spark SQL
cannot say from Python:

- snapshot summary properties of a SQL MERGE (Iceberg reads them from the
  thread-local of ``org.apache.iceberg.spark.CommitMetadata``; its public
  ``withCommitProperties`` takes a Java ``Callable``, which Python cannot
  hand over while keeping the same JVM thread, so the thread-local is set
  directly, by reflection, on the JVM thread PySpark pins to ours);
- walking a table's snapshots, rolling one back, table properties;
- Arrow data handed to Spark as Arrow (what ``createDataFrame(pandas)`` does
  inside, minus pandas, whose datetime64[ns] cannot hold year 9999).

Two Py4J costs are avoided on purpose, because every flush pays them per
table (a JFR profile of small flushes: 8% of the JVM's CPU):

- a name like ``jvm.org.apache.iceberg.catalog.Namespace`` is resolved one
  segment at a time, each a round trip in which the JVM tries ``org``,
  ``org.apache``, ... as classes through every jar of Spark's class path
  (failed lookups are not cached): the classes are looked up once
  (``_classes``);
- iterating a Java map through Py4J ends with a ``NoSuchElementException``
  that PySpark converts with a dozen more such lookups: a map is read as one
  JSON string (Jackson, which Spark ships) instead (``_map``).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from cynomys.applier.targets.spark.layout import Existing

log = logging.getLogger(__name__)

#: Iceberg's holder of per-thread commit (snapshot summary) properties.
COMMIT_METADATA_CLASS = "org.apache.iceberg.spark.CommitMetadata"
COMMIT_METADATA_FIELD = "COMMIT_PROPERTIES"


@dataclass(frozen=True)
class Snapshot:
    id: int
    parent: int | None
    operation: str
    summary: dict[str, str]


class IcebergApi:
    """One Iceberg catalog of a Spark session, seen through its Java API."""

    def __init__(self, spark: SparkSession, catalog: str) -> None:
        self.spark = spark
        self.catalog_name = catalog
        self._jvm: Any = spark.sparkContext._jvm
        self._gateway: Any = spark.sparkContext._gateway
        self._commit_local: Any = None

    @functools.cached_property
    def _classes(self) -> dict[str, Any]:
        """The Java classes used per flush, resolved once (module doc)."""
        jvm = self._jvm
        return {"String": jvm.java.lang.String, "HashMap": jvm.java.util.HashMap,
                "Namespace": jvm.org.apache.iceberg.catalog.Namespace,
                "TableIdentifier": jvm.org.apache.iceberg.catalog.TableIdentifier,
                "PythonSQLUtils": jvm.org.apache.spark.sql.api.python.PythonSQLUtils,
                "ArrowIteratorServer": jvm.org.apache.spark.sql.api.python.ArrowIteratorServer,
                "json": jvm.com.fasterxml.jackson.databind.ObjectMapper()}

    def _json(self, jobj: Any) -> Any:
        """A Java collection of strings as Python values, in one round trip
        (module doc)."""
        return json.loads(self._classes["json"].writeValueAsString(jobj))

    def _map(self, jmap: Any) -> dict[str, str]:
        """A Java ``Map<String, String>``."""
        return {str(k): str(v) for k, v in self._json(jmap).items()}

    # -- catalog and tables ------------------------------------------------
    def _catalog(self) -> Any:
        plugin = self.spark._jsparkSession.sessionState().catalogManager().catalog(self.catalog_name)
        return plugin.icebergCatalog()

    def _namespace(self, database: str) -> Any:
        arr = self._gateway.new_array(self._classes["String"], 1)
        arr[0] = database
        return self._classes["Namespace"].of(arr)

    def _ident(self, database: str, table: str) -> Any:
        return self._classes["TableIdentifier"].of(self._namespace(database), table)

    def exists(self, database: str, table: str) -> bool:
        return bool(self._catalog().tableExists(self._ident(database, table)))

    def load(self, database: str, table: str) -> Any:
        return self._catalog().loadTable(self._ident(database, table))

    def list_tables(self, database: str) -> list[str]:
        catalog = self._catalog()
        ns = self._namespace(database)
        if not catalog.namespaceExists(ns):
            return []
        return [str(ident.name()) for ident in catalog.listTables(ns)]

    def properties(self, database: str, table: str) -> dict[str, str]:
        return self._map(self.load(database, table).properties())

    def update_properties(self, database: str, table: str, set_: dict[str, str],
                          remove: tuple[str, ...] = ()) -> None:
        """One metadata-only commit (no Spark job)."""
        update = self.load(database, table).updateProperties()
        for k, v in set_.items():
            update = update.set(k, v)
        for k in remove:
            update = update.remove(k)
        update.commit()

    def layout(self, database: str, table: str) -> Existing:
        """The table's partition spec, sort order, format version and
        properties, in the forms ``layout.differences`` compares."""
        tbl = self.load(database, table)
        schema = tbl.schema()
        spec = []
        for f in tbl.spec().fields():
            transform = str(f.transform().toString())
            if transform == "void":  # a field dropped by partition evolution (v1 tables keep it as void)
                continue
            spec.append(f"{transform}({str(schema.findColumnName(f.sourceId())).lower()})")
        order = []
        for f in tbl.sortOrder().fields():
            # Enum constant names: ASC/DESC, NULLS_FIRST/NULLS_LAST.
            order.append(f"{str(schema.findColumnName(f.sourceId())).lower()} {f.direction().name()} "
                         f"{f.nullOrder().name()}")
        version = int(tbl.operations().current().formatVersion())
        props = self._map(tbl.properties())
        return Existing(tuple(spec), tuple(order), version, props)

    # -- snapshots -----------------------------------------------------------
    def _snapshot(self, s: Any) -> Snapshot:
        parent = s.parentId()
        return Snapshot(int(s.snapshotId()), None if parent is None else int(parent), str(s.operation()),
                        self._map(s.summary()))

    def current(self, database: str, table: str) -> Snapshot | None:
        s = self.load(database, table).currentSnapshot()
        return None if s is None else self._snapshot(s)

    def ancestry(self, database: str, table: str) -> Iterator[Snapshot]:
        """The current snapshot, then its parents, newest first."""
        tbl = self.load(database, table)
        s = tbl.currentSnapshot()
        while s is not None:
            snap = self._snapshot(s)
            yield snap
            s = tbl.snapshot(snap.parent) if snap.parent is not None else None

    def first_in_log(self, database: str, table: str, snapshot_id: int) -> bool:
        """The snapshot was the table's first current snapshot (it held no
        rows before it)."""
        history = list(self.load(database, table).history())
        return bool(history) and int(history[0].snapshotId()) == snapshot_id

    def commit_empty(self, database: str, table: str, summary: dict[str, str], branch: str | None = None) -> None:
        """An append of no files: a snapshot that only carries ``summary``
        (on ``branch``, else on main)."""
        append = self.load(database, table).newAppend()
        if branch is not None:
            append = append.toBranch(branch)
        for k, v in summary.items():
            append = append.set(k, v)
        append.commit()

    # -- branches (a transaction staged in parts: target.py) -------------------
    def branches(self, database: str, table: str) -> list[str]:
        """The table's branches, main aside."""
        refs = self.load(database, table).refs()
        return [str(name) for name in self._json(refs.keySet()) if str(name) != "main" and refs.get(name).isBranch()]

    def create_branch(self, database: str, table: str, branch: str) -> None:
        """A branch at main's current snapshot (one metadata commit)."""
        tbl = self.load(database, table)
        tbl.manageSnapshots().createBranch(branch, tbl.currentSnapshot().snapshotId()).commit()

    def remove_branch(self, database: str, table: str, branch: str) -> None:
        self.load(database, table).manageSnapshots().removeBranch(branch).commit()

    def fast_forward(self, database: str, table: str, branch: str) -> None:
        """Move main to ``branch``'s head (main must be its ancestor): one
        metadata commit that makes everything staged on it visible."""
        self.load(database, table).manageSnapshots().fastForwardBranch("main", branch).commit()

    def rollback_to(self, database: str, table: str, snapshot_id: int) -> None:
        """Make an ancestor the current snapshot again (metadata only)."""
        self.load(database, table).manageSnapshots().rollbackTo(snapshot_id).commit()

    # -- snapshot summary of the next commit on this thread ------------------
    def _thread_local(self) -> Any:
        if self._commit_local is None:
            loader = self._jvm.java.lang.Thread.currentThread().getContextClassLoader()
            cls = self._jvm.java.lang.Class.forName(COMMIT_METADATA_CLASS, True, loader)
            field = cls.getDeclaredField(COMMIT_METADATA_FIELD)
            field.setAccessible(True)
            self._commit_local = field.get(None)
        return self._commit_local

    @contextlib.contextmanager
    def commit_properties(self, props: dict[str, str]) -> Iterator[None]:
        """Iceberg commits made by Spark SQL on this thread inside the block
        carry ``props`` in their snapshot summary."""
        local = self._thread_local()
        jmap = self._classes["HashMap"]()
        for k, v in props.items():
            jmap.put(k, v)
        local.set(jmap)
        try:
            yield
        finally:
            local.set(self._classes["HashMap"]())

    # -- Arrow -> DataFrame ----------------------------------------------------
    def dataframe(self, table: pa.Table, schema: StructType) -> DataFrame:
        """A DataFrame over Arrow record batches, column types as ``schema``
        says (the Arrow types must be the ones Spark maps them to)."""
        from pyspark.sql.pandas.serializers import ArrowStreamSerializer

        if table.num_rows == 0:
            raise ValueError("no rows to hand to Spark")
        sc: Any = self.spark.sparkContext
        utils = self._classes["PythonSQLUtils"]
        jiter = sc._serialize_to_jvm(
            table.to_batches(), ArrowStreamSerializer(),
            lambda path: utils.readArrowStreamFromFile(path),
            self._classes["ArrowIteratorServer"])
        jdf = utils.toDataFrame(jiter, schema.json(), self.spark._jsparkSession)
        return DataFrame(jdf, self.spark)
