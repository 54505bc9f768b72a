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
import logging
import os
import sys
from typing import Callable

from cynomys.cli import apply, config, decode, demo, keygen, produce, snapshot, sql, status, tail, verify
from cynomys.cli.common import log_peak_memory, one_line
from cynomys.core.errors import ConfigError, CynomysError

#: The commands, in the order ``--help`` lists them: each module registers its parser.
COMMANDS = (config, keygen, produce, apply, tail, status, snapshot, verify, sql, decode, demo)
#: Daemons log their peak memory when they stop.
DAEMONS = ("produce", "apply")
#: Commands whose process ends without the interpreter's teardown once they
#: have returned (``run``): everything the producer writes is durable before
#: it returns (state and file transport fsync'd, Redis writes acknowledged),
#: and the teardown -- collecting and freeing every object still held, module
#: by module -- took 0.2-0.35 s of a 2.3 s ``produce --once`` over 500k rows
#: (10-15%, measured side by side on one core).  The applier is left alone:
#: its Spark target's JVM is stopped by pyspark's exit handlers.
QUICK_EXIT = ("produce",)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cynomys", description="Replicate MySQL/MariaDB into column stores from the binlog.")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return p


def run() -> None:
    """The process entry (the ``cynomys`` script, ``python -m cynomys.cli``)."""
    raise SystemExit(main(process=True))


def main(argv: list[str] | None = None, *, process: bool = False) -> int:
    """Run a command; its exit code.  ``process``: this is the whole
    process, which a QUICK_EXIT command then ends at once (``_leave``)."""
    args = build_parser().parse_args(argv)
    rc = _dispatch(args)
    if process and args.command in QUICK_EXIT:
        _leave(rc)
    return rc


def _leave(rc: int) -> None:
    """End the process now, its output flushed, without the interpreter's
    teardown (QUICK_EXIT)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone (a closed pipe): nothing more to say
            pass
    os._exit(rc)


def _dispatch(args: argparse.Namespace) -> int:
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
