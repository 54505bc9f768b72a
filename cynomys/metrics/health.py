"""A daemon's health: loop heartbeat, reachability checks, lag -> a verdict.

The daemon's loop calls ``beat()`` every turn; a reachability check (the
producer's source, the applier's target) reports with ``checked()`` every
``[metrics] health_interval_s``; errors that make the daemon retry report
with ``failed()``.  ``verdict()`` says healthy or not and why; it is what
/healthz answers and what the daemon writes for `cynomys status`.

Unhealthy when: the loop has not turned or the first check has not run
yet (starting); the loop made no progress for ``stall_intervals`` intervals
(stalled: a hung call, a retry loop that never gets through); the last
check failed, or no check succeeded for ``stall_intervals`` intervals (a
loop that stopped checking is not evidence that things are fine); an error
was raised after the last loop turn (the daemon is backing off); the lag is
over ``max_lag_s``.  Each rule names itself in ``reasons``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cynomys.core.config import MetricsConfig


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    reasons: tuple[str, ...]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"status": "healthy" if self.healthy else "unhealthy", "reasons": list(self.reasons), **self.details}


class Health:
    """Thread-safe: written by the daemon's threads, read by the HTTP thread."""

    def __init__(self, cfg: MetricsConfig, daemon: str, checks: str) -> None:
        self.interval = cfg.health_interval_s
        self.stall_s = cfg.health_interval_s * cfg.stall_intervals
        self.max_lag_s = cfg.max_lag_s
        self.daemon = daemon
        self.checks = checks          # what the reachability check reaches: "source" / "target"
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._beat: float | None = None
        self._check_at: float | None = None        # last check, ok or not
        self._check_ok_at: float | None = None
        self._check_error: str | None = None
        self._error_at: float | None = None
        self._error: str | None = None
        self._lag_s: float | None = None

    # -- written by the daemon -------------------------------------------
    def beat(self) -> None:
        with self._lock:
            self._beat = time.monotonic()

    def check_due(self) -> bool:
        with self._lock:
            return self._check_at is None or time.monotonic() - self._check_at >= self.interval

    def checked(self, error: str | None) -> None:
        """The result of one reachability check (``None``: reached)."""
        with self._lock:
            now = time.monotonic()
            self._check_at = now
            self._check_error = error
            if error is None:
                self._check_ok_at = now

    def failed(self, message: str) -> None:
        """An error the daemon is retrying (its loop restarts)."""
        with self._lock:
            self._error_at = time.monotonic()
            self._error = message

    def lag(self, seconds: float | None) -> None:
        with self._lock:
            self._lag_s = seconds

    # -- read --------------------------------------------------------------
    def verdict(self) -> Verdict:
        with self._lock:
            now = time.monotonic()
            reasons: list[str] = []
            # Nothing is claimed before it was seen: a daemon whose loop has
            # not turned, or whose first check has not run, is not healthy yet.
            if self._beat is None:
                reasons.append(f"starting: the loop has not turned yet ({now - self._started:.1f}s)")
            elif now - self._beat > self.stall_s:
                reasons.append(f"stalled: no loop progress for {now - self._beat:.1f}s (limit {self.stall_s:g}s)")
            if self._check_ok_at is None and self._check_error is None:
                reasons.append(f"starting: the {self.checks} has not been checked yet")
            elif self._check_error is not None:
                reasons.append(f"{self.checks} unreachable: {self._check_error}")
            else:
                since_ok = now - self._check_ok_at if self._check_ok_at is not None else 0.0
                if since_ok > self.stall_s:
                    reasons.append(f"{self.checks} not confirmed reachable for {since_ok:.1f}s "
                                   f"(limit {self.stall_s:g}s)")
            if self._error_at is not None and (self._beat is None or self._error_at > self._beat):
                reasons.append(f"retrying after an error: {self._error}")
            if self.max_lag_s and self._lag_s is not None and self._lag_s > self.max_lag_s:
                reasons.append(f"lag {self._lag_s:.1f}s over max_lag_s = {self.max_lag_s:g}s")
            details: dict[str, Any] = {
                "daemon": self.daemon,
                "last_loop_turn_s_ago": None if self._beat is None else round(now - self._beat, 3),
                f"{self.checks}_checked_s_ago": None if self._check_at is None else round(now - self._check_at, 3),
                f"{self.checks}_reachable": None if self._check_at is None else self._check_error is None,
                "lag_s": self._lag_s,
                "last_error": self._error,
            }
            return Verdict(not reasons, tuple(reasons), details)
