"""Deletion-vector blobs of the Spark target's row deltas (spark/delta.py):
the bytes the Puffin spec asks for, read back, and refused when damaged.
(The row deltas themselves run against real Spark and Iceberg in
tests/integration/test_spark_target.py.)"""
from __future__ import annotations

import struct
import zlib

import pyarrow as pa
import pytest
from pyroaring import BitMap64

from cynomys.applier.targets.spark.delta import DV_MAGIC, dv_blob, exact_key_type, read_dv


def test_a_blob_is_length_magic_portable_bitmap_and_crc() -> None:
    positions = BitMap64([0, 3, 70_000, 2**33 + 5])
    blob = dv_blob(positions)
    (length,) = struct.unpack(">I", blob[:4])
    assert length == len(blob) - 8 and blob[4:8] == DV_MAGIC
    body = blob[4:4 + length]
    assert struct.unpack(">I", blob[-4:])[0] == zlib.crc32(body)
    # The portable 64-bit layout: the number of 32-bit bitmaps (8 bytes,
    # little-endian), then each one's key (4 bytes) and bitmap.
    assert struct.unpack("<Q", body[4:12])[0] == 2 and struct.unpack("<I", body[12:16])[0] == 0
    assert read_dv(blob, "test") == positions


def test_a_damaged_blob_is_refused_by_name() -> None:
    blob = bytearray(dv_blob(BitMap64([1, 2, 3])))
    blob[-6] ^= 0xFF  # inside the bitmap: the CRC no longer holds
    with pytest.raises(ValueError, match="deletion vector f.puffin@4 is not a deletion-vector-v1 blob"):
        read_dv(bytes(blob), "f.puffin@4")
    with pytest.raises(ValueError, match="not a deletion-vector-v1 blob"):
        read_dv(b"\x00\x00\x00\x04" + b"\x00" * 8, "g")


@pytest.mark.parametrize(("t", "exact"), [
    (pa.int32(), True), (pa.int64(), True), (pa.string(), True), (pa.binary(), True), (pa.date32(), True),
    (pa.timestamp("us"), True), (pa.decimal128(20, 0), True), (pa.float64(), False), (pa.float32(), False),
])
def test_only_exact_key_types_take_the_row_delta(t: pa.DataType, exact: bool) -> None:
    assert exact_key_type(t) is exact
