"""`cynomys config check`: validate a configuration file."""
from __future__ import annotations

import argparse
from typing import Any

from cynomys.cli.common import with_config
from cynomys.core.config import load_config


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    print(f"{args.config}: OK")
    print(repr(cfg))
    return 0


def register(sub: Any) -> None:
    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    with_config(cfg_sub.add_parser("check", help="validate a configuration file")).set_defaults(func=run)

