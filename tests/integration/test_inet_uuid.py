"""MariaDB's INET4, INET6 and UUID replicated exactly, on every target.

The binlog's TABLE_MAP describes them as BINARY(4)/BINARY(16) and the row
image holds their bytes (addresses in network order, UUIDs in text order);
a SELECT gives their text.  The model value is the binlog's bytes, with the
type BINARY(n) (core/sourcetypes.py BINARY_OF_SOURCE_TYPE): the row decoder,
the DDL parser and the snapshot reads all give that, and each target keeps
the bytes in its binary type.  Checked here: the bytes the live producer
ships are the packed text a SELECT gives, the snapshot's conversion of
that text gives the same rows, and a run of the daemons into each target
(DuckDB, MariaDB, MonetDB when CYNOMYS_TEST_MONETDB is set, Spark/Iceberg
in the slow lane) ends with the target holding those bytes, row for row."""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from cynomys.applier.targets.base import open_target
from cynomys.core.config import load_config
from cynomys.core.model import Row
from cynomys.producer import Producer
from cynomys.snapshot.columns import row_converter, table_info
from cynomys.transport.keys import generate_keys
from tests.helpers import ListSink, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]

ADDRESSES = ["0.0.0.0", "192.0.2.1", "255.255.255.255", "10.1.2.3"]
V6 = ["::", "::1", "2001:db8::ff00:42:8329", "::ffff:192.0.2.1", "fe80::1ff:fe23:4567:890a"]
UUIDS = ["123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000",
         "f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "0190e1c6-2c3a-7b4e-9a1d-3f2b6c8d9e0a",
         str(uuid.UUID(int=(1 << 128) - 1))]
# A database (and producer id) of this run's own: MonetDB is one shared server.
DB = f"inet_{uuid.uuid4().hex[:8]}"
DDL = f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, a INET4, b INET6 NOT NULL, c UUID, note VARCHAR(10))"


def _statements() -> list[str]:
    rows = [f"({i}, '{ADDRESSES[i % 4]}', '{V6[i % 5]}', '{UUIDS[i % 5]}', 'r{i}')" for i in range(20)]
    return [f"CREATE DATABASE {DB}", DDL, f"INSERT INTO {DB}.t VALUES {', '.join(rows)}",
            f"INSERT INTO {DB}.t VALUES (99, NULL, '::', NULL, NULL)",
            f"UPDATE {DB}.t SET b = '2001:db8::1', c = 'f81d4fae-7dec-11d0-a765-00a0c91e6bf6' WHERE id % 3 = 0",
            f"UPDATE {DB}.t SET a = '198.51.100.7' WHERE id = 1", f"DELETE FROM {DB}.t WHERE id = 2",
            f"ALTER TABLE {DB}.t ADD COLUMN d INET6 NOT NULL", f"UPDATE {DB}.t SET d = '::2' WHERE id < 5",
            f"ALTER TABLE {DB}.t ADD COLUMN e UUID NOT NULL DEFAULT '00000000-0000-0000-0000-0000000000ab', "
            "ADD COLUMN f BINARY(3) NOT NULL, ADD COLUMN g INET4 DEFAULT '127.0.0.1'"]


def _source(srv: MariaDBServer) -> list[Row]:
    """The source table read as a snapshot reads it (snapshot/columns.py)."""
    cols = srv.execute("SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = "
                       f"'{DB}' AND table_name = 't' ORDER BY ordinal_position")
    info = table_info(DB, "t", [(str(n), str(t)) for n, t in cols], ["id"], "InnoDB", 0)
    convert = row_converter(info.schema.columns)
    return sorted((convert(r) for r in srv.execute(f"SELECT * FROM {DB}.t")), key=lambda r: r[0])


@pytest.fixture(scope="module")
def source() -> Iterator[tuple[MariaDBServer, str]]:
    srv = MariaDBServer(server_id=1).start()
    f, p = srv.execute("SHOW MASTER STATUS")[0][:2]
    srv.execute(*_statements())
    yield srv, f"{f}:{p}"
    srv.destroy()


def test_the_binlog_bytes_are_the_packed_text_and_the_snapshot_reads_the_same(
        source: tuple[MariaDBServer, str], tmp_path: Path) -> None:
    srv, start = source
    cfg = load_config(write_config(tmp_path / "c.toml", srv, source={"start": start, "include_tables": [f"{DB}.*"]}),
                      env={})
    sink = ListSink()
    Producer(cfg, sink, blocking=False).run()
    state: dict[Any, Row] = {}
    for c in sink.changes():
        if c.schema is None:
            continue
        assert [col.type for col in c.schema.columns][1:4] == ["binary(4)", "binary(16)", "binary(16)"]
        if c.before is not None:
            state.pop(c.before[0], None)
        if c.after is not None:
            state[c.after[0]] = c.after
    # The rows as the binlog holds them (the column added last is filled
    # in existing rows by the applier's DDL, checked on the targets below).
    want = [r[:5] for r in _source(srv)]
    assert sorted((r[:5] for r in state.values()), key=lambda r: r[0]) == want
    one = next(r for r in want if r[0] == 4)  # type: ignore[index]
    assert one[1:4] == (ipaddress.IPv4Address(ADDRESSES[0]).packed, ipaddress.IPv6Address(V6[4]).packed,
                        uuid.UUID(UUIDS[4]).bytes)


def _targets() -> list[Any]:
    out: list[Any] = ["duckdb", "mariadb"]
    out.append(pytest.param("monetdb", marks=pytest.mark.skipif(
        not os.environ.get("CYNOMYS_TEST_MONETDB"), reason="CYNOMYS_TEST_MONETDB is not set: no MonetDB server")))
    out.append(pytest.param("spark", marks=[pytest.mark.slow, pytest.mark.spark]))
    return out


@pytest.mark.parametrize("kind", _targets())
def test_replicated_exactly_on_every_target(source: tuple[MariaDBServer, str], tmp_path: Path, kind: str) -> None:
    srv, start = source
    tgt: MariaDBServer | None = None
    schema = DB
    extra: dict[str, Any] = {}
    if kind == "duckdb":
        pytest.importorskip("duckdb")
        target: dict[str, Any] = {"kind": "duckdb", "url": str(tmp_path / "r.duckdb")}
    elif kind == "mariadb":
        tgt = MariaDBServer(server_id=2).start()
        target = {"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"}
    elif kind == "monetdb":
        target = {"kind": "monetdb", "url": os.environ["CYNOMYS_TEST_MONETDB"]}
    else:
        pytest.importorskip("pyspark")
        target = {"kind": "spark"}
        extra = {"target__spark": {"master": "local[1]", "warehouse": str(tmp_path / "warehouse")}}
    try:
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(tmp_path / "c.toml", srv, source={"start": start, "include_tables": [f"{DB}.*"]},
                           producer={"id": f"p-{DB}-{kind}"},
                           transport={"kind": "file", "path": str(tmp_path / "t.bin")},
                           security={k: str(v) for k, v in keys.items()}, target=target, **extra)
        for cmd in (["produce", "--once"], ["apply", "--until-idle", "3"]):
            done = subprocess.run([sys.executable, "-m", "cynomys.cli", cmd[0], "-c", str(cfg), *cmd[1:]], cwd=ROOT,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
        c = load_config(cfg, env={})
        if kind == "spark":
            from cynomys.applier.targets.spark.config import SparkConfig
            c = dataclasses.replace(c, target=c.target.with_options(
                dataclasses.replace(c.target.of(SparkConfig), master="local[1]")))
        reader = open_target(c)
        reader.connect()
        try:
            got = sorted(reader.fetch_rows(schema, "t"), key=lambda r: r[0])
        finally:
            reader.close()
        assert got == _source(srv)
    finally:
        if kind == "monetdb":
            _drop_monetdb_schema(target["url"], schema)
        if tgt is not None:
            tgt.destroy()


def _drop_monetdb_schema(url: str, schema: str) -> None:
    try:
        import pymonetdb
    except ImportError:
        return
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = pymonetdb.connect(database=u.path.lstrip("/"), hostname=u.hostname, port=u.port or 50000,
                             username=u.username, password=u.password, autocommit=True)
    try:
        conn.cursor().execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        conn.close()
