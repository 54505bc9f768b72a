"""DuckDB targets: a database file of the test's own."""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Callable

from cynomys.core.config import ApplierConfig, Config, TargetConfig
from cynomys.core.model import RawTemporal, Row
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory, nothing

MARKS: tuple[Any, ...] = ()
resource = nothing
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
