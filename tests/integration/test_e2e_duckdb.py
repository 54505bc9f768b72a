"""End to end into DuckDB: MariaDB -> producer -> Redis -> applier -> a DuckDB
file, with both daemons killed with SIGKILL while 4 clients write (the
workload of test_e2e_columnstore.py: keyed, composite-key and keyless tables,
a key change, an ADD COLUMN mid-run).  At the end every target table equals
its source table row by row, read by another process while the applier
keeps running (the file is open only during a flush)."""
from __future__ import annotations

import datetime
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import duckdb_reader
from tests.integration.test_e2e_columnstore import TABLES, _run, _writer
from tests.servers.mariadb import MariaDBServer

duckdb = pytest.importorskip("duckdb", reason="the duckdb extra is not installed (pip install 'cynomys[duckdb]')")
from cynomys.applier.targets.duckdb.target import DuckDBTarget  # noqa: E402  (needs duckdb)
from cynomys.applier.targets.duckdb.types import duck_type  # noqa: E402

pytestmark = [pytest.mark.integration]


def _norm(v: Any) -> Any:
    """One domain for both sides: TIMESTAMP as naive UTC (the source session
    runs in UTC), SET as its text."""
    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    if isinstance(v, (set, frozenset)):
        return ",".join(sorted(v))
    return v


def _target_tables(path: Path) -> dict[str, list[tuple[Any, ...]]] | None:
    """Every table of the file read like any other process would (read-only,
    one short connection, as a reader polling it would: ``duckdb_reader``);
    None while the applier holds the file for its flushes."""
    conn = duckdb_reader(path)
    if conn is None:
        return None
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for table in TABLES:
            cols = DuckDBTarget.columns(conn, "app", table)
            types = [duck_type(c) for c in cols]
            exprs = ", ".join(t.select.format(c='"' + c.name.replace('"', '""') + '"') for t, c in zip(types, cols))
            rows = conn.execute(f'SELECT {exprs} FROM "app"."{table}"').fetchall() if cols else []
            out[table] = sorted(tuple(_norm(None if v is None else t.decode(v)) for t, v in zip(types, r)) for r in rows)
        return out
    finally:
        conn.close()


def _source_rows(src: MariaDBServer, table: str) -> list[tuple[Any, ...]]:
    rows = src.execute("SET time_zone = '+00:00'", f"SELECT * FROM app.{table}")
    return sorted(tuple(_norm(v) for v in r) for r in rows)


def _diff(src: MariaDBServer, path: Path) -> dict[str, Any]:
    target = _target_tables(path)
    if target is None:
        return {"file": "held by the applier"}
    out: dict[str, Any] = {}
    for t in TABLES:
        a, b = _source_rows(src, t), target[t]
        out[t] = None if a == b else {"source_rows": len(a), "target_rows": len(b),
                                      "only_source": [r for r in a if r not in b][:2],
                                      "only_target": [r for r in b if r not in a][:2]}
    return out


class DuckDBSide:
    """The target as a DuckDB file, read by this process between flushes."""

    def __init__(self, src: MariaDBServer, path: Path) -> None:
        self.src, self.path = src, path
        self.config: dict[str, Any] = {"kind": "duckdb", "url": str(path)}
        self.extra: dict[str, Any] = {}

    def diff(self, cfg: Path) -> dict[str, Any]:
        time.sleep(1.0)  # a reader now and then, as an analyst would
        return _diff(self.src, self.path)

    def destroy(self) -> None:
        pass


@pytest.mark.slow
def test_random_workload_with_sigkills_ends_equal_in_duckdb(tmp_path: Path, redis_url: str) -> None:
    replica = tmp_path / "replica.duckdb"
    _run(tmp_path, redis_url, writer=_writer, batch_max_events=500, kills=["producer", "applier"] * 3, alter_at=3,
         target=lambda src: DuckDBSide(src, replica), catch_up_s=240)
    # The values kept their types, not only their text.
    tables = _target_tables(replica)
    acct = tables["acct"] if tables else []
    assert acct and isinstance(acct[0][2], Decimal) and isinstance(acct[0][5], datetime.datetime)
