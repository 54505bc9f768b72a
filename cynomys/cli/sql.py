"""`cynomys sql`: Spark SQL on the Iceberg target."""
from __future__ import annotations

import argparse
from typing import Any

from cynomys.cli.common import config_of, with_config
from cynomys.core.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    """Run SQL on a Spark target's session (the Iceberg catalog is the default one)."""
    from cynomys.applier.targets.base import SqlConsole, target_class

    cfg = config_of(args)
    cls = target_class(cfg)
    if not issubclass(cls, SqlConsole):
        raise ConfigError(f"`cynomys sql` queries targets with a SQL session of their own (Spark); [target] kind "
                          f"is {cfg.target.kind!r}", hint="query that target with its own client")
    target = cls(cfg)
    target.connect()
    try:
        target.show_sql(args.query, args.limit)
    finally:
        target.close()
    return 0


def register(sub: Any) -> None:
    sq = with_config(sub.add_parser("sql", help="run Spark SQL against the Iceberg target"))
    sq.add_argument("query")
    sq.add_argument("--limit", type=int, default=20)
    sq.set_defaults(func=run)

