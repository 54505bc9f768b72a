"""HA producer pieces that need no server: config, the fenced envelope
header, the per-term replica id, the renewer's decisions (fake lease)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cynomys.core.config import load_config
from cynomys.core.errors import ConfigError, EnvelopeRejected, TransportUnavailableError
from cynomys.producer.ha import SERVER_IDS_PER_PRODUCER, _Term, run_ha, term_config
from cynomys.transport.envelope import VERSION, VERSION_FENCED, peek_header
from tests.unit.test_envelope import Keys, flip, keys, opener, payload, sealer  # noqa: F401 (keys: a fixture)


def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_ha_config_defaults_and_validation(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, ""), env={})
    assert (cfg.producer.ha, cfg.producer.lease_ms) == (False, 5000)
    cfg = load_config(_cfg(tmp_path, "[producer]\nha = true\nlease_ms = 2000\n"), env={})
    assert (cfg.producer.ha, cfg.producer.lease_ms) == (True, 2000)
    with pytest.raises(ConfigError, match=r"\[producer\] lease_ms .*at least 300"):
        load_config(_cfg(tmp_path, "[producer]\nlease_ms = 100\n"), env={})
    with pytest.raises(ConfigError, match=r"\[producer\] ha .*expected true or false"):
        load_config(_cfg(tmp_path, "[producer]\nha = 'yes'\n"), env={})


def test_ha_needs_the_redis_transport(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "[producer]\nha = true\n[transport]\nkind = 'file'\npath = 't.bin'\n"), env={})
    with pytest.raises(ConfigError, match=r"ha = true needs \[transport\] kind = \"redis\""):
        run_ha(cfg, None, threading.Event(), None)  # type: ignore[arg-type]


def test_envelope_carries_the_fencing_token_signed(keys: Keys) -> None:  # noqa: F811 (the fixture)
    s, o = sealer(keys), opener(keys)
    plain, fenced = s.seal(payload(), 1), s.seal(payload(), 2, fence=7)
    assert (peek_header(plain).version, peek_header(plain).fence) == (VERSION, 0)  # older appliers read it
    got = o.open(fenced)
    assert (got.version, got.fence, got.seq, got.payload) == (VERSION_FENCED, 7, 2, payload())
    assert got.header == peek_header(fenced)
    # The token is in the signed header: changing it breaks the signature.
    at = fenced.index((7).to_bytes(8, "big"), 0, 200) + 7
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(flip(fenced, at))
    assert ei.value.reason == "bad-signature"


def test_each_term_reads_the_binlog_under_its_own_replica_id(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "[source]\nserver_id = 100\n[producer]\nha = true\n"), env={})
    ids = [term_config(cfg, t).source.server_id for t in range(1, 4)]
    assert ids == [101, 102, 103] and len(set(ids)) == 3
    assert term_config(cfg, SERVER_IDS_PER_PRODUCER).source.server_id == 100
    assert term_config(cfg, 5).producer == cfg.producer


class FakeLease:
    """Pure logic: what renew() answers, in order (an exception is raised)."""

    key = "s:lease:p"
    token = 3

    def __init__(self, lease_ms: int, answers: list[object]) -> None:
        self.lease_ms = lease_ms
        self.answers = answers
        self.calls = 0

    def renew(self) -> bool:
        self.calls += 1
        a = self.answers.pop(0) if self.answers else True
        if isinstance(a, BaseException):
            raise a
        return bool(a)


def test_renewer_stops_the_term_when_the_lease_is_taken() -> None:
    lease = FakeLease(300, [True, False])
    term = _Term(lease, threading.Event())  # type: ignore[arg-type]
    try:
        assert term.halt.wait(3) and term.lost.is_set()
        assert "another producer" in term.reason and lease.calls == 2
    finally:
        term.close()


def test_renewer_gives_up_after_a_whole_lease_without_redis() -> None:
    down = TransportUnavailableError("Redis at redis://x unavailable")
    lease = FakeLease(300, [down] * 100)
    term = _Term(lease, threading.Event())  # type: ignore[arg-type]
    t0 = time.monotonic()
    try:
        assert term.halt.wait(3) and term.lost.is_set()
        assert "not renewed for 300 ms" in term.reason
        assert 0.25 <= time.monotonic() - t0 < 1.5
    finally:
        term.close()


def test_renewer_ends_the_term_on_the_daemons_stop_without_losing_it() -> None:
    stop = threading.Event()
    term = _Term(FakeLease(600, []), stop)  # type: ignore[arg-type]
    try:
        time.sleep(0.5)
        assert not term.halt.is_set()  # renewed, still leading
        stop.set()
        assert term.halt.wait(1) and not term.lost.is_set()
    finally:
        term.close()
