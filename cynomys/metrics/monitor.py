"""What the producer and the applier report about themselves.

Each daemon owns one monitor: a Prometheus registry of its own, a Health,
and (with ``[metrics] listen``) the HTTP server.  The daemons call a few
hooks -- one per loop turn, one per change or envelope, one per flush --
with events (metrics/events.py): data the loop hands over, never the loop
object itself, so the monitor reads no daemon's internals and the
replication code stays free of metrics code.

Every ``health_interval_s`` the monitor writes ``<daemon>.health.json``
into the daemon's ``state_dir`` (verdict, lag, where it listens) for
`cynomys status`, which thus never has to open the target.

Metric names (Prometheus text format; ``table`` is ``db.table``):

producer: cynomys_producer_events_in_total{table}, cynomys_producer_rows_out_total{table},
  cynomys_producer_binlog_bytes_read_total, cynomys_producer_envelope_bytes_total,
  cynomys_producer_batches_total, cynomys_producer_transactions_total,
  cynomys_producer_lag_seconds, cynomys_producer_lag_bytes, cynomys_producer_leader,
  cynomys_producer_lease_token, cynomys_producer_lease_acquired_total, cynomys_producer_fenced_total,
  cynomys_producer_clock_skew_seconds{clock} (metrics/clock.py)
applier: cynomys_applier_rows_in_total{table}, cynomys_applier_rows_out_total{table},
  cynomys_applier_envelope_bytes_total, cynomys_applier_envelopes_total,
  cynomys_applier_duplicates_total, cynomys_applier_envelopes_rejected_total{reason},
  cynomys_applier_flushes_total, cynomys_applier_flush_duration_seconds (histogram),
  cynomys_applier_ddl_total, cynomys_applier_buffer_rows, cynomys_applier_lag_seconds,
  cynomys_applier_lag_bytes, cynomys_applier_freshness_seconds (histogram, per source transaction),
  cynomys_applier_freshness_last_flush_seconds, cynomys_applier_clock_skew_seconds{clock},
  cynomys_applier_clock_skew_uncertainty_seconds (metrics/freshness.py)
both: cynomys_<daemon>_healthy, cynomys_<daemon>_reachable (source / target check),
  cynomys_<daemon>_errors_total{type,transient}, cynomys_<daemon>_last_error_timestamp_seconds,
  cynomys_<daemon>_last_loop_turn_timestamp_seconds
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter as Tally
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from cynomys.core.checkpoint import write_json_atomic
from cynomys.core.columnar import InsertRun, ManyRows
from cynomys.core.config import Config
from cynomys.core.errors import CynomysError, SourceUnavailableError, TargetUnavailableError
from cynomys.core.model import Change, Op, Position
from cynomys.metrics.clock import Offset
from cynomys.metrics.events import ApplierTurn, ProducerTurn
from cynomys.metrics.freshness import Freshness, Pending, Skew
from cynomys.metrics.health import Health
from cynomys.metrics.server import MetricsServer

if TYPE_CHECKING:
    from cynomys.core.model import Batch

log = logging.getLogger(__name__)

# Flush durations range from milliseconds (a few rows into MariaDB) to
# minutes (a large MERGE on Iceberg).
FLUSH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _tally(changes: Iterable[Change]) -> Tally[str]:
    """Row changes per table (an InsertRun or a ManyRows counts its rows)."""
    # Counted per (database, table) and named once per table: a text per
    # change cost the producer 2-3% of its time on an OLTP binlog.
    out: dict[tuple[str, str], int] = {}  # a plain dict: a Counter's += costs 1.7x as much
    get = out.get
    for c in changes:
        key = (c.database, c.table)
        out[key] = get(key, 0) + (c.rows if type(c) is InsertRun or type(c) is ManyRows else 1)
    return Tally({f"{db}.{table}": n for (db, table), n in out.items()})


# The producer's loop turns once per binlog event (tens of thousands a
# second): its per-turn bookkeeping runs at most this often.
TURN_EVERY_S = 0.1


def _bytes_between(end: Position | None, at: Position | None) -> float:
    """Binlog bytes from ``at`` to ``end``; NaN (unknown) across files, whose
    sizes we would need.  ``at`` past ``end`` (``end`` was sampled earlier)
    counts as caught up."""
    if end is None or at is None:
        return math.nan
    if at.sort_key() >= end.sort_key():
        return 0.0
    if end.file == at.file:
        return float(max(0, end.pos - at.pos))
    return math.nan


class _Monitor:
    """What both daemons share: registry, health, server, error metrics."""

    daemon = ""
    checks = ""
    # An error of this type from the loop is also a failed reachability check.
    unreachable: type[CynomysError] = CynomysError

    def __init__(self, cfg: Config, state_dir: str, labels: dict[str, str] | None = None,
                 report_name: str = "") -> None:
        self.cfg = cfg
        self.enabled = bool(cfg.metrics.listen)
        # ``labels``: carried by every metric (a partitioned applier's
        # partition), added when the registry is read, not at each metric.
        r = CollectorRegistry(auto_describe=True)
        self.own_registry = r  # where this daemon's metrics are registered
        self.registry = r      # what is served (and read by tests)
        if labels:
            self.registry = CollectorRegistry()
            self.registry.register(_Relabelled(r, labels))
        self.health = Health(cfg.metrics, self.daemon, self.checks)
        self.report_path = cfg.resolve(state_dir) / (report_name or f"{self.daemon}.health.json")
        self.server: MetricsServer | None = None
        d = self.daemon
        self.errors = Counter(f"cynomys_{d}_errors", "Errors that made the daemon retry (or stop), by type",
                              ["type", "transient"], registry=r)
        self.last_error_ts = Gauge(f"cynomys_{d}_last_error_timestamp_seconds",
                                   "Unix time of the last error (0: none)", registry=r)
        self.last_turn_ts = Gauge(f"cynomys_{d}_last_loop_turn_timestamp_seconds",
                                  "Unix time of the daemon loop's last turn", registry=r)
        self.reachable = Gauge(f"cynomys_{d}_reachable",
                               f"1 when the last check reached the {self.checks}, else 0", registry=r)
        healthy = Gauge(f"cynomys_{d}_healthy", "1 when /healthz answers 200", registry=r)
        healthy.set_function(lambda: 1.0 if self.health.verdict().healthy else 0.0)
        self._last_report = 0.0

    def start(self) -> None:
        """Serve /metrics and /healthz (a no-op when [metrics] listen is empty)."""
        if self.enabled and self.server is None:
            self.server = MetricsServer(self.cfg.metrics.listen, self.registry, self.health.verdict).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def failed(self, exc: BaseException) -> None:
        """An error escaped the daemon's loop (it retries, or stops on a terminal one)."""
        transient = isinstance(exc, CynomysError) and exc.transient or isinstance(exc, OSError)
        self.errors.labels(type(exc).__name__, str(transient).lower()).inc()
        self.last_error_ts.set(time.time())
        message = exc.message if isinstance(exc, CynomysError) else str(exc)
        self.health.failed(f"{type(exc).__name__}: {' '.join(message.split())}")
        if isinstance(exc, self.unreachable):
            self._checked(exc)

    def _beat(self) -> None:
        self.health.beat()
        self.last_turn_ts.set(time.time())

    def _checked(self, error: BaseException | None) -> None:
        if error is None:
            self.health.checked(None)
            self.reachable.set(1)
        else:
            msg = error.message if isinstance(error, CynomysError) else str(error)
            self.health.checked(" ".join(msg.split()))
            self.reachable.set(0)

    def _report_due(self) -> bool:
        return self.enabled and time.monotonic() - self._last_report >= self.cfg.metrics.health_interval_s

    def _write_report(self, extra: dict[str, Any]) -> None:
        """``<daemon>.health.json`` for `cynomys status` (at most once per interval)."""
        if not self._report_due():
            return
        self._last_report = time.monotonic()
        try:
            write_json_atomic(self.report_path, {
                "written_at": time.time(), "listen": self.cfg.metrics.listen,
                "health": self.health.verdict().to_dict(), **extra}, durable=False)
        except OSError as exc:  # a report we cannot write must not stop replication
            log.warning("cannot write %s: %s", self.report_path, exc)


class _Relabelled:
    """A registry's metrics with constant labels added to every sample."""

    def __init__(self, inner: CollectorRegistry, labels: dict[str, str]) -> None:
        self._inner = inner
        self._labels = labels

    def collect(self) -> Iterable[Metric]:
        for family in self._inner.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [s._replace(labels={**s.labels, **self._labels}) for s in family.samples]
            yield out


class _Deltas:
    """Feeds a daemon's cumulative counters (which restart with each loop
    object) into Prometheus counters (which must never go down)."""

    def __init__(self) -> None:
        self._owner: int | None = None
        self._seen: dict[str, int] = {}

    def step(self, owner: int, values: dict[str, int], counters: dict[str, Callable[[float], None]]) -> None:
        if owner != self._owner:
            self._owner, self._seen = owner, {}
        for key, value in values.items():
            delta = value - self._seen.get(key, 0)
            if delta > 0 and key in counters:
                counters[key](delta)
            self._seen[key] = value


class ProducerMonitor(_Monitor):
    daemon = "producer"
    checks = "source"
    unreachable = SourceUnavailableError

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg, cfg.producer.state_dir)
        r = self.own_registry
        self.events_in = Counter("cynomys_producer_events_in",
                                 "Row changes read from the binlog, per table (before folding)", ["table"], registry=r)
        self.rows_out = Counter("cynomys_producer_rows_out",
                                "Net row changes and DDL shipped in envelopes, per table (after folding)",
                                ["table"], registry=r)
        self.bytes_in = Counter("cynomys_producer_binlog_bytes_read", "Binlog bytes read", registry=r)
        self.bytes_out = Counter("cynomys_producer_envelope_bytes", "Sealed envelope bytes the transport accepted",
                                 registry=r)
        self.batches = Counter("cynomys_producer_batches", "Envelopes the transport accepted", registry=r)
        self.transactions = Counter("cynomys_producer_transactions", "Source transactions read", registry=r)
        self.lag_s = Gauge("cynomys_producer_lag_seconds",
                           "Seconds between now and the source time of the last change read; 0 when caught up",
                           registry=r)
        self.lag_bytes = Gauge("cynomys_producer_lag_bytes",
                               "Binlog bytes between the source's end and the producer's checkpoint "
                               "(NaN across binlog files)", registry=r)
        # Without HA the one producer always leads; an HA producer starts as
        # a standby (cynomys/producer/ha.py calls leading / standing_by).
        self.leader = Gauge("cynomys_producer_leader", "1 when this producer is the one reading the source",
                            registry=r)
        self.leader.set(0 if cfg.producer.ha else 1)
        self.is_leader = not cfg.producer.ha  # the clock thread publishes only while leading
        self.clock_skew = Gauge("cynomys_producer_clock_skew_seconds",
                                "Clock minus this producer host's clock (source: the source server; reference: "
                                "the Redis server both daemons compare with); NaN until measured", ["clock"],
                                registry=r)
        self.clock_skew.labels("source").set(math.nan)
        self.clock_skew.labels("reference").set(math.nan)
        self._clock: dict[str, Any] = {"measured": False}
        self._source_ahead_s = 0.0  # source clock minus this host's, once measured
        self.lease_token = Gauge("cynomys_producer_lease_token",
                                 "Fencing token of the HA lease this producer holds (0: none)", registry=r)
        self.terms = Counter("cynomys_producer_lease_acquired", "HA lease terms this producer began (takeovers)",
                             registry=r)
        self.fenced_writes = Counter("cynomys_producer_fenced",
                                     "Writes (envelope or state) Redis refused because this producer's HA lease "
                                     "had moved on", registry=r)
        self.lag_bytes.set(math.nan)
        # (database, table) -> row changes read; a plain dict (a Counter's
        # += costs 1.7x as much, once per row change).
        self._in: dict[tuple[str, str], int] = {}
        self._deltas = _Deltas()
        self._read: Position | None = None
        self._source_end: Position | None = None
        self._checkpoint: Position | None = None
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self._last_turn = 0.0

    def start(self) -> None:
        super().start()
        if self.enabled and self._prober is None:
            # The source check opens its own connection, so it runs beside
            # the replication loop: a black-holed source must not hold up
            # shipping what was already read.
            self._prober = threading.Thread(target=self._probe_loop, name="source-probe", daemon=True)
            self._prober.start()

    def close(self) -> None:
        self._stop.set()
        if self._prober is not None:
            self._prober.join(timeout=self.cfg.source.connect_timeout_s + 1)
            self._prober = None
        super().close()

    def _probe_loop(self) -> None:
        from cynomys.parser.stream import open_inspector

        while not self._stop.is_set():
            try:
                ins = open_inspector(self.cfg.source)  # the server, or [source] binlog_files
                try:
                    self._source_end = ins.current()
                finally:
                    ins.close()
                self._checked(None)
            except (CynomysError, OSError) as exc:
                self._checked(exc)
            self._stop.wait(self.cfg.metrics.health_interval_s)

    # -- HA hooks (cynomys/producer/ha.py) -----------------------------------------
    def leading(self, token: int) -> None:
        self.is_leader = True
        self.leader.set(1)
        self.lease_token.set(token)
        self.terms.inc()

    def standing_by(self) -> None:
        """A standby's loop turn: it is alive (healthy), and not the leader."""
        self.is_leader = False
        self.leader.set(0)
        self.lease_token.set(0)
        self._beat()

    def fenced(self) -> None:
        self.fenced_writes.inc()

    def clock(self, source: Offset, reference: Offset) -> None:
        """The clock thread's measurement (metrics/clock.py): source and
        reference clocks minus this host's."""
        self.clock_skew.labels("source").set(source.seconds)
        self._source_ahead_s = source.seconds
        self.clock_skew.labels("reference").set(reference.seconds)
        self._clock = {"measured": True, "source_minus_producer_s": round(source.seconds, 4),
                       "reference_minus_producer_s": round(reference.seconds, 4),
                       "uncertainty_s": round(source.uncertainty_s + reference.uncertainty_s, 4),
                       "measured_at": time.time()}

    # -- hooks (called from the producer's loop thread) ------------------
    def change_in(self, change: Change, n: int = 1) -> None:
        """``n``: the row changes ``change`` stands for (a ManyRows: its rows)."""
        key = (change.database, change.table)
        self._in[key] = self._in.get(key, 0) + n

    def batch_out(self, changes: Iterable[Change]) -> None:
        for table, n in _tally(changes).items():
            self.rows_out.labels(table).inc(n)
        for (db, table), n in self._in.items():
            self.events_in.labels(f"{db}.{table}").inc(n)
        self._in.clear()

    def turn(self, t: ProducerTurn) -> None:
        """Once per loop turn (does its work at most every TURN_EVERY_S)."""
        if self._read is None:
            self._read = t.start  # bytes read are counted from here
        now = time.monotonic()
        if now - self._last_turn < TURN_EVERY_S:
            return
        self._last_turn = now
        self._beat()
        self._deltas.step(t.run, dict(t.counters), {
            "batches": self.batches.inc, "transactions": self.transactions.inc, "bytes": self.bytes_out.inc})
        read = t.read
        if read is not None and self._read is not None and read != self._read:
            # Across a rotation the rest of the previous file is not known
            # here: counted from the new file's start (slightly under).
            # (A restart re-reads from the checkpoint: a step back counts nothing.)
            self.bytes_in.inc(max(0, read.pos - self._read.pos if read.file == self._read.file else read.pos - 4))
        self._read = read
        self._checkpoint = t.checkpoint
        lag_bytes = _bytes_between(self._source_end, t.checkpoint)
        self.lag_bytes.set(lag_bytes)
        lag_s: float | None
        if lag_bytes == 0:
            lag_s = 0.0
        elif t.last_event_ts:
            # The event's time is the source's clock: compared on it (0 offset until measured).
            lag_s = max(0.0, time.time() + self._source_ahead_s - t.last_event_ts)
        else:
            lag_s = None
        self.lag_s.set(math.nan if lag_s is None else lag_s)
        self.health.lag(lag_s)
        self._write_report({
            "source_end": self._source_end.to_dict() if self._source_end else None,
            "checkpoint": t.checkpoint.to_dict() if t.checkpoint else None,
            "lag_bytes": None if math.isnan(lag_bytes) else lag_bytes, "lag_s": lag_s, "clock": self._clock})


class ApplierMonitor(_Monitor):
    daemon = "applier"
    checks = "target"
    unreachable = TargetUnavailableError

    def __init__(self, cfg: Config) -> None:
        # Partitioned appliers (cynomys/applier/partition.py): every metric
        # says which partition, and each partition has its own report file.
        a = cfg.applier
        partitioned = a.partitions > 1
        super().__init__(cfg, a.state_dir, {"partition": str(a.partition)} if partitioned else None,
                         f"applier.p{a.partition}.health.json" if partitioned else "")
        r = self.own_registry
        self.rows_in = Counter("cynomys_applier_rows_in", "Net changes taken from envelopes, per table",
                               ["table"], registry=r)
        self.rows_out = Counter("cynomys_applier_rows_out", "Net changes committed to the target, per table",
                                ["table"], registry=r)
        self.bytes_in = Counter("cynomys_applier_envelope_bytes", "Envelope bytes received", registry=r)
        self.envelopes = Counter("cynomys_applier_envelopes", "Envelopes opened", registry=r)
        self.duplicates = Counter("cynomys_applier_duplicates", "Envelopes delivered again and skipped", registry=r)
        self.rejected = Counter("cynomys_applier_envelopes_rejected",
                                "Envelopes set aside in the dead-letter stream, by reason", ["reason"], registry=r)
        self.flushes = Counter("cynomys_applier_flushes", "Target transactions committed", registry=r)
        self.ddl = Counter("cynomys_applier_ddl", "DDL statements applied", registry=r)
        self.flush_s = Histogram("cynomys_applier_flush_duration_seconds", "Duration of one flush (target transaction)",
                                 buckets=FLUSH_BUCKETS, registry=r)
        self.buffer_rows = Gauge("cynomys_applier_buffer_rows", "Changes buffered, not yet flushed", registry=r)
        self.lag_s = Gauge("cynomys_applier_lag_seconds",
                           "Seconds between now and the source commit of the last applied transaction while "
                           "changes wait; 0 when everything delivered is applied", registry=r)
        self.lag_bytes = Gauge("cynomys_applier_lag_bytes",
                               "Binlog bytes between the newest envelope's end and the applied position "
                               "(NaN across binlog files)", registry=r)
        self.freshness = Freshness(r)
        self._deltas = _Deltas()
        self._rejected: dict[str, int] = {}
        self._newest: Position | None = None

    def clock(self, skew: Skew) -> None:
        """New clock offsets (metrics/clock.py ApplierClock, its own thread)."""
        self.freshness.set_skew(skew)

    def failed(self, exc: BaseException) -> None:
        super().failed(exc)
        self.freshness.dropped()  # the loop restarts: what it took is delivered again

    # -- hooks (called from the applier's loop thread) -------------------
    def envelope(self, size: int) -> None:
        self.bytes_in.inc(size)

    def taken(self, batch: Batch) -> None:
        for table, n in _tally(batch.changes).items():
            self.rows_in.labels(table).inc(n)
        self._newest = batch.end
        self.freshness.taken(batch)

    def committing(self) -> Pending:
        """The transactions taken so far, handed to the flush about to
        commit: readable once it has (``flushed(..., readable=)``)."""
        return self.freshness.detach()

    def flushed(self, changes: Iterable[Change], seconds: float, tables_at: Mapping[str, float] | None = None,
                committed_at: float | None = None, readable: Pending | None = None) -> None:
        """Called once the flush's target transaction committed, at
        ``committed_at`` (``time.time()``; now when None: a flush committed
        on the commit stage's worker is counted here up to a loop turn
        later); ``tables_at``: the target's Target.visible_at (tables
        readable one by one); ``readable``: its transactions (from
        ``committing``; everything taken so far when None; [] for a part
        of a transaction, not readable before its commit)."""
        self.freshness.flushed(time.time() if committed_at is None else committed_at, tables_at, readable)
        self.flush_s.observe(seconds)
        for table, n in _tally(c for c in changes if c.op is not Op.DDL).items():
            self.rows_out.labels(table).inc(n)

    def turn(self, t: ApplierTurn) -> None:
        """Once per loop turn, after the transport read.  Runs the target
        check when due: through ``t.ping`` (the applier's own Target, in its
        thread: targets are not thread-safe)."""
        self._beat()
        self._deltas.step(t.run, dict(t.counters), {"envelopes": self.envelopes.inc,
                                                    "duplicates": self.duplicates.inc,
                                                    "flushes": self.flushes.inc, "ddl": self.ddl.inc})
        for reason, n in t.rejected.items():
            key = f"{t.run}:{reason}"
            if n > self._rejected.get(key, 0):
                self.rejected.labels(reason).inc(n - self._rejected.get(key, 0))
                self._rejected[key] = n
        self.buffer_rows.set(t.buffered_rows)
        lag_s: float | None
        if t.delivered == 0 and not t.buffered_envelopes:
            lag_s, lag_bytes = 0.0, 0.0  # everything the transport delivered is in the target
        else:
            # The commit time is the source's clock: compared on it (metrics/clock.py).
            lag_s = max(0.0, time.time() + self.freshness.skew.source_s - t.applied_commit_ts) \
                if t.applied_commit_ts else None
            lag_bytes = _bytes_between(self._newest, t.applied_position)
        self.lag_s.set(math.nan if lag_s is None else lag_s)
        self.lag_bytes.set(lag_bytes)
        self.health.lag(lag_s)
        if self.enabled and self.health.check_due():
            try:
                t.ping()
                self._checked(None)
            except (CynomysError, OSError) as exc:
                # Recorded, not raised: the loop's own work meets the same
                # error and retries as usual; the check only reports it.
                self._checked(exc)
        if self._report_due():
            self._write_report({"lag_s": lag_s, "lag_bytes": None if math.isnan(lag_bytes) else lag_bytes,
                                "buffer_rows": t.buffered_rows, "freshness": self.freshness.summary()})
