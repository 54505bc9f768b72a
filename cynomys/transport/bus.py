"""Transport interfaces (Publisher / Subscriber) and the factory.

Delivery semantics by transport (details in FORMAT.md):

* Redis stream + consumer group (default): at-least-once.  An entry stays in
  the stream until the applier acknowledges it after its target commit;
  a crashed applier gets its unacknowledged entries again (redelivered=True).
* Redis pub/sub (the paper's transport): at-most-once.  A subscriber that is
  down or too slow loses messages; the SequenceTracker detects the hole.
* File: an append-only local file; the read offset advances on ack only.

Duplicates are possible with every transport; the applier removes them with
the per-producer sequence numbers (SequenceTracker), not the transport.

Every publisher is idempotent per (producer, seq) and answers "already
there" for a number it holds.  That answer is never taken on trust: a
publisher accepts it only when it can show the envelope (``same_envelope``),
or, in pub/sub where nothing is kept, when it is consistent with what this
process saw accepted.  Otherwise it raises TransportStateAltered: someone
raised the transport's sequence state or deleted the entry, and taking the
answer would make the producer move its checkpoint over changes nobody got.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence
from urllib.parse import urlsplit, urlunsplit

from cynomys.core.config import TransportConfig
from cynomys.core.errors import ConfigError, EnvelopeRejected, TerminalError
from cynomys.transport.envelope import peek_header

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """One envelope as handed out by a Subscriber.  ``id`` is transport-specific
    and only meaningful to the same Subscriber's ``ack``/``dead_letter``."""

    id: str
    envelope: bytes
    redelivered: bool = False


class TransportStateAltered(TerminalError):
    """The transport answers "already holds envelope N of producer P" but
    cannot show that envelope: its sequence state was raised, or the entry
    deleted, by a writer other than the publisher.  Terminal: the producer
    must stop before its checkpoint moves over changes nobody received."""


def same_envelope(stored: bytes, ours: bytes) -> bool:
    """Whether ``stored`` (what the transport holds under our producer and
    seq) is the envelope ``ours`` stands for.

    The same bytes: a retry whose lost first attempt was written.  Otherwise
    both headers must name the same producer, stream and seq: the producer
    re-sealing the same batch after a crash gets other bytes (a fresh data
    key, nonce and sealing time), so bytes cannot be required.  The header
    is signed, but the publisher holds no verifying key, so this reads it
    unverified: a Redis (or file) writer can plant an entry whose forged
    header names P and N and get it accepted here.  That is not silent: the
    applier checks the signature, dead-letters the forgery (bad-signature)
    and stops on the hole at N (SequenceGapError).  What this check rules out
    is the silent case, a raised sequence state with no entry behind it."""
    if stored == ours:
        return True
    try:
        a, b = peek_header(stored), peek_header(ours)
    except EnvelopeRejected:
        return False
    return (a.producer_id, a.stream, a.seq) == (b.producer_id, b.stream, b.seq)


class Publisher(Protocol):
    def last_sequence(self, producer_id: str) -> int:
        """Highest sequence the transport has accepted from ``producer_id`` (0: none)."""
        ...

    def publish(self, producer_id: str, seq: int, envelope: bytes, stop: threading.Event | None = None) -> None:
        """Return once the transport accepted the envelope; retry while it is
        down; raise TransportUnavailableError only when ``stop`` is set, and
        TransportStateAltered when it claims to hold ``seq`` but cannot show it."""
        ...

    def close(self) -> None: ...


class Subscriber(Protocol):
    def read(self, count: int, block_ms: int) -> list[Delivery]:
        """Up to ``count`` deliveries, waiting at most ``block_ms`` for the first."""
        ...

    def ack(self, ids: Sequence[str]) -> None:
        """The envelopes are applied (target committed): never deliver them again."""
        ...

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Set a delivery aside (rejected envelope) and acknowledge it."""
        ...

    def close(self) -> None: ...


class Backoff:
    """Exponential backoff delays: first, 2*first, ... capped at ``cap`` seconds."""

    def __init__(self, first: float = 0.05, cap: float = 5.0) -> None:
        self._first = first
        self._cap = cap
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self._cap, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self._first


# Query parameters whose value is a secret (redis-py reads ?password=...,
# pymysql-style URLs ?ssl_password=..., tokens in REST catalog URLs).
_SECRET_PARAM_WORDS = ("pass", "pwd", "secret", "token", "auth", "credential")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ***, fit for logs: the one in
    ``user:password@`` and any secret-looking query parameter.  Works on
    malformed URLs too (a bad port must not crash the error message that
    reports it), so it never uses urlsplit's port parsing."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostport}"
    query = "&".join(_redact_param(p) for p in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    if eq and any(w in name.lower() for w in _SECRET_PARAM_WORDS):
        return f"{name}=***"
    return param


def _file_path(cfg: TransportConfig) -> Path:
    if not cfg.path:
        raise ConfigError('[transport] kind = "file" needs a path', hint="set [transport] path to the transport file")
    return Path(cfg.path)


def open_publisher(cfg: TransportConfig) -> Publisher:
    """The Publisher for ``cfg`` (Redis stream, Redis pub/sub or file).
    ``cfg.path`` must already be resolved against the config file's folder."""
    if cfg.kind == "file":
        from cynomys.transport.file_bus import FilePublisher

        return FilePublisher(_file_path(cfg))
    from cynomys.transport.redis_bus import RedisPubSubPublisher, RedisStreamPublisher

    if cfg.mode == "pubsub":
        return RedisPubSubPublisher(cfg)
    return RedisStreamPublisher(cfg)


def open_subscriber(cfg: TransportConfig, consumer_name: str, *, claim_min_idle_ms: int | None = None,
                    sibling_groups: Sequence[str] = ()) -> Subscriber:
    """The Subscriber for ``cfg``.  ``consumer_name`` must be stable across
    restarts of one applier: it is how a restarted applier finds the entries
    it had read but not acknowledged.  ``sibling_groups``: consumer groups
    of the other partitions (Redis stream), created with ours."""
    if cfg.kind == "file":
        from cynomys.transport.file_bus import FileSubscriber

        return FileSubscriber(_file_path(cfg), consumer_name)
    from cynomys.transport.redis_bus import DEFAULT_CLAIM_MIN_IDLE_MS, RedisPubSubSubscriber, RedisStreamSubscriber

    if cfg.mode == "pubsub":
        return RedisPubSubSubscriber(cfg)
    idle = DEFAULT_CLAIM_MIN_IDLE_MS if claim_min_idle_ms is None else claim_min_idle_ms
    return RedisStreamSubscriber(cfg, consumer_name, claim_min_idle_ms=idle, sibling_groups=sibling_groups)
