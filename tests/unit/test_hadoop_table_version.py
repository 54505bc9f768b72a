"""Which metadata file is a Hadoop-catalog table's current one, as a reader
outside Spark finds it (applier/targets/spark/readers.py): the version hint
may lag the newest metadata file, and for an instant it does not exist (the
writer replaces it by a delete and a rename); a reader polling during the
applier's commits met that instant and failed (bench/freshness.py)."""
from __future__ import annotations

from pathlib import Path

from cynomys.applier.targets.spark.readers import _hadoop_tables


def _table(root: Path, db: str, name: str, versions: list[int], hint: int | None) -> Path:
    meta = root / db / name / "metadata"
    meta.mkdir(parents=True)
    for v in versions:
        (meta / f"v{v}.metadata.json").write_text("{}")
    (meta / "snap-1.avro").write_text("")  # other metadata files are not versions
    if hint is not None:
        (meta / "version-hint.text").write_text(f"{hint}\n")
    return meta


def test_the_current_metadata_file_with_a_lagging_or_missing_hint(tmp_path: Path) -> None:
    _table(tmp_path, "app", "steady", [1, 2, 3], 3)
    _table(tmp_path, "app", "lagging", [4, 5, 6], 5)        # v6 committed, the hint not yet moved
    _table(tmp_path, "app", "between", [7, 8, 9, 10], None)  # the hint deleted, its successor not yet renamed
    _table(tmp_path, "app", "empty", [], None)              # created folder, nothing committed
    got = {(t.database, t.table): Path(t.metadata).name for t in _hadoop_tables(str(tmp_path))}
    assert got == {("app", "steady"): "v3.metadata.json", ("app", "lagging"): "v6.metadata.json",
                   ("app", "between"): "v10.metadata.json"}


def test_a_hint_past_the_files_or_unreadable_falls_back_to_the_files(tmp_path: Path) -> None:
    _table(tmp_path, "app", "ahead", [1, 2], 9)    # a hint naming a file that is not there
    bad = _table(tmp_path, "app", "garbled", [3, 4], None)
    (bad / "version-hint.text").write_text("")     # read while being written
    got = {t.table: Path(t.metadata).name for t in _hadoop_tables(str(tmp_path))}
    assert got == {"ahead": "v2.metadata.json", "garbled": "v4.metadata.json"}
