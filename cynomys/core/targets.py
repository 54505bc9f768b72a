"""The target registry: ``[target] kind`` -> the class that implements it,
and the dataclass of the target's own settings.

The one list of target kinds.  Config validation, ``open_target``, the
benchmarks, the contract tests and the docs read it; adding a target is a
line here (two with settings of its own) plus its folder under
``cynomys/applier/targets/`` (see docs/internals, "Adding a target").

Both are named by import path, not imported: heavy drivers (PySpark,
pymonetdb, duckdb) load only for the target in use, and ``core`` stays
below ``applier`` in the layering (tests/unit/test_layers.py) although
each target keeps its settings in its own folder (``config.py``): the
configuration loader imports a settings module only when it reads a file,
by the path written here, and such a module imports nothing but
``cynomys.core`` -- so there is no cycle, only a name.
"""
from __future__ import annotations

import functools
import importlib

TARGETS: dict[str, str] = {
    "columnstore": "cynomys.applier.targets.columnstore.target:ColumnStoreTarget",
    "duckdb": "cynomys.applier.targets.duckdb.target:DuckDBTarget",
    "monetdb": "cynomys.applier.targets.monetdb.target:MonetDBTarget",
    "spark": "cynomys.applier.targets.spark.target:SparkTarget",
}

TARGET_KINDS: tuple[str, ...] = tuple(TARGETS)

#: ``[target] kind`` -> the frozen dataclass of that target's own settings
#: (``cynomys.core.config.TargetOptions``), for kinds that have any.  Every
#: one is read from every file (a file may carry settings of a target it
#: does not use: switching ``kind`` back and forth must not fail), under
#: ``[target.<section>]`` or, for ``section = ""``, as keys of ``[target]``.
TARGET_CONFIGS: dict[str, str] = {
    "columnstore": "cynomys.applier.targets.columnstore.config:ColumnStoreConfig",
    "spark": "cynomys.applier.targets.spark.config:SparkConfig",
}


def _load(spec: str) -> type:
    module, _, name = spec.partition(":")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


@functools.cache
def target_config_classes() -> tuple[type, ...]:
    """The settings classes of ``TARGET_CONFIGS``, in its order (imported once)."""
    return tuple(_load(spec) for spec in TARGET_CONFIGS.values())
