"""The Redis transport against a real redis-server (no mocks)."""
from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from cynomys.core.config import TransportConfig
from cynomys.core.errors import (
    ConfigError,
    EnvelopeRejected,
    SequenceGapError,
    TerminalError,
    TransportUnavailableError,
)
from cynomys.transport.bus import (
    Delivery,
    Publisher,
    Subscriber,
    TransportStateAltered,
    open_publisher,
    open_subscriber,
)
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
    again.publish(PID, 3, crypto.sealer.seal(row_payload(3), 3))  # idempotent: not written again
    assert again.last_sequence(PID) == 6
    if mode == "stream":  # the entry is checked: bytes that are not envelope 3 are not taken for it
        with pytest.raises(TransportStateAltered, match="entry numbered 3 holds another envelope"):
            again.publish(PID, 3, b"stale resend")
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


# --- an "already holds" answer is checked, never taken on trust ----------------

def entries(r: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """(id, fields) of every entry of the stream."""
    return [(i, f) for i, f in r.xrange(STREAM)]


def fresh_sealer(key_dir: Path) -> Sealer:
    """The producer's Sealer after a restart: same keys, a new data key."""
    return Sealer(PID, STREAM, load_public_key(key_dir / "applier_public.pem"),
                  load_private_key(key_dir / "producer_private.pem"), rotate_envelopes=500, rotate_seconds=60)


class LoseOneReply:
    """A TCP proxy in front of Redis that forwards everything but the reply to
    the first command carrying ``marker`` (not counting error replies such as
    NOSCRIPT): it drops that connection instead.  The command ran; its reply
    never arrived -- what the publisher's blind retry is for."""

    def __init__(self, redis_url: str, marker: bytes) -> None:
        self._upstream = int(redis_url.rsplit(":", 1)[1].split("/")[0])
        self._marker = marker
        self.lost = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._server.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
            armed = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, armed), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, armed), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, armed: threading.Event) -> None:
        tail = b""
        try:
            while data := client.recv(65536):
                if not self.lost.is_set() and self._marker in tail + data:
                    armed.set()  # before forwarding: the reply must find it set
                tail = data[-len(self._marker):]
                upstream.sendall(data)
        except OSError:
            pass

    def _down(self, client: socket.socket, upstream: socket.socket, armed: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if armed.is_set() and not self.lost.is_set():
                    if data.startswith(b"-"):
                        armed.clear()  # NOSCRIPT: redis-py loads the script and sends it again
                    else:
                        self.lost.set()
                        break
                client.sendall(data)
        except OSError:
            pass
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the other pump; close alone may not
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._server.close()


def test_stream_raised_sequence_state_is_terminal(redis_url: str, crypto: Crypto) -> None:
    """HSET <stream>:seq P 1000 used to make every later envelope vanish: the
    script wrote nothing, the publisher returned, the producer moved on."""
    pub = open_publisher(cfg(redis_url))
    publish_all(pub, crypto.sealer, 3)
    r = redis.Redis.from_url(redis_url)
    r.hset(f"{STREAM}:seq", PID, 1000)
    with pytest.raises(TransportStateAltered) as ei:
        pub.publish(PID, 4, crypto.sealer.seal(row_payload(4), 4))
    err = ei.value
    assert isinstance(err, TerminalError) and not err.transient
    assert f"stream {STREAM} already holds envelope 4 of producer {PID!r}" in err.message
    assert f"{STREAM}:seq says 1000" in err.message
    assert "the newest entry of 'producer-1' below it is envelope 3" in err.message
    assert err.hint is not None and f"HSET {STREAM}:seq {PID} 3" in err.hint
    assert r.xlen(STREAM) == 3  # nothing written
    r.hset(f"{STREAM}:seq", PID, 3)  # the fix the message gives
    pub.publish(PID, 4, crypto.sealer.seal(row_payload(4), 4))
    assert [int(f[b"seq"]) for _, f in entries(r)] == [1, 2, 3, 4]
    r.close()
    pub.close()


def test_stream_genuine_resends_are_still_accepted(redis_url: str, crypto: Crypto, key_dir: Path) -> None:
    pub = open_publisher(cfg(redis_url))
    publish_all(pub, crypto.sealer, 3)
    pub.publish("producer-2", 1, b"another producer's entry")  # above ours in the stream
    pub.close()
    # The producer crashed after publishing 3: a new life re-seals the same
    # batch (other bytes: a fresh data key) and publishes it again.
    again = open_publisher(cfg(redis_url))
    resealed = fresh_sealer(key_dir).seal(row_payload(3), 3)
    with redis.Redis.from_url(redis_url) as r:
        [(_, stored)] = [e for e in entries(r) if e[1][b"seq"] == b"3"]
        assert stored[b"env"] != resealed
        again.publish(PID, 3, resealed)
        assert r.xlen(STREAM) == 4
    # A retry whose first attempt ran but whose reply was lost.
    env4 = crypto.sealer.seal(row_payload(4), 4)
    proxy = LoseOneReply(redis_url, env4)
    lossy = open_publisher(cfg(proxy.url))
    lossy.publish(PID, 4, env4)
    assert proxy.lost.is_set()
    with redis.Redis.from_url(redis_url) as r:
        assert [int(f[b"seq"]) for _, f in entries(r) if f[b"producer"] == PID.encode()] == [1, 2, 3, 4]
    lossy.close()
    proxy.close()
    again.close()


def test_stream_deleted_entry_is_not_written_again(redis_url: str, crypto: Crypto, key_dir: Path) -> None:
    """An entry XDEL'd, then the producer sends that number again: an error,
    not a silent re-write -- someone removes entries and should be found;
    the message says how to have the producer send it again."""
    pub = open_publisher(cfg(redis_url))
    publish_all(pub, crypto.sealer, 3)
    r = redis.Redis.from_url(redis_url)
    [last_id] = [i for i, f in entries(r) if f[b"seq"] == b"3"]
    r.xdel(STREAM, last_id)
    resealed = fresh_sealer(key_dir).seal(row_payload(3), 3)
    with pytest.raises(TransportStateAltered, match="envelope 3 .* below it is envelope 2") as ei:
        pub.publish(PID, 3, resealed)
    assert ei.value.hint is not None and f"HSET {STREAM}:seq {PID} 2" in ei.value.hint
    r.hset(f"{STREAM}:seq", PID, 2)
    pub.publish(PID, 3, resealed)
    assert [int(f[b"seq"]) for _, f in entries(r)] == [1, 2, 3]
    r.close()
    pub.close()


def test_stream_check_scans_past_other_producers_within_its_bound(redis_url: str, crypto: Crypto,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from cynomys.transport import redis_bus

    pub = open_publisher(cfg(redis_url))
    env3 = crypto.sealer.seal(row_payload(3), 3)
    publish_all(pub, crypto.sealer, 2)
    pub.publish(PID, 3, env3)
    for s in range(1, 101):
        pub.publish("producer-2", s, b"other %d" % s)
    pub.publish(PID, 3, env3)  # found below 100 entries of another producer
    monkeypatch.setattr(redis_bus, "_HELD_SCAN_LIMIT", 50)
    with pytest.raises(TransportStateAltered, match="not among the newest 50 entries"):
        pub.publish(PID, 3, env3)
    pub.close()


def test_stream_forged_entry_passes_the_publisher_but_not_the_applier(redis_url: str, crypto: Crypto) -> None:
    """The documented limit: without the producer's public key the publisher
    reads an entry's header unverified.  A Redis writer who raises the state
    AND plants an entry with a forged header gets past it -- but the applier
    verifies the signature and refuses it, so the loss is not silent."""
    pub = open_publisher(cfg(redis_url))
    publish_all(pub, crypto.sealer, 3)
    genuine = crypto.sealer.seal(row_payload(4), 4)
    forged = genuine[:-64] + bytes(64)  # same header, no valid signature
    with redis.Redis.from_url(redis_url) as r:
        r.xadd(STREAM, {"producer": PID, "seq": 4, "env": forged})
        r.hset(f"{STREAM}:seq", PID, 4)
    pub.publish(PID, 4, genuine)
    with pytest.raises(EnvelopeRejected) as ei:
        crypto.opener.open(forged)
    assert ei.value.reason == "bad-signature"
    pub.close()


def test_pubsub_raised_sequence_state_is_terminal(redis_url: str, crypto: Crypto, key_dir: Path) -> None:
    c = cfg(redis_url, mode="pubsub")
    pub, sub = open_publisher(c), open_subscriber(c, "applier-1")
    assert pub.last_sequence(PID) == 0  # what a producer asks at start
    sub.read(1, 20)
    wait_subscribed(redis_url, STREAM)
    publish_all(pub, crypto.sealer, 3)
    assert len(sub.read(10, 1000)) == 3
    r = redis.Redis.from_url(redis_url)
    r.hset(f"{STREAM}:seq", PID, 1000)
    with pytest.raises(TransportStateAltered) as ei:
        pub.publish(PID, 4, crypto.sealer.seal(row_payload(4), 4))
    err = ei.value
    assert isinstance(err, TerminalError) and not err.transient
    assert f"channel {STREAM} already had envelope 4 of producer {PID!r}" in err.message
    assert f"{STREAM}:seq says 1000" in err.message and "accept only up to 3" in err.message
    assert err.hint is not None and f"HSET {STREAM}:seq {PID} 3" in err.hint
    assert sub.read(10, 200) == []  # nothing published
    # A producer restarted after publishing 3 re-sends it: this process read
    # 3 from the transport at start, so "already" is true and accepted.
    again = open_publisher(c)
    r.hset(f"{STREAM}:seq", PID, 3)
    assert again.last_sequence(PID) == 3
    again.publish(PID, 3, fresh_sealer(key_dir).seal(row_payload(3), 3))
    assert sub.read(10, 200) == []
    # A publisher never told what the transport holds cannot vouch for it.
    with pytest.raises(TransportStateAltered):
        open_publisher(c).publish(PID, 3, crypto.sealer.seal(row_payload(3), 3))
    # The hash raised while running, again: the new publisher stops too.
    r.hset(f"{STREAM}:seq", PID, 1_000_000)
    with pytest.raises(TransportStateAltered, match="says 1000000"):
        again.publish(PID, 4, crypto.sealer.seal(row_payload(4), 4))
    r.hset(f"{STREAM}:seq", PID, 3)
    again.publish(PID, 4, crypto.sealer.seal(row_payload(4), 4))
    [d] = sub.read(10, 1000)
    assert crypto.opener.open(d.envelope).seq == 4
    r.close()
    for x in (pub, sub, again):
        x.close()


def test_pubsub_lost_reply_retry_is_accepted(redis_url: str, crypto: Crypto) -> None:
    c = cfg(redis_url, mode="pubsub")
    env1 = crypto.sealer.seal(row_payload(1), 1)
    proxy = LoseOneReply(redis_url, env1)
    pub = open_publisher(cfg(proxy.url, mode="pubsub"))
    assert pub.last_sequence(PID) == 0
    pub.publish(PID, 1, env1)  # the retry gets "already": S:seq holds exactly 1
    assert proxy.lost.is_set()
    assert open_publisher(c).last_sequence(PID) == 1
    pub.close()
    proxy.close()
