"""Warming the JVM's write paths when the Spark applier connects.

A freshly started JVM runs Spark's and Iceberg's write paths interpreted
until the JIT compiles them: measured on lineitem (bench/lineitem.py, 2-core
box), the first three flushes after a start took 6.9, 4.0 and 3.0 s where a
warm one takes 1.3 s for as many rows.  An applier usually connects before
its first envelope is there (a start, a restart while the producer is also
starting, a DDL to apply first), so a small append, MERGE and DELETE on a
scratch table of the state namespace, in a thread of its own, moves most of
that cost off the first flushes.

It never touches a replicated table or the applier's state; a failure is
logged and forgotten (the flushes then warm the JVM themselves, as before).
"""
from __future__ import annotations

import logging
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cynomys.applier.targets.spark.target import SparkTarget

log = logging.getLogger(__name__)

WARM_TABLE = "warmup"
WARM_ROWS = 2000


_warmed: set[int] = set()  # session generations warmed (one JVM, several targets: once)
_lock = threading.Lock()


def start(target: SparkTarget, generation: int) -> threading.Thread | None:
    """Warm ``target``'s session in a daemon thread, once per session."""
    with _lock:
        if generation in _warmed:
            return None
        _warmed.add(generation)
    t = threading.Thread(target=_run, args=(target,), name="spark-warm-up", daemon=True)
    t.start()
    return t


def _run(target: SparkTarget) -> None:
    t0 = time.monotonic()
    try:
        warm_up(target)
    except Exception as exc:  # a warm-up is an optimisation: never a reason to stop
        log.info("Spark warm-up skipped after %.1fs: %s", time.monotonic() - t0, str(exc).splitlines()[0][:200])
        return
    log.info("Spark warm-up (append, MERGE, DELETE on a %d-row scratch table) took %.1fs",
             WARM_ROWS, time.monotonic() - t0)


def warm_up(target: SparkTarget) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cynomys.applier.targets.spark.layout import TableLayout
    from cynomys.applier.targets.spark.merge import lit

    spark = target.spark
    name = target.qualified(target.state_namespace, WARM_TABLE)
    # The default format version (its delete path is the one to warm); no
    # partition spec or sort order: those name the replicated tables' columns.
    default = TableLayout(format_version=target.settings.format_version)
    props = ", ".join(f"{lit(k)} = {lit(v)}" for k, v in target.properties_for(default).items())
    target.sql(f"DROP TABLE IF EXISTS {name} PURGE")
    target.sql(f"CREATE TABLE {name} (id BIGINT, v STRING, d DECIMAL(14,2), at TIMESTAMP) USING iceberg "
               f"COMMENT 'Cynomys: warms the JVM at connect; safe to drop' TBLPROPERTIES ({props})")
    ids = list(range(WARM_ROWS))
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids], pa.string()),
                     "d": pa.array([Decimal(i) / 100 for i in ids], pa.decimal128(14, 2)),
                     "at": pa.array([i * 1_000_000 for i in ids], pa.timestamp("us", tz="UTC"))})
    view = "cynomys_warm_up_src"
    with tempfile.TemporaryDirectory(prefix="cynomys-spark-warm-") as d:
        if target.conf["spark.master"].startswith("local"):
            path = Path(d) / "warm.parquet"
            pq.write_table(data, path, compression="none")  # the handoff the flushes use (SparkTarget._spool)
            spark.read.parquet(str(path)).createOrReplaceTempView(view)
        else:  # a cluster's executors cannot read the driver's temp folder
            spark.range(WARM_ROWS).selectExpr(
                "id", "concat('v', id) AS v", "CAST(id / 100 AS DECIMAL(14,2)) AS d",
                "timestamp_seconds(id) AS at").createOrReplaceTempView(view)
        try:
            target.sql(f"INSERT INTO {name} SELECT * FROM {view}")
            target.sql(f"MERGE INTO {name} t USING {view} s ON t.id = s.id "
                       "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
            target.sql(f"DELETE FROM {name} WHERE id < {WARM_ROWS // 2}")
            spark.sql(f"SELECT COUNT(*) FROM {name}").collect()
        finally:
            spark.catalog.dropTempView(view)
    target.sql(f"DROP TABLE IF EXISTS {name} PURGE")
