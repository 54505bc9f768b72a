"""A producer that dies after the transport accepted fragment k of a large
transaction, while the applier keeps running, restarts, or starts later.

The first attempt cuts one large transaction (preceded by small ones, so its
first fragment also carries whole transactions) into fragments of 20 changes
and "dies" right after the transport accepted fragment k, before it could
record that (the worst moment: its state still says the envelope is in
flight).  The second attempt runs with other batch settings, so it would cut
the same stretch of the binlog differently.  Whatever the interleaving, the
target must end equal to the source: nothing lost, nothing applied twice,
and the envelope after the crash must be the next fragment, not a re-send.
"""
from __future__ import annotations

import dataclasses
import shutil
import threading
import uuid
from pathlib import Path

import pytest

from cynomys.applier.loop import Applier
from cynomys.applier.receive import make_subscriber
from cynomys.applier.targets.base import open_target
from cynomys.core.config import Config, load_config
from cynomys.core.model import Batch
from cynomys.producer import Producer
from cynomys.transport.channel import SealedSink, make_opener
from cynomys.transport.keys import generate_keys
from tests.helpers import transport_batches, write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = pytest.mark.integration

BIG = 100          # changes in the large transaction
FIRST_MAX = 20     # batch_max_events of the first attempt: 5 fragments
FRAGMENTS = BIG // FIRST_MAX


class Crash(BaseException):
    """The producer process dying (not an error it could handle)."""


class CrashingSink(SealedSink):
    """Dies right after the transport accepted the ``k``-th incomplete batch
    (counting from 0) -- before the producer records it."""

    def __init__(self, cfg: Config, k: int) -> None:
        super().__init__(cfg)
        self.k = k
        self.fragments = 0

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        super().send(seq, batch, stop)
        if not batch.complete:
            if self.fragments == self.k:
                raise Crash(f"after fragment {self.k}, envelope {seq}")
            self.fragments += 1



def _workload(src: MariaDBServer) -> None:
    src.execute("CREATE DATABASE w", "CREATE TABLE w.k (id INT PRIMARY KEY, v INT)", "CREATE TABLE w.n (a INT, b INT)")
    small = []
    for t in range(5):  # small transactions, so the first fragment also closes them
        small += ["BEGIN", f"INSERT INTO w.k VALUES ({t}, 0), ({t + 100}, 0)", f"UPDATE w.k SET v = v + 1 WHERE id = {t}",
                  f"INSERT INTO w.n VALUES ({t}, 1), ({t}, 1)", "COMMIT"]
    big = ["BEGIN"]
    for i in range(BIG // 4):  # one row per statement: fragments can be cut after any of them
        big += [f"INSERT INTO w.k VALUES ({1000 + i}, {i})", f"UPDATE w.k SET v = v + 10 WHERE id = {i % 5}",
                f"INSERT INTO w.n VALUES ({i % 3}, {i % 2})", f"DELETE FROM w.n WHERE a = {i % 3} LIMIT 1"]
    big.append("COMMIT")
    after = ["BEGIN", "UPDATE w.k SET id = id + 5000 WHERE id = 1000", "DELETE FROM w.k WHERE id = 100",
             "INSERT INTO w.n VALUES (9, 9)", "COMMIT", "INSERT INTO w.k VALUES (7777, 7)"]
    src.execute(*small, *big, *after)


_KEYS: dict[Path, dict[str, str]] = {}


def _config(tmp_path: Path, src: MariaDBServer, tgt: MariaDBServer, redis_url: str, *, start: str = "earliest",
            **producer: object) -> Config:
    if tmp_path not in _KEYS:
        _KEYS[tmp_path] = {k: str(v) for k, v in generate_keys(tmp_path / "keys", rsa_bits=2048).items()}
    key_files = _KEYS[tmp_path]
    path = write_config(
        tmp_path / f"c-{uuid.uuid4().hex[:6]}.toml", src,
        source={"include_tables": ["w.*"], "start": start},
        producer={"id": "p1", "state_dir": str(tmp_path / "producer-state"), **producer},
        transport={"url": redis_url, "stream": f"frag-{tmp_path.name}"},
        security=key_files,
        applier={"buffer_rows": 1000, "max_delay_ms": 50, "consumer_name": "a1",
                 "state_dir": str(tmp_path / "applier-state")},
        target={"kind": "columnstore", "url": tgt.url, "engine": "InnoDB"})
    return load_config(path, env={})


def _produce(cfg: Config, sink: SealedSink) -> None:
    try:
        Producer(cfg, sink, blocking=False).run()
    finally:
        sink.close()


def _applier(cfg: Config) -> Applier:
    app = Applier(cfg, open_target(cfg), make_subscriber(cfg), make_opener(cfg))
    app.start()
    return app


def _pump(app: Applier) -> None:
    """What the applier loop does with what is on the transport now."""
    while True:
        got = app.sub.read(200, 300)
        if not got:
            break
        for d in got:
            app.handle(d)
            if app.buffer.due():
                app.flush()
    if app.buffer.due():
        app.flush()


def _finish(app: Applier) -> None:
    _pump(app)
    app.run(until_idle_s=0.5)
    app.sub.close()
    app.target.close()


def _rows(srv: MariaDBServer) -> tuple[list[tuple], list[tuple]]:
    return (srv.execute("SELECT id, v FROM w.k ORDER BY id"), srv.execute("SELECT a, b FROM w.n ORDER BY a, b"))


@pytest.mark.parametrize("applier_mode", ["after", "continuous", "restarted"])
@pytest.mark.parametrize("k", [0, 1, FRAGMENTS - 1])
def test_producer_dies_after_fragment_k(fresh_mariadb: MariaDBServer, target: MariaDBServer, redis_url: str,
                                        tmp_path: Path, k: int, applier_mode: str) -> None:
    src = fresh_mariadb
    _workload(src)
    first = _config(tmp_path, src, target, redis_url, batch_max_events=FIRST_MAX, batch_max_delay_ms=60_000)
    with pytest.raises(Crash):
        _produce(first, CrashingSink(first, k))
    sent_before = transport_batches(first)
    assert sum(1 for _, b in sent_before if not b.complete) == k + 1

    app = None
    if applier_mode in ("continuous", "restarted"):
        app = _applier(first)
        _pump(app)  # holds the fragments of the open transaction, cannot flush them yet
        assert not app.buffer.complete
        if applier_mode == "restarted":  # dies too: nothing flushed, nothing acknowledged
            app.sub.close()
            app.target.close()
            app = None

    # Cut differently: fewer events per batch, and every commit due at once.
    second = _config(tmp_path, src, target, redis_url, batch_max_events=7, batch_max_delay_ms=0)
    _produce(second, SealedSink(second))

    batches = transport_batches(second)
    seq_crash, last_fragment = sent_before[-1]
    resumed = dict(batches)[seq_crash + 1]
    assert resumed.meta.get("frag") == str(k + 1), resumed.meta
    assert resumed.meta["from"] == last_fragment.meta["to"]
    assert resumed.meta["from_n"] == last_fragment.meta["to_n"] == str((k + 1) * FIRST_MAX)
    assert [s for s, _ in batches] == list(range(1, len(batches) + 1))

    _finish(app if app is not None else _applier(second))
    assert _rows(target) == _rows(src)


def test_transport_claiming_more_than_was_sent_is_terminal(fresh_mariadb: MariaDBServer, target: MariaDBServer,
                                                           redis_url: str, tmp_path: Path) -> None:
    """The producer's own state is the authority: a sequence number planted in
    Redis must not make it skip changes (it used to log "already holds" and
    move its checkpoint past transactions the target never got)."""
    import redis

    from cynomys.core.errors import TerminalError

    src = fresh_mariadb
    src.execute("CREATE DATABASE w", "CREATE TABLE w.k (id INT PRIMARY KEY, v INT)", "INSERT INTO w.k VALUES (1, 1)")
    cfg = _config(tmp_path, src, target, redis_url)
    _produce(cfg, SealedSink(cfg))
    sent = len(transport_batches(cfg))
    src.execute("INSERT INTO w.k VALUES (2, 2)")
    r = redis.Redis.from_url(redis_url)
    seq_keys = [f"{cfg.transport.stream}:seq"]
    assert r.hget(seq_keys[0], "p1") == str(sent).encode()
    for key in seq_keys:
        r.hset(key, "p1", 1_000_000)
    with pytest.raises(TerminalError, match="claims to hold envelope 1000000"):
        _produce(cfg, SealedSink(cfg))
    for key in seq_keys:  # the operator repairs it: nothing was skipped
        r.hset(key, "p1", sent)
    _produce(cfg, SealedSink(cfg))
    _finish(_applier(cfg))
    assert target.execute("SELECT id, v FROM w.k ORDER BY id") == [(1, 1), (2, 2)]


def test_a_reset_producer_is_refused_unless_it_resumes_where_the_target_is(
        fresh_mariadb: MariaDBServer, target: MariaDBServer, redis_url: str, tmp_path: Path) -> None:
    """The producer's state dir is lost.  With the stream intact the
    producer refuses to start anew.  With Redis flushed too, the new
    producer numbers its envelopes from 1 again: the applier used to skip
    them as "delivered again" (new rows never arrived).  Now the target's
    state names the producer's incarnation and position: a new incarnation
    resuming where the target is loses nothing and is applied; one resuming
    past it stops the applier, naming both positions."""
    import redis

    from cynomys.core.errors import TerminalError

    src = fresh_mariadb
    src.execute("CREATE DATABASE w", "CREATE TABLE w.k (id INT PRIMARY KEY, v INT)",
                *[f"INSERT INTO w.k VALUES ({i}, {i})" for i in range(5)])
    cfg = _config(tmp_path, src, target, redis_url, batch_max_events=1, batch_max_delay_ms=0)
    _produce(cfg, SealedSink(cfg))
    _finish(_applier(cfg))
    assert target.execute("SELECT COUNT(*) FROM w.k") == [(5,)]

    def reset_producer() -> None:
        shutil.rmtree(tmp_path / "producer-state")

    reset_producer()
    with pytest.raises(TerminalError, match="state .* is empty, but the transport .* holds envelopes"):
        _produce(cfg, SealedSink(cfg))
    r = redis.Redis.from_url(redis_url)
    r.delete(cfg.transport.stream, f"{cfg.transport.stream}:seq")
    here = "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])  # where the target is
    src.execute("INSERT INTO w.k VALUES (100, 100)", "INSERT INTO w.k VALUES (101, 101)")
    again = _config(tmp_path, src, target, redis_url, start=here)
    _produce(again, SealedSink(again))
    assert [s for s, _ in transport_batches(again)] == [1]
    _finish(_applier(again))
    assert target.execute("SELECT id FROM w.k WHERE id >= 100 ORDER BY id") == [(100,), (101,)]

    # Reset again, and start past what the target holds: row 200 would be lost.
    reset_producer()
    r.delete(again.transport.stream, f"{again.transport.stream}:seq")
    src.execute("INSERT INTO w.k VALUES (200, 200)")
    past = "{}:{}".format(*src.execute("SHOW MASTER STATUS")[0][:2])
    src.execute("INSERT INTO w.k VALUES (201, 201)")
    third = _config(tmp_path, src, target, redis_url, start=past)
    _produce(third, SealedSink(third))
    with pytest.raises(TerminalError, match=r"started anew .* resumes at .*, past what the target holds"):
        _finish(_applier(third))
    assert target.execute("SELECT id FROM w.k WHERE id >= 100 ORDER BY id") == [(100,), (101,)]


def test_an_envelope_the_applier_would_refuse_as_too_large_stops_the_producer(
        fresh_mariadb: MariaDBServer, target: MariaDBServer, redis_url: str, tmp_path: Path) -> None:
    from cynomys.core.errors import TerminalError

    src = fresh_mariadb
    src.execute("CREATE DATABASE w", "CREATE TABLE w.k (id INT PRIMARY KEY, v TEXT)",
                "INSERT INTO w.k VALUES (1, REPEAT('x', 5000))")
    cfg = _config(tmp_path, src, target, redis_url)
    cfg = dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, max_envelope_bytes=2000))
    with pytest.raises(TerminalError, match="max_envelope_bytes"):
        _produce(cfg, SealedSink(cfg))
    assert transport_batches(cfg) == []
