"""A producer replaying MySQL binlog files whose transactions are zstd
TRANSACTION_PAYLOADs, stopped (a crash of the transport) again and again
inside them: positions and checkpoints stay on the outer events, so every
restart resumes exactly -- the envelopes of all its lives carry each row
change once, in order, as one uninterrupted run does."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from cynomys.core.config import load_config
from cynomys.core.model import Batch
from cynomys.producer import Producer
from tests import binlog_builder as B
from tests.helpers import ListSink
from tests.unit.test_mysql8_events import _payload_txn


class Crash(Exception):
    pass


class CrashingSink(ListSink):
    """Accepts envelopes until the ``crash_at``-th, which never arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_at = 0

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        if self.crash_at and len(self.batches) + 1 >= self.crash_at:
            raise Crash(f"envelope {seq} lost")
        super().send(seq, batch, stop)


def _config(tmp_path: Path, name: str) -> Any:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[source]\nbinlog_files = "archive/binlog.[0-9]*"\n'
                    f'[producer]\nstate_dir = "{name}-state"\nbatch_max_events = 100\nbatch_max_delay_ms = 600000\n')
    return load_config(path, env={})


def _shipped(sink: ListSink) -> list[tuple[str, str, Any, Any]]:
    return [(c.tid, c.op.value, c.before, c.after) for _, b in sink.batches for c in b.changes]


@pytest.mark.parametrize("crash_every", [3, 7])
def test_restarts_inside_payloads_resume_exactly(tmp_path: Path, crash_every: int) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    B.binlog_file(archive / "binlog.000001", _payload_txn(1, 0, 2000) + _payload_txn(2, 5000, 40),
                  next_file="binlog.000002")
    B.binlog_file(archive / "binlog.000002", _payload_txn(3, 9000, 1500, per_event=11))
    whole = ListSink()
    Producer(_config(tmp_path, "whole"), whole, blocking=False).run()
    assert len(_shipped(whole)) > 3000
    sink = CrashingSink()
    cfg = _config(tmp_path, "crashing")
    crashes = opened = 0
    while True:
        sink.crash_at = len(sink.batches) + crash_every
        producer = Producer(cfg, sink, blocking=False)
        try:
            producer.run()
            break
        except Crash:
            crashes += 1
            opened += producer.state.open is not None  # stopped inside a payload's transaction
    assert crashes >= 3 and opened >= 2
    assert [seq for seq, _ in sink.batches] == list(range(1, len(sink.batches) + 1))
    assert _shipped(sink) == _shipped(whole)
