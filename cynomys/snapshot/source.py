"""The snapshot's SQL connection to the source.

Its session is set up so that chunk rows come out in the binlog decoder's
value domain and from a fresh, lock-free view:
- ``time_zone = '+00:00'``: TIMESTAMP values come back in UTC;
- REPEATABLE READ + autocommit: every chunk SELECT is its own consistent
  (MVCC) read, taking no row or table locks on InnoDB;
- utf8mb4: text of every column charset arrives as Python str.
Driver errors are translated here: a lost connection is transient (the
producer restarts and the snapshot resumes from its last finished chunk),
anything else is a SnapshotError naming the statement.

Two drivers, one behaviour (``DRIVERS``).  pymysql (pure Python) serves
every connection; a snapshot's chunk selects use mysqlclient (MySQLdb, C,
on libmariadb) where it is installed, because parsing rows is most of a
chunk's cost: on a 2M-row lineitem table here pymysql read 48k rows/s in
chunks (12 us of client CPU a row), mysqlclient 190k rows/s (3.4 us),
MariaDB Connector/Python 248k rows/s but it fails on zero dates
(bench/source_reads.py, results/source_reads.json).  mysqlclient's own
temporal converters turn zero and invalid dates into None; ours keep them
as text, as pymysql does, so both drivers give the same values (tests:
test_snapshot.py, every type, both drivers).  On the compiled path the
driver hands DECIMAL, temporal and floating fields over as bytes and the
cursor converts a fetched block in one pass (``_text_fields``).  With TLS to the source the
chunk selects use pymysql (the TLS settings are tested with it only).  A
keyless table's whole-table read (snapshot/keyless.py) uses the same driver.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import importlib.util
import logging
from typing import Any, Callable, Iterator, Sequence

import pymysql

from cynomys.core import compiled
from cynomys.core.config import SourceConfig
from cynomys.core.errors import CynomysError, SourceUnavailableError
from cynomys.core.flavour import flavour_of
from cynomys.core.model import Position, RawTemporal
from cynomys.core.tls import source_connect_args, source_tls_enabled, source_tls_error
from cynomys.snapshot.columns import TableInfo, table_info, whole_column_indexes
from cynomys.snapshot.errors import SnapshotError

log = logging.getLogger(__name__)

_CONNECTION_ERRORS = {2003, 2006, 2013, 2055, 1053, 1927}
#: Command denied, access denied (database, login), a privilege needed.
DENIED = frozenset({1142, 1044, 1227, 1045})
_SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")


def translate(exc: Exception, cfg: SourceConfig, what: str) -> CynomysError:
    """A driver error (pymysql's or mysqlclient's: the same codes and args)."""
    tls = source_tls_error(exc, cfg)
    if tls is not None:
        return tls
    code = exc.args[0] if exc.args else 0
    operational = type(exc).__name__ == "OperationalError"  # both drivers' DB-API class
    if code in _CONNECTION_ERRORS or (operational and isinstance(code, int) and code >= 2000):
        return SourceUnavailableError(f"snapshot: cannot reach the source {cfg.host}:{cfg.port}: {exc}")
    if code in DENIED:
        return SnapshotError(
            f"snapshot: the source {cfg.host}:{cfg.port} refused {what}: {exc.args[1] if len(exc.args) > 1 else exc}",
            hint="grant the Cynomys user the privilege named above, or set [snapshot] read_only = true to "
                 "snapshot with GTID watermarks and SELECT only")
    return SnapshotError(f"snapshot: the source {cfg.host}:{cfg.port} refused {what}: {exc}")


# -- drivers ------------------------------------------------------------------
def _pymysql(cfg: SourceConfig) -> Any:
    return pymysql.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                           connect_timeout=int(cfg.connect_timeout_s), autocommit=True, charset="utf8mb4",
                           **source_connect_args(cfg))


def _temporal(parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    """A mysqlclient converter: the value, or the model's RawTemporal (its
    text) when Python cannot hold it (zero and invalid dates; pymysql gives
    the text, which snapshot/columns.py turns into the same).  Already the
    model value, so chunk rows skip that second pass (``MODEL_TYPES``)."""
    def convert(raw: Any) -> Any:
        try:
            return parse(raw)  # mysqlclient hands converters str
        except ValueError:
            return RawTemporal(raw)
        except TypeError:  # bytes
            return convert(raw.decode("ascii"))
    return convert


def _text_fields(ext: Any) -> dict[int, Any]:
    """Field type -> the compiled converter of its text (``_speedups.
    TextConverter``) on the compiled path, {} on the pure one.

    DECIMAL, DATE, DATETIME/TIMESTAMP and FLOAT/DOUBLE: mysqlclient converts
    these by calling a Python converter per field (a str and an argument
    tuple made, a call: ~300 ns a field, two thirds of its fetch of a
    lineitem chunk).  On the compiled path the driver hands their text over
    as bytes (no converter: its fast path) and the chunk cursor converts a
    fetched block's fields in one pass (``_speedups.convert_fields``): equal
    texts give one object from a small cache (lineitem's quantities,
    discounts, taxes and dates repeat), so fewer objects are made and the Avro
    writer's ``str(Decimal)`` cache (by identity) hits; dates, datetimes and
    doubles in the server's form are parsed in C; any other text goes to the
    Python converter the compiled one stands for (the same values:
    tests/unit/test_text_converter.py, and test_snapshot.py reads every type
    both ways).  Made per connection: each reader thread's caches are its
    own, and the path is the one selected when the connection opens
    (``ext``: the compiled module then, None on the pure path)."""
    if ext is None:
        return {}
    return {t: ext.TextConverter(kind, reference) for t, (kind, reference) in _reference_converters().items()}


def _reference_converters() -> dict[int, tuple[int, Callable[[Any], Any]]]:
    """Field type -> (TextConverter kind, the Python converter): mysqlclient's
    own, but the model's temporal values (``_temporal``)."""
    import MySQLdb.converters
    from MySQLdb.constants import FIELD_TYPE

    conv = MySQLdb.converters.conversions
    kinds: dict[int, tuple[int, Callable[[Any], Any]]] = {FIELD_TYPE.DATE: (1, _temporal(datetime.date.fromisoformat))}
    for t in (FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP):
        kinds[t] = (2, _temporal(datetime.datetime.fromisoformat))
    for t in (FIELD_TYPE.DECIMAL, FIELD_TYPE.NEWDECIMAL):
        kinds[t] = (0, conv[t])
    for t in (FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE):
        kinds[t] = (3, conv[t])
    return kinds


def mysqlclient_conversions(text_fields: dict[int, Any]) -> dict[Any, Any]:
    """mysqlclient's converters with the model's temporal values; the types
    of ``text_fields`` (``_text_fields``) have none: their text comes as
    bytes and the cursor converts it (``_cursors``)."""
    import MySQLdb.converters

    conv = dict(MySQLdb.converters.conversions)
    for t, (_, reference) in _reference_converters().items():
        conv[t] = None if t in text_fields else reference
    return conv


@functools.cache
def _cursors() -> tuple[type, type]:
    """mysqlclient's cursor classes (stored, streamed) that convert the
    ``text_fields`` of the connection's (``cynomys_text_fields``) in each
    fetched block: every statement on a chunk connection reads through them
    (chunk selects, boundaries, a keyless stream, status queries)."""
    import MySQLdb.cursors

    class TextFields:
        _cynomys_desc: Any = None
        _cynomys_plan: tuple[tuple[int, Any], ...] = ()

        def _fetch_row(self, size: int = 1) -> Any:
            rows = super()._fetch_row(size)  # type: ignore[misc]
            desc = self.description  # type: ignore[attr-defined]
            if desc is not self._cynomys_desc:  # a new result: its fields' converters
                fields = getattr(self.connection, "cynomys_text_fields", None) or {}  # type: ignore[attr-defined]
                self._cynomys_plan = tuple((i, fields[d[1]]) for i, d in enumerate(desc or ()) if d[1] in fields)
                self._cynomys_desc = desc
            # The pass of the path the connection opened on (its fields come as bytes), whatever is selected now.
            convert = getattr(self.connection, "cynomys_convert", None)  # type: ignore[attr-defined]
            if not self._cynomys_plan or not rows or convert is None:
                return rows
            return convert(rows, self._cynomys_plan)

    class Cursor(TextFields, MySQLdb.cursors.Cursor):
        pass

    class SSCursor(TextFields, MySQLdb.cursors.SSCursor):
        pass

    return Cursor, SSCursor


def mysqlclient_cursor(streamed: bool) -> type:
    """The chunk connections' cursor class (``_cursors``)."""
    return _cursors()[1 if streamed else 0]


def _mysqlclient(cfg: SourceConfig) -> Any:
    import MySQLdb

    ext = compiled.ext  # the path, once: the fields that come as bytes and the pass that converts them
    fields = _text_fields(ext)
    conn = MySQLdb.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                           connect_timeout=int(cfg.connect_timeout_s), autocommit=True, charset="utf8mb4",
                           conv=mysqlclient_conversions(fields), cursorclass=mysqlclient_cursor(False))
    conn.cynomys_text_fields = fields
    conn.cynomys_convert = ext.convert_fields if ext is not None and fields else None
    return conn


#: Driver name -> how it connects.  Both give the same values (module doc).
DRIVERS: dict[str, Callable[[SourceConfig], Any]] = {"pymysql": _pymysql, "mysqlclient": _mysqlclient}
#: Driver -> the base types whose values it already gives as model values
#: (snapshot/columns.py ``row_converter(done=...)``): mysqlclient's temporal
#: converters above.  Three DATE columns a lineitem row cost the producer's
#: chunk readers a Python pass over every row (~9% of its CPU).
MODEL_TYPES: dict[str, frozenset[str]] = {"pymysql": frozenset(), "mysqlclient": frozenset({"date", "datetime"})}


def chunk_driver(cfg: SourceConfig, wanted: str) -> str:
    """The driver chunk selects use: ``wanted`` ("auto": mysqlclient when
    installed and the source connection has no TLS, else pymysql)."""
    if wanted == "auto":
        have = importlib.util.find_spec("MySQLdb") is not None
        return "mysqlclient" if have and not source_tls_enabled(cfg) else "pymysql"
    if wanted == "mysqlclient" and importlib.util.find_spec("MySQLdb") is None:
        raise SnapshotError("[snapshot] driver = \"mysqlclient\", but mysqlclient is not installed",
                            hint="pip install mysqlclient (needs libmariadb-dev and pkg-config), or set "
                                 "[snapshot] driver = \"auto\"")
    return wanted


# -- one connection's life, either driver (SnapshotConnection, keyless.ConsistentRead)
@contextlib.contextmanager
def driver_errors(cfg: SourceConfig, what: str) -> Iterator[None]:
    """A driver's error inside the block raised as ``translate`` says (what
    failed: ``what``); anything else as it is."""
    try:
        yield
    except Exception as exc:  # the drivers' errors (pymysql.err.MySQLError, MySQLdb.Error): driver_error
        if not driver_error(exc):
            raise
        raise translate(exc, cfg, what) from None


def statement_text(sql: str) -> str:
    """A statement as an error names it: one line, at most 300 characters."""
    return " ".join(sql.split())[:300]


def connect(cfg: SourceConfig, driver: str) -> Any:
    with driver_errors(cfg, "a connection"):
        return DRIVERS[driver](cfg)


def fetch_all(conn: Any, cfg: SourceConfig, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one statement on ``conn`` and return its rows."""
    with driver_errors(cfg, statement_text(sql)):
        cur = conn.cursor()
        try:
            cur.execute(sql, tuple(params) if params is not None else None)
            return list(cur.fetchall())
        finally:
            cur.close()


def close_connection(conn: Any) -> None:
    """Close ``conn``; a driver error says the server closed it already."""
    try:
        conn.close()
    except Exception as exc:
        if not driver_error(exc):
            raise


class SnapshotConnection:
    def __init__(self, cfg: SourceConfig, driver: str = "pymysql") -> None:
        self.cfg = cfg
        self.driver = driver
        self.conn = connect(cfg, driver)
        self.query("SET time_zone = '+00:00'")
        self.query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        self.is_mariadb = "mariadb" in self.conn.get_server_info().lower()
        # SHOW BINARY LOG STATUS on MySQL 8.2+ (SHOW MASTER STATUS is gone in 8.4)
        self.binlog_status = flavour_of(self.conn.get_server_info()).statements.binlog_status

    def close(self) -> None:
        close_connection(self.conn)

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return fetch_all(self.conn, self.cfg, sql, params)

    def scalar(self, sql: str) -> Any:
        rows = self.query(sql)
        return rows[0][0] if rows else None

    # -- positions -----------------------------------------------------------
    def consistent_read(self) -> Position | None:
        """Start a read-only transaction with a consistent snapshot (the
        read view is taken now); the binlog position matching that view
        where the server reports one (MariaDB's ``Binlog_snapshot_file`` and
        ``_position``), else None."""
        self.query("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        if not self.is_mariadb:
            return None
        status = {str(k): v for k, v in self.query("SHOW STATUS LIKE 'binlog_snapshot_%'")}
        if not status.get("Binlog_snapshot_file"):
            return None
        return Position(str(status["Binlog_snapshot_file"]), int(status["Binlog_snapshot_position"]))

    def binlog_end(self) -> Position:
        rows = self.query(self.binlog_status)
        if not rows:
            raise SnapshotError(f"{self.binlog_status} is empty on the source: its binlog is off",
                                hint="enable log_bin on the source")
        return Position(str(rows[0][0]), int(rows[0][1]))

    def binlog_filters(self) -> tuple[list[str], list[str]]:
        """(Binlog_Do_DB, Binlog_Ignore_DB) of the source."""
        rows = self.query(self.binlog_status)
        if not rows or len(rows[0]) < 4:
            return [], []
        return _names(rows[0][2]), _names(rows[0][3])

    # -- tables ----------------------------------------------------------------
    def describe(self, database: str, table: str) -> TableInfo:
        rows = self.query(
            "SELECT ENGINE, TABLE_ROWS, TABLE_TYPE, AVG_ROW_LENGTH FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (database, table))
        if not rows:
            raise SnapshotError(f"table {database}.{table} does not exist on the source {self.cfg.host}:{self.cfg.port}",
                                hint="check the name given to --tables (db.table, case-sensitive)")
        engine, est, ttype, avg = rows[0]
        if ttype != "BASE TABLE":
            raise SnapshotError(f"{database}.{table} is a {str(ttype).lower()}, not a table: it has no rows of its own "
                                "in the binlog", hint=f"leave {database}.{table} out of --tables")
        cols = self.query(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (database, table))
        pk = self.query(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (database, table))
        return table_info(database, table, [(str(n), str(t)) for n, t in cols], [str(r[0]) for r in pk],
                          str(engine or ""), int(est or 0), int(avg or 0),
                          () if pk else self.secondary_indexes(database, table))

    def secondary_indexes(self, database: str, table: str) -> tuple[tuple[str, ...], ...]:
        """The table's plain B-tree indexes, each its column names in order,
        unique ones first: what a target can build on whole columns (a
        prefix, an expression, a FULLTEXT or SPATIAL index is left out)."""
        rows = self.query(
            "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART, INDEX_TYPE FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME <> 'PRIMARY' "
            "ORDER BY NON_UNIQUE, INDEX_NAME, SEQ_IN_INDEX", (database, table))
        return whole_column_indexes([(str(n), None if c is None else str(c), s is not None, str(t or ""))
                                     for n, c, s, t in rows])

    def base_tables(self) -> list[tuple[str, str]]:
        """Every base table outside the system schemas, (db, table) sorted."""
        marks = ",".join(["%s"] * len(_SYSTEM_SCHEMAS))
        rows = self.query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
            f"WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN ({marks}) ORDER BY 1, 2", _SYSTEM_SCHEMAS)
        return [(str(d), str(t)) for d, t in rows]


def driver_error(exc: BaseException) -> bool:
    """Is ``exc`` a DB-API error of one of the drivers?  (Their hierarchies
    are separate classes: by module, without importing mysqlclient.)"""
    if isinstance(exc, pymysql.err.Error):
        return True
    mod = type(exc).__module__
    return mod == "MySQLdb" or mod.startswith(("MySQLdb.", "_mysql"))


def _names(listed: object) -> list[str]:
    """'a,b' (a SHOW MASTER STATUS filter column) -> ['a', 'b']."""
    return [x for x in str(listed or "").split(",") if x]
