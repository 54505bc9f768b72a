"""Binlog files read offline: archived binlogs replayed like a live stream.

A binlog file is a 4-byte magic (``\\xfebin``) and then events back to
back, each with its common header (parser/raw.py); its first event is the
FORMAT_DESCRIPTION, which says which server wrote it (MySQL or MariaDB, and
the version: charset ids and event layouts depend on it), the post-header
lengths, and whether every event ends with a CRC32.

``FileReader`` hands BinlogSource the same library event objects the
network reader does (parser/stream.py: ``LibraryContext.parse``), in the
same order the server would send them: a ROTATE naming each file (as the
server announces it on connect), then the file's events.  So everything
after the reader -- tables, rows, containers, transactions -- is the live
path's code.  CRC32 trailers are checked (a damaged archive is refused,
never half-read); events of a file written without checksums get one, so
the library reads them like any other.

``ArchiveInspector`` answers the questions the producer asks a source
(where to start, whether a position is there, which server it is) from the
files alone.
"""
from __future__ import annotations

import glob
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from cynomys.core.errors import PositionLostError, SourceConfigError, UnsupportedEventError
from cynomys.core.model import Position
from cynomys.parser import raw as R

log = logging.getLogger(__name__)

MAGIC = b"\xfebin"
FIRST_EVENT = len(MAGIC)
_LOG_EVENT_ARTIFICIAL = 0x20  # the flag of a ROTATE the server makes up (not in the file)
_ALG_CRC32 = 1


def _damaged(path: Path, off: int, what: str) -> UnsupportedEventError:
    return UnsupportedEventError(f"binlog file {path} at {off}: {what}",
                                 hint="the file is damaged or not a binlog; copy it again from the server or backup")


@dataclass(frozen=True)
class Format:
    """What a file's FORMAT_DESCRIPTION says."""

    server_version: str
    version: tuple[int, ...]
    mariadb: bool
    post_header_lengths: tuple[int, ...]
    checksums: bool                 # every event ends with a CRC32
    server_id: int

    @classmethod
    def parse(cls, event: bytes, path: Path) -> Format:
        h = R.header(event)
        if h.type != R.FORMAT_DESCRIPTION:
            raise _damaged(path, FIRST_EVENT, f"the first event is of type 0x{h.type:02X}, not FORMAT_DESCRIPTION")
        body = event[R.HEADER_LEN:]
        text = body[2:52].rstrip(b"\x00").decode("ascii", "replace")
        numbers = text.split("-", 1)[0].split(".")
        version = tuple(int(n) for n in numbers if n.isdigit())
        mariadb = "mariadb" in text.lower()
        # Servers since MySQL 5.6.1 / MariaDB 5.3 end the FORMAT_DESCRIPTION
        # with the checksum algorithm (1 byte) and a 4-byte checksum field.
        aware = version >= (5, 6, 1) or (mariadb and version >= (5, 3)) or version[:1] >= (10,)
        fixed = 2 + 50 + 4 + 1
        tail = 5 if aware else 0
        lengths = tuple(body[fixed:len(body) - tail])
        alg = body[len(body) - 5] if aware else 0
        checksums = alg == _ALG_CRC32
        if checksums and not R.crc_ok(event):
            raise _damaged(path, FIRST_EVENT, "the FORMAT_DESCRIPTION's CRC32 does not match")
        return cls(text, version, mariadb, lengths, checksums, h.server_id)


class OfflineConnection:
    """Stands in for the library's control connection when there is no
    server: the library asks it which kind of server wrote the events
    (MySQL and MariaDB number their collations differently)."""

    charset = "utf8mb4"

    def __init__(self) -> None:
        self.dbms = "mysql"

    def _get_dbms(self) -> str:
        return self.dbms


def binlog_order(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files in binlog order (the number after the last dot), duplicates dropped."""
    unique = {os.path.abspath(p): Path(p) for p in paths}
    return sorted(unique.values(), key=lambda p: Position(p.name, 0).sort_key())


def expand(pattern: str) -> list[Path]:
    """``[source] binlog_files``: the files the glob names, in binlog order
    (index files and other non-binlogs are left out by their magic)."""
    found = [p for p in binlog_order(glob.glob(pattern)) if p.is_file() and _is_binlog(p)]
    if not found:
        raise SourceConfigError(f"[source] binlog_files = {pattern!r} names no binlog file",
                                hint="point it at the archived files (e.g. 'archive/mysql-bin.[0-9]*')")
    return found


def _is_binlog(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == MAGIC


class FileReader:
    """Events of binlog files, one library event at a time (``fetchone``),
    like mysql-replication's BinLogStreamReader.  ``start``: where to begin
    (a file of ``paths`` and an offset in it; files before it are skipped);
    ``stop``: an offset in the last file where reading ends (0: its end)."""

    def __init__(self, paths: Sequence[Path], start: Position | None = None, stop: int = 0,
                 parse: Callable[[FileReader, bytes], Any] | None = None) -> None:
        self.paths = list(paths)
        self.start = start
        self.stop = stop
        self.table_map: dict[int, Any] = {}
        self._ctl_connection = OfflineConnection()
        self.mysql_version: tuple[int, ...] = (0, 0, 0)
        self.post_header_lengths: tuple[int, ...] | None = None
        self.format: Format | None = None
        self._parse = parse
        self._queue = self._plan()
        self._file: BinaryIO | None = None
        self._path: Path | None = None
        self._off = 0
        self._stop_at = 0
        self._next_name: str | None = None   # the file the last ROTATE read names
        self._last: Path | None = None       # the file read before
        self._events: Iterator[tuple[bytes, int]] | None = None

    def _plan(self) -> list[tuple[Path, int]]:
        """(file, first offset) of each file to read."""
        out = []
        for p in self.paths:
            if self.start is not None and self.start.file:
                here = Position(p.name, 0).sort_key()[:2]
                want = Position(self.start.file, 0).sort_key()[:2]
                if here < want:
                    continue
                if here == want:
                    out.append((p, max(self.start.pos, FIRST_EVENT)))
                    continue
            out.append((p, FIRST_EVENT))
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def set_parser(self, parse: Callable[[FileReader, bytes], Any]) -> None:
        self._parse = parse

    # -- events --------------------------------------------------------
    def _read_event(self) -> bytes | None:
        """The next event's bytes at ``_off`` in the open file, None at its end."""
        f, path = self._file, self._path
        assert f is not None and path is not None
        if self._stop_at and self._off >= self._stop_at:
            return None
        head = f.read(R.HEADER_LEN)
        if not head:
            return None
        if len(head) < R.HEADER_LEN:
            raise _damaged(path, self._off, f"the file ends inside an event header ({len(head)} bytes)")
        h = R.header(head)
        if h.size < R.HEADER_LEN:
            raise _damaged(path, self._off, f"an event claims {h.size} bytes")
        # log_pos of a binlog (not relay log) event is where the next one
        # starts: a start offset inside an event, or garbage, shows here.
        if h.log_pos and h.log_pos != self._off + h.size:
            raise _damaged(path, self._off, f"the event says it ends at {h.log_pos}, it ends at "
                                            f"{self._off + h.size} (is {self._off} where an event starts?)")
        rest = f.read(h.size - R.HEADER_LEN)
        if len(rest) < h.size - R.HEADER_LEN:
            raise _damaged(path, self._off, f"the file ends inside an event of {h.size} bytes (a file still being "
                                            "written, or cut short)")
        self._off += h.size
        return head + rest

    def _for_library(self, event: bytes) -> tuple[bytes, int]:
        """The event with a CRC32 trailer (checked when the file has them)."""
        fmt = self.format
        assert fmt is not None and self._path is not None
        if fmt.checksums:
            if not R.crc_ok(event):
                raise _damaged(self._path, self._off - len(event), "the event's CRC32 does not match")
            return event, len(event)
        h = R.header(event)
        return R.build(h, event[R.HEADER_LEN:]), h.size

    def explain(self, off: int) -> Exception:
        """What is wrong with the event at ``off`` of the open file: the
        error reading it here raises (the compiled reader, parser/creader.py,
        found it damaged and leaves the words to this reader)."""
        f = self._file
        assert f is not None and self._path is not None
        f.seek(off)
        self._off = off
        try:
            event = self._read_event()
            if event is not None:
                self._for_library(event)
        except (UnsupportedEventError, PositionLostError) as exc:
            return exc
        return _damaged(self._path, off, "the event cannot be read")

    def _open_next(self) -> list[bytes]:
        """Open the next file: a made-up ROTATE naming it (as a server
        announces a file), its FORMAT_DESCRIPTION, and a seek to where
        reading starts.  [] when no file is left."""
        self.close()
        if not self._queue:
            return []
        path, first = self._queue.pop(0)
        self._check_follows(path)
        f = path.open("rb")
        if f.read(4) != MAGIC:
            f.close()
            raise _damaged(path, 0, "no binlog magic at its start")
        self._file, self._path, self._off = f, path, FIRST_EVENT
        self._stop_at = self.stop if self.stop and not self._queue else 0
        fde = self._read_event()
        if fde is None:
            raise _damaged(path, FIRST_EVENT, "the file has no FORMAT_DESCRIPTION")
        fmt = Format.parse(fde, path)
        if self.format is not None and (fmt.mariadb, fmt.server_id) != (self.format.mariadb, self.format.server_id):
            log.warning("binlog file %s was written by server_id %d (%s), the one before by server_id %d (%s)",
                        path, fmt.server_id, fmt.server_version, self.format.server_id, self.format.server_version)
        self.format = fmt
        self._ctl_connection.dbms = "mariadb" if fmt.mariadb else "mysql"
        self.mysql_version = fmt.version
        self.post_header_lengths = fmt.post_header_lengths
        # Tables are mapped anew in every file (ids may be reused after a restart).
        self.table_map.clear()
        if first > self._off:
            if first > path.stat().st_size:
                raise PositionLostError(f"binlog file {path} has {path.stat().st_size} bytes; the start {first} "
                                        "is beyond its end")
            f.seek(first)
            self._off = first
        elif first < self._off and first != FIRST_EVENT:
            raise _damaged(path, first, "the start offset falls inside the FORMAT_DESCRIPTION")
        rotate = R.build(R.Header(0, R.ROTATE, fmt.server_id, 0, 0, _LOG_EVENT_ARTIFICIAL),
                         struct.pack("<Q", self._off) + path.name.encode())
        return [rotate, fde]

    def _check_follows(self, path: Path) -> None:
        """A file missing from the archive would be a silent gap: the next
        file must be the one the last ROTATE named, or (a file that ended
        without one: a server stopped) the next number."""
        last, named = self._last, self._next_name
        self._last, self._next_name = path, None
        if last is None:
            return
        if named is not None:
            if named != path.name:
                raise PositionLostError(f"binlog file {last} ends rotating to {named}, but the next file given is "
                                        f"{path.name}", hint=f"add {named} (and any after it) to the files read")
            return
        a, b = Position(last.name, 0).sort_key(), Position(path.name, 0).sort_key()
        if a[0] >= 0 and b[0] != a[0] + 1:
            raise PositionLostError(f"binlog file {path.name} does not follow {last.name}",
                                    hint="add the files between them to the files read")

    def events(self) -> Iterator[tuple[bytes, int]]:
        """Event bytes (with a CRC32 trailer) and their size in the file (0
        for the ROTATE made up for each file)."""
        pending: list[bytes] = []
        while True:
            if self._file is None:
                pending = self._open_next()
                if not pending:
                    return
                rotate, fde = pending
                yield rotate, 0
                yield self._for_library(fde)
                continue
            event = self._read_event()
            if event is None:
                self.close()
                continue
            if event[4] == R.ROTATE:
                end = len(event) - (R.CHECKSUM_LEN if self.format and self.format.checksums else 0)
                self._next_name = event[R.HEADER_LEN + 8:end].decode("utf-8", "replace")
            yield self._for_library(event)

    def fetchone(self) -> Any:
        """The next library event, None after the last file's end."""
        if self._events is None:
            self._events = self.events()
        assert self._parse is not None, "FileReader needs a parser (BinlogSource sets it)"
        for event, size in self._events:
            lib = self._parse(self, event)
            if lib is None:
                continue
            if size and size != R.header(event).size:
                # A trailer was added: positions must stay the file's own
                # (BinlogSource measures an event by its header's size).
                lib.packet.event_size = size
            return lib
        return None


class ArchiveInspector:
    """SourceInspector's answers for ``[source] binlog_files``."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.paths = expand(pattern)
        first = self.paths[0]
        with first.open("rb") as f:
            f.seek(FIRST_EVENT)
            head = f.read(R.HEADER_LEN)
            if len(head) < R.HEADER_LEN:
                raise _damaged(first, FIRST_EVENT, "the file has no FORMAT_DESCRIPTION")
            event = head + f.read(R.header(head).size - R.HEADER_LEN)
        self.format = Format.parse(event, first)

    def close(self) -> None:
        pass

    def check_settings(self) -> None:
        """What can be checked without reading the files through: they are
        binlogs (expand).  Row format and FULL metadata show at the first
        statement or TABLE_MAP, which stop the producer naming the fix."""

    @property
    def is_mariadb(self) -> bool:
        return self.format.mariadb

    def server_identity(self) -> str:
        # The form SourceInspector gives a MariaDB (no server_uuid): a
        # checkpoint written while replaying the archive carries over to
        # the live server it came from.
        return f"server_id={self.format.server_id}"

    def table_names(self) -> list[tuple[str, str]] | None:
        return None  # archived files: no server to list tables on

    def binlog_filters(self) -> tuple[list[str], list[str]] | None:
        return None

    def cascading_foreign_keys(self) -> list[tuple[object, ...]] | None:
        return None

    def binlogs(self) -> list[tuple[str, int]]:
        return [(p.name, p.stat().st_size) for p in self.paths]

    def earliest(self) -> Position:
        return Position(self.paths[0].name, FIRST_EVENT)

    def current(self) -> Position:
        name, size = self.binlogs()[-1]
        return Position(name, size)

    def resolve_start(self, start: str) -> Position:
        """'current' (the default) and 'earliest' both mean the first
        file's start: "where the server is now" means nothing for an archive."""
        if start in ("current", "earliest"):
            return self.earliest()
        try:
            return Position.parse(start)
        except ValueError:
            raise SourceConfigError(
                f"[source] start = {start!r} is not 'earliest' or 'file:pos' (with binlog_files)") from None

    def ensure_available(self, pos: Position) -> None:
        """The checkpoint's file must be in the archive (or, right after a
        rotation, be the next file, not archived yet): a missing file would
        be a silent gap."""
        names = {p.name: p for p in self.paths}
        first = self.paths[0].name
        key = pos.sort_key()[:2]
        if key < Position(first, 0).sort_key()[:2]:
            raise PositionLostError(
                f"the checkpoint {pos} is before the first archived binlog file ({first}) of "
                f"[source] binlog_files = {self.pattern!r}",
                hint="add the missing files to the archive, or re-snapshot the tables")
        if pos.file in names:
            size = names[pos.file].stat().st_size
            if pos.pos > size:
                raise PositionLostError(f"the checkpoint {pos} is beyond the end of the archived {pos.file} "
                                        f"({size} bytes)", hint="is the archived file complete? copy it again")
            return
        later = [p.name for p in self.paths if Position(p.name, 0).sort_key()[:2] > key]
        if later or pos.pos > FIRST_EVENT:
            raise PositionLostError(
                f"the checkpoint {pos} is in binlog file {pos.file}, which [source] binlog_files = "
                f"{self.pattern!r} does not hold" + (f" (it holds {later[0]} after it)" if later else ""),
                hint=f"add {pos.file} to the archive")
