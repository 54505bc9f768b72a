"""`cynomys sql`: Spark SQL on the Iceberg target."""
from __future__ import annotations

import argparse
from typing import Any

from cynomys.cli.common import config_of, with_config
from cynomys.core.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    """Run SQL on a Spark target's session (the Iceberg catalog is the default one)."""
    from cynomys.applier.targets.base import open_target

    cfg = config_of(args)
    if cfg.target.kind != "spark":
        raise ConfigError(f"`cynomys sql` queries Spark targets; [target] kind is {cfg.target.kind!r}",
                          hint="query that target with its own client")
    target: Any = open_target(cfg)
    target.connect()
    try:
        target.spark.sql(f"USE {cfg.target.spark.catalog}")
        target.spark.sql(args.query).show(args.limit, truncate=False)
    finally:
        target.close()
    return 0


def register(sub: Any) -> None:
    sq = with_config(sub.add_parser("sql", help="run Spark SQL against the Iceberg target"))
    sq.add_argument("query")
    sq.add_argument("--limit", type=int, default=20)
    sq.set_defaults(func=run)

