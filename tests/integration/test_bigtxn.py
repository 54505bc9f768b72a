"""One large source transaction through the daemons, with the applier's
memory bound set so low that it applies the transaction in many parts
(applier/spill.py), on every target.

The transaction updates every row of a keyed table (some twice: a key
changed in two parts), deletes a fifth of them, updates and deletes rows of
a keyless table.  While it replicates: the producer is SIGKILLed once while
it is inside the transaction (its state names an open one), the applier
twice after it applied parts of it (the open target transaction dies with
the process), and a reader polls the target.  The reader must only ever see
the tables as they were before the transaction or after it, never part of
it; at the end the target equals the source row for row.

DuckDB lets no other process open its file while the applier holds it (the
open transaction holds it for the whole large transaction): there the
reader's polls that find the file locked count as seeing nothing, and the
others must pass the same check.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from cynomys.applier.targets.base import Target, open_target
from cynomys.core.config import load_config
from cynomys.core.errors import CynomysError
from cynomys.transport.keys import generate_keys
from tests.helpers import write_config
from tests.servers.mariadb import MariaDBServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYED, KEYLESS = 30_000, 6_000
# A MonetDB server is shared between runs: a database and a producer id (its
# applied state) of this run's own.
DB = f"big_{uuid.uuid4().hex[:8]}"
ROOT = Path(__file__).parents[2]


@dataclasses.dataclass
class Side:
    """A target kind: its [target] settings, batch size and cleanup."""

    target: dict[str, Any]
    extra: dict[str, Any]
    batch_max_events: int
    max_memory_mb: int
    close: Callable[[], None] = lambda: None
    locked_reads_ok: bool = False   # DuckDB: the file is locked while the applier holds it


def _columnstore(tmp: Path) -> Side:
    srv = MariaDBServer(server_id=2).start()
    return Side({"kind": "columnstore", "url": srv.url, "engine": "InnoDB"}, {}, 500, 1, srv.destroy)


def _duckdb(tmp: Path) -> Side:
    return Side({"kind": "duckdb", "url": str(tmp / "replica.duckdb")}, {}, 500, 1, locked_reads_ok=True)


def _monetdb(tmp: Path) -> Side:
    url = os.environ.get("CYNOMYS_TEST_MONETDB")
    if not url:
        pytest.skip("CYNOMYS_TEST_MONETDB is not set")
    return Side({"kind": "monetdb", "url": url}, {}, 500, 1)


def _spark(tmp: Path) -> Side:
    pytest.importorskip("pyspark")
    return Side({"kind": "spark"}, {"target__spark": {"master": "local[2]", "warehouse": str(tmp / "warehouse")}},
                3000, 2)


SIDES = {"columnstore": _columnstore, "duckdb": _duckdb, "monetdb": _monetdb, "spark": _spark}


@pytest.fixture(params=sorted(SIDES), ids=sorted(SIDES))
def side(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Side]:
    if request.param == "spark":
        request.applymarker(pytest.mark.spark)
    s = SIDES[request.param](tmp_path)
    yield s
    s.close()


def _daemon(cfg: Path, cmd: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(cfg)],
                            cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _shape(keyed: list[tuple[Any, ...]], keyless: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """What the reader compares: the tables as multisets."""
    return (frozenset(Counter(tuple(r) for r in keyed).items()), frozenset(Counter(tuple(r) for r in keyless).items()))


def _source(src: MariaDBServer) -> tuple[Any, ...]:
    return _shape(src.execute(f"SELECT id, v, pad FROM {DB}.k"), src.execute(f"SELECT a, b FROM {DB}.n"))


def _target_shape(t: Target) -> tuple[Any, ...]:
    """Both tables as of one moment: each is read in a transaction of its
    own, so ``k`` is read again after ``n``; the transaction changes both,
    so an unchanged ``k`` means no commit fell between the reads."""
    while True:
        k = [r[:3] for r in t.fetch_rows(DB, "k")]
        shape = _shape(k, [r[:2] for r in t.fetch_rows(DB, "n")])
        if _shape([r[:3] for r in t.fetch_rows(DB, "k")], [])[0] == shape[0]:
            return shape


def _reader(cfg: Path) -> Target:
    c = load_config(cfg, env={})
    t = open_target(c)
    if hasattr(t, "lock_wait_s"):
        t.lock_wait_s = 0.05  # type: ignore[attr-defined]  # a DuckDB reader: do not wait for the writer
    t.connect()
    return t


def _parts(log: Path) -> int:
    return log.read_text(errors="replace").count("applied part ") if log.exists() else 0


def _open_txn(state_dir: Path) -> bool:
    try:
        return json.loads((state_dir / "producer.json").read_text()).get("open") is not None
    except (OSError, ValueError):
        return False


def _applied_at(state_dir: Path) -> tuple[str, int] | None:
    try:
        d = json.loads((state_dir / "applier.json").read_text())
        return d["position"]["file"], int(d["position"]["pos"])
    except (OSError, ValueError, KeyError):
        return None


def test_a_large_transaction_in_parts_survives_kills_and_is_never_seen_in_part(
        side: Side, tmp_path: Path, redis_url: str) -> None:
    src = MariaDBServer(server_id=1).start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    reader: Target | None = None
    try:
        src.execute(f"CREATE DATABASE {DB}", f"CREATE TABLE {DB}.k (id INT PRIMARY KEY, v INT, pad VARCHAR(40))",
                    f"CREATE TABLE {DB}.n (a INT, b VARCHAR(40))")
        for lo in range(0, KEYED, 5000):  # loaded in ordinary transactions
            src.execute(f"INSERT INTO {DB}.k VALUES " + ", ".join(f"({i}, {i % 97}, 'pad-{i}')"
                                                                 for i in range(lo, lo + 5000)))
        src.execute(f"INSERT INTO {DB}.n VALUES " + ", ".join(f"({i % 50}, 'n-{i % 700}')" for i in range(KEYLESS)))
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(
            tmp_path / "c.toml", src,
            source={"include_tables": [f"{DB}.*"], "start": "earliest"},
            producer={"id": f"p-{DB}", "batch_max_events": side.batch_max_events, "batch_max_delay_ms": 100,
                      "state_dir": str(tmp_path / "producer-state")},
            transport={"url": redis_url, "stream": f"bigtxn-{tmp_path.name}"},
            security={k: str(v) for k, v in keys.items()},
            applier={"max_memory_mb": side.max_memory_mb, "max_delay_ms": 200, "consumer_name": "a1",
                     "state_dir": str(tmp_path / "applier-state")},
            target=side.target, **side.extra)
        logs = tmp_path / "logs"
        logs.mkdir()
        n = {"producer": 0, "applier": 0}

        def start(name: str) -> None:
            n[name] += 1
            procs[name] = _daemon(cfg, "produce" if name == "producer" else "apply", logs / f"{name}-{n[name]}.log")

        def end() -> tuple[str, int]:
            file, pos = src.execute("SHOW MASTER STATUS")[0][:2]
            return str(file), int(pos)

        def wait_applied(until: tuple[str, int], timeout: float = 600) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for name, p in procs.items():
                    assert p.poll() is None, f"{name} exited: " + (logs / f"{name}-{n[name]}.log").read_text()[-3000:]
                at = _applied_at(tmp_path / "applier-state")
                if at is not None and at >= until:
                    return
                time.sleep(0.1)
            raise AssertionError(f"the target did not reach {until}")

        start("producer")
        start("applier")
        wait_applied(end())
        before = _source(src)
        reader = _reader(cfg)
        assert _target_shape(reader) == before

        # The reader: every look at the target is the state before or after the transaction.
        seen: Counter[str] = Counter()
        stop = threading.Event()
        after_box: list[tuple[Any, ...]] = []
        bad: list[str] = []

        def poll() -> None:
            assert reader is not None
            while not stop.is_set():
                try:
                    got = _target_shape(reader)
                except CynomysError as exc:
                    if side.locked_reads_ok:
                        seen["locked"] += 1
                        time.sleep(0.05)
                        continue
                    bad.append(f"read failed: {exc}")
                    return
                if got == before:
                    seen["before"] += 1
                elif after_box and got == after_box[0]:
                    seen["after"] += 1
                else:
                    bad.append("the reader saw a state that is neither before nor after the transaction")
                    return
                time.sleep(0.05)

        # The producer waits (SIGSTOP) while the transaction commits and the
        # source's state after it is read: the producer is fast enough to be
        # through the whole transaction before that read ends, and the kill
        # below must find it inside.
        procs["producer"].send_signal(signal.SIGSTOP)
        src.execute(
            "BEGIN",
            f"UPDATE {DB}.k SET v = v + 1",
            f"UPDATE {DB}.k SET v = v * 2, pad = CONCAT(pad, '-2') WHERE id % 3 = 0",  # these keys change twice
            f"UPDATE {DB}.n SET b = CONCAT(b, 'x') WHERE a % 2 = 0",
            f"DELETE FROM {DB}.k WHERE id % 5 = 0",
            f"DELETE FROM {DB}.n WHERE a % 4 = 1",
            f"UPDATE {DB}.k SET v = -v WHERE id % 7 = 0",
            "COMMIT")
        after_box.append(_source(src))
        target_end = end()
        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        procs["producer"].send_signal(signal.SIGCONT)

        # Kills: the producer inside the transaction, then the applier twice with parts applied.
        plan = ["producer", "applier", "applier"]
        kills: list[str] = []
        deadline = time.monotonic() + 900
        while plan and time.monotonic() < deadline:
            name = plan[0]
            ready = _open_txn(tmp_path / "producer-state") if name == "producer" \
                else _parts(logs / f"applier-{n['applier']}.log") >= 2
            if ready:
                procs[name].send_signal(signal.SIGKILL)
                procs[name].wait()
                kills.append(name)
                plan.pop(0)
                start(name)
            at = _applied_at(tmp_path / "applier-state")
            if at is not None and at >= target_end:
                break
            time.sleep(0.01)
        assert kills == ["producer", "applier", "applier"], f"killed only {kills}: the transaction went too fast"
        wait_applied(target_end, timeout=900)
        time.sleep(0.5)
        stop.set()
        watcher.join(60)
        assert not bad, bad[0]
        assert _target_shape(reader) == after_box[0] if not side.locked_reads_ok else True
        final = _reader(cfg)
        try:
            assert _target_shape(final) == after_box[0], "the target differs from the source"
        finally:
            final.close()
        parts = sum(_parts(p) for p in logs.glob("applier-*.log"))
        assert parts >= 6, f"the transaction was applied in {parts} parts only"
        print(f"\n{side.target['kind']}: {parts} parts over {n['applier']} applier lives; reader saw {dict(seen)}")
        assert seen["before"] + seen["after"] > 0
    finally:
        if reader is not None:
            reader.close()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        src.destroy()
