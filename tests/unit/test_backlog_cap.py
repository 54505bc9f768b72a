"""The default backlog cap ([applier] max_buffer_rows = 0): a small
buffer_rows (latency on a quiet source) must not shrink what a catching-up
Spark applier takes per flush (issue #11: buffer_rows 2000 caught up in
69-84 s with a cap of 6,000, 53 s with 30,000).  The floor was 200,000
since an initial load's column-wise snapshot rows paid a MERGE per 50,000
rows (1M rows: 38.2 s -> 30.3 s to target equal), and is 400,000 since
snapshot rows are appended around the MERGE and held chunked (10M rows:
2.38x -> 1.92x the hand copy, applier peak within 500 MB); the memory
bound caps a flush of row changes first."""
from __future__ import annotations

from cynomys.applier.loop import backlog_cap
from cynomys.applier.targets.columnstore.target import ColumnStoreTarget
from cynomys.applier.targets.duckdb.target import DuckDBTarget
from cynomys.applier.targets.spark.target import SparkTarget


def test_spark_takes_at_least_its_backlog_rows_whatever_buffer_rows() -> None:
    caps = SparkTarget.capabilities
    assert backlog_cap(caps, 2000) == caps.backlog_rows == 400_000
    assert backlog_cap(caps, 10_000) == 400_000
    assert backlog_cap(caps, 200_000) == 600_000  # 3 x buffer_rows when that is more


def test_columnstore_takes_five_buffer_rows_while_behind() -> None:
    # Each flush leaves the server idle while the applier folds the next:
    # 10M-row initial load 88.8 -> 81.7 s (bench/README.md, 2026-12-01).
    assert backlog_cap(ColumnStoreTarget.capabilities, 2000) == 10_000
    assert backlog_cap(ColumnStoreTarget.capabilities, 10_000) == 50_000


def test_a_cheap_commit_keeps_one_buffer_rows() -> None:
    assert backlog_cap(DuckDBTarget.capabilities, 2000) == 2000
