"""`cynomys sql`: read-only SQL on the target's data (Spark SQL, or DuckDB
on the Iceberg replica without a JVM)."""
from __future__ import annotations

import argparse
from typing import Any, cast

from cynomys.cli.common import config_of, with_config
from cynomys.core.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    """Run one statement in a read-only console of the target (nothing is written)."""
    from cynomys.applier.targets.base import SqlConsoles, target_class

    cfg = config_of(args)
    cls = target_class(cfg)
    if not callable(getattr(cls, "open_console", None)):
        raise ConfigError(f"`cynomys sql` queries targets with a SQL session of their own (Spark/Iceberg); "
                          f"[target] kind is {cfg.target.kind!r}", hint="query that target with its own client")
    consoles = cast(type[SqlConsoles], cls)
    engine = args.engine or consoles.console_engines[0]
    if engine not in consoles.console_engines:
        raise ConfigError(f"`cynomys sql --engine {engine}`: the {cfg.target.kind} target is read with "
                          + " or ".join(consoles.console_engines), hint="pick one of those engines")
    console = consoles.open_console(cfg, engine)
    try:
        console.show_sql(args.query, args.limit)
    finally:
        console.close()
    return 0


def register(sub: Any) -> None:
    sq = with_config(sub.add_parser("sql", help="read-only SQL on the target (Spark SQL, or DuckDB on Iceberg)"))
    sq.add_argument("query")
    sq.add_argument("--limit", type=int, default=20)
    sq.add_argument("--engine", default="", help="spark (the default) or duckdb: DuckDB's SQL, no JVM")
    sq.set_defaults(func=run)
