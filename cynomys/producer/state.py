"""What the producer persists, and where: ``state_dir/producer.json`` for one
producer, or Redis next to the stream for HA producers (producer/ha.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cynomys.core import compiled
from cynomys.core.checkpoint import read_json, write_json_atomic
from cynomys.core.model import Position


@dataclass
class ProducerState:
    """What ``state_dir/producer.json`` holds."""

    checkpoint: Position | None = None
    seq: int = 0
    # The batch being published: written *before* publish, so after a crash
    # we can ask the transport whether it got there and, if so, resume right
    # after it.  Resuming exactly at a batch end keeps every batch boundary
    # the applier has seen intact: a re-read never re-folds changes already
    # applied together with new ones.
    pending: dict[str, Any] | None = None
    # The source transaction cut into fragments and partly shipped, or None:
    # {"tid", "begin" (position dict), "shipped" (its changes already in
    # accepted envelopes), "frag" (the next fragment's number)}.
    open: dict[str, Any] | None = None
    # Random id of this producer's life since its state was created: a
    # producer that lost its state is a new incarnation (the applier refuses
    # a new incarnation that numbers its envelopes from 1 again).
    incarnation: str = ""
    # The source server the checkpoint's file:pos belongs to
    # (SourceInspector.server_identity): positions of two servers are never
    # compared; after a failover the producer resumes by GTID.
    server: str = ""
    # The newest HA fencing token this producer worked under: a lease term
    # with a lower one means the fencing counter in Redis went backwards.
    fence: int = 0
    term: str = ""                      # the lease value ("token:owner") of that term
    read: Position | None = None        # last position read (for status)
    last_event_ts: int = 0              # source time of the last event read
    updated: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ProducerState:
        return cls.from_dict(read_json(path))

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ProducerState:
        if d is None:
            return cls()
        return cls(
            checkpoint=Position.from_dict(d["checkpoint"]) if d.get("checkpoint") else None,
            seq=int(d.get("seq", 0)), pending=d.get("pending"), open=d.get("open"),
            incarnation=str(d.get("incarnation", "")), server=str(d.get("server", "")),
            fence=int(d.get("fence", 0)), term=str(d.get("term", "")),
            read=Position.from_dict(d["read"]) if d.get("read") else None,
            last_event_ts=int(d.get("last_event_ts", 0)), updated=float(d.get("updated", 0)),
            stats=dict(d.get("stats", {})),
        )

    def save(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None, "seq": self.seq,
            "pending": self.pending, "open": self.open, "incarnation": self.incarnation,
            "server": self.server, "fence": self.fence, "term": self.term,
            "read": self.read.to_dict() if self.read else None, "last_event_ts": self.last_event_ts,
            "updated": time.time(), "stats": self.stats, "hot_path": compiled.status(),
        }


class StateStore(Protocol):
    """Where the producer's state lives: ``state_dir/producer.json`` (one
    producer), or Redis next to the stream (HA producers, cynomys/producer/ha.py)."""

    def load(self) -> ProducerState: ...

    def save(self, state: ProducerState) -> None:
        """Durably; raise (never return) when the state could not be written."""

    def describe(self) -> str:
        """Where the state is (for error messages)."""


class FileStateStore:
    """``state_dir/producer.json``, written atomically (tmp + fsync + rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> ProducerState:
        return ProducerState.load(self.path)

    def save(self, state: ProducerState) -> None:
        state.save(self.path)

    def describe(self) -> str:
        return str(self.path)
