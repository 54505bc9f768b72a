"""DuckDB targets: a database file of the test's own."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cynomys.core.config import ApplierConfig, Config, TargetConfig
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory, nothing

MARKS: tuple[Any, ...] = ()
resource = nothing

#: DuckDB's DATE/TIMESTAMP cannot hold zero or partial dates (the target
#: refuses them, see test_zero_dates_are_refused).
duckdb_rows = contract.real_dated_rows


def make_config(path: str, skip_ddl: list[str] | None = None) -> Config:
    return Config(target=TargetConfig(kind="duckdb", url=path), applier=ApplierConfig(skip_ddl=list(skip_ddl or [])))


def factory(path: str) -> Factory:
    from cynomys.applier.targets.duckdb.target import DuckDBTarget  # needs duckdb

    def make(**overrides: Any) -> DuckDBTarget:
        target = DuckDBTarget(make_config(path, overrides.pop("skip_ddl", None)))
        assert not overrides, overrides
        return target

    f = Factory(make, duckdb_rows())
    f.path = path  # type: ignore[attr-defined]
    return f


VARIANTS: dict[str, Callable[[None, Path], Factory]] = {
    "file": lambda _, tmp: factory(str(tmp / "replica.duckdb")),
}
