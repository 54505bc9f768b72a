"""Helpers shared by integration tests: configs, sinks, source-side reads."""
from __future__ import annotations

import dataclasses
import datetime as dt
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from cynomys.applier.batcher import Mark, Span
from cynomys.core.config import Config
from cynomys.core.model import Batch, Change, ColumnDef, RawTemporal, Row, Value
from cynomys.schemas import codec
from cynomys.transport.bus import Delivery, Subscriber, open_subscriber
from cynomys.transport.envelope import Opened, Opener
from cynomys.transport.keys import load_private_key, load_public_key
from tests.servers.mariadb import REPL_PASSWORD, REPL_USER, MariaDBServer


def write_config(path: Path, server: MariaDBServer, **sections: dict[str, Any]) -> Path:
    """A TOML config for ``server`` with extra keys per section."""
    data: dict[str, dict[str, Any]] = {
        "source": {"host": "127.0.0.1", "port": server.port, "user": REPL_USER, "password": REPL_PASSWORD,
                   "start": "earliest", "heartbeat_s": 0.5},
        "producer": {"state_dir": str(path.parent / "producer-state")},
        "applier": {"state_dir": str(path.parent / "applier-state")},
    }
    for name, keys in sections.items():
        data.setdefault(name.replace("__", "."), {}).update(keys)
    lines: list[str] = []
    for name, keys in data.items():
        lines.append(f"[{name}]")
        for k, v in keys.items():
            lines.append(f"{k} = {_toml(v)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml(x)}' for k, x in v.items()) + " }"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


class ListSink:
    """A BatchSink keeping batches in memory, through the real Avro codec."""

    fence_token = 0  # no HA lease
    fence_term = ""
    bytes_sent = 0

    def fence_holds(self) -> bool:
        return True

    def __init__(self) -> None:
        self.batches: list[tuple[int, Batch]] = []

    def last_sequence(self) -> int:
        return self.batches[-1][0] if self.batches else 0

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        self.batches.append((seq, codec.decode(codec.encode(batch))))

    def describe(self) -> str:
        return "a list in memory"

    def changes(self) -> list[Any]:
        return [c for _, b in self.batches for c in b.changes]


def normalize(col: ColumnDef, v: Any) -> Value:
    """A value as pymysql returns it -> the core.model value domain."""
    if v is None:
        return None
    base = col.base_type
    if isinstance(v, str) and base in ("date", "datetime", "timestamp") and (v.startswith("0000") or "-00" in v):
        return RawTemporal(v)
    if base == "timestamp" and isinstance(v, dt.datetime):
        return v.replace(tzinfo=dt.timezone.utc)  # the sessions run in UTC
    if base == "bit" and isinstance(v, bytes):
        return int.from_bytes(v, "big")
    if base == "float" and isinstance(v, float):
        return struct.unpack("<f", struct.pack("<f", v))[0]
    if base in ("binary", "varbinary", "blob", "tinyblob", "mediumblob", "longblob") and isinstance(v, str):
        return v.encode()
    return v


def source_rows(server: MariaDBServer, db: str, table: str, cols: tuple[ColumnDef, ...], order: str) -> list[Row]:
    raw = server.execute(f"SELECT * FROM `{db}`.`{table}` ORDER BY {order}")
    return [tuple(normalize(c, v) for c, v in zip(cols, row)) for row in raw]


def sorted_source_rows(server: MariaDBServer, db: str, table: str) -> list[Row]:
    """Every row of ``db.table`` on the source (columns as the source
    describes them now), in the core.model value domain, sorted by repr."""
    cols = tuple(ColumnDef(n, ty, nl == "YES") for n, ty, nl in server.execute(
        "SELECT column_name, column_type, is_nullable FROM information_schema.columns "
        f"WHERE table_schema = '{db}' AND table_name = '{table}' ORDER BY ordinal_position"))
    return sorted(source_rows(server, db, table, cols, "1"), key=repr)


def produce_to_end(cfg: Config) -> None:
    """Run the producer in this process to the source's binlog end, into
    the configured transport (sealed), and close its sink."""
    from cynomys.producer import Producer
    from cynomys.transport.channel import SealedSink

    sink = SealedSink(cfg)
    try:
        Producer(cfg, sink, blocking=False).run()
    finally:
        sink.close()


def wait_for(cond: Callable[[], bool], timeout: float = 60.0, what: str | Callable[[], str] = "condition") -> None:
    """``what`` names the wait in the failure; a callable is asked at the
    timeout (an f-string shows the state when the wait began, not when it
    gave up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")


def transport_envelopes(cfg: Config) -> list[Opened]:
    """Every envelope on the configured transport, opened, in order (a
    reader of its own, so the applier's position is not touched)."""
    opener = Opener(load_private_key(cfg.security.applier_private_key),
                    {cfg.producer.id: load_public_key(cfg.security.producer_public_key)}, cfg.transport.stream)
    # A consumer group of its own: in the applier's group the entries read
    # here would be pending for this reader instead of the applier.
    name = f"verifier-{uuid.uuid4().hex[:6]}"
    sub = open_subscriber(dataclasses.replace(cfg.transport, consumer_group=name), name)
    out: list[Opened] = []
    try:
        while True:
            got = sub.read(500, 200)
            if not got:
                return out
            out += [opener.open(d.envelope) for d in got]
    finally:
        sub.close()


def transport_batches(cfg: Config) -> list[tuple[int, Batch]]:
    """Every batch on the configured transport, opened and decoded, in order."""
    return [(o.seq, codec.decode(o.payload)) for o in transport_envelopes(cfg)]


def whole_transactions(batches: list[tuple[int, Batch]]) -> Iterator[tuple[int, list[Change]]]:
    """The changes of each complete source transaction in stream order, with
    the sequence number of the envelope that completed it (a transaction in
    fragments spans several).  Checks on the way that the sequence numbers
    have no gap and that nothing is ever sent twice: each envelope starts
    where the one before it stopped, or later (never a restarted attempt)."""
    pending: list[Batch] = []
    stop: Mark | None = None
    last_seq = 0
    for seq, b in batches:
        assert seq == last_seq + 1, f"sequence jumps from {last_seq} to {seq}"
        last_seq = seq
        span = Span.of(b)
        assert span is not None
        assert stop is None or span.start >= stop, f"envelope {seq} sends again from {span.describe_start()}"
        stop = span.stop
        pending.append(b)
        if b.complete:
            yield seq, [c for part in pending for c in part.changes]
            pending = []


def duckdb_reader(path: Path, wait_s: float = 5.0) -> Any:
    """A read-only connection to the DuckDB file ``path``, tried for up to
    ``wait_s`` as a reader polling it would (the applier holds the file only
    while it flushes, and a loaded machine flushes back to back); None if
    it stayed held."""
    import duckdb

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return duckdb.connect(str(path), read_only=True)
        except duckdb.Error:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


class SubscriberProxy:
    """A real subscriber passed through: tests override what they watch or break."""

    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub

    def read(self, count: int, block_ms: int) -> list[Delivery]:
        return self.sub.read(count, block_ms)

    def ack(self, ids: Sequence[str]) -> None:
        self.sub.ack(ids)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.sub.dead_letter(delivery, reason)

    def close(self) -> None:
        self.sub.close()
