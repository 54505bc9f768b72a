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
    cynomys demo                   (the sample job: throwaway MariaDB + Redis + keys)

Exit codes: 0 done (also after SIGTERM/SIGINT, once flushed and
checkpointed), 2 bad usage or configuration, 3 terminal replication error.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, MutableMapping

from cynomys.core.config import Config, load_config
from cynomys.core.errors import ConfigError, CynomysError

log = logging.getLogger(__name__)


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level, logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s: finishing the current batch, then exiting", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    _setup_logging(getattr(args, "log_level", None) or cfg.log.level)
    return cfg


# -- commands ----------------------------------------------------------------
def cmd_config_check(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    print(f"{args.config}: OK")
    print(repr(cfg))
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from cynomys.transport.keys import generate_keys

    import os
    passphrase = os.environ.get("CYNOMYS_SECURITY_PASSPHRASE") if args.passphrase else None
    if args.passphrase and not passphrase:
        raise ConfigError("--passphrase given but CYNOMYS_SECURITY_PASSPHRASE is empty",
                          hint="export CYNOMYS_SECURITY_PASSPHRASE=... first")
    paths = generate_keys(Path(args.out), rsa_bits=args.bits, passphrase=passphrase, force=args.force)
    print("[security]")
    for key, path in sorted(paths.items()):
        print(f'{key} = "{path}"')
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from cynomys.metrics import ProducerMonitor
    from cynomys.producer import Producer, SealedSink, run_with_retry

    cfg = _config(args)
    stop = _stop_on_signals()
    monitor = ProducerMonitor(cfg)
    monitor.start()  # /metrics and /healthz when [metrics] listen is set
    try:
        sink = SealedSink(cfg)
        try:
            if cfg.producer.ha:
                from cynomys.ha import run_ha

                if args.once:
                    raise ConfigError("produce --once reads as a single producer; [producer] ha = true is set",
                                      hint="run `cynomys produce` (leader or standby), or set ha = false")
                run_ha(cfg, sink, stop, monitor, fresh_start=args.fresh_start)
            else:
                run_with_retry(lambda: Producer(cfg, sink, stop, blocking=not args.once, monitor=monitor,
                                                fresh_start=args.fresh_start), stop, monitor=monitor)
        finally:
            sink.close()
    finally:
        monitor.close()
    return 0


#: The allocator pyarrow uses in the applier, unless ARROW_DEFAULT_MEMORY_POOL
#: says otherwise.  pyarrow's default (mimalloc) keeps the memory of freed
#: Arrow buffers: measured on lineitem 1M (ColumnStore), the applier's peak
#: RSS was 158-173 MB with mimalloc, 129-133 MB with the system allocator,
#: 138 MB with jemalloc, at the same speed (bench/lineitem.py,
#: bench/applier_decode.py; issue #12).
APPLIER_ARROW_POOL = "system"


def _choose_arrow_pool(env: MutableMapping[str, str]) -> str:
    """Set the applier's Arrow allocator in ``env`` (os.environ), where pyarrow
    reads it when first imported; a value already set is kept."""
    return env.setdefault("ARROW_DEFAULT_MEMORY_POOL", APPLIER_ARROW_POOL)


def cmd_apply(args: argparse.Namespace) -> int:
    _choose_arrow_pool(os.environ)  # before anything imports pyarrow
    from cynomys.applier.loop import run_applier
    from cynomys.metrics import ApplierMonitor

    cfg = _config(args)
    stop = _stop_on_signals()
    monitor = ApplierMonitor(cfg)
    monitor.start()  # /metrics and /healthz when [metrics] listen is set
    try:
        run_applier(cfg, stop, until_idle_s=args.until_idle, monitor=monitor)
    finally:
        monitor.close()
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    from cynomys.tail import tail

    cfg = _config(args)
    stop = _stop_on_signals()
    tail(cfg, stop, follow=args.follow, limit=args.count, out=sys.stdout)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from cynomys.status import collect, render_text

    cfg = _config(args)
    report = collect(cfg)
    print(json.dumps(report, indent=1, default=str) if args.json else render_text(report))
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    from cynomys.snapshot.command import run_snapshot_command

    cfg = _config(args)
    action, job_id = "list" if args.list else None, "*"
    for name in ("cancel", "pause", "resume"):
        if getattr(args, name) is not None:
            action, job_id = name, getattr(args, name)
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    return run_snapshot_command(cfg, tables=tables, where=args.where, action=action, job_id=job_id,
                                wait=not args.no_wait, progress=not args.no_progress)


def cmd_verify(args: argparse.Namespace) -> int:
    """Exits like diff: 0 equal, 1 a mismatch remains, 2 on error."""
    from cynomys.verify_command import ERROR, print_status, run_verify_command

    try:
        cfg = _config(args)
        if args.status:
            return print_status(cfg)
        tables = [t.strip() for t in args.tables.split(",") if t.strip()]
        return run_verify_command(cfg, tables=tables, chunk_size=args.chunk_size, wait=not args.no_wait,
                                  repair=args.repair, progress=not args.no_progress, timeout_s=args.timeout)
    except CynomysError as exc:
        kind = "configuration" if isinstance(exc, ConfigError) else ("transient" if exc.transient else "terminal")
        print(f"cynomys: {kind} error: {_one_line(exc)}", file=sys.stderr)
        return ERROR


def cmd_sql(args: argparse.Namespace) -> int:
    """Run SQL on a Spark target's session (the Iceberg catalog is the default one)."""
    from cynomys.applier.targets.base import open_target

    cfg = _config(args)
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


def cmd_demo(args: argparse.Namespace) -> int:
    from cynomys.sandbox.demo import run_demo

    _setup_logging(args.log_level or "INFO")
    return run_demo(Path(args.workdir), rows=args.rows, keep=args.keep)


# -- parser ------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cynomys", description="Replicate MySQL/MariaDB into column stores from the binlog.")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("-c", "--config", required=True, help="TOML configuration file")
        return sp

    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    with_config(cfg_sub.add_parser("check", help="validate a configuration file")).set_defaults(func=cmd_config_check)

    kg = sub.add_parser("keygen", help="write the applier's RSA and the producer's Ed25519 key pairs")
    kg.add_argument("--out", required=True)
    kg.add_argument("--bits", type=int, default=3072)
    kg.add_argument("--passphrase", action="store_true", help="encrypt private keys with $CYNOMYS_SECURITY_PASSPHRASE")
    kg.add_argument("--force", action="store_true", help="overwrite existing key files")
    kg.set_defaults(func=cmd_keygen)

    pr = with_config(sub.add_parser("produce", help="run the producer daemon"))
    pr.add_argument("--once", action="store_true", help="stop at the current end of the binlog")
    pr.add_argument("--fresh-start", action="store_true",
                    help="start with an empty state although the transport holds this producer's envelopes "
                         "(after a lost state, with [source] start set to where the target is)")
    pr.set_defaults(func=cmd_produce)

    ap = with_config(sub.add_parser("apply", help="run the applier daemon"))
    ap.add_argument("--until-idle", type=float, default=0.0, metavar="SECONDS",
                    help="exit after this long with nothing to apply (0: run until stopped)")
    ap.set_defaults(func=cmd_apply)

    tl = with_config(sub.add_parser("tail", help="decode records from the transport and print them as SQL"))
    tl.add_argument("-f", "--follow", action="store_true")
    tl.add_argument("-n", "--count", type=int, default=0, help="stop after N records (0: all)")
    tl.set_defaults(func=cmd_tail)

    st = with_config(sub.add_parser("status", help="positions and lag"))
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    sn = with_config(sub.add_parser("snapshot", help="snapshot tables through the running producer (DBLog watermarks)"))
    sn.add_argument("--tables", default="", help="db.t1,db.t2 (default: every replicated table)")
    sn.add_argument("--where", default="", help="SQL condition choosing rows, e.g. \"id IN (1, 2)\"")
    sn_act = sn.add_mutually_exclusive_group()
    for name in ("cancel", "pause", "resume"):
        sn_act.add_argument(f"--{name}", nargs="?", const="*", metavar="ID", help=f"{name} a snapshot (default: all)")
    sn_act.add_argument("--list", action="store_true", help="list snapshots and their progress")
    sn.add_argument("--no-wait", action="store_true", help="return once the request is written")
    sn.add_argument("--no-progress", action="store_true", help="no progress bar while waiting")
    sn.set_defaults(func=cmd_snapshot)

    vf = with_config(sub.add_parser("verify", help="compare source and target chunk by chunk through the running "
                                                   "daemons (exit 0 equal, 1 differ, 2 error)"))
    vf.add_argument("--tables", default="", help="db.t1,db.* (default: every replicated table)")
    vf.add_argument("--chunk-size", type=int, default=0, help="rows per checksum (default: [snapshot] chunk_size)")
    vf.add_argument("--repair", action="store_true", help="re-read mismatching ranges into the target, verify again")
    vf.add_argument("--no-wait", action="store_true", help="return once the request is written")
    vf.add_argument("--no-progress", action="store_true", help="no progress bar while waiting")
    vf.add_argument("--timeout", type=float, default=0.0, help="give up waiting after S seconds (exit 2; 0: wait)")
    vf.add_argument("--status", action="store_true", help="show verify jobs, progress and mismatches")
    vf.set_defaults(func=cmd_verify)

    sq = with_config(sub.add_parser("sql", help="run Spark SQL against the Iceberg target"))
    sq.add_argument("query")
    sq.add_argument("--limit", type=int, default=20)
    sq.set_defaults(func=cmd_sql)

    dm = sub.add_parser("demo", help="sample job: throwaway MariaDB + Redis + keys, a workload, replication")
    dm.add_argument("--workdir", default="./cynomys-demo")
    dm.add_argument("--rows", type=int, default=20000)
    dm.add_argument("--keep", action="store_true", help="leave the servers running")
    dm.set_defaults(func=cmd_demo)
    return p


def _log_peak_memory() -> None:
    # VmHWM, not ru_maxrss: on Linux ru_maxrss survives fork+exec, so a
    # daemon started by a big parent would report the parent's peak.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                log.info("peak RSS %.1f MB", int(line.split()[1]) / 1024)
                return
    except OSError:
        pass
    import resource

    log.info("peak RSS %.1f MB (ru_maxrss)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _one_line(exc: CynomysError) -> str:
    """The problem and its fix on one line (log collectors and shells keep
    lines together; a driver's multi-line message is folded too)."""
    text = exc.message if exc.hint is None else f"{exc.message} (fix: {exc.hint})"
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        rc = func(args)
        if args.command in ("produce", "apply"):
            _log_peak_memory()
        return rc
    except ConfigError as exc:
        print(f"cynomys: configuration error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except CynomysError as exc:
        print(f"cynomys: {'transient' if exc.transient else 'terminal'} error: {_one_line(exc)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
