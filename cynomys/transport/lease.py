"""The HA producer's lease, fencing token and shared state, in Redis.

Keys, for stream S and producer id P (on the transport's Redis, next to the
stream, so the checkpoint and the envelopes live and die together):

* ``S:lease:P``  "token:owner" while a producer holds the lease; set with NX
                 and PX ``lease_ms``, renewed by its holder (compare-and-PEXPIRE);
* ``S:fence:P``  the fencing counter: INCR on every acquisition, so each
                 lease term has a token larger than every earlier one;
* ``S:state:P``  the producer's state (ProducerState as JSON), written only
                 while the lease holds the writer's value (compare-and-SET).

Every write a leader makes (state, envelope) is checked against the lease in
the same Lua script that makes it: a leader that was paused past its lease
(SIGSTOP, a VM freeze) and wakes up cannot write anything, even before it
notices.  The acquisition is one script too (EXISTS, INCR, SET): two
standbys cannot both get a term, and a token is never handed out twice.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import redis

from cynomys.core.config import TransportConfig
from cynomys.core.errors import LeaseLost
from cynomys.transport.bus import redact_url
from cynomys.transport.redis_bus import redis_client, translate

log = logging.getLogger(__name__)

# Lease commands are small; a reply slower than this is "Redis is slow",
# and the renewer must notice well within one lease.
LEASE_SOCKET_TIMEOUT_S = 2.0

_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'PX', ARGV[2])
return {token, ''}
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_SAVE_STATE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


class RedisLease:
    """One producer process's view of the lease of producer ``producer_id``.

    ``owner`` names this process (host, pid, random part): it is how a
    holder recognises its own lease, and what `cynomys status` and the
    tests show as the leader."""

    def __init__(self, cfg: TransportConfig, producer_id: str, owner: str, lease_ms: int) -> None:
        self._cfg = cfg
        self._url = redact_url(cfg.url)
        self._r = redis_client(cfg.url, LEASE_SOCKET_TIMEOUT_S)
        self.producer_id = producer_id
        self.owner = owner
        self.lease_ms = lease_ms
        self.key = f"{cfg.stream}:lease:{producer_id}"
        self.fence_key = f"{cfg.stream}:fence:{producer_id}"
        self.state_key = f"{cfg.stream}:state:{producer_id}"
        self.token = 0
        self._acquire = self._r.register_script(_ACQUIRE)
        self._renew = self._r.register_script(_RENEW)
        self._release = self._r.register_script(_RELEASE)
        self._save = self._r.register_script(_SAVE_STATE)

    @property
    def value(self) -> str:
        """What the lease key holds while this process holds the current term."""
        return f"{self.token}:{self.owner}"

    def _call(self, doing: str, fn: Any, **kw: Any) -> Any:
        try:
            return fn(**kw)
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, doing) from exc

    def acquire(self) -> int | None:
        """A new term's fencing token, or None while another process holds the lease."""
        token, holder = self._call(f"acquiring the HA lease {self.key}", self._acquire,
                                   keys=[self.key, self.fence_key], args=[self.owner, self.lease_ms])
        if int(token) == 0:
            return None
        self.token = int(token)
        return self.token

    def renew(self) -> bool:
        """Extend our term by ``lease_ms``; False when the lease is no longer ours."""
        return bool(int(self._call(f"renewing the HA lease {self.key}", self._renew,
                                   keys=[self.key], args=[self.value, self.lease_ms])))

    def release(self) -> bool:
        """Give the lease up (clean shutdown: a standby takes over at once)."""
        return bool(int(self._call(f"releasing the HA lease {self.key}", self._release,
                                   keys=[self.key], args=[self.value])))

    def holder(self) -> str | None:
        """The lease key's value ("token:owner"), None when nobody holds it."""
        try:
            v = self._r.get(self.key)
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"reading the HA lease {self.key}") from exc
        return _text(v) if v is not None else None

    def load_state(self) -> dict[str, Any] | None:
        try:
            v = self._r.get(self.state_key)
        except redis.RedisError as exc:
            raise translate(exc, self._cfg.url, f"reading the producer state {self.state_key}") from exc
        if v is None:
            return None
        data = json.loads(_text(v))
        return data if isinstance(data, dict) else None

    def save_state(self, data: dict[str, Any]) -> None:
        """Write the state while our term holds; LeaseLost otherwise (nothing written)."""
        ok = int(self._call(f"writing the producer state {self.state_key}", self._save,
                            keys=[self.key, self.state_key], args=[self.value, json.dumps(data, sort_keys=True)]))
        if not ok:
            raise LeaseLost(
                f"Redis at {self._url} refused the producer state of {self.producer_id!r}: the HA lease "
                f"{self.key} is no longer ours ({self.value}); another producer took over or it expired",
                hint="nothing to do: this producer stands by again")

    def describe(self) -> str:
        return f"Redis key {self.state_key} at {self._url}"

    def close(self) -> None:
        self._r.close()
