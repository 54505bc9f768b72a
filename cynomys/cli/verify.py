"""`cynomys verify`: compare source and target chunk by chunk through the running daemons."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from cynomys.cli.common import config_of, one_line, with_config
from cynomys.core.errors import ConfigError, CynomysError


def run(args: argparse.Namespace) -> int:
    """Exits like diff: 0 equal, 1 a mismatch remains, 2 on error."""
    from cynomys.verify.command import ERROR, print_status, run_verify_command

    try:
        cfg = config_of(args)
        if args.status:
            return print_status(cfg)
        tables = [t.strip() for t in args.tables.split(",") if t.strip()]
        return run_verify_command(cfg, tables=tables, chunk_size=args.chunk_size, wait=not args.no_wait,
                                  repair=args.repair, progress=not args.no_progress, timeout_s=args.timeout)
    except CynomysError as exc:
        kind = "configuration" if isinstance(exc, ConfigError) else ("transient" if exc.transient else "terminal")
        print(f"cynomys: {kind} error: {one_line(exc)}", file=sys.stderr)
        return ERROR


def register(sub: Any) -> None:
    vf = with_config(sub.add_parser("verify", help="compare source and target chunk by chunk through the running "
                                                   "daemons (exit 0 equal, 1 differ, 2 error)"))
    vf.add_argument("--tables", default="", help="db.t1,db.* (default: every replicated table)")
    vf.add_argument("--chunk-size", type=int, default=0, help="rows per checksum (default: [snapshot] chunk_size)")
    vf.add_argument("--repair", action="store_true", help="re-read mismatching ranges into the target, verify again")
    vf.add_argument("--no-wait", action="store_true", help="return once the request is written")
    vf.add_argument("--no-progress", action="store_true", help="no progress bar while waiting")
    vf.add_argument("--timeout", type=float, default=0.0, help="give up waiting after S seconds (exit 2; 0: wait)")
    vf.add_argument("--status", action="store_true", help="show verify jobs, progress and mismatches")
    vf.set_defaults(func=run)

