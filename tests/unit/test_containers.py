"""MariaDB's compressed events (log_bin_compress) unpacked into the plain
events they stand for, from bytes built after MariaDB's layout
(log_event.cc: binlog_buf_compress, query_event_uncompress,
row_log_event_uncompress)."""
from __future__ import annotations

import os

import pytest

from cynomys.core.errors import UnsupportedEventError
from cynomys.parser import raw as R
from cynomys.parser.containers import mariadb_uncompress
from tests import binlog_builder as B


def _query(sql: str, db: str = "shop") -> tuple[bytes, int]:
    status = b"\x00\x00\x00\x00\x00" + b"\x04\x21\x00\x21\x00\x21\x00"  # FLAGS2, CHARSET
    body = B.query_body(sql, db, status)
    plain = B.event(B.QUERY, body, log_pos=4242)
    return plain, R.HEADER_LEN + 13 + len(status) + len(db) + 1


@pytest.mark.parametrize("sql", ["CREATE TABLE t (a int)", "x" * 300, "é" * 40_000, "INSERT" + "y" * 70_000])
def test_query_compressed_inflates_to_the_plain_event(sql: str) -> None:
    plain, split = _query(sql)
    packed = B.mariadb_compressed(plain, split=split)
    assert R.header(packed).type == 0xA5
    assert mariadb_uncompress(packed, 13, True) == plain


@pytest.mark.parametrize("kind,update", [(B.WRITE_V1, False), (B.UPDATE_V1, True), (B.DELETE_V1, False)])
@pytest.mark.parametrize("ncols", [1, 9, 300])
def test_rows_v1_compressed_keeps_the_head_and_inflates_the_images(kind: int, update: bool, ncols: int) -> None:
    head = B.rows_head(77, ncols, update=update)
    images = os.urandom(50) + b"\x00" * 5000
    plain = B.event(kind, head + images, log_pos=999)
    packed = B.mariadb_compressed(plain, split=R.HEADER_LEN + len(head))
    assert len(packed) < len(plain)
    assert mariadb_uncompress(packed, 8, True) == plain


def test_rows_v2_compressed_skips_the_extra_header() -> None:
    head = B.rows_head(5, 3, update=True, v2_extra=b"\x01\x02\x00\x03\x00")
    plain = B.event(B.UPDATE_V2, head + b"row images" * 20)
    packed = B.mariadb_compressed(plain, split=R.HEADER_LEN + len(head))
    assert mariadb_uncompress(packed, 10, True) == plain


@pytest.mark.parametrize("lenlen", [1, 2, 3, 4])
def test_every_length_width(lenlen: int) -> None:
    plain, split = _query("SELECT 1 " * 20)
    assert mariadb_uncompress(B.mariadb_compressed(plain, split=split, lenlen=lenlen), 13, True) == plain


def test_without_checksums() -> None:
    plain, split = _query("DROP TABLE t")
    packed = B.mariadb_compressed(plain, split=split)
    bare = R.build(R.header(packed), packed[R.HEADER_LEN:-4], checksum=False)
    assert mariadb_uncompress(bare, 13, False) == plain


def _damaged(packed: bytes, at: int, value: int) -> bytes:
    b = bytearray(packed)
    b[at] = value
    return bytes(b)


def test_damage_is_refused_loudly() -> None:
    plain, split = _query("CREATE TABLE t (a int, b varchar(20))")
    packed = B.mariadb_compressed(plain, split=split)
    cases = {
        "not a compression header": _damaged(packed, split, 0x01),
        "algorithm 1": _damaged(packed, split, 0x91),
        "length width 0": _damaged(packed, split, 0x80),
        "zlib stream corrupt": _damaged(packed, split + 4, packed[split + 4] ^ 0xFF),
        "length mismatch": _damaged(packed, split + 1, packed[split + 1] + 1),
        "ends early": packed[:split] + packed[-4:],
    }
    for what, bad in cases.items():
        with pytest.raises(UnsupportedEventError) as err:
            mariadb_uncompress(bad, 13, True, "mysql-bin.000001:4")
        assert "0xA5" in str(err.value), what
