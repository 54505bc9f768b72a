"""What every command shares: logging set-up (the only place handlers are
configured), the stop signal, loading the config, one-line errors."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from cynomys.core.config import Config, load_config
from cynomys.core.errors import CynomysError

log = logging.getLogger(__name__)


def with_config(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sp.add_argument("-c", "--config", required=True, help="TOML configuration file")
    return sp


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level, logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s: finishing the current batch, then exiting", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def config_of(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    setup_logging(getattr(args, "log_level", None) or cfg.log.level)
    return cfg


def log_peak_memory() -> None:
    # VmHWM, not ru_maxrss: on Linux ru_maxrss survives fork+exec, so a
    # daemon started by a big parent would report the parent's peak.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                log.info("peak RSS %.1f MB", int(line.split()[1]) / 1024)
                return
    except OSError:
        pass
    import resource

    log.info("peak RSS %.1f MB (ru_maxrss)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def one_line(exc: CynomysError) -> str:
    """The problem and its fix on one line (log collectors and shells keep
    lines together; a driver's multi-line message is folded too)."""
    text = exc.message if exc.hint is None else f"{exc.message} (fix: {exc.hint})"
    return " ".join(text.split())
