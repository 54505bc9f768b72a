"""`cynomys config check`: validate a configuration file.

What it checks without any server: every key and value (``load_config``),
the target's own settings where its driver is installed, and ``[shape]``
as the file says it (patterns and their capture groups, targets, masks,
filters, column names: ``cynomys.shape.compile_rules``).  When the source
is reachable (not with ``--offline``), ``[shape]`` against the source's
tables too (``cynomys.shape.check``): each table can be shaped, and tables
merged into one have the same key and no column of two types; and what the
producer checks at start (``check_source``).
"""
from __future__ import annotations

import argparse
from typing import Any

from cynomys.cli.common import one_line, with_config
from cynomys.core.config import Config, load_config
from cynomys.core.errors import ConfigError, CynomysError
from cynomys.core.model import TableSchema


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


def source_schemas(cfg: Config) -> list[TableSchema]:
    """The replicated tables of the source ([source] include/exclude), from its information_schema."""
    from cynomys.parser.stream import TableFilter
    from cynomys.snapshot.source import SnapshotConnection

    keep = TableFilter(cfg.source.include_tables, cfg.source.exclude_tables)
    conn = SnapshotConnection(cfg.source)
    try:
        return [conn.describe(db, t).schema for db, t in conn.base_tables()
                if keep(db, t) and db != cfg.snapshot.watermark_schema]
    finally:
        conn.close()


def check_shape(cfg: Config, *, online: bool) -> list[str]:
    """``[shape]`` checked (ConfigError naming what is wrong); returns notes."""
    from cynomys.shape import compile_rules
    from cynomys.shape.check import check_sources

    rules = compile_rules(cfg)
    notes: list[str] = []
    if rules.needs_mask_key and len(cfg.shape.mask_key) < 16:
        notes.append("note: [shape] mask_key is not set here: the producer needs it for its hash masks (set "
                     "CYNOMYS_SHAPE_MASK_KEY on the producer's host; the applier never needs it)")
    if not rules.producer_active:
        return notes
    if not online or cfg.source.binlog_files:
        why = "--offline" if not online else "[source] binlog_files: no live source"
        return notes + [f"note: [shape] was checked offline only ({why}): its tables are checked when the producer "
                        "shapes them"]
    try:
        schemas = source_schemas(cfg)
    except CynomysError as exc:
        return notes + [f"note: the source is not reachable ({one_line(exc)}): [shape] was checked offline only; "
                        "run `cynomys config check` where it is to check the tables it routes and merges"]
    report = check_sources(rules, schemas)
    if report.errors:
        more = f" (and {len(report.errors) - 1} more: " + "; ".join(report.errors[1:]) + ")" if len(report.errors) > 1 \
            else ""
        raise ConfigError(f"[shape] against the source's tables: {report.errors[0]}{more}")
    return notes + [f"note: {n}" for n in report.notes] + [
        f"[shape] checked against the source's {report.tables} replicated tables"]


def check_source(cfg: Config, *, online: bool) -> list[str]:
    """The checks the producer makes at start (binlog settings, a replica's
    log_slave_updates, table patterns against the source's tables, its
    binlog filters), when the source is reachable; returns notes."""
    if not online or cfg.source.binlog_files:
        return []
    from cynomys.parser.stream import SourceInspector
    from cynomys.producer.table_patterns import check_source_scope

    try:
        inspector = SourceInspector(cfg.source)
    except CynomysError as exc:
        return [f"note: the source is not reachable ({one_line(exc)}): its settings and tables are checked when "
                "the producer starts"]
    try:
        inspector.check_settings()
        check_source_scope(cfg, inspector)
    finally:
        inspector.close()
    return [f"[source] {cfg.source.host}:{cfg.source.port}: binlog settings and table patterns checked"]


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    note = check_target(cfg)
    shape_notes = check_source(cfg, online=not args.offline) + check_shape(cfg, online=not args.offline)
    print(f"{args.config}: OK")
    for n in ([note] if note else []) + shape_notes:
        print(n)
    print(repr(cfg))
    return 0


def register(sub: Any) -> None:
    cfg = sub.add_parser("config", help="configuration tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    check = with_config(cfg_sub.add_parser("check", help="validate a configuration file"))
    check.add_argument("--offline", action="store_true",
                       help="do not connect to the source (check [shape] against the file only)")
    check.set_defaults(func=run)
