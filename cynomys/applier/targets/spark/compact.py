"""A small table compacted without Spark: its live rows read by pyarrow,
written as one data file, swapped in by one Iceberg rewrite commit through
the Java API; then snapshots expired through the Java API.

Why (issue #28): once flushes run without Spark jobs (``delta.py``), the
table maintenance between them was the longest pause left: Spark's
``rewrite_data_files``, ``rewrite_position_delete_files`` and
``expire_snapshots`` procedures took 4.7-12.9 s for a table of 40 one-row
files on this 2-core box under load, and an applier that is never idle
runs them between two flushes (``maintenance.py``), so every row waiting
for the next flush waited that long.  A table of a few megabytes is read
and written here in tenths of a second.

What the procedures keep, this keeps: the rows (deletion vectors applied),
each row's lineage (``_row_id``, and ``_last_updated_sequence_number`` from
its file's data sequence number when the file does not hold it), the
table's field ids and codec (``direct.py``).  Only a format-v3 table that
``direct.py`` can append to, whose deletes are all deletion vectors, of at
most ``MAX_BYTES`` of data files (its rows are held in memory); otherwise ``run`` returns None and the
Spark procedures run as before.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cynomys.applier.targets.spark.delta import LIVE_ROW_ID, LIVE_SEQ, RowDelta, dv_positions, live_rows, readable_here
from cynomys.applier.targets.spark.direct import DirectAppend, local_path

log = logging.getLogger(__name__)

#: Tables with more data files than this (compressed, on disk) are compacted
#: by Spark's procedures: the live rows are held in the applier's memory
#: (Arrow: several times their Parquet size), within ``[applier] max_memory_mb``.
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Compacted:
    """What a compaction did."""

    rewritten_data_files: int
    added_data_files: int
    removed_delete_files: int
    expired_snapshots: int
    files_after: dict[str, int]


class SmallCompaction:
    """Compaction and snapshot expiry of small tables without Spark (module doc)."""

    def __init__(self, direct: DirectAppend, row_delta: RowDelta) -> None:
        self.direct = direct
        self.row_delta = row_delta
        self.iceberg = direct.iceberg

    def run(self, database: str, table: str, older_than_ms: int, keep: int) -> Compacted | None:
        tbl = self.iceberg.load(database, table)
        if int(tbl.operations().current().formatVersion()) < 3:
            return None
        layout = self.direct.layout(database, table, tbl)
        if layout is None:
            return None
        snap = tbl.currentSnapshot()
        files = self._files(tbl) if snap is not None else []
        if files is None:
            return None
        deletes = sum(1 for _, j in files if j.get("delete-files"))
        rewritten = added = 0
        if len(files) > 1 or deletes:
            parts, ids, seqs = [], [], []
            for task, j in files:
                part, part_ids, part_seqs = self._live(task, j, layout)
                parts.append(part)
                ids.append(part_ids)
                seqs.append(part_seqs)
            rows = pa.concat_tables(parts) if parts else None
            rewrite = tbl.newRewrite().validateFromSnapshot(snap.snapshotId())
            for task, j in files:
                rewrite = rewrite.deleteFile(task.file())
                if j.get("delete-files"):
                    rewrite = rewrite.deleteFile(task.deletes().get(0))
            if rows is not None and rows.num_rows:
                data_file, _ = self.direct.write(tbl, layout, rows, row_ids=pa.concat_arrays(ids),
                                                 last_updated=pa.concat_arrays(seqs))
                rewrite = rewrite.addFile(data_file)
                added = 1
            rewrite.commit()
            rewritten = len(files)
        before = self._snapshot_count(tbl)
        tbl.expireSnapshots().expireOlderThan(older_than_ms).retainLast(keep).commit()
        after = self._snapshot_count(self.iceberg.load(database, table))
        return Compacted(rewritten, added, deletes, before - after,
                         {"data": added if rewritten else len(files), "position_deletes": 0 if rewritten else deletes})

    def _snapshot_count(self, tbl: Any) -> int:
        return int(tbl.operations().current().snapshots().size())

    def _files(self, tbl: Any) -> list[tuple[Any, dict[str, Any]]] | None:
        """Every data file of the current snapshot with its scan task, or
        None when the table is too large or a delete is not a deletion vector."""
        out: list[tuple[Any, dict[str, Any]]] = []
        size = 0
        for task, j in self.row_delta.scan(tbl, tbl.currentSnapshot().snapshotId()):
            size += int(j["data-file"]["file-size-in-bytes"])
            if size > MAX_BYTES or not readable_here(j):
                return None
            out.append((task, j))
        return out

    def _live(self, task: Any, j: dict[str, Any], layout: Any) -> tuple[pa.Table, pa.Array, pa.Array]:
        """A data file's live rows (the table's columns, by field id), their
        lineage ids and last-updated sequence numbers (a row without its own
        inherits its file's data sequence number)."""
        f = j["data-file"]
        deletes = j.get("delete-files") or []
        fields = [(field_id, layout.names[k], t) for k, (field_id, t) in layout.fields.items()]
        first = f.get("first-row-id")
        rows = live_rows(str(local_path(f["file-path"])), fields, dv_positions(deletes[0]) if deletes else None,
                         None if first is None else int(first), lineage=True, missing_as_null=True)
        assert rows is not None  # missing columns are NULLs
        seq = task.file().dataSequenceNumber()
        seqs = rows.column(LIVE_SEQ) if seq is None else pc.coalesce(rows.column(LIVE_SEQ), pa.scalar(int(seq), pa.int64()))
        return rows.select([name for _, name, _ in fields]), _array(rows.column(LIVE_ROW_ID)), _array(seqs)


def _array(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
