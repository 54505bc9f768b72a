"""The source's (MySQL/MariaDB) column types as data: one catalog for every layer.

Every part of Cynomys reads the same type text (``ColumnDef.type``: the
``information_schema.COLUMN_TYPE`` spelling, 'bigint unsigned',
'decimal(65,30)', "enum('a','b')") and needs the same facts about it: which
integer family a name is and its ranges, which names are text, binary,
LOB or spatial types, how type parameters and ENUM/SET members are written.
They live here once; the parser, the snapshot, verify and each target read
them, and a target keeps only what differs for it (its own type per family)
as a table keyed by these names -- the sqlglot ``TYPE_MAPPING`` pattern.

The TIME and DATETIME text helpers live here too: MySQL's TIME spans
+-838 hours, which no ``datetime.time`` holds, and every dialect and
target writes these values the same way.
"""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Iterable


# --------------------------------------------------------------------------
# Integer families
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class IntFamily:
    """One MySQL integer type: its storage width and the ranges it holds.

    The ranges are written out (not computed) so the table reads as the
    server documents it; tests/unit/test_dialect.py checks them against
    ``2**bits``."""

    name: str
    bits: int
    signed: tuple[int, int]
    unsigned: tuple[int, int]

    @property
    def size(self) -> int:
        """Bytes of a value in a row image."""
        return self.bits // 8

    def bounds(self, unsigned: bool) -> tuple[int, int]:
        """(lowest, highest) value of the SIGNED or UNSIGNED type."""
        return self.unsigned if unsigned else self.signed


#: The integer families in order of width, by base type name.
INT_FAMILIES: dict[str, IntFamily] = {f.name: f for f in (
    IntFamily("tinyint", 8, (-128, 127), (0, 255)),
    IntFamily("smallint", 16, (-32768, 32767), (0, 65535)),
    IntFamily("mediumint", 24, (-8388608, 8388607), (0, 16777215)),
    IntFamily("int", 32, (-2147483648, 2147483647), (0, 4294967295)),
    IntFamily("bigint", 64, (-9223372036854775808, 9223372036854775807), (0, 18446744073709551615)),
)}

#: Other spellings of an integer family that some type text may carry (the
#: parsers normalise to the names above; targets reading type text written
#: elsewhere accept these too).
INT_SYNONYMS: dict[str, str] = {"integer": "int"}

#: What BOOL/BOOLEAN is on the source.
BOOLEAN_NAMES = ("bool", "boolean")
BOOLEAN_FAMILY = INT_FAMILIES["tinyint"]


def int_family(base_type: str) -> IntFamily | None:
    """The integer family of a base type name (synonyms included), or None."""
    return INT_FAMILIES.get(INT_SYNONYMS.get(base_type, base_type))


# --------------------------------------------------------------------------
# Other families
# --------------------------------------------------------------------------
#: DECIMAL and its synonyms.
DECIMAL_NAMES = ("decimal", "numeric", "dec", "fixed")

#: TINY/-/MEDIUM/LONG BLOB and TEXT by the bytes of their length prefix:
#: a type with an n-byte prefix holds fewer than 2**(8*n) bytes.
LOB_PREFIX: dict[int, str] = {1: "tiny", 2: "", 3: "medium", 4: "long"}


def lob_type(family: str, length_bytes: int) -> str:
    """('blob', 3) -> 'mediumblob'; ``family`` is 'blob' or 'text'."""
    return LOB_PREFIX[length_bytes] + family


def smallest_lob(family: str, nbytes: int) -> str:
    """The smallest BLOB/TEXT type that holds ``nbytes`` bytes (as the server
    picks for BLOB(n)/TEXT(n))."""
    widths = sorted(LOB_PREFIX)
    return lob_type(family, next((n for n in widths if nbytes < 2 ** (8 * n)), widths[-1]))


#: The TEXT and BLOB families, smallest first.
TEXT_LOBS = tuple(lob_type("text", n) for n in LOB_PREFIX)
BLOBS = tuple(lob_type("blob", n) for n in LOB_PREFIX)

#: Character types, and the binary type each becomes when declared
#: CHARACTER SET binary (same position in ``BINARY_TYPES``).
TEXT_TYPES = ("char", "varchar") + TEXT_LOBS
BINARY_TYPES = ("binary", "varbinary") + BLOBS
BINARY_OF_TEXT: dict[str, str] = dict(zip(TEXT_TYPES, BINARY_TYPES))

#: Types whose value is the text of a member list or document.
MEMBER_TYPES = ("enum", "set")
#: Every type a target may keep as plain text (characters, members, JSON).
STRING_TYPES = TEXT_TYPES + MEMBER_TYPES + ("json",)

#: Spatial types; their values are the server's internal bytes.
SPATIAL_TYPES = ("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                 "multipolygon", "geometrycollection")


# --------------------------------------------------------------------------
# Type text
# --------------------------------------------------------------------------
_PARAMS = re.compile(r"\(([\d,\s]+)\)")
_MEMBER = re.compile(r"'((?:[^'\\]|''|\\.)*)'")


def type_params(type_text: str) -> list[int]:
    """'decimal(65,30)' -> [65, 30]; 'int' -> []."""
    m = _PARAMS.search(type_text)
    return [int(p) for p in m.group(1).split(",")] if m else []


def members(type_text: str) -> list[str]:
    """"enum('a','it''s')" -> ['a', "it's"]."""
    inner = type_text[type_text.index("(") + 1:type_text.rindex(")")]
    return [re.sub(r"''|\\(.)", lambda m: m.group(1) or "'", v) for v in _MEMBER.findall(inner)]


def members_text(values: Iterable[str]) -> str:
    """ENUM/SET members as SHOW CREATE TABLE writes them (the inverse of
    ``members``): each quoted, ' doubled, backslash escaped, comma-joined."""
    return ",".join("'" + v.replace("\\", "\\\\").replace("'", "''") + "'" for v in values)


# --------------------------------------------------------------------------
# Temporal values as text
# --------------------------------------------------------------------------
def timedelta_micros(td: datetime.timedelta) -> int:
    """A TIME value as signed microseconds (exact, unlike total_seconds())."""
    return (td.days * 86400 + td.seconds) * 1_000_000 + td.microseconds


def time_text(td: datetime.timedelta, always_fraction: bool = True) -> str:
    """A TIME value as MySQL writes it: '-838:59:59.000000'."""
    total = timedelta_micros(td)
    sign, total = ("-" if total < 0 else ""), abs(total)
    secs, micro = divmod(total, 1_000_000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    fraction = f".{micro:06d}" if always_fraction or micro else ""
    return f"{sign}{h:02d}:{m:02d}:{s:02d}{fraction}"


def datetime_text(v: datetime.datetime, always_fraction: bool = True) -> str:
    """A DATETIME/TIMESTAMP as text; an aware value (TIMESTAMP) in UTC, for
    sessions that run with the UTC time zone."""
    if v.tzinfo is not None:
        v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return v.isoformat(sep=" ", timespec="microseconds" if always_fraction or v.microsecond else "seconds")


# --------------------------------------------------------------------------
# Types that travel as their binlog bytes
# --------------------------------------------------------------------------
#: MariaDB types the binlog's TABLE_MAP describes as BINARY(n) (it does not
#: tell them apart): their values travel as the row image's bytes -- INET4
#: and INET6 in network order, UUID in its text order -- and every reader
#: (row decoder, DDL parser, snapshot) gives them this type.
BINARY_OF_SOURCE_TYPE = {"inet4": "binary(4)", "inet6": "binary(16)", "uuid": "binary(16)"}

#: MySQL 9's VECTOR holds at most this many dimensions (the default of VECTOR).
VECTOR_MAX_DIMENSIONS = 2048


def vector_type(dimensions: int) -> str:
    """VECTOR(n) as the bytes it is stored as: n float32 values, little-endian."""
    return f"varbinary({4 * (dimensions or VECTOR_MAX_DIMENSIONS)})"
