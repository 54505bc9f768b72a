"""Frozen data that crosses module boundaries.

Row values use one Python domain everywhere (parser -> codec -> applier):

=================  =========================================================
MySQL type         Python value
=================  =========================================================
integer types      int (BIGINT UNSIGNED up to 18446744073709551615)
BIT(n)             int
DECIMAL            decimal.Decimal (exact text, scale kept)
FLOAT, DOUBLE      float (FLOAT is the exact single-precision value)
DATE               datetime.date, or RawTemporal for zero/partial dates
DATETIME(n)        naive datetime.datetime, or RawTemporal
TIMESTAMP(n)       UTC-aware datetime.datetime, or RawTemporal('0000-00-00 00:00:00')
TIME(n)            datetime.timedelta (negative and > 24h allowed)
YEAR               int (0 for YEAR 0000)
CHAR/VARCHAR/TEXT  str
ENUM               str
SET                str, members joined by ',' ('' is the empty set, not NULL)
JSON               str (the JSON text)
BINARY/BLOB        bytes (BINARY(n) always exactly n bytes)
NULL               None
=================  =========================================================
"""
from __future__ import annotations

import datetime
import decimal
import functools
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Union


class RawTemporal(str):
    """A DATE/DATETIME/TIMESTAMP that Python's datetime cannot hold, kept as
    MySQL's own text: '0000-00-00', '2020-00-15', '0000-00-00 00:00:00.000000'."""

    __slots__ = ()


Value = Union[
    None, int, float, str, bytes, decimal.Decimal,
    datetime.date, datetime.datetime, datetime.timedelta,
]
Row = tuple[Value, ...]


class Op(str, Enum):
    """What a change does.  READ is a snapshot read: an upsert of a full image."""

    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    READ = "READ"
    DDL = "DDL"
    # Verification records (cynomys/verify/coordinator.py): no row images; the
    # payload is JSON in ``sql``.  CHECKSUM: a key range's row count and hash
    # on the source at this position; PURGE: delete a key range on the
    # target (a repair: the range's READ rows follow in the same transaction).
    CHECKSUM = "CHECKSUM"
    PURGE = "PURGE"


_FILE_NUM = re.compile(r"\.(\d+)$")


@functools.lru_cache(maxsize=1024)
def _file_number(name: str) -> int:
    """The numeric suffix of a binlog file's name (-1: none).  Cached: the
    applier orders every change of a flush by its position, and a stream
    names few files."""
    m = _FILE_NUM.search(name)
    return int(m.group(1)) if m else -1


@dataclass(frozen=True)
class Position:
    """A place in the source's binlog: file + byte offset, plus the GTID of
    the transaction when the source has one.  ``pos`` is the offset of the
    *next* event to read, so a checkpoint Position is where to resume."""

    file: str
    pos: int
    gtid: str = ""

    def sort_key(self) -> tuple[int, str, int]:
        """Binlog order: the numeric suffix of the file name, then offset."""
        return (_file_number(self.file), self.file, self.pos)

    def __lt__(self, other: Position) -> bool:
        return self.sort_key() < other.sort_key()

    def __le__(self, other: Position) -> bool:
        return self.sort_key() <= other.sort_key()

    def __str__(self) -> str:
        if not self.file:  # a checkpoint carried to another server by its GTID alone
            return f"gtid {self.gtid}"
        base = f"{self.file}:{self.pos}"
        return f"{base} (gtid {self.gtid})" if self.gtid else base

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Position:
        return cls(str(d["file"]), int(d["pos"]), str(d.get("gtid", "") or ""))  # type: ignore[call-overload]

    @classmethod
    def parse(cls, text: str) -> Position:
        """'mysql-bin.000003:1234' -> Position."""
        file, sep, pos = text.rpartition(":")
        if not sep or not file or not pos.isdigit():
            raise ValueError(f"not a binlog position 'file:pos': {text!r}")
        return cls(file, int(pos))


@dataclass(frozen=True)
class ColumnDef:
    """A column as the source declares it.  ``type`` is the full column type
    text (information_schema COLUMN_TYPE), e.g. 'decimal(65,30)',
    'bigint(20) unsigned', "enum('a','b')", 'datetime(6)'."""

    name: str
    type: str
    nullable: bool = True

    @property
    def base_type(self) -> str:
        """'bigint(20) unsigned' -> 'bigint'."""
        return re.split(r"[(\s]", self.type, maxsplit=1)[0].lower()

    @property
    def unsigned(self) -> bool:
        return " unsigned" in self.type.lower()


@dataclass(frozen=True)
class TableSchema:
    database: str
    table: str
    columns: tuple[ColumnDef, ...]
    key: tuple[str, ...] = ()  # primary key (or first NOT NULL unique key); () = none
    #: A keyless table's secondary indexes on the source, each its column
    #: names in order (the snapshot reads them; the binlog does not carry
    #: them).  A hint, not the table's shape, so not compared: a target that
    #: can index creates them with the table, so that the applier's
    #: ``DELETE ... WHERE <every column>`` of a changed row is a lookup, not
    #: a scan of the table.
    indexes: tuple[tuple[str, ...], ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"

    # Cached: asked for every row change (folding, flushes).  A frozen
    # dataclass still has an instance __dict__, which cached_property uses.
    @functools.cached_property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @functools.cached_property
    def _key_indexes(self) -> tuple[int, ...]:
        names = self.column_names
        return tuple(names.index(k) for k in self.key)

    def key_indexes(self) -> tuple[int, ...]:
        return self._key_indexes


@dataclass(frozen=True)
class Change:
    """One row change or one statement (the paper's record).

    ``txn`` is where the source transaction begins; every change of one
    transaction shares it, and it is what the applier compares with its
    checkpoint to drop replays.  ``tid`` is the transaction id: the GTID
    when there is one, else ``file:pos`` of the transaction's start."""

    op: Op
    database: str
    table: str
    tid: str
    txn: Position
    commit_ts: int  # seconds since the epoch (source event timestamp)
    schema: TableSchema | None = None  # row changes only
    before: Row | None = None
    after: Row | None = None
    sql: str | None = None

    def key(self, image: Row | None = None) -> tuple[Value, ...] | None:
        """Primary-key values of ``image`` (default: after, else before)."""
        schema = self.schema
        if schema is None or not schema.key:
            return None
        row = image if image is not None else (self.after if self.after is not None else self.before)
        assert row is not None
        return tuple(row[i] for i in schema.key_indexes())


@dataclass(frozen=True)
class Batch:
    """What one envelope carries: changes of one or more whole source
    transactions, in source order, already folded to net changes.

    ``end`` is the position after the last event in the batch.  When
    ``complete`` is true it is a transaction boundary and a valid resume
    point; a transaction too large for one batch is carried by several
    batches, all but the last with ``complete`` false."""

    producer_id: str
    changes: tuple[Change, ...]
    end: Position
    complete: bool = True
    first_txn: Position | None = None
    created_us: int = 0
    last_commit_ts: int = 0
    meta: dict[str, str] = field(default_factory=dict)


def _pos_text(p: Position) -> str:
    return f"{p.file}:{p.pos}"


@dataclass(frozen=True)
class EnvelopeMeta:
    """What an envelope says about the stretch of the source it covers.

    On the wire it is ``Batch.meta``, a string map inside the signed
    payload; this is its one typed reading and writing (the producer builds
    it, the applier's admission reads it).  Keys: ``from``/``from_n`` where
    the first change is (its transaction's start, and how many changes of
    that transaction earlier envelopes carried), ``to``/``to_n`` where an
    incomplete envelope stops, ``frag`` the fragment number inside a
    transaction cut into fragments, ``incarnation`` the producer's life
    since its state was created, ``server`` the source server the positions
    belong to (positions of two servers are never ordered by file name),
    ``after``/``after_gtid`` the producer's checkpoint when it began this
    envelope: every change between it and this envelope's first change was
    nothing to ship, so an applier holding ``after`` misses nothing, and
    ``abandoned`` the id of a keyless read whose fragments are dropped."""

    start: Position | None = None
    start_n: int = 0
    stop: Position | None = None
    stop_n: int = 0
    frag: int | None = None
    incarnation: str = ""
    server: str = ""
    after: Position | None = None
    abandoned: str = ""

    @classmethod
    def of(cls, meta: dict[str, str]) -> EnvelopeMeta:
        def pos(key: str, gtid_key: str = "") -> Position | None:
            text = meta.get(key)
            if not text:
                return None
            # Not Position.parse: a checkpoint rebased onto another server by
            # GTID has no file yet (":0").
            file, _, pos_text = text.rpartition(":")
            if not pos_text.isdigit():
                raise ValueError(f"envelope meta {key!r} is not a binlog position 'file:pos': {text!r}")
            return Position(file, int(pos_text), meta.get(gtid_key, "") if gtid_key else "")

        frag = meta.get("frag")
        return cls(start=pos("from"), start_n=int(meta.get("from_n", "0") or 0), stop=pos("to"),
                   stop_n=int(meta.get("to_n", "0") or 0), frag=int(frag) if frag is not None else None,
                   incarnation=meta.get("incarnation", ""), server=meta.get("server", ""),
                   after=pos("after", "after_gtid"), abandoned=meta.get("abandoned", ""))

    def to_dict(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.start is not None:
            out["from"], out["from_n"] = _pos_text(self.start), str(self.start_n)
        if self.stop is not None:
            out["to"], out["to_n"] = _pos_text(self.stop), str(self.stop_n)
        if self.frag is not None:
            out["frag"] = str(self.frag)
        if self.incarnation:
            out["incarnation"] = self.incarnation
        if self.server:
            out["server"] = self.server
        if self.after is not None:
            out["after"] = _pos_text(self.after)
            if self.after.gtid:
                out["after_gtid"] = self.after.gtid
        if self.abandoned:
            out["abandoned"] = self.abandoned
        return out


@dataclass(frozen=True)
class AppliedState:
    """What the target holds for one producer, committed with the data."""

    producer_id: str
    seq: int
    position: Position                   # source position applied up to (a transaction boundary)
    commit_ts: int = 0                   # source time of the last applied transaction
    # Who wrote what the target holds (applier/admit.py): the source server
    # ``position`` belongs to, the producer incarnation and the newest HA
    # fencing token taken.  Kept in the target so an applier restart still
    # recognises a producer that lost its state.
    server: str = ""
    incarnation: str = ""
    fence: int = 0
