"""End to end into the embedded default, Spark/Iceberg (issue #11's scenario):
4 writers of the mixed workload (multi-row inserts, range updates, deletes,
key changes, a keyless table), producer and applier killed with SIGKILL
while they write, then the Iceberg tables must equal the source row by row
(once with a source writing compressed binlog events).
The test prints how long after the writers stopped the target was equal."""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cynomys.applier.targets.base import Target, open_target
from cynomys.applier.targets.spark.config import SparkConfig
from cynomys.core.config import load_config
from cynomys.core.errors import CynomysError
from tests.helpers import sorted_source_rows
from tests.integration.test_e2e_columnstore import TABLES, _run, _writer
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

pytest.importorskip("pyspark", reason="the Spark target needs pyspark (pip install 'cynomys[spark]')")


class SparkSide:
    """The target as Iceberg tables in a local warehouse, read back through a
    Spark session of the test's own (the applier daemon has another)."""

    def __init__(self, src: MariaDBServer, cfg: Path | None = None) -> None:
        self.src = src
        self.config: dict[str, Any] = {"kind": "spark"}
        self.extra: dict[str, Any] = {"target__spark": {"master": "local[2]"}}
        self.reader: Target | None = None
        self.warming: threading.Thread | None = None
        if cfg is not None:
            # Start the reader's Spark while the writers write: the catch-up
            # time then measures the applier, not the test's JVM start.
            self.warming = threading.Thread(target=self._warm, args=(cfg,), daemon=True)
            self.warming.start()

    def _warm(self, cfg: Path) -> None:
        deadline = time.monotonic() + 120
        while not cfg.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # _run writes the file once, whole; give it a moment
        try:
            self._open(cfg)
        except Exception:  # diff() opens it again and raises what is wrong
            self.reader = None

    def _open(self, cfg: Path) -> Target:
        c = load_config(cfg, env={})
        c = dataclasses.replace(c, target=c.target.with_options(
            dataclasses.replace(c.target.of(SparkConfig), master="local[1]")))
        reader = open_target(c)
        reader.connect()
        self.reader = reader
        return reader

    def _target(self, cfg: Path) -> Target:
        if self.warming is not None:
            self.warming.join()
            self.warming = None
        return self.reader or self._open(cfg)

    def diff(self, cfg: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for t in TABLES:
            want = sorted_source_rows(self.src, "app", t)
            try:
                got = sorted(self._target(cfg).fetch_rows("app", t), key=repr)
            except CynomysError as exc:
                out[t] = str(exc).splitlines()[0]
                continue
            out[t] = None if got == want else {"source_rows": len(want), "target_rows": len(got),
                                               "only_source": [r for r in want if r not in got][:2],
                                               "only_target": [r for r in got if r not in want][:2]}
        return out

    def destroy(self) -> None:
        if self.reader is not None:
            self.reader.close()


@pytest.mark.parametrize("buffer_rows,binlog_compress", [(10_000, False), (2000, False), (2000, True)],
                         ids=["buffer10000", "buffer2000", "compressed-binlog"])
def test_mixed_workload_with_kills_into_iceberg(tmp_path: Path, redis_url: str, buffer_rows: int,
                                                binlog_compress: bool) -> None:
    # _run asserts that every table ends equal to the source, row by row
    # (catch_up_s is a generous limit, not the goal); it prints how long
    # after the writers stopped that was: bench/bench_spark_catchup.py
    # records that number.
    _run(tmp_path, redis_url, writer=_writer, batch_max_events=500, kills=["producer", "applier"] * 2,
         alter_at=2, target=lambda src: SparkSide(src, tmp_path / "c.toml"), write_s=60, catch_up_s=300,
         applier={"buffer_rows": buffer_rows, "max_delay_ms": 300}, binlog_compress=binlog_compress)
