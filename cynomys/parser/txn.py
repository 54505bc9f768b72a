"""Transaction assembly: SourceEvents -> row Changes and commit marks.

Invariants (MySQL and MariaDB write them this way):
- MariaDB: a GTID event starts every transaction; with the STANDALONE flag
  it is followed by one statement and no COMMIT.
- MySQL: a GTID event, then either 'BEGIN' ... XID/COMMIT, or one DDL.
- A DDL commits implicitly: it is a transaction of its own.
So a statement that arrives while no explicit BEGIN is open closes the
transaction right after it.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from cynomys.core import compiled
from cynomys.core.columnar import MANY_ROWS_MIN, ManyRows
from cynomys.core.errors import UnsupportedEventError
from cynomys.core.model import Change, Op, Position
from cynomys.parser.kinds import Basic
from cynomys.parser.stream import SourceEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Commit:
    """End of a source transaction: ``end`` is a valid resume point."""

    begin: Position
    end: Position
    commit_ts: int
    gtid: str


@dataclass(frozen=True)
class Progress:
    """No change, but the reader moved (heartbeat, rotate, skipped event)."""

    end: Position
    timestamp: int


Item = Change | Commit | Progress

_ROW_OPS = {Basic.INSERT: Op.INSERT, Basic.UPDATE: Op.UPDATE, Basic.DELETE: Op.DELETE}
# Which image is which, for the compiled reader's changes(): 0 the after
# image, 1 (before, after), 2 the before image.
_WHICH = {Op.INSERT: 0, Op.UPDATE: 1, Op.DELETE: 2}


_MARIADB_GTID = re.compile(r"(\d+)-\d+-\d+")

# A frozen dataclass's __init__ sets each field with object.__setattr__;
# an instance given its __dict__ at once is the same object at half the
# cost (0.41 vs 0.70 us for a Commit), and the assembler makes two per
# source transaction (bench/producer_oltp.py).
_new, _set = object.__new__, object.__setattr__


class Assembler:
    """``start_gtid``: the MariaDB GTID position the read starts from
    ('0-1-42,1-1-7'); commits then carry the position after them as the
    last GTID of every replication domain, which is what MariaDB's
    GTID-based resumption (@slave_connect_state) takes."""

    def __init__(self, start_gtid: str = "") -> None:
        self.begin: Position | None = None
        self.explicit = False
        self.gtid = ""
        self.tid = ""
        self.domains: dict[str, str] = {}
        self._order: list[str] = []  # the domains sorted by number (the GTID position's order)
        for g in filter(None, (x.strip() for x in start_gtid.split(","))):
            m = _MARIADB_GTID.fullmatch(g)
            if m:
                self.domains[m.group(1)] = g

    def _open(self, ev: SourceEvent, explicit: bool) -> None:
        if self.begin is None:
            self.begin = ev.start
            self.gtid = ev.gtid
            self.tid = ev.gtid or f"{ev.start.file}:{ev.start.pos}"
        self.explicit = self.explicit or explicit

    def _close(self, ev: SourceEvent) -> Commit:
        assert self.begin is not None
        gtid = self.gtid
        # A MariaDB GTID (domain-server-seq); a MySQL one has a ':' (uuid:n).
        # The domain is kept by its text, the regex only checks a new one.
        if gtid and ":" not in gtid:
            domain = gtid[:gtid.find("-")]
            if domain in self.domains or _MARIADB_GTID.fullmatch(gtid):
                self.domains[domain] = gtid
        c = _new(Commit)  # Commit(...) without the frozen __init__: once per transaction
        _set(c, "__dict__", {"begin": self.begin, "end": self._here(ev.end), "commit_ts": ev.timestamp,
                             "gtid": gtid})
        self.begin, self.explicit, self.gtid, self.tid = None, False, "", ""
        return c

    def _here(self, end: Position) -> Position:
        """``end`` with the GTID position reached (between transactions)."""
        domains = self.domains
        if not domains:
            return end
        if len(domains) != len(self._order):
            self._order = sorted(domains, key=int)
        text = domains[self._order[0]] if len(domains) == 1 else ",".join(domains[d] for d in self._order)
        here = _new(Position)  # Position(...) without the frozen __init__, as the C reader makes them
        _set(here, "__dict__", {"file": end.file, "pos": end.pos, "gtid": text})
        return here

    def feed(self, ev: SourceEvent) -> Iterable[Item]:
        """The items ``ev`` makes, in order (consumed before the next feed)."""
        return _HANDLERS[ev.basic](self, ev)

    # -- one handler per basic type --------------------------------------
    def _on_begin(self, ev: SourceEvent) -> Iterator[Item]:
        if ev.kind == "QUERY_EVENT":
            self._open(ev, explicit=True)
        else:  # a GTID event: MariaDB's non-standalone GTID is the BEGIN itself
            if self.begin is not None and self.explicit:
                raise UnsupportedEventError(f"GTID event at {ev.start} inside an open transaction")
            self.begin = None
            self._open(ev, explicit=(ev.kind == "GTID_EVENT" and not ev.standalone))
        return iter(())

    def _on_commit(self, ev: SourceEvent) -> Iterator[Item]:
        if self.begin is None:
            yield Progress(self._here(ev.end), ev.timestamp)
            return
        yield self._close(ev)

    def _on_rows(self, ev: SourceEvent) -> Iterable[Item]:
        if self.begin is None:  # rows outside BEGIN (non-transactional engine): own transaction
            self._open(ev, explicit=True)
        op = _ROW_OPS[ev.basic]
        assert self.begin is not None and ev.schema is not None
        if op is Op.INSERT and len(ev.rows) >= MANY_ROWS_MIN:
            # A bulk insert: one item for the event's rows (core/columnar.py).
            return (ManyRows(op, ev.database, ev.table, self.tid, self.begin, ev.timestamp, ev.schema,
                             images=tuple([pair[0] for pair in ev.rows])),)
        made = compiled.reader
        if made is not None:
            # The same Changes, made in C (cynomys._reader.changes): the
            # frozen dataclass's __init__ is most of this step's time.
            changes: list[Item] = made.changes(Change, op, ev.database, ev.table, self.tid, self.begin,
                                               ev.timestamp, ev.schema, ev.rows, _WHICH[op])
            return changes
        return self._row_changes(ev, op)

    def _row_changes(self, ev: SourceEvent, op: Op) -> Iterator[Item]:
        """The reference: one Change per row image (pair)."""
        assert self.begin is not None
        for first, second in ev.rows:
            if op is Op.UPDATE:
                before, after = first, second
            elif op is Op.INSERT:
                before, after = None, first
            else:
                before, after = first, None
            yield Change(op, ev.database, ev.table, self.tid, self.begin, ev.timestamp, ev.schema, before, after)

    def _on_statement(self, ev: SourceEvent) -> Iterator[Item]:
        standalone = self.begin is None or not self.explicit
        self._open(ev, explicit=False)
        assert self.begin is not None
        if ev.basic is Basic.DDL:
            yield Change(Op.DDL, ev.database, "", self.tid, self.begin, ev.timestamp, sql=ev.sql)
        if standalone or ev.basic is Basic.DDL:
            yield self._close(ev)

    def _on_info(self, ev: SourceEvent) -> Iterator[Item]:
        if ev.kind == "QUERY_EVENT" and self.begin is not None and not self.explicit:
            # A statement that changes no rows (GRANT, FLUSH, ...) ends its
            # standalone GTID group; inside BEGIN..COMMIT (SAVEPOINT) it is ignored.
            yield self._close(ev)
        elif self.begin is None:
            yield Progress(self._here(ev.end), ev.timestamp)

    def _on_halt(self, ev: SourceEvent) -> Iterator[Item]:
        raise UnsupportedEventError(
            f"{ev.kind} at {ev.start} cannot be replicated faithfully" + (f": {ev.sql[:200]!r}" if ev.sql else ""),
            hint=ev.why or "see the README's event table",
        )


_HANDLERS: dict[Basic, Callable[[Assembler, SourceEvent], Iterable[Item]]] = {
    Basic.BEGIN: Assembler._on_begin,
    Basic.COMMIT: Assembler._on_commit,
    Basic.INSERT: Assembler._on_rows,
    Basic.UPDATE: Assembler._on_rows,
    Basic.DELETE: Assembler._on_rows,
    Basic.DDL: Assembler._on_statement,
    Basic.TABLE_MAP: Assembler._on_info,
    Basic.ROTATE: Assembler._on_info,
    Basic.INFO: Assembler._on_info,
    Basic.HALT: Assembler._on_halt,
}

