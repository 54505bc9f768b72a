"""Binlog events built byte by byte from the servers' documented layouts
(MySQL libbinlogevents / the replication internals manual, MariaDB
log_event.cc), for tests of formats no server here writes.

Nothing here is copied from another project's fixtures: every event is
assembled from its field list, and the tests say which layout they follow.
"""
from __future__ import annotations

import struct
import zlib

from cynomys.parser import raw as R

FDE, QUERY, ROTATE, XID, TABLE_MAP = 0x0F, 0x02, 0x04, 0x10, 0x13
WRITE_V1, UPDATE_V1, DELETE_V1 = 0x17, 0x18, 0x19
WRITE_V2, UPDATE_V2, DELETE_V2 = 0x1E, 0x1F, 0x20


def event(kind: int, body: bytes, *, log_pos: int = 0, timestamp: int = 1_700_000_000, server_id: int = 1,
          flags: int = 0, checksum: bool = True) -> bytes:
    return R.build(R.Header(timestamp, kind, server_id, 0, log_pos, flags), body, checksum=checksum)


def lenenc(n: int) -> bytes:
    if n < 0xFB:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    if n < 1 << 24:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + n.to_bytes(8, "little")


def query_body(sql: str, db: str = "", status: bytes = b"", thread_id: int = 7) -> bytes:
    """QUERY_EVENT: post-header (thread id, exec time, db length, error
    code, status-vars length), status vars, db NUL, statement."""
    dbb = db.encode()
    return (struct.pack("<IIBHH", thread_id, 0, len(dbb), 0, len(status)) + status + dbb + b"\x00"
            + sql.encode())


def rows_head(table_id: int, ncols: int, *, update: bool = False, v2_extra: bytes | None = None,
              flags: int = 1) -> bytes:
    """ROWS event head: table id (6 bytes), flags, [v2: extra-data length
    counting itself, extra data], column count, columns-present bitmap(s)."""
    head = table_id.to_bytes(6, "little") + struct.pack("<H", flags)
    if v2_extra is not None:
        head += struct.pack("<H", 2 + len(v2_extra)) + v2_extra
    bitmap = ((1 << ncols) - 1).to_bytes((ncols + 7) // 8, "little")
    return head + lenenc(ncols) + bitmap + (bitmap if update else b"")


def mariadb_compressed(plain: bytes, *, split: int, lenlen: int | None = None, level: int = 6) -> bytes:
    """MariaDB's compressed form of ``plain`` (an event with a CRC32): the
    bytes from ``split`` (an offset into the event) up to the checksum are
    replaced by the compression header (1AAA0LLL, the length most
    significant byte first) and a zlib stream; the type becomes the
    compressed kind."""
    h = R.header(plain)
    data = plain[split:len(plain) - R.CHECKSUM_LEN]
    n = len(data)
    width = lenlen or max(1, (n.bit_length() + 7) // 8)
    part = bytes([0x80 | width]) + n.to_bytes(width, "big") + zlib.compress(data, level)
    compressed = {QUERY: 0xA5, WRITE_V1: 0xA6, UPDATE_V1: 0xA7, DELETE_V1: 0xA8,
                  WRITE_V2: 0xA9, UPDATE_V2: 0xAA, DELETE_V2: 0xAB}[h.type]
    return event(compressed, plain[R.HEADER_LEN:split] + part, log_pos=h.log_pos, timestamp=h.timestamp,
                 server_id=h.server_id, flags=h.flags)
