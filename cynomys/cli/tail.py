"""`cynomys tail`: decode envelopes on the transport and print them as SQL.

Reads without consuming: a Redis stream is read with XRANGE/XREAD (never
through the applier's consumer group, whose pending list must not change);
a file transport is read from its start by a throwaway reader that never
acknowledges; pub/sub shows what is published from now on.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import sys
import threading
from dataclasses import replace
from itertools import groupby
from typing import Any, Iterator, TextIO

from cynomys.cli.common import config_of, stop_on_signals, with_config
from cynomys.core.config import Config
from cynomys.core.dialect import MARIADB
from cynomys.core.errors import EnvelopeRejected, SchemaError
from cynomys.core.model import Op
from cynomys.reducer.sql import render
from cynomys.schemas import codec

log = logging.getLogger(__name__)


def _stream_envelopes(cfg: Config, stop: threading.Event, follow: bool) -> Iterator[bytes]:
    import redis

    from cynomys.transport.redis_bus import SUBSCRIBE_SOCKET_TIMEOUT_S, redis_client, translate

    # The transport's own client: URL checked, TLS verified, errors (Redis
    # down, wrong password) translated into one-line Cynomys errors.
    r = redis_client(cfg.transport.url, SUBSCRIBE_SOCKET_TIMEOUT_S)
    stream = cfg.transport.stream
    last = "0-0"
    entries: list[Any]
    try:
        while not stop.is_set():
            try:
                if follow:
                    reply: Any = r.xread({stream: last}, count=100, block=500)
                    entries = reply[0][1] if reply else []
                else:
                    entries = list(r.xrange(stream, min="(" + last if last != "0-0" else "-", count=100))  # type: ignore[arg-type]
            except redis.RedisError as exc:
                raise translate(exc, cfg.transport.url, f"reading stream {stream}") from None
            if not entries and not follow:
                return
            for entry_id, fields in entries:
                last = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                if b"env" in fields:
                    yield bytes(fields[b"env"])
    finally:
        r.close()


def _other_envelopes(cfg: Config, stop: threading.Event, follow: bool) -> Iterator[bytes]:
    from cynomys.transport.bus import open_subscriber

    tcfg = cfg.transport
    if tcfg.kind == "file":
        tcfg = replace(tcfg, path=str(cfg.resolve(tcfg.path)))
    sub = open_subscriber(tcfg, f"cynomys-tail-{threading.get_ident()}")
    try:
        while not stop.is_set():
            got = sub.read(100, 500)
            if not got and not follow:
                return
            for d in got:
                yield d.envelope
    finally:
        sub.close()


def tail(cfg: Config, stop: threading.Event, *, follow: bool, limit: int, out: TextIO) -> int:
    """Print records as SQL; returns how many records were printed."""
    from cynomys.transport.channel import make_opener

    opener = make_opener(cfg)
    source = _stream_envelopes if cfg.transport.kind == "redis" and cfg.transport.mode == "stream" else _other_envelopes
    printed = 0
    for env in source(cfg, stop, follow):
        try:
            opened = opener.open(env)
            batch = codec.decode(opened.payload)
        except (EnvelopeRejected, SchemaError) as exc:
            print(f"-- rejected envelope: {exc}", file=out)
            continue
        when = datetime.datetime.fromtimestamp(batch.last_commit_ts, datetime.timezone.utc).isoformat() \
            if batch.last_commit_ts else "-"
        print(f"-- envelope {opened.seq} from {opened.producer_id}: {len(batch.changes)} changes, "
              f"up to {batch.end}{'' if batch.complete else ' (transaction continues)'}, source time {when}", file=out)
        # One header per run of changes of one transaction, op and table;
        # the run renders as one multi-row statement where it can.
        for (tid, op, db, table), group in groupby(batch.changes, key=lambda c: (c.tid, c.op, c.database, c.table)):
            changes = list(group)
            if limit:
                changes = changes[: limit - printed]
            print(f"-- tid {tid} {op.value} {db}.{table}".rstrip(".") + f" ({len(changes)} rows)" * (op is not Op.DDL),
                  file=out)
            for stmt in render(changes, MARIADB):
                print(stmt + ";", file=out)
            printed += len(changes)
            if limit and printed >= limit:
                return printed
        out.flush()
    return printed


# -- the command ----------------------------------------------------------

def run(args: argparse.Namespace) -> int:

    cfg = config_of(args)
    stop = stop_on_signals()
    tail(cfg, stop, follow=args.follow, limit=args.count, out=sys.stdout)
    return 0


def register(sub: Any) -> None:
    tl = with_config(sub.add_parser("tail", help="decode records from the transport and print them as SQL"))
    tl.add_argument("-f", "--follow", action="store_true")
    tl.add_argument("-n", "--count", type=int, default=0, help="stop after N records (0: all)")
    tl.set_defaults(func=run)

