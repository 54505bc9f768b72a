"""Shaping data on the way (docs/guides/shaping.md): the ``[shape]`` rules and what they do.

The producer's part runs between assemble and fold/batch, on the source
host (``stage.Shaper``): routing (``rules``: many tables into one, with
the source's database and table as key columns), columns kept, renamed and
masked (``masks``), row filters (``filters``) and DDL on shaped tables
(``ddl``; written back as SQL by parser/ddl_render.py).  The applier's part
is pure logic here, run by the applier between admit and buffer
(cynomys/applier/shaping.py): modes per target table (``modes``: upsert,
soft_delete, history) and the schema-change policy (``policy``: evolve,
ignore_drops, freeze, stop).

This package sits below snapshot and verify: verify checksums source rows
the way they land (``Shaper.rows``).
"""
from cynomys.shape.rules import ShapeRules, compile_rules
from cynomys.shape.stage import Shaper

__all__ = ["ShapeRules", "Shaper", "compile_rules"]
