"""The compiled binlog reader (cynomys._reader, parser/creader.py) against
the reference (mysql-replication's reader, parser/stream.py): the same
SourceEvents -- kinds, positions, GTIDs, statements, rows -- and the same
errors, on binlog files built from the servers' documented layouts
(tests/binlog_builder.py) and on the replication protocol's packets written
into a real socket pair."""
from __future__ import annotations

import socket
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from cynomys.core import compiled
from cynomys.core.config import SourceConfig
from cynomys.core.errors import CynomysError, UnsupportedEventError
from cynomys.core.model import Change, Op, Position
from cynomys.parser import creader
from cynomys.parser import raw as R
from cynomys.parser.files import FileReader, binlog_order
from cynomys.parser.kinds import Basic
from cynomys.parser.stream import BinlogSource, SourceEvent
from cynomys.parser.txn import Assembler
from tests import binlog_builder as B
from tests.unit.test_mysql8_events import COLUMNS, DOC, NAMES, SID, _partial, _payload_txn, _row, _table_map, _txn

pytestmark = pytest.mark.skipif(not compiled.reader_available(), reason="cynomys._reader is not built")


@pytest.fixture(autouse=True)
def _restore_path() -> Iterator[None]:
    was = compiled.ext is not None
    yield
    compiled.use_compiled(was)


def _read(paths: list[Path], *, use_compiled: bool, start: int = 0, stop: int = 0,
          include: list[str] | None = None) -> tuple[list[SourceEvent], BaseException | None]:
    """Every SourceEvent of the files on one path, and the error that ended the read."""
    compiled.use_compiled(use_compiled)
    files = binlog_order(paths)
    first = Position(files[0].name, start) if start else None
    source = BinlogSource(SourceConfig(include_tables=include or []), first or Position(files[0].name, 4),
                          reader=FileReader(files, first, stop))
    assert source.compiled is use_compiled
    out: list[SourceEvent] = []
    try:
        for ev in source:
            out.append(ev)
    except (CynomysError, Exception) as exc:  # compared between the paths below
        return out, exc
    finally:
        source.close()
    return out, None


def _same(paths: list[Path], **kw: Any) -> tuple[list[SourceEvent], BaseException | None]:
    c, c_err = _read(paths, use_compiled=True, **kw)
    p, p_err = _read(paths, use_compiled=False, **kw)
    assert len(c) == len(p)
    for i, (a, b) in enumerate(zip(c, p)):
        assert a == b, f"event {i} differs:\n compiled {a!r}\n python   {b!r}"
        assert [type(v) for img in a.rows for v in (img[0] or ())] == [type(v) for img in b.rows for v in (img[0] or ())]
    assert type(c_err) is type(p_err) and str(c_err) == str(p_err), (c_err, p_err)
    return c, c_err


def _file(tmp_path: Path, events: list[tuple[int, bytes]], name: str = "binlog.000001", **kw: Any) -> Path:
    path = tmp_path / name
    B.binlog_file(path, events, **kw)
    return path


def _rows(n: int, start: int = 1) -> bytes:
    return b"".join(_row(i, f"{i}.25", {"k": i, "v": [i, str(i)]}, f"note {i}") for i in range(start, start + n))


def test_mysql_transactions_read_alike(tmp_path: Path) -> None:
    events = []
    for k in range(1, 4):
        events += _txn((B.GTID, B.gtid_body(SID, k, immediate_us=k)),
                       (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(3, 10 * k))),
                       (B.UPDATE_V2, B.rows_head(90, 4, update=True, v2_extra=b"") + _row(10 * k, "1.00", None)
                        + _row(10 * k, "2.00", [1, 2], None)),
                       (B.DELETE_V2, B.rows_v2_body(90, 4, _row(10 * k + 1, "3.00", "x"))), xid=k)
    events.append((B.QUERY, B.query_body("CREATE TABLE shop.u (a int)", "shop")))
    path = tmp_path / "binlog.000001"
    starts = B.binlog_file(path, events, next_file="binlog.000002")
    evs, err = _same([path])
    assert err is None
    kinds = [e.kind for e in evs]
    assert kinds.count("WRITE_ROWS_EVENT_V2") == 3 and kinds[-1] == "ROTATE_EVENT"
    assert [e.basic for e in evs if e.kind == "QUERY_EVENT"] == [Basic.BEGIN] * 3 + [Basic.DDL]
    # Each event is placed where it is in the file (what checkpoints rely on).
    placed = [e for e in evs if e.kind not in ("ROTATE_EVENT", "FORMAT_DESCRIPTION_EVENT")]
    table_maps = {starts[2 + 7 * k] for k in range(3)}  # no SourceEvent of their own
    spans = list(zip(starts, starts[1:]))  # the last event, the ROTATE, is placed in the next file
    assert [(e.start.pos, e.end.pos) for e in placed] == [(a, b) for a, b in spans if a not in table_maps]


def test_mysql_8_event_kinds_handed_to_python_read_alike(tmp_path: Path) -> None:
    """GTIDs (tagged too), PREVIOUS_GTIDS, zstd payloads and partial JSON
    updates are read by the Python side from their bytes."""
    prev = B.previous_gtids_body([(SID, "", [(1, 4)]), (SID, "blue", [(1, 3)])])
    partial = B.rows_v2_body(90, 4, _partial(DOC, [B.json_diff(0, "$.e", "g")]), update=True)
    events = [(B.PREVIOUS_GTIDS, prev),
              *_txn((B.GTID_TAGGED, B.tagged_gtid_body(SID, "blue", 4)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(2)))),
              *_txn((B.ANONYMOUS_GTID, B.gtid_body(bytes(16), 0)), (B.PARTIAL_UPDATE, partial)),
              *_payload_txn(7, 100, 5)]
    evs, err = _same([_file(tmp_path, events, version="8.4.3")])
    assert err is None
    assert {"PREVIOUS_GTIDS_LOG_EVENT", "GTID_TAGGED_LOG_EVENT", "PARTIAL_UPDATE_ROWS_EVENT"} <= {e.kind for e in evs}
    assert sum(len(e.rows) for e in evs if e.basic is Basic.INSERT) == 2 + 5


def _mariadb_events() -> list[tuple[int, bytes]]:
    plain_q = B.event(B.QUERY, B.query_body("ALTER TABLE shop.t ADD COLUMN z int" + " " * 40, "shop"))
    split_q = R.HEADER_LEN + 13 + 0 + len(b"shop") + 1
    rows = B.event(B.WRITE_V1, B.rows_head(90, 4) + _rows(4, 50))
    split_r = R.HEADER_LEN + 8 + 1 + 1
    gtid = struct.pack("<QIB", 77, 0, 0) + b"\x00" * 6   # seq_no, domain, flags: a transaction with BEGIN
    standalone = struct.pack("<QIB", 78, 0, 1) + b"\x00" * 6
    return [(0xA3, struct.pack("<I", 0)), (0xA1, struct.pack("<I", 16) + b"binlog.000001".ljust(16, b"\x00")),
            (0xA2, gtid), (0xA0, b"INSERT INTO t VALUES ..."), (B.TABLE_MAP, _table_map()),
            (B.WRITE_V1, B.rows_head(90, 4) + _rows(2)), (0xA6, B.mariadb_compressed(rows, split=split_r)[R.HEADER_LEN:-4]),
            (B.XID, B.xid_body(5)),
            (0xA2, standalone), (0xA5, B.mariadb_compressed(plain_q, split=split_q)[R.HEADER_LEN:-4])]


def test_mariadb_events_and_compressed_events_read_alike(tmp_path: Path) -> None:
    evs, err = _same([_file(tmp_path, _mariadb_events(), version="10.11.6-MariaDB-log")])
    assert err is None
    gtids = [e for e in evs if e.kind == "GTID_EVENT"]
    assert [(g.gtid, g.standalone) for g in gtids] == [("0-1-77", False), ("0-1-78", True)]
    assert [len(e.rows) for e in evs if e.basic is Basic.INSERT] == [2, 4]
    assert [e.basic for e in evs if e.kind == "QUERY_EVENT"] == [Basic.DDL]


def test_query_status_variables_are_walked_like_the_library(tmp_path: Path) -> None:
    status = (b"\x00" + struct.pack("<I", 0) + b"\x01" + struct.pack("<Q", 0) + b"\x05\x06+00:00"
              + b"\x06\x03std" + b"\x0b\x04root\x09localhost" + b"\x0c\x02shop\x00app\x00"
              + b"\x0c\xfe" + b"\x0d\x01\x02\x03" + b"\x80\x01\x02\x03" + b"\x81" + struct.pack("<Q", 9))
    events = [(B.QUERY, B.query_body(sql, "shop", status)) for sql in
              ("BEGIN", "COMMIT", "CREATE TABLE a (x int)", "GRANT SELECT ON *.* TO u", "SAVEPOINT s",
               "/* c */ DROP TABLE a", "caf\xe9 INSERT", "ROLLBACK")]
    events.append((B.QUERY, B.query_body("DROP TABLE b", "d\xe9b")))
    evs, err = _same([_file(tmp_path, events)])
    assert err is None and [e.sql for e in evs if e.kind == "QUERY_EVENT"][2] == "CREATE TABLE a (x int)"
    # An unknown status variable: the library refuses the event, on both paths.
    evs, err = _same([_file(tmp_path, [(B.QUERY, B.query_body("BEGIN", "shop", b"\x7f\x00"))], name="binlog.000009")])
    assert err is not None


def test_unknown_and_statement_kinds_halt_alike(tmp_path: Path) -> None:
    events = [(0x05, struct.pack("<BQ", 2, 7)), (0x99, b"what is this"), (B.XID, B.xid_body(1))]
    evs, err = _same([_file(tmp_path, events)])
    assert err is None
    halts = [e for e in evs if e.basic is Basic.HALT]
    assert [e.kind for e in halts] == ["INTVAR_EVENT", "EVENT_0x99"] and all(e.why for e in halts)


def test_files_follow_each_other_and_a_file_in_use_is_read(tmp_path: Path) -> None:
    first = _file(tmp_path, _txn((B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(2)))),
                  next_file="binlog.000002")
    second = _file(tmp_path, _txn((B.GTID, B.gtid_body(SID, 2)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(3)))),
                   name="binlog.000002")
    # The server's file being written: its FORMAT_DESCRIPTION has
    # LOG_EVENT_BINLOG_IN_USE_F, set after its checksum was computed.
    raw = bytearray(second.read_bytes())
    raw[4 + R.FLAGS_OFFSET] |= R.BINLOG_IN_USE
    second.write_bytes(bytes(raw))
    evs, err = _same([first, second])
    assert err is None
    assert [e.start.file for e in evs if e.basic is Basic.INSERT] == ["binlog.000001", "binlog.000002"]
    # From inside the first file, to a stop offset in the second.
    starts = B.binlog_file(first, _txn((B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(2)))),
                           next_file="binlog.000002")
    evs, err = _same([first, second], start=starts[0], stop=len(raw) - 31)
    assert err is None and evs


def _damaged(path: Path, at: int, data: bytes) -> Path:
    raw = bytearray(path.read_bytes())
    raw[at:at + len(data)] = data
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("damage", ["crc", "log_pos", "size", "short_event", "short_header"])
def test_damaged_files_are_refused_alike(tmp_path: Path, damage: str) -> None:
    events = _txn((B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(3))))
    path = tmp_path / "binlog.000001"
    starts = B.binlog_file(path, events)
    rows_at = starts[3]
    if damage == "crc":
        _damaged(path, rows_at + 40, b"\xee")
    elif damage == "log_pos":
        _damaged(path, rows_at + 13, struct.pack("<I", 12345))
    elif damage == "size":
        _damaged(path, rows_at + 9, struct.pack("<I", 7))
    elif damage == "short_event":
        path.write_bytes(path.read_bytes()[:rows_at + 30])
    else:
        path.write_bytes(path.read_bytes()[:rows_at + 7])
    evs, err = _same([path])
    assert isinstance(err, UnsupportedEventError) and "binlog file" in str(err)
    assert [e.kind for e in evs][-1] == "QUERY_EVENT"  # what came before the damage was read


def test_an_event_larger_than_the_read_buffer(tmp_path: Path) -> None:
    big = b"".join(_row(i, "1.00", {"blob": "x" * 3000}, "n") for i in range(1000))  # ~3 MB
    evs, err = _same([_file(tmp_path, _txn((B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(90, 4, big))))])
    assert err is None and sum(len(e.rows) for e in evs) == 1000


def test_a_filtered_table_keeps_no_decoder_under_its_id(tmp_path: Path) -> None:
    """Table ids are reused after a server restart: the id of an included
    table may map an excluded one; its rows are skipped, not decoded with
    the other table's decoder (both paths)."""
    other = B.table_map_body(90, "other", "t", COLUMNS, names=NAMES, pk=(0,), signed=[True, True])
    events = (_txn((B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(1))))
              + [(B.GTID, B.gtid_body(SID, 2)), (B.QUERY, B.query_body("BEGIN", "other")), (B.TABLE_MAP, other),
                 (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(2))), (B.XID, B.xid_body(2))])
    evs, err = _same([_file(tmp_path, events)], include=["shop.*"])
    assert err is None
    assert [(e.database, len(e.rows)) for e in evs if e.basic is Basic.INSERT] == [("shop", 1)]


def test_rows_without_their_table_map_stop_the_compiled_reader(tmp_path: Path) -> None:
    """The library drops such an event; the compiled reader refuses it."""
    path = _file(tmp_path, [(B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(91, 4, _rows(1)))])
    evs, err = _read([path], use_compiled=True)
    assert isinstance(err, UnsupportedEventError) and "table id 91" in str(err)


def _assembled(path: Path) -> dict[bool, list[Any]]:
    """The Assembler's items of a binlog file, read by the compiled reader (True) and the library's (False)."""
    out = {}
    for on in (True, False):
        evs, _ = _read([path], use_compiled=on)
        asm = Assembler()
        out[on] = [x for ev in evs for x in asm.feed(ev)]
    return out


def test_changes_made_in_c_equal_the_assemblers(tmp_path: Path) -> None:
    events = _txn((B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(3))),
                  (B.UPDATE_V2, B.rows_head(90, 4, update=True, v2_extra=b"") + _row(1, "1.00", None)
                   + _row(2, "2.00", [1], None)),
                  (B.DELETE_V2, B.rows_v2_body(90, 4, _row(3, "3.00", "x"))))
    out = _assembled(_file(tmp_path, events))
    changes = [c for c in out[True] if isinstance(c, Change)]
    assert out[True] == out[False] and [c.op for c in changes] == [Op.INSERT] * 3 + [Op.UPDATE, Op.DELETE]
    assert all(type(c) is Change and c.sql is None for c in changes)
    assert changes[3].before is not None and changes[3].after is not None and changes[4].after is None


def test_a_bulk_insert_event_is_one_item_on_both_paths(tmp_path: Path) -> None:
    # An INSERT event of MANY_ROWS_MIN rows or more is one ManyRows (the
    # producer's per-row work is per event then); one row fewer, a Change
    # per row.  Both paths, the same items.
    from cynomys.core.columnar import MANY_ROWS_MIN, ManyRows

    events = _txn((B.GTID, B.gtid_body(SID, 1)), (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(MANY_ROWS_MIN))),
                  (B.WRITE_V2, B.rows_v2_body(90, 4, _rows(MANY_ROWS_MIN - 1, 100))))
    out = _assembled(_file(tmp_path, events))
    flat = {on: [(c.op, c.tid, c.txn, c.after) for x in items if isinstance(x, Change)
                 for c in (x.as_changes() if type(x) is ManyRows else [x])] for on, items in out.items()}
    assert flat[True] == flat[False] and len(flat[True]) == 2 * MANY_ROWS_MIN - 1
    for items in out.values():
        changes = [x for x in items if isinstance(x, Change)]
        assert type(changes[0]) is ManyRows and changes[0].op is Op.INSERT and changes[0].rows == MANY_ROWS_MIN
        assert [type(c) for c in changes[1:]] == [Change] * (MANY_ROWS_MIN - 1)
        assert [r[0] for r in changes[0].images] == list(range(1, MANY_ROWS_MIN + 1))


# -- the replication protocol, through a real socket pair ---------------------
def _packet(payload: bytes, seq: int) -> bytes:
    return len(payload).to_bytes(3, "little") + bytes([seq & 0xFF]) + payload


def _stream_events() -> list[bytes]:
    """What a MariaDB server sends after a dump request: a ROTATE it makes
    up (timestamp 0, log_pos 0), its FORMAT_DESCRIPTION (log_pos 0), then
    the binlog's events with their positions."""
    rotate = B.event(B.ROTATE, struct.pack("<Q", 4) + b"binlog.000001", timestamp=0)
    fde = B.fde("10.11.6-MariaDB-log")
    out, at = [rotate, fde], 256
    for kind, body in [(0xA2, struct.pack("<QIB", 5, 0, 0) + b"\x00" * 6), (B.TABLE_MAP, _table_map()),
                       (B.WRITE_V1, B.rows_head(90, 4) + _rows(3)), (B.XID, B.xid_body(1)),
                       (0x1B, b"binlog.000001")]:
        ev = B.event(kind, body)
        out.append(R.build(R.Header(1_700_000_000, kind, 1, 0, at + len(ev), 0), body))
        at += len(ev)
    return out


def _reader(sock: socket.socket, mode: str = "socket") -> Any:
    compiled.use_compiled(True)
    return creader.new_reader(sock.fileno() if mode == "socket" else sock, mode, checksums=True, seq=1,
                              start=Position("", 4), table_map={}, decoders={})


def _drain(reader: Any, source: BinlogSource | None = None) -> list[Any]:
    out: list[Any] = []
    while True:
        items = reader.read(256, 4096)
        if not items:
            return out
        out.extend(items)
        if type(items[-1]) is tuple:
            return out


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("mode", ["socket", "socket_py"])
def test_packets_framed_and_events_placed(pair: tuple[socket.socket, socket.socket], mode: str) -> None:
    ours, server = pair
    reader = _reader(ours, mode)
    events = _stream_events()
    wire = b"".join(_packet(b"\x00" + ev, seq) for seq, ev in enumerate(events, start=1))
    server.sendall(wire + _packet(b"\xfe\x00\x00\x02\x00", len(events) + 1))
    items = _drain(reader)
    rotate = items[0]
    assert isinstance(rotate, SourceEvent) and rotate.basic is Basic.ROTATE
    assert rotate.start == rotate.end == Position("binlog.000001", 4) and reader.file == "binlog.000001"
    handoff = items[1]
    assert handoff[0] == "handoff" and handoff[1] == R.FORMAT_DESCRIPTION and handoff[3] == Position("binlog.000001", 4)
    # The rest after the FORMAT_DESCRIPTION (the batch stopped after the handoff).
    reader.post_header = bytes(B.fde()[R.HEADER_LEN + 57:-5])
    rest = _drain(reader)
    assert rest[0].kind == "GTID_EVENT" and rest[0].gtid == "0-1-5" and rest[0].start == Position("binlog.000001", 256)
    assert rest[1][0] == "handoff" and rest[1][1] == B.TABLE_MAP  # a body seen for the first time
    # What the Python side does with it (creader.table_entry), here for a
    # table filtered out: its rows are skipped.
    body = rest[1][2][R.HEADER_LEN:-R.CHECKSUM_LEN]
    reader.remember(body, (True, "shop", "t", None, None, None, 0, None, None))
    more = _drain(reader)
    assert [getattr(x, "kind", x) for x in more] == ["XID_EVENT", "HEARTBEAT_LOG_EVENT", ("eof",)]


def test_a_message_of_16_mib_and_more_is_joined(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, server = pair
    reader = _reader(ours)
    sql = "/* " + "x" * (17 << 20) + " */ CREATE TABLE t (a int)"
    ev = R.build(R.Header(1, B.QUERY, 1, 0, 4 + R.HEADER_LEN + 13 + 5 + len(sql) + 4, 0), B.query_body(sql, "shop"))
    payload = b"\x00" + ev
    first, second = payload[:0xFFFFFF], payload[0xFFFFFF:]
    wire = _packet(first, 1) + _packet(second, 2) + _packet(b"\xfe\x00\x00\x02\x00", 3)
    threading.Thread(target=server.sendall, args=(wire,), daemon=True).start()
    items = _drain(reader)
    assert items[0].basic is Basic.DDL and items[0].sql == sql and items[-1] == ("eof",)


def test_server_errors_lost_connections_and_damage(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, server = pair
    reader = _reader(ours)
    err = b"\xff" + struct.pack("<H", 1236) + b"#HY000Could not find first log file name in binary log index file"
    server.sendall(_packet(b"\x00" + _stream_events()[0], 1) + _packet(err, 2))
    items = _drain(reader)
    assert items[0].basic is Basic.ROTATE and items[1] == ("server_error", err)
    a, b = socket.socketpair()
    with a, b:
        reader = _reader(a)
        bad = bytearray(_stream_events()[0])
        bad[-1] ^= 0xFF
        b.sendall(_packet(b"\x00" + bytes(bad), 1))
        assert _drain(reader) == [("error", "crc", 0, 0)]
    a, b = socket.socketpair()
    with a, b:
        reader = _reader(a)
        b.sendall(_packet(b"\x00" + _stream_events()[0], 2))  # sequence id 2 where 1 is due
        assert _drain(reader) == [("error", "seq", 2, 0)]
    a, b = socket.socketpair()
    with a:
        reader = _reader(a)
        b.sendall(_packet(b"\x00" + _stream_events()[0], 1) + b"\x30\x00")  # then the server goes away
        b.close()
        items = _drain(reader)
        assert items[0].basic is Basic.ROTATE and items[1] == ("error", "lost", 0, 0)


def test_close_wakes_a_blocked_read(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, _ = pair
    reader = _reader(ours)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(reader.read(256, 4096)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive()
    reader.close()
    t.join(5)
    assert not t.is_alive() and got == [[]]


def test_crc32_is_zlibs() -> None:
    mod = compiled._reader_loaded
    assert mod is not None
    for data in (b"", b"a", bytes(range(256)) * 33 + b"tail", b"\x00" * 1000):
        assert mod.crc32(data) == zlib.crc32(data)
