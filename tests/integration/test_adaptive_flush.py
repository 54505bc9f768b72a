"""Adaptive delay commit: an applier that is behind takes the backlog into
one flush (up to [applier] max_buffer_rows) instead of committing once per
buffer_rows -- a target whose commit is dear pays it fewer times."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cynomys.applier.loop import run_applier
from cynomys.core.config import load_config
from cynomys.transport.keys import generate_keys
from tests.helpers import produce_to_end, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("max_buffer_rows, most_flushes", [(10_000, 4), (1000, 40)])
def test_a_backlog_is_flushed_in_few_large_flushes(fresh_mariadb: MariaDBServer, tmp_path: Path,
                                                   max_buffer_rows: int, most_flushes: int) -> None:
    src = fresh_mariadb
    tgt = MariaDBServer(server_id=2).start()
    try:
        src.execute("CREATE DATABASE b", "CREATE TABLE b.t (id INT PRIMARY KEY, v INT)",
                    *["INSERT INTO b.t VALUES " + ",".join(f"({i * 100 + j}, {j})" for j in range(100))
                      for i in range(200)])
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = load_config(write_config(
            tmp_path / "c.toml", src, source={"include_tables": ["b.*"]},
            producer={"id": "p1", "batch_max_events": 100, "batch_max_delay_ms": 0},
            transport={"kind": "file", "path": str(tmp_path / "t.bin")},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 1000, "max_delay_ms": 100, "max_buffer_rows": max_buffer_rows},
            target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"}), env={})
        produce_to_end(cfg)  # the whole backlog is waiting when the applier starts
        stats = run_applier(cfg, threading.Event(), until_idle_s=1)
        assert stats.rows_out == 20_000
        # 20 flushes of buffer_rows without the backlog rule; the cap still
        # bounds each one (the default is the target's backlog_factor).
        assert 2 <= stats.flushes <= most_flushes, stats
        assert tgt.execute("SELECT COUNT(*), SUM(v) FROM b.t") == src.execute("SELECT COUNT(*), SUM(v) FROM b.t")
    finally:
        tgt.destroy()


def test_a_backlog_of_hot_key_updates_is_capped_by_net_changes(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    """The backlog cap counts net changes (what a buffer holds after
    folding), not raw ones: 20,000 updates of 100 keys hold 100 net changes,
    so they go into the flushes that RAW_FACTOR x max_buffer_rows raw changes
    allow (2 here), not 20 flushes of max_buffer_rows raw changes."""
    from cynomys.applier.loop import RAW_FACTOR

    src = fresh_mariadb
    tgt = MariaDBServer(server_id=2).start()
    try:
        src.execute("CREATE DATABASE h", "CREATE TABLE h.t (id INT PRIMARY KEY, v INT)",
                    "INSERT INTO h.t VALUES " + ",".join(f"({i}, 0)" for i in range(100)),
                    *["UPDATE h.t SET v = v + 1" for _ in range(200)])
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = load_config(write_config(
            tmp_path / "c.toml", src, source={"include_tables": ["h.*"]},
            producer={"id": "p1", "batch_max_events": 100, "batch_max_delay_ms": 0},
            transport={"kind": "file", "path": str(tmp_path / "t.bin")},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 1000, "max_delay_ms": 100, "max_buffer_rows": 1000},
            target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"}), env={})
        produce_to_end(cfg)
        stats = run_applier(cfg, threading.Event(), until_idle_s=1)
        assert stats.rows_in >= 20_100
        raw_flushes = stats.rows_in // (RAW_FACTOR * 1000)
        assert 1 <= stats.flushes <= raw_flushes + 2, stats  # + the tail and the flush before the DDL's end
        assert stats.rows_out <= 100 * (stats.flushes + 1), stats  # folded: each flush writes the 100 keys
        assert tgt.execute("SELECT COUNT(*), SUM(v) FROM h.t") == src.execute("SELECT COUNT(*), SUM(v) FROM h.t")
    finally:
        tgt.destroy()
