"""The Redis transport against a real redis-server (no mocks)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from cynomys.core.config import TransportConfig
from cynomys.core.errors import ConfigError, EnvelopeRejected, SequenceGapError, TransportUnavailableError
from cynomys.transport.bus import Delivery, Publisher, Subscriber, open_publisher, open_subscriber
from cynomys.transport.envelope import Opener, Sealer
from cynomys.transport.keys import generate_keys, load_private_key, load_public_key
from cynomys.transport.redis_bus import RedisStreamPublisher, RedisStreamSubscriber
from cynomys.transport.sequence import SequenceTracker
from tests.servers.redis import RedisServer, free_port

pytestmark = pytest.mark.integration

PID = "producer-1"
STREAM = "cynomys"


@dataclass
class Crypto:
    sealer: Sealer
    opener: Opener


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    generate_keys(d, rsa_bits=2048)
    return d


@pytest.fixture
def crypto(key_dir: Path) -> Crypto:
    sealer = Sealer(PID, STREAM, load_public_key(key_dir / "applier_public.pem"),
                    load_private_key(key_dir / "producer_private.pem"), rotate_envelopes=500, rotate_seconds=60)
    opener = Opener(load_private_key(key_dir / "applier_private.pem"),
                    {PID: load_public_key(key_dir / "producer_public.pem")}, STREAM)
    return Crypto(sealer, opener)


def row_payload(seq: int) -> bytes:
    return b"".join(b"%d|customer-%d|%d.%02d;" % (seq, seq * 31 + i, i * 997 % 10000, i % 100) for i in range(40))


@dataclass
class Applier:
    """The applier's loop in miniature: open, classify, apply, commit, ack."""

    opener: Opener
    tracker: SequenceTracker = field(default_factory=SequenceTracker)
    applied: list[int] = field(default_factory=list)
    duplicates: int = 0
    redelivered: int = 0

    def handle(self, sub: Subscriber, batch: list[Delivery], *, ack: bool = True) -> None:
        for d in batch:
            self.redelivered += d.redelivered
            opened = self.opener.open(d.envelope)
            assert opened.payload == row_payload(opened.seq)
            if self.tracker.classify(opened.producer_id, opened.seq) == "duplicate":
                self.duplicates += 1
            else:
                self.applied.append(opened.seq)
                self.tracker.advance(opened.producer_id, opened.seq)
        # "target commit" happened here; ack only after it.
        if ack:
            sub.ack([d.id for d in batch])


def publish_all(pub: Publisher, sealer: Sealer, n: int) -> None:
    for s in range(1, n + 1):
        pub.publish(PID, s, sealer.seal(row_payload(s), s))


def cfg(url: str, **kw: object) -> TransportConfig:
    return TransportConfig(url=url, stream=STREAM, **kw)  # type: ignore[arg-type]


def wait_subscribed(url: str, channel: str, n: int = 1, timeout: float = 5.0) -> None:
    with redis.Redis.from_url(url) as r:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if dict(r.pubsub_numsub(channel)).get(channel.encode(), 0) >= n:
                return
            time.sleep(0.01)
    raise AssertionError(f"no subscriber on {channel}")


def drain(sub: Subscriber, app: Applier, until: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (not app.applied or app.applied[-1] < until) and time.monotonic() < deadline:
        try:
            app.handle(sub, sub.read(200, 100))
        except TransportUnavailableError:
            time.sleep(0.05)
    assert app.applied and app.applied[-1] == until, f"stopped at {app.applied[-1:]} waiting for {until}"


# --- round trips --------------------------------------------------------------

def test_stream_round_trip(redis_url: str, crypto: Crypto) -> None:
    n = 2000
    pub, sub = open_publisher(cfg(redis_url)), open_subscriber(cfg(redis_url), "applier-1")
    app = Applier(crypto.opener)
    producer = threading.Thread(target=publish_all, args=(pub, crypto.sealer, n))
    producer.start()
    drain(sub, app, n)
    producer.join()
    assert app.applied == list(range(1, n + 1))
    assert app.duplicates == app.redelivered == 0
    assert crypto.opener.unwraps == 4  # rotate_envelopes=500
    with redis.Redis.from_url(redis_url) as r:
        assert r.xpending(STREAM, "cynomys-appliers")["pending"] == 0
    pub.close()
    sub.close()


def test_pubsub_round_trip(redis_url: str, crypto: Crypto) -> None:
    n = 2000
    c = cfg(redis_url, mode="pubsub")
    pub, sub = open_publisher(c), open_subscriber(c, "applier-1")
    app = Applier(crypto.opener)
    assert sub.read(10, 50) == []  # subscribes
    wait_subscribed(redis_url, STREAM)
    producer = threading.Thread(target=publish_all, args=(pub, crypto.sealer, n))
    producer.start()
    drain(sub, app, n)
    producer.join()
    assert app.applied == list(range(1, n + 1))
    pub.close()
    sub.close()


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_tls_and_auth_in_url(tmp_path: Path, crypto: Crypto, mode: str) -> None:
    srv = RedisServer(tmp_path / "r", password="s3cret pw", tls=True)
    try:
        url = srv.url.replace("s3cret pw", "s3cret%20pw")
        assert url.startswith("rediss://")
        c = cfg(url, mode=mode)
        pub, sub = open_publisher(c), open_subscriber(c, "applier-1")
        app = Applier(crypto.opener)
        sub.read(10, 50)
        if mode == "pubsub":
            wait_subscribed(url, STREAM)
        for s in range(1, 21):
            pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
        drain(sub, app, 20)
        assert pub.last_sequence(PID) == 20
        bad = open_publisher(cfg(url.replace("s3cret%20pw", "wrong"), mode=mode))
        with pytest.raises(ConfigError, match="refused our credentials") as ei:
            bad.publish(PID, 21, b"x")  # not retried forever
        assert "wrong" not in str(ei.value)  # the password is redacted
        pub.close()
        sub.close()
    finally:
        srv.close()


# --- failures -----------------------------------------------------------------

def test_stream_survives_redis_restart(tmp_path: Path, crypto: Crypto, caplog: pytest.LogCaptureFixture) -> None:
    srv = RedisServer(tmp_path / "r")  # appendfsync always: accepted == durable
    n = 600
    try:
        c = cfg(srv.url)
        pub, sub = open_publisher(c), open_subscriber(c, "applier-1")
        app = Applier(crypto.opener)
        published = [0]

        def produce() -> None:
            for s in range(1, n + 1):
                pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
                published[0] = s
                time.sleep(0.001)

        caplog.set_level(logging.WARNING, logger="cynomys.transport")
        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + 20
        while published[0] < 200:
            assert producer.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        srv.kill()  # SIGKILL mid-stream
        time.sleep(0.8)
        srv.start()
        drain(sub, app, n, timeout=30)
        producer.join(timeout=30)
        assert app.applied == list(range(1, n + 1))  # nothing lost, order kept, nothing applied twice
        retries = [r for r in caplog.records if "did not accept envelope" in r.getMessage()]
        assert retries and f"127.0.0.1:{srv.port}" in retries[0].getMessage()
        pub.close()
        sub.close()
    finally:
        srv.close()


def test_publish_gives_up_only_when_stopped(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://:pw@127.0.0.1:{free_port()}/0"  # nobody listens there
    pub = open_publisher(cfg(url))
    stop = threading.Event()
    threading.Timer(0.6, stop.set).start()
    caplog.set_level(logging.WARNING, logger="cynomys.transport")
    t0 = time.monotonic()
    with pytest.raises(TransportUnavailableError) as ei:
        pub.publish(PID, 1, b"x", stop=stop)
    assert 0.5 < time.monotonic() - t0 < 3
    assert ei.value.transient
    warnings = [r.getMessage() for r in caplog.records if "did not accept" in r.getMessage()]
    assert len(warnings) >= 3  # backoff 0.05, 0.1, 0.2, 0.4 ...
    assert all(":***@127.0.0.1" in w and ":pw@" not in w for w in warnings)


def test_consumer_killed_between_read_and_ack(redis_url: str, crypto: Crypto) -> None:
    c = cfg(redis_url)
    pub = open_publisher(c)
    for s in range(1, 21):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
    app = Applier(crypto.opener)

    # 1. Applied and committed, then killed before the ack.
    a = open_subscriber(c, "applier-1")
    first = a.read(10, 100)
    app.handle(a, first, ack=False)
    committed = app.tracker.snapshot()  # persisted in the target transaction
    a.close()  # dropped: no ack

    # 2. Restarted under the same name: gets them again, marked redelivered.
    app.tracker = SequenceTracker(committed)
    a2 = open_subscriber(c, "applier-1")
    again = a2.read(10, 100)
    assert [d.id for d in again] == [d.id for d in first]
    assert all(d.redelivered for d in again)
    app.handle(a2, again)
    assert app.duplicates == 10 and app.applied == list(range(1, 11))

    # 3. Reads 11..20, dies before applying; a replacement with ANOTHER name
    #    takes them over once they have been idle for min-idle.
    lost = a2.read(10, 100)
    read_at = time.monotonic()
    assert len(lost) == 10 and not any(d.redelivered for d in lost)
    a2.close()
    b = open_subscriber(c, "applier-2", claim_min_idle_ms=600)
    early = b.read(10, 50)
    if time.monotonic() - read_at < 0.5:  # (a slow machine may already be past min-idle)
        assert early == []  # not idle long enough yet: not taken
    b.close()
    time.sleep(max(0.0, read_at + 0.65 - time.monotonic()))
    b = open_subscriber(c, "applier-2", claim_min_idle_ms=600)
    taken = b.read(10, 100)
    assert [d.id for d in taken] == [d.id for d in lost]
    assert all(d.redelivered for d in taken)
    app.handle(b, taken)
    assert app.applied == list(range(1, 21))  # each applied exactly once
    assert b.read(10, 50) == []
    with redis.Redis.from_url(redis_url) as r:
        assert r.xpending(STREAM, "cynomys-appliers")["pending"] == 0
    pub.close()
    b.close()


def test_periodic_claim_skips_own_in_flight(redis_url: str, crypto: Crypto) -> None:
    """An applier that holds entries longer than min-idle (slow commit) must
    not get its own in-flight entries back from its periodic XAUTOCLAIM."""
    c = cfg(redis_url)
    pub = open_publisher(c)
    for s in range(1, 6):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
    sub = RedisStreamSubscriber(c, "applier-1", claim_min_idle_ms=50, claim_interval_s=0.0)
    held = sub.read(10, 100)
    assert len(held) == 5
    time.sleep(0.1)
    assert sub.read(10, 50) == []
    sub.ack([d.id for d in held])
    pub.close()
    sub.close()


def test_pubsub_subscriber_down_gap_detected(redis_url: str, crypto: Crypto) -> None:
    c = cfg(redis_url, mode="pubsub")
    pub = open_publisher(c)
    app = Applier(crypto.opener)
    s1 = open_subscriber(c, "applier-1")
    s1.read(1, 20)
    wait_subscribed(redis_url, STREAM)
    for s in range(1, 11):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
    drain(s1, app, 10)
    s1.close()  # the applier is down ...
    for s in range(11, 21):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))  # ... these are lost
    s2 = open_subscriber(c, "applier-1")
    s2.read(1, 20)
    wait_subscribed(redis_url, STREAM)
    for s in range(21, 26):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
    batch = s2.read(10, 1000)
    with pytest.raises(SequenceGapError, match=r"envelopes 11\.\.20 from producer-1 are missing"):
        app.handle(s2, batch)
    assert app.applied == list(range(1, 11))
    pub.close()
    s2.close()


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_dead_letter_of_tampered_envelope(redis_url: str, crypto: Crypto, mode: str) -> None:
    c = cfg(redis_url, mode=mode)
    pub, sub = open_publisher(c), open_subscriber(c, "applier-1")
    sub.read(1, 20)
    if mode == "pubsub":
        wait_subscribed(redis_url, STREAM)
    good = crypto.sealer.seal(row_payload(1), 1)
    tampered = bytearray(good)
    tampered[len(good) // 2] ^= 0xFF
    pub.publish(PID, 1, bytes(tampered))
    [d] = sub.read(10, 1000)
    with pytest.raises(EnvelopeRejected) as ei:
        crypto.opener.open(d.envelope)
    sub.dead_letter(d, ei.value.reason)
    assert crypto.opener.rejections == {"bad-signature": 1}
    with redis.Redis.from_url(redis_url) as r:
        [(_, fields)] = r.xrange(f"{STREAM}:dead")
        assert fields[b"env"] == bytes(tampered)
        assert fields[b"reason"] == b"bad-signature"
        assert fields[b"id"] == d.id.encode()
        if mode == "stream":
            assert r.xpending(STREAM, "cynomys-appliers")["pending"] == 0
    assert sub.read(10, 50) == []
    pub.close()
    sub.close()


def test_trimming_never_removes_unacknowledged(redis_url: str, crypto: Crypto) -> None:
    c = cfg(redis_url, max_stream_len=100)
    pub = open_publisher(c)
    assert isinstance(pub, RedisStreamPublisher)
    env = {s: crypto.sealer.seal(row_payload(s), s) for s in range(1, 1301)}
    for s in range(1, 1001):
        pub.publish(PID, s, env[s])  # no group yet: the automatic trims remove nothing
    r = redis.Redis.from_url(redis_url)
    assert r.xlen(STREAM) == 1000
    app = Applier(crypto.opener)
    sub = open_subscriber(c, "applier-1")
    got: list[Delivery] = []
    while len(got) < 700:
        got += sub.read(700 - len(got), 100)
    app.handle(sub, got[:600])  # 601..700 delivered but not acknowledged, 701.. not delivered
    committed = app.tracker.snapshot()
    removed = pub.trim()
    assert 0 < removed <= 600
    first_pending = got[600].id
    remaining = r.xrange(STREAM, min=first_pending)
    assert [int(f[b"seq"]) for _, f in remaining or [] if f] == list(range(601, 1001))
    for s in range(1001, 1301):
        pub.publish(PID, s, env[s])  # automatic trims run again, with a group now
    assert r.xlen(STREAM) >= 700
    sub.close()  # crash: 601..700 never acknowledged
    app.tracker = SequenceTracker(committed)
    sub = open_subscriber(c, "applier-1")
    drain(sub, app, 1300)
    assert app.applied == list(range(1, 1301))
    pub.trim()
    assert r.xlen(STREAM) < 400  # once acknowledged, entries do go
    r.close()
    pub.close()
    sub.close()


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_last_sequence_after_producer_restart(redis_url: str, crypto: Crypto, mode: str) -> None:
    c = cfg(redis_url, mode=mode)
    pub = open_publisher(c)
    assert pub.last_sequence(PID) == 0
    for s in range(1, 6):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
    pub.publish("producer-2", 77, b"other")
    pub.close()
    again = open_publisher(c)  # the producer restarted
    assert again.last_sequence(PID) == 5
    assert again.last_sequence("producer-2") == 77
    again.publish(PID, 6, crypto.sealer.seal(row_payload(6), 6))
    again.publish(PID, 3, b"stale resend")  # idempotent: not written again
    assert again.last_sequence(PID) == 6
    if mode == "stream":
        with redis.Redis.from_url(redis_url) as r:
            assert r.xlen(STREAM) == 7
            r.delete(f"{STREAM}:seq")  # fall back to the stream's tail
        assert again.last_sequence(PID) == 6
        assert again.last_sequence("producer-2") == 77
        assert again.last_sequence("nobody") == 0
    again.close()


def test_redis_server_fixture_restart_keeps_data(tmp_path: Path) -> None:
    srv = RedisServer(tmp_path / "r")
    try:
        with srv.client() as c:
            c.set("k", "v")
        srv.restart()
        with srv.client() as c:
            assert c.get("k") == b"v"
        srv.restart(kill=True)
        with srv.client() as c:
            assert c.get("k") == b"v"
    finally:
        srv.close()



def test_lost_reply_entries_come_back_first(redis_url: str, crypto: Crypto) -> None:
    """XREADGROUP ran but its reply never arrived (connection dropped): the
    entries sit in our pending list.  After the error the subscriber re-reads
    its pending list before new entries, so the order stays intact."""
    c = cfg(redis_url)
    pub = open_publisher(c)
    for s in range(1, 4):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
    app = Applier(crypto.opener)
    sub = open_subscriber(c, "applier-1")
    app.handle(sub, sub.read(3, 100))
    errors: list[Exception] = []

    def blocked_read() -> None:
        try:
            sub.read(3, 5000)
        except TransportUnavailableError as exc:
            errors.append(exc)

    reader = threading.Thread(target=blocked_read)
    reader.start()
    with redis.Redis.from_url(redis_url) as r:
        deadline = time.monotonic() + 5
        while not any(cl.get("cmd") == "xreadgroup" for cl in r.client_list()) and time.monotonic() < deadline:
            time.sleep(0.01)
        r.client_kill_filter(_type="normal", skipme=True)  # the connection drops mid-command
        reader.join(timeout=5)
        assert len(errors) == 1
        for s in range(4, 10):
            pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
        # What the lost reply carried: 4..6, now pending for applier-1, seen by nobody.
        r.xreadgroup("cynomys-appliers", "applier-1", {STREAM: ">"}, count=3)
    drain(sub, app, 9)
    assert app.applied == list(range(1, 10))
    assert app.redelivered == 3
    pub.close()
    sub.close()


# --- issue #13, item 7: a stream deleted under the applier, foreign entries ------

def test_stream_deleted_under_a_blocked_reader_is_transient(redis_url: str, crypto: Crypto,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    pub, sub = open_publisher(cfg(redis_url)), open_subscriber(cfg(redis_url), "applier-1")
    app = Applier(crypto.opener)
    publish_all(pub, crypto.sealer, 3)
    drain(sub, app, 3)

    def delete_soon() -> None:
        time.sleep(0.5)
        with redis.Redis.from_url(redis_url) as r:
            r.delete(STREAM)

    killer = threading.Thread(target=delete_soon)
    killer.start()
    # Redis answers the blocked XREADGROUP with "UNBLOCKED the stream key no
    # longer exists": before the fix a terminal TransportRejectedError.
    with caplog.at_level(logging.ERROR, logger="cynomys.transport.redis_bus"):
        with pytest.raises(TransportUnavailableError, match="vanished") as ei:
            sub.read(10, 5000)
    killer.join()
    assert ei.value.transient
    assert any("recreating the group" in r.getMessage() for r in caplog.records)
    # The producer goes on; the same subscriber picks up where the stream restarts.
    for s in range(4, 7):
        pub.publish(PID, s, crypto.sealer.seal(row_payload(s), s))
    drain(sub, app, 6)
    assert app.applied == [1, 2, 3, 4, 5, 6]
    pub.close()
    sub.close()


def test_entry_without_envelope_field_is_dead_lettered(redis_url: str, crypto: Crypto) -> None:
    pub, sub = open_publisher(cfg(redis_url)), open_subscriber(cfg(redis_url), "applier-1")
    app = Applier(crypto.opener)
    pub.publish(PID, 1, crypto.sealer.seal(row_payload(1), 1))
    with redis.Redis.from_url(redis_url) as r:
        foreign = r.xadd(STREAM, {"producer": PID, "seq": 2, "payload": b"not an envelope"}).decode()
    pub.publish(PID, 2, crypto.sealer.seal(row_payload(2), 2))
    drain(sub, app, 2)
    assert app.applied == [1, 2]
    with redis.Redis.from_url(redis_url) as r:
        dead = r.xrange(f"{STREAM}:dead")
        assert len(dead) == 1
        fields = dead[0][1]
        assert fields[b"id"].decode() == foreign
        assert fields[b"reason"].startswith(b"no-envelope-field") and b"payload" in fields[b"reason"]
        assert fields[b"orig.payload"] == b"not an envelope"
        assert r.xpending(STREAM, "cynomys-appliers")["pending"] == 0
    pub.close()
    sub.close()


def test_rediss_verifies_the_server_certificate(tmp_path: Path, crypto: Crypto) -> None:
    from tests.servers.tls import make_tls_files

    srv = RedisServer(tmp_path / "r", tls=True)
    try:
        assert srv.tls is not None
        base = f"rediss://127.0.0.1:{srv.port}/0"
        # ssl_ca: the name [source] and the target URLs use (redis-py's is ssl_ca_certs).
        pub = open_publisher(cfg(f"{base}?ssl_ca={srv.tls.ca_cert}"))
        pub.publish(PID, 1, crypto.sealer.seal(row_payload(1), 1))
        assert pub.last_sequence(PID) == 1
        pub.close()
        stranger = make_tls_files(tmp_path / "other-ca")
        for url in (base, f"{base}?ssl_ca={stranger.ca_cert}"):  # system CAs; another CA
            with pytest.raises(ConfigError, match="does not verify") as ei:
                open_publisher(cfg(url)).last_sequence(PID)
            assert ei.value.hint is not None and "ssl_ca" in ei.value.hint
        with pytest.raises(ConfigError, match="needs TLS"):
            open_publisher(cfg(f"redis://127.0.0.1:{srv.port}/0?ssl_ca={srv.tls.ca_cert}"))
    finally:
        srv.close()
