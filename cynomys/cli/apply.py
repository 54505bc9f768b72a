"""`cynomys apply`: the applier daemon (analytics host)."""
from __future__ import annotations

import argparse
import os
from typing import Any, MutableMapping

from cynomys.cli.common import config_of, stop_on_signals, with_config

#: The allocator pyarrow uses in the applier, unless ARROW_DEFAULT_MEMORY_POOL
#: says otherwise.  pyarrow's default (mimalloc) keeps the memory of freed
#: Arrow buffers: measured on lineitem 1M (ColumnStore), the applier's peak
#: RSS was 158-173 MB with mimalloc, 129-133 MB with the system allocator,
#: 138 MB with jemalloc, at the same speed (bench/lineitem.py,
#: bench/applier_decode.py; issue #12).
APPLIER_ARROW_POOL = "system"


def choose_arrow_pool(env: MutableMapping[str, str]) -> str:
    """Set the applier's Arrow allocator in ``env`` (os.environ), where pyarrow
    reads it when first imported; a value already set is kept."""
    return env.setdefault("ARROW_DEFAULT_MEMORY_POOL", APPLIER_ARROW_POOL)


def run(args: argparse.Namespace) -> int:
    choose_arrow_pool(os.environ)  # before anything imports pyarrow
    from cynomys.applier.loop import run_applier
    from cynomys.metrics import ApplierMonitor
    from cynomys.metrics.clock import ApplierClock

    cfg = config_of(args)
    stop = stop_on_signals()
    monitor = ApplierMonitor(cfg)
    monitor.start()  # /metrics and /healthz when [metrics] listen is set
    # The clock offsets freshness is corrected by (a thread of its own).
    clock = ApplierClock(cfg, monitor).start()
    try:
        run_applier(cfg, stop, until_idle_s=args.until_idle, monitor=monitor)
    finally:
        clock.close()
        monitor.close()
    return 0


def register(sub: Any) -> None:
    ap = with_config(sub.add_parser("apply", help="run the applier daemon"))
    ap.add_argument("--until-idle", type=float, default=0.0, metavar="SECONDS",
                    help="exit after this long with nothing to apply (0: run until stopped)")
    ap.set_defaults(func=run)

