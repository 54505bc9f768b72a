"""MySQL's binary JSON (the JSON column in row images) and its partial
updates (binlog_row_value_options = PARTIAL_JSON).

The binary format (MySQL sql-common/json_binary.cc): a type byte, then

- objects and arrays, small (2-byte counts and offsets) or large (4-byte):
  element count, byte size, [key entries: offset, 2-byte length], value
  entries (type byte and an offset, or the value itself when it fits:
  literals, int16/uint16, and int32/uint32 in large ones); offsets count
  from the start of the object;
- literals (null, true, false), int16/uint16/int32/uint32/int64/uint64,
  double (8 bytes), all little-endian;
- string: its byte length in 7-bit groups (high bit: more follow), UTF-8;
- opaque: a MySQL field type byte, a 7-bit-group length and the bytes --
  DECIMAL (precision, scale, the row format's binary decimal), and DATE,
  TIME, DATETIME, TIMESTAMP as one packed 64-bit integer.

Values become a small model (dict, list, str, int, float, decimal.Decimal,
bool, None, ``Temporal``, ``Opaque``) and are printed the way MySQL prints
JSON: ``", "`` and ``": "`` separators, object keys in MySQL's order
(shorter keys first, then by bytes), DECIMAL with its exact digits (never
through a float), DATETIME as ``"YYYY-MM-DD hh:mm:ss.ffffff"``.

A partial update (a ``Json_diff_vector``) is a 4-byte length and diffs:
operation (0 REPLACE, 1 INSERT, 2 REMOVE), path length and path (MySQL JSON
path text), and for REPLACE/INSERT a value length and a binary JSON value.
``apply_diffs`` applies them to the before image as the server does
(sql/json_diff.cc ``apply_json_diffs``); a diff that does not apply is
``DiffError``, never a guess.
"""
from __future__ import annotations

import base64
import decimal
import json
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable

from cynomys.core.errors import UnsupportedEventError

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY, LITERAL = range(5)
INT16, UINT16, INT32, UINT32, INT64, UINT64, DOUBLE, STRING = range(5, 13)
OPAQUE = 0x0F
_INLINE_SMALL = {LITERAL, INT16, UINT16}
_INLINE_LARGE = {LITERAL, INT16, UINT16, INT32, UINT32}
_FIXED = {INT16: "<h", UINT16: "<H", INT32: "<i", UINT32: "<I", INT64: "<q", UINT64: "<Q", DOUBLE: "<d"}
# MySQL field types inside opaque values.
_DECIMAL_TYPES = {0, 246}
_DATE, _TIME, _DATETIME, _TIMESTAMP = 10, 11, 12, 7

REPLACE, INSERT, REMOVE = 0, 1, 2
OPERATIONS = {REPLACE: "REPLACE", INSERT: "INSERT", REMOVE: "REMOVE"}


class JsonFormatError(UnsupportedEventError):
    """Bytes that are not MySQL binary JSON."""


class DiffError(ValueError):
    """A partial JSON update that cannot be applied to the before image."""


@dataclass(frozen=True)
class Temporal:
    """A DATE/TIME/DATETIME/TIMESTAMP inside JSON: printed as its text."""

    text: str


@dataclass(frozen=True)
class Opaque:
    """Any other opaque value: MySQL prints it as base64:typeNN:..."""

    field_type: int
    data: bytes


# --------------------------------------------------------------------------
# Binary -> model
# --------------------------------------------------------------------------
def _varlen(buf: bytes, off: int) -> tuple[int, int]:
    n, shift = 0, 0
    for i in range(5):
        if off + i >= len(buf):
            break
        b = buf[off + i]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, off + i + 1
        shift += 7
    raise JsonFormatError("binary JSON: bad variable-length size")


def _packed_temporal(field_type: int, packed: int) -> str:
    neg = packed < 0
    if neg:
        packed = -packed
    frac = packed % (1 << 24)
    ymdhms = packed >> 24
    if field_type == _TIME:
        hms = ymdhms
        hour, minute, second = (hms >> 12) % (1 << 10), (hms >> 6) % 64, hms % 64
        return f"{'-' if neg else ''}{hour:02d}:{minute:02d}:{second:02d}.{frac:06d}"
    ymd, hms = ymdhms >> 17, ymdhms % (1 << 17)
    ym, day = ymd >> 5, ymd % 32
    year, month = divmod(ym, 13)
    if field_type == _DATE:
        return f"{year:04d}-{month:02d}-{day:02d}"
    hour, minute, second = hms >> 12, (hms >> 6) % 64, hms % 64
    return f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}.{frac:06d}"


def _opaque(buf: bytes, off: int) -> Any:
    field_type = buf[off]
    n, start = _varlen(buf, off + 1)
    data = buf[start:start + n]
    if len(data) < n:
        raise JsonFormatError("binary JSON: opaque value cut short")
    if field_type in _DECIMAL_TYPES:
        from cynomys.parser.rows import _decimal

        value, _ = _decimal(data[0], data[1])(data, 2)
        return value
    if field_type in (_DATE, _TIME, _DATETIME, _TIMESTAMP) and n >= 8:
        return Temporal(_packed_temporal(field_type, struct.unpack_from("<q", data, 0)[0]))
    return Opaque(field_type, bytes(data))


def _container(buf: bytes, off: int, large: bool, is_object: bool) -> Any:
    w = 4 if large else 2
    fmt = "<I" if large else "<H"
    if off + 2 * w > len(buf):
        raise JsonFormatError("binary JSON: container header cut short")
    count = struct.unpack_from(fmt, buf, off)[0]
    size = struct.unpack_from(fmt, buf, off + w)[0]
    if off + size > len(buf):
        raise JsonFormatError("binary JSON: container larger than its value")
    inline = _INLINE_LARGE if large else _INLINE_SMALL
    keys_at = off + 2 * w
    key_entry = w + 2
    values_at = keys_at + (count * key_entry if is_object else 0)
    value_entry = 1 + w
    values = []
    for i in range(count):
        e = values_at + i * value_entry
        t = buf[e]
        if t in inline:
            values.append(_scalar(t, buf, e + 1))
        else:
            values.append(parse_value(t, buf, off + struct.unpack_from(fmt, buf, e + 1)[0]))
    if not is_object:
        return values
    out: dict[str, Any] = {}
    for i in range(count):
        e = keys_at + i * key_entry
        k_off = struct.unpack_from(fmt, buf, e)[0]
        k_len = struct.unpack_from("<H", buf, e + w)[0]
        out[bytes(buf[off + k_off:off + k_off + k_len]).decode("utf-8")] = values[i]
    return out


def _scalar(t: int, buf: bytes, off: int) -> Any:
    if t == LITERAL:
        lit = buf[off]
        if lit > 2:
            raise JsonFormatError(f"binary JSON: literal {lit}")
        return (None, True, False)[lit]
    return struct.unpack_from(_FIXED[t], buf, off)[0]


def parse_value(t: int, buf: bytes, off: int) -> Any:
    """The value of type ``t`` stored at ``off`` of ``buf``."""
    try:
        if t in (SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY):
            return _container(buf, off, t in (LARGE_OBJECT, LARGE_ARRAY), t in (SMALL_OBJECT, LARGE_OBJECT))
        if t == STRING:
            n, start = _varlen(buf, off)
            if start + n > len(buf):
                raise JsonFormatError("binary JSON: string cut short")
            return bytes(buf[start:start + n]).decode("utf-8")
        if t == OPAQUE:
            return _opaque(buf, off)
        if t in _FIXED or t == LITERAL:
            return _scalar(t, buf, off)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise JsonFormatError(f"binary JSON: {exc}") from None
    raise JsonFormatError(f"binary JSON: unknown value type 0x{t:02X}")


def parse(data: bytes) -> Any:
    """A whole binary JSON value (type byte first); b'' is JSON null (how
    the server stores an empty value)."""
    if not data:
        return None
    return parse_value(data[0], data, 1)


# --------------------------------------------------------------------------
# Model -> text
# --------------------------------------------------------------------------
def _key_order(k: str) -> tuple[int, bytes]:
    b = k.encode("utf-8")
    return len(b), b


def _double(v: float) -> str:
    text = repr(v)
    if "e" in text:  # MySQL: 1e300, 1.5e-7 (no '+', no leading zeros)
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def dumps(v: Any) -> str:
    """A model value as MySQL prints the JSON."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _double(v)
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {dumps(v[k])}"
                               for k in sorted(v, key=_key_order)) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(dumps(x) for x in v) + "]"
    if isinstance(v, Temporal):
        return json.dumps(v.text)
    if isinstance(v, Opaque):
        return json.dumps(f"base64:type{v.field_type}:{base64.b64encode(v.data).decode('ascii')}")
    raise TypeError(f"not a JSON model value: {type(v).__name__}")


def to_text(data: bytes) -> str:
    return dumps(parse(data))


# --------------------------------------------------------------------------
# Partial updates
# --------------------------------------------------------------------------
_LEG = re.compile(r'\.(?:([A-Za-z_$][\w$]*)|("(?:[^"\\]|\\.)*"))|\[\s*(?:(\d+)|last(?:\s*-\s*(\d+))?)\s*\]')


@dataclass(frozen=True)
class Leg:
    member: str | None = None      # an object member, or
    index: int = 0                 # an array cell: index, counted from the end when from_end
    from_end: bool = False

    def position(self, length: int) -> int:
        """MySQL's Json_array_index: from the end, or clamped to the length."""
        if self.from_end:
            return length - 1 - self.index if self.index < length else 0
        return min(self.index, length)

    def __str__(self) -> str:
        if self.member is not None:
            return "." + json.dumps(self.member, ensure_ascii=False)
        return f"[last-{self.index}]" if self.from_end else f"[{self.index}]"


def parse_path(text: str) -> tuple[Leg, ...]:
    """A MySQL JSON path without wildcards ($.a."b c"[3][last-1])."""
    s = text.strip()
    if not s.startswith("$"):
        raise DiffError(f"path {text!r} does not start with $")
    legs: list[Leg] = []
    pos = 1
    while pos < len(s):
        if s[pos].isspace():
            pos += 1
            continue
        m = _LEG.match(s, pos)
        if m is None:
            raise DiffError(f"path {text!r}: cannot read it at {s[pos:]!r}")
        name, quoted, idx, back = m.groups()
        if name is not None:
            legs.append(Leg(member=name))
        elif quoted is not None:
            legs.append(Leg(member=json.loads(quoted)))
        elif idx is not None:
            legs.append(Leg(index=int(idx)))
        else:
            legs.append(Leg(index=int(back or 0), from_end=True))
        pos = m.end()
    return tuple(legs)


@dataclass(frozen=True)
class Diff:
    op: int
    path: str
    value: Any = None   # the model value (REPLACE, INSERT)

    def __str__(self) -> str:
        return f"{OPERATIONS[self.op]} at {self.path}"


def _lenenc(buf: bytes, off: int) -> tuple[int, int]:
    from cynomys.parser.raw import lenenc

    return lenenc(buf, off)


def read_diffs(buf: bytes, off: int) -> tuple[list[Diff], int]:
    """A Json_diff_vector at ``off`` (its 4-byte length first) -> diffs and
    the offset after it."""
    length = int.from_bytes(buf[off:off + 4], "little")
    pos, end = off + 4, off + 4 + length
    if end > len(buf):
        raise JsonFormatError("partial JSON: the diff vector is longer than the row")
    out: list[Diff] = []
    while pos < end:
        op = buf[pos]
        if op not in OPERATIONS:
            raise JsonFormatError(f"partial JSON: unknown diff operation {op}")
        n, pos = _lenenc(buf, pos + 1)
        path = bytes(buf[pos:pos + n]).decode("utf-8")
        pos += n
        value = None
        if op != REMOVE:
            n, pos = _lenenc(buf, pos)
            value = parse(bytes(buf[pos:pos + n]))
            pos += n
        out.append(Diff(op, path, value))
    if pos != end:
        raise JsonFormatError("partial JSON: a diff runs past the diff vector")
    return out, end


def _seek(doc: Any, legs: tuple[Leg, ...]) -> tuple[bool, Any]:
    for leg in legs:
        if isinstance(doc, list) and leg.member is None:
            i = leg.position(len(doc))
            if i >= len(doc):
                return False, None
            doc = doc[i]
        elif isinstance(doc, dict) and leg.member is not None:
            if leg.member not in doc:
                return False, None
            doc = doc[leg.member]
        else:
            return False, None
    return True, doc


def apply_diffs(doc: Any, diffs: list[Diff]) -> Any:
    """The document after the diffs, applied in order as the server does
    (``doc`` is changed in place where it can be, and returned)."""
    for diff in diffs:
        legs = parse_path(diff.path)
        if not legs:
            raise DiffError(f"{diff}: a diff cannot {OPERATIONS[diff.op]} the whole document")
        found, parent = _seek(doc, legs[:-1])
        last = legs[-1]
        if not found:
            raise DiffError(f"{diff}: the path's parent is not in the document")
        if diff.op == REPLACE:
            if isinstance(parent, dict) and last.member is not None and last.member in parent:
                parent[last.member] = diff.value
            elif isinstance(parent, list) and last.member is None and last.position(len(parent)) < len(parent):
                parent[last.position(len(parent))] = diff.value
            else:
                raise DiffError(f"{diff}: nothing at that path to replace")
        elif diff.op == INSERT:
            if isinstance(parent, dict) and last.member is not None:
                if last.member in parent:
                    raise DiffError(f"{diff}: the member is already there")
                parent[last.member] = diff.value
            elif isinstance(parent, list) and last.member is None:
                parent.insert(last.position(len(parent)), diff.value)
            else:
                raise DiffError(f"{diff}: the path's parent is not an object or array of that kind")
        else:
            if isinstance(parent, dict) and last.member is not None and last.member in parent:
                del parent[last.member]
            elif isinstance(parent, list) and last.member is None and last.position(len(parent)) < len(parent):
                del parent[last.position(len(parent))]
            else:
                raise DiffError(f"{diff}: nothing at that path to remove")
    return doc


#: A decoder of one JSON column value: (buf, off) -> (model, new_off).
ModelDecoder = Callable[[bytes, int], "tuple[Any, int]"]


def model_decoder(length_size: int) -> ModelDecoder:
    def dec(buf: bytes, off: int) -> tuple[Any, int]:
        n = int.from_bytes(buf[off:off + length_size], "little")
        start = off + length_size
        return parse(bytes(buf[start:start + n])), start + n

    return dec
