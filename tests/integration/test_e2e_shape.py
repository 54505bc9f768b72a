"""End to end with [shape]: 4 sharded source databases (identical tables,
overlapping keys) written by 4 writers while the producer and the applier
are killed with SIGKILL, routed by one rule into one DuckDB database:

* ``shop_N.orders`` -> ``merged.orders``: the union of the shards, each row
  with its source database and table (an ALTER runs shard by shard in the
  middle: flushes hold both shapes);
* ``shop_N.customers`` -> ``merged.customers``, keyed by a hashed e-mail,
  the name hashed, the phone redacted, only tenants < 3 (rows move in and
  out): the shaped union; none of the plain values is in any envelope's
  decrypted payload nor in the target file, and updates and deletes by the
  hashed key land;
* ``shop_N.events`` -> ``merged.events`` in mode ``history``: the changelog
  replayed in (binlog file, position, number) order rebuilds every shard's
  table, and it holds exactly the row changes the binlog holds (decoded
  from the source's binlog files) -- none lost, none twice.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import random
import signal
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cynomys.core.config import load_config
from cynomys.core.model import Change, Op
from cynomys.transport.keys import generate_keys
from tests.helpers import duckdb_reader, transport_envelopes, wait_for, write_config
from tests.integration.test_e2e_columnstore import OneProducer, _kill, _reports_caught_up, _start_applier, _write_loop
from tests.servers.mariadb import MariaDBServer

duckdb = pytest.importorskip("duckdb", reason="the duckdb extra is not installed (pip install 'cynomys[duckdb]')")
from cynomys.applier.targets.duckdb.target import DuckDBTarget  # noqa: E402  (needs duckdb)
from cynomys.applier.targets.duckdb.types import duck_type  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHARDS = [f"shop_{i}" for i in range(4)]
TABLES = {
    "orders": "id INT PRIMARY KEY, cust INT, amount DECIMAL(12,2), note VARCHAR(40)",
    "customers": "email VARCHAR(80) PRIMARY KEY, name VARCHAR(40), phone VARCHAR(20), tenant INT",
    "events": "id INT PRIMARY KEY, v INT, tag VARCHAR(10)",
}
MASK_KEY = "e2e-shape-mask-key-0123456789"
SHAPE = {
    "mask_key": MASK_KEY,
    "route": [{"source": "shop_*.*", "target": "merged.\\2"}],
    "tables": {"shop_*.customers": {"mask": {"email": "hash", "name": "hash:12", "phone": "null"},
                                    "filter": "tenant < 3"}},
    "targets": {"merged.events": {"mode": "history"}},
}
UTC = datetime.timezone.utc


def _h(v: str, n: int = 64) -> str:
    return hmac.new(MASK_KEY.encode(), v.encode(), hashlib.sha256).hexdigest()[:n]


class Plain:
    """Every plain value of a masked column the writers wrote."""

    def __init__(self) -> None:
        self.values: set[str] = set()
        self.lock = threading.Lock()

    def add(self, *values: str) -> None:
        with self.lock:
            self.values.update(values)


def _shard_txn(plain: Plain) -> Any:
    def txn(cur: Any, rnd: random.Random, seed: int) -> None:
        for db in rnd.sample(SHARDS, rnd.choice((1, 1, 1, 2))):  # now and then one transaction over two shards
            k = rnd.randrange(60)  # the same keys in every shard
            r = rnd.random()
            if r < 0.3:
                cur.execute(f"INSERT INTO {db}.orders (id, cust, amount, note) VALUES (%s, %s, %s, %s) "
                            "ON DUPLICATE KEY UPDATE amount = amount + 1", (k, k % 7, rnd.randrange(10**5) / 100, f"n{seed}"))
            elif r < 0.4:
                cur.execute(f"UPDATE {db}.orders SET id = id + 100 WHERE id = %s", (k,))
            elif r < 0.5:
                cur.execute(f"DELETE FROM {db}.orders WHERE id = %s", (k,))
            elif r < 0.7:
                email, name, phone = f"c{k}@{db}.example", f"Name{k}-{seed}", f"+49-{k:04d}-{seed}"
                plain.add(email, name, phone)
                cur.execute(f"INSERT INTO {db}.customers VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                            "name = VALUES(name), phone = VALUES(phone), tenant = %s",
                            (email, name, phone, rnd.randrange(5), rnd.randrange(5)))
            elif r < 0.78:
                cur.execute(f"DELETE FROM {db}.customers WHERE email = %s", (f"c{k}@{db}.example",))
            else:
                cur.execute(f"INSERT INTO {db}.events VALUES (%s, 1, %s) ON DUPLICATE KEY UPDATE v = v + 1",
                            (k, f"t{seed}"))
                if rnd.random() < 0.3:
                    cur.execute(f"UPDATE {db}.events SET id = id + 100, tag = 'moved' WHERE id = %s", (rnd.randrange(60),))
                if rnd.random() < 0.3:
                    cur.execute(f"DELETE FROM {db}.events WHERE id = %s", (rnd.randrange(160),))
    return txn


# --------------------------------------------------------------------------
# Reading both sides
# --------------------------------------------------------------------------
def _norm(v: Any) -> Any:
    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        return v.astimezone(UTC).replace(tzinfo=None)
    return v


def _target(path: Path) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]] | None:
    """merged.<table> -> (column names, rows), read as an analyst would; None
    while the applier holds the file (``duckdb_reader``)."""
    conn = duckdb_reader(path)
    if conn is None:
        return None
    try:
        out = {}
        for table in TABLES:
            cols = DuckDBTarget.columns(conn, "merged", table)
            types = [duck_type(c) for c in cols]
            exprs = ", ".join(t.select.format(c='"' + c.name + '"') for t, c in zip(types, cols))
            rows = conn.execute(f'SELECT {exprs} FROM "merged"."{table}"').fetchall() if cols else []
            out[table] = ([c.name for c in cols],
                          [tuple(_norm(None if v is None else t.decode(v)) for t, v in zip(types, r)) for r in rows])
        return out
    finally:
        conn.close()


def _source(src: MariaDBServer, table: str, cols: list[str]) -> list[tuple[Any, ...]]:
    """The union of the shards as the target should hold it (``cols`` the target's names)."""
    out = []
    for db in SHARDS:
        names = [c[0] for c in src.execute(f"SHOW COLUMNS FROM {db}.{table}")]
        for row in src.execute(f"SELECT * FROM {db}.{table}"):
            by = dict(zip(names, row))
            if table == "customers":
                if by["tenant"] is None or by["tenant"] >= 3:
                    continue
                by = {**by, "email": _h(by["email"]), "name": None if by["name"] is None else _h(by["name"], 12),
                      "phone": None}
            by.update(source_db=db, source_table=table)
            out.append(tuple(_norm(by.get(c)) for c in cols))
    return sorted(out, key=repr)


def _replayed(log: tuple[list[str], list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """The changelog replayed in (file, position, number) order: the table it rebuilds."""
    names, rows = log
    at = {n: i for i, n in enumerate(names)}
    data = [n for n in names if not n.startswith("_cdc_")]
    table: dict[Any, tuple[Any, ...]] = {}

    def key(image: tuple[Any, ...]) -> tuple[Any, ...]:
        return image[:3]  # source_db, source_table, id

    for r in sorted(rows, key=lambda r: (r[at["_cdc_binlog_file"]], r[at["_cdc_binlog_pos"]], r[at["_cdc_seq"]])):
        image = tuple(r[at[n]] for n in data)
        before = tuple(r[at["_cdc_before_" + n]] for n in data)
        op = r[at["_cdc_op"]]
        if op in ("UPDATE", "DELETE"):
            assert table.pop(key(before), None) == before, f"the changelog removes a row it never held: {before}"
        if op != "DELETE":
            assert key(image) not in table, f"the changelog inserts a row twice: {image}"
            table[key(image)] = image
    return sorted(table.values(), key=repr)


def _diff(src: MariaDBServer, path: Path) -> dict[str, Any]:
    target = _target(path)
    if target is None:
        return {"file": "held by the applier"}
    out: dict[str, Any] = {}
    for table in ("orders", "customers"):
        cols, rows = target[table]
        want = _source(src, table, cols) if cols else []
        got = sorted(rows, key=repr)
        out[table] = None if got == want else {"source": len(want), "target": len(got),
                                               "only_source": [r for r in want if r not in got][:2],
                                               "only_target": [r for r in got if r not in want][:2]}
    names, _ = target["events"]
    data = [n for n in names if not n.startswith("_cdc_")]
    want, got = (_source(src, "events", data), _replayed(target["events"])) if names else ([], [])
    out["events"] = None if got == want else {"source": len(want), "replayed": len(got)}
    return out


def _binlog_changes(src: MariaDBServer, start: tuple[str, int]) -> Counter[tuple[Any, ...]]:
    """Every row change of shop_N.events in the source's binlog files since the test began."""
    from cynomys.cli.decode import decode

    src.execute("FLUSH BINARY LOGS")
    names = [str(r[0]) for r in src.execute("SHOW BINARY LOGS")]
    files = [str(src.datadir / n) for n in names[names.index(start[0]):-1]]
    held: Counter[tuple[Any, ...]] = Counter()
    for item in decode(files, start[1]):
        if isinstance(item, Change) and item.op is not Op.DDL and item.table == "events" and item.database in SHARDS:
            shard = (item.database, "events")
            before = shard + item.before if item.before is not None else None
            after = shard + item.after if item.after is not None else None
            held[(item.op.value, item.tid, before, after)] += 1
    return held


def _changelog(log: tuple[list[str], list[tuple[Any, ...]]]) -> Counter[tuple[Any, ...]]:
    names, rows = log
    at = {n: i for i, n in enumerate(names)}
    data = [n for n in names if not n.startswith("_cdc_")]
    out: Counter[tuple[Any, ...]] = Counter()
    for r in rows:
        op = r[at["_cdc_op"]]
        image = tuple(r[at[n]] for n in data)
        before = tuple(r[at["_cdc_before_" + n]] for n in data)
        out[(op, r[at["_cdc_txn"]], before if op in ("UPDATE", "DELETE") else None,
             image if op != "DELETE" else None)] += 1
    return out


def _payloads(cfg_path: Path) -> list[bytes]:
    """Every envelope's payload on the transport, decrypted (Avro bytes)."""
    return [o.payload for o in transport_envelopes(load_config(cfg_path, env={}))]


# --------------------------------------------------------------------------
def test_sharded_sources_merged_masked_and_logged_through_sigkills(tmp_path: Path, redis_url: str) -> None:
    src = MariaDBServer(server_id=1).start()
    replica = tmp_path / "replica.duckdb"
    apps: dict[str, Any] = {}
    prods: Any = None
    try:
        start = tuple(src.execute("SHOW MASTER STATUS")[0][:2])
        keys = generate_keys(tmp_path / "keys", rsa_bits=2048)
        cfg = write_config(
            tmp_path / "c.toml", src,
            source={"include_tables": ["shop_*.*"], "start": "{}:{}".format(*start)},
            producer={"id": "p1", "batch_max_events": 300, "batch_max_delay_ms": 100},
            transport={"url": redis_url, "stream": f"e2e-{tmp_path.name}"},
            security={k: str(v) for k, v in keys.items()},
            applier={"buffer_rows": 2000, "max_delay_ms": 300, "consumer_name": "a1"},
            target={"kind": "duckdb", "url": str(replica)}, shape=SHAPE)
        logs = tmp_path / "logs"
        logs.mkdir()
        prods = OneProducer(cfg, logs, redis_url)
        apps["applier"] = _start_applier(cfg, "applier", logs)
        for db in SHARDS:
            src.execute(f"CREATE DATABASE {db}", *[f"CREATE TABLE {db}.{t} ({c})" for t, c in TABLES.items()])
        plain, stop, done, errors = Plain(), threading.Event(), [0], []
        writers = [threading.Thread(target=_write_loop, args=(src, stop, s, done, errors, _shard_txn(plain), None))
                   for s in range(4)]
        for w in writers:
            w.start()
        rnd = random.Random(5)
        kills = ["producer", "applier"] * 3
        try:
            for i, name in enumerate(kills):
                time.sleep(rnd.uniform(2.0, 5.0))
                if i == 2:  # an ALTER shard after shard, writes going on: shapes mix in the merged table
                    for db in SHARDS:
                        src.execute(f"ALTER TABLE {db}.orders ADD COLUMN region CHAR(2) NOT NULL DEFAULT 'eu'")
                        time.sleep(0.5)
                _kill(name, prods, apps, cfg, logs)
        finally:
            stop.set()
            for w in writers:
                w.join()
        assert not errors, errors
        assert done[0] > 200, "the workload did not run"

        def caught_up() -> bool:
            prods.check()
            assert apps["applier"].poll() is None, (logs / "applier.log").read_text()[-3000:]
            if not _reports_caught_up(tmp_path, src):
                time.sleep(0.5)
                return False
            time.sleep(1.0)
            return not any(_diff(src, replica).values())

        try:
            wait_for(caught_up, timeout=300, what="the merged tables to equal the shards")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_diff(src, replica)}\nproducer:\n{prods.log_tail()}\napplier:\n"
                                 f"{(logs / 'applier.log').read_text()[-4000:]}") from None
        for p in [*prods.procs(), *apps.values()]:
            p.send_signal(signal.SIGTERM)
        for p in [*prods.procs(), *apps.values()]:
            assert p.wait(120) == 0
        target = _target(replica)
        assert target is not None
        # The merged orders: both shapes, the region filled for rows before each shard's ALTER.
        cols, rows = target["orders"]
        assert cols[:3] == ["source_db", "source_table", "id"] and "region" in cols
        assert {r[0] for r in rows} == set(SHARDS) and all(r[cols.index("region")] == "eu" for r in rows)
        assert any(isinstance(r[cols.index("amount")], Decimal) for r in rows)
        # Masking: no plain value in any envelope, nor in the target file.
        payloads = _payloads(cfg)
        assert payloads and plain.values
        blob = replica.read_bytes()
        for value in plain.values:
            raw = value.encode()
            assert not any(raw in p for p in payloads), f"{value!r} travelled in an envelope"
            assert raw not in blob, f"{value!r} is in the target file"
        # History: the changelog is the binlog's changes, each once.
        held, logged = _binlog_changes(src, (str(start[0]), int(start[1]))), _changelog(target["events"])
        assert held == logged, (f"binlog {sum(held.values())} changes, changelog {sum(logged.values())}: "
                                f"missing {list((held - logged).elements())[:3]}, extra {list((logged - held).elements())[:3]}")
        print(f"\n{done[0]} source transactions over {len(SHARDS)} shards, kills {kills}; merged orders "
              f"{len(rows)} rows, customers {len(target['customers'][1])}, changelog {sum(logged.values())} changes; "
              f"{len(payloads)} envelopes searched for {len(plain.values)} plain values")
    finally:
        for p in [*(prods.procs() if prods is not None else []), *apps.values()]:
            if p.poll() is None:
                p.kill()
        src.destroy()
