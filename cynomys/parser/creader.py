"""The compiled binlog reader's Python side: BinlogSource's events in batches.

``cynomys._reader`` (cynomys/_reader.c) reads the binlog's bytes -- the
replication protocol's packets from the socket that mysql-replication
opened, or binlog files -- and makes the SourceEvents itself, many per call,
with the GIL released while it reads, frames and checks CRC32s.  This module
drives it for a ``BinlogSource``:

- ``Stream``: the live binlog.  mysql-replication connects (handshake,
  authentication, ``SET @master_binlog_checksum``, the heartbeat period,
  COM_BINLOG_DUMP or the GTID dump); then the reader takes the socket.  A
  TLS socket is read through its ``recv_into`` (framing still in C).
- ``Files``: archived binlog files.  ``FileReader`` still plans the files,
  opens each (its FORMAT_DESCRIPTION, the ROTATE made up for it, the checks
  that no file is missing); the reader reads the events of each.

The reader hands back (the batch's last item) what the Python path reads:
events of a ``Kind.decoder`` (MariaDB's compressed events, MySQL's GTID and
payload events: ``BinlogSource._own``), FORMAT_DESCRIPTIONs (their
post-header lengths), a TABLE_MAP body seen for the first time
(``BinlogSource._remember_table``; the reader then knows the body), and
anything unusual, which the library parses and BinlogSource sorts exactly
as on the Python path -- the same result, or the same error.  Damage and a
lost connection come back as the errors the Python path raises for them.

What differs from the library's reader, on purpose: a lost connection is a
``SourceUnavailableError`` (the producer resumes from its checkpoint) where
mysql-replication reconnected by itself (from its own idea of the position;
by GTID, from the start GTID again); a ROWS event whose table was never
mapped stops the reader where the library dropped the event silently; and
live events' CRC32 trailers are checked (the library did not; BinlogSource
now checks them on both paths).
"""
from __future__ import annotations

import collections
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pymysql

from cynomys.core import compiled
from cynomys.core.errors import SourceUnavailableError, UnsupportedEventError
from cynomys.core.model import Position
from cynomys.parser import raw as R
from cynomys.parser.kinds import Basic, classify_query, kind_of

if TYPE_CHECKING:
    from cynomys.parser.files import FileReader
    from cynomys.parser.stream import BinlogSource, LibraryContext, SourceEvent

log = logging.getLogger(__name__)

#: Events per batch at most, and decoded rows per batch at most (a batch of
#: 1000-row INSERTs stops after a few events: the queue behind the reader
#: holds batches, so this bounds its memory).
MAX_EVENTS = 256
MAX_ROWS = 4096

# How the reader treats a kind (the enum in _reader.c).
_HOW_HERE, _HOW_DECODER, _HOW_LIBRARY = 0, 1, 2
# Kinds the reader reads itself (_reader.c event()).
_READ_IN_C = frozenset({0x02, 0x04, 0x0F, 0x13, 0x17, 0x18, 0x19, 0x1E, 0x1F, 0x20, 0xA2})
_LIBRARY_BASICS = frozenset({Basic.TABLE_MAP, Basic.INSERT, Basic.UPDATE, Basic.DELETE, Basic.BEGIN})
# A TLS socket is read with this timeout, so that close() is seen.
_TLS_POLL_S = 0.2
_CLASSIFIED_MAX = 1024


def kinds_table() -> tuple[tuple[Basic, str, str, int], ...]:
    """parser/kinds.py as the reader takes it: per code 0-255 (basic, name,
    why, how).  Unknown codes are HALT, as ``kind_of`` makes them."""
    out = []
    for code in range(256):
        k = kind_of(code)
        how = _HOW_DECODER if k.decoder else (
            _HOW_LIBRARY if k.basic in _LIBRARY_BASICS and code not in _READ_IN_C else _HOW_HERE)
        out.append((k.basic, k.name, k.why, how))
    return tuple(out)


_KINDS = kinds_table()
_classified: dict[str, tuple[Basic, str]] = {}


def classify(sql: str) -> tuple[Basic, str]:
    """A QUERY's statement -> (basic, why) by QUERY_RULES; the same texts
    (BEGIN, COMMIT) come again and again."""
    hit = _classified.get(sql)
    if hit is None:
        rule = classify_query(sql)
        hit = (rule.basic, rule.why)
        if len(sql) <= 64:
            if len(_classified) >= _CLASSIFIED_MAX:
                _classified.clear()
            _classified[sql] = hit
    return hit


def available() -> bool:
    """Whether BinlogSource reads with the compiled reader (the selected
    hot path is compiled and cynomys._reader imports)."""
    return compiled.reader is not None


def new_reader(source: Any, mode: str, *, checksums: bool, seq: int, start: Position, table_map: dict[int, Any],
               decoders: dict[int, Any]) -> Any:
    """A cynomys._reader.Reader: ``mode`` "socket" (``source``: the socket's
    file descriptor, the replication stream already asked for; ``seq``: the
    sequence id of the server's first packet), "socket_py" (``source``: a
    socket object read through ``recv_into``: TLS) or "file" (``set_file``
    gives it each file); ``checksums``: events end with a CRC32; ``start``:
    the position before the first event; ``table_map``: the library's table
    map and ``decoders`` BinlogSource's, which it keeps in step."""
    mod = compiled.reader
    assert mod is not None, "the compiled reader is not selected"
    speed = compiled.ext
    from cynomys.parser.stream import SourceEvent

    return mod.Reader(source, mode, checksums, seq, start.file, start.pos, _KINDS, SourceEvent, Position, classify,
                      speed.decode_rows if speed is not None else None,
                      speed.Fallback if speed is not None else None, Basic.INFO, table_map, decoders)


class _Driver:
    """What both drivers share: the reader's items -> batches of SourceEvents,
    pulled one at a time (``next_batch``) by whoever reads: the producer's
    loop itself (no reader thread: producer/loop.py) or ``batches()``."""

    def __init__(self, source: BinlogSource) -> None:
        self.source = source
        self.reader: Any = None
        self.closed = False
        self._ready: collections.deque[list[SourceEvent]] = collections.deque()
        self._ended = False
        # An error met after events that are still to be handed on: raised
        # once they are (the Python path raises at the event, after them).
        self._error: BaseException | None = None

    def close(self) -> None:
        self.closed = True
        if self.reader is not None:
            self.reader.close()

    def next_batch(self, timeout: float | None) -> list[SourceEvent] | None:
        """The next events, in binlog order: a batch; [] when nothing came
        within ``timeout`` seconds (None: wait as long as it takes); None at
        the end of the input (a non-blocking dump's or the files' end) or
        once closed."""
        while True:
            if self._ready:
                return self._ready.popleft()
            if self._error is not None:
                raise self._error
            if self._ended or self.closed:
                return None
            if not self._step(timeout):
                return []

    def batches(self) -> Iterator[list[SourceEvent]]:
        while True:
            batch = self.next_batch(None)
            if batch is None:
                return
            if batch:
                yield batch

    def _step(self, timeout: float | None) -> bool:
        """Read once; False when nothing came within ``timeout``."""
        raise NotImplementedError

    def _ctx(self) -> LibraryContext:
        raise NotImplementedError

    def _error_for(self, what: str, detail: int, offset: int) -> Exception:
        raise NotImplementedError

    def _end_of_file(self) -> None:
        self._ended = True

    def _read(self, timeout: float | None) -> bool:
        """One read of the reader: its batches queued, a handoff done, an
        error kept for after the events before it.  False: nothing came."""
        reader, src = self.reader, self.source
        items = reader.read(MAX_EVENTS, MAX_ROWS, timeout)
        src.file, src.pos = reader.file, reader.pos
        if not items:
            if self.closed:
                self._ended = True
            return False
        last = items[-1]
        if type(last) is not tuple:
            self._ready.append(items)
            return True
        if len(items) > 1:
            self._ready.append(items[:-1])
        tag = last[0]
        try:
            if tag == "handoff":
                out = self._handoff(last[1], last[2], last[3], last[4])
                src.file, src.pos = reader.file, reader.pos
                if out:
                    self._ready.append(out)
            elif tag == "eof":
                self._ended = True
            elif tag == "file_end":
                self._end_of_file()
            elif tag == "server_error":
                try:
                    pymysql.err.raise_mysql_exception(last[1])
                except pymysql.err.MySQLError as exc:
                    from cynomys.parser.stream import _translate

                    raise _translate(exc, src.cfg, f"the binlog from {src.file}:{src.pos}") from None
                raise AssertionError("raise_mysql_exception returned")
            else:
                raise self._error_for(last[1], last[2], last[3])
        except Exception as exc:  # after the events read before it
            self._error = exc
        return True

    def _handoff(self, code: int, event: bytes, start: Position, end: Position) -> list[SourceEvent]:
        """One event for the Python path, placed at start/end by the reader."""
        src = self.source
        if not self.reader.checksums:
            # The library parses events as a server with CRC32 trailers sends them (raw.build).
            event = R.build(R.header(event), event[R.HEADER_LEN:])
        ctx = self._ctx()
        lib = ctx.parse(event)
        if lib is None:
            return []  # the library skips it, as on the Python path
        kind = kind_of(code)
        if code == R.FORMAT_DESCRIPTION:
            self._format(lib)
        if kind.decoder:
            return list(src._own(lib, kind.decoder, (start, end)))
        if code == 0x13:  # TABLE_MAP
            entry = src._remember_table(lib)
            body = event[R.HEADER_LEN:len(event) - R.CHECKSUM_LEN]
            self.reader.remember(body, table_entry(lib, entry))
            return []
        out = src._convert(lib, (start, end))
        return [out] if out is not None else []

    def _format(self, lib: Any) -> None:
        """A FORMAT_DESCRIPTION: what later events are read with."""


def table_entry(lib: Any, entry: tuple[Any, Any, Any] | None) -> tuple[Any, ...]:
    """What the reader keeps per TABLE_MAP body (_reader.c E_*): filtered,
    database, table, schema, the compiled plan, the reference decoder, the
    column count, the library's table object, BinlogSource.decoders' entry."""
    if entry is None:
        return (True, lib.schema, lib.table, None, None, None, 0, lib.table_obj, None)
    _, dec, schema = entry
    return (False, lib.schema, lib.table, schema, dec.compiled_plan, dec.rows, len(dec.plan), lib.table_obj,
            entry)


class Stream(_Driver):
    """The live binlog through the compiled reader (see the module doc)."""

    def __init__(self, source: BinlogSource, library_reader: Any) -> None:
        super().__init__(source)
        self.lib = library_reader
        self.table_map: dict[int, Any] = {}
        self.mysql_version: tuple[int, ...] = (0, 0, 0)
        self.post_header_lengths: Any = None
        self.sock: Any = None

    def _connect(self) -> None:
        lib = self.lib
        # mysql-replication's connection steps, without its reading loop
        # (the library is pinned, setup.cfg; stream.py uses its private
        # names the same way).
        lib._BinLogStreamReader__connect_to_stream()
        lib._BinLogStreamReader__connect_to_ctl()
        conn = lib._stream_connection
        sock = conn._sock
        self.sock = sock
        checksums = bool(lib._BinLogStreamReader__use_checksum)
        if type(sock) is socket.socket:
            arg, mode = sock.fileno(), "socket"
        else:  # TLS: read through the ssl module, which decrypts
            sock.settimeout(_TLS_POLL_S)
            arg, mode = sock, "socket_py"
        self.reader = new_reader(arg, mode, checksums=checksums, seq=conn._next_seq_id, table_map=self.table_map,
                                 start=Position(self.source.file, self.source.pos), decoders=self.source.decoders)

    def _step(self, timeout: float | None) -> bool:
        if self.reader is None:
            src = self.source
            try:
                self._connect()
            except pymysql.err.MySQLError as exc:
                from cynomys.parser.stream import _translate

                raise _translate(exc, src.cfg, f"the binlog from {src.file}:{src.pos}") from None
            except (OSError, EOFError) as exc:
                raise SourceUnavailableError(f"lost the binlog connection to {src.cfg.host}:{src.cfg.port}: "
                                             f"{exc}") from None
            if self.closed:  # closed while connecting: the read returns at once
                self.close()
        return self._read(timeout)

    def _ctx(self) -> LibraryContext:
        from cynomys.parser.stream import LibraryContext

        return LibraryContext(self.table_map, self.lib._ctl_connection, self.mysql_version, self.post_header_lengths,
                              bool(self.lib._BinLogStreamReader__optional_meta_data))

    def _format(self, lib: Any) -> None:
        # What mysql-replication's fetchone takes from a FORMAT_DESCRIPTION.
        self.mysql_version = lib.mysql_version
        self.post_header_lengths = lib.post_header_len
        self.reader.post_header = bytes(lib.post_header_len)

    def _error_for(self, what: str, detail: int, offset: int) -> Exception:
        src = self.source
        where = f"{src.cfg.host}:{src.cfg.port}"
        at = f"{src.file}:{src.pos}"
        lost: dict[str, Callable[[], str]] = {
            "lost": lambda: "the server closed the connection",
            "io": lambda: os.strerror(detail),
            "seq": lambda: f"packet sequence number {detail} out of order" if detail else
            "the server is shutting down",
        }
        if what in lost:
            return SourceUnavailableError(f"lost the binlog connection to {where}: {lost[what]()}")
        return event_error(what, detail, at, where)


def event_error(what: str, detail: int, at: str, source: str) -> UnsupportedEventError:
    """The reader's refusals that the library path shares (stream.py)."""
    if what == "no_table_map":
        return UnsupportedEventError(f"ROWS event for table id {detail} at {at} has no TABLE_MAP")
    hint = "the binlog on the source is damaged, or the connection altered it; re-snapshot the tables it covers"
    texts = {"crc": "fails its CRC32 check", "size": f"claims {detail} bytes, less than its header",
             "packet_size": f"is {detail} bytes, not what its header says", "short_rotate": "is a ROTATE too short"}
    return UnsupportedEventError(f"the binlog event at {at} from {source} {texts.get(what, what)}", hint=hint)


class Files(_Driver):
    """Binlog files through the compiled reader: FileReader opens each file
    and checks the files follow each other; the reader reads its events."""

    def __init__(self, source: BinlogSource, files: FileReader) -> None:
        super().__init__(source)
        self.files = files
        self.open = False  # a file is being read

    def _step(self, timeout: float | None) -> bool:
        """Files never wait: a step opens the next file, or reads on."""
        fr = self.files
        if self.reader is None:
            self.reader = new_reader(None, "file", checksums=True, seq=0, table_map=fr.table_map,
                                     start=Position(self.source.file, self.source.pos), decoders=self.source.decoders)
        if not self.open:
            self._open()
            return True
        return self._read(None)

    def _open(self) -> None:
        """The next file: the ROTATE made up for it and its FORMAT_DESCRIPTION
        through the reader, then its events from where reading starts."""
        fr = self.files
        opened = fr._open_next()
        if not opened:
            self._ended = True
            return
        fmt, f = fr.format, fr._file
        assert fmt is not None and f is not None
        rotate, fde = opened
        out: list[SourceEvent] = []
        for event, checksummed in ((rotate, True), (fde, fmt.checksums)):
            for item in self.reader.feed(event, checksummed):
                if type(item) is tuple:  # the FORMAT_DESCRIPTION
                    out.extend(self._handoff(item[1], item[2], item[3], item[4]))
                else:
                    out.append(item)
        self.source.file, self.source.pos = self.reader.file, self.reader.pos
        if out:
            self._ready.append(out)
        self.reader.post_header = bytes(fmt.post_header_lengths)
        self.reader.set_file(f.fileno(), fr._off, fr._stop_at, fmt.checksums)
        self.open = True

    def _end_of_file(self) -> None:
        # What the file's last ROTATE named: the next file must be that one.
        self.files._next_name = self.reader.last_rotate
        self.open = False

    def _ctx(self) -> LibraryContext:
        from cynomys.parser.stream import LibraryContext

        fr = self.files
        return LibraryContext(fr.table_map, fr._ctl_connection, fr.mysql_version, fr.post_header_lengths)

    def _error_for(self, what: str, detail: int, offset: int) -> Exception:
        if what == "io":
            src = self.source
            return SourceUnavailableError(f"lost the binlog connection to {src.cfg.host}:{src.cfg.port}: "
                                          f"{os.strerror(detail)}")
        if what in ("no_table_map", "short_rotate"):
            return event_error(what, detail, f"{self.source.file}:{self.source.pos}", str(self.files._path))
        # FileReader reads the event at the offset again and raises what it
        # raises for it on the Python path.
        return self.files.explain(offset)
