"""Every target's DDL handler table covers every neutral DDL operation."""
from __future__ import annotations

import importlib

import pytest

from cynomys.applier.targets.ddl_runner import missing_ops
from cynomys.core.targets import TARGETS
from cynomys.parser import ddl


def _handlers(kind: str) -> dict[type[ddl.DdlOp], object]:
    try:
        module = importlib.import_module(f"cynomys.applier.targets.{kind}.ddl")
    except ImportError as exc:  # a driver extra not installed: say which
        pytest.skip(f"the {kind} target's driver is not installed here ({exc})")
    handlers: dict[type[ddl.DdlOp], object] = module.HANDLERS
    return handlers


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_handler_table_covers_every_op(kind: str) -> None:
    assert missing_ops(_handlers(kind)) == []


def test_all_ops_lists_every_op_class() -> None:
    # ALL_OPS is what the coverage check reads; a new op class must be in it.
    def subclasses(cls: type) -> set[type]:
        return set(cls.__subclasses__()).union(*(subclasses(c) for c in cls.__subclasses__()))
    assert subclasses(ddl.DdlOp) == set(ddl.ALL_OPS)
