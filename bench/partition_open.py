"""What every partition of a partitioned applier repeats per envelope.

    .venv/bin/python bench/partition_open.py [--quick]

Each partition opens every envelope (verify the signature, decrypt, gunzip,
decode the Avro batch) and then keeps its own tables' changes
(``Partitioning.select``); only the target work is split.  This measures,
on one core, those per-envelope steps for envelopes of 500 net changes
shaped like the e2e workload (tables acct, pair, log of database app), so
the repeated cost can be set against what a flush costs on the target.
Writes bench/results/partition_open.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402
from cynomys.applier.partition import Partitioning  # noqa: E402
from cynomys.core.model import Batch, Change, ColumnDef, Op, Position, TableSchema  # noqa: E402
from cynomys.schemas import codec  # noqa: E402
from cynomys.transport.envelope import Opener, Sealer  # noqa: E402
from cynomys.transport.keys import generate_keys, load_private_key, load_public_key  # noqa: E402

ACCT = TableSchema("app", "acct", (ColumnDef("id", "int(11)", False), ColumnDef("owner", "varchar(40)"),
                                   ColumnDef("balance", "decimal(14,2)"), ColumnDef("ver", "int(11)"),
                                   ColumnDef("note", "text"), ColumnDef("at", "datetime(6)")), ("id",))
PAIR = TableSchema("app", "pair", (ColumnDef("a", "int(11)", False), ColumnDef("b", "varchar(10)", False),
                                   ColumnDef("v", "double"), ColumnDef("ver", "int(11)")), ("a", "b"))
LOG = TableSchema("app", "log", (ColumnDef("who", "int(11)"), ColumnDef("what", "varchar(20)"),
                                 ColumnDef("n", "int(11)")), ())


def batch(seq: int, changes: int, rnd: random.Random) -> Batch:
    out: list[Change] = []
    for i in range(changes):
        txn = Position("mysql-bin.000001", 1000 + seq * 100_000 + i // 3 * 300)
        r = rnd.random()
        if r < 0.6:
            row = (rnd.randrange(400), "owner", Decimal(rnd.randrange(10**6)) / 100, rnd.randrange(50),
                   "n" * rnd.randrange(20), dt.datetime(2026, 11, 23, 12, 0, rnd.randrange(60)))
            out.append(Change(Op.UPDATE, "app", "acct", f"0-1-{i}", txn, 1, ACCT, row, row))
        elif r < 0.8:
            out.append(Change(Op.INSERT, "app", "pair", f"0-1-{i}", txn, 1, PAIR, None,
                              (rnd.randrange(50), f"b{rnd.randrange(7)}", rnd.random(), 0)))
        else:
            out.append(Change(Op.INSERT, "app", "log", f"0-1-{i}", txn, 1, LOG, None, (i % 5, "x", i % 3)))
    return Batch("p1", tuple(out), Position("mysql-bin.000001", 1000 + (seq + 1) * 100_000), True,
                 meta={"from": f"mysql-bin.000001:{1000 + seq * 100_000}"})


def per_call_ms(fn: Callable[[], Any], min_time: float, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_time:
            fn()
            n += 1
        runs.append((time.perf_counter() - t0) / n * 1000)
    return round(statistics.median(runs), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--changes", type=int, default=500, help="net changes per envelope")
    args = ap.parse_args()
    min_time, repeats = (0.2, 1) if args.quick else (1.0, 5)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    with tempfile.TemporaryDirectory() as d:
        keys = generate_keys(Path(d), rsa_bits=3072)
        sealer = Sealer("p1", "cynomys", load_public_key(keys["applier_public_key"]),
                        load_private_key(keys["producer_private_key"]), rotate_envelopes=1000, rotate_seconds=300)
        opener = Opener(load_private_key(keys["applier_private_key"]),
                        {"p1": load_public_key(keys["producer_public_key"])}, "cynomys")
    b = batch(1, args.changes, random.Random(1))
    payload = codec.encode(b)
    env = sealer.seal(payload, 1)
    opener.open(env)  # the data key is cached from here on (RSA once per 1000 envelopes)
    decoded = codec.decode(opener.open(env).payload)
    parts = {n: [Partitioning(n, i) for i in range(n)] for n in (2, 4)}
    rows: dict[str, Any] = {
        "envelope_bytes": len(env), "payload_bytes": len(payload), "changes": args.changes,
        "open_ms": per_call_ms(lambda: opener.open(env), min_time, repeats),
        "decode_ms": per_call_ms(lambda: codec.decode(payload), min_time, repeats),
        "select_ms_2_partitions": per_call_ms(lambda: parts[2][0].select(decoded), min_time, repeats),
        "select_ms_4_partitions": per_call_ms(lambda: parts[4][0].select(decoded), min_time, repeats),
        "kept_by_partition_of_2": [len(p.select(decoded).changes) for p in parts[2]],
    }
    rows["repeated_per_partition_ms"] = round(rows["open_ms"] + rows["decode_ms"], 3)
    print(f"per envelope of {args.changes} changes, one core: open {rows['open_ms']} ms, decode "
          f"{rows['decode_ms']} ms (both repeated by every partition), select {rows['select_ms_2_partitions']} ms "
          f"(2 partitions; kept {rows['kept_by_partition_of_2']})")
    out = write_result("partition_open", {
        "settings": {"rsa_bits": 3072, "min_time_s": min_time, "repeats": repeats, "pinned_to_one_core": True,
                     "compiled_codec": os.environ.get("CYNOMYS_PURE_PYTHON") != "1"},
        "results": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
