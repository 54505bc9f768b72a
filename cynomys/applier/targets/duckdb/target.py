"""DuckDB target: one database file, each source database a schema in it.

``[target] url`` is the file's path (``duckdb:`` in front is allowed; a
relative path is taken from the config file's folder).  Tables are
``"<source db>"."<table>"``, the applier state ``cynomys_state.applied``.

One flush is one DuckDB transaction: keyed deletes (a semijoin with the
keys as an Arrow view), keyless deletes (each row image's copies found by
``rowid``), the bulk insert of the final images from an Arrow table, and the
state row -- exactly once for every table, keyed or not.  DuckDB DDL is
transactional, so a DDL statement and its state row commit together too.

DuckDB lets one process write a file, and a process that has it open for
writing locks out every other, readers included.  The file is therefore
open only while a transaction runs (``hold_connection = False``): between
flushes other processes can read it.  A flush that finds the file locked by
someone else fails as transient and is retried.

No primary keys are declared (``supports_keys = False``): DuckDB refuses to
ALTER a table that has one, and deletes go by the flush's key anyway.
"""
from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, Mapping

import duckdb
import pyarrow as pa

from cynomys.applier.targets.base import Capabilities, TableFlush
from cynomys.applier.targets.duckdb import ddl as duckdb_ddl
from cynomys.applier.targets.duckdb import verify as duckdb_verify
from cynomys.applier.targets.duckdb.types import DuckType, Unstorable, arrow_column, duck_type, native_source_type
from cynomys.applier.targets.source_types import source_type_comment, source_type_from_comment
from cynomys.applier.targets.sql import SqlTarget
from cynomys.core.config import Config
from cynomys.core.dialect import DUCKDB, Dialect
from cynomys.core.errors import ConfigError, TargetRejectedError
from cynomys.core.model import AppliedState, Change, ColumnDef, Row, TableSchema
from cynomys.verify.checksum import KeyRange

log = logging.getLogger(__name__)

Cursor = Any  # a duckdb connection: DuckDB's cursor() is a second connection with its own transaction


class DuckDBTarget(SqlTarget):
    """DuckDB over its Python API; see the module docstring."""

    dialect: ClassVar[Dialect] = DUCKDB

    capabilities: ClassVar[Capabilities] = Capabilities(
        transactional_ddl=True, max_statement_rows=100_000, supports_keys=False)
    hold_connection: ClassVar[bool] = False
    #: How long a flush waits for another process to release the file.
    lock_wait_s: ClassVar[float] = 10.0
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (duckdb.Error,)
    ddl_handlers = duckdb_ddl.HANDLERS
    unavailable_hint: ClassVar[str] = ("another process holds the DuckDB file open for writing, or it cannot be "
                                       "opened; Cynomys retries")
    #: Schemas a source database may not land on.
    reserved_schemas: ClassVar[frozenset[str]] = frozenset({"information_schema", "pg_catalog"})
    placeholder: ClassVar[str] = "?"
    #: The state table (targets/state.py).
    state_types: ClassVar[Mapping[str, str]] = {
        "producer_id": "VARCHAR NOT NULL", "seq": "BIGINT NOT NULL", "file": "VARCHAR NOT NULL",
        "pos": "BIGINT NOT NULL", "gtid": "VARCHAR NOT NULL", "commit_ts": "BIGINT NOT NULL",
        "updated_at": "TIMESTAMPTZ", "lineage": "VARCHAR"}
    now_sql: ClassVar[str] = "now()"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        url = cfg.target.url.removeprefix("duckdb://").removeprefix("duckdb:")
        if not url:
            raise ConfigError("[target] url is empty", hint="set it to the DuckDB file, e.g. url = \"replica.duckdb\"")
        self.path = str(cfg.resolve(url))

    @property
    def where(self) -> str:
        return f"DuckDB target {self.path}"

    # -- connection: opened per transaction, see the module docstring --------
    def _connect(self) -> Any:
        # Readers are expected between flushes: wait a while for one to let
        # go of the file before failing as transient (the loop then backs off).
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                conn = duckdb.connect(self.path)
                conn.execute("BEGIN TRANSACTION")  # the API autocommits; transaction() commits
                return conn
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    raise self.target_error(exc, f"cannot open {self.where}") from exc
                time.sleep(0.05)
            except (duckdb.Error, OSError) as exc:
                raise self.target_error(exc, f"cannot open {self.where}") from exc

    def _cursor(self, conn: Any) -> Cursor:
        return conn

    def is_transient(self, exc: BaseException) -> bool:
        # A lock held by another process.  (Transaction errors are not: with
        # one writing process they come from what the statements did.)
        return isinstance(exc, (duckdb.IOException, OSError))

    def connect_note(self) -> str:
        return f" (DuckDB {duckdb.__version__})"

    # -- catalog ----------------------------------------------------------------
    def check_database(self, database: str) -> None:
        super().check_database(database)
        if database.lower() in self.reserved_schemas:
            raise TargetRejectedError(f"the source database {database!r} has the name of a schema Cynomys or "
                                      "DuckDB uses", hint="exclude it in [source] exclude_tables")

    @staticmethod
    def columns(cur: Cursor, database: str, table: str) -> list[ColumnDef]:
        """The table's columns with their source types, in order; [] when missing."""
        rows = cur.execute("SELECT column_name, data_type, comment FROM duckdb_columns() WHERE database_name = "
                           "current_database() AND schema_name = ? AND table_name = ? ORDER BY column_index",
                           [database, table]).fetchall()
        return [ColumnDef(n, source_type_from_comment(c) or native_source_type(t)) for n, t, c in rows]

    def table_exists(self, database: str, table: str) -> bool:
        with self.transaction(f"looking up {database}.{table}") as cur:
            return bool(self.columns(cur, database, table))

    def duck_type(self, schema_name: str, col: ColumnDef) -> DuckType:
        try:
            return duck_type(col)
        except TypeError as exc:
            raise TargetRejectedError(f"table {schema_name}: {exc}",
                                      hint="exclude the table in [source] exclude_tables") from exc

    def column_sql(self, schema_name: str, col: ColumnDef) -> str:
        return f"{self.ident(col.name)} {self.duck_type(schema_name, col).sql}"

    def comment_sql(self, database: str, table: str, col: ColumnDef) -> str:
        text = source_type_comment(col.type).replace("'", "''")
        return f"COMMENT ON COLUMN {self.table_name(database, table)}.{self.ident(col.name)} IS '{text}'"

    def create_table(self, cur: Cursor, database: str, table: str, columns: list[ColumnDef]) -> None:
        self.check_database(database)
        name = f"{database}.{table}"
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {self.ident(database)}")
        cur.execute(f"CREATE TABLE {self.table_name(database, table)} ("
                    + ", ".join(self.column_sql(name, c) for c in columns) + ")")
        for col in columns:
            cur.execute(self.comment_sql(database, table, col))

    def add_column(self, cur: Cursor, database: str, table: str, col: ColumnDef) -> None:
        cur.execute(f"ALTER TABLE {self.table_name(database, table)} ADD COLUMN "
                    f"{self.column_sql(f'{database}.{table}', col)}")
        cur.execute(self.comment_sql(database, table, col))

    def _prepare(self, schema: TableSchema) -> None:
        """Create a missing table (or add columns the target lacks: a skipped
        ADD COLUMN) in a transaction of its own, before the flush's."""
        ident = (schema.database, schema.table)
        if self._ready.get(ident) == schema:
            return
        with self.transaction(f"preparing table {schema.name}") as cur:
            have = {c.name.lower() for c in self.columns(cur, *ident)}
            if not have:
                self.create_table(cur, schema.database, schema.table, list(schema.columns))
                log.info("created table %s on %s", schema.name, self.where)
            for col in schema.columns:
                if have and col.name.lower() not in have:
                    self.add_column(cur, schema.database, schema.table, col)
                    log.warning("added column %s.%s (%s): the target lacked it", schema.name, col.name, col.type)
        self._ready[ident] = schema
        self.schemas[ident] = schema

    # -- flush ------------------------------------------------------------------
    def _arrow(self, schema: TableSchema, columns: list[ColumnDef], rows: list[Row],
               extra: dict[str, pa.Array] | None = None) -> pa.Table:
        """Rows as an Arrow table named c0, c1, ... (no quoting of source names);
        a value a column cannot hold is refused naming the table and column."""
        arrays: dict[str, pa.Array] = {}
        for i, (col, values) in enumerate(zip(columns, zip(*rows) if rows else [()] * len(columns))):
            try:
                arrays[f"c{i}"] = arrow_column(self.duck_type(schema.name, col), list(values))
            except (Unstorable, ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
                bad = next((r for r in rows if _refused(self.duck_type(schema.name, col), r[i])), None)
                raise self.rejected(schema, [bad] if bad is not None else [], f"{exc} at row 1", col) from None
        arrays.update(extra or {})
        return pa.table(arrays)

    def _apply_table(self, cur: Cursor, tf: TableFlush) -> None:
        schema = tf.schema
        tbl = self.table_name(schema.database, schema.table)
        cols = list(schema.columns)
        if tf.delete_keys:
            key_cols = [cols[i] for i in schema.key_indexes()]
            keys = list(dict.fromkeys(tf.delete_keys))
            cur.register("cynomys_keys", self._arrow(schema, key_cols, keys))
            match = " AND ".join(f"t.{self.ident(c.name)} = k.c{i}" for i, c in enumerate(key_cols))
            self._execute(cur, f"DELETE FROM {tbl} AS t USING cynomys_keys AS k WHERE {match}", schema)
            cur.unregister("cynomys_keys")
        if tf.delete_rows:
            # Keyless: remove n copies of each row image, picked by rowid.
            images = list(tf.delete_rows)
            extra = {"n": pa.array([tf.delete_rows[r] for r in images], pa.int64()),
                     "i": pa.array(range(len(images)), pa.int64())}
            cur.register("cynomys_gone", self._arrow(schema, cols, images, extra))
            match = " AND ".join(f"t.{self.ident(c.name)} IS NOT DISTINCT FROM g.c{i}" for i, c in enumerate(cols))
            self._execute(cur, f"DELETE FROM {tbl} WHERE rowid IN (SELECT rid FROM (SELECT t.rowid AS rid, g.n, "
                               f"row_number() OVER (PARTITION BY g.i ORDER BY t.rowid) AS k FROM {tbl} AS t "
                               f"JOIN cynomys_gone AS g ON {match}) WHERE k <= n)", schema)
            cur.unregister("cynomys_gone")
        if tf.inserts:
            cur.register("cynomys_rows", self._arrow(schema, cols, tf.inserts))
            names = ", ".join(self.ident(c.name) for c in cols)
            picks = ", ".join(f"c{i}" for i in range(len(cols)))
            self._run_rows(cur, schema, f"INSERT INTO {tbl} ({names}) SELECT {picks} FROM cynomys_rows", tf.inserts)
            cur.unregister("cynomys_rows")

    def describe_column(self, col: ColumnDef) -> str:
        try:
            return duck_type(col).sql
        except TypeError:
            return "none (unknown source type)"

    # -- DDL and reading back -----------------------------------------------------
    def ddl_run(self, change: Change, state: AppliedState, scope: Cursor | None) -> duckdb_ddl.Run:
        return duckdb_ddl.Run(self, change.sql or "", self.where, self.schemas, change.commit_ts, scope)

    def range_rows(self, schema: TableSchema, rng: KeyRange) -> list[Row]:
        """`cynomys verify`: the key range read in SQL (duckdb/verify.py)."""
        rows = duckdb_verify.range_rows(self, schema, rng)
        return super().range_rows(schema, rng) if rows is None else rows

    def fetch_rows(self, database: str, table: str) -> list[Row]:
        with self.transaction(f"reading {database}.{table}") as cur:
            columns = self.columns(cur, database, table)
            if not columns:
                raise TargetRejectedError(f"table {database}.{table} does not exist on {self.where}")
            types = [duck_type(c) for c in columns]
            exprs = [t.select.format(c=self.ident(c.name)) for t, c in zip(types, columns)]
            rows = cur.execute(f"SELECT {', '.join(exprs)} FROM {self.table_name(database, table)}").fetchall()
        decoders = [t.decode for t in types]
        return [tuple(None if v is None else d(v) for d, v in zip(decoders, row)) for row in rows]


def _refused(t: DuckType, v: Any) -> bool:
    try:
        arrow_column(t, [v])
        return False
    except (Unstorable, ValueError, TypeError, OverflowError, pa.ArrowException):
        return True
