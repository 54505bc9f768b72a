"""``[shape]`` compiled: routes, table rules and target rules, checked once.

``compile_rules`` turns the configuration (core/config.py ``ShapeConfig``)
into lookups the stages use per table -- which route a source table takes
and where it lands, which columns it keeps, renames and masks, which rows
it keeps, and how a target table is written -- and refuses what cannot
work with a one-line ``ConfigError`` naming the key.  It needs no source:
what depends on a table's columns (a key column left out, a filter naming
a column the table lacks, tables merged with different keys) is checked
when a schema is shaped (shape/tables.py), and by ``cynomys config check``
against the source when it can reach it (cli/config.py).
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cynomys.core.config import Config, RouteRule, ShapeConfig, TableRule
from cynomys.core.errors import ConfigError
from cynomys.shape.masks import Mask, parse_mask

if TYPE_CHECKING:
    from cynomys.shape.filters import RowFilter

#: Type of the columns a merging route adds: MySQL names are at most 64 characters.
SHARD_TYPE = "varchar(64)"
_GROUP_REF = re.compile(r"\\(?:(\d+)|g<(\w+)>)")


def _glob(pattern: str) -> re.Pattern[str]:
    """A glob as a regular expression whose ``*`` and ``?`` are capture groups."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            out.append("(.*)")
        elif ch == "?":
            out.append("(.)")
        elif ch == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("!", "]") else i + 1)
            if end < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1:end]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


@dataclass(frozen=True)
class Route:
    """One compiled ``[[shape.route]]`` rule."""

    number: int                     # 1-based, in file order (for messages)
    rule: RouteRule
    pattern: re.Pattern[str]
    merge: bool                     # sources are told apart by shard columns

    @property
    def where(self) -> str:
        return f"[[shape.route]] {self.number} ({self.rule.source!r} -> {self.rule.target!r})"

    def target_of(self, database: str, table: str) -> tuple[str, str] | None:
        m = self.pattern.fullmatch(f"{database}.{table}")
        if m is None:
            return None
        db, _, t = m.expand(self.rule.target).partition(".")
        return db, t

    @property
    def shard_columns(self) -> tuple[str, ...]:
        """The columns a merging route adds (database first), none otherwise."""
        if not self.merge:
            return ()
        return tuple(c for c in (self.rule.database_column, self.rule.table_column) if c)


@dataclass(frozen=True)
class TableShape:
    """One compiled ``[shape.tables."<pattern>"]`` entry (column names lower-case)."""

    pattern: str
    include: frozenset[str]
    exclude: frozenset[str]
    rename: dict[str, str]
    masks: dict[str, Mask]
    filter: RowFilter | None

    @property
    def where(self) -> str:
        return f'[shape.tables."{self.pattern}"]'

    def keeps(self, column: str) -> bool:
        c = column.lower()
        return (not self.include or c in self.include) and c not in self.exclude

    def names(self) -> frozenset[str]:
        """Every column an entry names (a rename of one of them changes what it does)."""
        return self.include | self.exclude | set(self.rename) | set(self.masks) | \
            (self.filter.columns if self.filter else frozenset())


#: A table without an entry: every column, every row.
PLAIN = TableShape("", frozenset(), frozenset(), {}, {}, None)


@dataclass(frozen=True)
class TargetShape:
    """How a target table is written (its ``[shape.targets."<pattern>"]`` or the defaults)."""

    pattern: str
    mode: str
    schema_changes: str

    @property
    def where(self) -> str:
        return f'[shape.targets."{self.pattern}"]' if self.pattern else "[shape]"


@dataclass
class ShapeRules:
    """Lookups by table, memoised (names are few, lookups are per change)."""

    cfg: ShapeConfig
    routes: tuple[Route, ...]
    tables: tuple[TableShape, ...]
    targets: tuple[tuple[str, TargetShape], ...]
    mask_key: bytes = b""
    _routes: dict[tuple[str, str], Route | None] = field(default_factory=dict)
    _tables: dict[tuple[str, str], TableShape] = field(default_factory=dict)
    _targets: dict[tuple[str, str], TargetShape] = field(default_factory=dict)

    @property
    def producer_active(self) -> bool:
        """Anything for the producer's stage to do."""
        return bool(self.routes or self.tables)

    @property
    def needs_mask_key(self) -> bool:
        return any(m.needs_key for t in self.tables for m in t.masks.values())

    def route(self, database: str, table: str) -> Route | None:
        ident = (database, table)
        if ident not in self._routes:
            self._routes[ident] = next((r for r in self.routes if r.target_of(database, table) is not None), None)
        return self._routes[ident]

    def table(self, database: str, table: str) -> TableShape:
        ident = (database, table)
        if ident not in self._tables:
            name = f"{database}.{table}"
            self._tables[ident] = next((t for t in self.tables if fnmatch.fnmatchcase(name, t.pattern)), PLAIN)
        return self._tables[ident]

    def shaped(self, database: str, table: str) -> bool:
        """Whether the producer changes anything of this source table."""
        return self.route(database, table) is not None or self.table(database, table) is not PLAIN

    def target_of(self, database: str, table: str) -> tuple[str, str]:
        """Where a source table lands."""
        r = self.route(database, table)
        found = r.target_of(database, table) if r is not None else None
        return found if found is not None else (database, table)

    def target(self, database: str, table: str) -> TargetShape:
        """How the target table ``database.table`` is written."""
        ident = (database, table)
        if ident not in self._targets:
            name = f"{database}.{table}"
            hit = next((t for p, t in self.targets if fnmatch.fnmatchcase(name, p)), None)
            self._targets[ident] = hit or TargetShape("", "upsert", self.cfg.schema_changes)
        return self._targets[ident]

    def verify_refusal(self, database: str, table: str) -> str:
        """Why `cynomys verify` cannot compare this source table with its
        target table, or '' (cynomys/verify/coordinator.py)."""
        r = self.route(database, table)
        target = self.target(*self.target_of(database, table))
        if r is not None and r.merge:
            return (f"it is merged with other tables by {r.where}: a key range of one source is no key range "
                    "of the merged table")
        if target.mode != "upsert":
            return f"its target table is written in mode {target.mode!r} ({target.where}): rows there are not the source's"
        if target.schema_changes not in ("evolve",):
            return (f"its target table keeps schema_changes = {target.schema_changes!r} ({target.where}): its "
                    "columns need not be the source's")
        return ""


def _route(number: int, rule: RouteRule) -> Route:
    where = f"[[shape.route]] {number}"
    src = rule.source
    try:
        if src.startswith("re:"):
            pattern = re.compile(src[3:], re.DOTALL)
            literal = re.sub(r"\\\.", "", src[3:])
            is_literal = not re.search(r"[.^$*+?{}\[\]|()\\]", literal)
        else:
            pattern = _glob(src)
            is_literal = not re.search(r"[*?\[]", src)
    except re.error as exc:
        raise ConfigError(f"{where} source {src!r}: not a regular expression: {exc}") from None
    if "." not in rule.target:
        raise ConfigError(f"{where} target {rule.target!r}: expected 'db.table'")
    used: set[int] = set()
    for m in _GROUP_REF.finditer(rule.target):
        if m.group(1) is not None:
            n = int(m.group(1))
            if not 1 <= n <= pattern.groups:
                raise ConfigError(f"{where} target {rule.target!r}: \\{n} names no capture group of source "
                                  f"{src!r} (it has {pattern.groups})")
            used.add(n)
        else:
            name = m.group(2)
            if name not in pattern.groupindex:
                raise ConfigError(f"{where} target {rule.target!r}: \\g<{name}> names no group of source {src!r}")
            used.add(pattern.groupindex[name])
    # Many sources, one target: a pattern (not one name) whose target does not
    # use every group (a regular expression without groups uses none).
    merge = not is_literal and (not pattern.groups or used != set(range(1, pattern.groups + 1)))
    if merge:
        if not (rule.database_column or rule.table_column):
            raise ConfigError(f"{where} merges the tables matching {src!r} into {rule.target!r}: database_column "
                              "and table_column cannot both be empty (rows of two sources would collide)")
        if rule.database_column.lower() == rule.table_column.lower():
            raise ConfigError(f"{where}: database_column and table_column are both {rule.database_column!r}")
    return Route(number, rule, pattern, merge)


def _table(pattern: str, rule: TableRule) -> TableShape:
    where = f'[shape.tables."{pattern}"]'
    if "." not in pattern:
        raise ConfigError(f"{where}: the pattern names tables as 'db.table' (a glob, e.g. 'shop_*.customers')")
    include, exclude = frozenset(n.lower() for n in rule.include), frozenset(n.lower() for n in rule.exclude)
    both = sorted(include & exclude)
    if both:
        raise ConfigError(f"{where}: column {both[0]!r} is both in include and in exclude")
    rename = {k.lower(): v for k, v in rule.rename.items()}
    masks: dict[str, Mask] = {}
    for col, spec in rule.mask.items():
        try:
            masks[col.lower()] = parse_mask(spec)
        except ValueError as exc:
            raise ConfigError(f"{where} mask {col}: {exc}") from None
    probe = TableShape(pattern, include, exclude, rename, masks, None)
    for key, names in (("rename", rename), ("mask", masks)):
        gone = sorted(n for n in names if not probe.keeps(n))
        if gone:
            raise ConfigError(f"{where} {key}: column {gone[0]!r} is left out (include/exclude)")
    targets = [v.lower() for v in rename.values()]
    dup = sorted({t for t in targets if targets.count(t) > 1})
    if dup:
        raise ConfigError(f"{where} rename: two columns are renamed to {dup[0]!r}")
    if any(not v or "`" in v for v in rename.values()):
        raise ConfigError(f"{where} rename: a new name must be a non-empty column name without backticks")
    filt = None
    if rule.filter.strip():
        # Imported here: filters parse with sqlglot, which only a
        # configuration with a filter needs (it is a fifth of the start-up).
        from cynomys.shape.filters import parse_filter

        try:
            filt = parse_filter(rule.filter)
        except ValueError as exc:
            raise ConfigError(f"{where} filter: {exc}") from None
    return TableShape(pattern, include, exclude, rename, masks, filt)


def compile_rules(cfg: Config | ShapeConfig, *, producer: bool = False) -> ShapeRules:
    """``[shape]`` checked and compiled.  ``producer``: the hash masks need
    ``[shape] mask_key`` here (the applier never does)."""
    shape = cfg.shape if isinstance(cfg, Config) else cfg
    routes = tuple(_route(i + 1, r) for i, r in enumerate(shape.route))
    tables = tuple(_table(p, r) for p, r in shape.tables.items())
    for p in shape.targets:
        if "." not in p:
            raise ConfigError(f'[shape.targets."{p}"]: the pattern names target tables as \'db.table\'')
    targets = tuple((p, TargetShape(p, t.mode, t.schema_changes or shape.schema_changes))
                    for p, t in shape.targets.items())
    names = [shape.deleted_column, shape.commit_time_column, shape.op_column, shape.txn_column,
             shape.file_column, shape.pos_column, shape.seq_column]
    lowered = [n.lower() for n in names]
    if len(set(lowered)) != len(lowered):
        raise ConfigError("[shape] the columns of the modes (deleted_column, commit_time_column, op_column, "
                          "txn_column, file_column, pos_column, seq_column) need different names")
    rules = ShapeRules(shape, routes, tables, targets, shape.mask_key.encode("utf-8"))
    if producer and rules.needs_mask_key and len(shape.mask_key) < 16:
        raise ConfigError("[shape] mask_key: hash masks need a key of at least 16 characters "
                          + ("(it is empty)" if not shape.mask_key else f"(it has {len(shape.mask_key)})"),
                          hint="set CYNOMYS_SHAPE_MASK_KEY in the producer's environment (keep it secret: "
                               "whoever has it can test guesses of a masked value)")
    return rules
