"""The applier's shaping stage: the changes each target table needs ([shape.targets]).

Between admit (and the partition's choice of tables) and the buffer, each
admitted envelope's changes are rewritten for their target table:

* the mode (cynomys/shape/modes.py): ``soft_delete`` turns deletes into
  flagged upserts, ``history`` turns every change into an INSERT of a
  changelog row numbered within its transaction;
* the schema-change policy (cynomys/shape/policy.py) on DDL statements, and
  for ``freeze`` and ``ignore_drops`` on rows: a row gets the target
  table's columns it lacks as NULL (a column kept for a source that
  dropped it: every target writes NULL, none keeps an updated row's old
  value), and with ``freeze`` loses those the table lacks (the target's
  columns are read once per table, again after a DDL naming it).

It runs after admit, which decides by transaction on the source's changes,
so exactly-once holds in every mode: a transaction the target holds is
dropped before it is rewritten, one it lacks is rewritten whole.  A
history row's number counts the changes of its transaction and table in
stream order; the count starts again when an envelope begins a
transaction from its start (``from_n`` 0: a producer sending a transaction
cut into fragments again, or redelivery after a restart), so a change gets
the same number, and the same key, each time it is applied.
"""
from __future__ import annotations

import logging
from dataclasses import replace

from cynomys.applier.targets.base import Target
from cynomys.core.columnar import InsertRun
from cynomys.core.config import Config
from cynomys.core.errors import TerminalError
from cynomys.core.model import Batch, Change, ColumnDef, EnvelopeMeta, Op, Position, Row, TableSchema
from cynomys.parser.ddl import NoOp, UnsupportedDdl, parse_ddl
from cynomys.parser.ddl_render import render
from cynomys.shape import compile_rules
from cynomys.shape.modes import History, SoftDelete
from cynomys.shape.policy import names_tables, policy_ops
from cynomys.snapshot.keyless import is_snapshot_tid

log = logging.getLogger(__name__)

_ROW_OPS = frozenset({Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ})


class Shaping:
    """The stage; ``batch`` is its one entry (applier/loop.py calls it)."""

    def __init__(self, cfg: Config, target: Target) -> None:
        self.rules = compile_rules(cfg)
        self.active = bool(self.rules.targets) or cfg.shape.schema_changes != "evolve"
        self.target = target
        self.skip_ddl = tuple(cfg.applier.skip_ddl)
        self.soft, self.history = SoftDelete(cfg.shape), History(cfg.shape)
        # (db, table) -> (transaction id, its start, the next number) of history tables
        self._seq: dict[tuple[str, str], tuple[str, Position, int]] = {}
        # id(schema) -> (schema, what a mode makes of it) / (schema, columns kept, its projection)
        self._modes: dict[tuple[int, str], tuple[TableSchema, TableSchema]] = {}
        self._views: dict[tuple[int, int, bool], tuple[TableSchema, tuple[ColumnDef, ...], TableSchema | None,
                                                        tuple[int | None, ...]]] = {}
        # freeze, ignore_drops: (db, table) -> the target table's columns, None: no such table yet
        self._catalog: dict[tuple[str, str], tuple[ColumnDef, ...] | None] = {}
        self._first: dict[tuple[str, str], tuple[ColumnDef, ...]] = {}

    def batch(self, batch: Batch) -> Batch:
        if not self.active or not batch.changes:
            return batch
        meta = EnvelopeMeta.of(batch.meta)
        if meta.start is not None and meta.start_n == 0:
            # A transaction starts here from its first change: number it from 0.
            self._seq = {k: v for k, v in self._seq.items() if v[1] != meta.start}
        out: list[Change] = []
        for c in batch.changes:
            out.extend(self.change(c))
        if len(out) == len(batch.changes) and all(a is b for a, b in zip(out, batch.changes)):
            return batch
        return replace(batch, changes=tuple(out))

    def change(self, c: Change) -> list[Change]:
        if c.op is Op.DDL:
            return self._ddl(c)
        if c.schema is None or c.op not in _ROW_OPS:
            return [c]
        shape = self.rules.target(c.database, c.table)
        fit = shape.schema_changes in ("freeze", "ignore_drops")
        if shape.mode == "upsert" and not fit:
            return [c]
        out: list[Change] = []
        for one in (c.as_changes() if type(c) is InsertRun else [c]):
            if shape.mode == "soft_delete":
                out.extend(self.soft.rewrite(one, self._mode_schema(one, "soft_delete")))
            elif shape.mode == "history":
                out.append(self.history.rewrite(one, self._mode_schema(one, "history"), self._next(one)))
            else:
                out.append(one)
        return [self._fit(x, shape.schema_changes == "freeze") for x in out] if fit else out

    # -- modes -------------------------------------------------------------------
    def _mode_schema(self, c: Change, mode: str) -> TableSchema:
        assert c.schema is not None
        hit = self._modes.get((id(c.schema), mode))
        if hit is None or hit[0] is not c.schema:
            made = self.soft.schema(c.schema) if mode == "soft_delete" else self.history.schema(c.schema)
            hit = self._modes[(id(c.schema), mode)] = (c.schema, made)
        return hit[1]

    def _next(self, c: Change) -> int:
        ident = (c.database, c.table)
        tid, at, n = self._seq.get(ident, ("", c.txn, 0))
        if tid != c.tid:
            at, n = c.txn, 0
        self._seq[ident] = (c.tid, at, n + 1)
        return n

    # -- freeze and ignore_drops: rows fitted to the target table's columns -------
    def _columns(self, ident: tuple[str, str], schema: TableSchema, freeze: bool) -> tuple[ColumnDef, ...] | None:
        if ident not in self._catalog:
            self._catalog[ident] = self.target.table_columns(*ident)
        have = self._catalog[ident]
        if have is None and freeze:
            # No table yet: the first shape seen creates it, and stays.
            return self._first.setdefault(ident, schema.columns)
        return have

    def _fit(self, c: Change, freeze: bool) -> Change:
        """``c`` with the target table's columns it lacks, as NULL (every
        target then writes NULL there: the column is kept, the source has
        no value), and with ``freeze`` without the columns the table lacks."""
        assert c.schema is not None
        have = self._columns((c.database, c.table), c.schema, freeze)
        if have is None:
            return c
        hit = self._views.get((id(c.schema), id(have), freeze))
        if hit is None or hit[0] is not c.schema or hit[1] is not have:
            names = {col.name.lower() for col in have}
            mine = {n.lower(): i for i, n in enumerate(c.schema.column_names)}
            missing = [k for k in c.schema.key if k.lower() not in names] if freeze else []
            if missing:
                raise TerminalError(
                    f"table {c.schema.name} keeps schema_changes = 'freeze' but its target table lacks the primary-key "
                    f"column {missing[0]}", hint="add the column to the target table by hand, or use another policy")
            # The target's columns in its order (NULL where the row has none),
            # then, unless frozen, the row's new ones (the target adds them).
            picks: list[int | None] = [mine.get(col.name.lower()) for col in have]
            cols = [c.schema.columns[i] if i is not None else replace(col, nullable=True)
                    for i, col in zip(picks, have)]
            if not freeze:
                new = [i for n, i in mine.items() if n not in names]
                picks += new
                cols += [c.schema.columns[i] for i in new]
            same = picks == list(range(len(c.schema.columns)))
            view = None if same else replace(c.schema, columns=tuple(cols))
            hit = self._views[(id(c.schema), id(have), freeze)] = (c.schema, have, view, tuple(picks))
        view, kept = hit[2], hit[3]
        if view is None:
            return c

        def cut(row: Row | None) -> Row | None:
            return None if row is None else tuple(None if i is None else row[i] for i in kept)

        return Change(c.op, c.database, c.table, c.tid, c.txn, c.commit_ts, view, cut(c.before), cut(c.after), c.sql)

    # -- DDL ---------------------------------------------------------------------
    def _ddl(self, c: Change) -> list[Change]:
        sql = c.sql or ""
        position = f"{c.txn.file}:{c.txn.pos}"
        norm = " ".join(sql.split())
        if any(s == position or " ".join(s.split()) == norm for s in self.skip_ddl):
            return [c]  # the target skips it on purpose (Target.ddl_ops)
        try:
            ops = parse_ddl(sql, c.database)
        except UnsupportedDdl:
            return [c]  # the target refuses it, naming the fix
        for ident in names_tables(ops):
            self._catalog.pop(ident, None)
            self._first.pop(ident, None)
        shaped = policy_ops(self.rules, ops, sql, position, snapshot=is_snapshot_tid(c.tid))
        real = [op for op in shaped if not isinstance(op, NoOp)]
        if real == [op for op in ops if not isinstance(op, NoOp)]:
            return [c]
        if not real:
            log.info("DDL at %s changes nothing of its target tables ([shape] schema_changes, modes): %s", position,
                     norm[:200])
            return []
        text = render(real)
        log.info("DDL at %s applied as: %s", position, text[:300])
        return [replace(c, sql=text)]
