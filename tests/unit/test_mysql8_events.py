"""MySQL 8.0-9.x binlog formats, from event bytes the tests build after
MySQL's documented layouts (tests/binlog_builder.py), read through the
producer's own file path (parser/files.py -> BinlogSource -> Assembler):
GTID events with their 8.0 fields, tagged GTIDs, PREVIOUS_GTIDS forms,
zstd TRANSACTION_PAYLOADs, binary JSON with exact DECIMALs, PARTIAL_UPDATE_ROWS
with JSON diffs, invisible columns."""
from __future__ import annotations

import decimal
import json
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest

from cynomys.cli.decode import decode
from cynomys.core.errors import UnsupportedEventError
from cynomys.core.model import Change, Op
from cynomys.parser import mysql8
from cynomys.parser.stream import BinlogSource
from cynomys.parser.txn import Commit
from tests import binlog_builder as B

SID = uuid.UUID("3e11fa47-71ca-11e1-9e33-c80aa9429562").bytes
SID2 = uuid.UUID("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee").bytes
# t (id INT PRIMARY KEY, price DECIMAL(12,2), doc JSON, note VARCHAR(40)) utf8mb4
COLUMNS = [(B.T_LONG, b""), (B.T_NEWDECIMAL, bytes([12, 2])), (B.T_JSON, b"\x04"), (B.T_VARCHAR, struct.pack("<H", 160))]
NAMES = ["id", "price", "doc", "note"]


def _dec(text: str, precision: int = 12, scale: int = 2) -> bytes:
    return B.decimal_bin(decimal.Decimal(text), precision, scale)


def _row(i: int, price: str, doc: Any, note: str | None = "n") -> bytes:
    jb = B.json_binary(doc)
    return B.image([struct.pack("<i", i), _dec(price), struct.pack("<I", len(jb)) + jb,
                    None if note is None else bytes([len(note.encode())]) + note.encode()])


def _table_map(table_id: int = 90, **kw: Any) -> bytes:
    return B.table_map_body(table_id, "shop", "t", COLUMNS, names=NAMES, pk=(0,), signed=[True, True], **kw)


def _items(tmp_path: Path, events: list[tuple[int, bytes]], name: str = "binlog.000001", **kw: Any) -> list[Any]:
    path = tmp_path / name
    B.binlog_file(path, events, **kw)
    return list(decode([str(path)]))


def _changes(items: list[Any]) -> list[Change]:
    return [x for x in items if isinstance(x, Change)]


def _txn(gtid_event: tuple[int, bytes], *rows: tuple[int, bytes], xid: int = 1) -> list[tuple[int, bytes]]:
    return [gtid_event, (B.QUERY, B.query_body("BEGIN", "shop")), (B.TABLE_MAP, _table_map()), *rows,
            (B.XID, B.xid_body(xid))]


def test_gtid_events_with_their_8_0_fields(tmp_path: Path) -> None:
    gtid = B.gtid_body(SID, 42, last_committed=7, sequence_number=8, immediate_us=1_700_000_000_123_456,
                       original_us=1_699_999_999_000_001, transaction_length=777, server_version=80036,
                       original_version=50744, ticket=9)
    info = mysql8.parse_gtid(gtid)
    assert info == mysql8.Gtid("3e11fa47-71ca-11e1-9e33-c80aa9429562:42", 1, 7, 8, 1_700_000_000_123_456,
                               1_699_999_999_000_001, 777, 80036, 50744, 9)
    # Without the optional parts: originals equal the immediate ones.
    plain = mysql8.parse_gtid(B.gtid_body(SID, 3, immediate_us=5, transaction_length=300))
    assert (plain.original_commit_us, plain.original_server_version, plain.commit_group_ticket) == (5, 80036, 0)
    items = _items(tmp_path, _txn((B.GTID, gtid), (B.WRITE_V2, B.rows_v2_body(90, 4, _row(1, "9.99", {"a": 1})))))
    (c,) = _changes(items)
    assert c.tid == "3e11fa47-71ca-11e1-9e33-c80aa9429562:42" and c.op is Op.INSERT
    assert c.after == (1, decimal.Decimal("9.99"), '{"a": 1}', "n")
    assert c.schema is not None and c.schema.key == ("id",)
    commit = [x for x in items if isinstance(x, Commit)][0]
    assert commit.gtid == c.tid


def test_anonymous_gtid_transactions_have_a_position_as_id(tmp_path: Path) -> None:
    items = _items(tmp_path, _txn((B.ANONYMOUS_GTID, B.gtid_body(bytes(16), 0)),
                                  (B.WRITE_V2, B.rows_v2_body(90, 4, _row(1, "1.00", [])))))
    (c,) = _changes(items)
    assert c.tid == f"binlog.000001:{c.txn.pos}"


@pytest.mark.parametrize("gno", [1, 127, 128, 65535, 2**40 + 3, 2**62])
def test_tagged_gtids(tmp_path: Path, gno: int) -> None:
    body = B.tagged_gtid_body(SID, "orders_2", gno, immediate_us=1_700_000_000_000_001, original_us=17,
                              transaction_length=4096, server_version=80400, last_committed=-1 + gno % 3,
                              sequence_number=gno)
    info = mysql8.parse_tagged_gtid(body)
    assert info.gtid == f"3e11fa47-71ca-11e1-9e33-c80aa9429562:orders_2:{gno}"
    assert (info.immediate_commit_us, info.original_commit_us, info.transaction_length,
            info.immediate_server_version, info.sequence_number) == (1_700_000_000_000_001, 17, 4096, 80400, gno)
    items = _items(tmp_path, _txn((B.GTID_TAGGED, body), (B.WRITE_V2, B.rows_v2_body(90, 4, _row(2, "0.50", None)))),
                   version="8.4.3")
    (c,) = _changes(items)
    assert c.tid == info.gtid and c.after is not None and c.after[2] == "null"


def test_varints_of_the_serialization_format() -> None:
    # The examples of MySQL's serialization readme (bytes as on the wire).
    assert mysql8.varint(bytes([0xFB, 0xFF, 0x07]), 0) == (65535, 3)
    assert mysql8.svarint(bytes([0xF3, 0xFF, 0x0F]), 0) == (65535, 3)
    assert mysql8.svarint(bytes([0xEB, 0xFF, 0x0F]), 0) == (-65535, 3)
    assert mysql8.svarint(bytes([0xFB, 0xFF, 0x0F]), 0) == (-65536, 3)
    for n in (0, 1, 127, 128, 255, 2**20, 2**56 - 1, 2**63 + 5, 2**64 - 1):
        assert mysql8.varint(B.varint(n), 0) == (n, len(B.varint(n)))


def test_previous_gtids_untagged_and_tagged(tmp_path: Path) -> None:
    untagged = B.previous_gtids_body([(SID, "", [(1, 6), (7, 10)]), (SID2, "", [(3, 4)])])
    assert mysql8.parse_previous_gtids(untagged) == (
        "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7-9,aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee:3")
    tagged = B.previous_gtids_body([(SID, "", [(1, 101)]), (SID, "blue", [(1, 3)])])
    assert mysql8.parse_previous_gtids(tagged) == (
        "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100,3e11fa47-71ca-11e1-9e33-c80aa9429562:blue:1-2")
    # Read in a file: information only, and the stream goes on.
    path = tmp_path / "binlog.000007"
    B.binlog_file(path, [(B.PREVIOUS_GTIDS, tagged), *_txn((B.GTID, B.gtid_body(SID, 101)),
                                                          (B.WRITE_V2, B.rows_v2_body(90, 4, _row(3, "3", 1))))],
                  version="8.4.0")
    events = list(BinlogSource(_cfg(), _start(path), reader=_reader(path)))
    prev = [e for e in events if e.kind == "PREVIOUS_GTIDS_LOG_EVENT"]
    assert prev[0].detail.endswith(":blue:1-2")
    with pytest.raises(UnsupportedEventError):
        mysql8.parse_previous_gtids(tagged[:-5])


def _cfg() -> Any:
    from cynomys.core.config import SourceConfig

    return SourceConfig()


def _start(path: Path) -> Any:
    from cynomys.core.model import Position

    return Position(path.name, 4)


def _reader(path: Path) -> Any:
    from cynomys.parser.files import FileReader

    return FileReader([path])


def _payload_txn(gno: int, first_id: int, rows: int, per_event: int = 250) -> list[tuple[int, bytes]]:
    """A GTID event, then one TRANSACTION_PAYLOAD (zstd) holding BEGIN,
    the TABLE_MAP, WRITE_ROWS events of ``per_event`` rows, an UPDATE, a
    DELETE and the XID -- as MySQL writes with binlog_transaction_compression."""
    inner = [B.bare(B.QUERY, B.query_body("BEGIN", "shop")), B.bare(B.TABLE_MAP, _table_map())]
    for start in range(first_id, first_id + rows, per_event):
        images = b"".join(_row(i, f"{i}.25", {"i": i, "tags": ["x", i]}) for i in range(start, min(start + per_event,
                                                                                                   first_id + rows)))
        inner.append(B.bare(B.WRITE_V2, B.rows_v2_body(90, 4, images)))
    inner.append(B.bare(B.UPDATE_V2, B.rows_v2_body(90, 4, _row(first_id, "1", {}) + _row(first_id, "2", {"u": 1}),
                                                    update=True)))
    inner.append(B.bare(B.DELETE_V2, B.rows_v2_body(90, 4, _row(first_id + 1, f"{first_id + 1}.25",
                                                                {"i": first_id + 1, "tags": ["x", first_id + 1]}))))
    inner.append(B.bare(B.XID, B.xid_body(gno)))
    return [(B.GTID, B.gtid_body(SID, gno)), (B.PAYLOAD, B.payload_body(inner))]


def test_zstd_transaction_payloads_hold_many_transactions_worth_of_rows(tmp_path: Path) -> None:
    events = _payload_txn(1, 0, 5000) + _payload_txn(2, 10_000, 3) + _payload_txn(3, 20_000, 1200, per_event=7)
    path = tmp_path / "binlog.000002"
    starts = B.binlog_file(path, events)
    items = list(decode([str(path)]))
    changes = _changes(items)
    commits = [x for x in items if isinstance(x, Commit)]
    assert [len([c for c in changes if c.tid.endswith(f":{g}")]) for g in (1, 2, 3)] == [5002, 5, 1202]
    inserts = [c for c in changes if c.op is Op.INSERT and c.tid.endswith(":1")]
    assert inserts[4999].after == (4999, decimal.Decimal("4999.25"), '{"i": 4999, "tags": ["x", 4999]}', "n")
    # Positions stay on the outer events: a transaction begins at its GTID
    # event and ends where its payload ends.
    for k, commit in enumerate(commits):
        gtid_at, payload_at = starts[2 * k], starts[2 * k + 1]
        assert commit.begin.pos == gtid_at
        end = starts[2 * k + 2] if 2 * k + 2 < len(starts) else path.stat().st_size
        assert commit.end.pos == end and payload_at < end
        assert all(c.txn.pos == gtid_at for c in changes if c.tid == commit.gtid)
    assert len(path.read_bytes()) < 5000 * 40, "the payload was not compressed"


def test_damaged_payloads_are_refused(tmp_path: Path) -> None:
    _, (kind, body) = _payload_txn(1, 0, 10)
    for bad in (body[:-3], body[:3] + b"\x05" + body[4:], body.replace(b"\x00", b"\x01", 1)):
        with pytest.raises(UnsupportedEventError):
            mysql8.payload_events(bad, "binlog.000001:4")


def test_json_in_row_images_keeps_decimals_exact(tmp_path: Path) -> None:
    doc = {"price": decimal.Decimal("12345678901234567890.123456789"), "neg": decimal.Decimal("-0.000001"),
           "n": [1, 2.5, -70000, "s\u00e9", None, True, False], "nested": {"k": {"deeper": decimal.Decimal("1.50")}}}
    items = _items(tmp_path, _txn((B.GTID, B.gtid_body(SID, 5)), (B.WRITE_V2, B.rows_v2_body(90, 4, _row(1, "2", doc)))))
    text = _changes(items)[0].after[2]  # type: ignore[index]
    assert text == ('{"n": [1, 2.5, -70000, "s\u00e9", null, true, false], "neg": -0.000001, "price": '
                    '12345678901234567890.123456789, "nested": {"k": {"deeper": 1.50}}}')
    assert json.loads(text, parse_float=decimal.Decimal)["price"] == decimal.Decimal("12345678901234567890.123456789")


def _partial(before: Any, diffs: list[bytes], *, note: str = "n") -> bytes:
    """One PARTIAL_UPDATE_ROWS row: the before image, value options 1
    (PARTIAL_JSON_UPDATES), the partial bitmap (doc is the one JSON column),
    then the after image whose doc is a diff vector."""
    bi = _row(1, "1.00", before)
    after = B.image([struct.pack("<i", 1), _dec("1.00"), B.diff_vector(diffs), bytes([len(note)]) + note.encode()])
    return bi + b"\x01" + b"\x01" + after


DOC = {"a": {"b": [1, 2, {"c": "x"}], "d": decimal.Decimal("0.10")}, "e": "f", "key with space": 1}


@pytest.mark.parametrize("diffs,expected", [
    ([B.json_diff(0, "$.a.b[2].c", "y")], {"a": {"b": [1, 2, {"c": "y"}], "d": decimal.Decimal("0.10")}}),
    ([B.json_diff(1, "$.a.b[1]", decimal.Decimal("9.90"))], {"a": {"b": [1, decimal.Decimal("9.90"), 2, {"c": "x"}],
                                                                  "d": decimal.Decimal("0.10")}}),
    ([B.json_diff(1, "$.a.new", {"z": [True]})], {"a": {"b": [1, 2, {"c": "x"}], "d": decimal.Decimal("0.10"),
                                                        "new": {"z": [True]}}}),
    ([B.json_diff(2, "$.a.b[0]")], {"a": {"b": [2, {"c": "x"}], "d": decimal.Decimal("0.10")}}),
    ([B.json_diff(2, '$."key with space"'), B.json_diff(0, "$.e", None), B.json_diff(1, "$.a.b[last]", 0)],
     {"a": {"b": [1, 2, 0, {"c": "x"}], "d": decimal.Decimal("0.10")}, "e": None, "key with space": None}),
    ([B.json_diff(1, "$.a.b[99]", "end")], {"a": {"b": [1, 2, {"c": "x"}, "end"], "d": decimal.Decimal("0.10")}}),
], ids=["replace", "insert-array", "insert-member", "remove", "several", "insert-past-end"])
def test_partial_json_updates_give_the_full_after_image(tmp_path: Path, diffs: list[bytes], expected: Any) -> None:
    from cynomys.parser.mysqljson import dumps

    want = {**DOC, **expected}
    want = {k: v for k, v in want.items() if v is not None or k == "e"}  # None: removed ("e" is JSON null)
    items = _items(tmp_path, _txn((B.GTID, B.gtid_body(SID, 9)),
                                  (B.PARTIAL_UPDATE, B.rows_v2_body(90, 4, _partial(DOC, diffs), update=True))))
    (c,) = _changes(items)
    assert c.op is Op.UPDATE and c.before is not None and c.after is not None
    assert c.before[2] == dumps(DOC)
    assert c.after[2] == dumps(want)
    assert c.after[:2] == (1, decimal.Decimal("1.00")) and c.after[3] == "n"


@pytest.mark.parametrize("diff", [B.json_diff(0, "$.missing", 1), B.json_diff(1, "$.e", 2),
                                  B.json_diff(2, "$.a.b[7]"), B.json_diff(0, "$.a.b.c", 1),
                                  B.json_diff(1, "$.nope.x", 1), B.json_diff(0, "$", 1)])
def test_a_diff_that_does_not_apply_stops_naming_table_column_and_position(tmp_path: Path, diff: bytes) -> None:
    with pytest.raises(UnsupportedEventError) as err:
        _items(tmp_path, _txn((B.GTID, B.gtid_body(SID, 9)),
                              (B.PARTIAL_UPDATE, B.rows_v2_body(90, 4, _partial(DOC, [diff]), update=True))))
    text = str(err.value)
    assert "'doc'" in text and "shop.t" in text and "binlog.000001:" in text


def test_partial_rows_without_diffs_and_with_full_values(tmp_path: Path) -> None:
    # Value options 0: a plain after image inside a PARTIAL_UPDATE_ROWS event.
    row = _row(1, "1.00", {"a": 1}) + b"\x00" + _row(1, "2.00", {"a": 2}, note="m")
    items = _items(tmp_path, _txn((B.GTID, B.gtid_body(SID, 9)),
                                  (B.PARTIAL_UPDATE, B.rows_v2_body(90, 4, row, update=True))))
    (c,) = _changes(items)
    assert c.after == (1, decimal.Decimal("2.00"), '{"a": 2}', "m")


def test_invisible_columns_travel_like_the_others(tmp_path: Path) -> None:
    tm = B.table_map_body(91, "shop", "inv", [(B.T_LONG, b""), (B.T_LONG, b"")], names=["id", "hidden"], pk=(0,),
                          signed=[True, True], visibility=[True, False])
    events = [(B.GTID, B.gtid_body(SID, 1)), (B.QUERY, B.query_body("BEGIN", "shop")), (B.TABLE_MAP, tm),
              (B.WRITE_V2, B.rows_v2_body(91, 2, B.image([struct.pack("<i", 1), struct.pack("<i", 77)]))),
              (B.XID, B.xid_body(1))]
    (c,) = _changes(_items(tmp_path, events, version="8.0.36"))
    assert c.schema is not None and c.schema.column_names == ("id", "hidden") and c.after == (1, 77)


def test_vector_columns_of_mysql_9(tmp_path: Path) -> None:
    """VECTOR (type 242, metadata: the length's size) with its dimensions in
    optional metadata VECTOR_DIMENSIONALITY (13); an optional metadata kind
    of a later server (14) is passed over."""
    dims = B.lenenc(3)
    tm = B.table_map_body(92, "ai", "emb", [(B.T_LONG, b""), (B.T_VECTOR, b"\x04"), (B.T_VARCHAR, struct.pack("<H", 80))],
                          names=["id", "v", "label"], pk=(0,), signed=[True],
                          extra_tlv=bytes([13]) + B.lenenc(len(dims)) + dims + bytes([14, 2, 0xAB, 0xCD]))
    vec = struct.pack("<3f", 0.5, -1.25, 3e-7)
    row = B.image([struct.pack("<i", 7), struct.pack("<I", len(vec)) + vec, bytes([len("caf\u00e9".encode())])
                   + "caf\u00e9".encode()])
    events = [(B.GTID, B.gtid_body(SID, 1)), (B.QUERY, B.query_body("BEGIN", "ai")), (B.TABLE_MAP, tm),
              (B.WRITE_V2, B.rows_v2_body(92, 3, row)), (B.XID, B.xid_body(1))]
    (c,) = _changes(_items(tmp_path, events, version="9.1.0"))
    assert c.schema is not None
    # VECTOR(3) travels as its 12 bytes (core/sourcetypes.py vector_type), as the DDL parser reads it too
    assert [col.type for col in c.schema.columns] == ["int", "varbinary(12)", "varchar(20)"]
    assert c.after == (7, vec, "caf\u00e9")
