"""Canonical helpers on source (MySQL/MariaDB) column types, shared by targets.

Every target reads the same type text (``ColumnDef.type``: the
``information_schema.COLUMN_TYPE`` spelling) and some keep it next to the
column they create, so a value read back decodes by the type it had on the
source.  The text helpers for temporal values live here too: MySQL's TIME
spans +-838 hours, which no ``datetime.time`` holds.
"""
from __future__ import annotations

import datetime
import re

#: Prefix of a column comment that records the source type ('cynomys:time(6)').
SOURCE_TYPE_TAG = "cynomys:"
#: Tags older tables carry (Spark/Iceberg wrote 'mysql:'); still read.
LEGACY_SOURCE_TYPE_TAGS = ("mysql:",)

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


def source_type_comment(type_text: str) -> str:
    """The comment a target puts on a column to remember its source type."""
    return SOURCE_TYPE_TAG + type_text


def source_type_from_comment(remark: str | None) -> str | None:
    """The source type a column comment records, or None."""
    if remark:
        for tag in (SOURCE_TYPE_TAG,) + LEGACY_SOURCE_TYPE_TAGS:
            if remark.startswith(tag):
                return remark[len(tag):]
    return None


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
