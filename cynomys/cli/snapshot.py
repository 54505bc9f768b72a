"""`cynomys snapshot`: full-state capture through the running producer."""
from __future__ import annotations

import argparse
from typing import Any

from cynomys.cli.common import config_of, with_config


def run(args: argparse.Namespace) -> int:
    from cynomys.snapshot.command import run_snapshot_command

    cfg = config_of(args)
    action, job_id = "list" if args.list else None, "*"
    for name in ("cancel", "pause", "resume"):
        if getattr(args, name) is not None:
            action, job_id = name, getattr(args, name)
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    return run_snapshot_command(cfg, tables=tables, where=args.where, action=action, job_id=job_id,
                                wait=not args.no_wait, progress=not args.no_progress)


def register(sub: Any) -> None:
    sn = with_config(sub.add_parser("snapshot", help="snapshot tables through the running producer (DBLog watermarks)"))
    sn.add_argument("--tables", default="", help="db.t1,db.t2 (default: every replicated table)")
    sn.add_argument("--where", default="", help="SQL condition choosing rows, e.g. \"id IN (1, 2)\"")
    sn_act = sn.add_mutually_exclusive_group()
    for name in ("cancel", "pause", "resume"):
        sn_act.add_argument(f"--{name}", nargs="?", const="*", metavar="ID", help=f"{name} a snapshot (default: all)")
    sn_act.add_argument("--list", action="store_true", help="list snapshots and their progress")
    sn.add_argument("--no-wait", action="store_true", help="return once the request is written")
    sn.add_argument("--no-progress", action="store_true", help="no progress bar while waiting")
    sn.set_defaults(func=run)

