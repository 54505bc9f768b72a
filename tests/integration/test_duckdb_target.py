"""DuckDBTarget against a real DuckDB file: the shared contract, plus what
only DuckDB has (one writing process: the file is free between flushes)."""
from __future__ import annotations

import datetime
import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from cynomys.applier.targets.base import Target, open_target
from cynomys.core.config import ApplierConfig, Config, TargetConfig
from cynomys.core.errors import TargetRejectedError
from cynomys.core.model import ColumnDef, Op, RawTemporal, Row, TableSchema
from tests.integration import target_contract as contract

duckdb = pytest.importorskip("duckdb", reason="the duckdb extra is not installed (pip install 'cynomys[duckdb]')")
from cynomys.applier.targets.duckdb.target import DuckDBTarget  # noqa: E402  (needs duckdb)

pytestmark = pytest.mark.integration
UTC = datetime.timezone.utc

#: DuckDB's DATE/TIMESTAMP cannot hold zero or partial dates (the target
#: refuses them, see test_zero_dates_are_refused): the contract rows get
#: real dates at the edges of the range instead.
_REAL_DATES = {
    RawTemporal("0000-00-00"): datetime.date(1, 1, 1),
    RawTemporal("2020-02-31"): datetime.date(2020, 2, 28),
    RawTemporal("2020-00-10 00:00:00.000000"): datetime.datetime(1, 1, 1, 0, 0, 0, 1),
}


def duckdb_rows() -> list[Row]:
    rows = []
    for r in contract.ALL_TYPES_ROWS:
        fixed = []
        for (_, type_text), v in zip(contract.ALL_TYPES, r):
            if isinstance(v, RawTemporal):
                v = _REAL_DATES.get(v) or (datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC) if type_text.startswith(
                    "timestamp") else datetime.datetime(9999, 12, 31, 23, 59, 59, 999999))
            fixed.append(v)
        rows.append(tuple(fixed))
    return rows


def make_config(path: str, skip_ddl: list[str] | None = None) -> Config:
    return Config(target=TargetConfig(kind="duckdb", url=path), applier=ApplierConfig(skip_ddl=list(skip_ddl or [])))


class Factory:
    def __init__(self, path: str) -> None:
        self.path = path
        self.made: list[Target] = []
        self.all_types_rows = duckdb_rows()

    def __call__(self, **overrides: Any) -> Target:
        target = DuckDBTarget(make_config(self.path, overrides.pop("skip_ddl", None)))
        assert not overrides, overrides
        target.connect()
        self.made.append(target)
        return target

    def close(self) -> None:
        for t in self.made:
            t.close()


_names = itertools.count(1)


@pytest.fixture
def db() -> str:
    return f"duck_test_{next(_names)}"


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[Factory]:
    f = Factory(str(tmp_path / "replica.duckdb"))
    yield f
    f.close()


@pytest.mark.parametrize("body", sorted(contract.CONTRACT))
def test_contract(body: str, factory: Factory, db: str) -> None:
    contract.CONTRACT[body](factory, db)


def test_registry_opens_it(tmp_path: Path) -> None:
    assert isinstance(open_target(make_config(str(tmp_path / "x.duckdb"))), DuckDBTarget)


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
