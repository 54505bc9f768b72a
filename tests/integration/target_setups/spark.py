"""Spark targets: Iceberg tables on local disk, Spark in local mode.

One Spark session serves a whole test module (starting one costs ~10 s on a
small machine): every target made shares it, and the resource keeps one
target connected until the module ends.  Variants: the defaults (small
flushes as row deltas and appends without a Spark job, the rest as
statements with Arrow sources through Py4J), and every flush a statement
with a Parquet file as its source (the path large flushes take on a local
master).
"""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.core.config import ApplierConfig, Config, TargetConfig
from tests.integration.target_setups import Factory

if TYPE_CHECKING:
    from cynomys.applier.targets.spark.target import SparkTarget

MARKS: tuple[Any, ...] = (pytest.mark.spark,)

#: Small and quick: 2 cores, no UI, few shuffle partitions.  (The JDBC
#: catalog's drivers are on the test JVM's class path: tests/conftest.py.)
TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "2",
}


def make_config(warehouse: Path, skip_ddl: list[str] | None = None, catalog: str = "cy", **spark_kw: Any) -> Config:
    spark = SparkConfig(master="local[2]", warehouse=str(warehouse), catalog=catalog, conf=dict(TEST_CONF),
                        **spark_kw)
    return Config(target=TargetConfig(kind="spark", options=(spark,)),
                  applier=ApplierConfig(skip_ddl=list(skip_ddl or [])))


@functools.cache
def parquet_handoff_target() -> type[SparkTarget]:
    """A SparkTarget whose every flush goes through a Spark statement (no
    direct append, no row delta: spark/delta.py) and whose maintenance is
    Spark's procedures, its source handed to Spark as a Parquet file
    whatever its size."""
    from cynomys.applier.targets.spark.target import SparkTarget

    class ParquetHandoffTarget(SparkTarget):
        parquet_handoff_rows = 1
        fast_appends = False
        row_delta_rows = 0
        small_compaction = False

    return ParquetHandoffTarget


def factory(warehouse: Path, cls: type[SparkTarget] | None = None) -> Factory:
    """``overrides``: ``cls`` (a SparkTarget subclass), ``spark`` ([target.spark] keys), ``skip_ddl``."""
    from cynomys.applier.targets.spark.target import SparkTarget

    def make(**overrides: Any) -> SparkTarget:
        made: type[SparkTarget] = overrides.pop("cls", cls or SparkTarget)
        target = made(make_config(warehouse, overrides.pop("skip_ddl", None), **overrides.pop("spark", {})))
        assert not overrides, overrides
        return target

    return Factory(make)


@contextlib.contextmanager
def resource(tmp: Path) -> Iterator[Path]:
    """A warehouse, and the module's session (kept by one connected target)."""
    warehouse = tmp / "warehouse"
    keeper = factory(warehouse)
    keeper()
    try:
        yield warehouse
    finally:
        keeper.close()


VARIANTS: dict[str, Callable[[Path, Path], Factory]] = {
    "arrow": lambda warehouse, tmp: factory(warehouse),
    "parquet-handoff": lambda warehouse, tmp: factory(warehouse, parquet_handoff_target()),
}


@contextlib.contextmanager
def counting_py4j() -> Iterator[tuple[list[str], list[str]]]:
    """Inside the block: the Py4J name lookups (``jvm.a.b.C``, a segment
    each) and the Java exceptions PySpark converts, as two lists filled as
    they happen; both restored after (targets/spark/iceberg.py's module doc
    says what each costs)."""
    import py4j.java_gateway as jg
    import pyspark.errors.exceptions.captured as captured

    lookups: list[str] = []
    exceptions: list[str] = []
    saved: list[tuple[Any, str, Any]] = [(jg.JVMView, "__getattr__", jg.JVMView.__getattr__),
                                         (jg.JavaPackage, "__getattr__", jg.JavaPackage.__getattr__),
                                         (captured, "convert_exception", captured.convert_exception)]
    for cls in (jg.JVMView, jg.JavaPackage):
        def counting(self: Any, name: str, _orig: Any = cls.__getattr__) -> Any:
            if not name.startswith("__"):
                lookups.append(name)
            return _orig(self, name)
        cls.__getattr__ = counting  # type: ignore[method-assign]

    def converting(e: Any, _orig: Any = captured.convert_exception) -> Any:
        exceptions.append(str(e).splitlines()[0][:120])
        return _orig(e)
    captured.convert_exception = converting
    try:
        yield lookups, exceptions
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)
