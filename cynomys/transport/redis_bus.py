"""Redis transport: a stream with a consumer group (default) or pub/sub.

Keys used, for stream name S (the default S is "cynomys"):

* ``S``          the stream (stream mode), or the pub/sub channel (pub/sub mode);
                 stream entries have fields {producer, seq, env};
* ``S:seq``      hash producer id -> highest sequence accepted, updated in the
                 same Lua script as the XADD / PUBLISH (atomic);
* ``S:dead``     dead-letter stream (or [transport] dead_letter_stream);
* ``S:lease:P``, ``S:fence:P``, ``S:state:P``  an HA producer's lease, fencing
                 counter and state (cynomys/transport/lease.py).

Fencing (HA producers): the publish scripts take the lease key as their last
key and the value the publisher believes it holds ("token:owner") as their
last argument; when that value is set and the lease holds anything else
(expired, or taken over by another producer with a newer token), the script
writes nothing and returns -2.  The check and the write are one script, so a
deposed leader cannot publish between them.

The publish script is idempotent per (producer, seq): a sequence at or below
the accepted one is not written again.  That makes the publisher's blind
retry safe when Redis executed a command but the reply was lost.  Its
"already holds" answer rests on ``S:seq`` alone, which any Redis writer can
raise (``HSET S:seq P 1000000``): taken on trust, every later envelope would
vanish while the producer moves its checkpoint on.  So the publisher checks
each such answer (``_check_held``): in stream mode against the entry itself,
in pub/sub mode against what this process saw accepted; failing that it
raises TransportStateAltered (terminal) and the producer stops.
All keys live on one Redis server (no Redis Cluster: the script touches two
keys that may hash to different slots).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cynomys.core.config import TransportConfig
from cynomys.core.errors import (
    ConfigError,
    CynomysError,
    EnvelopeRejected,
    LeaseLost,
    TerminalError,
    TransportUnavailableError,
)
from cynomys.transport.bus import Backoff, Delivery, TransportStateAltered, redact_url, same_envelope
from cynomys.transport.envelope import peek_header

log = logging.getLogger(__name__)

# A replacement applier with a different consumer name takes over entries
# another consumer has held un-acknowledged for this long.  It must exceed the
# applier's longest read-to-commit time ([applier] max_delay_ms plus a flush),
# or a live applier's entries would be stolen.
DEFAULT_CLAIM_MIN_IDLE_MS = 60_000
CLAIM_INTERVAL_S = 30.0
# Publisher: a command slower than this counts as "Redis is slow" and is
# retried (safe: the publish script is idempotent).
PUBLISH_SOCKET_TIMEOUT_S = 10.0
SUBSCRIBE_SOCKET_TIMEOUT_S = 30.0
# XREADGROUP BLOCK must end well before the socket timeout fires.
MAX_BLOCK_MS = 20_000
# Check the stream length every this many publishes.
TRIM_EVERY = 128
# XREVRANGE page size when scanning the stream tail for a producer's last
# entry (entries carry whole envelopes, so pages stay small).
_TAIL_PAGE = 32
# How far back from the tail the entry behind an "already holds (P, N)"
# answer is looked for.  A genuine answer concerns the envelope P has in
# flight -- a retry whose lost first attempt was written -- which is P's
# newest entry: only entries other producers sharing the stream appended
# since lie above it (none with one producer).  The scan stops at once at an
# older entry of P; this bound only caps it when P's entries are far back
# (or gone).  Beyond it the answer counts as unproven: a false alarm there
# stops the producer, and its restart settles the in-flight envelope from
# S:seq (Producer._recover_pending), while a bigger bound would read that
# many whole envelopes (up to max_envelope_bytes each) on every such answer.
_HELD_SCAN_LIMIT = 1024

# Compare two decimal strings as unsigned integers (Lua numbers are doubles
# and would round sequences above 2**53).
_LUA_LE = """
local function le(a, b)
  if #a ~= #b then return #a < #b end
  return a <= b
end
"""
# A fenced publisher whose lease value is not the current one (-2).
_LUA_FENCE = """
local fence = ARGV[#ARGV]
if fence ~= '' and redis.call('GET', KEYS[#KEYS]) ~= fence then return -2 end
"""
FENCED = -2
_STREAM_PUBLISH = _LUA_LE + _LUA_FENCE + """
local last = redis.call('HGET', KEYS[2], ARGV[1]) or '0'
if le(ARGV[2], last) then return 0 end
redis.call('XADD', KEYS[1], '*', 'producer', ARGV[1], 'seq', ARGV[2], 'env', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""
_PUBSUB_PUBLISH = _LUA_LE + _LUA_FENCE + """
local last = redis.call('HGET', KEYS[1], ARGV[1]) or '0'
if le(ARGV[2], last) then return -1 end
local receivers = redis.call('PUBLISH', ARGV[4], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return receivers
"""


# Error replies that mean "not now" rather than "never".
_TRANSIENT_REPLIES = ("BUSY", "TRYAGAIN", "MASTERDOWN", "LOADING")


class TransportRejectedError(TerminalError):
    """Redis refused a command for a reason retrying will not fix."""


# Query parameters accepted in [transport] url.  redis-py passes any other
# name on to the connection class, where it fails with a TypeError at the
# first command, far from the config; we refuse it up front instead.
_URL_OPTIONS = frozenset({
    "db", "username", "password", "protocol", "client_name", "socket_timeout", "socket_connect_timeout",
    "socket_keepalive", "retry_on_timeout", "health_check_interval", "max_connections",
    "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_cert_reqs",
    "ssl_check_hostname",
})
# The names [source] and the target URLs use for the same TLS files.
_URL_ALIASES = {"ssl_ca": "ssl_ca_certs", "ssl_cert": "ssl_certfile", "ssl_key": "ssl_keyfile"}


def _normalize_url(url: str) -> str:
    """``url`` with our TLS aliases renamed to redis-py's names; a ConfigError
    for options redis-py would only trip over at the first command."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"[transport] url {redact_url(url)} is not a Redis URL (scheme {parts.scheme!r})",
                          hint="use redis://[user:password@]host:port/db, or rediss://... for TLS")
    out: list[str] = []
    for param in parts.query.split("&") if parts.query else []:
        name, eq, value = param.partition("=")
        name = _URL_ALIASES.get(name, name)
        if name not in _URL_OPTIONS:
            # Not the URL itself: a misspelt "pasword=" would not be redacted.
            raise ConfigError(f"[transport] url has an unknown option {name!r}",
                              hint="known options: " + ", ".join(sorted({*_URL_OPTIONS, *_URL_ALIASES})))
        if name.startswith("ssl_") and parts.scheme != "rediss":
            raise ConfigError(f"[transport] url {redact_url(url)}: {name} needs TLS",
                              hint="use rediss:// for a TLS connection to Redis")
        if name == "ssl_cert_reqs" and value.lower() not in ("none", "optional", "required"):
            raise ConfigError(f"[transport] url {redact_url(url)}: ssl_cert_reqs={value!r}",
                              hint="use ssl_cert_reqs=required (the default) or leave it out")
        out.append(f"{name}{eq}{value}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(out), parts.fragment))


def redis_client(url: str, socket_timeout: float) -> redis.Redis:
    """A client for ``url`` (redis://, or rediss:// with certificate and host
    name verification on unless the URL says ssl_cert_reqs=none); a
    malformed URL is a ConfigError naming it, password redacted."""
    try:
        normalized = _normalize_url(url)
        tls: dict[str, Any] = {}
        if normalized.startswith("rediss:"):
            # Host name checking became redis-py's default only in 6.0; we
            # accept redis>=5, so ask for it (an explicit URL option wins).
            tls["ssl_check_hostname"] = True
        # retry=0: our own loops own the retry policy (and log each attempt);
        # redis-py's built-in retries would hide outages and delay `stop`.
        return redis.Redis.from_url(
            normalized,
            socket_timeout=socket_timeout,
            socket_connect_timeout=5.0,
            health_check_interval=30,
            retry=Retry(NoBackoff(), 0),
            **tls,
        )
    except ValueError as exc:
        raise ConfigError(f"[transport] url {redact_url(url)} is not a valid Redis URL: {exc}",
                          hint="use redis://[user:password@]host:port/db or rediss://... for TLS") from None


_client = redis_client


def translate(exc: redis.RedisError, url: str, doing: str) -> CynomysError:
    """A redis-py error as a Cynomys error carrying the right retry marker."""
    where = redact_url(url)
    if isinstance(exc, (redis.AuthenticationError, redis.exceptions.AuthorizationError,
                        redis.exceptions.NoPermissionError)):
        return ConfigError(f"Redis at {where} refused our credentials while {doing}: {exc}",
                           hint="set user and password in [transport] url (or CYNOMYS_TRANSPORT_URL)")
    if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "certificate verify failed" in str(exc):
        # rediss:// verifies the server's certificate and host name; a
        # mismatch does not heal by retrying.
        return ConfigError(f"Redis at {where} presented a TLS certificate that does not verify: {exc}",
                           hint="add ?ssl_ca=/path/ca.pem (the CA that signed Redis's certificate) to [transport] "
                                "url, and use a host name the certificate holds")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError,
                        redis.exceptions.OutOfMemoryError)) or str(exc).startswith(_TRANSIENT_REPLIES):
        # OOM: the stream is full of entries no applier has acknowledged;
        # waiting for the applier is the right reaction (back-pressure).
        # READONLY/MASTERDOWN: a failover is in progress.  BUSY: a slow script.
        return TransportUnavailableError(f"Redis at {where} unavailable while {doing}: {exc}",
                                         hint="start Redis, or check host, port and TLS in [transport] url")
    if "WRONGTYPE" in str(exc):
        return ConfigError(f"Redis at {where}: a key used by the transport holds another type ({doing}): {exc}",
                           hint="choose another [transport] stream name or delete the key")
    return TransportRejectedError(f"Redis at {where} rejected a command while {doing}: {exc}")


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _stream_entries(resp: Any) -> list[Any]:
    """The (id, fields) list of the one stream in an XREAD/XREADGROUP reply
    (a list of [name, entries] pairs under RESP2, a dict under RESP3)."""
    if not resp:
        return []
    if isinstance(resp, dict):
        entries = next(iter(resp.values()))
        return list(entries[0]) if entries and isinstance(entries[0], list) else list(entries)
    return list(resp[0][1])


def _parse_id(v: Any) -> tuple[int, int]:
    ms, _, seq = _text(v).partition("-")
    return int(ms), int(seq or 0)


class _RedisPublisherBase:
    _script_text = ""
    # The script's "already holds this (producer, seq)" answer.
    _ALREADY = 0

    def __init__(self, cfg: TransportConfig) -> None:
        self._cfg = cfg
        self._url = redact_url(cfg.url)
        self._r = _client(cfg.url, PUBLISH_SOCKET_TIMEOUT_S)
        self._script = self._r.register_script(self._script_text)
        self._seq_key = f"{cfg.stream}:seq"
        # HA fencing: (lease key, "token:owner") while this process leads;
        # ("", "") publishes without a lease (a single producer).
        self._lease_key = f"{cfg.stream}:lease:-"
        self._lease_value = ""

    def fence(self, lease_key: str, lease_value: str) -> None:
        """Publish from now on only while ``lease_key`` holds ``lease_value``."""
        self._lease_key, self._lease_value = lease_key, lease_value

    def lease_holds(self) -> bool:
        """Whether the lease key holds our value now (True without a lease)."""
        if not self._lease_value:
            return True
        try:
            v = self._r.get(self._lease_key)
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"reading the HA lease {self._lease_key}") from exc
        return v is not None and _text(v) == self._lease_value

    def _fenced(self, result: int, seq: int, producer_id: str) -> None:
        if result == FENCED:
            raise LeaseLost(
                f"Redis at {self._url} refused envelope {seq} of {producer_id}: the HA lease {self._lease_key} "
                f"is no longer ours ({self._lease_value}); another producer took over or it expired",
                hint="nothing to do: this producer stands by again (if it happens often, raise [producer] "
                     "lease_ms or find what pauses the producer)")

    def _run(self, producer_id: str, seq: int, envelope: bytes, stop: threading.Event | None) -> tuple[int, int]:
        """Run the publish script until Redis accepts it (see Publisher.publish).
        Returns (script result, attempts)."""
        backoff = Backoff(first=0.05, cap=5.0)
        attempt = 0
        while True:
            attempt += 1
            try:
                result = int(self._call(producer_id, seq, envelope))
                if result == self._ALREADY:
                    # Inside the retry: a Redis error while checking runs
                    # the (idempotent) script again and checks again.
                    self._check_held(producer_id, seq, envelope, attempt)
            except redis.RedisError as exc:
                err = translate(exc, self._cfg.url, f"publishing envelope {seq} of {producer_id}")
                if not err.transient or (stop is not None and stop.is_set()):
                    raise err from exc
                delay = backoff.next()
                log.warning("Redis at %s did not accept envelope %d of %s (%s); retry %d in %.2fs",
                            self._url, seq, producer_id, exc, attempt, delay)
                if stop is None:
                    time.sleep(delay)
                elif stop.wait(delay):
                    raise TransportUnavailableError(
                        f"Redis at {self._url} still unavailable when asked to stop; "
                        f"envelope {seq} of {producer_id} may not have been published") from exc
                continue
            if attempt > 1:
                log.info("Redis at %s accepted envelope %d of %s after %d attempts",
                         self._url, seq, producer_id, attempt)
            return result, attempt

    def _call(self, producer_id: str, seq: int, envelope: bytes) -> Any:
        raise NotImplementedError

    def _check_held(self, producer_id: str, seq: int, envelope: bytes, attempt: int) -> None:
        """Return if the script's "already holds" answer for (producer, seq)
        is borne out; else raise TransportStateAltered.  May raise
        redis.RedisError (the caller retries)."""
        raise NotImplementedError

    def _held(self, producer_id: str) -> str:
        """What S:seq holds for ``producer_id`` now (for messages)."""
        v = self._r.hget(self._seq_key, producer_id)
        return _text(v) if v is not None else "nothing"

    def last_sequence(self, producer_id: str) -> int:
        try:
            v = self._r.hget(self._seq_key, producer_id)
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"reading the last sequence of {producer_id}") from exc
        return int(v) if v is not None else 0

    def close(self) -> None:
        self._r.close()


class RedisStreamPublisher(_RedisPublisherBase):
    """XADD to the stream (at-least-once with RedisStreamSubscriber)."""

    _script_text = _STREAM_PUBLISH

    def __init__(self, cfg: TransportConfig) -> None:
        super().__init__(cfg)
        self._since_trim = 0
        self._warned_no_group = False

    def _call(self, producer_id: str, seq: int, envelope: bytes) -> Any:
        return self._script(keys=[self._cfg.stream, self._seq_key, self._lease_key],
                            args=[producer_id, seq, envelope, self._lease_value])

    def publish(self, producer_id: str, seq: int, envelope: bytes, stop: threading.Event | None = None) -> None:
        result, _ = self._run(producer_id, seq, envelope, stop)
        self._fenced(result, seq, producer_id)
        self._since_trim += 1
        if self._since_trim >= TRIM_EVERY:
            self._since_trim = 0
            self._trim_if_long()

    def _check_held(self, producer_id: str, seq: int, envelope: bytes, attempt: int) -> None:
        """The entry (producer, seq) must be in the stream and hold this
        envelope (bus.same_envelope): then the applier gets it, and
        returning as if accepted is true.  Else S:seq was raised, or the
        entry deleted (XDEL) or trimmed: writing nothing and returning would
        lose the envelope silently, so stop.  A deleted entry is not written
        again on purpose: someone removed it, and a person should look."""
        found, seen, newest = self._find_entry(producer_id, seq, envelope)
        if found:
            # On a retry "already there" is expected (the lost reply's
            # command ran); on a first attempt the producer re-sent it.
            log.log(logging.WARNING if attempt == 1 else logging.INFO,
                    "stream %s already holds envelope %d of %s (entry checked); not written again",
                    self._cfg.stream, seq, producer_id)
            return
        stream, held = self._cfg.stream, self._held(producer_id)
        restore = str(newest) if newest is not None else "<the seq of its newest entry>"
        raise TransportStateAltered(
            f"Redis at {self._url} claims stream {stream} already holds envelope {seq} of producer "
            f"{producer_id!r} ({self._seq_key} says {held}), but {seen}: another writer altered the sequence state "
            f"or the entries; nothing was written and the producer stops before skipping changes",
            hint=f"check the stream (XREVRANGE {stream} + - COUNT 20), restore the sequence state with "
                 f"HSET {self._seq_key} {producer_id} {restore} (the last envelope really there), then restart "
                 f"the producer: it sends the rest again")

    def _find_entry(self, producer_id: str, seq: int, envelope: bytes) -> tuple[bool, str, int | None]:
        """Look for the entry (producer, seq) holding ``envelope`` from the
        tail down (see _HELD_SCAN_LIMIT).  Returns (found, what was seen
        instead for a message, the seq of the newest entry of the producer
        below ``seq`` if met)."""
        want = producer_id.encode("utf-8")
        top, count, scanned = "+", 2, 0
        other = ""
        while scanned < _HELD_SCAN_LIMIT:
            # Growing pages: a genuine entry is at or next to the tail, so
            # the first page is tiny; envelopes can be large.
            page = self._r.xrevrange(self._cfg.stream, max=top, min="-", count=min(count, _HELD_SCAN_LIMIT - scanned))
            if not page:
                return False, (other or f"the stream holds no entry of {producer_id!r} at or below it"), None
            for _, fields in page:
                scanned += 1
                if not fields or fields.get(b"producer") != want:
                    continue
                try:
                    entry_seq = int(fields[b"seq"])
                except (KeyError, ValueError):
                    continue  # not a publisher's entry (the applier dead-letters it)
                if entry_seq == seq:
                    stored = fields.get(b"env")
                    if isinstance(stored, bytes) and same_envelope(stored, envelope):
                        return True, "", None
                    # Keep looking: an older entry may be the real one.
                    other = f"its entry numbered {seq} holds another envelope"
                elif entry_seq < seq:
                    # Entries of one producer are in seq order: ours would be above.
                    return False, (other or f"the newest entry of {producer_id!r} below it is envelope "
                                            f"{entry_seq}"), entry_seq
            top = f"({_text(page[-1][0])}"  # exclusive: continue below the last id seen
            count = min(count * 2, _TAIL_PAGE)
        return False, (other or f"it is not among the newest {_HELD_SCAN_LIMIT} entries"), None

    def _trim_if_long(self) -> None:
        try:
            try:
                length = int(self._r.xlen(self._cfg.stream))
            except redis.RedisError as exc:
                raise translate(exc, self._cfg.url, f"measuring stream {self._cfg.stream}") from exc
            if length > self._cfg.max_stream_len:
                self.trim()
        except TransportUnavailableError as exc:
            # Trimming is housekeeping: the envelope is already accepted, and
            # the next TRIM_EVERY publishes try again.
            log.warning("could not trim stream %s at %s: %s", self._cfg.stream, self._url, exc)

    def trim(self) -> int:
        """Remove entries every consumer group has acknowledged; return how many.

        The cut is ``XTRIM MINID ~ B`` with B the smallest of, over all groups,
        the oldest pending id and the id just after last-delivered-id: entries
        below B have been delivered *and* acknowledged.  Never MAXLEN, which
        would drop entries an applier has not committed yet.  ``~`` lets Redis
        trim less (whole nodes only), never more."""
        stream = self._cfg.stream
        try:
            if not self._r.exists(stream):
                return 0  # deleted meanwhile: nothing to trim (XINFO would say "no such key")
            groups = self._r.xinfo_groups(stream)
            if not groups:
                if not self._warned_no_group:
                    log.warning("stream %s has no consumer group yet; nothing is trimmed until an applier "
                                "has acknowledged entries", stream)
                    self._warned_no_group = True
                return 0
            boundary: tuple[int, int] | None = None
            for g in groups:
                ms, sq = _parse_id(g["last-delivered-id"])
                cut = (ms, sq + 1)
                if int(g["pending"]) > 0:
                    pend = self._r.xpending(stream, g["name"])
                    if pend["min"] is not None:
                        cut = min(cut, _parse_id(pend["min"]))
                boundary = cut if boundary is None else min(boundary, cut)
            assert boundary is not None
            # Keep the newest entry whatever the groups say: last_sequence's
            # fallback reads the stream's tail.
            newest = self._r.xinfo_stream(stream)["last-generated-id"]
            boundary = min(boundary, _parse_id(newest))
            removed = int(self._r.xtrim(stream, minid=f"{boundary[0]}-{boundary[1]}", approximate=True))
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"trimming stream {stream}") from exc
        if removed:
            log.debug("trimmed %d acknowledged entries from stream %s (below %d-%d)", removed, stream, *boundary)
        return removed

    def last_sequence(self, producer_id: str) -> int:
        """From the ``S:seq`` hash (written atomically with each XADD); if the
        hash has no entry (stream written by an older tool, hash deleted),
        from the newest stream entry of this producer."""
        seq = super().last_sequence(producer_id)
        return seq if seq else self._scan_tail(producer_id)

    def _scan_tail(self, producer_id: str) -> int:
        want = producer_id.encode("utf-8")
        top: str = "+"
        try:
            while True:
                page = self._r.xrevrange(self._cfg.stream, max=top, min="-", count=_TAIL_PAGE)
                if not page:
                    return 0
                for _, fields in page:
                    if fields and fields.get(b"producer") == want:
                        return int(fields[b"seq"])
                top = f"({_text(page[-1][0])}"  # exclusive: continue below the last id seen
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"scanning stream {self._cfg.stream} for {producer_id}") from exc


class RedisPubSubPublisher(_RedisPublisherBase):
    """PUBLISH on channel = stream name (at-most-once, as in the Cynomys paper).

    The script's "already" answer (-1) rests on S:seq alone, and a channel
    keeps nothing to check it against.  What this publisher can check is
    its own memory: ``_known``, per producer, the highest seq this process
    saw the transport hold -- from last_sequence (the producer reads it at
    start) and from each publish accepted here.  The producer only publishes
    numbers after those (Producer._recover_pending settles the one that was
    in flight at a crash), so "already" for a seq above ``_known`` is only
    genuine on a retry whose lost first attempt ran, and then S:seq holds
    exactly that seq.  Anything else (a raised S:seq, or a publisher never
    told what the transport held) is TransportStateAltered.  Not caught: a
    writer setting S:seq to exactly the seq being retried, in the moment
    between our two attempts."""

    _script_text = _PUBSUB_PUBLISH
    _ALREADY = -1

    def __init__(self, cfg: TransportConfig) -> None:
        super().__init__(cfg)
        self._warned_no_subscriber = False
        self._known: dict[str, int] = {}

    def last_sequence(self, producer_id: str) -> int:
        seq = super().last_sequence(producer_id)
        self._known[producer_id] = max(self._known.get(producer_id, 0), seq)
        return seq

    def _check_held(self, producer_id: str, seq: int, envelope: bytes, attempt: int) -> None:
        if seq <= self._known.get(producer_id, 0):
            log.warning("channel %s already had envelope %d of %s (this process saw it accepted); not published "
                        "again", self._cfg.stream, seq, producer_id)
            return
        held = self._held(producer_id)
        if attempt > 1 and held == str(seq):
            log.info("channel %s already had envelope %d of %s (the lost reply's attempt ran)",
                     self._cfg.stream, seq, producer_id)
            return
        stream = self._cfg.stream
        restore = self._known.get(producer_id, 0)
        raise TransportStateAltered(
            f"Redis at {self._url} claims channel {stream} already had envelope {seq} of producer {producer_id!r} "
            f"({self._seq_key} says {held}), but this process saw it accept only up to "
            f"{restore or 'nothing'}: the transport's sequence state was altered; nothing was published and "
            f"the producer stops before skipping changes",
            hint=f"restore it with HSET {self._seq_key} {producer_id} {restore or '<the last seq really sent>'}, "
                 f"then restart the producer")

    def _call(self, producer_id: str, seq: int, envelope: bytes) -> Any:
        return self._script(keys=[self._seq_key, self._lease_key],
                            args=[producer_id, seq, envelope, self._cfg.stream, self._lease_value])

    def publish(self, producer_id: str, seq: int, envelope: bytes, stop: threading.Event | None = None) -> None:
        receivers, _ = self._run(producer_id, seq, envelope, stop)
        self._fenced(receivers, seq, producer_id)
        self._known[producer_id] = max(self._known.get(producer_id, 0), seq)
        if receivers == 0:
            if not self._warned_no_subscriber:
                log.warning("no subscriber on channel %s at %s: envelope %d of %s is lost (pub/sub is "
                            "at-most-once); said once until a subscriber is back", self._cfg.stream, self._url,
                            seq, producer_id)
                self._warned_no_subscriber = True
        elif receivers > 0:
            self._warned_no_subscriber = False


class _DeadLetters:
    """XADD rejected envelopes to the dead-letter stream, capped (nobody
    consumes it: approximate MAXLEN is fine there)."""

    def __init__(self, r: redis.Redis, cfg: TransportConfig) -> None:
        self._r = r
        self.stream = cfg.dead_letter_stream or f"{cfg.stream}:dead"
        self.cap = cfg.max_stream_len

    def fields(self, delivery: Delivery, reason: str, source: str, consumer: str) -> dict[Any, Any]:
        return {"env": delivery.envelope, "reason": reason, "id": delivery.id, "stream": source,
                "consumer": consumer, "at_ms": int(time.time() * 1000)}

    def describe(self, delivery: Delivery) -> str:
        try:
            h = peek_header(delivery.envelope)
        except EnvelopeRejected as exc:
            return f"entry {delivery.id} (header unreadable: {exc.reason})"
        return f"entry {delivery.id} (claims producer {h.producer_id!r} seq {h.seq})"


class RedisStreamSubscriber:
    """Reads the stream through a consumer group; at-least-once.

    Recovery order matters for the sequence check downstream: at start (and
    after any connection error, when a reply may have been lost) we first
    take over entries other consumers left idle for min-idle (XPENDING IDLE
    + XCLAIM, ids only), then re-read our own pending list from id 0 — now
    holding both, in stream order — and only then new entries ('>').  While
    running, XAUTOCLAIM every ``claim_interval_s`` picks up entries of a
    consumer that died meanwhile.  One applier should read a group at a time: a group
    spreads new entries across its consumers, which would break per-producer
    order."""

    def __init__(self, cfg: TransportConfig, consumer_name: str, *,
                 claim_min_idle_ms: int = DEFAULT_CLAIM_MIN_IDLE_MS,
                 claim_interval_s: float = CLAIM_INTERVAL_S, sibling_groups: Sequence[str] = ()) -> None:
        self._cfg = cfg
        self._url = redact_url(cfg.url)
        self._r = _client(cfg.url, SUBSCRIBE_SOCKET_TIMEOUT_S)
        self._stream = cfg.stream
        self._group = cfg.consumer_group
        # Partitioned appliers: the other partitions' groups, created with ours.
        self._groups = [self._group, *(g for g in sibling_groups if g != self._group)]
        self.consumer = consumer_name
        self._dead = _DeadLetters(self._r, cfg)
        self._min_idle = claim_min_idle_ms
        self._claim_interval = claim_interval_s
        self._group_ready = False
        self._recovering = True
        self._took_over = False
        self._pel_cursor = "0"
        self._claim_cursor = "0-0"
        self._next_claim = 0.0
        # Ids handed out and not yet acked: a periodic XAUTOCLAIM may return
        # them (the applier may hold them longer than min idle) and they must
        # not be delivered twice in one life.
        self._in_flight: set[str] = set()

    def read(self, count: int, block_ms: int) -> list[Delivery]:
        try:
            self._ensure_group()
            if self._recovering:
                if not self._took_over:
                    self._take_over_idle()
                    self._took_over = True
                out = self._read_own_pending(count)
                if out:
                    return out
                self._recovering = False
            if time.monotonic() >= self._next_claim:
                out = self._claim_idle(count)
                if out:
                    return out
            return self._read_new(count, block_ms)
        except redis.RedisError as exc:
            # A lost reply may have moved entries into our pending list that we
            # never saw: re-read it before any new entry.
            self._recovering = True
            self._took_over = False
            self._pel_cursor = "0"
            text = str(exc)
            if "NOGROUP" in text or "UNBLOCKED" in text or "no such key" in text:
                # The stream (and with it the group) was deleted or lost:
                # by hand (DEL), a FLUSHALL, a Redis restarted without
                # persistence.  Not terminal: the group is recreated and the
                # producer's next XADD recreates the stream.  What the stream
                # held unacknowledged is gone; the sequence check reports it.
                self._group_ready = False
                log.error("stream %s or its consumer group %s vanished at %s (%s): recreating the group; "
                          "entries not yet acknowledged are lost with it, and the applier reports any "
                          "missing sequence numbers", self._stream, self._group, self._url, text)
                raise TransportUnavailableError(
                    f"stream {self._stream} or its consumer group {self._group} at {self._url} vanished "
                    "(deleted, flushed, or Redis restarted without persistence); it will be recreated",
                    hint="nothing to do if the stream was reset on purpose; otherwise find who deletes it") from exc
            raise translate(exc, self._cfg.url, f"reading stream {self._stream}") from exc

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        for group in self._groups:
            try:
                # Id 0: a new group starts at the beginning of the stream, so
                # entries published before the first applier started are applied.
                self._r.xgroup_create(self._stream, group, id="0", mkstream=True)
                log.info("created consumer group %s on stream %s at %s", group, self._stream, self._url)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._group_ready = True

    def _deliveries(self, entries: list[Any], redelivered: bool) -> list[Delivery]:
        out: list[Delivery] = []
        gone: list[str] = []
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            if entry_id in self._in_flight:
                continue
            if not fields:
                # XREADGROUP/XCLAIM return an id without fields for an entry
                # that was XDEL'd while pending.
                gone.append(entry_id)
                continue
            if b"env" not in fields:
                # Present but not ours (another writer, a tool, a bug): set
                # it aside where it can be inspected, never acknowledge it
                # as if nothing happened.
                self._dead_letter_foreign(entry_id, fields)
                continue
            self._in_flight.add(entry_id)
            out.append(Delivery(entry_id, bytes(fields[b"env"]), redelivered))
        if gone:
            self._drop_deleted(gone)
        return out

    def _dead_letter_foreign(self, entry_id: str, fields: dict[Any, Any]) -> None:
        names = ", ".join(sorted(_text(k) for k in fields))
        reason = f"no-envelope-field: the entry has fields [{names}] and no 'env'"
        dead = self._dead.fields(Delivery(entry_id, b""), reason, self._stream, self.consumer)
        # The entry's own fields travel along (prefixed), for whoever inspects it.
        dead.update({f"orig.{_text(k)}": v for k, v in fields.items()})
        with self._r.pipeline(transaction=True) as pipe:
            pipe.xadd(self._dead.stream, dead, maxlen=self._dead.cap, approximate=True)
            pipe.xack(self._stream, self._group, entry_id)
            pipe.execute()
        log.error("stream %s: entry %s is not a Cynomys envelope (fields: %s); dead-lettered to %s",
                  self._stream, entry_id, names, self._dead.stream)

    def _drop_deleted(self, ids: list[str]) -> None:
        # An entry deleted while pending cannot be redelivered; acknowledge it
        # so it leaves the pending list.  The sequence check downstream reports
        # the hole with the missing range.
        log.error("stream %s: pending entries %s were deleted before being acknowledged; "
                  "the applier will report the missing sequence numbers", self._stream, ", ".join(ids))
        self._r.xack(self._stream, self._group, *ids)

    def _take_over_idle(self) -> None:
        """Startup: move every entry other consumers left idle for min-idle
        into our pending list (ids only; _read_own_pending then returns them
        with our own, in stream order)."""
        start = "-"
        taken = 0
        while True:
            pending = self._r.xpending_range(self._stream, self._group, min=start, max="+", count=500,
                                             idle=self._min_idle)
            if not pending:
                break
            ids: list[Any] = [_text(p["message_id"]) for p in pending if _text(p["consumer"]) != self.consumer]
            if ids:
                taken += len(self._r.xclaim(self._stream, self._group, self.consumer, self._min_idle, ids,
                                            justid=True))
            start = "(" + _text(pending[-1]["message_id"])
        if taken:
            log.warning("took over %d entries left idle by crashed consumers of group %s", taken, self._group)
        self._claim_cursor = "0-0"
        self._next_claim = time.monotonic() + self._claim_interval

    def _claim_idle(self, count: int) -> list[Delivery]:
        """Periodic XAUTOCLAIM of entries idle for min-idle (a consumer died
        while we run).  They come after newer entries we have already read."""
        resp = self._r.xautoclaim(self._stream, self._group, self.consumer, self._min_idle,
                                  start_id=self._claim_cursor, count=count)
        cursor, claimed = resp[0], resp[1]
        deleted = [_text(i) for i in resp[2]] if len(resp) > 2 else []
        if deleted:
            log.error("stream %s: idle pending entries %s were deleted before being acknowledged",
                      self._stream, ", ".join(deleted))
        self._claim_cursor = _text(cursor)
        if self._claim_cursor == "0-0":
            self._next_claim = time.monotonic() + self._claim_interval
        out = self._deliveries(claimed, redelivered=True)
        if out:
            log.warning("took over %d idle entries (from %s) of consumer group %s", len(out), out[0].id, self._group)
        return out

    def _read_own_pending(self, count: int) -> list[Delivery]:
        while True:
            entries = _stream_entries(
                self._r.xreadgroup(self._group, self.consumer, {self._stream: self._pel_cursor}, count=count))
            if not entries:
                return []
            self._pel_cursor = _text(entries[-1][0])
            out = self._deliveries(entries, redelivered=True)
            if out:
                return out

    def _read_new(self, count: int, block_ms: int) -> list[Delivery]:
        block = min(block_ms, MAX_BLOCK_MS)
        # BLOCK 0 means "forever" to Redis; block_ms 0 means "don't wait" here.
        entries = _stream_entries(self._r.xreadgroup(self._group, self.consumer, {self._stream: ">"},
                                                     count=count, block=block if block > 0 else None))
        return self._deliveries(entries, redelivered=False)

    def ack(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        try:
            self._r.xack(self._stream, self._group, *ids)
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"acknowledging {len(ids)} entries of {self._stream}") from exc
        self._in_flight.difference_update(ids)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        # XADD + XACK in one MULTI/EXEC: the entry is either set aside and
        # acknowledged, or still pending — never acknowledged and lost.
        try:
            with self._r.pipeline(transaction=True) as pipe:
                pipe.xadd(self._dead.stream, self._dead.fields(delivery, reason, self._stream, self.consumer),
                          maxlen=self._dead.cap, approximate=True)
                pipe.xack(self._stream, self._group, delivery.id)
                pipe.execute()
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"dead-lettering entry {delivery.id}") from exc
        self._in_flight.discard(delivery.id)
        log.warning("dead-lettered %s to %s: %s", self._dead.describe(delivery), self._dead.stream, reason)

    def close(self) -> None:
        self._r.close()


class RedisPubSubSubscriber:
    """SUBSCRIBE to channel = stream name.  At-most-once: what is published
    while this subscriber is not connected is gone; ``ack`` does nothing."""

    def __init__(self, cfg: TransportConfig) -> None:
        self._cfg = cfg
        self._url = redact_url(cfg.url)
        self._r = _client(cfg.url, SUBSCRIBE_SOCKET_TIMEOUT_S)
        self._dead = _DeadLetters(self._r, cfg)
        self._channel = cfg.stream
        self._ps = self._r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        self._subscribed = False
        self._counter = 0

    def read(self, count: int, block_ms: int) -> list[Delivery]:
        out: list[Delivery] = []
        deadline = time.monotonic() + block_ms / 1000.0
        try:
            if not self._subscribed:
                self._ps.subscribe(self._channel)
                self._subscribed = True
            while len(out) < count:
                # Wait for the first message only; then take what is buffered.
                timeout = max(0.0, deadline - time.monotonic()) if not out else 0.0
                msg = self._ps.get_message(timeout=timeout)
                if msg is None:
                    if out or time.monotonic() >= deadline:
                        break
                    continue
                if msg.get("type") != "message":
                    continue
                self._counter += 1
                out.append(Delivery(f"pubsub-{self._counter}", bytes(msg["data"]), False))
        except redis.RedisError as exc:
            # The subscription died with the connection; subscribe afresh next
            # time.  Whatever was published meanwhile is lost (at-most-once).
            self._ps.close()
            self._ps = self._r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            self._subscribed = False
            raise translate(exc, self._cfg.url, f"receiving from channel {self._channel}") from exc
        return out

    def ack(self, ids: Sequence[str]) -> None:
        """Nothing to acknowledge in pub/sub."""

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        try:
            self._r.xadd(self._dead.stream, self._dead.fields(delivery, reason, self._channel, "pubsub"),
                         maxlen=self._dead.cap, approximate=True)
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"dead-lettering {delivery.id}") from exc
        log.warning("dead-lettered %s to %s: %s", self._dead.describe(delivery), self._dead.stream, reason)

    def close(self) -> None:
        self._ps.close()
        self._r.close()
