"""`cynomys produce`: the producer daemon (source host)."""
from __future__ import annotations

import argparse
import gc
from typing import Any

from cynomys.cli.common import config_of, stop_on_signals, with_config
from cynomys.core.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from cynomys.metrics import ProducerMonitor
    from cynomys.metrics.clock import ProducerClock
    from cynomys.producer import Producer, run_with_retry
    from cynomys.transport.channel import SealedSink

    cfg = config_of(args)
    stop = stop_on_signals()
    # The producer allocates a few short-lived objects per row change and
    # keeps no cycles of them; at the default threshold (700) the cycle
    # collector ran often enough to cost ~10% of the daemon's CPU on small
    # OLTP transactions (bench/producer_oltp.py, py-spy --native).  Collections
    # still run, just less often; memory stays bounded by the queues.
    gc.set_threshold(100_000, 50, 50)
    monitor = ProducerMonitor(cfg)
    monitor.start()  # /metrics and /healthz when [metrics] listen is set
    # Archived binlog files ([source] binlog_files) are replayed to their end.
    once = args.once or bool(cfg.source.binlog_files)
    # Source and reference clocks against this host, for the applier's
    # freshness metric (a thread of its own; never stops the producer).  Not
    # for a run to the binlog's end: there is no live commit to be fresh about
    # (and archived files have no server to ask the time).
    clock = ProducerClock(cfg, monitor).start() if not once else None
    try:
        sink = SealedSink(cfg)
        try:
            if cfg.producer.ha:
                from cynomys.producer.ha import run_ha

                if once:
                    raise ConfigError("produce --once and [source] binlog_files read as a single producer; "
                                      "[producer] ha = true is set",
                                      hint="run `cynomys produce` (leader or standby), or set ha = false")
                run_ha(cfg, sink, stop, monitor, fresh_start=args.fresh_start)
            else:
                run_with_retry(lambda: Producer(cfg, sink, stop, blocking=not once, monitor=monitor,
                                                fresh_start=args.fresh_start), stop, monitor=monitor)
        finally:
            sink.close()
    finally:
        if clock is not None:
            clock.close()
        monitor.close()
    return 0


def register(sub: Any) -> None:
    pr = with_config(sub.add_parser("produce", help="run the producer daemon"))
    pr.add_argument("--once", action="store_true", help="stop at the current end of the binlog")
    pr.add_argument("--fresh-start", action="store_true",
                    help="start with an empty state although the transport holds this producer's envelopes "
                         "(after a lost state, with [source] start set to where the target is)")
    pr.set_defaults(func=run)

