"""BinlogSource: the binlog as a stream of basic-typed events.

The only module that reads with pymysqlreplication.  It checks the source's
settings, resolves where to start, refuses a purged position loudly, and
turns every raw event into a ``SourceEvent`` through the kinds table.

Two readers give the same SourceEvents: the compiled one (parser/creader.py,
cynomys._reader: the protocol's packets and the events read in C, in
batches) when the compiled hot path is selected, and the library's reader,
event by event (the reference, ``CYNOMYS_PURE_PYTHON=1``), which the
compiled one also hands what it does not read itself.
"""
from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator

import pymysql
from pymysql.protocol import MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication import event as rp_event
from pymysqlreplication import row_event as rp_row
from pymysqlreplication.packet import BinLogPacketWrapper

from cynomys.core.config import SourceConfig
from cynomys.core.errors import (
    PositionLostError,
    SourceConfigError,
    SourceUnavailableError,
    UnsupportedEventError,
)
from cynomys.core.flavour import Flavour, flavour_of
from cynomys.core.model import Position, Row, TableSchema
from cynomys.core.tls import source_connect_args, source_tls_error
from cynomys.parser import containers, creader, mysql8
from cynomys.parser import raw as R
from cynomys.parser.files import ArchiveInspector, FileReader, expand
from cynomys.parser.kinds import (
    MARIADB_ZLIB,
    MYSQL_GTID,
    MYSQL_GTID_TAGGED,
    PREVIOUS_GTIDS,
    ZSTD_PAYLOAD,
    Basic,
    classify_query,
    kind_of,
)
from cynomys.parser.rows import TableDecoder
from cynomys.parser.tablemap import CachedTableMapEvent
from cynomys.parser.tablemap import install as _install_tablemap_cache

log = logging.getLogger(__name__)

# Every event class the library has, so that it filters nothing away silently
# (its default list leaves out INTVAR, which matters for statement detection).
_ALL_EVENT_CLASSES = frozenset(
    c for mod in (rp_event, rp_row) for c in vars(mod).values()
    if isinstance(c, type) and issubclass(c, rp_event.BinLogEvent) and c is not rp_event.BinLogEvent
    and c is not rp_row.RowsEvent
) | {CachedTableMapEvent}
_TABLEMAP_CACHED = _install_tablemap_cache()

# Client errors that mean "the server went away": retry later.
_CONNECTION_ERRORS = {2003, 2006, 2013, 2055, 1053, 1927}
# ER_MASTER_FATAL_ERROR_READING_BINLOG: the requested file/GTID is gone.
_POSITION_LOST = 1236
_MARIADB_GTID_STANDALONE = 1
_PARTIAL_UPDATE_ROWS = 0x27


def _read_ourselves() -> None:
    """MySQL's GTID and PREVIOUS_GTIDS events are read by Cynomys
    (parser/mysql8.py): the library's classes stop before the 8.0 fields
    and misread 8.3's tagged GTID sets (they take the format byte for part
    of a count).  The library then only steps over them.  Its map is
    private (the library is pinned, setup.cfg): if it is not there, the
    library still parses them first, which is harmless for untagged sets."""
    event_map: dict[int, type] | None = getattr(BinLogPacketWrapper, "_BinLogPacketWrapper__event_map", None)
    if event_map is None:
        log.warning("mysql-replication's event map is not the one of version 1.0.17: MySQL 8.3+ tagged "
                    "PREVIOUS_GTIDS events may not be read")
        return
    for code in (0x21, 0x23):  # GTID_LOG_EVENT, PREVIOUS_GTIDS_LOG_EVENT
        event_map[code] = rp_event.NotImplementedEvent


_read_ourselves()


@dataclass
class LibraryContext:
    """What mysql-replication needs to parse one event from its bytes: the
    reading state of the stream (or file) the bytes came from.  The table
    map is the reader's own dict, so a TABLE_MAP parsed here serves the
    ROWS events the reader parses, and the other way round."""

    table_map: dict[int, Any]
    ctl_connection: Any
    mysql_version: tuple[int, ...]
    post_header_lengths: Any
    optional_meta_data: bool = True

    def parse(self, event: bytes) -> Any:
        """Event bytes (header to CRC32 trailer, see raw.build) -> the
        library's event object, or None when the library skips it.  The
        packet is what the server would have sent: an OK byte, then the
        event."""
        wrapper = BinLogPacketWrapper(
            MysqlPacket(b"\x00" + event, "utf8"), self.table_map, self.ctl_connection, self.mysql_version,
            True, _ALL_EVENT_CLASSES, None, None, None, None, False, False, False, self.optional_meta_data, False,
            False, self.post_header_lengths)
        return wrapper.event


def event_bytes(ev: Any) -> tuple[bytes, bool]:
    """A library event's own bytes (header to end) and whether they end with
    a CRC32: the packet keeps all it received after the OK byte."""
    data = bytes(ev.packet.packet.get_all_data()[1:])
    return data, R.header(data).size - R.HEADER_LEN - ev.event_size == R.CHECKSUM_LEN


@dataclass(frozen=True)
class SourceEvent:
    """One binlog event, sorted.  ``start``/``end`` are where it begins and
    where the next event begins (``end`` is the resume point after it)."""

    basic: Basic
    kind: str
    start: Position
    end: Position
    timestamp: int
    gtid: str = ""
    standalone: bool = False        # GTID of a statement with no BEGIN/COMMIT
    database: str = ""
    table: str = ""
    sql: str = ""
    schema: TableSchema | None = None
    rows: list[tuple[Row, Row | None]] = field(default_factory=list)
    why: str = ""
    #: what Cynomys read from the event itself: a MySQL GTID event's fields
    #: (mysql8.Gtid), a PREVIOUS_GTIDS set's text
    detail: Any = None


def _minimal_metadata(ev: Any) -> None:
    """A TABLE_MAP of binlog_row_metadata = MINIMAL: no names, no ENUM/SET
    members, no key.  The library leaves such columns bare; what MINIMAL
    does carry (signedness, character sets) is applied here as the library
    applies it with FULL, and the columns are named by position."""
    meta = ev.optional_metadata
    unsigned = list(getattr(meta, "unsigned_column_list", []) or [])
    charsets = iter(getattr(meta, "charset_collation_list", []) or [])
    enum_set = iter(getattr(meta, "enum_and_set_collation_list", []) or [])
    for i, col in enumerate(ev.columns):
        col.name = f"@{i + 1}"
        if i < len(unsigned) and unsigned[i]:
            col.unsigned = True
        pick = charsets if rp_row.TableMapEvent._is_character_column(col.type, dbms=ev.dbms) else (
            enum_set if rp_row.TableMapEvent._is_enum_or_set_column(col.type) else None)
        charset_id = next(pick, None) if pick is not None else None
        if charset_id is not None:
            encoding, collation, _ = rp_row.find_charset(str(charset_id), dbms=ev.dbms)
            col.collation_name, col.character_set_name = collation, encoding


class TableFilter:
    """include/exclude fnmatch patterns on 'db.table' (case-sensitive, as
    table names are on Linux).  Exclude wins."""

    def __init__(self, include: list[str], exclude: list[str]) -> None:
        self.include = include or ["*.*"]
        self.exclude = exclude
        self._cache: dict[tuple[str, str], bool] = {}

    def __call__(self, database: str, table: str) -> bool:
        key = (database, table)
        hit = self._cache.get(key)
        if hit is None:
            name = f"{database}.{table}"
            hit = any(fnmatch.fnmatchcase(name, p) for p in self.include) and not any(
                fnmatch.fnmatchcase(name, p) for p in self.exclude)
            self._cache[key] = hit
        return hit


def _translate(exc: pymysql.err.MySQLError, cfg: SourceConfig, what: str) -> Exception:
    tls = source_tls_error(exc, cfg)
    if tls is not None:
        return tls
    code = exc.args[0] if exc.args else 0
    if code == _POSITION_LOST:
        return PositionLostError(
            f"the source {cfg.host}:{cfg.port} no longer has the binlog position Cynomys needs ({what}): {exc.args[1:]}",
            hint="the binlog was purged before it was read; re-snapshot the tables (cynomys snapshot) "
                 "and keep binlogs longer (binlog_expire_logs_seconds)",
        )
    if code in _CONNECTION_ERRORS or isinstance(exc, pymysql.err.OperationalError) and code >= 2000:
        return SourceUnavailableError(f"cannot reach the source {cfg.host}:{cfg.port}: {exc}")
    return SourceConfigError(f"source {cfg.host}:{cfg.port} refused {what}: {exc}")


class SourceInspector:
    """A plain SQL connection to the source for settings and positions."""

    def __init__(self, cfg: SourceConfig) -> None:
        self.cfg = cfg
        try:
            self.conn = pymysql.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                                        connect_timeout=int(cfg.connect_timeout_s), autocommit=True,
                                        charset="utf8mb4", **source_connect_args(cfg))
        except pymysql.err.MySQLError as exc:
            raise _translate(exc, cfg, "a connection") from None

    def close(self) -> None:
        self.conn.close()

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        try:
            with self.conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        except pymysql.err.MySQLError as exc:
            raise _translate(exc, self.cfg, sql) from None

    def variables(self, *names: str) -> dict[str, str]:
        rows = self.query("SHOW GLOBAL VARIABLES WHERE Variable_name IN ("
                          + ",".join(f"'{n}'" for n in names) + ")")
        return {str(k).lower(): str(v) for k, v in rows}

    @property
    def is_mariadb(self) -> bool:
        return self.flavour.name == "mariadb"

    @property
    def flavour(self) -> Flavour:
        """MySQL or MariaDB, which version, and so which statements (core/flavour.py)."""
        return flavour_of(self.conn.get_server_info())

    def server_identity(self) -> str:
        """Which server this is, for telling binlog positions of two servers
        apart (a failover): MySQL's ``server_uuid``, else (MariaDB has none)
        ``server_id``, which replication requires to be unique among the
        servers of one topology."""
        have = self.variables("server_uuid", "server_id")
        if have.get("server_uuid"):
            return have["server_uuid"]
        return f"server_id={have.get('server_id', '?')}"

    def check_settings(self) -> None:
        """Refuse to start on a source that cannot give full, typed row images."""
        want = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
        have = self.variables(*want)
        bad = [f"{k}={have.get(k, '<unset>')} (need {v})" for k, v in want.items() if have.get(k, "").upper() != v]
        if bad:
            fix = "; ".join(f"SET GLOBAL {k}={v}" for k, v in want.items() if k != "log_bin" and have.get(k, "").upper() != v)
            raise SourceConfigError(
                f"source {self.cfg.host}:{self.cfg.port} is not set up for row-based capture: " + ", ".join(bad),
                hint=(fix + " and put the same settings in the server's config file" if fix else "")
                + ("; enable the binlog with log_bin in the server's config file and restart it"
                   if have.get("log_bin", "").upper() != "ON" else ""),
            )
        self._check_replica_logs()

    def _check_replica_logs(self) -> None:
        """A replica writes what it replicates into its own binlog only with
        log_slave_updates (MariaDB's default: OFF; MySQL 8's log_replica_updates:
        ON): pointed at such a replica, the producer read a binlog holding
        none of the primary's changes, and replicated nothing without a word.
        Whether it replicates is read where the usual grants can read it
        (``Slaves_running``; SHOW SLAVE STATUS needs SLAVE MONITOR)."""
        have = self.variables("log_slave_updates", "log_replica_updates")
        if any(v.upper() in ("ON", "1") for v in have.values()):
            return
        try:
            if self.is_mariadb:
                rows = self.query("SHOW GLOBAL STATUS WHERE Variable_name = 'Slaves_running'")
                running = int(rows[0][1]) if rows else 0
            else:
                rows = self.query("SELECT COUNT(*) FROM performance_schema.replication_applier_status "
                                  "WHERE SERVICE_STATE = 'ON'")
                running = int(rows[0][0]) if rows else 0
        except (SourceConfigError, ValueError):
            return  # not readable with these grants: nothing to tell
        if running:
            name = "log_replica_updates" if "log_replica_updates" in have else "log_slave_updates"
            raise SourceConfigError(
                f"source {self.cfg.host}:{self.cfg.port} is a replica with {name}=OFF: its binlog holds only what "
                "is written on it, none of the changes it replicates, so they would never reach the target",
                hint=f"set {name}=ON in the server's config file and restart it, or point [source] at its primary")

    def binlogs(self) -> list[tuple[str, int]]:
        return [(str(r[0]), int(r[1])) for r in self.query(self.flavour.statements.binary_logs)]

    def binlog_filters(self) -> tuple[list[str], list[str]] | None:
        """The databases the server's own binlog filters keep and leave out
        (binlog_do_db, binlog_ignore_db): their changes never reach the binlog."""
        rows = self.query(self.flavour.statements.binlog_status)
        if not rows or len(rows[0]) < 4:
            return None

        def names(v: object) -> list[str]:
            return [n.strip() for n in str(v or "").split(",") if n.strip()]
        return names(rows[0][2]), names(rows[0][3])

    def cascading_foreign_keys(self) -> list[tuple[object, ...]] | None:
        """information_schema's foreign keys whose actions change rows
        (producer/foreign_keys.py): child database, table, key name, parent
        database, table, delete rule, update rule.  None on a MySQL whose
        foreign keys run in the SQL layer, which logs what they change."""
        if not self.is_mariadb and self.variables("innodb_native_foreign_keys").get(
                "innodb_native_foreign_keys", "ON").upper() in ("OFF", "0"):
            return []
        return [tuple(r) for r in self.query(
            "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, UNIQUE_CONSTRAINT_SCHEMA, REFERENCED_TABLE_NAME, "
            "DELETE_RULE, UPDATE_RULE FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE DELETE_RULE IN "
            "('CASCADE', 'SET NULL', 'SET DEFAULT') OR UPDATE_RULE IN ('CASCADE', 'SET NULL', 'SET DEFAULT')")]

    def table_names(self) -> list[tuple[str, str]] | None:
        """Every table and view on the server, as it spells them (database, table)."""
        return [(str(d), str(t)) for d, t in self.query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA NOT IN "
            "('mysql', 'information_schema', 'performance_schema', 'sys')")]

    def current(self) -> Position:
        statement = self.flavour.statements.binlog_status
        rows = self.query(statement)
        if not rows:
            raise SourceConfigError(f"{statement} is empty: the binlog is off", hint="enable log_bin")
        gtid = ""
        if self.is_mariadb:
            gtid = self.variables("gtid_binlog_pos").get("gtid_binlog_pos", "")
        elif len(rows[0]) > 4:
            gtid = str(rows[0][4] or "")
        return Position(str(rows[0][0]), int(rows[0][1]), gtid)

    def earliest(self) -> Position:
        logs = self.binlogs()
        return Position(logs[0][0], 4)

    def ensure_available(self, pos: Position) -> None:
        """A checkpoint whose file was purged must fail loudly, never skip."""
        logs = dict(self.binlogs())
        if pos.file not in logs:
            oldest = min(logs, key=lambda f: Position(f, 4).sort_key()) if logs else "none"
            raise PositionLostError(
                f"binlog file {pos.file} (checkpoint {pos}) is no longer on the source "
                f"{self.cfg.host}:{self.cfg.port}; its oldest binlog is {oldest}",
                hint="changes between the checkpoint and the oldest binlog are lost to the log: re-snapshot the "
                     "tables (cynomys snapshot) or remove the producer state to start anew; keep binlogs longer "
                     "(binlog_expire_logs_seconds)",
            )
        if pos.pos > logs[pos.file] and pos.file == max(logs, key=lambda f: Position(f, 4).sort_key()):
            raise PositionLostError(
                f"checkpoint {pos} is beyond the end of {pos.file} ({logs[pos.file]} bytes) on the source: "
                "the source's binlog was reset or belongs to another server",
                hint="check that [source] points at the right server; re-snapshot if its binlog was reset",
            )

    def resolve_start(self, start: str) -> Position:
        if start == "current":
            return self.current()
        if start == "earliest":
            return self.earliest()
        try:
            return Position.parse(start)
        except ValueError:
            raise SourceConfigError(
                f"[source] start = {start!r} is not 'current', 'earliest' or 'file:pos'") from None


def _parse_file_event(reader: FileReader, event: bytes) -> Any:
    return LibraryContext(reader.table_map, reader._ctl_connection, reader.mysql_version,
                          reader.post_header_lengths).parse(event)


def open_inspector(cfg: SourceConfig) -> SourceInspector | ArchiveInspector:
    """The source's settings and positions: the server's, or with ``[source]
    binlog_files`` the archived files'."""
    return ArchiveInspector(cfg.binlog_files) if cfg.binlog_files else SourceInspector(cfg)


class BinlogSource:
    """Reads the binlog from ``start`` and yields SourceEvents."""

    def __init__(self, cfg: SourceConfig, start: Position, *, blocking: bool = True,
                 is_mariadb: bool = True, table_filter: TableFilter | None = None,
                 reader: FileReader | None = None, positional_names: bool = False) -> None:
        """``reader``: read binlog files instead of the server (by default
        the files of ``[source] binlog_files`` when it is set);
        ``positional_names``: accept TABLE_MAPs without column names
        (binlog_row_metadata = MINIMAL) and name columns @1, @2, ... (for
        `cynomys decode`; a target needs the real names)."""
        self.cfg = cfg
        self.start = start
        self.filter = table_filter or TableFilter(cfg.include_tables, cfg.exclude_tables)
        self.decoders: dict[int, tuple[Any, TableDecoder, TableSchema]] = {}
        self.positional_names = positional_names
        self.file = start.file
        self.pos = start.pos
        # The compiled reader's driver (parser/creader.py), when it reads.
        self._driver: creader.Stream | creader.Files | None = None
        self._compiled = creader.available()  # chosen once: the path selected now
        if reader is None and cfg.binlog_files:
            reader = FileReader(expand(cfg.binlog_files), start)
        self.reader: Any
        if reader is not None:
            reader.set_parser(_parse_file_event)
            self.reader = reader
            return
        settings = {"host": cfg.host, "port": cfg.port, "user": cfg.user, "password": cfg.password,
                    "connect_timeout": int(cfg.connect_timeout_s), **source_connect_args(cfg)}
        # mysql-replication's MariaDB dump request ignores log_file/log_pos
        # (it asks for position 4 of an empty file name: the oldest binlog),
        # so file/pos resumption must use the classic COM_BINLOG_DUMP, which
        # MariaDB serves too.  The MariaDB request is used for GTID only.
        gtid = cfg.use_gtid and bool(start.gtid)
        kwargs: dict[str, Any] = dict(
            connection_settings=settings, server_id=cfg.server_id, blocking=blocking,
            only_events=list(_ALL_EVENT_CLASSES), filter_non_implemented_events=False,
            is_mariadb=is_mariadb and gtid, slave_heartbeat=cfg.heartbeat_s, enable_logging=False,
            resume_stream=True, log_file=start.file, log_pos=start.pos,
        )
        if gtid:
            kwargs.update(auto_position=start.gtid, log_file=None, log_pos=None)
        self.reader = BinLogStreamReader(**kwargs)

    @property
    def compiled(self) -> bool:
        """Whether this source reads with the compiled reader (in batches)."""
        return self._compiled

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()  # a read blocked on the socket returns
        try:
            self.reader.close()
        except pymysql.err.Error as exc:
            # "Already closed": the stream closed itself (the reader thread
            # hit an error or the end); closing twice must not replace the
            # error the producer is stopping for.
            log.debug("binlog stream already closed: %s", exc)

    def __iter__(self) -> Iterator[SourceEvent]:
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[SourceEvent]]:
        """The events in batches, in binlog order: the compiled reader's as
        it reads them (as many as have arrived, up to creader.MAX_EVENTS),
        the library's one by one."""
        if not self._compiled:
            for ev in self._library_events():
                yield [ev]
            return
        yield from self._compiled_driver().batches()

    def next_batch(self, timeout: float | None) -> list[SourceEvent] | None:
        """The compiled reader's next batch, read on the caller's thread: []
        when nothing came within ``timeout`` seconds (None: as long as it
        takes), None at the end (of a non-blocking read, or of the files)."""
        return self._compiled_driver().next_batch(timeout)

    def _compiled_driver(self) -> creader.Stream | creader.Files:
        assert self._compiled, "the compiled reader is not selected for this source"
        if self._driver is None:
            self._driver = creader.Files(self, self.reader) if isinstance(self.reader, FileReader) else \
                creader.Stream(self, self.reader)
        return self._driver

    def _library_events(self) -> Iterator[SourceEvent]:
        """The reference: mysql-replication's events, sorted here."""
        live = not isinstance(self.reader, FileReader)
        while True:
            try:
                ev = self.reader.fetchone()
            except pymysql.err.MySQLError as exc:
                raise _translate(exc, self.cfg, f"the binlog from {self.file}:{self.pos}") from None
            except (OSError, EOFError) as exc:
                raise SourceUnavailableError(f"lost the binlog connection to {self.cfg.host}:{self.cfg.port}: {exc}") from None
            if ev is None:
                return
            if live:
                self._check_crc(ev)  # (FileReader checks the files' own)
            kind = kind_of(ev.event_type)
            if kind.decoder:
                yield from self._own(ev, kind.decoder, None)
                continue
            out = self._convert(ev)
            if out is not None:
                yield out

    def _check_crc(self, ev: Any) -> None:
        """A live event's CRC32 trailer, checked as the server's own reader
        checks it (a FORMAT_DESCRIPTION's in-use flag is set after its
        checksum was computed; parser/files.py)."""
        data, checksum = event_bytes(ev)
        if checksum and not R.crc_ok(data):
            raise creader.event_error("crc", 0, f"{self.file}:{self.pos}", f"{self.cfg.host}:{self.cfg.port}")

    def _context(self, ev: Any) -> LibraryContext:
        if self._driver is not None:
            return self._driver._ctx()
        reader = self.reader
        return LibraryContext(reader.table_map, reader._ctl_connection, reader.mysql_version,
                              getattr(ev, "_post_header_lengths", None))

    def _span(self, ev: Any, span: tuple[Position, Position] | None) -> tuple[Position, Position]:
        """Where an event is: its own place, or (inside a container) the
        container's; reading moves past it."""
        if span is not None:
            return span
        pkt = ev.packet
        self.pos = pkt.log_pos
        return Position(self.file, pkt.log_pos - pkt.event_size), Position(self.file, pkt.log_pos)

    def _own(self, ev: Any, decoder: str, span: tuple[Position, Position] | None) -> Iterator[SourceEvent]:
        """An event Cynomys reads from its bytes (Kind.decoder)."""
        start, end = self._span(ev, span)
        data, checksum = event_bytes(ev)
        body = data[R.HEADER_LEN:len(data) - (R.CHECKSUM_LEN if checksum else 0)]
        kind = kind_of(ev.event_type)
        where = str(start)
        if decoder in (MYSQL_GTID, MYSQL_GTID_TAGGED):
            info = mysql8.parse_tagged_gtid(body, where) if decoder == MYSQL_GTID_TAGGED else \
                mysql8.parse_gtid(body, ev.event_type == mysql8.ANONYMOUS_GTID, where)
            yield SourceEvent(Basic.BEGIN, kind.name, start, end, ev.timestamp, gtid=info.gtid, detail=info)
            return
        if decoder == PREVIOUS_GTIDS:
            yield SourceEvent(Basic.INFO, kind.name, start, end, ev.timestamp,
                              detail=mysql8.parse_previous_gtids(body, where))
            return
        ctx = self._context(ev)
        if decoder == MARIADB_ZLIB:
            lengths = ctx.post_header_lengths
            post = lengths[ev.event_type - 1] if lengths and len(lengths) >= ev.event_type else None
            inner = [containers.mariadb_uncompress(data, post, checksum, where)]
        elif decoder == ZSTD_PAYLOAD:
            inner = mysql8.payload_events(body, where)
        else:
            raise AssertionError(f"no decoder {decoder!r}")
        yield from self._unpacked(inner, ctx, start, end)

    def _unpacked(self, inner: list[bytes], ctx: LibraryContext, start: Position, end: Position
                  ) -> Iterator[SourceEvent]:
        """A container's events, parsed by the library from their bytes and
        sorted as if the server had written them plainly.  They all take
        the container's place in the binlog: only the last ends where it
        ends, so a checkpoint never falls inside it (a restart reads the
        container again, from its start, and skips what was shipped)."""
        for i, event in enumerate(inner):
            lib = ctx.parse(event)
            if lib is None:
                continue
            span = (start, end if i == len(inner) - 1 else start)
            kind = kind_of(lib.event_type)
            if kind.decoder:
                yield from self._own(lib, kind.decoder, span)
                continue
            out = self._convert(lib, span)
            if out is not None:
                yield out

    # ------------------------------------------------------------------
    def _convert(self, ev: Any, span: tuple[Position, Position] | None = None) -> SourceEvent | None:
        """One library event -> SourceEvent.  ``span``: where it is in the
        binlog when it is not where its header says (an unpacked event)."""
        kind = kind_of(ev.event_type)
        pkt = ev.packet
        if kind.basic is Basic.ROTATE:
            # The rotate names the next file; the reader already follows it.
            self.file, self.pos = ev.next_binlog, ev.position
            here = Position(self.file, self.pos)
            return SourceEvent(Basic.ROTATE, kind.name, here, here, ev.timestamp)
        log_pos = pkt.log_pos
        if span is not None:
            start, end = span
        elif ev.event_type == 0x0F or not log_pos:
            # A FORMAT_DESCRIPTION re-sent on connect carries its original
            # offset, not ours: it must not move the position backwards.
            here = Position(self.file, self.pos)
            return SourceEvent(Basic.INFO, kind.name, here, here, ev.timestamp)
        else:
            start = Position(self.file, log_pos - pkt.event_size)
            end = Position(self.file, log_pos)
            self.pos = log_pos
        basic = kind.basic
        if ev.event_type == 0x02:  # QUERY: sorted by its statement text
            sql = ev.query
            rule = classify_query(sql)
            db = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema or "")
            return SourceEvent(rule.basic, kind.name, start, end, ev.timestamp, sql=sql, database=db, why=rule.why)
        if basic is Basic.BEGIN:
            gtid = getattr(ev, "gtid", "") or ""
            standalone = bool(getattr(ev, "flags", 0) & _MARIADB_GTID_STANDALONE) if ev.event_type == 0xA2 else False
            return SourceEvent(Basic.BEGIN, kind.name, start, end, ev.timestamp, gtid=str(gtid), standalone=standalone)
        if basic is Basic.TABLE_MAP:
            self._remember_table(ev)
            return None
        if basic in (Basic.INSERT, Basic.UPDATE, Basic.DELETE):
            return self._rows(ev, kind.name, basic, start, end)
        return SourceEvent(basic, kind.name, start, end, ev.timestamp, why=kind.why)

    def _remember_table(self, ev: Any) -> tuple[Any, TableDecoder, TableSchema] | None:
        """The table's decoder for the rows that follow (None: filtered out)."""
        if not self.filter(ev.schema, ev.table):
            # Not another table's decoder left under this id (ids are reused
            # after a server restart): its rows are skipped.
            self.decoders.pop(ev.table_id, None)
            return None
        body = getattr(ev, "body", None)
        cached = self.decoders.get(ev.table_id)
        if body is not None and cached is not None and cached[0] == body:
            return cached  # the same TABLE_MAP as last time (every transaction repeats it)
        meta = getattr(ev, "optional_metadata", None)
        pk = list(getattr(meta, "simple_primary_key_list", []) or [])
        if not pk and meta is not None and getattr(meta, "primary_keys_with_prefix", None):
            pk = list(meta.primary_keys_with_prefix)
        if any(c.name is None for c in ev.columns) and self.positional_names:
            _minimal_metadata(ev)
        if any(c.name is None for c in ev.columns):
            raise SourceConfigError(
                f"TABLE_MAP for {ev.schema}.{ev.table} has no column names",
                hint="SET GLOBAL binlog_row_metadata=FULL on the source (MariaDB >= 10.5, MySQL >= 8.0.1)")
        # Table ids are reused after DDL and restarts, so a cached decoder
        # is kept only while the column metadata is byte-for-byte the same:
        # the event's body when the library gives it (parser/tablemap.py),
        # else what it parsed from it.
        sig: Any = body if body is not None else (
            ev.schema, ev.table, tuple((c.type, c.name, tuple(sorted((k, str(v)) for k, v in vars(c).items())))
                                       for c in ev.columns), tuple(pk))
        if cached is None or cached[0] != sig:
            dec = TableDecoder.from_table_map(ev.columns, pk)
            cached = self.decoders[ev.table_id] = (sig, dec, TableSchema(ev.schema, ev.table, dec.columns, dec.key))
        return cached

    def _rows(self, ev: Any, kind: str, basic: Basic, start: Position, end: Position) -> SourceEvent | None:
        entry = self.decoders.get(ev.table_id)
        if entry is None:
            return None  # table filtered out (its TABLE_MAP was not remembered)
        _, dec, schema = entry
        if not getattr(ev, "_processed", True):
            raise UnsupportedEventError(f"ROWS event for table id {ev.table_id} at {end} has no TABLE_MAP")
        pkt = ev.packet
        body = pkt.read(ev.event_size - pkt.read_bytes)
        present = int.from_bytes(ev.columns_present_bitmap, "little")
        if basic is Basic.UPDATE and ev.columns_present_bitmap2 != ev.columns_present_bitmap:
            raise UnsupportedEventError(
                f"UPDATE on {ev.schema}.{ev.table} at {end} has a partial after-image",
                hint="SET GLOBAL binlog_row_image=FULL on the source")
        if ev.event_type == _PARTIAL_UPDATE_ROWS:
            rows = dec.partial_rows(body, present, f"{ev.schema}.{ev.table} at {start}")
        else:
            rows = dec.rows(body, present, basic is Basic.UPDATE)
        return SourceEvent(basic, kind, start, end, ev.timestamp, database=ev.schema, table=ev.table,
                           schema=schema, rows=rows)
