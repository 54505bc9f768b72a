"""`cynomys demo`: the sample job."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cynomys.cli.common import setup_logging


def run(args: argparse.Namespace) -> int:
    from cynomys.sandbox.demo import run_demo

    setup_logging(args.log_level or "INFO")
    return run_demo(Path(args.workdir), rows=args.rows, keep=args.keep)


def register(sub: Any) -> None:
    dm = sub.add_parser("demo", help="sample job: throwaway MariaDB + Redis + keys, a workload, replication")
    dm.add_argument("--workdir", default="./cynomys-demo")
    dm.add_argument("--rows", type=int, default=20000)
    dm.add_argument("--keep", action="store_true", help="leave the servers running")
    dm.set_defaults(func=run)
