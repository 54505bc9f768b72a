"""MySQL 8.0-9.x events decoded from their bytes (bodies: after the common
header, without the CRC32), where mysql-replication 1.0.17 reads nothing
or reads wrong.

- GTID_LOG_EVENT / ANONYMOUS_GTID_LOG_EVENT (libbinlogevents Gtid_event):
  post-header ``flags(1) uuid(16) gno(8) lt_type(1) last_committed(8)
  sequence_number(8)``, then (8.0.1+) ``immediate_commit_timestamp`` in 7
  bytes whose top bit says ``original_commit_timestamp`` (7 bytes) follows,
  (8.0.2+) ``transaction_length`` (packed integer), (8.0.14+)
  ``immediate_server_version`` in 4 bytes whose top bit says
  ``original_server_version`` (4 bytes) follows, and (8.0.33+) an 8-byte
  ``commit_group_ticket``.
- GTID_TAGGED_LOG_EVENT (8.3+, tagged GTIDs ``uuid:tag:gno``): the same
  fields in MySQL's serialization format (libs/mysql/serialization):
  varint-coded format version (1), message size, last non-ignorable field
  id, then (field id, value) pairs; field ids 0 flags, 1 uuid (16 varint
  bytes), 2 gno, 3 tag (length and bytes), 4 last_committed,
  5 sequence_number, 6 immediate_commit_timestamp, 7 original_commit_timestamp,
  8 transaction_length, 9 immediate_server_version, 10 original_server_version,
  11 commit_group_ticket.  Signed fields are zigzag-coded.
- PREVIOUS_GTIDS_LOG_EVENT: an 8-byte count whose top byte is the format
  (0 untagged; 1 tagged, the count then in bits 8-55), then per source the
  uuid, (tagged) the tag, an 8-byte interval count and [start, end) pairs.
- TRANSACTION_PAYLOAD_EVENT (8.0.20+, binlog_transaction_compression):
  (type, length, value) header fields as packed integers up to an end mark
  (0): 1 payload size, 2 compression type (0 zstd, 255 none),
  3 uncompressed size; then the payload: the transaction's events back to
  back, each with its common header.
"""
from __future__ import annotations

import uuid as _uuid
import zlib
from dataclasses import dataclass

from cynomys.core.errors import UnsupportedEventError
from cynomys.parser import raw as R

ANONYMOUS_GTID = 0x22


def _damaged(what: str, where: str) -> UnsupportedEventError:
    return UnsupportedEventError(f"{what}" + (f" at {where}" if where else ""),
                                 hint="the binlog is damaged or written by a newer server; upgrade Cynomys or "
                                      "re-snapshot the tables it covers")


@dataclass(frozen=True)
class Gtid:
    """A MySQL GTID event's fields (times in microseconds since the epoch)."""

    gtid: str                           # "uuid:gno", "uuid:tag:gno"; "" for an anonymous one
    flags: int = 0
    last_committed: int = 0
    sequence_number: int = 0
    immediate_commit_us: int = 0
    original_commit_us: int = 0
    transaction_length: int = 0
    immediate_server_version: int = 0
    original_server_version: int = 0
    commit_group_ticket: int = 0


def _uuid_text(b: bytes) -> str:
    return str(_uuid.UUID(bytes=bytes(b)))


def parse_gtid(body: bytes, anonymous: bool = False, where: str = "") -> Gtid:
    """GTID_LOG_EVENT / ANONYMOUS_GTID_LOG_EVENT body."""
    if len(body) < 25:
        raise _damaged(f"GTID event of {len(body)} bytes", where)
    flags = body[0]
    sid, gno = body[1:17], int.from_bytes(body[17:25], "little", signed=True)
    text = "" if anonymous else f"{_uuid_text(sid)}:{gno}"
    fields: dict[str, int] = {}
    off = 25
    if len(body) >= off + 17 and body[off] == 2:  # logical clock
        fields["last_committed"] = int.from_bytes(body[off + 1:off + 9], "little", signed=True)
        fields["sequence_number"] = int.from_bytes(body[off + 9:off + 17], "little", signed=True)
        off += 17
    if len(body) >= off + 7:
        ts = int.from_bytes(body[off:off + 7], "little")
        off += 7
        original = ts & (1 << 55)
        ts &= (1 << 55) - 1
        fields["immediate_commit_us"] = fields["original_commit_us"] = ts
        if original:
            fields["original_commit_us"] = int.from_bytes(body[off:off + 7], "little") & ((1 << 55) - 1)
            off += 7
        if off < len(body):
            fields["transaction_length"], off = R.lenenc(body, off)
        if len(body) >= off + 4:
            version = int.from_bytes(body[off:off + 4], "little")
            off += 4
            original_version = version & (1 << 31)
            version &= (1 << 31) - 1
            fields["immediate_server_version"] = fields["original_server_version"] = version
            if original_version and len(body) >= off + 4:
                fields["original_server_version"] = int.from_bytes(body[off:off + 4], "little") & ((1 << 31) - 1)
                off += 4
        if len(body) >= off + 8:
            fields["commit_group_ticket"] = int.from_bytes(body[off:off + 8], "little")
    return Gtid(text, flags, **fields)


# -- MySQL's serialization format (varints) ---------------------------------
def varint(buf: bytes, off: int) -> tuple[int, int]:
    """An unsigned varint: the count of trailing 1 bits of the first byte
    is the count of bytes that follow (0-8); the value's low bits are the
    first byte's high bits, the rest follows little-endian."""
    if off >= len(buf):
        raise IndexError("varint past the end")
    first = buf[off]
    extra = 0
    while extra < 8 and first >> extra & 1:
        extra += 1
    if off + 1 + extra > len(buf):
        raise IndexError("varint past the end")
    rest = int.from_bytes(buf[off + 1:off + 1 + extra], "little")
    if extra == 8:
        return rest, off + 9
    n = extra + 1
    return (first >> n) | (rest << (8 - n)), off + n


def svarint(buf: bytes, off: int) -> tuple[int, int]:
    u, off = varint(buf, off)
    return (u >> 1) ^ -(u & 1), off


_TAGGED_FIELDS = ("flags", "uuid", "gno", "tag", "last_committed", "sequence_number", "immediate_commit_us",
                  "original_commit_us", "transaction_length", "immediate_server_version",
                  "original_server_version", "commit_group_ticket")
_SIGNED = {"gno", "last_committed", "sequence_number"}


def parse_tagged_gtid(body: bytes, where: str = "") -> Gtid:
    """GTID_TAGGED_LOG_EVENT body (a serialization-format message)."""
    try:
        version, off = varint(body, 0)
        size, off = varint(body, off)
        _last_non_ignorable, off = varint(body, off)
        if version != 1 or size != len(body):
            raise _damaged(f"GTID_TAGGED event: format version {version}, size {size} of {len(body)} bytes",
                           where)
        got: dict[str, object] = {}
        last = -1
        while off < len(body):
            fid, off = varint(body, off)
            if fid <= last or fid >= len(_TAGGED_FIELDS):
                raise _damaged(f"GTID_TAGGED event: field id {fid} after {last}", where)
            last = fid
            name = _TAGGED_FIELDS[fid]
            if name == "uuid":
                raw = bytearray()
                for _ in range(16):
                    b, off = varint(body, off)
                    raw.append(b)
                got[name] = bytes(raw)
            elif name == "tag":
                n, off = varint(body, off)
                got[name] = bytes(body[off:off + n]).decode("ascii")
                off += n
            else:
                got[name], off = (svarint if name in _SIGNED else varint)(body, off)
    except IndexError:
        raise _damaged("GTID_TAGGED event cut short", where) from None
    missing = {"uuid", "gno"} - set(got)
    if missing:
        raise _damaged(f"GTID_TAGGED event without {', '.join(sorted(missing))}", where)
    sid = _uuid_text(got.pop("uuid"))  # type: ignore[arg-type]
    tag = str(got.pop("tag", ""))
    gno = int(got.pop("gno"))  # type: ignore[call-overload]
    text = f"{sid}:{tag}:{gno}" if tag else f"{sid}:{gno}"
    if "original_commit_us" not in got:
        got["original_commit_us"] = got.get("immediate_commit_us", 0)
    if "original_server_version" not in got:
        got["original_server_version"] = got.get("immediate_server_version", 0)
    return Gtid(text, **{k: int(v) for k, v in got.items()})  # type: ignore[call-overload]


def parse_previous_gtids(body: bytes, where: str = "") -> str:
    """PREVIOUS_GTIDS_LOG_EVENT body -> the GTID set text
    ("uuid:1-5:7-9,uuid:tag:1-3"), sources in the order written."""
    try:
        word = int.from_bytes(body[0:8], "little")
        fmt = word >> 56
        if fmt == 0:
            count = word & ((1 << 56) - 1)
        elif fmt == 1:
            count = (word >> 8) & ((1 << 48) - 1)
        else:
            raise _damaged(f"PREVIOUS_GTIDS event in format {fmt}", where)
        off = 8
        parts = []
        for _ in range(count):
            sid = _uuid_text(body[off:off + 16])
            off += 16
            tag = ""
            if fmt == 1:
                n, off = varint(body, off)
                tag = bytes(body[off:off + n]).decode("ascii")
                off += n
            n_intervals = int.from_bytes(body[off:off + 8], "little")
            off += 8
            spans = []
            for _ in range(n_intervals):
                start = int.from_bytes(body[off:off + 8], "little", signed=True)
                stop = int.from_bytes(body[off + 8:off + 16], "little", signed=True)  # exclusive
                off += 16
                spans.append(str(start) if stop == start + 1 else f"{start}-{stop - 1}")
            parts.append(":".join([sid, *([tag] if tag else []), *spans]))
        if off > len(body):
            raise IndexError
    except (IndexError, ValueError):
        raise _damaged("PREVIOUS_GTIDS event cut short", where) from None
    return ",".join(parts)


# -- TRANSACTION_PAYLOAD ------------------------------------------------------
_END_MARK, _SIZE, _COMPRESSION, _UNCOMPRESSED = 0, 1, 2, 3
ZSTD, NONE = 0, 255
#: The largest payload inflated (MySQL's own limit on a transaction in the
#: binlog is max_binlog_cache_size; this bounds a damaged size field).
MAX_PAYLOAD = 4 << 30


def payload_events(body: bytes, where: str = "") -> list[bytes]:
    """The events a TRANSACTION_PAYLOAD holds, in order, each with a CRC32
    trailer (raw.build): MySQL writes them without one."""
    fields: dict[int, int] = {}
    off = 0
    try:
        while True:
            kind, off = R.lenenc(body, off)
            if kind == _END_MARK:
                break
            length, off = R.lenenc(body, off)
            if kind in (_SIZE, _COMPRESSION, _UNCOMPRESSED):
                fields[kind], _ = R.lenenc(body, off)
            off += length
    except IndexError:
        raise _damaged("TRANSACTION_PAYLOAD header cut short", where) from None
    size = fields.get(_SIZE, len(body) - off)
    data = body[off:off + size]
    if len(data) != size:
        raise _damaged(f"TRANSACTION_PAYLOAD of {size} bytes holds {len(data)}", where)
    compression = fields.get(_COMPRESSION, NONE)
    if compression == ZSTD:
        data = _zstd(data, fields.get(_UNCOMPRESSED, 0), where)
    elif compression != NONE:
        raise _damaged(f"TRANSACTION_PAYLOAD compressed with algorithm {compression} (known: 0 zstd, 255 none)",
                       where)
    out = []
    pos = 0
    while pos < len(data):
        if pos + R.HEADER_LEN > len(data):
            raise _damaged("TRANSACTION_PAYLOAD ends inside an event header", where)
        h = R.header(data[pos:pos + R.HEADER_LEN])
        if h.size < R.HEADER_LEN or pos + h.size > len(data):
            raise _damaged(f"TRANSACTION_PAYLOAD holds an event of {h.size} bytes at {pos} of {len(data)}", where)
        event = data[pos:pos + h.size]
        pos += h.size
        # An inner event with a CRC32 of its own is kept as it is.
        if h.size >= R.HEADER_LEN + 4 and zlib.crc32(event[:-4]) == int.from_bytes(event[-4:], "little"):
            out.append(bytes(event))
        else:
            out.append(R.build(h, bytes(event[R.HEADER_LEN:])))
    return out


def _zstd(data: bytes, expected: int, where: str) -> bytes:
    import zstandard

    if expected > MAX_PAYLOAD:
        raise _damaged(f"TRANSACTION_PAYLOAD claims {expected} uncompressed bytes", where)
    try:
        z = zstandard.ZstdDecompressor()
        # With the size known (the header's, or the frame's own) one buffer
        # of that size; else a stream, so a damaged size field cannot make
        # it allocate MAX_PAYLOAD up front.
        out = z.decompress(data, max_output_size=expected) if expected else z.decompressobj().decompress(data)
    except zstandard.ZstdError as exc:
        raise _damaged(f"TRANSACTION_PAYLOAD zstd stream: {exc}", where) from None
    if expected and len(out) != expected:
        raise _damaged(f"TRANSACTION_PAYLOAD inflated to {len(out)} bytes, its header says {expected}", where)
    return bytes(out)


# -- TABLE_MAP of MySQL 9 (VECTOR) ---------------------------------------------
VECTOR = 242
_BLOB = 252
_VECTOR_DIMENSIONALITY = 13
#: Optional metadata kinds mysql-replication 1.0.17 knows (it refuses others).
_LIBRARY_METADATA = range(1, 13)


def table_map_types(body: bytes) -> tuple[int, int]:
    """Where a TABLE_MAP body's column types start, and how many there are
    (past the table id, flags, database and table names)."""
    off = 8
    off += 1 + body[off] + 1  # db
    off += 1 + body[off] + 1  # table
    n, off = R.lenenc(body, off)
    return off, n


def table_map_for_library(body: bytes) -> tuple[bytes, dict[int, int]] | None:
    """A TABLE_MAP body (without CRC32) the library can parse, or None when
    it can parse this one as it is.

    MySQL 9.0 has VECTOR columns (type 242, one metadata byte: the length's
    size, like a BLOB; a character column of charset binary) and their
    dimensions in optional metadata VECTOR_DIMENSIONALITY (13, a packed
    integer per vector column).  The library knows neither: VECTOR is
    handed to it as the BLOB it is stored like, and optional metadata it
    does not know is left out.  Returns the body and {column: dimensions}
    (0 when the map does not say)."""
    types_at, n = table_map_types(body)
    off = types_at
    types = body[off:off + n]
    off += n
    meta_len, off = R.lenenc(body, off)
    off += meta_len + (n + 7) // 8
    tlvs_at = off
    keep = bytearray()
    dims: list[int] = []
    unknown = False
    while off < len(body):
        kind = body[off]
        length, start = R.lenenc(body, off + 1)
        end = start + length
        if kind == _VECTOR_DIMENSIONALITY:
            pos = start
            while pos < end:
                d, pos = R.lenenc(body, pos)
                dims.append(d)
        if kind in _LIBRARY_METADATA:
            keep += body[off:end]
        else:
            unknown = True
        off = end
    if VECTOR not in types and not unknown:
        return None
    vectors = [i for i, t in enumerate(types) if t == VECTOR]
    fixed = bytes(_BLOB if t == VECTOR else t for t in types)
    out = body[:types_at] + fixed + body[types_at + n:tlvs_at] + bytes(keep)
    return out, {col: (dims[k] if k < len(dims) else 0) for k, col in enumerate(vectors)}
