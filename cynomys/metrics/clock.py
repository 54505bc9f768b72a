"""Clocks compared, so freshness (metrics/freshness.py) is measured on one
clock although its two ends are stamped on three.

A transaction's commit is stamped by the source server's clock (binlog
event times), the envelope's seal by the producer host's, the moment it is
readable by the applier host's.  Both daemons reach one common reference:

- the producer (``ProducerClock``, started by `cynomys produce`) measures
  the source's ``UNIX_TIMESTAMP(NOW(6))`` and the reference against its own
  clock at start and every PRODUCER_EVERY_S, and publishes "source minus
  reference" and "producer minus reference" (``ProducerClocks``);
- the applier (``ApplierClock``, started by `cynomys apply`) measures the
  reference against its own clock every APPLIER_EVERY_S, reads what the
  producer published, and hands the monitor the offsets to its own clock
  (``freshness.Skew``), which it exports and `cynomys status` shows.

The reference (a ``Board``) is the Redis server's ``TIME``, for the Redis
transport; the file transport's daemons share a host (they share the
file), whose clock is then the reference.  Each offset is the best of
MEASURE_ROUNDS round trips (the one with the shortest round trip; half of
it bounds the error).  The published record is not signed: someone who can
write to Redis can make the freshness metric wrong, never the data.
A failed measurement is logged and retried; it never stops a daemon.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from cynomys.core.checkpoint import write_json_atomic
from cynomys.core.errors import CynomysError
from cynomys.metrics.freshness import Skew

if TYPE_CHECKING:
    from cynomys.core.config import Config
    from cynomys.metrics.monitor import ApplierMonitor, ProducerMonitor

log = logging.getLogger(__name__)

MEASURE_ROUNDS = 5
#: Clocks drift by milliseconds a day under NTP; a measurement every few
#: minutes follows a step (a clock set by hand) soon enough.
PRODUCER_EVERY_S = 300.0
APPLIER_EVERY_S = 60.0
#: After a failure, or while the producer has published nothing yet.
RETRY_S = 5.0

SOURCE_NOW_SQL = "SELECT UNIX_TIMESTAMP(NOW(6))"


@dataclass(frozen=True)
class Offset:
    """A remote clock minus the local clock at the same instant (seconds)."""

    seconds: float
    uncertainty_s: float  # half the round trip of the sample used


def measure(remote_now: Callable[[], float], local_now: Callable[[], float] = time.time,
            rounds: int = MEASURE_ROUNDS) -> Offset:
    """NTP's estimate: the remote time read between two local readings is
    taken at their middle; of ``rounds`` tries, the shortest round trip."""
    best: Offset | None = None
    for _ in range(rounds):
        t0 = local_now()
        remote = remote_now()
        t1 = local_now()
        sample = Offset(remote - (t0 + t1) / 2, max(0.0, t1 - t0) / 2)
        if best is None or sample.uncertainty_s < best.uncertainty_s:
            best = sample
    assert best is not None, "rounds must be at least 1"
    return best


@dataclass(frozen=True)
class ProducerClocks:
    """What the producer publishes: its clocks against the reference."""

    source_minus_ref: float
    producer_minus_ref: float
    uncertainty_s: float
    measured_at: float  # reference time of the measurement

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> ProducerClocks:
        d = json.loads(text)
        return cls(float(d["source_minus_ref"]), float(d["producer_minus_ref"]), float(d["uncertainty_s"]),
                   float(d["measured_at"]))


class Board(Protocol):
    """The common reference clock, and where the producer's record lives."""

    def reference_now(self) -> float: ...

    def publish(self, clocks: ProducerClocks) -> None: ...

    def read(self) -> ProducerClocks | None: ...

    def close(self) -> None: ...


class RedisBoard:
    """The Redis server's TIME; the record under ``<stream>:clock:<producer id>``."""

    def __init__(self, cfg: Config) -> None:
        from cynomys.transport.redis_bus import redis_client

        self.url = cfg.transport.url
        self.key = clock_key(cfg)
        self.client = redis_client(cfg.transport.url, 5.0)

    def _do(self, what: str, fn: Callable[[], Any]) -> Any:
        import redis

        from cynomys.transport.redis_bus import translate

        try:
            return fn()
        except redis.RedisError as exc:
            raise translate(exc, self.url, what) from None

    def reference_now(self) -> float:
        sec, usec = self._do("reading TIME", self.client.time)
        return float(sec) + float(usec) / 1e6

    def publish(self, clocks: ProducerClocks) -> None:
        self._do(f"writing {self.key}", lambda: self.client.set(self.key, clocks.to_json()))

    def read(self) -> ProducerClocks | None:
        raw = self._do(f"reading {self.key}", lambda: self.client.get(self.key))
        return None if raw is None else ProducerClocks.from_json(raw)

    def close(self) -> None:
        self.client.close()


class LocalBoard:
    """The file transport: both daemons on the host holding the file, whose
    clock is the reference; the record in a file beside it."""

    def __init__(self, cfg: Config) -> None:
        self.path = Path(cfg.resolve(cfg.transport.path)).with_name(
            Path(cfg.transport.path).name + f".clock.{cfg.producer.id}.json")

    def reference_now(self) -> float:
        return time.time()

    def publish(self, clocks: ProducerClocks) -> None:
        write_json_atomic(self.path, asdict(clocks), durable=False)

    def read(self) -> ProducerClocks | None:
        try:
            return ProducerClocks.from_json(self.path.read_text())
        except FileNotFoundError:
            return None

    def close(self) -> None:
        return None


def clock_key(cfg: Config) -> str:
    return f"{cfg.transport.stream}:clock:{cfg.producer.id}"


def open_board(cfg: Config) -> Board:
    return LocalBoard(cfg) if cfg.transport.kind == "file" else RedisBoard(cfg)


class SourceClock:
    """The source server's clock, on a connection of its own."""

    def __init__(self, cfg: Config) -> None:
        from cynomys.parser.stream import SourceInspector

        self._ins = SourceInspector(cfg.source)

    def now(self) -> float:
        return float(self._ins.query(SOURCE_NOW_SQL)[0][0])

    def close(self) -> None:
        self._ins.close()


def skew_of(clocks: ProducerClocks, applier: Offset, reference_now: float, now: float) -> Skew:
    """The producer's record and the applier's own offset to the reference
    (reference minus applier) -> offsets to the applier's clock."""
    applier_minus_ref = -applier.seconds
    return Skew(source_s=clocks.source_minus_ref - applier_minus_ref,
                producer_s=clocks.producer_minus_ref - applier_minus_ref,
                uncertainty_s=clocks.uncertainty_s + applier.uncertainty_s, measured_at=now,
                source_measured_at=now - max(0.0, reference_now - clocks.measured_at))


class _Every:
    """A daemon thread running ``step`` now and then until closed; ``step``
    returns the seconds until the next run."""

    name = "clock"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> _Every:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # Short: a measurement stuck on a dead server must not hold up the
            # daemon's exit (the thread is a daemon thread).
            self._thread.join(timeout=2)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.step()
                self._failing = False
            except (CynomysError, OSError, ValueError, KeyError) as exc:
                # Logged once per outage: the daemon's own checks report it too.
                if not self._failing:
                    log.warning("%s: cannot compare clocks (freshness keeps the last offsets): %s", self.name,
                                " ".join(str(exc).split()))
                self._failing = True
                wait = RETRY_S
            self._stop.wait(wait)

    def step(self) -> float:
        raise NotImplementedError


class ProducerClock(_Every):
    """Measures the source and the reference against this host every
    PRODUCER_EVERY_S; publishes while this producer leads (an HA standby's
    host is not the one sealing envelopes), and as soon as it takes over."""

    name = "producer-clock"

    def __init__(self, cfg: Config, monitor: ProducerMonitor, board: Board | None = None,
                 source_now: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.monitor = monitor
        self._board = board
        self._source_now = source_now  # tests: a clock instead of the source server
        self._clocks: ProducerClocks | None = None
        self._measured = -math.inf     # monotonic time of the last measurement
        self._published = False        # the last measurement is in the board

    def _measure_source(self) -> Offset:
        if self._source_now is not None:
            return measure(self._source_now)
        src = SourceClock(self.cfg)
        try:
            return measure(src.now)
        finally:
            src.close()

    def step(self) -> float:
        board = self._board = self._board or open_board(self.cfg)
        if time.monotonic() - self._measured >= PRODUCER_EVERY_S:
            source = self._measure_source()
            ref = measure(board.reference_now)
            self._clocks = ProducerClocks(source.seconds - ref.seconds, -ref.seconds,
                                          source.uncertainty_s + ref.uncertainty_s, time.time() + ref.seconds)
            self._measured, self._published = time.monotonic(), False
            self.monitor.clock(source, ref)
            log.info("clocks: source %+.4fs, reference %+.4fs against this host (+-%.4fs)", source.seconds,
                     ref.seconds, self._clocks.uncertainty_s)
        if not self.monitor.is_leader:
            self._published = False
            return RETRY_S  # a standby: look again soon, to publish as soon as it leads
        if not self._published and self._clocks is not None:
            board.publish(self._clocks)
            self._published = True
        return max(1.0, PRODUCER_EVERY_S - (time.monotonic() - self._measured))

    def close(self) -> None:
        super().close()
        if self._board is not None:
            self._board.close()


class ApplierClock(_Every):
    """Measures the reference against this host and combines it with the
    producer's record into the monitor's Skew."""

    name = "applier-clock"

    def __init__(self, cfg: Config, monitor: ApplierMonitor, board: Board | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.monitor = monitor
        self._board = board
        self._announced: Skew | None = None

    def step(self) -> float:
        board = self._board = self._board or open_board(self.cfg)
        ref = measure(board.reference_now)
        clocks = board.read()
        if clocks is None:
            return RETRY_S  # the producer has not published yet
        now = time.time()
        skew = skew_of(clocks, ref, now + ref.seconds, now)
        self.monitor.clock(skew)
        last = self._announced
        if last is None or not math.isclose(last.source_s, skew.source_s, abs_tol=0.05) \
                or not math.isclose(last.producer_s, skew.producer_s, abs_tol=0.05):
            log.info("clocks against this host: source %+.4fs, producer %+.4fs (+-%.4fs); freshness corrects "
                     "by them", skew.source_s, skew.producer_s, skew.uncertainty_s)
            self._announced = skew
        return APPLIER_EVERY_S

    def close(self) -> None:
        super().close()
        if self._board is not None:
            self._board.close()
