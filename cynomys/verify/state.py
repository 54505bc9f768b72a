"""Verify jobs as the producer persists them, and requests to the producer.

``<producer state_dir>/verify.json`` holds every running job and the last
finished ones: per task (a table, or a key range to repair) the end of the
last chunk the producer's checkpoint has passed, so a producer restarted
after a crash reads a chunk again rather than lose it, and every chunk the
checkpoint has passed (the applier's results name them).  Requests (start,
repair, cancel) are files in ``<producer state_dir>/verify-requests/``,
written by `cynomys verify`; the store is the snapshot's (snapshot/state.py).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cynomys.core.config import Config
from cynomys.snapshot.state import JobStore, TablePart, settled

STATE_FILE = "verify.json"
REQUEST_DIR = "verify-requests"
RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"


@dataclass(frozen=True)
class VerifyTask(TablePart):
    """One table of a verify job, or one range of a repair job."""

    repair: bool = False
    lo: list[Any] | None = None        # encoded key: the next chunk starts after it
    hi: list[Any] | None = None        # repair: where the range ends (None: the table's end)
    chunks: int = 0
    rows: int = 0
    done: bool = False
    error: str = ""
    estimate: int = 0
    # Repair chunks shipped since the checkpoint last passed one of this
    # task's (persisted before each is handed to the producer).
    attempts: int = 0

    @property
    def over(self) -> bool:
        return self.done or bool(self.error)

    @property
    def failed(self) -> bool:
        return bool(self.error)

    @property
    def after(self) -> list[Any] | None:
        return self.lo


@dataclass(frozen=True)
class VerifyJob:
    id: str
    status: str
    tasks: tuple[VerifyTask, ...] = ()
    chunk_size: int = 0
    # Every chunk the checkpoint has passed: {"id", "table", "range"}; the
    # applier's results name them, so `cynomys verify` knows what to wait for.
    chunks: tuple[dict[str, Any], ...] = ()
    repair_of: str = ""
    created: float = 0.0
    finished: float = 0.0
    error: str = ""

    @property
    def active(self) -> bool:
        return self.status == RUNNING

    @property
    def parts(self) -> tuple[VerifyTask, ...]:
        return self.tasks

    def with_task(self, i: int, task: VerifyTask) -> VerifyJob:
        return replace(self, tasks=(*self.tasks[:i], task, *self.tasks[i + 1:]))

    def failing(self, i: int, reason: str) -> VerifyJob:
        return self.with_task(i, replace(self.tasks[i], error=reason)).settle()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VerifyJob:
        return cls(**{**d, "tasks": tuple(VerifyTask(**t) for t in d.get("tasks", ())),
                      "chunks": tuple(d.get("chunks", ()))})

    def settle(self) -> VerifyJob:
        end = settled(self.tasks) if self.active else None
        return self if end is None else replace(self, status=end[0], finished=time.time(), error=end[1])


class VerifyStore(JobStore[VerifyJob]):
    """verify.json and verify-requests/."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir, STATE_FILE, REQUEST_DIR, VerifyJob.from_dict)


def store_for(cfg: Config) -> VerifyStore:
    return VerifyStore(cfg.resolve(cfg.producer.state_dir))


def new_job_id() -> str:
    return "v" + time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
