"""Lossless row decoding from the raw bytes of a ROWS event.

pymysqlreplication's own value decoder loses information (zero dates become
None, BINARY(n) loses trailing 0x00 bytes, an empty SET looks like NULL,
YEAR 0000 becomes 1900, TIME2 fractions of negative values are wrong, BIT
becomes a '0'/'1' string) and spends most of the reader's time in per-value
Python branching.  We keep its protocol handling (packets, TABLE_MAP with
FULL metadata) and decode the row images ourselves: for each table a list of
small decoder closures is compiled once from the TABLE_MAP column metadata,
then rows are read with ``struct.unpack_from`` over one ``bytes`` buffer.

That pure-Python decoder is the reference.  The compiled twin
(``cynomys/_speedups.c``, ``decode_rows``) reads a whole event body in one
call from a *plan*: one small tuple per column, built here from the same
metadata (``_plan_for``).  It returns the same values of the same types; for
what it does not handle itself (JSON, SET, old temporal types, zero dates,
bytes invalid in a charset) it calls the column's pure decoder for that
value, and on anything unexpected it raises ``Fallback`` and the event is
decoded here instead.  ``cynomys.core.compiled`` selects the path.

Formats follow the server's own ``my_*_packed_from_binary`` functions
(sql-common/my_time.c, strings/decimal.c); multi-byte temporal parts are
big-endian, integers little-endian.
"""
from __future__ import annotations

import copy
import datetime
import decimal
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from cynomys.core import compiled
from cynomys.core.errors import UnsupportedEventError
from cynomys.core.model import ColumnDef, RawTemporal, Row, Value
from cynomys.core.sourcetypes import INT_FAMILIES, IntFamily, lob_type, members_text, vector_type
from cynomys.parser import mysqljson
from cynomys.parser.containers import inflate
from cynomys.parser.raw import lenenc

# MySQL field type codes (include/field_types.h).
DECIMAL, TINY, SHORT, LONG, FLOAT, DOUBLE, NULL, TIMESTAMP, LONGLONG, INT24 = range(10)
DATE, TIME, DATETIME, YEAR, NEWDATE, VARCHAR, BIT, TIMESTAMP2, DATETIME2, TIME2 = range(10, 20)
JSON, NEWDECIMAL, ENUM, SET, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB, VAR_STRING, STRING, GEOMETRY = range(245, 256)
VECTOR = 242  # MySQL 9.0: float32 values, little-endian, length-prefixed like a BLOB

Decoder = Callable[[bytes, int], "tuple[Value, int]"]

_UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
# Bytes used by the fractional part of TIME2/DATETIME2/TIMESTAMP2 per fsp,
# and the factor that scales it to microseconds.
_FSP_BYTES = (0, 1, 1, 2, 2, 3, 3)
_FSP_SCALE = (1, 10000, 10000, 100, 100, 1, 1)
# Maximum bytes per character, to turn byte lengths back into CHAR(n)/VARCHAR(n).
_MBMAXLEN = {"utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "utf16": 4, "utf16le": 4, "utf32": 4,
             "ucs2": 2, "big5": 2, "gbk": 2, "gb2312": 2, "sjis": 2, "cp932": 2, "ujis": 3,
             "eucjpms": 3, "euckr": 2, "gb18030": 4}
# Python codec for a MySQL charset (collation prefix).
_PY_CODEC = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "cp1252",
             "ascii": "ascii", "binary": "", "ucs2": "utf-16-be", "utf16": "utf-16-be",
             "utf16le": "utf-16-le", "utf32": "utf-32-be", "cp1250": "cp1250", "cp1251": "cp1251",
             "cp1256": "cp1256", "cp1257": "cp1257", "latin2": "iso8859-2", "greek": "iso8859-7",
             "hebrew": "iso8859-8", "latin5": "iso8859-9", "koi8r": "koi8-r", "koi8u": "koi8-u",
             "big5": "big5", "gbk": "gbk", "gb2312": "gb2312", "sjis": "shift_jis", "cp932": "cp932",
             "ujis": "euc-jp", "eucjpms": "euc-jp", "euckr": "euc-kr", "gb18030": "gb18030",
             "tis620": "tis-620", "cp850": "cp850", "cp852": "cp852", "cp866": "cp866",
             "macroman": "mac-roman", "swe7": "ascii", "dec8": "latin-1", "hp8": "latin-1"}


def _charset(col: Any) -> str:
    """'utf8mb4_general_ci' -> 'utf8mb4'; binary columns -> 'binary'."""
    coll = getattr(col, "collation_name", None) or getattr(col, "character_set_name", None) or "binary"
    return "binary" if coll == "binary" else coll.split("_", 1)[0]


# --------------------------------------------------------------------------
# Column type text (what the target needs to create the column)
# --------------------------------------------------------------------------
def _enum_members(values: Sequence[str] | None) -> list[str]:
    """ENUM members as declared (a leading '' is the error member, not one of them)."""
    if values and values[0] == "":
        return [v for v in values if v != ""]
    return list(values or [])


#: The integer family of each integer field type.
_INT_FIELDS: dict[int, IntFamily] = {
    TINY: INT_FAMILIES["tinyint"], SHORT: INT_FAMILIES["smallint"], INT24: INT_FAMILIES["mediumint"],
    LONG: INT_FAMILIES["int"], LONGLONG: INT_FAMILIES["bigint"],
}


def _fsp_suffix(name: str, col: Any) -> str:
    fsp = getattr(col, "fsp", 0) or 0
    return f"{name}({fsp})" if fsp else name


def _varchar_bytes(col: Any) -> int:
    """A VARCHAR's length in bytes; a COMPRESSED one's counts its compression header byte."""
    return int(col.max_length) - (1 if getattr(col, "compressed", False) else 0)


def column_type_text(col: Any) -> str:
    """Rebuild the SQL column type from TABLE_MAP metadata (FULL row metadata)."""
    t = col.type
    if t in _INT_FIELDS:
        return _INT_FIELDS[t].name + (" unsigned" if col.unsigned else "")
    cs = _charset(col)
    mb = _MBMAXLEN.get(cs, 1)
    simple: dict[int, Callable[[], str]] = {
        FLOAT: lambda: "float",
        DOUBLE: lambda: "double",
        NEWDECIMAL: lambda: f"decimal({col.precision},{col.decimals})" + (" unsigned" if col.unsigned else ""),
        VARCHAR: lambda: f"varbinary({_varchar_bytes(col)})" if cs == "binary" else f"varchar({_varchar_bytes(col) // mb})",
        VAR_STRING: lambda: f"varbinary({col.max_length})" if cs == "binary" else f"varchar({col.max_length // mb})",
        STRING: lambda: f"binary({col.max_length})" if cs == "binary" else f"char({col.max_length // mb})",
        BLOB: lambda: lob_type("blob" if cs == "binary" else "text", col.length_size),
        # No members: a TABLE_MAP of binlog_row_metadata = MINIMAL (decode only).
        ENUM: lambda: f"enum({members_text(_enum_members(col.enum_values))})" if col.enum_values else "enum",
        SET: lambda: f"set({members_text(col.set_values or [])})" if col.set_values else "set",
        BIT: lambda: f"bit({col.bits})",
        DATE: lambda: "date",
        NEWDATE: lambda: "date",
        DATETIME: lambda: "datetime",
        DATETIME2: lambda: _fsp_suffix("datetime", col),
        TIMESTAMP: lambda: "timestamp",
        TIMESTAMP2: lambda: _fsp_suffix("timestamp", col),
        TIME: lambda: "time",
        TIME2: lambda: _fsp_suffix("time", col),
        YEAR: lambda: "year",
        JSON: lambda: "json",
        GEOMETRY: lambda: "geometry",
        VECTOR: lambda: vector_type(getattr(col, "dimensions", 0)),
        NULL: lambda: "null",
    }
    if t not in simple:
        raise UnsupportedEventError(f"column {col.name!r} has MySQL field type {t}, which Cynomys cannot decode")
    return simple[t]()


def column_defs(columns: Sequence[Any]) -> tuple[ColumnDef, ...]:
    return tuple(ColumnDef(c.name, column_type_text(c)) for c in columns)


# --------------------------------------------------------------------------
# Value decoders: (buf, off) -> (value, new_off)
# --------------------------------------------------------------------------
def _int_decoder(fmt: str, size: int) -> Decoder:
    s = struct.Struct("<" + fmt)
    unpack = s.unpack_from

    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        return unpack(buf, off)[0], off + size

    return dec


def _int24(unsigned: bool) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        v = buf[off] | (buf[off + 1] << 8) | (buf[off + 2] << 16)
        if not unsigned and v & 0x800000:
            v -= 0x1000000
        return v, off + 3

    return dec


def _length_prefixed(prefix: int, convert: Callable[[bytes], Value]) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        n = int.from_bytes(buf[off:off + prefix], "little")
        start = off + prefix
        return convert(buf[start:start + n]), start + n

    return dec


def inflate_column(data: bytes, col_name: str = "") -> bytes:
    """The bytes a MariaDB ``COMPRESSED`` column's stored record stands for
    (sql/field.cc compress_zlib): empty; or a header byte without bit 7 and
    the bytes as they are (under ``column_compression_threshold``); or the
    binlog's own compressed record (``containers.inflate``), whose header's
    bit 3 says raw deflate (the default) rather than a zlib stream
    (``column_compression_zlib_wrap``)."""
    if not data:
        return b""
    if not data[0] & 0x80:
        return data[1:]
    return inflate(data, f"compressed column {col_name!r}", -zlib.MAX_WBITS if data[0] & 0x08 else zlib.MAX_WBITS)


def _text(codec: str, col_name: str) -> Callable[[bytes], Value]:
    def convert(raw: bytes) -> Value:
        try:
            return raw.decode(codec)
        except UnicodeDecodeError as exc:
            raise UnsupportedEventError(
                f"column {col_name!r}: bytes not valid in its charset ({codec}): {exc}",
                hint="fix the column's charset on the source or declare it binary",
            ) from None

    return convert


def _binary_fixed(width: int) -> Callable[[bytes], Value]:
    # BINARY(n) values are stored without their trailing 0x00 padding; the
    # server pads them back to n bytes on read, and so do we.
    def convert(raw: bytes) -> Value:
        return bytes(raw).ljust(width, b"\x00")

    return convert


def _decimal(precision: int, scale: int) -> Decoder:
    """strings/decimal.c bin2decimal: groups of 9 digits in 4 bytes, the
    leftover digits in 1-4 bytes, big-endian; the first bit flipped is the
    sign, and a negative number has every byte inverted.  The whole field is
    read as one integer and split with precomputed shifts (hot path)."""
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    groups: list[tuple[int, int]] = []  # (bytes, digits), most significant first
    if intg0x:
        groups.append((_DIG2BYTES[intg0x], intg0x))
    groups += [(4, 9)] * (intg0 + frac0)
    if frac0x:
        groups.append((_DIG2BYTES[frac0x], frac0x))
    size = sum(b for b, _ in groups)
    bits = 8 * size
    sign_bit = 1 << (bits - 1)
    all_ones = (1 << bits) - 1
    plan: list[tuple[int, int, int]] = []  # (shift, mask, 10**digits)
    shift = bits
    for nbytes, ndig in groups:
        shift -= 8 * nbytes
        plan.append((shift, (1 << (8 * nbytes)) - 1, 10 ** ndig))
    exponent = -scale
    Dec = decimal.Decimal

    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        raw = int.from_bytes(buf[off:off + size], "big") ^ sign_bit
        negative = raw & sign_bit  # the stored sign bit was 0
        if negative:
            raw ^= all_ones
        n = 0
        for sh, mask, base in plan:
            n = n * base + ((raw >> sh) & mask)
        # From text: exact, whatever the decimal context's precision.
        return Dec(f"{'-' if negative else ''}{n}E{exponent}"), off + size

    return dec


def _frac(buf: bytes, off: int, fsp: int) -> tuple[int, int]:
    """Unsigned big-endian fraction field and its size."""
    n = _FSP_BYTES[fsp]
    return int.from_bytes(buf[off:off + n], "big"), n


def _frac_text(micro: int, fsp: int) -> str:
    return "." + f"{micro:06d}"[:fsp] if fsp else ""


def _datetime2(fsp: int) -> Decoder:
    nfrac = _FSP_BYTES[fsp]
    scale = _FSP_SCALE[fsp]

    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        intpart = int.from_bytes(buf[off:off + 5], "big") - 0x8000000000
        micro = int.from_bytes(buf[off + 5:off + 5 + nfrac], "big") * scale if nfrac else 0
        ymd, hms = intpart >> 17, intpart & 0x1FFFF
        ym, day = ymd >> 5, ymd & 31
        year, month = divmod(ym, 13)
        hour, minute, second = hms >> 12, (hms >> 6) & 63, hms & 63
        try:
            return datetime.datetime(year, month, day, hour, minute, second, micro), off + 5 + nfrac
        except ValueError:  # zero date or zero-in-date: keep MySQL's text
            text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}" + _frac_text(micro, fsp)
            return RawTemporal(text), off + 5 + nfrac

    return dec


def _timestamp2(fsp: int) -> Decoder:
    nfrac = _FSP_BYTES[fsp]
    scale = _FSP_SCALE[fsp]

    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        sec = int.from_bytes(buf[off:off + 4], "big")
        micro = int.from_bytes(buf[off + 4:off + 4 + nfrac], "big") * scale if nfrac else 0
        if sec == 0 and micro == 0:  # '0000-00-00 00:00:00' is stored as 0
            return RawTemporal("0000-00-00 00:00:00" + _frac_text(0, fsp)), off + 4 + nfrac
        return _EPOCH + datetime.timedelta(seconds=sec, microseconds=micro), off + 4 + nfrac

    return dec


def _time2(fsp: int) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        # my_time_packed_from_binary: a biased integer part and a fraction
        # whose borrow must be undone for negative values.
        if fsp >= 5:
            packed = int.from_bytes(buf[off:off + 6], "big") - 0x800000000000
            size = 6
        else:
            intpart = int.from_bytes(buf[off:off + 3], "big") - 0x800000
            size = 3
            frac = 0
            if fsp:
                n = _FSP_BYTES[fsp]
                frac = int.from_bytes(buf[off + 3:off + 3 + n], "big")
                size += n
                if intpart < 0 and frac:
                    intpart += 1
                    frac -= 0x100 if n == 1 else 0x10000
                frac *= _FSP_SCALE[fsp]
            packed = (intpart << 24) + frac
        neg = packed < 0
        if neg:
            packed = -packed
        hms, micro = packed >> 24, packed & 0xFFFFFF
        hour, minute, second = (hms >> 12) & 0x3FF, (hms >> 6) & 63, hms & 63
        td = datetime.timedelta(hours=hour, minutes=minute, seconds=second, microseconds=micro)
        return (-td if neg else td), off + size

    return dec


def _date(buf: bytes, off: int) -> tuple[Value, int]:
    v = buf[off] | (buf[off + 1] << 8) | (buf[off + 2] << 16)
    year, month, day = v >> 9, (v >> 5) & 15, v & 31
    try:
        return datetime.date(year, month, day), off + 3
    except ValueError:
        return RawTemporal(f"{year:04d}-{month:02d}-{day:02d}"), off + 3


def _old_datetime(buf: bytes, off: int) -> tuple[Value, int]:
    v = int.from_bytes(buf[off:off + 8], "little")
    d, t = divmod(v, 1000000)
    year, md = divmod(d, 10000)
    month, day = divmod(md, 100)
    hour, ms = divmod(t, 10000)
    minute, second = divmod(ms, 100)
    try:
        return datetime.datetime(year, month, day, hour, minute, second), off + 8
    except ValueError:
        return RawTemporal(f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"), off + 8


def _old_timestamp(buf: bytes, off: int) -> tuple[Value, int]:
    sec = int.from_bytes(buf[off:off + 4], "little")
    if sec == 0:
        return RawTemporal("0000-00-00 00:00:00"), off + 4
    return _EPOCH + datetime.timedelta(seconds=sec), off + 4


def _old_time(buf: bytes, off: int) -> tuple[Value, int]:
    v = int.from_bytes(buf[off:off + 3], "little", signed=True)
    neg = v < 0
    v = abs(v)
    hours, ms = divmod(v, 10000)
    minutes, seconds = divmod(ms, 100)
    td = datetime.timedelta(hours=hours, minutes=minutes, seconds=seconds)
    return (-td if neg else td), off + 3


def _year(buf: bytes, off: int) -> tuple[Value, int]:
    v = buf[off]
    return (v + 1900 if v else 0), off + 1


def _bit(nbytes: int) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        return int.from_bytes(buf[off:off + nbytes], "big"), off + nbytes

    return dec


def _bit_mask(size: int) -> Decoder:
    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        return int.from_bytes(buf[off:off + size], "little"), off + size

    return dec


def _enum(values: Sequence[str], size: int) -> Decoder:
    # Index 0 is the "invalid value" '' the server stores for bad input.
    table = list(values) if values and values[0] == "" else [""] + list(values)

    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        idx = int.from_bytes(buf[off:off + size], "little")
        return (table[idx] if idx < len(table) else ""), off + size

    return dec


# Distinct SET values kept per column (the pure-Python path; tables use few
# combinations of their members; the compiled decoder, K_SET, keeps the last).
_SET_CACHE = 256


def _set(values: Sequence[str], size: int) -> Decoder:
    members = list(values)
    seen: dict[int, str] = {}

    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        mask = int.from_bytes(buf[off:off + size], "little")
        text = seen.get(mask)
        if text is None:
            text = ",".join(m for i, m in enumerate(members) if mask >> i & 1)
            if len(seen) < _SET_CACHE:
                seen[mask] = text
        return text, off + size

    return dec


def _mysql_json(length_size: int) -> Decoder:
    """MySQL's binary JSON as its JSON text (parser/mysqljson.py: exact
    DECIMALs, MySQL's own printing)."""
    to_text = mysqljson.to_text

    def dec(buf: bytes, off: int) -> tuple[Value, int]:
        n = int.from_bytes(buf[off:off + length_size], "little")
        start = off + length_size
        if n == 0:
            return "null", start
        return to_text(bytes(buf[start:start + n])), start + n

    return dec


def compile_decoder(col: Any) -> Decoder:
    """Build the decoder for one column from its TABLE_MAP metadata."""
    t = col.type
    cs = _charset(col)
    codec = _PY_CODEC.get(cs, cs)
    text_or_bytes: Callable[[bytes], Value] = bytes if cs == "binary" else _text(codec, col.name)
    u = bool(col.unsigned)
    table: dict[int, Callable[[], Decoder]] = {
        TINY: lambda: _int_decoder("B" if u else "b", 1),
        SHORT: lambda: _int_decoder("H" if u else "h", 2),
        INT24: lambda: _int24(u),
        LONG: lambda: _int_decoder("I" if u else "i", 4),
        LONGLONG: lambda: _int_decoder("Q" if u else "q", 8),
        YEAR: lambda: _year,
        FLOAT: lambda: _int_decoder("f", 4),
        DOUBLE: lambda: _int_decoder("d", 8),
        NEWDECIMAL: lambda: _decimal(col.precision, col.decimals),
        VARCHAR: lambda: _length_prefixed(1 if col.max_length < 256 else 2, text_or_bytes),
        VAR_STRING: lambda: _length_prefixed(1 if col.max_length < 256 else 2, text_or_bytes),
        STRING: lambda: _length_prefixed(
            1 if col.max_length < 256 else 2,
            _binary_fixed(col.max_length) if cs == "binary" else text_or_bytes),
        BLOB: lambda: _length_prefixed(col.length_size, text_or_bytes),
        GEOMETRY: lambda: _length_prefixed(col.length_size, bytes),
        VECTOR: lambda: _length_prefixed(col.length_size, bytes),
        JSON: lambda: _mysql_json(col.length_size),
        # Without their members (binlog_row_metadata = MINIMAL) ENUM and SET
        # values are their index and bit mask, as stored.
        ENUM: lambda: _enum(col.enum_values, col.size) if col.enum_values else _bit_mask(col.size),
        SET: lambda: _set(col.set_values, col.size) if col.set_values else _bit_mask(col.size),
        BIT: lambda: _bit(col.bytes),
        DATE: lambda: _date,
        NEWDATE: lambda: _date,
        DATETIME: lambda: _old_datetime,
        DATETIME2: lambda: _datetime2(col.fsp or 0),
        TIMESTAMP: lambda: _old_timestamp,
        TIMESTAMP2: lambda: _timestamp2(col.fsp or 0),
        TIME: lambda: _old_time,
        TIME2: lambda: _time2(col.fsp or 0),
        NULL: lambda: (lambda buf, off: (None, off)),
    }
    if t not in table:
        raise UnsupportedEventError(f"column {col.name!r} has MySQL field type {t}, which Cynomys cannot decode")
    if getattr(col, "compressed", False):  # MariaDB COMPRESSED: handed over as VARCHAR/BLOB (parser/tablemap.py)
        prefix = col.length_size if t == BLOB else 1 if col.max_length < 256 else 2
        return _length_prefixed(prefix, lambda raw: text_or_bytes(inflate_column(bytes(raw), col.name)))
    return table[t]()


# Column kinds of the compiled decoder's plan (the enum in _speedups.c).
K_PY, K_INT, K_FLOAT, K_DOUBLE, K_DECIMAL, K_TEXT_UTF8, K_TEXT_CODEC, K_BYTES, K_BINARY_FIXED = range(9)
K_DATE, K_DATETIME2, K_TIMESTAMP2, K_TIME2, K_YEAR, K_BIT, K_ENUM, K_NULL, K_SET = range(9, 18)
# (kind, a, b, obj, pure decoder): one column of the compiled decoder's plan.
PlanEntry = tuple[int, int, int, Any, Decoder]


def _plan_for(col: Any, pydec: Decoder) -> PlanEntry:
    """The compiled decoder's instructions for one column; parameters as
    ``compile_decoder`` reads them, so both paths agree by construction.
    K_PY: the compiled decoder calls ``pydec`` for every value."""
    t = col.type
    cs = _charset(col)
    codec = _PY_CODEC.get(cs, cs)

    def text(prefix: int) -> PlanEntry:
        if cs == "binary":
            return (K_BYTES, prefix, 0, None, pydec)
        if codec == "utf-8":
            return (K_TEXT_UTF8, prefix, 0, None, pydec)
        return (K_TEXT_CODEC, prefix, 0, codec, pydec)

    if getattr(col, "compressed", False):
        return (K_PY, 0, 0, None, pydec)  # inflated by the reference decoder, on both paths
    if t in _INT_FIELDS:
        return (K_INT, _INT_FIELDS[t].size, int(bool(col.unsigned)), None, pydec)
    if t in (VARCHAR, VAR_STRING):
        return text(1 if col.max_length < 256 else 2)
    if t == STRING:
        prefix = 1 if col.max_length < 256 else 2
        return (K_BINARY_FIXED, prefix, col.max_length, None, pydec) if cs == "binary" else text(prefix)
    if t == BLOB:
        return text(col.length_size)
    if t in (GEOMETRY, VECTOR):
        return (K_BYTES, col.length_size, 0, None, pydec)
    if t == NEWDECIMAL:
        return (K_DECIMAL, col.precision, col.decimals, None, pydec)
    if t == ENUM and col.enum_values:
        values = list(col.enum_values)
        return (K_ENUM, col.size, 0, values if values and values[0] == "" else [""] + values, pydec)
    if t == SET and col.set_values:
        # The members in declared order (bit i is member i), as _set joins them.
        return (K_SET, col.size, 0, list(col.set_values), pydec)
    if t in (DATETIME2, TIMESTAMP2, TIME2):
        kinds = {DATETIME2: K_DATETIME2, TIMESTAMP2: K_TIMESTAMP2, TIME2: K_TIME2}
        return (kinds[t], col.fsp or 0, 0, None, pydec)
    if t == BIT:
        return (K_BIT, col.bytes, 0, None, pydec)
    simple = {FLOAT: K_FLOAT, DOUBLE: K_DOUBLE, YEAR: K_YEAR, DATE: K_DATE, NEWDATE: K_DATE, NULL: K_NULL}
    # Anything else (JSON, the old DATETIME/TIMESTAMP/TIME, ENUM/SET without members) is K_PY.
    return (simple.get(t, K_PY), 0, 0, None, pydec)


@dataclass(frozen=True)
class TableDecoder:
    """Decoders for every column of one TABLE_MAP, compiled once."""

    decoders: tuple[Decoder, ...]
    columns: tuple[ColumnDef, ...]
    key: tuple[str, ...]
    plan: tuple[PlanEntry, ...] = ()
    #: the plan compiled by the extension (with its value caches), when it is built
    compiled_plan: Any = field(default=None, compare=False, repr=False)
    #: per column: the JSON column's model decoder (partial JSON updates), else None
    json_models: tuple[mysqljson.ModelDecoder | None, ...] = ()

    @classmethod
    def from_table_map(cls, columns: Sequence[Any], primary_key: Sequence[int]) -> TableDecoder:
        compiled.announce()
        defs = column_defs(columns)
        key = tuple(defs[i].name for i in primary_key)
        decoders = tuple(compile_decoder(c) for c in columns)
        plan = tuple(_plan_for(c, d) for c, d in zip(columns, decoders))
        models = tuple(mysqljson.model_decoder(c.length_size) if c.type == JSON else None for c in columns)
        return cls(decoders, defs, key, plan, compiled.make_plan(plan), models)

    def _read_image(self, buf: bytes, off: int, present: int) -> tuple[Row, int]:
        """One row image.  ``present`` is the columns-present bitmap as int."""
        decoders = self.decoders
        n = len(decoders)
        if present == (1 << n) - 1:
            null_len = (n + 7) >> 3
            nulls = int.from_bytes(buf[off:off + null_len], "little")
            off += null_len
            if not nulls:
                out: list[Value] = []
                for d in decoders:
                    v, off = d(buf, off)
                    out.append(v)
                return tuple(out), off
            out = []
            for i, d in enumerate(decoders):
                if nulls >> i & 1:
                    out.append(None)
                else:
                    v, off = d(buf, off)
                    out.append(v)
            return tuple(out), off
        raise UnsupportedEventError(
            "a ROWS event holds a partial row image (binlog_row_image is not FULL)",
            hint="SET GLOBAL binlog_row_image=FULL on the source (and in its config file)",
        )

    def rows(self, buf: bytes, present: int, pairs: bool) -> list[tuple[Row, Row | None]]:
        """All rows of an event body.  ``pairs`` for UPDATE (before, after)."""
        ext = compiled.ext
        if ext is not None and self.compiled_plan is not None and present == (1 << len(self.plan)) - 1 \
                and type(buf) is bytes:
            try:
                rows: list[tuple[Row, Row | None]] = ext.decode_rows(buf, self.compiled_plan, pairs)
                return rows
            except ext.Fallback:
                # Something the reference must judge: decode (or fail) exactly as it does.
                compiled.fallbacks["decode"] += 1
        out: list[tuple[Row, Row | None]] = []
        off, end = 0, len(buf)
        read = self._read_image
        while off < end:
            first, off = read(buf, off, present)
            if pairs:
                second, off = read(buf, off, present)
                out.append((first, second))
            else:
                out.append((first, None))
        return out

    # -- PARTIAL_UPDATE_ROWS (MySQL binlog_row_value_options = PARTIAL_JSON) --
    def _read_models(self, buf: bytes, off: int) -> tuple[list[Any], int, int]:
        """A full row image with JSON columns as models: values, the null
        bits, the offset after it."""
        n = len(self.decoders)
        null_len = (n + 7) >> 3
        nulls = int.from_bytes(buf[off:off + null_len], "little")
        off += null_len
        out: list[Any] = []
        for i, d in enumerate(self.decoders):
            if nulls >> i & 1:
                out.append(None)
                continue
            model = self.json_models[i]
            v, off = (model or d)(buf, off)
            out.append(v)
        return out, nulls, off

    def _text(self, values: list[Any], nulls: int) -> Row:
        return tuple(mysqljson.dumps(v) if self.json_models[i] is not None and not nulls >> i & 1 else v
                     for i, v in enumerate(values))

    def partial_rows(self, buf: bytes, present: int, where: str) -> list[tuple[Row, Row | None]]:
        """(before, after) pairs of a PARTIAL_UPDATE_ROWS event body.  Each
        after image starts with its value options; with PARTIAL_JSON_UPDATES
        (bit 0) a bitmap says which JSON columns hold a diff vector instead
        of a value, and each diff vector is applied to the column's before
        image, so the after image carries the full JSON.  ``where``: the
        table and position, for the error when a diff does not apply."""
        n = len(self.decoders)
        if present != (1 << n) - 1:
            raise UnsupportedEventError(
                "a ROWS event holds a partial row image (binlog_row_image is not FULL)",
                hint="SET GLOBAL binlog_row_image=FULL on the source (and in its config file)")
        json_cols = [i for i, m in enumerate(self.json_models) if m is not None]
        out: list[tuple[Row, Row | None]] = []
        off, end = 0, len(buf)
        while off < end:
            before, before_nulls, off = self._read_models(buf, off)
            options, off = lenenc(buf, off)
            partial = 0
            if options & 1:
                width = (len(json_cols) + 7) // 8
                partial = int.from_bytes(buf[off:off + width], "little")
                off += width
            diffed = {col for bit, col in enumerate(json_cols) if partial >> bit & 1}
            null_len = (n + 7) >> 3
            nulls = int.from_bytes(buf[off:off + null_len], "little")
            off += null_len
            after: list[Any] = []
            for i, d in enumerate(self.decoders):
                if nulls >> i & 1:
                    after.append(None)
                elif i in diffed:
                    diffs, off = mysqljson.read_diffs(buf, off)
                    after.append(self._apply(before, before_nulls, i, diffs, where))
                else:
                    v, off = (self.json_models[i] or d)(buf, off)
                    after.append(v)
            out.append((self._text(before, before_nulls), self._text(after, nulls)))
        return out

    def _apply(self, before: list[Any], nulls: int, i: int, diffs: list[mysqljson.Diff], where: str) -> Any:
        name = self.columns[i].name
        try:
            if nulls >> i & 1:
                raise mysqljson.DiffError("the before image is SQL NULL")
            return mysqljson.apply_diffs(copy.deepcopy(before[i]), diffs)
        except mysqljson.DiffError as exc:
            raise UnsupportedEventError(
                f"partial JSON update of column {name!r} of {where} cannot be applied to its before image: {exc}",
                hint="the binlog does not match the row it updates; re-snapshot the table, and consider "
                     "SET GLOBAL binlog_row_value_options='' on the source") from None
