"""`cynomys apply`: the applier daemon (analytics host)."""
from __future__ import annotations

import argparse
import ctypes
import os
from typing import Any, Mapping, MutableMapping

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


#: glibc malloc settings of the applier (mallopt), unless the environment
#: sets them (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_).  Arrow's system pool
#: is glibc's malloc, whose defaults keep freed memory: an arena per thread
#: that allocated (commit threads, the transport reader), and a threshold
#: for mmap that rises to the largest buffer freed so far, after which every
#: buffer comes from the heap and stays there.  Measured on a Spark initial
#: load of 3M lineitem rows with 345k-row flushes (bench/initial_load.py):
#: peak RSS 450 MB with the defaults, 401 MB with these, the RSS falling
#: back by ~100 MB after each flush instead of staying at its peak.
APPLIER_MALLOC = {"MALLOC_ARENA_MAX": 2, "MALLOC_MMAP_THRESHOLD_": 128 * 1024}
_MALLOPT = {"MALLOC_ARENA_MAX": -8, "MALLOC_MMAP_THRESHOLD_": -3}  # M_ARENA_MAX, M_MMAP_THRESHOLD (malloc.h)


def tune_malloc(env: Mapping[str, str]) -> dict[str, int]:
    """Apply APPLIER_MALLOC to this process's glibc malloc, each setting
    unless ``env`` has its own; returns what was set (nothing off glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    done: dict[str, int] = {}
    for name, value in APPLIER_MALLOC.items():
        if name not in env and mallopt(_MALLOPT[name], value) == 1:
            done[name] = value
    return done


def run(args: argparse.Namespace) -> int:
    choose_arrow_pool(os.environ)  # before anything imports pyarrow
    tune_malloc(os.environ)  # before the threads that allocate start
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

