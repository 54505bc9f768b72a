"""Source-type comments: how a target remembers a column's source type.

Every target reads the same type text (``ColumnDef.type``: the
``information_schema.COLUMN_TYPE`` spelling) and some keep it next to the
column they create, so a value read back decodes by the type it had on the
source.  The helpers on the type text itself (parameters, ENUM/SET members,
TIME/DATETIME text) live in ``cynomys.core.sourcetypes`` with the rest of the
source-type catalog.
"""
from __future__ import annotations

#: Prefix of a column comment that records the source type ('cynomys:time(6)').
SOURCE_TYPE_TAG = "cynomys:"
#: Tags older tables carry (Spark/Iceberg wrote 'mysql:'); still read.
LEGACY_SOURCE_TYPE_TAGS = ("mysql:",)


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
