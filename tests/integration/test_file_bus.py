"""The file transport (no server needed)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from cynomys.core.config import TransportConfig
from cynomys.core.errors import ConfigError, SequenceGapError
from cynomys.transport.bus import Delivery, TransportStateAltered, open_publisher, open_subscriber
from cynomys.transport.envelope import Sealer
from cynomys.transport.file_bus import CorruptTransportFile, FilePublisher, FileSubscriber
from cynomys.transport.keys import generate_keys, load_private_key, load_public_key
from cynomys.transport.sequence import SequenceTracker

PID = "producer-1"


def env(seq: int) -> bytes:
    return b"envelope-%d|" % seq + bytes(range(seq % 50))


def cfg(path: Path) -> TransportConfig:
    return TransportConfig(kind="file", path=str(path))


def test_round_trip_and_ack_persists_offset(tmp_path: Path) -> None:
    f = tmp_path / "bus.log"
    pub = open_publisher(cfg(f))
    sub = open_subscriber(cfg(f), "applier-1")
    assert sub.read(10, 30) == []  # no file yet: just waits
    sent = {s: env(s) for s in range(1, 2001)}
    def write() -> None:
        for s in range(1, 2001):
            pub.publish(PID, s, sent[s])

    writer = threading.Thread(target=write)
    writer.start()
    got: list[Delivery] = []
    while len(got) < 2000:
        batch = sub.read(300, 500)
        got += batch
        sub.ack([d.id for d in batch])
    writer.join()
    assert [d.envelope for d in got] == [sent[s] for s in range(1, 2001)]
    assert not any(d.redelivered for d in got)
    sub.close()
    assert open_subscriber(cfg(f), "applier-1").read(10, 30) == []  # all acknowledged
    assert len(open_subscriber(cfg(f), "applier-2").read(5000, 30)) == 2000  # another consumer starts at 0
    pub.close()


def test_unacked_records_come_back_redelivered(tmp_path: Path) -> None:
    f = tmp_path / "bus.log"
    pub = FilePublisher(f)
    for s in range(1, 11):
        pub.publish(PID, s, env(s))
    sub = FileSubscriber(f, "a")
    batch = sub.read(10, 100)
    sub.ack([batch[0].id, batch[1].id, batch[3].id])  # 3 is not acked: the offset stops after 2
    sub.close()
    state = json.loads((tmp_path / "bus.log.a.offset").read_text())
    assert state["offset"] == int(batch[2].id)
    again = FileSubscriber(f, "a").read(10, 100)
    assert [d.envelope for d in again] == [d.envelope for d in batch[2:]]
    assert all(d.redelivered for d in again)
    tracker = SequenceTracker({PID: 4})  # 4 was applied (and acked) before the crash
    verdicts = [tracker.classify(PID, s) for s in range(3, 6)]
    assert verdicts == ["duplicate", "duplicate", "new"]


def test_last_sequence_after_restart_and_torn_tail(tmp_path: Path) -> None:
    f = tmp_path / "bus.log"
    pub = FilePublisher(f)
    for s in range(1, 6):
        pub.publish(PID, s, env(s))
    pub.publish("producer-2", 9, env(9))
    pub.close()
    with open(f, "ab") as fh:  # a publisher died in the middle of a write
        fh.write(b"\x00\x00\x01\x00partial")
    pub = FilePublisher(f)  # restart: cuts the torn record
    assert pub.last_sequence(PID) == 5
    assert pub.last_sequence("producer-2") == 9
    pub.publish(PID, 6, env(6))
    pub.publish(PID, 4, env(4))  # idempotent
    with pytest.raises(TransportStateAltered, match="record numbered 4 holds another envelope"):
        pub.publish(PID, 4, b"stale resend")  # checked against the record: not envelope 4
    got = FileSubscriber(f, "a").read(100, 100)
    assert [d.envelope for d in got] == [env(1), env(2), env(3), env(4), env(5), env(9), env(6)]
    pub.close()


def test_subscriber_waits_for_incomplete_record_and_reports_damage(tmp_path: Path) -> None:
    f = tmp_path / "bus.log"
    pub = FilePublisher(f)
    pub.publish(PID, 1, b"one")
    pub.close()
    with open(f, "ab") as fh:
        fh.write(b"\x00\x00\x00\x40abc")  # incomplete: announced 64 bytes
    sub = FileSubscriber(f, "a")
    assert [d.envelope for d in sub.read(10, 50)] == [b"one"]
    assert sub.read(10, 50) == []
    with open(f, "r+b") as fh:
        fh.seek(12)
        fh.write(b"X")  # damage record 1 (a complete record)
    with pytest.raises(CorruptTransportFile, match="offset 0"):
        FileSubscriber(f, "b").read(10, 50)


def test_records_before_a_damaged_one_are_delivered_and_acked_before_the_error(tmp_path: Path) -> None:
    f = tmp_path / "bus.log"
    pub = FilePublisher(f)
    for s in range(1, 4):
        pub.publish(PID, s, env(s))
    pub.close()
    third = f.stat().st_size - len(env(3)) - 4 - 4  # inside record 3's envelope
    with open(f, "r+b") as fh:
        fh.seek(third)
        fh.write(b"\xff")
    sub = FileSubscriber(f, "a")
    # Before the fix, this read raised and records 1 and 2 were never seen.
    batch = sub.read(10, 50)
    assert [d.envelope for d in batch] == [env(1), env(2)]
    assert sub.read(10, 50) == []  # 1 and 2 are not committed yet: no error yet
    sub.ack([d.id for d in batch])
    with pytest.raises(CorruptTransportFile, match="damaged at offset"):
        sub.read(10, 50)
    # The offset covers 1 and 2: a restarted applier goes straight to the damage.
    with pytest.raises(CorruptTransportFile):
        FileSubscriber(f, "a").read(10, 50)


def test_dead_letter(tmp_path: Path) -> None:
    f = tmp_path / "bus.log"
    pub = FilePublisher(f)
    pub.publish(PID, 1, b"bad envelope")
    pub.publish(PID, 2, b"good envelope")
    sub = FileSubscriber(f, "a")
    bad, good = sub.read(10, 50)
    sub.dead_letter(bad, "bad-signature")
    sub.ack([good.id])
    [line] = (tmp_path / "bus.log.dead").read_text().splitlines()
    rec = json.loads(line)
    assert bytes.fromhex(rec["env"]) == b"bad envelope" and rec["reason"] == "bad-signature"
    assert FileSubscriber(f, "a").read(10, 50) == []


def test_gap_detected_by_tracker(tmp_path: Path) -> None:
    f = tmp_path / "bus.log"
    pub = FilePublisher(f)
    for s in (1, 2, 5):
        pub.publish(PID, s, b"%d" % s)
    tracker = SequenceTracker()
    with pytest.raises(SequenceGapError, match=r"envelopes 3\.\.4 from producer-1"):
        for d in FileSubscriber(f, "a").read(10, 50):
            s = int(d.envelope)
            tracker.classify(PID, s)
            tracker.advance(PID, s)


def test_file_kind_needs_a_path() -> None:
    with pytest.raises(ConfigError, match=r"\[transport\] path"):
        open_publisher(TransportConfig(kind="file"))


def test_a_record_planted_with_a_higher_seq_is_terminal(tmp_path: Path) -> None:
    """Another writer appends a record numbered 1000 for our producer: every
    later envelope used to count as "already there" and vanish."""
    f = tmp_path / "bus.log"
    pub = FilePublisher(f)
    for s in range(1, 4):
        pub.publish(PID, s, env(s))
    FilePublisher(f).publish(PID, 1000, b"planted")
    with pytest.raises(TransportStateAltered) as ei:
        pub.publish(PID, 4, env(4))
    assert not ei.value.transient
    assert f"transport file {f}" in ei.value.message and "up to 1000" in ei.value.message
    assert "no record numbered 4 (the highest below is 3)" in ei.value.message
    assert [d.envelope for d in FileSubscriber(f, "a").read(100, 100)] == [env(1), env(2), env(3), b"planted"]
    pub.close()


def test_a_resealed_envelope_is_accepted_as_the_record_it_repeats(tmp_path: Path) -> None:
    """After a crash the producer re-seals the same batch (a fresh data key:
    other bytes); the record naming the same producer, stream and seq is it."""
    keys = generate_keys(tmp_path / "keys", rsa_bits=2048)

    def sealer() -> Sealer:
        return Sealer(PID, "cynomys", load_public_key(keys["applier_public_key"]),
                      load_private_key(keys["producer_private_key"]), rotate_envelopes=10, rotate_seconds=60)

    f = tmp_path / "bus.log"
    first = sealer()
    sent = [first.seal(b"batch %d" % s, s) for s in range(1, 4)]
    pub = FilePublisher(f)
    for s, e in enumerate(sent, 1):
        pub.publish(PID, s, e)
    pub.close()
    again = FilePublisher(f)
    resealed = sealer().seal(b"batch 3", 3)
    assert resealed != sent[2]
    again.publish(PID, 3, resealed)
    with pytest.raises(TransportStateAltered):  # a header naming seq 2 is not envelope 3
        again.publish(PID, 3, sealer().seal(b"batch 3", 2))
    assert [d.envelope for d in FileSubscriber(f, "a").read(100, 100)] == sent
    again.close()
