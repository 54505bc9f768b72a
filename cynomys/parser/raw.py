"""Raw binlog events as bytes: the common header, rebuilding an event.

Every binlog event (binlog format v4, MySQL 5.0+ and MariaDB) starts with a
19-byte common header, little-endian::

    timestamp u32 | type u8 | server_id u32 | event_size u32 | log_pos u32 | flags u16

``event_size`` counts the whole event (header, body and, when the server
writes checksums, the 4-byte CRC32 at its end); ``log_pos`` is where the
next event starts.  The container events (MariaDB's compressed events,
MySQL's TRANSACTION_PAYLOAD) and binlog files read offline hand the parser
events as bytes; this module is what they share.  No library import: the
layouts are the servers' own (libbinlogevents, MariaDB log_event.cc).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from cynomys.core.errors import UnsupportedEventError

HEADER = struct.Struct("<IBIIIH")
HEADER_LEN = HEADER.size  # 19
CHECKSUM_LEN = 4
FORMAT_DESCRIPTION = 0x0F
ROTATE = 0x04
FLAGS_OFFSET = 17
#: LOG_EVENT_BINLOG_IN_USE_F: a FORMAT_DESCRIPTION's flag while its file is
#: being written, set after its CRC32 was computed (log_event.cc).
BINLOG_IN_USE = 0x1


@dataclass(frozen=True)
class Header:
    timestamp: int
    type: int
    server_id: int
    size: int
    log_pos: int
    flags: int


def header(raw: bytes) -> Header:
    if len(raw) < HEADER_LEN:
        raise UnsupportedEventError(f"a binlog event of {len(raw)} bytes is shorter than its 19-byte header")
    return Header(*HEADER.unpack_from(raw, 0))


def crc_ok(event: bytes) -> bool:
    """An event's CRC32 trailer matches.  A FORMAT_DESCRIPTION of a file
    still being written carries LOG_EVENT_BINLOG_IN_USE_F, set after its
    checksum was computed: the server's own reader clears it before
    checking (log_event.cc, event_checksum_test), and so does this."""
    want = int.from_bytes(event[-CHECKSUM_LEN:], "little")
    if zlib.crc32(event[:-CHECKSUM_LEN]) == want:
        return True
    if len(event) > FLAGS_OFFSET + CHECKSUM_LEN and event[4] == FORMAT_DESCRIPTION and event[FLAGS_OFFSET] & BINLOG_IN_USE:
        flag = bytes([event[FLAGS_OFFSET] & ~BINLOG_IN_USE & 0xFF])
        crc = zlib.crc32(event[FLAGS_OFFSET + 1:-CHECKSUM_LEN], zlib.crc32(flag, zlib.crc32(event[:FLAGS_OFFSET])))
        return crc == want
    return False


def build(h: Header, body: bytes, *, checksum: bool = True) -> bytes:
    """An event from a header and a body: ``event_size`` set to match, and
    (``checksum``) a CRC32 trailer, as a server with binlog_checksum=CRC32
    writes it.  Rebuilt events always carry one, so that the parser reads
    every event the same way (mysql-replication measures a TABLE_MAP's
    optional metadata as "all but the last 4 bytes")."""
    size = HEADER_LEN + len(body) + (CHECKSUM_LEN if checksum else 0)
    head = HEADER.pack(h.timestamp, h.type, h.server_id, size, h.log_pos, h.flags)
    if not checksum:
        return head + body
    crc = zlib.crc32(body, zlib.crc32(head))
    return head + body + crc.to_bytes(4, "little")


def lenenc(buf: bytes, off: int) -> tuple[int, int]:
    """A length-encoded integer (the client/server protocol's and the row
    events' column count): value and the offset after it."""
    first = buf[off]
    if first < 0xFB:
        return first, off + 1
    width = {0xFC: 2, 0xFD: 3, 0xFE: 8}.get(first)
    if width is None:
        raise UnsupportedEventError(f"bad length-encoded integer (first byte 0x{first:02X})")
    return int.from_bytes(buf[off + 1:off + 1 + width], "little"), off + 1 + width
