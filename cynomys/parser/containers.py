"""Events that hold other events: unpacked into the events they stand for.

MariaDB (``log_bin_compress = ON``) writes QUERY and ROWS events whose
statement text or row images are zlib-compressed, when they are longer than
``log_bin_compress_min_len``.  The server itself turns such an event back
into the plain event before using it (log_event.cc,
``query_event_uncompress`` / ``row_log_event_uncompress``), and so do we:
the event's head is kept byte for byte, the compressed part is inflated,
and the event type becomes the plain one.  The rest of the parser then
sees exactly what a server without compression would have written, so the
changes shipped are the same.

The compressed part starts with one byte ``1AAA0LLL``: bit 7 set
(compressed), AAA the algorithm (0 = zlib, the only one MariaDB has), LLL
the number (1-4) of the bytes that follow and hold the uncompressed length,
most significant first; then the zlib stream.  Where it starts:

- QUERY_COMPRESSED (0xA5): after the post-header, the status variables and
  the NUL-terminated default database -- where a QUERY event's statement
  text starts.
- *_ROWS_COMPRESSED_EVENT_V1 (0xA6-0xA8) and *_ROWS_COMPRESSED_EVENT
  (0xA9-0xAB, v2: the variable-length extra header too): after table id,
  flags, column count and the column bitmap(s) -- where the row images start.
"""
from __future__ import annotations

import zlib

from cynomys.core.errors import UnsupportedEventError
from cynomys.parser import raw as R

QUERY = 0x02
#: MariaDB compressed kind -> the plain kind it stands for.
MARIADB_PLAIN = {0xA5: QUERY, 0xA6: 0x17, 0xA7: 0x18, 0xA8: 0x19, 0xA9: 0x1E, 0xAA: 0x1F, 0xAB: 0x20}
_UPDATES = {0x18, 0x1F}
# Post-header lengths when the FORMAT_DESCRIPTION gives none (MariaDB's
# QUERY_HEADER_LEN, ROWS_HEADER_LEN_V1 / _V2).
_QUERY_POST_HEADER = 13
_ROWS_V1_POST_HEADER = 8
_ROWS_V2_POST_HEADER = 10


def _where(raw: bytes, plain: int, post_header_len: int) -> int:
    """Offset of the compressed part in a MariaDB compressed event."""
    body = R.HEADER_LEN
    if plain == QUERY:
        db_len = raw[body + 8]
        status_len = int.from_bytes(raw[body + 11:body + 13], "little")
        return body + post_header_len + status_len + db_len + 1
    off = body + _ROWS_V1_POST_HEADER
    if post_header_len == _ROWS_V2_POST_HEADER:
        off += int.from_bytes(raw[off:off + 2], "little")  # the extra header's length counts its own 2 bytes
    width, off = R.lenenc(raw, off)
    bitmaps = 2 if plain in _UPDATES else 1
    return off + bitmaps * ((width + 7) // 8)


def inflate(part: bytes, what: str, wbits: int = zlib.MAX_WBITS) -> bytes:
    """MariaDB's compressed record (binlog_buf_uncompress) -> its bytes.
    ``wbits``: a zlib stream (events), or raw deflate (-MAX_WBITS: what a
    COMPRESSED column usually holds, parser/rows.py ``inflate_column``)."""
    if not part or part[0] & 0xE0 != 0x80:
        raise UnsupportedEventError(f"{what}: the compressed part does not start with a compression header")
    alg, lenlen = (part[0] & 0x70) >> 4, part[0] & 0x07
    if alg != 0:
        raise UnsupportedEventError(f"{what}: compression algorithm {alg} (MariaDB knows only 0, zlib)",
                                    hint="is this binlog written by a newer MariaDB? upgrade Cynomys")
    if not 1 <= lenlen <= 4:
        raise UnsupportedEventError(f"{what}: the compression header says the length takes {lenlen} bytes")
    length = int.from_bytes(part[1:1 + lenlen], "big")
    try:
        out = zlib.decompress(part[1 + lenlen:], wbits, max(length, 1))
    except zlib.error as exc:
        raise UnsupportedEventError(f"{what}: the zlib stream is corrupt ({exc})",
                                    hint="the binlog is damaged; re-snapshot the tables it covers") from None
    if len(out) != length:
        raise UnsupportedEventError(f"{what}: inflated to {len(out)} bytes, the header says {length}",
                                    hint="the binlog is damaged; re-snapshot the tables it covers")
    return out


def mariadb_uncompress(raw: bytes, post_header_len: int | None, checksum: bool, where: str = "") -> bytes:
    """A MariaDB compressed event (header to checksum) -> the plain event it
    stands for, with a CRC32 trailer (raw.build).  ``post_header_len``: the
    FORMAT_DESCRIPTION's for this kind (None: the server's default);
    ``checksum``: whether ``raw`` ends with a CRC32."""
    h = R.header(raw)
    plain = MARIADB_PLAIN[h.type]
    what = f"compressed event 0x{h.type:02X}" + (f" at {where}" if where else "")
    if post_header_len is None:
        post_header_len = _QUERY_POST_HEADER if plain == QUERY else _ROWS_V1_POST_HEADER
    end = len(raw) - (R.CHECKSUM_LEN if checksum else 0)
    try:
        start = _where(raw, plain, post_header_len)
    except IndexError:
        start = end + 1
    if start >= end:
        raise UnsupportedEventError(f"{what}: the event ends before its compressed part",
                                    hint="the binlog is damaged; re-snapshot the tables it covers")
    body = raw[R.HEADER_LEN:start] + inflate(raw[start:end], what)
    return R.build(R.Header(h.timestamp, plain, h.server_id, 0, h.log_pos, h.flags), body)
