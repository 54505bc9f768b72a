"""The target contract (target_contract.py) on every registered target.

Parametrised over the registry (``cynomys.core.targets.TARGET_KINDS``):
each kind's module under target_setups/ gives its variants (bulk paths,
engine profiles) and what they need -- a MariaDB server started here, a
Spark session on a local warehouse, a DuckDB file, the MonetDB server that
``CYNOMYS_TEST_MONETDB`` names.  MonetDB cases skip only when that variable
is unset; no other kind skips.  What is particular to one target stays in
its own test file (test_<kind>_target.py).
"""
from __future__ import annotations

import contextlib
import itertools
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from cynomys.core.targets import TARGET_KINDS
from tests.integration import shape_contract
from tests.integration import target_contract as contract
from tests.integration.target_setups import Factory, setup_of

pytestmark = pytest.mark.integration


def _cases() -> list[Any]:
    cases = []
    for kind in TARGET_KINDS:
        try:
            setup = setup_of(kind)
        except ImportError:
            continue  # test_every_registered_kind_has_a_setup says which
        cases += [pytest.param((kind, variant), id=f"{kind}-{variant}", marks=list(setup.MARKS))
                  for variant in setup.VARIANTS]
    return cases


def test_every_registered_kind_has_a_setup() -> None:
    """Adding a target to the registry without its setup fails here, not silently."""
    missing = []
    for kind in TARGET_KINDS:
        try:
            setup = setup_of(kind)
        except ModuleNotFoundError as exc:
            if exc.name != f"{setup_of.__module__}.{kind}":
                raise
            missing.append(kind)
            continue
        assert setup.VARIANTS, f"target_setups/{kind}.py has no variants"
        assert callable(setup.resource)
    assert not missing, f"give these registered kinds a module under tests/integration/target_setups/: {missing}"


class Resources:
    """Each kind's resource, made on first use and kept for the module."""

    def __init__(self, stack: contextlib.ExitStack, tmp: pytest.TempPathFactory) -> None:
        self.stack, self.tmp = stack, tmp
        self.made: dict[str, Any] = {}

    def of(self, kind: str) -> Any:
        if kind not in self.made:
            self.made[kind] = self.stack.enter_context(setup_of(kind).resource(self.tmp.mktemp(kind)))
        return self.made[kind]


@pytest.fixture(scope="module")
def resources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resources]:
    with contextlib.ExitStack() as stack:
        yield Resources(stack, tmp_path_factory)


@pytest.fixture(scope="module", params=_cases())
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(kind, variant); module scope: pytest runs a case's bodies together."""
    kind, variant = request.param
    return kind, variant


@pytest.fixture
def factory(case: tuple[str, str], resources: Resources, tmp_path: Path) -> Iterator[Factory]:
    kind, variant = case
    made = setup_of(kind).VARIANTS[variant](resources.of(kind), tmp_path)
    yield made
    made.close()


_run = uuid.uuid4().hex[:6]  # a MonetDB server is shared between runs: names of this run's own
_names = itertools.count(1)


@pytest.fixture
def db(case: tuple[str, str]) -> str:
    return f"contract_{case[0]}_{_run}_{next(_names)}"


#: Every body: the target's own contract and [shape]'s (shape_contract.py).
BODIES = {**contract.CONTRACT, **shape_contract.CONTRACT}


@pytest.mark.parametrize("body", sorted(BODIES))
def test_contract(body: str, factory: Factory, db: str) -> None:
    BODIES[body](factory, db)
