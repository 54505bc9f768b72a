"""What the producer checks against the source's tables when it starts
(and `cynomys config check` with it): table patterns, binlog filters and
cascading foreign keys (producer/foreign_keys.py).

The patterns are matched case-sensitively (parser/stream.py
``TableFilter``): the binlog spells a name as the server stores it, and a
server with ``lower_case_table_names = 1`` (usual where the database came
from Windows or macOS, or on some managed services) stores every name in
lower case.  ``include_tables = ["shop.Orders"]`` then matched nothing: the
table was never replicated, the snapshot skipped it, lag stayed at zero and
nothing said why; ``exclude_tables = ["hr.Salaries"]`` replicated the table
it meant to keep out, a ``[shape.tables."hr.Employees"]`` mask was not
applied to ``hr.employees``, and a route so spelled did not route.  A
pattern that matches no table but would in another case is refused, naming
the spelling to write; one that matches no table at all is only warned
about (its table may be created later), and watched (``PatternWatch``).
"""
from __future__ import annotations

import fnmatch
import logging
import re
from typing import Iterable, Protocol, Sequence

from cynomys.core.config import Config
from cynomys.core.errors import SourceConfigError
from cynomys.core.model import Change
from cynomys.parser.kinds import statement_of
from cynomys.parser.stream import TableFilter
from cynomys.producer.ddl_scope import one_table
from cynomys.producer.foreign_keys import ALLOW, CascadingKey, check_keys

log = logging.getLogger(__name__)

#: The default pattern (no include_tables): matches whatever exists.
_EVERYTHING = "*.*"
#: Names shown in a message, at most.
_SHOWN = 3
#: What a pattern spelled in another case would do, by where it is written.
_MISSED = {
    "include_tables": "the tables would never be replicated",
    "exclude_tables": "the tables would be replicated",
    "shape": "its masks, filters and column lists would not apply to them",
    "route": "they would land under their own names, not where the route sends them",
}
#: A route's source written as a regular expression: not a glob, not checked.
_REGEX = "re:"
#: The DDL a watched pattern is checked at: a table created.
_CREATE = re.compile(r"^\s*(?:/\*.*?\*/\s*)*CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\b", re.IGNORECASE | re.DOTALL)
#: A pattern as (how a message names it, the pattern, its kind: a key of _MISSED).
Group = tuple[str, str, str]


class _Inspector(Protocol):
    """What the checks read of the source (parser/stream.py SourceInspector;
    None from archived binlog files: nothing to check)."""

    def table_names(self) -> list[tuple[str, str]] | None: ...

    def binlog_filters(self) -> tuple[list[str], list[str]] | None: ...

    def cascading_foreign_keys(self) -> list[tuple[object, ...]] | None: ...


def check_source_scope(cfg: Config, inspector: _Inspector) -> PatternWatch | None:
    """Every check of this module against the source's tables (the
    producer's start, `cynomys config check`); the patterns that match no
    table yet, to watch the tables the log creates (None: no source)."""
    tables = inspector.table_names()
    if tables is None:
        return None
    src, shape = cfg.source, cfg.shape
    unmatched = _unmatched(_groups(src.include_tables, src.exclude_tables, list(shape.tables),
                                   [r.source for r in shape.route]), tables)
    for w in _warnings(unmatched):
        log.warning("%s", w)
    keep = TableFilter(src.include_tables, src.exclude_tables)
    filters = inspector.binlog_filters()
    if filters is not None:
        # The watermark table's events must reach the binlog too (chunks wait for them).
        marks = [] if cfg.snapshot.read_only else [(cfg.snapshot.watermark_schema, "watermark")]
        check_binlog_filters([*(t for t in tables if keep(*t)), *marks], *filters, where=f"{src.host}:{src.port}")
    keys = inspector.cascading_foreign_keys() if src.cascading_foreign_keys != ALLOW else None
    if keys:
        check_keys([CascadingKey.from_row(r) for r in keys], keep, src.cascading_foreign_keys)
    return PatternWatch(unmatched)


class PatternWatch:
    """The patterns that matched no table at start: a table the log creates
    later that one of them matches only in another case stops the producer
    as it would have at start (``include_tables = ["shop.Orders"]`` and a
    ``CREATE TABLE shop.orders`` an hour later).  A pattern that matches a
    created table as written is no longer watched."""

    def __init__(self, groups: list[Group]) -> None:
        self.groups = groups

    def on_ddl(self, change: Change) -> None:
        sql = change.sql or ""
        if not self.groups or not _CREATE.match(statement_of(sql)):
            return
        table = one_table(sql, change.database)
        if table is not None:
            self.groups = _unmatched(self.groups, [table])


def check_patterns(include: Sequence[str], exclude: Sequence[str], tables: Iterable[tuple[str, str]],
                   shaped: Sequence[str] = (), routes: Sequence[str] = ()) -> list[str]:
    """Raise SourceConfigError for a pattern that matches no table of
    ``tables`` (database, table) but does in another case; return warnings
    for include patterns that match no table at all.  ``shaped``: the
    ``[shape.tables]`` patterns; ``routes``: the ``[[shape.route]]``
    sources."""
    return _warnings(_unmatched(_groups(include, exclude, shaped, routes), tables))


def _groups(include: Sequence[str], exclude: Sequence[str], shaped: Sequence[str],
            routes: Sequence[str]) -> list[Group]:
    """Every pattern, each with its name in messages and its kind."""
    return [*((f"[source] include_tables pattern {p!r}", p, "include_tables") for p in include),
            *((f"[source] exclude_tables pattern {p!r}", p, "exclude_tables") for p in exclude),
            *((f'[shape.tables."{p}"]', p, "shape") for p in shaped),
            *((f"[[shape.route]] source {p!r}", p, "route") for p in routes if not p.startswith(_REGEX))]


def _unmatched(groups: Sequence[Group], tables: Iterable[tuple[str, str]]) -> list[Group]:
    """The patterns that match none of ``tables``; SourceConfigError for
    one that matches some only in another case."""
    names = [f"{db}.{t}" for db, t in tables]
    out: list[Group] = []
    for label, p, kind in groups:
        if p == _EVERYTHING or any(fnmatch.fnmatchcase(n, p) for n in names):
            continue
        near = [n for n in names if fnmatch.fnmatchcase(n.lower(), p.lower())]
        if near:
            one = len(near) == 1
            shown = ", ".join(near[:_SHOWN]) + (" ..." if len(near) > _SHOWN else "")
            fix = {"shape": f'[shape.tables."{near[0]}"]', "route": f"source = {near[0]!r} in the route"}.get(
                kind, f"{near[0]!r} in [source] {kind}")
            raise SourceConfigError(
                f"{label} matches no table on the source, but {shown} {'does' if one else 'do'} in another case: "
                f"patterns are compared case-sensitively (the binlog spells names as the server stores them), so "
                f"{_MISSED[kind]}",
                hint=f"write {fix}" if one and not any(c in p for c in "*?[")
                else f"spell the pattern as the server stores the names ({shown})")
        out.append((label, p, kind))
    return out


def _warnings(unmatched: Sequence[Group]) -> list[str]:
    """An include pattern that matches no table yet replicates nothing until one is created."""
    return [f"{label} matches no table on the source (yet): nothing is replicated for it until such a table is "
            "created" for label, _, kind in unmatched if kind == "include_tables"]


def check_binlog_filters(replicated: Iterable[tuple[str, str]], do_db: Sequence[str], ignore_db: Sequence[str],
                         where: str) -> None:
    """Raise SourceConfigError when a replicated table's database is one the
    source's binlog filters leave out (``binlog_do_db`` not naming it, or
    ``binlog_ignore_db`` naming it): its changes never reach the binlog, and
    the producer would replicate none of them without a word."""
    dbs = sorted({db for db, _ in replicated})
    left = [db for db in dbs if (do_db and db not in do_db) or db in ignore_db]
    if not left:
        return
    option = "binlog_do_db" if do_db and left[0] not in ignore_db else "binlog_ignore_db"
    shown = ", ".join(left[:_SHOWN]) + (" ..." if len(left) > _SHOWN else "")
    raise SourceConfigError(
        f"source {where} does not write database{'s' if len(left) > 1 else ''} {shown} to its binlog ({option} "
        f"= {','.join(do_db if option == 'binlog_do_db' else ignore_db)}), yet Cynomys reads tables there "
        "([source] include_tables, or the snapshot's watermark table): their changes would never reach the target",
        hint=f"remove {option} from the source's config file (or list these databases in it) and restart it, or "
             "leave the tables out with [source] exclude_tables")
