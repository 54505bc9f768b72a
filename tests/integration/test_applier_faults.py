"""Applier faults: an untranslatable DDL, a target that goes down, a target
that rejects a row.  Each gives a clear error, loses nothing, and the applier
resumes where it stopped once the cause is fixed."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cynomys.applier.loop import run_applier
from cynomys.core.config import load_config
from cynomys.core.errors import TargetRejectedError
from cynomys.transport.file_bus import CorruptTransportFile
from cynomys.transport.keys import generate_keys
from tests.helpers import produce_to_end, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration



def _config(tmp_path: Path, src: MariaDBServer, tgt: MariaDBServer, **applier: object) -> Path:
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    start = "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])
    return write_config(tmp_path / "c.toml", src, source={"include_tables": ["f.*"], "start": start},
                        producer={"id": "p1"}, transport={"kind": "file", "path": str(tmp_path / "t.bin")},
                        security={k: str(v) for k, v in keys.items()},
                        applier={"max_delay_ms": 50, **applier},
                        target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"})


def _rows(srv: MariaDBServer, table: str = "t") -> list[tuple]:
    return srv.execute(f"SELECT * FROM f.{table} ORDER BY 1")


def test_untranslatable_ddl_stops_with_the_statement_and_skip_ddl_resumes(
        fresh_mariadb: MariaDBServer, target: MariaDBServer, tmp_path: Path) -> None:
    src = fresh_mariadb
    path = _config(tmp_path, src, target)
    src.execute("CREATE DATABASE f", "CREATE TABLE f.t (id INT PRIMARY KEY, a INT)", "INSERT INTO f.t VALUES (1, 1)",
                "ALTER TABLE f.t ADD COLUMN g INT AS (a + 1) STORED", "INSERT INTO f.t (id, a) VALUES (2, 2)")
    cfg = load_config(path, env={})
    produce_to_end(cfg)
    with pytest.raises(TargetRejectedError) as err:
        run_applier(cfg, threading.Event(), until_idle_s=1)
    msg = str(err.value)
    assert "ADD COLUMN g INT AS (a + 1) STORED" in msg and "skip_ddl" in msg
    assert _rows(target) == [(1, 1)]  # everything before the DDL is in, nothing after
    position = msg.split("DDL at ")[1].split(" ")[0]
    path.write_text(path.read_text().replace("[applier]\n", f'[applier]\nskip_ddl = ["{position}"]\n'))
    cfg = load_config(path, env={})
    run_applier(cfg, threading.Event(), until_idle_s=1)
    # No row is lost.  The skipped statement's effect on existing rows is what
    # the user chose to skip: the column arrives with the next row images
    # (schema drift is followed from the binlog's TABLE_MAP), row 1 keeps NULL.
    assert _rows(target) == [(1, 1, None), (2, 2, 3)]
    assert _rows(src) == [(1, 1, 2), (2, 2, 3)]


def test_target_down_for_a_while_then_everything_arrives(
        fresh_mariadb: MariaDBServer, target: MariaDBServer, tmp_path: Path) -> None:
    src = fresh_mariadb
    cfg = load_config(_config(tmp_path, src, target), env={})
    src.execute("CREATE DATABASE f", "CREATE TABLE f.t (id INT PRIMARY KEY, v VARCHAR(10))",
                *[f"INSERT INTO f.t VALUES ({i}, 'a')" for i in range(100)])
    produce_to_end(cfg)
    stop = threading.Event()
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(run_applier(cfg, stop, until_idle_s=3)))
    t.start()
    time.sleep(2)
    target.stop()  # the target goes away while the applier runs
    src.execute(*[f"UPDATE f.t SET v = 'b' WHERE id = {i}" for i in range(0, 100, 2)], "DELETE FROM f.t WHERE id > 90")
    produce_to_end(cfg)
    time.sleep(5)
    assert t.is_alive(), f"the applier gave up on a transient outage: {result}"
    target.start()
    t.join(120)
    assert not t.is_alive()
    assert _rows(target) == _rows(src)


def test_target_rejecting_a_row_stops_clearly_and_resumes_when_fixed(
        fresh_mariadb: MariaDBServer, target: MariaDBServer, tmp_path: Path) -> None:
    src = fresh_mariadb
    cfg = load_config(_config(tmp_path, src, target), env={})
    src.execute("CREATE DATABASE f", "CREATE TABLE f.t (id INT PRIMARY KEY, n INT)", "INSERT INTO f.t VALUES (1, 5)")
    produce_to_end(cfg)
    run_applier(cfg, threading.Event(), until_idle_s=1)
    target.execute("ALTER TABLE f.t MODIFY n TINYINT")  # someone narrowed the target column
    src.execute("INSERT INTO f.t VALUES (2, 100000)", "INSERT INTO f.t VALUES (3, 7)")
    produce_to_end(cfg)
    with pytest.raises(TargetRejectedError) as err:
        run_applier(cfg, threading.Event(), until_idle_s=1)
    assert "f.t" in str(err.value) and "100000" in str(err.value)
    assert _rows(target) == [(1, 5)]
    target.execute("ALTER TABLE f.t MODIFY n INT")  # fixed
    run_applier(cfg, threading.Event(), until_idle_s=1)
    assert _rows(target) == _rows(src) == [(1, 5), (2, 100000), (3, 7)]


def test_damaged_file_record_stops_the_applier_after_the_valid_records_before_it(
        fresh_mariadb: MariaDBServer, target: MariaDBServer, tmp_path: Path) -> None:
    src = fresh_mariadb
    cfg = load_config(_config(tmp_path, src, target), env={})
    src.execute("CREATE DATABASE f", "CREATE TABLE f.t (id INT PRIMARY KEY, v VARCHAR(10))",
                "INSERT INTO f.t VALUES (1, 'a'), (2, 'b')")
    produce_to_end(cfg)
    transport = Path(cfg.transport.path)
    good = transport.stat().st_size
    src.execute("INSERT INTO f.t VALUES (3, 'c')")
    produce_to_end(cfg)
    assert transport.stat().st_size > good
    with open(transport, "r+b") as fh:  # one flipped byte in the second record
        fh.seek(good + (transport.stat().st_size - good) // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptTransportFile, match=f"damaged at offset {good}"):
        run_applier(cfg, threading.Event(), until_idle_s=5)
    assert _rows(target) == [(1, "a"), (2, "b")]  # what precedes the damage is applied
