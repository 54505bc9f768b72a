"""MariaDB with log_bin_compress = ON: the producer ships byte for byte the
envelopes it ships for the same changes from a server writing plain events.

Two fresh servers, one compressing every event longer than 10 bytes, take
the same statements on one connection each; the producer reads both
binlogs.  Positions differ (compressed events are shorter) and so do the
source timestamps; everything else in every envelope -- changes, images,
schemas, GTIDs, SQL text, where envelopes are cut -- must be equal, compared
as encoded Avro bytes."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

import pytest

from cynomys.core.config import load_config
from cynomys.core.model import Batch, Position
from cynomys.producer import Producer
from cynomys.schemas import codec
from tests.helpers import ListSink, write_config
from tests.integration.test_producer import ALL_TYPES, ROWS
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

_NOWHERE = Position("", 0)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    plain = MariaDBServer(server_id=1).start()
    packed = MariaDBServer(server_id=1, binlog_compress=True).start()
    yield plain, packed
    plain.destroy()
    packed.destroy()


def _statements() -> list[str]:
    cols = ", ".join(f"`{n}` {t}" for n, t in ALL_TYPES)
    big = ",".join(f"({i}, REPEAT('p', {i % 300}), {i}.25)" for i in range(1500))
    return [
        "CREATE DATABASE z",
        f"CREATE TABLE z.types ({cols}) DEFAULT CHARSET=utf8mb4",
        *(f"INSERT INTO z.types VALUES {r}" for r in ROWS),
        "UPDATE z.types SET vc = CONCAT(IFNULL(vc, ''), 'more'), d10 = IFNULL(d10, 0) + 1",
        "CREATE TABLE z.big (id int primary key, pad varchar(400), n double)",
        "CREATE TABLE z.nokey (a int, b text)",
        "BEGIN", f"INSERT INTO z.big VALUES {big}", "INSERT INTO z.nokey VALUES (1, 'a'), (1, 'a'), (2, NULL)",
        "COMMIT",
        "UPDATE z.big SET n = n * 2 WHERE id % 3 = 0",
        "DELETE FROM z.big WHERE id % 5 = 0",
        "DELETE FROM z.nokey LIMIT 1",
        "ALTER TABLE z.big ADD COLUMN extra JSON",
        "UPDATE z.big SET extra = JSON_OBJECT('k', id, 'pad', pad) WHERE id < 100",
        "DELETE FROM z.types WHERE id = 4",
        "DROP TABLE z.nokey",
    ]


def _comparable(b: Batch) -> bytes:
    """A batch with positions and source times taken out, encoded."""
    changes = tuple(dataclasses.replace(c, txn=Position("", 0, c.txn.gtid), commit_ts=0) for c in b.changes)
    meta = {k: v for k, v in b.meta.items() if k not in ("from", "to", "after", "incarnation")}
    return codec.encode(dataclasses.replace(b, changes=changes, end=_NOWHERE, first_txn=None, created_us=0,
                                            last_commit_ts=0, meta=meta))


def _shipped(tmp_path: Path, srv: MariaDBServer, start: str, **producer: int) -> list[bytes]:
    run = tmp_path / f"{srv.port}-{producer['batch_max_events']}"
    run.mkdir()
    cfg = load_config(write_config(run / "c.toml", srv, source={"start": start, "include_tables": ["z.*"]},
                                   producer={"batch_max_delay_ms": 600_000, **producer}), env={})
    sink = ListSink()
    Producer(cfg, sink, blocking=False).run()
    return [_comparable(b) for _, b in sink.batches if b.changes]


def test_compressed_binlog_gives_byte_identical_envelopes(servers: tuple[MariaDBServer, MariaDBServer],
                                                          tmp_path: Path) -> None:
    starts = []
    for srv in servers:
        f, p = srv.execute("SHOW MASTER STATUS")[0][:2]
        starts.append(f"{f}:{p}")
        conn = srv.connect()
        with conn.cursor() as cur:
            for sql in _statements():
                cur.execute(sql)
        conn.close()
    plain, packed = servers
    kinds = {str(r[2]) for r in packed.execute(f"SHOW BINLOG EVENTS IN '{starts[1].split(':')[0]}'")}
    assert {"Query_compressed", "Write_rows_compressed_v1", "Update_rows_compressed_v1",
            "Delete_rows_compressed_v1"} <= kinds, f"the server did not compress: {sorted(kinds)}"
    assert not any("compressed" in k for k in {str(r[2]) for r in plain.execute("SHOW BINLOG EVENTS")})
    plain_size, packed_size = (sum(int(r[1]) for r in s.execute("SHOW BINARY LOGS")) for s in servers)
    # One envelope per run of transactions, and envelopes cut every 7
    # changes (fragments inside the large transaction).
    for producer in ({"batch_max_events": 100_000}, {"batch_max_events": 7}):
        want = _shipped(tmp_path, plain, starts[0], **producer)
        got = _shipped(tmp_path, packed, starts[1], **producer)
        assert len(want) > 0 and len(got) == len(want)
        assert got == want, [i for i, (a, b) in enumerate(zip(got, want)) if a != b][:5]
        print(f"\n{producer}: {len(got)} envelopes identical; binlogs of {plain_size} and {packed_size} bytes")
