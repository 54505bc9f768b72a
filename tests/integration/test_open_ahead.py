"""The applier's open stage runs ahead of the loop (applier/opening.py): the
loop reads what is waiting before each flush so the worker opens it while
the target works.  A transport fault while reading ahead must not keep the
flush from its commit or lose anything: the loop's next read meets it."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cynomys.applier.loop import Applier
from cynomys.applier.receive import make_subscriber
from cynomys.applier.targets.base import open_target
from cynomys.core.config import load_config
from cynomys.core.errors import TransportUnavailableError
from cynomys.transport.bus import Delivery, Subscriber
from cynomys.transport.channel import make_opener
from cynomys.transport.keys import generate_keys
from tests.helpers import SubscriberProxy, produce_to_end, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration


class FlakyAhead(SubscriberProxy):
    """The real subscriber, failing its first ``fail`` reads that do not
    wait (the reads ahead) as a lost Redis connection would."""

    def __init__(self, sub: Subscriber, fail: int) -> None:
        super().__init__(sub)
        self.fail = fail
        self.ahead_reads = 0

    def read(self, count: int, block_ms: int) -> list[Delivery]:
        if block_ms == 0:
            self.ahead_reads += 1
            if self.fail:
                self.fail -= 1
                raise TransportUnavailableError("injected: connection lost while reading ahead")
        return self.sub.read(count, block_ms)



def test_a_fault_while_reading_ahead_delays_nothing_and_loses_nothing(mariadb: MariaDBServer, target: MariaDBServer,
                                                                      tmp_path: Path) -> None:
    db = f"ah_{uuid.uuid4().hex[:8]}"
    start = mariadb.execute("SHOW MASTER STATUS")[0]
    mariadb.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.k (id INT PRIMARY KEY, v INT)")
    for t in range(40):  # 40 transactions: many envelopes, many flushes
        mariadb.execute("BEGIN", *(f"INSERT INTO {db}.k VALUES ({t * 100 + i}, {t})" for i in range(25)),
                        f"UPDATE {db}.k SET v = v + 1 WHERE id = {t * 100}", "COMMIT")
    keys = {k: str(v) for k, v in generate_keys(tmp_path / "keys", rsa_bits=2048).items()}
    cfg = load_config(write_config(
        tmp_path / "c.toml", mariadb, source={"include_tables": [f"{db}.*"], "start": f"{start[0]}:{start[1]}"},
        producer={"id": db, "batch_max_events": 60, "batch_max_delay_ms": 0},
        transport={"kind": "file", "path": str(tmp_path / "t.bin")}, security=keys,
        # A flush per 50 changes even while behind: the loop's own reads then
        # wait, and only reads ahead do not (what FlakyAhead tells apart).
        applier={"buffer_rows": 50, "max_delay_ms": 0, "max_buffer_rows": 50},
        target={"kind": "columnstore", "url": target.url, "engine": "InnoDB"}), env={})
    produce_to_end(cfg)

    flaky = FlakyAhead(make_subscriber(cfg), fail=1)
    app = Applier(cfg, open_target(cfg), flaky, make_opener(cfg))  # type: ignore[arg-type]
    try:
        app.run(until_idle_s=0.5)  # returns: the injected faults never reached the loop
    finally:
        flaky.close()
        app.target.close()
    assert flaky.fail == 0 and flaky.ahead_reads >= 2, "the loop did not read ahead after the fault"
    assert app.stats.flushes > 3
    assert target.execute(f"SELECT id, v FROM {db}.k ORDER BY id") == mariadb.execute(
        f"SELECT id, v FROM {db}.k ORDER BY id")
    assert len(target.execute(f"SELECT id FROM {db}.k")) == 1000
