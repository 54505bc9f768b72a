"""`cynomys decode FILE... [--json] [--start POS] [--stop POS]`: binlog files
printed as the changes the producer would ship, transaction by transaction.

The files go through the producer's own reading path (parser/files.py feeds
BinlogSource, then the transaction assembler): the same event kinds, row
decoding and halts.  Each row change is printed as the binlog holds it;
the producer ships the same changes, folded to one net change per row
within an envelope.  Files written with ``binlog_row_metadata = MINIMAL``
have no column names: columns are named by position (``@1``, ``@2``, ...),
ENUM and SET values are their index and bit mask.

``--json`` prints one object per row change or statement, with typed values
(docs/reference/cli.md has the table):
``{"gtid", "at", "db", "table", "op", "before", "after"}``, DDL as
``{"gtid", "at", "db", "op": "DDL", "sql"}``.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import decimal
import json
import math
import sys
from typing import Any, Iterator, Sequence, TextIO

from cynomys.core.config import SourceConfig
from cynomys.core.model import Change, ColumnDef, Op, Position, Row, Value

#: Changes rendered as SQL at most at once (a long run of one table's rows
#: prints as several statements instead of one held in memory).
_RUN = 1000


def _timedelta_text(v: datetime.timedelta) -> str:
    sign = "-" if v < datetime.timedelta(0) else ""
    v = abs(v)
    hours, rest = divmod(v.days * 86400 + v.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}" + (f".{v.microseconds:06d}" if v.microseconds else "")


def json_value(col: ColumnDef, v: Value) -> str:
    """One value as JSON text.  Numbers stay numbers (DECIMAL with its exact
    digits), a JSON column is its own JSON, bytes are base64, temporal
    values ISO 8601 text (TIME as [-]HH:MM:SS[.ffffff], zero dates as MySQL
    writes them)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else json.dumps(str(v))
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, bytes):
        return json.dumps(base64.b64encode(v).decode("ascii"))
    if isinstance(v, datetime.timedelta):
        return json.dumps(_timedelta_text(v))
    if isinstance(v, (datetime.date, datetime.datetime)):
        return json.dumps(v.isoformat())
    if col.base_type == "json":
        return v  # already JSON text (the source's own)
    return json.dumps(v, ensure_ascii=False)


def _image(columns: Sequence[ColumnDef], row: Row | None) -> str:
    if row is None:
        return "null"
    return "{" + ", ".join(f"{json.dumps(c.name, ensure_ascii=False)}: {json_value(c, v)}"
                           for c, v in zip(columns, row)) + "}"


def json_line(c: Change) -> str:
    """One change as one JSON object (a line of ``decode --json``)."""
    gtid = c.tid if c.tid and c.tid != f"{c.txn.file}:{c.txn.pos}" else ""
    head = (f'{{"gtid": {json.dumps(gtid or None)}, "at": {json.dumps(f"{c.txn.file}:{c.txn.pos}")}, '
            f'"db": {json.dumps(c.database, ensure_ascii=False)}')
    if c.op is Op.DDL or c.schema is None:
        return head + f', "op": {json.dumps(c.op.value)}, "sql": {json.dumps(c.sql, ensure_ascii=False)}}}'
    cols = c.schema.columns
    return (head + f', "table": {json.dumps(c.table, ensure_ascii=False)}, "op": {json.dumps(c.op.value)}, '
            f'"before": {_image(cols, c.before)}, "after": {_image(cols, c.after)}}}')


def decode(paths: Sequence[str], start: int = 0, stop: int = 0) -> Iterator[Any]:
    """Changes and commits of binlog files, as the producer assembles them."""
    from cynomys.core.columnar import ManyRows
    from cynomys.parser.files import FileReader, binlog_order
    from cynomys.parser.stream import BinlogSource
    from cynomys.parser.txn import Assembler

    files = binlog_order(paths)
    first = Position(files[0].name, start) if start else None
    reader = FileReader(files, first, stop)
    source = BinlogSource(SourceConfig(), first or Position(files[0].name, 4), reader=reader,
                          positional_names=True)
    asm = Assembler()
    try:
        for ev in source:
            for item in asm.feed(ev):
                # A bulk insert's one item (core.columnar.ManyRows): printed row by row.
                yield from item.as_changes() if type(item) is ManyRows else (item,)
    finally:
        source.close()


def print_sql(items: Iterator[Any], out: TextIO) -> int:
    from cynomys.core.dialect import MARIADB
    from cynomys.parser.txn import Commit
    from cynomys.reducer.sql import render

    run: list[Change] = []
    tid = None
    count = 0

    def flush() -> None:
        for stmt in render(run, MARIADB):
            print(stmt + ";", file=out)
        run.clear()

    for item in items:
        if isinstance(item, Change):
            if item.tid != tid:
                tid = item.tid
                print(f"-- transaction {tid} at {item.txn.file}:{item.txn.pos}", file=out)
            if run and ((run[-1].op, run[-1].database, run[-1].table) != (item.op, item.database, item.table)
                        or len(run) >= _RUN):
                flush()
            run.append(item)
            count += 1
        elif isinstance(item, Commit) and tid is not None:
            flush()
            when = datetime.datetime.fromtimestamp(item.commit_ts, datetime.timezone.utc).isoformat()
            print(f"-- commit at {item.end.file}:{item.end.pos}, source time {when}", file=out)
            tid = None
    flush()
    return count


def print_json(items: Iterator[Any], out: TextIO) -> int:
    count = 0
    for item in items:
        if isinstance(item, Change):
            print(json_line(item), file=out)
            count += 1
    return count


def run(args: argparse.Namespace) -> int:
    from cynomys.cli.common import setup_logging

    setup_logging(args.log_level or "WARNING")
    items = decode(args.files, args.start, args.stop)
    (print_json if args.json else print_sql)(items, sys.stdout)
    sys.stdout.flush()
    return 0


def register(sub: Any) -> None:
    dc = sub.add_parser("decode", help="print binlog files as the changes the producer would ship")
    dc.add_argument("files", nargs="+", metavar="FILE", help="binlog files (read in binlog order)")
    dc.add_argument("--json", action="store_true", help="one JSON object per row change, with typed values")
    dc.add_argument("--start", type=int, default=0, metavar="POS", help="begin at this offset of the first file")
    dc.add_argument("--stop", type=int, default=0, metavar="POS",
                    help="end before the event at this offset of the last file")
    dc.set_defaults(func=run)
