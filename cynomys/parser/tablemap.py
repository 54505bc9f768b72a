"""TABLE_MAP events parsed once per distinct event body, not once per transaction.

MariaDB and MySQL write a TABLE_MAP before the rows of every table in every
transaction.  With ``binlog_row_metadata = FULL`` it carries every column's
name, type, charset and the primary key, and mysql-replication (1.0.17)
turns it into Column objects value by value: on an OLTP source of small
transactions that was ~60% of the producer's reading time (profile in
bench/producer_oltp.py), far more than the row decoding itself.

The body of a TABLE_MAP (table id, names, types, metadata, optional
metadata) fully determines what the library parses from it, as long as the
column names come from the event and not from a query to the server (the
library asks information_schema when the optional metadata has no names;
such events are never cached).  So the parsed attributes are kept per body
bytes and copied onto the next event with the same body.

The library picks its event class from a private map; ``install`` points the
TABLE_MAP entry at the caching subclass.  mysql-replication is pinned
(setup.cfg), and ``install`` checks the map is what it expects: otherwise it
logs once and the library's own class stays (slower, same result).
"""
from __future__ import annotations

import logging
from typing import Any

from pymysqlreplication import constants
from pymysqlreplication import packet as rp_packet
from pymysqlreplication.event import BinLogEvent
from pymysqlreplication.row_event import TableMapEvent

from cynomys.parser.mysql8 import VECTOR, table_map_for_library, table_map_types

log = logging.getLogger(__name__)

# Attributes BinLogEvent.__init__ sets for each event (the packet, its
# timestamp, ...): never copied from a cached event.
_PER_EVENT = frozenset({"packet", "table_map", "event_type", "timestamp", "event_size", "_post_header_lengths",
                        "_ctl_connection", "mysql_version", "_ignore_decode_errors", "_verify_checksum",
                        "_is_event_valid", "_processed", "complete", "dbms"})
# Distinct bodies kept; table ids change after DDL and restarts, so old
# bodies are dropped wholesale when this many have been seen (a re-parse
# of each live table is all that costs).
MAX_BODIES = 4096


class CachedTableMapEvent(TableMapEvent):
    """TableMapEvent whose parse is reused for a byte-identical body.

    ``body`` holds the event's bytes after the common header (what the
    parse reads): BinlogSource keys its row decoders on it too."""

    _cache: dict[bytes, dict[str, Any]] = {}

    def __init__(self, from_packet: Any, event_size: int, table_map: dict[int, Any], ctl_connection: Any,
                 **kwargs: Any) -> None:
        # Peeked, not read: the library's parse below reads the same bytes
        # and measures what is left of the event from the packet's position
        # (bytes_to_read), so they must stay where they are.
        raw = from_packet.packet
        body = bytes(raw.get_bytes(raw._position, event_size))
        hit = self._cache.get(body)
        vectors: dict[int, int] = {}
        compressed: tuple[int, ...] = ()
        if hit is None:
            # MariaDB's COMPRESSED columns, MySQL 9's VECTOR columns and
            # optional metadata the library does not know: it parses a
            # rewritten copy (above; mysql8.py).
            new_body = body
            unpacked = uncompressed_types(body)
            if unpacked is not None:
                new_body, compressed = unpacked
            fixed = table_map_for_library(new_body)
            if fixed is not None:
                new_body, vectors = fixed
            if new_body is not body:
                at = raw._position
                raw._data = raw._data[:at] + new_body + raw._data[at + event_size:]
                event_size = len(new_body)
        if hit is not None:
            BinLogEvent.__init__(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
            self.__dict__.update(hit)
            table_map[self.table_id] = self.table_obj
            self.body = body
            return
        super().__init__(from_packet, event_size, table_map, ctl_connection, **kwargs)
        self.body = body
        for i in compressed:  # the row decoders inflate their values (parser/rows.py inflate_column)
            if self._processed and i < len(self.columns):
                self.columns[i].compressed = True
        for i, dims in vectors.items():
            if self._processed and i < len(self.columns):
                self.columns[i].type = VECTOR
                self.columns[i].dimensions = dims
        meta = getattr(self, "optional_metadata", None)
        if self._processed and meta is not None and len(getattr(meta, "column_name_list", ()) or ()) > 0:
            if len(self._cache) >= MAX_BODIES:
                self._cache.clear()
            self._cache[body] = {k: v for k, v in self.__dict__.items() if k not in _PER_EVENT and k != "body"}


#: MariaDB's TABLE_MAP types of ``COMPRESSED`` columns -> the type each is
#: stored like (its metadata has the same shape), which the library reads:
#: MYSQL_TYPE_BLOB_COMPRESSED -> BLOB, MYSQL_TYPE_VARCHAR_COMPRESSED -> VARCHAR.
_COMPRESSED_AS = {140: 252, 141: 15}


def uncompressed_types(body: bytes) -> tuple[bytes, tuple[int, ...]] | None:
    """A TABLE_MAP body whose MariaDB ``COMPRESSED`` column types read as the
    types they are stored like, and those columns' positions; None when it
    has none.  The library misreads such a map (a ValueError from deep inside
    it, for every table, replicated or not); the row decoders inflate the
    columns' values (parser/rows.py ``inflate_column``)."""
    off, n = table_map_types(body)
    found = tuple(i for i in range(n) if body[off + i] in _COMPRESSED_AS)
    if not found:
        return None
    types = bytes(_COMPRESSED_AS.get(t, t) for t in body[off:off + n])
    return body[:off] + types + body[off + n:], found


def install(enabled: bool = True) -> bool:
    """Make mysql-replication build TABLE_MAP events with CachedTableMapEvent
    (``enabled=False``: with its own class again, for benchmarks and tests)."""
    event_map: dict[int, type] | None = getattr(rp_packet.BinLogPacketWrapper, "_BinLogPacketWrapper__event_map", None)
    if event_map is None or event_map.get(constants.TABLE_MAP_EVENT) not in (TableMapEvent, CachedTableMapEvent):
        log.warning("mysql-replication's event map is not the one of version 1.0.17: TABLE_MAP events are "
                    "parsed by the library each time (slower on many small transactions; results the same)")
        return False
    event_map[constants.TABLE_MAP_EVENT] = CachedTableMapEvent if enabled else TableMapEvent
    CachedTableMapEvent._cache.clear()
    return enabled
