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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cynomys.applier.targets.spark.delta import RowDelta, field_names, readable_here
from cynomys.applier.targets.spark.direct import LAST_UPDATED_FIELD, ROW_ID_FIELD, DirectAppend, local_path

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
        lineage ids and last-updated sequence numbers."""
        f = j["data-file"]
        path = local_path(f["file-path"])
        assert path is not None
        by_id = field_names(pf := pq.ParquetFile(path))
        wanted = [i for i, _ in layout.fields.values() if i in by_id]
        extra = [i for i in (ROW_ID_FIELD, LAST_UPDATED_FIELD) if i in by_id]
        held = pf.read(columns=[by_id[i] for i in wanted + extra], use_threads=False)
        n = held.num_rows
        pos = pa.array(np.arange(n, dtype=np.int64))
        first = f.get("first-row-id")
        row_ids = pa.nulls(n, pa.int64()) if first is None else pc.add(pos, int(first))
        if ROW_ID_FIELD in by_id:
            row_ids = pc.coalesce(held.column(by_id[ROW_ID_FIELD]).cast(pa.int64()), row_ids)
        seq = task.file().dataSequenceNumber()  # what a row without its own number inherits
        seqs = pa.nulls(n, pa.int64()) if seq is None else pa.array(np.full(n, int(seq), dtype=np.int64))
        if LAST_UPDATED_FIELD in by_id:
            seqs = pc.coalesce(held.column(by_id[LAST_UPDATED_FIELD]).cast(pa.int64()), seqs)
        cols = []
        for name, (field_id, arrow_type) in layout.fields.items():
            col = held.column(by_id[field_id]).cast(arrow_type) if field_id in by_id else pa.nulls(n, arrow_type)
            cols.append(col)
        rows = pa.table(cols, names=[layout.names[k] for k in layout.fields])
        deletes = j.get("delete-files") or []
        if deletes:
            gone = self.row_delta._old_dv_of(deletes[0])
            live = pc.invert(pc.is_in(pos, value_set=pa.array(gone.to_array(), type=pa.int64())))
            rows, row_ids, seqs = rows.filter(live), row_ids.filter(live), seqs.filter(live)
        return rows, _array(row_ids), _array(seqs)


def _array(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
