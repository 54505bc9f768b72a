"""Archived binlog files ([source] binlog_files) as a source: where a
checkpoint may resume, and files missing from the archive refused."""
from __future__ import annotations

from pathlib import Path

import pytest

from cynomys.core.errors import PositionLostError, SourceConfigError
from cynomys.core.gtid import GtidSet
from cynomys.core.model import Position
from cynomys.parser import mysql8
from cynomys.parser.files import ArchiveInspector
from tests import binlog_builder as B
from tests.unit.test_mysql8_events import SID, _payload_txn


def _archive(tmp_path: Path, numbers: list[int]) -> str:
    for n in numbers:
        B.binlog_file(tmp_path / f"binlog.{n:06d}", _payload_txn(n, 100 * n, 3), next_file=f"binlog.{n + 1:06d}")
    (tmp_path / "binlog.index").write_text("not a binlog\n")
    return str(tmp_path / "binlog.*")


def test_where_a_checkpoint_may_resume(tmp_path: Path) -> None:
    ins = ArchiveInspector(_archive(tmp_path, [1, 3]))
    assert ins.resolve_start("current") == ins.earliest() == Position("binlog.000001", 4)
    assert ins.server_identity() == "server_id=1" and not ins.is_mariadb
    ins.ensure_available(Position("binlog.000003", 4))
    ins.ensure_available(Position("binlog.000004", 4))  # after the last rotation: nothing to read yet
    for lost in (Position("binlog.000002", 4), Position("binlog.000004", 900), Position("binlog.000000", 4),
                 Position("binlog.000003", 10**9)):
        with pytest.raises(PositionLostError):
            ins.ensure_available(lost)


def test_an_empty_glob_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(SourceConfigError, match="names no binlog file"):
        ArchiveInspector(str(tmp_path / "nothing.*"))


def test_tagged_gtids_read_from_the_binlog_are_in_gtid_sets() -> None:
    text = mysql8.parse_previous_gtids(B.previous_gtids_body([(SID, "", [(1, 4)]), (SID, "blue", [(1, 3)])]))
    got = GtidSet.parse_mysql(text)
    tagged = mysql8.parse_tagged_gtid(B.tagged_gtid_body(SID, "blue", 2)).gtid
    assert got.contains(tagged) and got.contains(mysql8.parse_gtid(B.gtid_body(SID, 3)).gtid)
    assert not got.contains(mysql8.parse_tagged_gtid(B.tagged_gtid_body(SID, "blue", 3)).gtid)
