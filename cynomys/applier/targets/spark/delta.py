"""A small flush of a table as one Iceberg row delta, written here and committed
through Iceberg's Java API -- deletion vectors for the rows it replaces or
deletes, a data file of its final images -- with no Spark job.

Why (issue #28, freshness): a MERGE of a few rows costs ~1 s of driver work
on this 2-core box whatever its size (analysis, planning, adaptive
re-planning, a shuffle of the pruned target side: bench/README.md, "Py4J
inside every Spark flush"), and a flush of a mixed workload is several of
them side by side: p99 freshness was two such flushes, 5-8 s against a goal
of 5.  What the MERGE works out with a join, a small flush works out here:
Iceberg plans the data files whose column bounds may hold the flush's keys
(``in`` on the first key column), pyarrow reads those files' key columns,
and the live rows holding a key of the flush are the ones to delete.  A
keyless table's flush deletes so many copies of each row value
(``multiset``): the live rows equal to it on every column, NULL-safe as the
MERGE's ``<=>``, the first so many of them.  They
are deleted as Spark's merge-on-read MERGE deletes them on a v3 table: one
deletion vector per data file (a Puffin blob; the file's earlier vector is
merged into the new one and removed in the same commit, as Iceberg requires
of v3 tables), and the final images are appended as a data file written by
pyarrow (``direct.py``).  One commit, carrying the flush marker like the
MERGE's: exactly-once and the rollback of a table ahead of the state
(``target.py``) hold as before.

Only where the result is the MERGE's: a v3 table ``direct.py`` can append to
(unpartitioned, unsorted, flat types, a local warehouse), every column of
the table in the flush (a MERGE keeps the columns it does not set), key
columns (a keyless table's: every column) of exact types, keys without
NULLs, deletes that are all deletion vectors, at most ``MAX_FILES`` data
files holding at most ``MAX_ROWS`` rows and ``MAX_BYTES`` (keyless:
``MAX_KEYLESS_BYTES``) to read (files a deletion vector empties are not
read), and no key held by two live rows.  Otherwise ``upsert`` and
``multiset`` return None before anything was written, and the caller runs
the MERGE.
"""
from __future__ import annotations

import contextlib
import decimal
import functools
import json
import logging
import os
import struct
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from cynomys.applier.targets.spark.direct import LAST_UPDATED_FIELD, ROW_ID_FIELD, DirectAppend, Layout, local_path
from cynomys.applier.targets.spark.iceberg import IcebergApi
from cynomys.applier.targets.spark.merge import COUNT_COLUMN, OP_COLUMN

log = logging.getLogger(__name__)

#: Candidate data files (those whose bounds may hold a key of the flush)
#: beyond which the MERGE does it: each is opened and its key columns read.
MAX_FILES = 64
#: ... and rows in them.
MAX_ROWS = 4_000_000
#: ... and bytes on disk (a keyed table's files: only the key columns are read).
MAX_BYTES = 256 << 20
#: ... of a keyless table, whose files are read whole (Arrow holds several
#: times their Parquet size; one file at a time, within ``max_memory_mb``).
MAX_KEYLESS_BYTES = 32 << 20
#: First-key values handed to Iceberg's planner as ``in`` (more: a range).
MAX_IN = 1_000
#: Iceberg's reserved field id of a row's position (``_pos``): the field a
#: deletion vector is computed for.
ROW_POSITION_FIELD = 2147483545
DV_TYPE = "deletion-vector-v1"
DV_MAGIC = bytes.fromhex("d1d33964")
#: The columns ``live_rows`` adds: a row's position in its file, lineage id and
#: last-updated sequence number.
LIVE_POS = "__cynomys_pos"
LIVE_ROW_ID = "__cynomys_row_id"
LIVE_SEQ = "__cynomys_last_updated"
_INDEX = "__cynomys_index"


def exact_key_type(t: pa.DataType) -> bool:
    """Key types whose Arrow equality is the MERGE's ``=``: not floating
    point (``-0.0 = 0.0`` and NaN equal to itself there)."""
    return bool(pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_binary(t)
                or pa.types.is_fixed_size_binary(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)
                or pa.types.is_decimal(t) or pa.types.is_boolean(t))


def dv_blob(positions: BitMap64) -> bytes:
    """A ``deletion-vector-v1`` blob (Puffin spec): length and magic, the
    positions as a portable 64-bit Roaring bitmap, a CRC-32 of magic and
    bitmap; lengths and CRC big-endian."""
    body = DV_MAGIC + positions.serialize()
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def read_dv(blob: bytes, where: str) -> BitMap64:
    """The positions of a ``deletion-vector-v1`` blob (checked as Iceberg checks it)."""
    (length,) = struct.unpack(">I", blob[:4])
    body = blob[4:4 + length]
    if length != len(blob) - 8 or body[:4] != DV_MAGIC \
            or struct.unpack(">I", blob[4 + length:])[0] != zlib.crc32(body):
        raise ValueError(f"deletion vector {where} is not a deletion-vector-v1 blob (length, magic or CRC)")
    return BitMap64.deserialize(body[4:])


@dataclass
class _File:
    """A data file that may hold keys of the flush."""

    task: Any                 # its Java FileScanTask (the old vector is removed through it)
    location: str             # as the table's metadata names it
    path: str                 # on the local file system
    records: int
    first_row_id: int | None  # the lineage id of its first row (v3), when assigned
    dv: dict[str, Any] | None  # its deletion vector, as ScanTaskParser writes it


class RowDelta:
    """Small flushes committed as Iceberg row deltas (module doc)."""

    def __init__(self, iceberg: IcebergApi, direct: DirectAppend) -> None:
        self.iceberg = iceberg
        self.direct = direct

    @functools.cached_property
    def _classes(self) -> dict[str, Any]:
        """Resolved once: each Py4J name lookup is a class-path search (iceberg.py)."""
        jvm = self.iceberg._jvm
        ice = jvm.org.apache.iceberg
        return {"Expressions": ice.expressions.Expressions, "ScanTaskParser": ice.ScanTaskParser,
                "Puffin": ice.puffin.Puffin, "Blob": ice.puffin.Blob, "ByteBuffer": jvm.java.nio.ByteBuffer,
                "FileMetadata": ice.FileMetadata, "PUFFIN": ice.FileFormat.PUFFIN}

    def upsert(self, database: str, table: str, data: pa.Table, key: Sequence[str],
               summary: dict[str, str]) -> str | None:
        """Commit ``data`` (final images 'U' and deleted keys 'D' in
        ``OP_COLUMN``, at most one row per key, as ``merge.keyed_rows`` makes
        them) as one row delta carrying ``summary``: a note for the flush
        log line, or None -- nothing written -- where the MERGE must do it."""
        t0 = time.monotonic()
        columns = [c for c in data.column_names if c != OP_COLUMN]
        opened = self._open(database, table, columns)
        if opened is None:  # key columns are among the columns, which are the table's
            return None
        tbl, layout, snap = opened
        types = [layout.fields[k.lower()][1] for k in key]
        if not all(exact_key_type(t) for t in types):
            return None
        keys = pa.table([data.column(k).cast(t) for k, t in zip(key, types, strict=True)], names=list(key))
        if any(c.null_count for c in keys.columns):
            return None
        files = self._candidates(tbl, snap, keys, layout) if snap is not None else []
        if files is None:
            return None
        found_hits = self._hits(files, keys, layout)
        if found_hits is None:
            return None
        hits, held = found_hits
        t_find = time.monotonic()
        is_upsert = pc.equal(data.column(OP_COLUMN), "U")
        upserts = data.filter(is_upsert).select(columns)
        row_ids = _row_ids(keys.filter(is_upsert), held)
        deleted = sum(len(new) for _, _, new in hits)
        self._commit(tbl, layout, snap, upserts, row_ids, hits, summary)
        return (f" (row delta: {deleted} rows deleted in {len(hits)} of {len(files)} files, "
                f"{upserts.num_rows} written; found in {t_find - t0:.2f}s, "
                f"committed in {time.monotonic() - t_find:.2f}s)")

    def multiset(self, database: str, table: str, data: pa.Table, summary: dict[str, str]) -> str | None:
        """Commit a keyless flush (``merge.keyless_rows``: row values to
        delete 'D' with how many copies in ``COUNT_COLUMN``, rows to insert
        'I') as one row delta carrying ``summary``: that many live copies of
        each deleted value get a deletion vector (all there are, when fewer:
        as the MERGE), the new rows a data file.  Rows compare NULL-safe on
        every column, as the MERGE's ``<=>``; a table with a floating-point
        column keeps the MERGE (``-0.0 <=> 0.0`` and NaN there are not
        Arrow's equality).  A note, or None (nothing written)."""
        t0 = time.monotonic()
        columns = [c for c in data.column_names if c not in (OP_COLUMN, COUNT_COLUMN)]
        opened = self._open(database, table, columns)
        if opened is None:
            return None
        tbl, layout, snap = opened
        types = [layout.fields[c.lower()][1] for c in columns]
        if not all(exact_key_type(t) for t in types):
            return None
        is_delete = pc.equal(data.column(OP_COLUMN), "D")
        gone = data.filter(is_delete)
        values = pa.table([gone.column(c).cast(t) for c, t in zip(columns, types, strict=True)], names=columns)
        counts = gone.column(COUNT_COLUMN).to_numpy(zero_copy_only=False)
        files = self._candidates(tbl, snap, values, layout, MAX_KEYLESS_BYTES) \
            if snap is not None and gone.num_rows else []
        if files is None:
            return None
        hits = self._copies(files, values, counts, layout)
        if hits is None:
            return None
        t_find = time.monotonic()
        inserts = data.filter(pc.invert(is_delete)).select(columns)
        deleted = sum(len(new) for _, _, new in hits)
        self._commit(tbl, layout, snap, inserts, None, hits, summary)
        return (f" (row delta: {deleted} copies deleted in {len(hits)} of {len(files)} files, "
                f"{inserts.num_rows} written; found in {t_find - t0:.2f}s, "
                f"committed in {time.monotonic() - t_find:.2f}s)")

    def _open(self, database: str, table: str, columns: list[str]) -> tuple[Any, Layout, Any] | None:
        """The table, its layout and current snapshot, where a flush of
        ``columns`` can be a row delta: a v3 table that takes files written
        here (direct.py) whose columns are exactly ``columns`` (a MERGE
        keeps the columns it does not set)."""
        tbl = self.iceberg.load(database, table)
        if int(tbl.operations().current().formatVersion()) < 3:
            return None  # v2 deletes are position-delete files: Spark's MERGE writes those
        layout = self.direct.layout(database, table, tbl)
        if layout is None or {c.lower() for c in columns} != set(layout.fields):
            return None
        return tbl, layout, tbl.currentSnapshot()

    # -- which rows ------------------------------------------------------------
    def _candidates(self, tbl: Any, snap: Any, keys: pa.Table, layout: Layout, max_bytes: int = MAX_BYTES
                    ) -> list[_File] | None:
        """The data files of the current snapshot whose bounds may hold a
        row of ``keys`` (by its first column), less those a deletion vector
        empties; None when there are too many or a delete of theirs is not
        a deletion vector."""
        c = self._classes
        first = keys.column_names[0]
        name = layout.names[first.lower()]
        values = pc.unique(keys.column(0))
        t = values.type
        if values.null_count:
            expr = c["Expressions"].alwaysTrue()  # NULL-safe rows (keyless): bounds say nothing of NULLs
        elif (pa.types.is_integer(t) or pa.types.is_string(t)) and len(values) <= MAX_IN:
            expr = getattr(c["Expressions"], "in")(name, values.to_pylist())
        elif pa.types.is_integer(t) or pa.types.is_string(t):
            lo, hi = (v.as_py() for v in pc.min_max(values).values())
            expr = getattr(c["Expressions"], "and")(c["Expressions"].greaterThanOrEqual(name, lo),
                                                    c["Expressions"].lessThanOrEqual(name, hi))
        else:
            expr = c["Expressions"].alwaysTrue()
        files: list[_File] = []
        rows = size = 0
        for task, j in self.scan(tbl, snap.snapshotId(), expr):
            f, deletes = j["data-file"], j.get("delete-files") or []
            if not readable_here(j):
                return None
            if deletes and int(deletes[0]["record-count"]) >= int(f["record-count"]):
                continue  # every row deleted (a row updated again and again: each flush's file)
            rows += int(f["record-count"])
            size += int(f["file-size-in-bytes"])
            if len(files) >= MAX_FILES or rows > MAX_ROWS or size > max_bytes:
                return None
            first = f.get("first-row-id")
            files.append(_File(task, f["file-path"], str(local_path(f["file-path"])), int(f["record-count"]),
                               None if first is None else int(first), deletes[0] if deletes else None))
        return files

    def scan(self, tbl: Any, snapshot_id: int, expr: Any = None) -> Iterator[tuple[Any, dict[str, Any]]]:
        """The data files of a snapshot (those ``expr`` may match): each
        one's Java scan task and the task as JSON (Iceberg's
        ``ScanTaskParser``: one round trip for the file and its deletes)."""
        c = self._classes
        scan = tbl.newScan().useSnapshot(snapshot_id).ignoreResiduals()
        tasks = (scan if expr is None else scan.filter(expr)).planFiles()
        try:
            it = tasks.iterator()
            while it.hasNext():
                task = it.next()
                yield task, json.loads(str(c["ScanTaskParser"].toJson(task)))
        finally:
            tasks.close()

    def _hits(self, files: list[_File], keys: pa.Table, layout: Layout
              ) -> tuple[list[tuple[_File, BitMap64 | None, BitMap64]], pa.Table] | None:
        """Per data file holding live rows with a key of ``keys``: its old
        deletion vector and the positions to delete now; and the keys found
        with their rows' lineage ids.  None when a key is held twice (the
        MERGE decides what that means) or a file lacks a key column (a
        column added later: the MERGE reads it as NULL)."""
        names = keys.column_names
        fields = [(layout.fields[k.lower()][0], k, keys.schema.field(k).type) for k in names]
        out: list[tuple[_File, BitMap64 | None, BitMap64]] = []
        matched: list[pa.Table] = []
        for f in files:
            old = dv_positions(f.dv) if f.dv is not None else None
            side = live_rows(f.path, fields, old, f.first_row_id, lineage=True)
            if side is None:
                return None
            hit = side.join(keys, keys=names, join_type="inner")
            if hit.num_rows:
                matched.append(hit.select(names + [LIVE_ROW_ID]))
                out.append((f, old, BitMap64(hit.column(LIVE_POS).to_numpy())))
        every = pa.concat_tables(matched) if matched else keys.schema.empty_table().append_column(
            LIVE_ROW_ID, pa.array([], pa.int64()))
        if every.group_by(names).aggregate([]).num_rows != every.num_rows:
            log.info("a key of the flush is held by more than one live row: the MERGE applies it")
            return None
        return out, every

    def _copies(self, files: list[_File], values: pa.Table, counts: Any, layout: Layout
                ) -> list[tuple[_File, BitMap64 | None, BitMap64]] | None:
        """Per data file: its old deletion vector and the positions of the
        copies to delete now -- for row value i, its first ``counts[i]`` live
        copies in file order.  None when a file lacks a column."""
        names = values.column_names
        fields = [(layout.fields[n.lower()][0], n, values.schema.field(n).type) for n in names]
        gone = _null_safe(values).append_column(_INDEX, pa.array(np.arange(values.num_rows, dtype=np.int64)))
        keys = [n for n in gone.column_names if n != _INDEX]
        matched: list[tuple[int, Any, Any]] = []  # (file, positions, value index)
        olds: list[BitMap64 | None] = []
        for n, f in enumerate(files):
            old = dv_positions(f.dv) if f.dv is not None else None
            olds.append(old)
            held = live_rows(f.path, fields, old)
            if held is None:
                return None
            side = _null_safe(held.select(names)).append_column(LIVE_POS, held.column(LIVE_POS))
            hit = side.join(gone, keys=keys, join_type="inner")
            if hit.num_rows:
                matched.append((n, hit.column(LIVE_POS).to_numpy(), hit.column(_INDEX).to_numpy()))
        if not matched:
            return []
        file_of = np.concatenate([np.full(len(p), n, dtype=np.int64) for n, p, _ in matched])
        pos = np.concatenate([p for _, p, _ in matched])
        value = np.concatenate([v for _, _, v in matched])
        order = np.lexsort((pos, file_of, value))
        file_of, pos, value = file_of[order], pos[order], value[order]
        # Each copy's rank among its value's copies: keep the first counts[value].
        starts = np.flatnonzero(np.r_[True, value[1:] != value[:-1]])
        rank = np.arange(len(value)) - np.repeat(starts, np.diff(np.r_[starts, len(value)]))
        keep = rank < np.asarray(counts, dtype=np.int64)[value]
        out: list[tuple[_File, BitMap64 | None, BitMap64]] = []
        for n in np.unique(file_of[keep]):
            out.append((files[n], olds[n], BitMap64(pos[keep & (file_of == n)])))
        return out

    # -- the commit ------------------------------------------------------------
    def _commit(self, tbl: Any, layout: Layout, snap: Any, upserts: pa.Table, row_ids: pa.Array | None,
                hits: list[tuple[_File, BitMap64 | None, BitMap64]], summary: dict[str, str]) -> None:
        written: list[str] = []  # local files no commit refers to yet
        try:
            delta = tbl.newRowDelta()
            if upserts.num_rows:
                data_file, _ = self.direct.write(tbl, layout, upserts, row_ids=row_ids)
                written.append(str(local_path(str(data_file.location()))))
                delta = delta.addRows(data_file)
            if hits:
                for dv in self._write_dvs(tbl, hits, written):
                    delta = delta.addDeletes(dv)
                for f, old, _ in hits:
                    if old is not None:
                        delta = delta.removeDeletes(f.task.deletes().get(0))
            if snap is not None:
                # The applier is the table's only writer; should anything
                # else have committed since the planning, fail, not lose it.
                delta = delta.validateFromSnapshot(snap.snapshotId()) \
                    .validateDataFilesExist([f.location for f, _, _ in hits]) \
                    .validateNoConflictingDeleteFiles()
            for k, v in summary.items():
                delta = delta.set(k, v)
        except BaseException:
            for path in written:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        # A commit that fails may still have been taken (Iceberg cannot
        # always tell): its files stay (direct.py says the same).
        delta.commit()

    def _write_dvs(self, tbl: Any, hits: list[tuple[_File, BitMap64 | None, BitMap64]],
                   written: list[str]) -> list[Any]:
        """One Puffin file with a deletion vector per data file hit (the old
        positions and the new): their Java ``DeleteFile``s."""
        c = self._classes
        location = str(tbl.locationProvider().newDataLocation(f"cynomys-{uuid.uuid4().hex}-deletes.puffin"))
        path = local_path(location)
        assert path is not None
        os.makedirs(os.path.dirname(path), exist_ok=True)
        written.append(path)
        vectors = [(f, (old | new) if old is not None else new) for f, old, new in hits]
        writer = c["Puffin"].write(tbl.io().newOutputFile(location)).createdBy("cynomys").build()
        try:
            for f, positions in vectors:
                writer.write(c["Blob"](DV_TYPE, [ROW_POSITION_FIELD], -1, -1,
                                       c["ByteBuffer"].wrap(bytearray(dv_blob(positions))), None,
                                       {"referenced-data-file": f.location, "cardinality": str(len(positions))}))
        finally:
            writer.close()
        size = writer.fileSize()
        blobs = writer.writtenBlobsMetadata()
        metas = [blobs.get(i) for i in range(blobs.size())]  # not iterated: that ends in a Java exception
        return [c["FileMetadata"].deleteFileBuilder(tbl.spec()).ofPositionDeletes().withFormat(c["PUFFIN"])
                .withPath(location).withFileSizeInBytes(size).withRecordCount(len(positions))
                .withReferencedDataFile(f.location).withContentOffset(meta.offset())
                .withContentSizeInBytes(meta.length()).build()
                for (f, positions), meta in zip(vectors, metas, strict=True)]


def _row_ids(upserts: pa.Table, held: pa.Table) -> pa.Array:
    """The lineage id of each final image, in its order: the id of the row
    it replaces (the key held before), else NULL (a new row: the id is
    inherited from the new file's first id and the row's position)."""
    names = upserts.column_names
    indexed = upserts.append_column(_INDEX, pa.array(np.arange(upserts.num_rows, dtype=np.int64)))
    joined = indexed.join(held, keys=names, join_type="left outer").sort_by(_INDEX)
    return joined.column(LIVE_ROW_ID).combine_chunks()


def _zero(t: pa.DataType) -> pa.Scalar:
    """A value of type ``t`` standing in for NULL beside a NULL flag."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.scalar("", t)
    if pa.types.is_fixed_size_binary(t):
        return pa.scalar(b"\0" * t.byte_width, t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.scalar(b"", t)
    if pa.types.is_boolean(t):
        return pa.scalar(False, t)
    if pa.types.is_date32(t):
        return pa.scalar(0, pa.int32()).cast(t)
    if pa.types.is_decimal(t):
        return pa.scalar(decimal.Decimal(0), t)
    return pa.scalar(0, pa.int64()).cast(t)


def _null_safe(table: pa.Table) -> pa.Table:
    """``table`` with each nullable column as (value with NULL replaced,
    NULL flag): Arrow's join never matches NULLs, the MERGE's ``<=>`` does."""
    arrays, names = [], []
    for name, col in zip(table.column_names, table.columns, strict=True):
        arrays.append(pc.fill_null(col, _zero(col.type)) if col.null_count else col)
        names.append(name)
        arrays.append(pc.is_null(col))
        names.append(name + "__cynomys_null")
    return pa.table(arrays, names=names)


def dv_positions(dv: dict[str, Any]) -> BitMap64:
    """The positions of a deletion vector (as its scan task's JSON names it)."""
    path = local_path(dv["file-path"])
    if path is None:
        raise ValueError(f"deletion vector {dv['file-path']} is not on the local file system")
    with open(path, "rb") as fh:
        fh.seek(int(dv["content-offset"]))
        blob = fh.read(int(dv["content-size-in-bytes"]))
    return read_dv(blob, f"{dv['file-path']}@{dv['content-offset']}")


def live_rows(path: str, fields: Sequence[tuple[int, str, pa.DataType]], deleted: BitMap64 | None,
              first_row_id: int | None = None, lineage: bool = False, missing_as_null: bool = False
              ) -> pa.Table | None:
    """The rows of a data file that ``deleted`` (its deletion vector's
    positions) leaves live: the columns ``fields`` names (field id, name,
    type), their position in the file (``LIVE_POS``) and, with ``lineage``, the
    lineage id (``LIVE_ROW_ID``: the one the file holds, else ``first_row_id``
    plus the position) and the last-updated sequence number the file holds
    (``LIVE_SEQ``, else NULL: inherited from the file).  A column the file
    lacks (added to the table later) is NULLs with ``missing_as_null``,
    else the answer is None."""
    pf = pq.ParquetFile(path)
    by_id = {int(fld.metadata[b"PARQUET:field_id"]): fld.name for fld in pf.schema_arrow
             if fld.metadata and b"PARQUET:field_id" in fld.metadata}
    if not missing_as_null and any(i not in by_id for i, _, _ in fields):
        return None
    meta = [ROW_ID_FIELD, LAST_UPDATED_FIELD] if lineage else []
    held = pf.read(columns=[by_id[i] for i in [i for i, _, _ in fields] + meta if i in by_id], use_threads=False)
    n = held.num_rows
    pos = pa.array(np.arange(n, dtype=np.int64))
    arrays = [held.column(by_id[i]).cast(t) if i in by_id else pa.nulls(n, t) for i, _, t in fields] + [pos]
    names = [name for _, name, _ in fields] + [LIVE_POS]
    if lineage:
        inherited = pa.nulls(n, pa.int64()) if first_row_id is None else pc.add(pos, first_row_id)
        arrays.append(pc.coalesce(held.column(by_id[ROW_ID_FIELD]).cast(pa.int64()), inherited)
                      if ROW_ID_FIELD in by_id else inherited)
        arrays.append(held.column(by_id[LAST_UPDATED_FIELD]).cast(pa.int64()) if LAST_UPDATED_FIELD in by_id
                      else pa.nulls(n, pa.int64()))
        names += [LIVE_ROW_ID, LIVE_SEQ]
    rows = pa.table(arrays, names=names)
    if deleted is not None and len(deleted):
        rows = rows.filter(pc.invert(pc.is_in(pos, value_set=pa.array(deleted.to_array(), type=pa.int64()))))
    return rows


def readable_here(task: dict[str, Any]) -> bool:
    """A scan task (JSON) whose data file pyarrow reads from the local file
    system and whose deletes are at most one deletion vector of that file."""
    f, deletes = task["data-file"], task.get("delete-files") or []
    return local_path(f["file-path"]) is not None and f.get("file-format") == "PARQUET" and len(deletes) <= 1 \
        and all(d.get("content") == "POSITION_DELETES" and d.get("file-format") == "PUFFIN"
                and d.get("referenced-data-file") == f["file-path"] for d in deletes)
