"""`cynomys config check`: validate a configuration file."""
from __future__ import annotations

import argparse
from typing import Any

from cynomys.cli.common import with_config
from cynomys.core.config import Config, load_config
from cynomys.core.errors import ConfigError


def check_target(cfg: Config) -> str:
    """Build the configured target without connecting to it, so that its own
    checks of ``[target]`` run (the url, ColumnStore's ``engine``,
    ``[target.spark]``'s catalog and jars).  Where its driver is not
    installed (a producer's host needs none) that is only noted: the keys
    were validated by ``load_config`` already.  Returns the note, or ''."""
    from cynomys.applier.targets.base import target_class

    try:
        cls = target_class(cfg)
    except ConfigError as exc:
        return f"note: {exc}; [target] was checked for its keys and values only"
    cls(cfg)
    return ""


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    note = check_target(cfg)
    print(f"{args.config}: OK")
    if note:
        print(note)
    print(repr(cfg))
    return 0


def register(sub: Any) -> None:
    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    with_config(cfg_sub.add_parser("check", help="validate a configuration file")).set_defaults(func=run)
