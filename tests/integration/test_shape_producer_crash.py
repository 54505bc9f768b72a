"""The producer's shape stage across SIGKILLs inside large transactions:
what the rules drop (a row filter leaving most rows out, a route) still
counts where the producer counts a transaction's changes, so resuming inside
a transaction cut into fragments skips exactly what was shipped -- nothing
sent twice, nothing lost (test_producer_crash.py's replay checks the chain
of envelopes and every key)."""
from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import write_config
from tests.integration.test_producer_crash import _batches, _produce, _replay
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_sigkills_inside_fragments_of_filtered_transactions(fresh_mariadb: MariaDBServer, tmp_path: Path) -> None:
    from cynomys.transport.keys import generate_keys

    srv = fresh_mariadb
    srv.execute("CREATE DATABASE w", "CREATE TABLE w.t (id INT PRIMARY KEY, v INT, keep BOOL)")
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
    cfg = write_config(
        tmp_path / "c.toml", srv,
        source={"include_tables": ["w.*"], "start": "earliest"},
        producer={"id": "p1", "batch_max_events": 500, "batch_max_delay_ms": 50},
        transport={"kind": "file", "path": str(tmp_path / "transport.bin")},
        security={k: str(v) for k, v in keys.items()},
        shape={"route": [{"source": "w.t", "target": "out.kept"}], "tables": {"w.t": {"filter": "keep = 1"}}})
    # Large transactions, most of their rows filtered out, then one moving
    # rows in and out of the filter: the producer is killed while it ships
    # their fragments, and resumes inside them.
    for base in (0, 30_000, 60_000):
        srv.execute("INSERT INTO w.t SELECT seq, seq, MOD(seq, 3) = 0 FROM w.seq_{}_to_{}".format(base + 1, base + 24_000))
    srv.execute("UPDATE w.t SET keep = NOT keep, v = v + 1 WHERE MOD(id, 2) = 0")
    log = tmp_path / "producer.log"
    rnd = random.Random(11)
    wire = tmp_path / "transport.bin"
    caught_up, kills = False, 0
    for _ in range(10):
        # Kill shortly after this run shipped something (not after a fixed
        # time: a loaded machine's start-up alone can outlast one), so the
        # kills land while fragments are being shipped.
        shipped = wire.stat().st_size if wire.exists() else 0
        with log.open("ab") as out:
            p = _produce(cfg, level="INFO", stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and p.poll() is None:
                if wire.exists() and wire.stat().st_size > shipped:
                    break
                time.sleep(0.02)
            else:
                caught_up = True  # nothing more to ship: the kills are over
            time.sleep(rnd.uniform(0.0, 0.3))
            p.send_signal(signal.SIGKILL)
            p.wait()
            kills += 1
        if caught_up:
            break
    resumes = log.read_text().count("resuming inside transaction")
    assert resumes > 0, "no restart landed inside a transaction: the test did not test that"
    drain = _produce(cfg, "--once")
    assert drain.wait(180) == 0
    batches = _batches(cfg)
    assert any(not b.complete for _, b in batches), "no transaction was cut into fragments"
    assert {(c.database, c.table) for _, b in batches for c in b.changes if c.schema is not None} == {("out", "kept")}
    # No change was shipped twice: a resume inside a transaction that
    # counted the shaped changes instead of the source's would send kept
    # rows again (the same transaction, the same images).
    from collections import Counter

    sent = Counter((c.tid, c.op, c.before, c.after) for _, b in batches for c in b.changes)
    again = [k for k, n in sent.items() if n > 1]
    assert not again, f"{len(again)} changes were shipped twice, e.g. {again[:2]}"
    keyed, keyless, tids = _replay(batches)
    want: dict[tuple[Any, ...], tuple[Any, ...]] = {
        (r[0],): tuple(r) for r in srv.execute("SELECT id, v, keep FROM w.t WHERE keep = 1")}
    assert keyed == want and not keyless
    print(f"\n{kills} SIGKILLs, {resumes} restarts inside a transaction, {len(batches)} envelopes "
          f"({sum(1 for _, b in batches if not b.complete)} fragments), {len(want)} rows kept of "
          f"{srv.execute('SELECT COUNT(*) FROM w.t')[0][0]}")
