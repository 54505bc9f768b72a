"""Compiled and pure-Python hot paths give the same rows and the same Avro
bytes, on the every-type corpus and on a random workload (real MariaDB);
the compiled binlog reader gives mysql-replication's SourceEvents, live and
from files, plain and compressed, and the producer ships byte-identical
envelopes on both paths.

CI also runs the whole suite twice: as is (compiled) and with
``CYNOMYS_PURE_PYTHON=1`` (pure Python)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from cynomys.core import compiled
from cynomys.core.config import SourceConfig, load_config
from cynomys.core.model import Batch, Change, Position, Row
from cynomys.parser.files import FileReader
from cynomys.parser.kinds import Basic
from cynomys.parser.stream import BinlogSource, SourceEvent
from cynomys.parser.txn import Assembler, Commit
from cynomys.producer import Producer
from cynomys.reducer.fold import Folder
from cynomys.schemas import codec
from tests.helpers import ListSink, write_config
from tests.integration import test_producer
from tests.integration.test_producer import ALL_TYPES, ROWS
from tests.servers.mariadb import REPL_PASSWORD, REPL_USER, MariaDBServer

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")]


@pytest.fixture(params=["compiled", "pure"])
def hot_path(request: pytest.FixtureRequest) -> Iterator[str]:
    was = compiled.ext is not None
    compiled.use_compiled(request.param == "compiled")
    try:
        yield request.param
    finally:
        compiled.use_compiled(was)


def test_every_mysql_type_round_trips_exactly_on_both_paths(hot_path: str, mariadb: MariaDBServer,
                                                            tmp_path: Path) -> None:
    assert (compiled.status()["hot_path"] == "compiled") == (hot_path == "compiled")
    test_producer.test_every_mysql_type_round_trips_exactly(mariadb, tmp_path)


def _read(server: MariaDBServer, db: str, start: Position, end: Position, *, use_compiled: bool,
          batch_rows: int = 50) -> tuple[list[tuple[Row, Row | None]], list[bytes]]:
    """Every row image between start and end, and the Avro batches the
    producer's steps (assemble, fold, encode) make of them."""
    compiled.use_compiled(use_compiled)
    cfg = SourceConfig(host="127.0.0.1", port=server.port, user=REPL_USER, password=REPL_PASSWORD,
                       include_tables=[f"{db}.*"])
    src = BinlogSource(cfg, start, blocking=False, is_mariadb=True)
    asm, folder = Assembler(), Folder()
    rows: list[tuple[Row, Row | None]] = []
    batches: list[bytes] = []
    try:
        for ev in src:
            if ev.end.file == end.file and ev.end.pos > end.pos:
                break
            rows.extend(ev.rows)
            for item in asm.feed(ev):
                if isinstance(item, Change):
                    folder.add(item)
                elif isinstance(item, Commit) and len(folder) >= batch_rows:
                    batches.append(codec.encode(Batch("p", tuple(folder.changes()), item.end, True, None, 1, 2)))
                    folder = Folder()
    finally:
        src.close()
    if len(folder):
        batches.append(codec.encode(Batch("p", tuple(folder.changes()), end, True, None, 1, 2)))
    return rows, batches


def _typed(rows: list[tuple[Row, Row | None]]) -> list[object]:
    return [tuple(None if img is None else tuple((type(v), v) for v in img) for img in pair) for pair in rows]


def _same_on_both_paths(server: MariaDBServer, db: str, start: Position, expect_rows: int) -> None:
    end = Position(*server.execute("SHOW MASTER STATUS")[0][:2])
    was = compiled.ext is not None
    try:
        before = dict(compiled.fallbacks)
        c_rows, c_batches = _read(server, db, start, end, use_compiled=True)
        assert compiled.fallbacks == before, "the compiled path handed work back to the pure one"
        p_rows, p_batches = _read(server, db, start, end, use_compiled=False)
    finally:
        compiled.use_compiled(was)
    assert len(c_rows) == len(p_rows) >= expect_rows
    assert _typed(c_rows) == _typed(p_rows)
    assert len(c_batches) == len(p_batches) > 0
    for i, (c, p) in enumerate(zip(c_batches, p_batches)):
        assert c == p, f"batch {i}: compiled and pure Avro bytes differ"


def test_every_type_corpus_same_rows_and_avro_bytes(mariadb: MariaDBServer) -> None:
    db = "ctypes_" + uuid.uuid4().hex[:8]
    start = Position(*mariadb.execute("SHOW MASTER STATUS")[0][:2])
    cols = ", ".join(f"`{n}` {t}" for n, t in ALL_TYPES)
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t ({cols}) DEFAULT CHARSET=utf8mb4")
    mariadb.execute("SET SESSION sql_mode=''", "SET SESSION time_zone='+00:00'",
                    *[f"INSERT INTO {db}.t VALUES {r}" for r in ROWS],
                    f"UPDATE {db}.t SET id = id + 10",  # key change: delete + insert after folding
                    f"DELETE FROM {db}.t WHERE id = 11")
    _same_on_both_paths(mariadb, db, start, len(ROWS) * 2 + 1)


# A random workload over the types, with edge values mixed in.
RANDOM_TYPES = [
    ("ti", "tinyint", lambda r: str(r.randint(-128, 127))),
    ("miu", "mediumint unsigned", lambda r: str(r.randint(0, 16777215))),
    ("bi", "bigint", lambda r: str(r.randint(-2**63, 2**63 - 1))),
    ("biu", "bigint unsigned", lambda r: str(r.choice([r.randint(0, 2**64 - 1), 2**64 - 1, 0]))),
    ("d", "decimal(15,2)", lambda r: f"{r.randint(-10**13, 10**13) / 100:.2f}"),
    ("d65", "decimal(65,30)", lambda r: f"'{r.choice('-+')}{r.randint(0, 10**35)}.{r.randint(0, 10**30):030d}'"),
    ("d9", "decimal(9,9)", lambda r: f"'0.{r.randint(0, 10**9 - 1):09d}'"),
    ("f", "float", lambda r: repr(r.uniform(-1e30, 1e30))),
    ("db", "double", lambda r: repr(r.uniform(-1e300, 1e300))),
    ("b", "bit(13)", lambda r: f"b'{r.getrandbits(13):b}'"),
    ("dt", "date", lambda r: r.choice(["'0000-00-00'", "'2020-00-00'", f"'{r.randint(1000, 9999)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}'"])),
    ("dtm", "datetime(3)", lambda r: r.choice(["'0000-00-00 00:00:00'", f"'{r.randint(1000, 9999)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} {r.randint(0, 23)}:{r.randint(0, 59)}:{r.randint(0, 59)}.{r.randint(0, 999):03d}'"])),
    ("ts", "timestamp(1) NULL", lambda r: r.choice(["'0000-00-00 00:00:00'", f"FROM_UNIXTIME({r.randint(1, 2**31 - 1)}.{r.randint(0, 9)})"])),
    ("tm", "time(4)", lambda r: f"'{r.choice('-+')}{r.randint(0, 838)}:{r.randint(0, 59)}:{r.randint(0, 59)}.{r.randint(0, 9999):04d}'"),
    ("tm0", "time", lambda r: f"'{r.choice('-+')}{r.randint(0, 838)}:{r.randint(0, 59)}:{r.randint(0, 59)}'"),
    ("yr", "year", lambda r: r.choice(["0", str(r.randint(1901, 2155))])),
    ("c", "char(5)", lambda r: "'" + "".join(r.choice("ab\u00e9\U0001F600") for _ in range(r.randint(0, 5))) + "'"),
    ("vc", "varchar(300)", lambda r: "'" + "".join(r.choice("xyz\u00e9 ") for _ in range(r.randint(0, 300))) + "'"),
    ("lat", "varchar(10) CHARACTER SET latin1", lambda r: r.choice(["'caf\u00e9'", "''", "'abc'"])),
    ("bn", "binary(3)", lambda r: "X'" + bytes(r.choice([0, 0x41, 0xFF]) for _ in range(r.randint(0, 3))).hex() + "'"),
    ("vb", "varbinary(20)", lambda r: "X'" + bytes(r.getrandbits(8) for _ in range(r.randint(0, 20))).hex() + "'"),
    ("bl", "mediumblob", lambda r: "X'" + bytes(r.getrandbits(8) for _ in range(r.randint(0, 300))).hex() + "'"),
    ("tx", "text", lambda r: "'" + "w" * r.randint(0, 400) + "'"),
    ("en", "enum('a','b','c d')", lambda r: r.choice(["'a'", "'b'", "'c d'", "''"])),
    ("st", "set('x','y','z')", lambda r: r.choice(["''", "'x'", "'x,z'", "'x,y,z'"])),
    ("js", "json", lambda r: r.choice(["'[]'", "'{\"a\": 1}'", f"'[{r.random()}, \"s\"]'"])),
]


def _literal(rng: random.Random, make) -> str:  # type: ignore[no-untyped-def]
    return "NULL" if rng.random() < 0.1 else make(rng)


def test_random_workload_same_rows_and_avro_bytes(mariadb: MariaDBServer) -> None:
    rng = random.Random(12)
    db = "crand_" + uuid.uuid4().hex[:8]
    start = Position(*mariadb.execute("SHOW MASTER STATUS")[0][:2])
    cols = ", ".join(f"`{n}` {t}" for n, t, _ in RANDOM_TYPES)
    mariadb.execute(f"CREATE DATABASE {db}",
                    f"CREATE TABLE {db}.t (id int NOT NULL PRIMARY KEY, {cols}) DEFAULT CHARSET=utf8mb4",
                    f"CREATE TABLE {db}.nokey (a int, b varchar(10))")
    stmts = ["SET SESSION sql_mode=''", "SET SESSION time_zone='+00:00'"]
    ids: list[int] = []
    for n in range(600):
        what = rng.random()
        if what < 0.5 or not ids:
            rows = []
            for _ in range(rng.randint(1, 5)):
                ids.append(len(ids) * 7 + 1)
                rows.append(f"({ids[-1]}, " + ", ".join(_literal(rng, m) for _, _, m in RANDOM_TYPES) + ")")
            stmts.append(f"INSERT INTO {db}.t VALUES " + ", ".join(rows))
        elif what < 0.8:
            name, _, make = rng.choice(RANDOM_TYPES)
            stmts.append(f"UPDATE {db}.t SET `{name}` = {_literal(rng, make)} WHERE id = {rng.choice(ids)}")
        elif what < 0.9:
            stmts.append(f"DELETE FROM {db}.t WHERE id = {rng.choice(ids)}")
        else:
            stmts.append(f"INSERT INTO {db}.nokey VALUES ({rng.randint(0, 3)}, 'v{n}')")
    mariadb.execute(*stmts)
    _same_on_both_paths(mariadb, db, start, 600)


# -- the compiled reader (cynomys._reader) against mysql-replication's ----------
def _events(cfg: SourceConfig, start: Position, *, use_compiled: bool, reader: Any = None) -> list[SourceEvent]:
    """Every SourceEvent from ``start`` to the binlog's end (non-blocking
    dump, or the files' end) on one path."""
    compiled.use_compiled(use_compiled)
    src = BinlogSource(cfg, start, blocking=False, is_mariadb=True, reader=reader)
    assert src.compiled is use_compiled
    try:
        return list(src)
    finally:
        src.close()


def _assert_same_events(c: list[SourceEvent], p: list[SourceEvent]) -> None:
    assert len(c) == len(p) > 0
    for i, (a, b) in enumerate(zip(c, p)):
        assert a == b, f"event {i}: compiled {a!r}\n         python   {b!r}"
        assert _typed(a.rows) == _typed(b.rows)


@pytest.fixture(scope="module")
def both_servers() -> Iterator[dict[str, MariaDBServer]]:
    """A plain server and one compressing every event (log_bin_compress),
    each with the same statements in its binlog."""
    from tests.integration.test_compressed_binlog import _statements

    servers = {"plain": MariaDBServer(server_id=3).start(), "compressed": MariaDBServer(server_id=3, binlog_compress=True).start()}
    try:
        for srv in servers.values():
            srv.execute("SET SESSION sql_mode=''", *_statements(),
                        "CREATE TABLE z.wide (id int primary key, t longtext, b longblob)",
                        "INSERT INTO z.wide VALUES (1, REPEAT('t', 3000000), REPEAT(X'00ff', 800000))",
                        "UPDATE z.wide SET t = CONCAT(t, 'x')", "FLUSH BINARY LOGS",
                        "INSERT INTO z.wide VALUES (2, 'after the rotation', NULL)")
        yield servers
    finally:
        for srv in servers.values():
            srv.destroy()


@pytest.mark.parametrize("kind", ["plain", "compressed"])
def test_compiled_reader_gives_the_librarys_source_events_live_and_from_files(
        both_servers: dict[str, MariaDBServer], kind: str, tmp_path: Path) -> None:
    srv = both_servers[kind]
    cfg = SourceConfig(host="127.0.0.1", port=srv.port, user=REPL_USER, password=REPL_PASSWORD,
                       include_tables=["z.*"])
    start = Position("mysql-bin.000001", 4)
    was = compiled.ext is not None
    try:
        # Both live reads up to where the binlog ended before the first: the
        # server may add an event meanwhile (MariaDB writes a
        # BINLOG_CHECKPOINT once the rotation's commits are durable, at a
        # moment of its own), which the second read alone would see.
        end = Position(*srv.execute("SHOW MASTER STATUS")[0][:2])

        def upto_end(events: list[SourceEvent]) -> list[SourceEvent]:
            return [e for e in events if e.start < end]

        live = upto_end(_events(cfg, start, use_compiled=True))
        _assert_same_events(live, upto_end(_events(cfg, start, use_compiled=False)))
        assert {"ROTATE_EVENT", "GTID_EVENT", "WRITE_ROWS_EVENT_V1", "UPDATE_ROWS_EVENT_V1", "DELETE_ROWS_EVENT_V1",
                "XID_EVENT", "QUERY_EVENT"} <= {e.kind for e in live}
        assert sum(len(e.rows) for e in live if e.basic is Basic.INSERT) > 1500
        # The same binlog as files (the last one still being written: its
        # FORMAT_DESCRIPTION has the in-use flag).
        for f in sorted(srv.datadir.glob("mysql-bin.0*")):
            shutil.copy(f, tmp_path / f.name)
        files = sorted(tmp_path.glob("mysql-bin.0*"))
        read = [_events(SourceConfig(include_tables=["z.*"]), start, use_compiled=on, reader=FileReader(files, start))
                for on in (True, False)]
        _assert_same_events(*read)
        # What the two inputs both hold: the data events (the ROTATE and
        # FORMAT_DESCRIPTION events around them differ: a server sends its own).
        data = [Basic.INSERT, Basic.UPDATE, Basic.DELETE, Basic.DDL, Basic.COMMIT, Basic.BEGIN]
        assert [e for e in read[0] if e.basic in data] == [e for e in live if e.basic in data]
    finally:
        compiled.use_compiled(was)


class _EncodingSink(ListSink):
    """The batches as encoded Avro, with the wall-clock time taken out."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[bytes] = []

    def send(self, seq: int, batch: Batch, stop: Any) -> None:
        meta = {k: v for k, v in batch.meta.items() if k != "incarnation"}
        self.encoded.append(codec.encode(dataclasses.replace(batch, created_us=0, meta=meta)))
        super().send(seq, batch, stop)


@pytest.mark.parametrize("kind", ["plain", "compressed"])
@pytest.mark.parametrize("batch_max_events", [5000, 7])
def test_the_producer_ships_byte_identical_envelopes_on_both_paths(
        both_servers: dict[str, MariaDBServer], kind: str, batch_max_events: int, tmp_path: Path) -> None:
    srv = both_servers[kind]
    out = {}
    was = compiled.ext is not None
    try:
        for path in ("compiled", "pure"):
            compiled.use_compiled(path == "compiled")
            run = tmp_path / path
            run.mkdir()
            cfg = load_config(write_config(run / "c.toml", srv, source={"start": "mysql-bin.000001:4",
                                                                        "include_tables": ["z.*"]},
                                           producer={"batch_max_delay_ms": 600_000,
                                                     "batch_max_events": batch_max_events}), env={})
            sink = _EncodingSink()
            Producer(cfg, sink, blocking=False).run()
            out[path] = sink.encoded
    finally:
        compiled.use_compiled(was)
    # 7 changes per envelope: the large transactions are cut into fragments.
    assert len(out["compiled"]) == len(out["pure"]) > (30 if batch_max_events == 7 else 0)
    for i, (c, p) in enumerate(zip(out["compiled"], out["pure"])):
        assert c == p, f"envelope {i}: compiled and pure bytes differ"


def test_a_source_restart_during_a_live_read_loses_and_repeats_nothing(hot_path: str, fresh_mariadb: MariaDBServer,
                                                                      tmp_path: Path) -> None:
    """The compiled reader ends at a lost connection (a transient error: the
    producer resumes from its checkpoint); mysql-replication reconnects by
    itself.  Either way every insert is shipped once."""
    import threading

    from cynomys.core.model import Op
    from cynomys.producer import run_with_retry
    from tests.helpers import wait_for

    srv = fresh_mariadb
    srv.execute("CREATE DATABASE r", "CREATE TABLE r.t (id int primary key, v varchar(20))")
    at = Position(*srv.execute("SHOW MASTER STATUS")[0][:2])
    cfg = load_config(write_config(tmp_path / "c.toml", srv, source={"start": f"{at.file}:{at.pos}",
                                                                     "include_tables": ["r.*"]}), env={})
    sink, stop = ListSink(), threading.Event()
    daemon = threading.Thread(target=run_with_retry, args=(lambda: Producer(cfg, sink, stop), stop),
                              kwargs={"max_backoff": 1.0}, daemon=True)
    daemon.start()

    def inserted() -> list[int]:
        return [c.after[0] for c in sink.changes() if c.op is Op.INSERT]

    try:
        srv.execute(*[f"INSERT INTO r.t VALUES ({i}, 'before {i}')" for i in range(150)])
        wait_for(lambda: len(inserted()) >= 150, what="the inserts before the restart")
        srv.stop()
        srv.start()
        srv.execute(*[f"INSERT INTO r.t VALUES ({i}, 'after {i}')" for i in range(150, 300)])
        wait_for(lambda: len(inserted()) >= 300, what="the inserts after the restart")
        time.sleep(1.0)  # anything sent twice would arrive by now
    finally:
        stop.set()
        daemon.join(30)
    assert sorted(inserted()) == list(range(300))


def test_a_chunk_connection_converts_its_fields_on_the_path_it_opened_on(mariadb: MariaDBServer) -> None:
    """On the compiled path mysqlclient hands DECIMAL, temporal and floating
    fields over as bytes and the cursor converts them (snapshot/source.py
    ``_text_fields``): the values are the pure path's, for stored and
    streamed cursors, and stay values when the selected path changes while
    the connection is open (its fields still come as bytes)."""
    pytest.importorskip("MySQLdb")
    from cynomys.core.model import RawTemporal
    from cynomys.snapshot.source import _mysqlclient, mysqlclient_cursor

    cfg = SourceConfig(host="127.0.0.1", port=mariadb.port, user=REPL_USER, password=REPL_PASSWORD)
    sql = ("SELECT CAST('12.50' AS DECIMAL(10,2)), DATE('2024-02-29'), CAST('2024-02-29 01:02:03.5' AS DATETIME(6)), "
           "CAST(1.5 AS DOUBLE), NULL, CAST(0.1 AS FLOAT), 'x', 7")
    zero = "SELECT CAST('0000-00-00' AS DATE), CAST('0000-00-00 00:00:00' AS DATETIME)"

    def read(conn: Any, query: str, streamed: bool) -> list[tuple[Any, ...]]:
        cur = conn.cursor(mysqlclient_cursor(streamed))
        try:
            cur.execute("SET SESSION sql_mode = ''")
            cur.execute(query)
            return list(cur.fetchall())
        finally:
            cur.close()

    was = compiled.ext is not None
    try:
        compiled.use_compiled(False)
        pure = _mysqlclient(cfg)
        compiled.use_compiled(True)
        fast = _mysqlclient(cfg)
        try:
            want = read(pure, sql, False) + read(pure, zero, False)
            assert [type(v) for v in want[0]][:4] == [decimal.Decimal, dt.date, dt.datetime, float]
            assert want[1] == (RawTemporal("0000-00-00"), RawTemporal("0000-00-00 00:00:00"))
            for streamed in (False, True):
                got = read(fast, sql, streamed) + read(fast, zero, streamed)
                assert [[(type(v), v) for v in r] for r in got] == [[(type(v), v) for v in r] for r in want]
            compiled.use_compiled(False)  # the connection opened compiled: its fields come as bytes still
            got = read(fast, sql, True) + read(fast, zero, False)
            assert [[(type(v), v) for v in r] for r in got] == [[(type(v), v) for v in r] for r in want]
        finally:
            pure.close()
            fast.close()
    finally:
        compiled.use_compiled(was)
