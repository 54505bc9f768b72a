"""Reading the Iceberg replica as other engines do, for tests: pyiceberg and
DuckDB (cynomys/applier/targets/spark/readers.py), rows decoded back to the
source's values with the source types kept in the column comments, so they
compare with the source row by row (as SparkTarget.fetch_rows does)."""
from __future__ import annotations

import datetime
from typing import Any, Callable

from cynomys.applier.targets.spark import readers
from cynomys.applier.targets.spark import types as st
from cynomys.core.config import Config
from cynomys.core.model import ColumnDef, RawTemporal, Row, Value

UTC = datetime.timezone.utc


def _decoder(col: ColumnDef) -> Callable[[Any], Value]:
    m = st.mapping(col)
    if m.family == "timestamp":  # both readers give an aware datetime, not unix micros
        return lambda v: None if v is None else v.astimezone(UTC)
    return st.decoder(m)


def _rows(names: list[str], docs: dict[str, str | None], columns: dict[str, list[Any]]) -> list[Row]:
    """Columns by name -> rows of source values, companions folded in."""
    lower = {n.lower(): n for n in names}
    plan = []
    for n in names:
        if n.endswith(st.COMPANION_SUFFIX) and n[:-len(st.COMPANION_SUFFIX)].lower() in lower:
            continue
        found = st.source_type(docs.get(n))
        col = ColumnDef(n, found or "longtext")
        plan.append((n, _decoder(col), lower.get((n + st.COMPANION_SUFFIX).lower())))
    count = len(columns[names[0]]) if names else 0
    out: list[Row] = []
    for i in range(count):
        row: list[Value] = []
        for n, dec, comp in plan:
            raw = columns[comp][i] if comp is not None else None
            row.append(RawTemporal(raw) if raw is not None else dec(columns[n][i]))
        out.append(tuple(row))
    return out


def pyiceberg_rows(cfg: Config, database: str, table: str) -> list[Row]:
    t = readers.pyiceberg_table(cfg, database, table)
    arrow = t.scan().to_arrow()
    docs = {f.name: f.doc for f in t.schema().fields}
    return _rows(arrow.column_names, docs, {n: arrow.column(n).to_pylist() for n in arrow.column_names})


def duckdb_rows(cfg: Config, database: str, table: str, con: Any = None) -> list[Row]:
    """Through DuckDB's iceberg extension (the comments come from pyiceberg:
    DuckDB does not expose Iceberg column docs)."""
    con = con or readers.duckdb_connection(cfg)
    t = readers.pyiceberg_table(cfg, database, table)
    docs = {f.name: f.doc for f in t.schema().fields}
    # As Arrow: TIMESTAMP WITH TIME ZONE values become UTC datetimes without pytz.
    arrow = con.execute(f'SELECT * FROM "{database}"."{table}"').to_arrow_table()
    return _rows(arrow.column_names, docs, {n: arrow.column(n).to_pylist() for n in arrow.column_names})
