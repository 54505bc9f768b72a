"""MonetDB targets on the server ``CYNOMYS_TEST_MONETDB`` names.

No MonetDB server package is installable here, so these run where
``CYNOMYS_TEST_MONETDB`` names a reachable server as a pymonetdb URL, e.g.
``monetdb://monetdb:monetdb@127.0.0.1:50000/demo``, and skip elsewhere (the
one kind that may skip).  Variants: the ``COPY INTO ... FROM STDIN`` bulk
path and multi-row INSERTs (``?bulk=insert``).  Every test works in
databases (schemas) of its own, so a shared server is fine.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from cynomys.core.config import ApplierConfig, Config, TargetConfig
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory

MARKS: tuple[Any, ...] = ()
URL = os.environ.get("CYNOMYS_TEST_MONETDB", "")


@contextlib.contextmanager
def resource(tmp: Path) -> Iterator[str]:
    if not URL:
        pytest.skip("CYNOMYS_TEST_MONETDB is not set: no MonetDB server here (docs/targets/monetdb.md)")
    yield URL


def make_config(url: str, skip_ddl: list[str] | None = None, show_keys: bool = False) -> Config:
    return Config(target=TargetConfig(kind="monetdb", url=url, show_keys=show_keys),
                  applier=ApplierConfig(skip_ddl=list(skip_ddl or [])))


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query if query else url


#: MonetDB's DATE/TIMESTAMP cannot hold zero or partial dates (the target
#: rejects them, see test_zero_dates_are_rejected).
monetdb_rows = contract.real_dated_rows


def factory(url: str, cls: Any = None) -> Factory:
    from cynomys.applier.targets.monetdb.target import MonetDBTarget  # needs pymonetdb

    made = cls or MonetDBTarget

    def make(**overrides: Any) -> Any:
        target = made(make_config(overrides.pop("url", url), overrides.pop("skip_ddl", None)))
        assert not overrides, overrides
        return target

    return Factory(make, monetdb_rows())


VARIANTS: dict[str, Callable[[str, Path], Factory]] = {
    "copy": lambda url, tmp: factory(url),
    "insert": lambda url, tmp: factory(with_query(url, "bulk=insert")),
}
