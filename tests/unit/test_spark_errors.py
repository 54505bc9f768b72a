"""Which Spark/Iceberg failures the applier retries (pure logic: the text of
the Java cause chain decides, as it does for a real Py4JJavaError)."""
from __future__ import annotations

import pytest

from cynomys.applier.targets.spark.session import translate
from cynomys.core.errors import TargetRejectedError, TargetUnavailableError


class _JavaError(Exception):
    """Stands for a CapturedException: the JVM stack trace in ``_stackTrace``."""

    def __init__(self, trace: str) -> None:
        super().__init__("An error occurred while calling o42.sql")
        self._stackTrace = trace


@pytest.mark.parametrize("trace", [
    "org.apache.iceberg.exceptions.ValidationException: Found new conflicting delete files that can apply to "
    "records matching ((not_null(ref(name=\"id\")) and ref(name=\"id\") >= 5000) and ref(name=\"id\") <= 6000)",
    "org.apache.iceberg.exceptions.ValidationException: Found conflicting files that can contain records matching true",
    "org.apache.iceberg.exceptions.CommitFailedException: Cannot commit: stale table metadata",
    # Seen in the Spark verify test: its tampering's row delta met the applier's compaction of the same file.
    "org.apache.iceberg.exceptions.ValidationException: Cannot commit, missing data files: "
    "[file:/w/warehouse/app/acct/data/cynomys-386a8e11dc324c8dbf95614d3e0f6418.parquet]",
    # Seen in the Spark verify test when another writer replaced a DV during the commit (apache/iceberg#17764).
    "org.apache.iceberg.exceptions.ValidationException: Can't index multiple DVs for /w/app/acct/data/00000-162-05fb"
    "-00001.parquet: DV{location=/w/app/acct/data/00000-180-f5b4-00001-deletes.puffin, offset=4, length=111, "
    "referencedDataFile=/w/app/acct/data/00000-162-05fb-00001.parquet} and DV{location=/w/app/acct/data/00000-200-"
    "dbfb-00001-deletes.puffin, offset=4, length=67, referencedDataFile=/w/app/acct/data/00000-162-05fb-00001.parquet}",
])
def test_a_concurrent_committer_is_transient(trace: str) -> None:
    err = translate(_JavaError(trace), "applying a flush")
    assert isinstance(err, TargetUnavailableError), err


def test_a_schema_validation_error_is_terminal() -> None:
    err = translate(_JavaError("org.apache.iceberg.exceptions.ValidationException: Cannot find field 'x' in struct"),
                    "applying a flush")
    assert isinstance(err, TargetRejectedError) and not isinstance(err, TargetUnavailableError), err
