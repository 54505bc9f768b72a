"""Connected targets of every registered kind, for tests.

One module per kind of the target registry (``cynomys.core.targets.TARGETS``),
named after the kind.  Each says what its targets need (``resource``: a
server, a session, nothing) and how to make a ``Factory`` of connected
targets in each of its variants (``VARIANTS``: bulk paths, engine profiles),
with the pytest marks its cases carry (``MARKS``).
tests/integration/test_target_contract.py runs every contract body
(target_contract.py) on every variant of every registered kind; the
target's own test file reuses its factories for the tests only it has.  A
new target adds its module here: the contract module fails until it does.
"""
from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ContextManager, Iterator, Mapping, Protocol, Sequence

from cynomys.applier.targets.base import Target
from cynomys.core.model import Row
from tests.integration import target_contract as contract


class Factory:
    """Connected targets made by ``make(**overrides)``; closed at teardown.

    ``all_types_rows``: the contract's rows of every type as this target can
    hold them (target_contract.all_types_rows reads it)."""

    def __init__(self, make: Callable[..., Target], all_types_rows: list[Row] | None = None) -> None:
        self.make = make
        self.made: list[Target] = []
        self.all_types_rows = all_types_rows if all_types_rows is not None else contract.ALL_TYPES_ROWS

    def __call__(self, **overrides: Any) -> Any:
        target = self.make(**overrides)
        target.connect()
        self.made.append(target)
        return target

    def close(self) -> None:
        for t in reversed(self.made):
            t.close()


class Setup(Protocol):
    """What a kind's module provides."""

    #: variant -> (its resource, a temporary folder of the test's own) -> a Factory.
    VARIANTS: Mapping[str, Callable[[Any, Path], Factory]]
    #: pytest marks of every case of the kind.
    MARKS: Sequence[Any]

    def resource(self, tmp: Path) -> ContextManager[Any]:
        """What the variants need, for a whole test module (skips when the
        kind cannot run here, which only MonetDB does: no server package)."""


def setup_of(kind: str) -> ModuleType:
    """The module of ``kind`` (ImportError when the kind has none)."""
    return importlib.import_module(f"{__name__}.{kind}")


@contextlib.contextmanager
def nothing(tmp: Path) -> Iterator[None]:
    """The resource of a kind whose targets need none."""
    yield None
