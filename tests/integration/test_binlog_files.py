"""Binlog files read offline: `cynomys decode` and `[source] binlog_files`.

MariaDB-written files (FLUSH BINARY LOGS, then the closed files) go through
the file path and give what the live producer shipped for the same range;
archived files replayed by `cynomys produce` into a DuckDB target give the
source's tables; MINIMAL row metadata decodes with positional names; damaged
or incomplete archives are refused, naming the file and offset."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pymysql
import pytest

from cynomys.cli.decode import decode, json_line
from cynomys.core.config import load_config
from cynomys.core.errors import PositionLostError, SourceConfigError, UnsupportedEventError
from cynomys.producer import Producer
from cynomys.transport.keys import generate_keys
from tests.helpers import ListSink, write_config
from tests.integration.test_compressed_binlog import _statements
from tests.integration.test_e2e_columnstore import TABLES, _mixed_txn
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cynomys.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _position(srv: MariaDBServer) -> tuple[str, int]:
    f, p = srv.execute("SHOW MASTER STATUS")[0][:2]
    return str(f), int(p)


def _closed_files(srv: MariaDBServer) -> list[Path]:
    """Every binlog file but the one being written."""
    current = _position(srv)[0]
    return [srv.datadir / str(r[0]) for r in srv.execute("SHOW BINARY LOGS") if str(r[0]) != current]


def _run_statements(srv: MariaDBServer, statements: list[str]) -> None:
    conn = srv.connect()
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
    conn.close()


@pytest.mark.parametrize("binlog_compress", [False, True], ids=["plain", "compressed"])
def test_decode_of_closed_files_equals_what_the_live_producer_shipped(tmp_path: Path, binlog_compress: bool) -> None:
    srv = MariaDBServer(server_id=1, binlog_compress=binlog_compress).start()
    try:
        file, pos = _position(srv)
        # A rotation in the middle: the range spans two closed files.
        statements = _statements()
        _run_statements(srv, statements[:8] + ["FLUSH BINARY LOGS"] + statements[8:] + ["FLUSH BINARY LOGS"])
        # Each envelope one transaction (batch_max_delay_ms = 0): nothing
        # folds across transactions, and no transaction here changes a row twice.
        cfg = load_config(write_config(tmp_path / "c.toml", srv, source={"start": f"{file}:{pos}"},
                                       producer={"batch_max_delay_ms": 0}), env={})
        sink = ListSink()
        Producer(cfg, sink, blocking=False).run()
        shipped = [json_line(c) for c in sink.changes()]
        files = [str(p) for p in _closed_files(srv) if p.name >= file]
        assert len(files) == 2
        out = cli("decode", "--json", "--start", str(pos), *reversed(files))  # any order: binlog order is used
        assert out.returncode == 0, out.stderr
        decoded = out.stdout.splitlines()
        assert len(decoded) == len(shipped) > 1500
        assert decoded == shipped
        for line in decoded:
            json.loads(line)  # each line is one JSON object
        sql = cli("decode", "--start", str(pos), *files)
        assert sql.returncode == 0, sql.stderr
        assert sql.stdout.count("-- transaction ") == len({json.loads(x)["gtid"] for x in decoded})
        assert "INSERT INTO `z`.`big`" in sql.stdout and "ALTER TABLE z.big ADD COLUMN extra JSON;" in sql.stdout
        # --stop: up to an event boundary of the last file.
        first_only = cli("decode", "--json", "--start", str(pos), "--stop", str(_event_starts(files[1])[3]), *files)
        assert first_only.returncode == 0 and len(decoded) > len(first_only.stdout.splitlines()) > 0
    finally:
        srv.destroy()


def _event_starts(path: str | Path) -> list[int]:
    data = Path(path).read_bytes()
    out, off = [], 4
    while off < len(data):
        out.append(off)
        off += int.from_bytes(data[off + 9:off + 13], "little")
    return out


def test_minimal_row_metadata_decodes_with_positional_names(tmp_path: Path) -> None:
    srv = MariaDBServer(server_id=1, extra_args=("--binlog-row-metadata=MINIMAL",)).start()
    try:
        file, pos = _position(srv)
        _run_statements(srv, [
            "CREATE DATABASE m", "CREATE TABLE m.t (id int unsigned primary key, name varchar(20) CHARACTER SET latin1, "
            "e enum('a','b','c'), s set('x','y'), d decimal(8,3), b binary(3))",
            "INSERT INTO m.t VALUES (4000000000, 'caf\u00e9', 'c', 'x,y', -12.5, 'ab')", "FLUSH BINARY LOGS"])
        files = [str(p) for p in _closed_files(srv) if p.name >= file]
        out = cli("decode", "--json", "--start", str(pos), *files)
        assert out.returncode == 0, out.stderr
        rows = [json.loads(x) for x in out.stdout.splitlines() if '"INSERT"' in x]
        assert rows[0]["after"] == {"@1": 4000000000, "@2": "caf\u00e9", "@3": 3, "@4": 3, "@5": -12.5,
                                    "@6": "YWIA"}
        # The producer needs the names a target has: it stops, naming the setting.
        (tmp_path / "arch").mkdir()
        for f in files:
            shutil.copy(f, tmp_path / "arch")
        cfg = load_config(write_config(tmp_path / "c.toml", srv, source={
            "binlog_files": str(tmp_path / "arch" / "mysql-bin.[0-9]*"), "start": f"{file}:{pos}"}), env={})
        with pytest.raises(SourceConfigError, match="binlog_row_metadata=FULL"):
            Producer(cfg, ListSink(), blocking=False).run()
    finally:
        srv.destroy()


def _copy_damaged(src: Path, dst: Path, at: int, length: int | None = None) -> Path:
    data = bytearray(src.read_bytes())
    if length is not None:
        data = data[:length]
    else:
        data[at] ^= 0xFF
    dst.write_bytes(bytes(data))
    return dst


def test_damaged_or_incomplete_archives_are_refused(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    mariadb = fresh_mariadb
    file, _ = _position(mariadb)
    _run_statements(mariadb, ["CREATE DATABASE IF NOT EXISTS dmg", "CREATE TABLE IF NOT EXISTS dmg.t (a int)",
                              "INSERT INTO dmg.t VALUES (1), (2)", "FLUSH BINARY LOGS",
                              "INSERT INTO dmg.t VALUES (3)", "FLUSH BINARY LOGS",
                              "INSERT INTO dmg.t VALUES (4)", "FLUSH BINARY LOGS"])
    files = [p for p in _closed_files(mariadb) if p.name >= file]
    assert len(files) == 3
    good = files[0]
    starts = _event_starts(good)
    cases: dict[str, tuple[list[Path], int, type[Exception], str]] = {
        "bit flip": ([_copy_damaged(good, tmp_path / good.name, starts[-2] + 20)], 0, UnsupportedEventError, "CRC32"),
        "cut short": ([_copy_damaged(good, tmp_path / ("cut." + good.name.split(".")[-1]), 0, starts[-1] + 7)], 0,
                      UnsupportedEventError, "ends inside"),
        "start inside an event": ([good], starts[-2] + 3, UnsupportedEventError, "where an event starts"),
        "a file missing": ([files[0], files[2]], 0, PositionLostError, files[1].name),
    }
    for what, (paths, start, error, text) in cases.items():
        with pytest.raises(error, match=text):
            list(decode([str(p) for p in paths], start))
        print(f"{what}: refused")
    assert sum(1 for _ in decode([str(p) for p in files])) > 0


def _archive(srv: MariaDBServer, dst: Path) -> None:
    dst.mkdir(exist_ok=True)
    for p in _closed_files(srv):
        if not (dst / p.name).exists():
            shutil.copy(p, dst / p.name)
    shutil.copy(srv.datadir / "mysql-bin.index", dst)  # not a binlog: the glob's matches are checked


def _write(srv: MariaDBServer, n: int, seed: int) -> None:
    rnd = random.Random(seed)
    conn = srv.connect("app")
    with conn.cursor() as cur:
        for _ in range(n):
            cur.execute("BEGIN")
            try:
                _mixed_txn(cur, rnd, seed)
                cur.execute("COMMIT")
            except pymysql.err.IntegrityError:
                cur.execute("ROLLBACK")
    conn.close()


def test_replay_of_archived_files_into_a_target_equals_the_source(tmp_path: Path) -> None:
    pytest.importorskip("duckdb", reason="the duckdb extra is not installed")
    from tests.integration.test_e2e_duckdb import _diff

    srv = MariaDBServer(server_id=1).start()
    try:
        srv.execute("CREATE DATABASE app", *[f"CREATE TABLE app.{t} ({c})" for t, c in TABLES.items()])
        _write(srv, 300, 1)
        srv.execute("FLUSH BINARY LOGS")
        _write(srv, 300, 2)
        srv.execute("ALTER TABLE app.acct ADD COLUMN region CHAR(2) NOT NULL DEFAULT 'eu'")
        _write(srv, 200, 3)
        srv.execute("FLUSH BINARY LOGS")
        archive = tmp_path / "archive"
        _archive(srv, archive)
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        replica = tmp_path / "replica.duckdb"
        cfg = write_config(tmp_path / "c.toml", srv,
                           source={"binlog_files": "archive/mysql-bin.[0-9]*", "include_tables": ["app.*"],
                                   "host": "127.0.0.1", "port": 1},  # the server is not asked: port 1 is closed
                           producer={"id": "replay", "batch_max_events": 300},
                           transport={"kind": "file", "path": str(tmp_path / "t.bin")},
                           security={k: str(v) for k, v in keys.items()},
                           target={"kind": "duckdb", "url": str(replica)})
        produced = cli("produce", "-c", str(cfg))  # stops by itself at the archive's end
        assert produced.returncode == 0, produced.stderr
        # `cynomys status` measures the producer against the archive's end, not the server.
        status = json.loads(cli("status", "-c", str(cfg), "--json").stdout)
        last = max(archive.glob("mysql-bin.[0-9]*"))
        assert status["source"] == {"reachable": True, "binlog_end": f"{last.name}:{last.stat().st_size}"}
        applied = cli("apply", "-c", str(cfg), "--until-idle", "3")
        assert applied.returncode == 0, applied.stderr
        assert not any(_diff(srv, replica).values()), _diff(srv, replica)
        # More archived later: the producer goes on from its checkpoint.
        _write(srv, 200, 4)
        srv.execute("DELETE FROM app.log WHERE who = 1")
        srv.execute("FLUSH BINARY LOGS")
        _archive(srv, archive)
        again = cli("produce", "-c", str(cfg))
        assert again.returncode == 0, again.stderr
        # It read on from where the first run stopped, to the archive's end.
        state = json.loads((tmp_path / "producer-state" / "producer.json").read_text())
        assert state["checkpoint"]["file"] >= max(p.name for p in archive.glob("mysql-bin.[0-9]*"))
        assert cli("apply", "-c", str(cfg), "--until-idle", "3").returncode == 0
        diff: dict[str, Any] = _diff(srv, replica)
        assert not any(diff.values()), diff
    finally:
        srv.destroy()
