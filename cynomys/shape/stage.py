"""The producer's shape stage: every assembled change, as the target needs it.

It runs in the producer between the plugged tasks (snapshot, verify) and
fold/batch (producer/batching.py), on every Change: binlog row changes,
snapshot READ rows, verify's CHECKSUM/PURGE records and DDL.  So what
leaves the source host is already routed, cut to its columns, masked and
filtered: a masked value is never in an envelope.

Row changes (shape/tables.py says how each image maps): the row filter is
evaluated on both images, so

=================  ===================  =================
before / after     UPDATE becomes       INSERT/DELETE/READ
=================  ===================  =================
in / in            UPDATE               kept
in / out           DELETE of before     (DELETE: kept)
out / in           INSERT of after      (INSERT, READ: kept)
out / out          nothing              nothing
=================  ===================  =================

A change that becomes nothing is not shipped; the producer still counts it
where it counts the source's changes (resuming inside a transaction), so
shaping never moves a resume point.

Verification records name the target table; their checksum was computed by
verify over shaped rows (verify/coordinator.py), and tables whose target
cannot be compared range by range are refused there (``verify_refusal``).

DDL: a statement touching no shaped table passes as it is.  One that does
is parsed, its operations shaped (shape/ddl.py) and written back as SQL
(parser/ddl_render.py); one that cannot be shaped stops the producer with
the statement and the fix, unless ``[shape] skip_ddl`` names it (then it is
dropped: the target never sees it).
"""
from __future__ import annotations

import logging
from dataclasses import replace

from cynomys.core.columnar import ManyRows
from cynomys.core.model import Change, Op, Row, TableSchema
from cynomys.parser.ddl_ops import NoOp, UnsupportedDdl
from cynomys.parser.ddl_render import render
from cynomys.shape.ddl import shape_ops, touches
from cynomys.shape.rules import ShapeRules
from cynomys.shape.tables import SchemaShape, shape_schema

log = logging.getLogger(__name__)

# Looked up once (the stage runs per change on the producer's hot path).
_INSERT, _UPDATE, _DELETE, _DDL, _CHECKSUM, _PURGE = Op.INSERT, Op.UPDATE, Op.DELETE, Op.DDL, Op.CHECKSUM, Op.PURGE



class Shaper:
    """Shapes changes with ``rules``; keeps each source schema's shape
    (schemas are shared by every change of a table map, so by identity)."""

    def __init__(self, rules: ShapeRules) -> None:
        self.rules = rules
        # id(source schema) -> (that schema, held so its id is not reused; its
        # shape, None for a table no rule touches): one lookup per change.
        self._shapes: dict[int, tuple[TableSchema, SchemaShape | None]] = {}

    @property
    def active(self) -> bool:
        return self.rules.producer_active

    def _lookup(self, schema: TableSchema) -> SchemaShape | None:
        hit = self._shapes.get(id(schema))
        if hit is None or hit[0] is not schema:
            shaped = self.rules.shaped(schema.database, schema.table)
            hit = self._shapes[id(schema)] = (schema, shape_schema(self.rules, schema) if shaped else None)
        return hit[1]

    def shape_of(self, schema: TableSchema) -> SchemaShape:
        """The shape of a table some rule touches."""
        shape = self._lookup(schema)
        assert shape is not None, f"{schema.name} is not shaped"
        return shape

    def unfolded(self, database: str, table: str) -> bool:
        """Target tables the producer must not fold (cynomys/reducer/fold.py
        ``Folder``): a ``history`` table records every change, and a
        ``soft_delete`` table keeps every row written, also one inserted and
        deleted inside a transaction -- folded, whether it stays would
        depend on where batches end (a transaction cut in fragments)."""
        return self.rules.target(database, table).mode != "upsert"

    # ------------------------------------------------------------------
    def change(self, c: Change) -> Change | None:
        """``c`` as the target needs it; None when nothing of it goes."""
        schema = c.schema
        if schema is None:
            return self._ddl(c) if c.op is _DDL else c
        shape = self._lookup(schema)
        if shape is None:
            return c
        target = shape.schema
        op: Op = c.op
        if op is _CHECKSUM or op is _PURGE:
            return replace(c, database=target.database, table=target.table, schema=target)
        keep, row = shape.keep, shape.row
        if type(c) is ManyRows:
            # A snapshot chunk or a bulk insert, one object for its rows:
            # shaped row by row, dropped when the filter leaves none of them.
            images = tuple(row(r) for r in c.images if keep is None or keep(r))
            return ManyRows(op, target.database, target.table, c.tid, c.txn, c.commit_ts, target,
                            images=images) if images else None
        before, after = c.before, c.after
        if keep is None:  # no filter: every image goes (the common case, without a call per image)
            return Change(op, target.database, target.table, c.tid, c.txn, c.commit_ts, target,
                          None if before is None else row(before), None if after is None else row(after), c.sql)
        b_in = before is not None and keep(before)
        a_in = after is not None and keep(after)
        if op is _UPDATE:
            if not (b_in or a_in):
                return None
            op = _UPDATE if b_in and a_in else _DELETE if b_in else _INSERT
        elif (op is _DELETE and not b_in) or (op is not _DELETE and not a_in):
            return None
        return Change(op, target.database, target.table, c.tid, c.txn, c.commit_ts, target,
                      row(before) if before is not None and b_in and op is not _INSERT else None,
                      row(after) if after is not None and a_in and op is not _DELETE else None, c.sql)

    def rows(self, schema: TableSchema, rows: list[Row]) -> tuple[TableSchema, list[Row]]:
        """Source rows as the target holds them (filtered, shaped): what
        `cynomys verify` checksums on the source side."""
        shape = self._lookup(schema)
        if shape is None:
            return schema, rows
        keep, row = shape.keep, shape.row
        return shape.schema, [row(r) for r in rows if keep is None or keep(r)]

    # ------------------------------------------------------------------
    def _ddl(self, c: Change) -> Change | None:
        # Imported here: the parser (sqlglot) is a fifth of the producer's
        # start-up, and most runs see no DDL to shape.
        from cynomys.parser.ddl import parse_ddl

        sql = c.sql or ""
        try:
            ops = parse_ddl(sql, c.database)
        except UnsupportedDdl:
            return c  # the applier stops on it (or skips it), as without shaping
        if not touches(self.rules, ops):
            return c
        position = f"{c.txn.file}:{c.txn.pos}"
        norm = " ".join(sql.split())
        if any(s == position or " ".join(s.split()) == norm for s in self.rules.cfg.skip_ddl):
            log.warning("dropping DDL at %s on purpose ([shape] skip_ddl): %s", position, norm[:200])
            return None
        shaped = shape_ops(self.rules, ops, c, position)
        real = [op for op in shaped if not isinstance(op, NoOp)]
        if real == [op for op in ops if not isinstance(op, NoOp)]:
            return c  # nothing changed: the source's own text goes
        if not real:
            log.info("DDL at %s changes nothing the shaped tables hold: not shipped: %s", position, norm[:200])
            return None
        text = render(real)
        log.info("DDL at %s shaped: %s -> %s", position, norm[:200], text[:300])
        return replace(c, sql=text)
