"""DDL handlers for Iceberg tables (run by targets/ddl_runner.py).

Iceberg DDL commits on its own, so the applier state is written after the
operations, not with them.  Every operation first checks what the table
already holds and does nothing when its effect is there (table created,
column added, type changed, rename done): replaying a DDL after a crash
between the DDL and the state write changes nothing.  An ALTER of a table
the target does not have is skipped with a warning: the next flush of that
table creates it from the source's schema.

What Iceberg does not do in place:

- MODIFY COLUMN changes the type in place only for Iceberg's promotions
  (int -> bigint, float -> double, decimal precision up with the same scale)
  or when the Iceberg type stays the same (VARCHAR(10) -> TEXT, TINYINT ->
  INT); a change between numeric types beyond that (DECIMAL(10,2) ->
  DECIMAL(12,3), BIGINT -> INT) rewrites the table atomically (REPLACE TABLE
  ... AS SELECT with a CAST, under ANSI overflow checks, so a value that does
  not fit fails instead of wrapping).  Every other change (text <-> number,
  DATETIME -> TIMESTAMP, ...) is refused: the stored values would need
  MySQL's own conversion rules.
- RENAME TABLE on a Hadoop catalog (its tables are directories named after
  them and cannot be renamed): the table is copied atomically (CREATE TABLE
  ... AS SELECT, its snapshot marked ``cynomys.renamed-from``), then the old
  one dropped.  This costs a full copy; Hive and REST catalogs rename in
  place.
- CREATE TABLE ... LIKE: built from the source types kept in the old
  table's column comments and its primary-key property.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import json
import logging
from typing import Any, ClassVar, Iterator, Protocol, Sequence

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cynomys.applier.targets.ddl_runner import DdlRun, handler_table
from cynomys.applier.targets.spark import types as st
from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.applier.targets.spark.iceberg import IcebergApi
from cynomys.applier.targets.spark.layout import TableLayout
from cynomys.applier.targets.spark.merge import Layout, lit, marker, marker_of, q, same_flush
from cynomys.applier.targets.spark.session import CatalogProfile
from cynomys.core.config import Config
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import AppliedState, ColumnDef, RawTemporal
from cynomys.parser import ddl

log = logging.getLogger(__name__)

#: Snapshot summary key of a table copied by a RENAME: the old table's name.
RENAMED_FROM = "cynomys.renamed-from"


class IcebergTarget(Protocol):
    """What the handlers use of the Spark target (kept apart from target.py,
    which imports this module: no cycle)."""

    cfg: Config
    settings: SparkConfig
    profile: CatalogProfile
    key_property: ClassVar[str]
    table_properties: ClassVar[dict[str, str]]

    @property
    def where(self) -> str: ...
    @property
    def spark(self) -> SparkSession: ...
    @property
    def iceberg(self) -> IcebergApi: ...
    def sql(self, statement: str) -> None: ...
    def qualified(self, database: str, table: str | None = None) -> str: ...
    def layout(self, database: str, table: str) -> Layout | None: ...
    def check_database(self, database: str) -> None: ...
    def mapping(self, schema_name: str, col: ColumnDef) -> st.Mapping: ...
    def column_sql(self, schema_name: str, col: ColumnDef) -> str: ...
    def create_table(self, database: str, table: str, columns: Sequence[ColumnDef], key: Sequence[str]) -> None: ...
    def table_layout(self, database: str, table: str, columns: Sequence[str] | None = None) -> TableLayout: ...
    def properties_for(self, want: TableLayout) -> dict[str, str]: ...
    def source_columns(self, layout: Layout) -> list[tuple[T.StructField, ColumnDef]]: ...



class Run(DdlRun[IcebergTarget]):
    """One DDL statement on Iceberg tables; ``state`` is the state it leads
    to (it marks the commits the statement makes)."""

    state: AppliedState

    def __init__(self, target: IcebergTarget, sql: str, state: AppliedState) -> None:
        super().__init__(target, sql, target.where, {}, state.commit_ts)
        self.state = state

    def step(self, statement: str) -> None:
        log.info("DDL step on %s: %s", self.where, statement)
        self.target.sql(statement)

    def check_database(self, database: str) -> None:
        self.target.check_database(database)

    def drop_table(self, database: str, table: str) -> None:
        self.step(f"DROP TABLE IF EXISTS {self.table(database, table)} PURGE")

    def layout(self, database: str, table: str) -> Layout | None:
        return self.target.layout(database, table)

    def table(self, database: str, table: str) -> str:
        return self.target.qualified(database, table)

    @contextlib.contextmanager
    def marked(self, extra: dict[str, str] | None = None) -> Iterator[None]:
        """Commits inside carry the DDL's state (and ``extra``) in their summary."""
        with self.target.iceberg.commit_properties({**marker(self.state), **(extra or {})}):
            yield

    def key(self, database: str, table: str) -> list[str]:
        raw = self.target.iceberg.properties(database, table).get(self.target.key_property, "[]")
        return [str(k) for k in json.loads(raw)]

    def set_key(self, database: str, table: str, key: list[str]) -> None:
        self.target.iceberg.update_properties(database, table, {self.target.key_property: json.dumps(key)})


# --------------------------------------------------------------------------
# One function per operation
# --------------------------------------------------------------------------
def _create_database(r: Run, op: ddl.CreateDatabase) -> None:
    r.target.check_database(op.database)
    r.step(f"CREATE NAMESPACE IF NOT EXISTS {r.target.qualified(op.database)}")


def _drop_database(r: Run, op: ddl.DropDatabase) -> None:
    r.target.check_database(op.database)
    for table in r.target.iceberg.list_tables(op.database):
        r.step(f"DROP TABLE IF EXISTS {r.table(op.database, table)} PURGE")
    # The catalog drops only an empty namespace (CASCADE is not supported).
    r.step(f"DROP NAMESPACE IF EXISTS {r.target.qualified(op.database)}")


def _create_table(r: Run, op: ddl.CreateTable) -> None:
    r.target.create_table(op.database, op.table, op.columns, op.key)


def _create_table_like(r: Run, op: ddl.CreateTableLike) -> None:
    like = r.layout(op.like_database, op.like_table)
    if like is None:
        r.skip_missing(op.like_database, op.like_table, "create table like")
        return
    columns = [col for _, col in r.target.source_columns(like)]
    r.target.create_table(op.database, op.table, columns, r.key(op.like_database, op.like_table))


def _rename_table(r: Run, op: ddl.RenameTable) -> None:
    for (odb, old), (ndb, new) in op.pairs:
        r.target.check_database(ndb)
        there = r.target.iceberg.exists
        new_there = there(ndb, new)
        source = f"{odb}.{old}"

        def ours() -> bool:
            # Ours only if its snapshot is the copy made by this very statement.
            current = r.target.iceberg.current(ndb, new)
            copied = current is not None and current.summary.get(RENAMED_FROM) == source
            mark = marker_of(current.summary, r.state.producer_id) if current is not None else None
            return copied and mark is not None and same_flush(mark, r.state)

        if not r.rename_table_wanted((odb, old), (ndb, new), there(odb, old), new_there, ours):
            continue
        if new_there:
            # The copy committed before a crash; only the drop is left.
            log.info("%s: %s.%s already holds the copy of %s", r.what("rename table"), ndb, new, source)
        else:
            r.step(f"CREATE NAMESPACE IF NOT EXISTS {r.target.qualified(ndb)}")
            if r.target.profile.rename_tables:
                r.step(f"ALTER TABLE {r.table(odb, old)} RENAME TO {r.table(ndb, new)}")
                continue
            _copy_table(r, odb, old, ndb, new)
        r.step(f"DROP TABLE IF EXISTS {r.table(odb, old)} PURGE")


def _layout_props(r: Run, db: str, table: str, want: TableLayout) -> dict[str, str]:
    """The properties of a table made anew from ``db.table`` (a copy, a
    rewrite): Cynomys's own (the primary key...) kept, the layout's on top."""
    props = {k: v for k, v in r.target.iceberg.properties(db, table).items() if k.startswith("cynomys.")}
    props.update(r.target.properties_for(want))
    return props


def _copy_table(r: Run, odb: str, old: str, ndb: str, new: str) -> None:
    """CREATE TABLE new AS SELECT * FROM old: one atomic commit, marked with
    the old name so a replay recognises it.  The copy gets the layout
    [target.spark] asks for the new name."""
    want = r.target.table_layout(ndb, new)
    props = _layout_props(r, odb, old, want)
    log.warning("%s: the %s catalog cannot rename tables; copying %s.%s to %s.%s (a full copy)",
                r.what("rename table"), r.target.settings.catalog_type, odb, old, ndb, new)
    with r.marked({RENAMED_FROM: f"{odb}.{old}"}):
        r.step(f"CREATE TABLE {r.table(ndb, new)} USING iceberg{want.partition_sql()} TBLPROPERTIES ("
               + ", ".join(f"{lit(k)} = {lit(v)}" for k, v in props.items())
               + f") AS SELECT * FROM {r.table(odb, old)}")
    if want.sort:  # a metadata commit: the current snapshot stays the marked copy
        r.step(f"ALTER TABLE {r.table(ndb, new)} {want.sort_sql()}")
    if r.target.iceberg.current(ndb, new) is None:
        # An empty table's copy commits no snapshot: an empty one carries the marks.
        r.target.iceberg.commit_empty(ndb, new, {**marker(r.state), RENAMED_FROM: f"{odb}.{old}"})


def _truncate(r: Run, op: ddl.Truncate) -> None:
    if r.target.iceberg.exists(op.database, op.table):
        # A DELETE without a condition drops whole files: metadata only.
        with r.marked():
            r.step(f"DELETE FROM {r.table(op.database, op.table)}")


def _add_column(r: Run, op: ddl.AddColumn) -> None:
    layout = r.layout(op.database, op.table)
    if layout is None:
        r.skip_missing(op.database, op.table, "add column")
    elif not layout.has(op.column.name):
        name = f"{op.database}.{op.table}"
        r.step(f"ALTER TABLE {r.table(op.database, op.table)} ADD COLUMN {r.target.column_sql(name, op.column)}")
        _fill(r, op)
    else:
        # A replay: the column is there, but the crash may have come between
        # its commit and the fill's (two Iceberg commits), and the state is
        # written after both.  No later change of the table was applied
        # meanwhile, so a NULL in the new column is one the fill never set.
        _fill(r, op, replay=True)


def _fill(r: Run, op: ddl.AddColumn, replay: bool = False) -> None:
    """Give existing rows what the source gave them: no row event carries
    it.  On a replay only the rows still NULL (none, when the fill had
    committed)."""
    value: Any = r.fill_value(op)
    if value is None:
        return
    if isinstance(value, RawTemporal):
        raise TargetRejectedError(
            f"{r.what('add column')}: existing rows get the zero date {value!r}, which the Iceberg column cannot hold",
            hint="give the column a real DEFAULT on the source, or " + ddl.SKIP_HINT)
    m = st.mapping(op.column)
    try:
        stored = m.encode(value)
    except st.ValueRejected as exc:
        raise TargetRejectedError(f"{r.what('add column')}: DEFAULT {value!r} does not fit: {exc}",
                                  hint=ddl.SKIP_HINT) from None
    where = f" WHERE {q(op.column.name)} IS NULL" if replay else ""
    r.step(f"UPDATE {r.table(op.database, op.table)} SET {q(op.column.name)} = "
           f"CAST({_literal(stored)} AS {m.sql}){where}")


def _literal(v: Any) -> str:
    """A Spark SQL literal of a value in the form Arrow takes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, decimal.Decimal):
        # Positional notation: Spark reads '1.23E-7' as a DOUBLE (digits lost).
        return format(v, "f")
    if isinstance(v, bytes):
        return "X'" + v.hex() + "'"
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            return "TIMESTAMP " + lit(v.astimezone(datetime.timezone.utc).isoformat(sep=" "))
        return "TIMESTAMP_NTZ " + lit(v.isoformat(sep=" "))
    if isinstance(v, datetime.date):
        return "DATE " + lit(v.isoformat())
    return lit(str(v))


def _drop_column(r: Run, op: ddl.DropColumn) -> None:
    layout = r.layout(op.database, op.table)
    if layout is None:
        r.skip_missing(op.database, op.table, "drop column")
        return
    tbl = r.table(op.database, op.table)
    for name in (op.column, op.column + st.COMPANION_SUFFIX):
        f = layout.get(name)
        if f is not None:
            r.step(f"ALTER TABLE {tbl} DROP COLUMN {q(f.name)}")
    key = r.key(op.database, op.table)
    if any(k.lower() == op.column.lower() for k in key):
        r.set_key(op.database, op.table, [k for k in key if k.lower() != op.column.lower()])


def _modify_column(r: Run, op: ddl.ModifyColumn) -> None:
    db, t, col = op.database, op.table, op.column
    name = f"{db}.{t}"
    layout = r.layout(db, t)
    if layout is None:
        r.skip_missing(db, t, "modify column")
        return
    have = layout.get(col.name)
    if have is None:
        log.warning("%s: column %s is not in %s on the target; skipped", r.what("modify column"), col.name, name)
        return
    old_col = st.column_for(have.name, have.dataType, have.metadata.get("comment"))
    new = r.target.mapping(name, col)
    new_comment = st.comment(col, new)
    if have.dataType == new.spark and have.metadata.get("comment") == new_comment:
        return  # already this type (or a replay)
    try:
        old = dataclasses.replace(st.mapping(old_col), spark=have.dataType)
    except ValueError:
        old = dataclasses.replace(st.mapping(ColumnDef(have.name, "longtext")), spark=have.dataType)
    how = st.conversion(old, new)
    tbl = r.table(db, t)
    if how == "same":
        r.step(f"ALTER TABLE {tbl} ALTER COLUMN {q(have.name)} COMMENT {lit(new_comment)}")
    elif how == "promote":
        r.step(f"ALTER TABLE {tbl} ALTER COLUMN {q(have.name)} TYPE {new.sql}")
        r.step(f"ALTER TABLE {tbl} ALTER COLUMN {q(have.name)} COMMENT {lit(new_comment)}")
    elif how == "rewrite":
        _rewrite_column(r, db, t, have, new, new_comment)
    else:
        reason = how.partition(": ")[2]
        raise TargetRejectedError(
            f"{r.what('modify column')}: {name}.{col.name} from {old_col.type} to {col.type}: {reason}",
            hint="skip the statement ([applier] skip_ddl), drop the target table and re-snapshot it")


def _rewrite_column(r: Run, db: str, t: str, have: T.StructField, new: st.Mapping, new_comment: str) -> None:
    """REPLACE TABLE ... AS SELECT with the column cast: one atomic commit."""
    spark = r.target.spark
    tbl = r.table(db, t)
    source = spark.table(tbl)
    want = r.target.table_layout(db, t)
    props = _layout_props(r, db, t, want)
    log.warning("%s: Iceberg cannot change %s from %s to %s in place; rewriting %s.%s",
                r.what("modify column"), have.name, have.dataType.simpleString(), new.sql, db, t)
    previous = spark.conf.get("spark.sql.ansi.enabled", "false")
    # Overflow fails instead of wrapping.  A CAST takes the mode when it is
    # built, so the setting comes first.
    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        cols = [F.col(q(f.name)).cast(new.spark).alias(f.name, metadata={"comment": new_comment})
                if f.name == have.name else F.col(q(f.name)) for f in source.schema.fields]
        # SQL, not DataFrameWriterV2: its partitionedBy has no truncate
        # transform.  The view's field comments become the columns' comments.
        view = "cynomys_rewrite_src"
        source.select(*cols).createOrReplaceTempView(view)
        try:
            with r.marked():
                r.step(f"CREATE OR REPLACE TABLE {tbl} USING iceberg{want.partition_sql()} TBLPROPERTIES ("
                       + ", ".join(f"{lit(k)} = {lit(v)}" for k, v in props.items()) + f") AS SELECT * FROM {view}")
        finally:
            spark.catalog.dropTempView(view)
        if want.sort:  # a metadata commit: the current snapshot stays the marked rewrite
            r.step(f"ALTER TABLE {tbl} {want.sort_sql()}")
    finally:
        spark.conf.set("spark.sql.ansi.enabled", previous or "false")


def _rename_column(r: Run, op: ddl.RenameColumn) -> None:
    db, t = op.database, op.table
    layout = r.layout(db, t)
    if layout is None:
        r.skip_missing(db, t, "rename column")
        return
    old, new = layout.get(op.old), layout.get(op.new)
    if old is None:
        log.info("%s: no column %s on the target (already renamed?)", r.what("rename column"), op.old)
        return
    if new is not None and new.name.lower() != old.name.lower():
        raise TargetRejectedError(f"{r.what('rename column')}: both {op.old} and {op.new} exist in {db}.{t}",
                                  hint="drop the stale column on the target, or " + ddl.SKIP_HINT)
    tbl = r.table(db, t)
    r.step(f"ALTER TABLE {tbl} RENAME COLUMN {q(old.name)} TO {q(op.new)}")
    companion = layout.get(op.old + st.COMPANION_SUFFIX)
    if companion is not None:
        r.step(f"ALTER TABLE {tbl} RENAME COLUMN {q(companion.name)} TO {q(op.new + st.COMPANION_SUFFIX)}")
    key = r.key(db, t)
    if any(k.lower() == op.old.lower() for k in key):
        r.set_key(db, t, [op.new if k.lower() == op.old.lower() else k for k in key])


def _add_primary_key(r: Run, op: ddl.AddPrimaryKey) -> None:
    if not r.target.iceberg.exists(op.database, op.table):
        r.skip_missing(op.database, op.table, "add primary key")
        return
    r.set_key(op.database, op.table, list(op.columns))


def _drop_primary_key(r: Run, op: ddl.DropPrimaryKey) -> None:
    if r.target.iceberg.exists(op.database, op.table):
        r.set_key(op.database, op.table, [])


#: Operation type -> what runs it (the functions above, by name).
HANDLERS = handler_table(globals())

