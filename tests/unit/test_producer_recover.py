"""A fresh producer killed between publishing its first envelope (the
announcement of its incarnation) and recording it accepted: its state holds
that envelope as ``pending``, which settles it at the next start -- it is not
a lost state (the refusal that names `--fresh-start` is for those)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cynomys.core.config import Config, ProducerConfig
from cynomys.core.errors import TerminalError
from cynomys.core.model import Batch, Position
from cynomys.producer import FileStateStore, Producer, ProducerState


class HoldsOne:
    """A transport that holds envelope 1 of this producer."""

    fence_token = 0
    fence_term = ""
    bytes_sent = 0

    def fence_holds(self) -> bool:
        return True

    def last_sequence(self) -> int:
        return 1

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        raise AssertionError("nothing is sent while recovering")

    def describe(self) -> str:
        return "a transport holding envelope 1"


def _producer(tmp_path: Path, state: ProducerState) -> Producer:
    store = FileStateStore(tmp_path / "producer.json")
    store.save(state)
    return Producer(Config(producer=ProducerConfig(state_dir=str(tmp_path))), HoldsOne(), store=store)


def test_the_first_envelope_in_flight_settles(tmp_path: Path) -> None:
    start = Position("mysql-bin.000001", 4)
    p = _producer(tmp_path, ProducerState(incarnation="i1", pending={"seq": 1, "checkpoint": start.to_dict(),
                                                                     "open": None}))
    p._recover_pending()
    assert p.state.seq == 1 and p.state.checkpoint == start and p.state.pending is None


def test_a_lost_state_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(TerminalError, match="is empty, but the transport"):
        _producer(tmp_path, ProducerState())._recover_pending()
