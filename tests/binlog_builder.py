"""Binlog events built byte by byte from the servers' documented layouts
(MySQL libbinlogevents / the replication internals manual, MariaDB
log_event.cc), for tests of formats no server here writes.

Nothing here is copied from another project's fixtures: every event is
assembled from its field list, and the tests say which layout they follow.
"""
from __future__ import annotations

import os
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


# -- MySQL 8.0-9.x -----------------------------------------------------------
GTID, ANONYMOUS_GTID, PREVIOUS_GTIDS, PARTIAL_UPDATE = 0x21, 0x22, 0x23, 0x27
PAYLOAD, GTID_TAGGED = 0x28, 0x2A
# MySQL field types (include/field_types.h)
T_LONG, T_LONGLONG, T_DOUBLE, T_VARCHAR, T_DATETIME2 = 3, 8, 5, 15, 18
T_JSON, T_NEWDECIMAL, T_ENUM, T_BLOB, T_STRING, T_VECTOR = 245, 246, 247, 252, 254, 242
UTF8MB4_0900 = 255


def fde(version: str = "8.0.36", *, checksum: bool = True, server_id: int = 1) -> bytes:
    """FORMAT_DESCRIPTION: binlog version 4, server version (50 bytes),
    create time, header length 19, post-header lengths of event types
    1..42 (libbinlogevents' table: QUERY 13, ROTATE 8, TABLE_MAP 8, ROWS v1
    8, ROWS v2 10, GTID 42, PARTIAL_UPDATE_ROWS 10, ...), the checksum
    algorithm and (always) a 4-byte checksum field."""
    lengths = [0] * 42
    for code, n in {0x01: 56, 0x02: 13, 0x04: 8, 0x0F: 98, 0x11: 4, 0x12: 26, 0x13: 8, 0x17: 8, 0x18: 8, 0x19: 8,
                    0x1A: 2, 0x1E: 10, 0x1F: 10, 0x20: 10, 0x21: 42, 0x22: 42, 0x24: 18, 0x25: 52, 0x27: 10}.items():
        lengths[code - 1] = n
    body = (struct.pack("<H", 4) + version.encode().ljust(50, b"\x00") + struct.pack("<I", 0) + bytes([19])
            + bytes(lengths) + bytes([1 if checksum else 0]))
    head = R.HEADER.pack(1_700_000_000, FDE, server_id, R.HEADER_LEN + len(body) + 4, 0, 0)
    crc = zlib.crc32(body, zlib.crc32(head)) if checksum else 0
    return head + body + crc.to_bytes(4, "little")


def gtid_body(sid: bytes, gno: int, *, last_committed: int = 0, sequence_number: int = 1,
              immediate_us: int = 0, original_us: int | None = None, transaction_length: int = 0,
              server_version: int = 80036, original_version: int | None = None, ticket: int | None = None,
              flags: int = 1) -> bytes:
    """Gtid_event: flags, uuid, gno, lt_type 2, last_committed,
    sequence_number; immediate_commit_timestamp (7 bytes, top bit: the
    original one follows), transaction_length (packed), immediate server
    version (4 bytes, top bit: the original follows), commit_group_ticket."""
    out = bytes([flags]) + sid + struct.pack("<q", gno) + b"\x02" + struct.pack("<qq", last_committed, sequence_number)
    if original_us is None:
        out += immediate_us.to_bytes(7, "little")
    else:
        out += (immediate_us | 1 << 55).to_bytes(7, "little") + original_us.to_bytes(7, "little")
    out += lenenc(transaction_length)
    if original_version is None:
        out += struct.pack("<I", server_version)
    else:
        out += struct.pack("<II", server_version | 1 << 31, original_version)
    if ticket is not None:
        out += struct.pack("<Q", ticket)
    return out


def varint(n: int) -> bytes:
    """MySQL serialization's unsigned varint (libs/mysql/serialization)."""
    bits = max(n.bit_length(), 1)
    count = min(9, ((bits * 575) >> 12) + 1)  # bytes, as get_size_integer_varlen_unsigned
    if count == 9:
        return b"\xff" + n.to_bytes(8, "little")
    first = ((1 << (count - 1)) - 1) | ((n << count) & 0xFF)
    return bytes([first]) + (n >> (8 - count)).to_bytes(count - 1, "little")


def svarint(n: int) -> bytes:
    return varint((n << 1) ^ (n >> 63) if n >= 0 else ((~n) << 1) | 1)


def tagged_gtid_body(sid: bytes, tag: str, gno: int, *, immediate_us: int = 0, original_us: int | None = None,
                     transaction_length: int = 0, server_version: int = 80400, last_committed: int = 0,
                     sequence_number: int = 1) -> bytes:
    """Gtid_tagged_log_event: serialization version 1, message size, last
    non-ignorable field id 0, then (field id, value) for fields 0-9."""
    fields = varint(0) + varint(1) + varint(1) + b"".join(varint(b) for b in sid) + varint(2) + svarint(gno)
    fields += varint(3) + varint(len(tag)) + tag.encode() + varint(4) + svarint(last_committed)
    fields += varint(5) + svarint(sequence_number) + varint(6) + varint(immediate_us)
    if original_us is not None:
        fields += varint(7) + varint(original_us)
    fields += varint(8) + varint(transaction_length) + varint(9) + varint(server_version)
    rest = varint(0) + fields  # last_non_ignorable_field_id, then the fields
    size = 1 + len(rest) + 1
    while size != 1 + len(varint(size)) + len(rest):
        size = 1 + len(varint(size)) + len(rest)
    return varint(1) + varint(size) + rest


def previous_gtids_body(sets: list[tuple[bytes, str, list[tuple[int, int]]]]) -> bytes:
    """PREVIOUS_GTIDS: the 8-byte count (format in its top byte; tagged:
    count << 8 | 1), then per uuid [tag] the intervals [start, end)."""
    tagged = any(tag for _, tag, _ in sets)
    n = len(sets)
    out = struct.pack("<Q", (1 << 56) | (n << 8) | 1 if tagged else n)
    for sid, tag, intervals in sets:
        out += sid + (varint(len(tag)) + tag.encode() if tagged else b"")
        out += struct.pack("<Q", len(intervals)) + b"".join(struct.pack("<qq", a, b) for a, b in intervals)
    return out


def table_map_body(table_id: int, db: str, table: str, columns: list[tuple[int, bytes]], *, names: list[str],
                   pk: tuple[int, ...] = (), signed: list[bool] | None = None, enums: list[list[str]] | None = None,
                   visibility: list[bool] | None = None, charset: int = UTF8MB4_0900,
                   extra_tlv: bytes = b"") -> bytes:
    """TABLE_MAP: table id, flags, db and table (length, name, NUL), column
    count, types, metadata block, null bitmap, then optional metadata TLVs
    (binlog_row_metadata = FULL): SIGNEDNESS (1), DEFAULT_CHARSET (2),
    COLUMN_NAME (4), ENUM_STR_VALUE (6), SIMPLE_PRIMARY_KEY (8),
    ENUM_AND_SET_DEFAULT_CHARSET (10), VISIBILITY (12)."""
    n = len(columns)
    meta = b"".join(m for _, m in columns)
    out = table_id.to_bytes(6, "little") + b"\x01\x00"
    out += bytes([len(db)]) + db.encode() + b"\x00" + bytes([len(table)]) + table.encode() + b"\x00"
    out += lenenc(n) + bytes(t for t, _ in columns) + lenenc(len(meta)) + meta + b"\xff" * ((n + 7) // 8)

    def tlv(kind: int, value: bytes) -> bytes:
        return bytes([kind]) + lenenc(len(value)) + value

    def bits(flags: list[bool]) -> bytes:
        raw = bytearray((len(flags) + 7) // 8)
        for i, f in enumerate(flags):
            if f:
                raw[i // 8] |= 0x80 >> (i % 8)
        return bytes(raw)

    numeric = [t in (1, 2, 3, 8, 9, 4, 5, 246, 13) for t, _ in columns]
    if signed is not None:
        out += tlv(1, bits([not s for s, num in zip(signed, numeric) if num]))
    out += tlv(2, lenenc(charset))
    out += tlv(4, b"".join(lenenc(len(x.encode())) + x.encode() for x in names))
    if enums:
        out += tlv(6, b"".join(lenenc(len(e)) + b"".join(lenenc(len(v)) + v.encode() for v in e) for e in enums))
        out += tlv(10, lenenc(charset))
    if pk:
        out += tlv(8, b"".join(lenenc(i) for i in pk))
    if visibility is not None:
        out += tlv(12, bits(visibility))
    return out + extra_tlv


def rows_v2_body(table_id: int, ncols: int, images: bytes, *, update: bool = False) -> bytes:
    return rows_head(table_id, ncols, update=update, v2_extra=b"") + images


def image(values: list[bytes | None]) -> bytes:
    """One row image: null bitmap, then the non-null values' bytes."""
    nulls = 0
    for i, v in enumerate(values):
        if v is None:
            nulls |= 1 << i
    return nulls.to_bytes((len(values) + 7) // 8, "little") + b"".join(v for v in values if v is not None)


def xid_body(xid: int) -> bytes:
    return struct.pack("<Q", xid)


def payload_body(events: list[bytes], *, compression: int = 0, level: int = 3) -> bytes:
    """TRANSACTION_PAYLOAD: (type, length, value) packed-integer fields --
    1 payload size, 2 compression type, 3 uncompressed size -- an end mark
    (0), then the payload: the events (without checksums) back to back,
    zstd-compressed."""
    import zstandard

    raw = b"".join(events)
    data = zstandard.ZstdCompressor(level=level).compress(raw) if compression == 0 else raw

    def field(kind: int, value: int) -> bytes:
        v = lenenc(value)
        return lenenc(kind) + lenenc(len(v)) + v

    return field(1, len(data)) + field(2, compression) + field(3, len(raw)) + b"\x00" + data


def bare(kind: int, body: bytes, **kw: int) -> bytes:
    """An event without a checksum (as inside a TRANSACTION_PAYLOAD)."""
    return event(kind, body, checksum=False, **kw)


def binlog_file(path: os.PathLike[str] | str, events: list[tuple[int, bytes]], *, version: str = "8.0.36",
                next_file: str | None = None) -> list[int]:
    """A binlog file: magic, FORMAT_DESCRIPTION, then (kind, body) events
    with log_pos set and CRC32s; a final ROTATE to ``next_file``.  Returns
    each event's start offset."""
    from pathlib import Path

    out = bytearray(b"\xfebin")
    out += _with_pos(fde(version), len(out))
    starts = []
    for kind, body in events + ([(ROTATE, struct.pack("<Q", 4) + next_file.encode())] if next_file else []):
        starts.append(len(out))
        ev = event(kind, body)
        out += _with_pos(ev, len(out))
    Path(path).write_bytes(bytes(out))
    return starts


def _with_pos(ev: bytes, at: int) -> bytes:
    h = R.header(ev)
    return R.build(R.Header(h.timestamp, h.type, h.server_id, 0, at + len(ev), h.flags),
                   ev[R.HEADER_LEN:-4])


# -- MySQL binary JSON (sql-common/json_binary.cc), small containers --------
def json_binary(v: object) -> bytes:
    """A value in MySQL's binary JSON: type byte and value."""
    t, data = _jb(v)
    return bytes([t]) + data


def _jvarlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _jb(v: object) -> tuple[int, bytes]:
    import decimal as _d

    if v is None:
        return 4, b"\x00"
    if v is True:
        return 4, b"\x01"
    if v is False:
        return 4, b"\x02"
    if isinstance(v, int):
        if -32768 <= v < 32768:
            return 5, struct.pack("<h", v)
        return 9, struct.pack("<q", v)
    if isinstance(v, float):
        return 11, struct.pack("<d", v)
    if isinstance(v, str):
        b = v.encode()
        return 12, _jvarlen(len(b)) + b
    if isinstance(v, _d.Decimal):
        return 15, bytes([246]) + _jvarlen(len(_decimal_bytes(v)) + 2) + _decimal_meta(v) + _decimal_bytes(v)
    if isinstance(v, (dict, list)):
        return _container(v)
    raise TypeError(type(v))


def _decimal_meta(v: "object") -> bytes:
    t = v.as_tuple()  # type: ignore[attr-defined]
    scale = -t.exponent
    precision = max(len(t.digits), scale + 1)
    return bytes([precision, scale])


def _decimal_bytes(v: "object") -> bytes:
    precision, scale = _decimal_meta(v)
    return decimal_bin(v, precision, scale)


def decimal_bin(v: "object", precision: int, scale: int) -> bytes:
    """strings/decimal.c decimal2bin: the integer digits in groups of 9
    from the point leftwards (a leading partial group in 1-4 bytes), the
    fraction in groups of 9 rightwards (a trailing partial group), each
    group big-endian; the first bit flipped; every byte inverted when
    negative."""
    import decimal as _d

    with _d.localcontext() as ctx:
        ctx.prec = 100
        d = _d.Decimal(v).quantize(_d.Decimal(1).scaleb(-scale))
    t = d.as_tuple()
    digits = "".join(map(str, t.digits)).rjust(scale + 1, "0")
    int_digits, frac_digits = digits[:len(digits) - scale], digits[len(digits) - scale:]
    intg = precision - scale
    int_digits = int_digits.rjust(intg, "0")[-intg:] if intg else ""
    dig2bytes = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
    out = bytearray()
    lead = intg % 9
    pos = 0
    if lead:
        out += int(int_digits[:lead]).to_bytes(dig2bytes[lead], "big")
        pos = lead
    while pos < intg:
        out += int(int_digits[pos:pos + 9]).to_bytes(4, "big")
        pos += 9
    pos = 0
    while pos + 9 <= scale:
        out += int(frac_digits[pos:pos + 9]).to_bytes(4, "big")
        pos += 9
    if scale % 9:
        out += int(frac_digits[pos:]).to_bytes(dig2bytes[scale % 9], "big")
    out[0] ^= 0x80
    if t.sign:
        out = bytearray(b ^ 0xFF for b in out)
    return bytes(out)


def _container(v: "dict[str, object] | list[object]") -> tuple[int, bytes]:
    is_obj = isinstance(v, dict)
    items = sorted(v.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode())) if is_obj else list(
        enumerate(v))
    n = len(items)
    header = 4 + n * 3 + (n * 4 if is_obj else 0)
    keys = b"".join(str(k).encode() for k, _ in items) if is_obj else b""
    body = bytearray()
    entries = bytearray()
    key_entries = bytearray()
    koff = header
    for k, _ in items if is_obj else []:
        kb = str(k).encode()
        key_entries += struct.pack("<HH", koff, len(kb))
        koff += len(kb)
    voff = header + len(keys)
    for _, x in items:
        t, data = _jb(x)
        if t in (4, 5, 6):
            entries += bytes([t]) + data.ljust(2, b"\x00")[:2]
        else:
            entries += bytes([t]) + struct.pack("<H", voff + len(body))
            body += data
    total = header + len(keys) + len(body)
    return (0 if is_obj else 2), struct.pack("<HH", n, total) + bytes(key_entries) + bytes(entries) + keys + bytes(body)


def json_diff(op: int, path: str, value: object = None) -> bytes:
    """One Json_diff: operation, path (packed length), value (packed length,
    binary JSON) unless REMOVE."""
    out = bytes([op]) + lenenc(len(path.encode())) + path.encode()
    if op != 2:
        jb = json_binary(value)
        out += lenenc(len(jb)) + jb
    return out


def diff_vector(diffs: list[bytes]) -> bytes:
    data = b"".join(diffs)
    return struct.pack("<I", len(data)) + data
