"""A source table's shape on the target: its schema and how each row image maps.

The steps, in this order, on every image of a change:

1. the row filter, on the source image (source column names and values);
2. the columns kept (include/exclude), each masked if it has a mask;
3. renamed columns;
4. the route: the target's database and table and, for a merging route,
   the source database and table as leading columns, which lead the key too.

The key stays the source's (renamed, masked alike for every image: a hashed
key is still a key), so the producer's fold after this stage keys by
(target table, shaped key), and rows of two shards never fold together.

What cannot work is refused with a ``ShapeError`` naming the table, the
rule and the fix: a key column left out or masked to something that is no
longer unique, a keyless table merged (its rows have no identity to tell
the shards apart), a filter naming a column the table lacks.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Callable

from cynomys.core.errors import TerminalError
from cynomys.core.model import ColumnDef, Row, TableSchema, Value
from cynomys.shape.masks import Masker
from cynomys.shape.rules import PLAIN, SHARD_TYPE, Route, ShapeRules, TableShape


class ShapeError(TerminalError):
    """A table cannot be shaped as the configuration says."""


RowMap = Callable[[Row], Row]


@dataclass(frozen=True)
class SchemaShape:
    """What one source schema becomes."""

    source: TableSchema
    schema: TableSchema                      # the target table's columns and key
    row: RowMap                              # source image -> target image
    keep: Callable[[Row], bool] | None       # the row filter on source images; None: every row
    key_masked: bool
    route: Route | None
    table: TableShape

    @property
    def merged(self) -> bool:
        return self.route is not None and self.route.merge


def column_out(ts: TableShape, col: ColumnDef, key: bytes) -> tuple[ColumnDef, Masker | None] | None:
    """A source column on the target: (its definition there, its masker),
    or None when it is left out.  ValueError when a mask does not fit its type."""
    if not ts.keeps(col.name):
        return None
    low = col.name.lower()
    mask = ts.masks.get(low)
    out = mask.column(col) if mask is not None else col
    if low in ts.rename:
        out = replace(out, name=ts.rename[low])
    return out, (mask.masker(key) if mask is not None else None)


def shaped_indexes(indexes: tuple[tuple[str, ...], ...],
                   name_of: Callable[[str], str | None]) -> tuple[tuple[str, ...], ...]:
    """A keyless table's indexes (``TableSchema.indexes``) on its shaped
    table: each index's leading columns the shape keeps, by their target
    names (``name_of``: None for a column left out).  An index whose first
    column is left out finds nothing and goes; (a, b) without b is still an
    index on a.  A masked column stays: rows are found by their masked values."""
    out: list[tuple[str, ...]] = []
    for cols in indexes:
        kept: list[str] = []
        for c in cols:
            name = name_of(c)
            if name is None:
                break
            kept.append(name)
        if kept and tuple(kept) not in out:
            out.append(tuple(kept))
    return tuple(out)


def shard_columns(route: Route | None) -> tuple[ColumnDef, ...]:
    if route is None:
        return ()
    return tuple(ColumnDef(name, SHARD_TYPE, False) for name in route.shard_columns)


def shape_schema(rules: ShapeRules, source: TableSchema) -> SchemaShape:
    """How rows of ``source`` land on the target (ShapeError when they cannot)."""
    db, t = source.database, source.table
    route, ts = rules.route(db, t), rules.table(db, t)
    name = source.name
    rule_where = " and ".join(w for w in ((ts.where if ts is not PLAIN else ""), (route.where if route else "")) if w)

    def refuse(why: str, fix: str) -> ShapeError:
        return ShapeError(f"table {name} cannot be shaped by {rule_where}: {why}", hint=fix)

    keyset = {k.lower() for k in source.key}
    columns: list[ColumnDef] = []
    getters: list[tuple[int, Masker | None]] = []
    renamed: dict[str, str] = {}
    key_masked = False
    for i, col in enumerate(source.columns):
        try:
            out = column_out(ts, col, rules.mask_key)
        except ValueError as exc:
            raise refuse(f"column {col.name}: {exc}", f"change the mask of {col.name} in {ts.where}") from None
        low = col.name.lower()
        if out is None:
            if low in keyset:
                raise refuse(f"its primary-key column {col.name} is left out",
                             f"keep {col.name} (include/exclude of {ts.where}); mask it with hash if it must not travel")
            continue
        mask = ts.masks.get(low)
        if low in keyset and mask is not None:
            if not mask.key_safe:
                raise refuse(f"its primary-key column {col.name} would be masked with {mask.kind}, which makes rows "
                             "equal", f"mask {col.name} with hash or hash_int in {ts.where}")
            key_masked = True
        columns.append(out[0])
        getters.append((i, out[1]))
        renamed[low] = out[0].name
    if not columns:
        raise refuse("every column is left out", f"keep at least one column (include/exclude of {ts.where})")
    key = tuple(renamed[k.lower()] for k in source.key)
    shard = shard_columns(route)  # () unless the route merges
    if route is not None and route.merge:
        if not source.key:
            raise refuse(f"it has no primary key, and {route.where} merges it with other tables: rows of two "
                         "sources could not be told apart on the target",
                         "give the source tables a primary key, or route each to a table of its own")
        clash = sorted({c.name.lower() for c in shard} & {c.name.lower() for c in columns})
        if clash:
            raise refuse(f"it has a column {clash[0]!r}, the name {route.where} gives the source's database or table",
                         "set database_column/table_column of the route to other names")
    target_db, target_t = rules.target_of(db, t)
    # A keyless table keeps the source's indexes it can (a merged one was refused above).
    indexes = () if source.key else shaped_indexes(source.indexes, lambda c: renamed.get(c.lower()))
    schema = TableSchema(target_db, target_t, shard + tuple(columns), tuple(c.name for c in shard) + key, indexes)
    keep = None
    if ts.filter is not None:
        try:
            keep = ts.filter.bind(source.column_names)
        except KeyError as exc:
            raise refuse(f"its filter {ts.filter.text!r} names column(s) {exc.args[0]}, which it does not have",
                         f"change the filter of {ts.where}") from None
    consts: tuple[Value, ...] = ()
    if route is not None and route.merge:
        consts = tuple(v for c, v in ((route.rule.database_column, db), (route.rule.table_column, t)) if c)
    return SchemaShape(source, schema, _row_map(getters, consts), keep, key_masked, route, ts)


def _row_map(getters: list[tuple[int, Masker | None]], consts: tuple[Value, ...]) -> RowMap:
    """The function building a target image from a source image: the
    constants (a merging route's source database and table), then each kept
    column, masked where it has a mask.  Runs once per image of a shaped
    table: the common cases avoid a Python call per value."""
    idx = [i for i, _ in getters]
    if all(m is None for _, m in getters):
        if len(idx) == 1:
            (only,) = idx
            return lambda row: consts + (row[only],)
        pick = operator.itemgetter(*idx)
        return lambda row: consts + pick(row)
    return lambda row: consts + tuple(row[i] if m is None else m(row[i]) for i, m in getters)
