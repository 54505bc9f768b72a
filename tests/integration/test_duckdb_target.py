"""DuckDBTarget against a real DuckDB file: what only DuckDB has (one
writing process: the file is free between flushes).  The contract every
target passes runs in test_target_contract.py (setup: target_setups/duckdb.py)."""
from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from cynomys.applier.targets.base import open_target
from cynomys.core.config import Config, TargetConfig
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import ColumnDef, Op, RawTemporal, TableSchema
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory
from tests.integration.target_setups import duckdb as duckdb_setup

duckdb = pytest.importorskip("duckdb", reason="the duckdb extra is not installed (pip install 'cynomys[duckdb]')")
from cynomys.applier.targets.duckdb.target import DuckDBTarget  # noqa: E402  (needs duckdb)

pytestmark = pytest.mark.integration


_names = itertools.count(1)


@pytest.fixture
def db() -> str:
    return f"duck_test_{next(_names)}"


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[Factory]:
    f = duckdb_setup.factory(str(tmp_path / "replica.duckdb"))
    yield f
    f.close()


def test_registry_opens_it(tmp_path: Path) -> None:
    assert isinstance(open_target(duckdb_setup.make_config(str(tmp_path / "x.duckdb"))), DuckDBTarget)


def test_zero_dates_are_refused(factory: Factory, db: str) -> None:
    target = factory()
    schema = TableSchema(db, "z", (ColumnDef("id", "int"), ColumnDef("d", "date")), ("id",))
    with pytest.raises(TargetRejectedError) as info:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(1, RawTemporal("0000-00-00")))]))
    assert f"{db}.z" in str(info.value) and "column d" in str(info.value)
    assert target.fetch_rows(db, "z") == []


def test_other_processes_read_the_file_between_flushes(factory: Factory, db: str) -> None:
    """DuckDB admits one writing process per file; the applier must not
    keep it open, or nobody else could read the replica."""
    target = factory()
    schema = TableSchema(db, "r", (ColumnDef("id", "int"), ColumnDef("v", "varchar(5)")), ("id",))
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(i, "x")) for i in range(3)]))
    reader = ("import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
              f"print(c.execute('SELECT count(*) FROM \"{db}\".r').fetchone()[0])")
    out = subprocess.run([sys.executable, "-c", reader, factory.path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"
    # ... and the applier goes on writing after the reader is gone.
    target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(9, "y"))]))
    contract.assert_rows(target, schema, [(0, "x"), (1, "x"), (2, "x"), (9, "y")])


def test_show_keys_names_the_key_of_a_refused_row(tmp_path: Path, db: str) -> None:
    cfg = Config(target=TargetConfig(kind="duckdb", url=str(tmp_path / "k.duckdb"), show_keys=True))
    target = DuckDBTarget(cfg)
    target.connect()
    schema = TableSchema(db, "k", (ColumnDef("id", "int"), ColumnDef("small", "tinyint")), ("id",))
    with pytest.raises(TargetRejectedError) as info:
        target.apply(contract.flush([contract.change(Op.INSERT, schema, after=(41, 1)),
                                     contract.change(Op.INSERT, schema, after=(42, 1000))]))
    assert "column small" in str(info.value) and "key (42,)" in str(info.value)
