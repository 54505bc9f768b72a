"""Freshness: how long after its source commit a transaction is readable on
the target ("how far behind is the lakehouse?").

What the applier knows, and how the commit time is estimated
-------------------------------------------------------------
The binlog stamps every event with the source's clock in whole seconds
(``Change.commit_ts``; MariaDB writes no finer commit time), so a change
committed in [c, c + 1).  Each envelope also carries the moment the producer
sealed it (``Batch.created_us``, the producer host's clock, microseconds):
every transaction in it committed before that, and -- while the producer
keeps up -- after the producer sealed its previous envelope.  A
transaction's commit time is estimated as the middle of the window these
bounds leave: ``[max(c, previous seal), min(c + 1, this seal)]``.  Its error
is at most half that window: half the time between two envelopes of a
producer keeping up (``batch_max_delay_ms`` on a busy source), never more
than half a second.  The clocks of the source, the producer host and the
applier host are brought onto one by the offsets of ``Skew``
(metrics/clock.py measures them).

Weighting
---------
Observed once per source transaction that still has a net change in what
the applier takes (distinct ``tid``), all of a flush's transactions with the
moment its target transaction committed: a flush of 900 one-row
transactions and one 50,000-row transaction is 901 observations, not
50,900 -- a per-row histogram would let one big transaction drown the
freshness of everything else.  Transactions of one envelope committed in
the same second share one estimate, so they are one weighted observation
(``WeightedHistogram``): the cost is per envelope, not per transaction.
Snapshot reads, DDL and verify records are not source transactions of the
live stream and are left out.
"""
from __future__ import annotations

import bisect
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import HistogramMetricFamily

from cynomys.core.model import Op

if TYPE_CHECKING:
    from cynomys.core.model import Batch

#: Steps of about a tenth where the targets' defaults put freshness (0.3-2 s
#: on MariaDB/DuckDB, 2-8 s on Spark): a quantile interpolated inside a
#: bucket is then within a few percent of the exact one (tested).
FRESHNESS_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8,
                     2.0, 2.2, 2.4, 2.6, 2.8, 3.0, 3.25, 3.5, 3.75, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0,
                     9.0, 10.0, 12.5, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

#: Ops of the live stream (what a source transaction changed).
LIVE_OPS = frozenset({Op.INSERT, Op.UPDATE, Op.DELETE})
#: Transactions taken, not yet readable: (estimated source commit time,
#: how many, the tables they touched).
Pending = list[tuple[float, int, frozenset[str]]]

#: `cynomys status` shows the quantiles of this many last seconds.
WINDOW_S = 300.0
#: Observations kept for the window (about ten per flush): a bound on memory
#: during a long backlog of tiny flushes; the oldest go first.
WINDOW_MAX = 50_000


@dataclass(frozen=True)
class Skew:
    """Clock offsets the applier corrects by: each is "that clock minus the
    applier host's clock" at the same instant, in seconds."""

    source_s: float = 0.0        # the source server's clock (binlog timestamps)
    producer_s: float = 0.0      # the producer host's clock (envelope seal times)
    uncertainty_s: float = 0.0   # half round trips of the measurements, summed
    measured_at: float = 0.0     # applier time of the measurement; 0: never measured (offsets 0 assumed)
    source_measured_at: float = 0.0  # applier time at which the producer last measured the source

    def to_dict(self, now: float) -> dict[str, Any]:
        if not self.measured_at:
            return {"measured": False}
        return {"measured": True, "source_minus_applier_s": round(self.source_s, 4),
                "producer_minus_applier_s": round(self.producer_s, 4), "uncertainty_s": round(self.uncertainty_s, 4),
                "measured_s_ago": round(now - self.measured_at, 1),
                "source_measured_s_ago": round(now - self.source_measured_at, 1) if self.source_measured_at else None}


class CommitEstimator:
    """Commit-time estimates (applier clock) of the transactions of each
    envelope taken, per producer (see the module docstring)."""

    def __init__(self) -> None:
        self._sealed: dict[str, float] = {}  # producer -> its last envelope's seal time (applier clock)

    def forget(self) -> None:
        """After the applier's loop restarts: what comes next may be re-sent."""
        self._sealed.clear()

    def estimate(self, batch: Batch, skew: Skew) -> list[tuple[float, int, frozenset[str]]]:
        """[(estimated commit time, transactions, their tables "db.table")]
        for ``batch``: transactions of one second and one set of tables
        share an entry (a target readable table by table, Spark/Iceberg,
        makes each readable when the last of its tables is)."""
        commits: dict[str, int] = {}
        tables: dict[str, set[tuple[str, str]]] = {}  # named "db.table" once per entry, not per change
        for c in batch.changes:
            if c.op in LIVE_OPS:
                commits[c.tid] = c.commit_ts
                tables.setdefault(c.tid, set()).add((c.database, c.table))
        if not batch.complete and commits:
            # The last transaction goes on in the next envelope: counted
            # there, where it ends (its first change is the latest to start).
            live = [c for c in batch.changes if c.op in LIVE_OPS]
            commits.pop(max(live, key=lambda c: c.txn.sort_key()).tid, None)
        sealed = batch.created_us / 1e6 - skew.producer_s if batch.created_us else None
        previous = self._sealed.get(batch.producer_id)
        if sealed is not None:
            self._sealed[batch.producer_id] = sealed
        out: list[tuple[float, int, frozenset[str]]] = []
        groups = Counter((second, frozenset(tables[tid])) for tid, second in commits.items())
        for (second, pairs), n in groups.items():
            if not second:
                continue  # no source time (not a binlog change)
            where = frozenset(f"{d}.{t}" for d, t in pairs)
            lo = second - skew.source_s
            hi = lo + 1.0
            if sealed is not None:
                hi = min(hi, sealed)
            if previous is not None and lo < previous < hi:
                lo = previous
            if hi <= lo:  # the bounds disagree (a clock moved since it was measured): the second alone
                lo, hi = second - skew.source_s, second - skew.source_s + 1.0
            out.append(((lo + hi) / 2, n, where))
        return out


class WeightedHistogram:
    """A Prometheus histogram whose observations carry a count (one
    observation of weight n = n equal observations), as a collector."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float, weight: int = 1) -> None:
        i = bisect.bisect_left(self.bounds, value)  # the first bucket whose bound is >= value ("le")
        with self._lock:
            self._counts[i] += weight
            self._sum += value * weight

    def cumulative(self) -> list[tuple[float, int]]:
        """[(upper bound, observations at or below it)], the last bound +Inf."""
        return self._snapshot()[0]

    def _snapshot(self) -> tuple[list[tuple[float, int]], float]:
        with self._lock:  # buckets and sum of the same observations
            counts, total_sum = list(self._counts), self._sum
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), counts):
            total += n
            out.append((bound, total))
        return out, total_sum

    def collect(self) -> Iterable[HistogramMetricFamily]:
        cum, total = self._snapshot()
        yield HistogramMetricFamily(self.name, self.documentation, sum_value=total,
                                    buckets=[("+Inf" if math.isinf(b) else repr(b), n) for b, n in cum])

    def describe(self) -> Iterable[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation)


def bucket_quantile(q: float, cumulative: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: the q-quantile of cumulative
    buckets [(upper bound, count)] ending with +Inf, linear inside the
    bucket it falls in; None without observations."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower  # above the highest bound: its bound, as Prometheus answers
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def weighted_quantiles(samples: Iterable[tuple[float, int]], qs: Sequence[float]) -> list[float | None]:
    """Exact quantiles of weighted values [(value, weight)]: the smallest
    value at or below which a fraction q of the weight lies."""
    ordered = sorted(samples)
    total = sum(w for _, w in ordered)
    if not total:
        return [None for _ in qs]
    out: list[float | None] = []
    for q in qs:
        rank, acc = q * total, 0
        for value, w in ordered:
            acc += w
            if acc >= rank:
                out.append(value)
                break
        else:
            out.append(ordered[-1][0])
    return out


class Freshness:
    """The applier's freshness metrics: fed by ApplierMonitor.taken (each
    envelope taken) and .flushed (each target commit)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = WeightedHistogram(
            "cynomys_applier_freshness_seconds",
            "Source commit to target commit (readable), per source transaction applied; the commit time is "
            "estimated within the second the binlog gives (see cynomys/metrics/freshness.py)",
            FRESHNESS_BUCKETS, registry)
        self.last = Gauge("cynomys_applier_freshness_last_flush_seconds",
                          "Source commit to target commit of the newest transaction in the last flush that held any "
                          "(how far the target trailed right after it)", registry=registry)
        self.last.set(math.nan)
        self.skew_s = Gauge("cynomys_applier_clock_skew_seconds",
                            "Clock minus this applier host's clock, as freshness corrects by it (source: the "
                            "source server; producer: the producer host); 0 until measured", ["clock"],
                            registry=registry)
        self.skew_uncertainty = Gauge("cynomys_applier_clock_skew_uncertainty_seconds",
                                      "How far the clock offsets may be off (half round trips of their measurement)",
                                      registry=registry)
        self.skew = Skew()
        self._estimator = CommitEstimator()
        self._pending: Pending = []
        self._recent: deque[tuple[float, float, int]] = deque()  # (monotonic time, freshness, weight)
        self._last_flush: float | None = None
        self.set_skew(self.skew)

    def set_skew(self, skew: Skew) -> None:
        """New clock offsets (from the clock thread)."""
        self.skew = skew  # one reference: read whole by the loop thread
        self.skew_s.labels("source").set(skew.source_s)
        self.skew_s.labels("producer").set(skew.producer_s)
        self.skew_uncertainty.set(skew.uncertainty_s)

    def taken(self, batch: Batch) -> None:
        self._pending.extend(self._estimator.estimate(batch, self.skew))

    def dropped(self) -> None:
        """The applier's loop failed and restarts: what it had taken is
        delivered again (and taken again), not applied."""
        self._pending.clear()
        self._estimator.forget()

    def detach(self) -> Pending:
        """The transactions taken so far, handed to the flush about to
        commit (``flushed(..., pending=)``): what the loop takes while that
        flush commits on the commit stage's worker belongs to the next."""
        pending, self._pending = self._pending, []
        return pending

    def flushed(self, visible: float, tables_at: Mapping[str, float] | None = None,
                pending: Pending | None = None) -> None:
        """A flush committed at ``visible`` (applier clock, seconds since
        the epoch): its transactions (``pending``, from ``detach``; else
        everything taken since the last flush) are readable.
        ``tables_at``: where tables became readable one by one (Spark/
        Iceberg: a commit per table, base.Target.visible_at), the moment
        each did; a transaction is readable once the last of its tables is."""
        if pending is None:
            pending = self.detach()
        if not pending:
            return
        mono = time.monotonic()
        for committed, n, where in pending:
            at = max((tables_at.get(t, visible) for t in where), default=visible) if tables_at else visible
            # Below 0 only by a clock error larger than its uncertainty.
            age = max(0.0, at - committed)
            self.histogram.observe(age, n)
            self._recent.append((mono, age, n))
        newest = max(t for t, _, _ in pending)
        self._last_flush = max(0.0, visible - newest)
        self.last.set(self._last_flush)
        while len(self._recent) > WINDOW_MAX or (self._recent and mono - self._recent[0][0] > WINDOW_S):
            self._recent.popleft()

    def summary(self) -> dict[str, Any]:
        """For the health report and `cynomys status`: exact quantiles of the
        last WINDOW_S seconds, and the clock offsets used."""
        mono = time.monotonic()
        recent = [(age, n) for at, age, n in self._recent if mono - at <= WINDOW_S]
        p50, p99, top = weighted_quantiles(recent, (0.5, 0.99, 1.0))
        return {"window_s": WINDOW_S, "transactions": sum(n for _, n in recent),
                "p50_s": _round(p50), "p99_s": _round(p99), "max_s": _round(top),
                "last_flush_s": _round(self._last_flush), "clock": self.skew.to_dict(time.time())}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
