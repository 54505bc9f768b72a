"""``[shape]`` checked against the source's tables (`cynomys config check`).

Offline, ``compile_rules`` checks what the file alone says (patterns,
targets and their capture groups, masks, filters, names).  With the
source's schemas (cli/config.py reads them from information_schema when
the source is reachable) this module checks what depends on the tables:

* every replicated table can be shaped (a key column left out or masked
  to non-unique values, a filter naming a missing column, a keyless table
  merged, a truncate mask on a number ...);
* tables landing on one target table: a merge needs the same primary key
  and no column with two types (both tables are named); a table that is
  not merged must be alone on its target (two sources writing one table
  without shard columns would overwrite each other's rows);
* what only differs by columns one source lacks is a note: the merged
  table holds the union, NULL where a source has no value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from cynomys.core.errors import CynomysError
from cynomys.core.model import TableSchema
from cynomys.shape.rules import PLAIN, ShapeRules
from cynomys.shape.tables import SchemaShape, shape_schema


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tables: int = 0


def check_sources(rules: ShapeRules, schemas: Iterable[TableSchema]) -> Report:
    """Errors and notes for the source tables ``schemas`` under ``rules``."""
    report = Report()
    landed: dict[tuple[str, str], list[tuple[str, SchemaShape]]] = {}
    for s in schemas:
        report.tables += 1
        if not rules.shaped(s.database, s.table):
            landed.setdefault((s.database, s.table), []).append((s.name, _plain(s)))
            continue
        try:
            shape = shape_schema(rules, s)
        except CynomysError as exc:
            report.errors.append(f"{exc.message} (fix: {exc.hint})" if exc.hint else exc.message)
            continue
        landed.setdefault((shape.schema.database, shape.schema.table), []).append((s.name, shape))
    for (db, t), sources in sorted(landed.items()):
        if len(sources) < 2:
            continue
        unmerged = [name for name, shape in sources if not shape.merged]
        if unmerged:
            names = " and ".join(name for name, _ in sources[:2])
            report.errors.append(f"{names} both land on {db}.{t}, and {unmerged[0]} is not merged by a route (no "
                                 "source columns tell their rows apart): route them to tables of their own, or into "
                                 "one with a pattern that merges")
            continue
        first_name, first = sources[0]
        for name, shape in sources[1:]:
            a, b = first.schema, shape.schema
            if tuple(k.lower() for k in a.key) != tuple(k.lower() for k in b.key):
                report.errors.append(f"{first_name} and {name} are merged into {db}.{t} with different primary keys "
                                     f"({', '.join(a.key)} vs {', '.join(b.key)}): rows of one could not be told apart")
                continue
            types_a = {c.name.lower(): c for c in a.columns}
            types_b = {c.name.lower(): c for c in b.columns}
            for n in sorted(types_a.keys() & types_b.keys()):
                if types_a[n].type != types_b[n].type:
                    report.errors.append(f"{first_name} and {name} are merged into {db}.{t}, but column "
                                         f"{types_a[n].name} is {types_a[n].type} in one and {types_b[n].type} in "
                                         "the other")
            only = sorted((types_a.keys() ^ types_b.keys()))
            if only:
                report.notes.append(f"{first_name} and {name} are merged into {db}.{t} with different columns "
                                    f"({', '.join(only)}): the merged table has them all, NULL where a source lacks one")
    return report


def _plain(s: TableSchema) -> SchemaShape:
    return SchemaShape(s, s, lambda r: r, None, False, None, PLAIN)
