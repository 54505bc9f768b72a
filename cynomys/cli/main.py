"""Command line: the only place that wires daemons and configures logging.

    cynomys config check -c FILE
    cynomys keygen --out DIR
    cynomys produce -c FILE        (producer daemon, source host)
    cynomys apply -c FILE          (applier daemon, analytics host)
    cynomys tail -c FILE           (decode records and print them as SQL)
    cynomys status -c FILE [--json]
    cynomys snapshot -c FILE [--tables db.t1,db.t2] [--where SQL]   (full-state capture via the producer)
    cynomys verify -c FILE [--tables PATTERN] [--chunk-size N] [--repair] [--no-wait] [--status]
    cynomys sql -c FILE "SELECT"   (Spark SQL on the Iceberg target)
    cynomys decode FILE... [--json] [--start POS] [--stop POS]   (binlog files as the changes shipped)
    cynomys demo                   (the sample job: throwaway MariaDB + Redis + keys)

Exit codes: 0 done (also after SIGTERM/SIGINT, once flushed and
checkpointed), 2 bad usage or configuration, 3 terminal replication error.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from cynomys.cli import apply, config, decode, demo, keygen, produce, snapshot, sql, status, tail, verify
from cynomys.cli.common import log_peak_memory, one_line
from cynomys.core.errors import ConfigError, CynomysError

#: The commands, in the order ``--help`` lists them: each module registers its parser.
COMMANDS = (config, keygen, produce, apply, tail, status, snapshot, verify, sql, decode, demo)
#: Daemons log their peak memory when they stop.
DAEMONS = ("produce", "apply")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cynomys", description="Replicate MySQL/MariaDB into column stores from the binlog.")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        rc = func(args)
        if args.command in DAEMONS:
            log_peak_memory()
        return rc
    except ConfigError as exc:
        print(f"cynomys: configuration error: {one_line(exc)}", file=sys.stderr)
        return 2
    except CynomysError as exc:
        print(f"cynomys: {'transient' if exc.transient else 'terminal'} error: {one_line(exc)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 0
