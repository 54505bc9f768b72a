"""ColumnStore targets on a real MariaDB server.

The ColumnStore engine cannot be installed here, so targets run with
``engine = 'InnoDB'``; the ``columnstore-profile`` variant swaps in the
ColumnStore *profile* on InnoDB tables (its type mapping, no keys, deletes
without LIMIT, type changes by copying), every ColumnStore-specific code
path but the engine itself.
"""
from __future__ import annotations

import contextlib
import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterator

from cynomys.applier.targets.columnstore.config import ColumnStoreConfig
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.applier.targets.columnstore.types import COLUMNSTORE, PROFILES
from cynomys.core.config import ApplierConfig, Config, TargetConfig
from cynomys.core.model import Row
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory
from tests.servers.mariadb import MariaDBServer

MARKS: tuple[Any, ...] = ()


class EmulatedColumnStore(ColumnStoreTarget):
    """The ColumnStore profile on InnoDB tables (ENGINE=InnoDB)."""

    profiles = {**PROFILES, "innodb": dataclasses.replace(COLUMNSTORE, session_sql=())}


def make_config(url: str, engine: str = "InnoDB", skip_ddl: list[str] | None = None) -> Config:
    return Config(target=TargetConfig(kind="columnstore", url=url, options=(ColumnStoreConfig(engine),)),
                  applier=ApplierConfig(skip_ddl=list(skip_ddl or [])))


def columnstore_rows() -> list[Row]:
    """ColumnStore DECIMAL stops at 38 digits: DECIMAL(65,30) becomes
    DECIMAL(38,3), so the test values keep 3 fraction digits."""
    dec = [c for c, _ in contract.ALL_TYPES].index("dec")
    fitted = {1: Decimal("12345678901234567890123456789012345.123"), 2: Decimal("-0.001"), 3: Decimal("0.000")}
    return [r[:dec] + (fitted.get(int(r[0]), r[dec]),) + r[dec + 1:] for r in contract.ALL_TYPES_ROWS]  # type: ignore[arg-type]


def factory(cls: type[ColumnStoreTarget], url: str) -> Factory:
    def make(**overrides: Any) -> ColumnStoreTarget:
        target = cls(make_config(overrides.pop("url", url), overrides.pop("engine", "InnoDB"),
                                 overrides.pop("skip_ddl", None)))
        assert not overrides, overrides
        return target

    return Factory(make, columnstore_rows() if cls.profiles is not PROFILES else contract.ALL_TYPES_ROWS)


@contextlib.contextmanager
def resource(tmp: Path) -> Iterator[MariaDBServer]:
    srv = MariaDBServer(server_id=7).start()
    try:
        yield srv
    finally:
        srv.destroy()


def _variant(cls: type[ColumnStoreTarget], query: str) -> Callable[[MariaDBServer, Path], Factory]:
    return lambda srv, tmp: factory(cls, srv.url + query)


VARIANTS: dict[str, Callable[[MariaDBServer, Path], Factory]] = {
    "innodb": _variant(ColumnStoreTarget, ""),
    "innodb-insert": _variant(ColumnStoreTarget, "?local_infile=0"),  # the multi-row INSERT path
    "columnstore-profile": _variant(EmulatedColumnStore, ""),
}
