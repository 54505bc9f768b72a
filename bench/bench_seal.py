"""Seal + open throughput of the transport envelope, one core.

    /tmp/venv/bin/python bench/bench_seal.py [--quick]

Payloads are real Avro (fastavro, schemaless) rows shaped like TPC-H
lineitem with varying numbers and text, so gzip sees realistic redundancy.
Throughput is MB/s of *payload* (1 MB = 10**6 bytes).  Writes
bench/results/seal.json with the machine description.
"""
from __future__ import annotations

import argparse
import datetime
import io
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import fastavro
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import cpu_model, write_json  # noqa: E402
from cynomys.transport.envelope import Opener, Sealer  # noqa: E402
from cynomys.transport.keys import (  # noqa: E402
    PrivateKey,
    PublicKey,
    generate_keys,
    load_private_key,
    load_public_key,
)

SIZES = {"16KiB": 16 * 1024, "256KiB": 256 * 1024, "1MiB": 1024 * 1024}
SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "lineitem_change", "fields": [
        {"name": "tid", "type": "long"},
        {"name": "database_name", "type": "string"},
        {"name": "table_name", "type": "string"},
        {"name": "op", "type": "string"},
        {"name": "l_orderkey", "type": "long"},
        {"name": "l_partkey", "type": "long"},
        {"name": "l_suppkey", "type": "int"},
        {"name": "l_linenumber", "type": "int"},
        {"name": "l_quantity", "type": "bytes"},       # DECIMAL(15,2) unscaled
        {"name": "l_extendedprice", "type": "bytes"},
        {"name": "l_discount", "type": "bytes"},
        {"name": "l_returnflag", "type": "string"},
        {"name": "l_linestatus", "type": "string"},
        {"name": "l_shipdate", "type": {"type": "int", "logicalType": "date"}},
        {"name": "l_shipinstruct", "type": "string"},
        {"name": "l_shipmode", "type": "string"},
        {"name": "l_comment", "type": "string"},
    ]})
WORDS = ("furiously regular deposits sleep quickly final packages haggle carefully ironic accounts "
         "boldly express requests nag slyly pending theodolites wake blithely even instructions").split()


def avro_payload(size: int, seed: int = 1) -> bytes:
    """Concatenated schemaless Avro records, about ``size`` bytes."""
    rnd = random.Random(seed)
    buf = io.BytesIO()
    i = 0
    while buf.tell() < size:
        i += 1
        fastavro.schemaless_writer(buf, SCHEMA, {
            "tid": 1_000_000 + i // 7, "database_name": "tpch", "table_name": "lineitem", "op": "INSERT",
            "l_orderkey": 600_000 + i // 4, "l_partkey": rnd.randrange(1, 200_000),
            "l_suppkey": rnd.randrange(1, 10_000),
            "l_linenumber": i % 7 + 1, "l_quantity": rnd.randrange(100, 5000).to_bytes(4, "big", signed=True),
            "l_extendedprice": rnd.randrange(90_000, 10_000_000).to_bytes(4, "big", signed=True),
            "l_discount": rnd.randrange(0, 11).to_bytes(1, "big"), "l_returnflag": rnd.choice("ANR"),
            "l_linestatus": rnd.choice("OF"), "l_shipdate": 8036 + rnd.randrange(0, 2500),
            "l_shipinstruct": rnd.choice(["DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN"]),
            "l_shipmode": rnd.choice(["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"]),
            "l_comment": " ".join(rnd.choice(WORDS) for _ in range(rnd.randrange(2, 7))),
        })
    return buf.getvalue()


def rate(fn: Callable[[], Any], nbytes: int, min_time: float, repeats: int) -> float:
    """Median MB/s over ``repeats`` runs of >= ``min_time`` seconds each."""
    results = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        results.append(n * nbytes / dt / 1e6)
    return statistics.median(results)


@dataclass(frozen=True)
class Keys:
    applier_pub: PublicKey
    applier_priv: PrivateKey
    producer_priv: PrivateKey
    producer_pub: PublicKey


def measure(level: int, name: str, size: int, keys: Keys, min_time: float, repeats: int) -> dict[str, Any]:
    """One row of the table: seal/open and their parts for one payload size and gzip level."""
    payload = avro_payload(size)
    sealer = Sealer("producer-1", "cynomys", keys.applier_pub, keys.producer_priv,
                    rotate_envelopes=1000, rotate_seconds=300, compress_level=level)
    opener = Opener(keys.applier_priv, {"producer-1": keys.producer_pub}, "cynomys")
    seq = [0]

    def seal() -> bytes:
        seq[0] += 1
        return sealer.seal(payload, seq[0])

    env = seal()
    opener.open(env)  # warm the key cache (RSA once per data key)
    gz = zlib.compress(payload, level, 31)
    aes = AESGCM(os.urandom(32))
    nonce = os.urandom(12)
    ct = aes.encrypt(nonce, gz, b"")
    n = len(payload)
    row: dict[str, Any] = {
        "gzip_level": level, "payload": name, "payload_bytes": n,
        "envelope_bytes": len(env), "ratio": round(n / len(env), 2),
        "seal_MBps": rate(seal, n, min_time, repeats),
        "open_MBps": rate(lambda: opener.open(env), n, min_time, repeats),
        "round_trip_MBps": rate(lambda: opener.open(seal()), n, min_time, repeats),
        "gzip_only_MBps": rate(lambda: zlib.compress(payload, level, 31), n, min_time, repeats),
        "gunzip_only_MBps": rate(lambda: zlib.decompress(gz, 31), n, min_time, repeats),
        "aes_gcm_only_MBps": rate(lambda: aes.encrypt(nonce, gz, b""), n, min_time, repeats),
        "aes_gcm_decrypt_only_MBps": rate(lambda: aes.decrypt(nonce, ct, b""), n, min_time, repeats),
    }
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    ap.add_argument("--levels", default="1,6", help="gzip levels to measure (default 1,6; the Sealer default is 1)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "seal.json"))
    args = ap.parse_args()
    min_time, repeats = (0.1, 1) if args.quick else (0.5, 5)
    load_at_start = os.getloadavg()[0]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core

    with tempfile.TemporaryDirectory() as d:
        paths = generate_keys(Path(d), rsa_bits=3072)
        keys = Keys(load_public_key(paths["applier_public_key"]), load_private_key(paths["applier_private_key"]),
                    load_private_key(paths["producer_private_key"]), load_public_key(paths["producer_public_key"]))
        applier_pub, applier_priv = keys.applier_pub, keys.applier_priv
        producer_priv, producer_pub = keys.producer_priv, keys.producer_pub

    rows = [measure(level, name, size, keys, min_time, repeats)
            for level in [int(x) for x in args.levels.split(",")] for name, size in SIZES.items()]

    # RSA cost per data key (what the key cache saves on every other envelope).
    opener = Opener(applier_priv, {"producer-1": producer_pub}, "cynomys")
    cold = [Sealer("producer-1", "cynomys", applier_pub, producer_priv, rotate_envelopes=1, rotate_seconds=300)
            .seal(b"x", i + 1) for i in range(50)]
    t0 = time.perf_counter()
    for e in cold:
        opener.open(e)
    unwrap_ms = (time.perf_counter() - t0) / len(cold) * 1000

    hdr = (f"{'gzip':>4} {'payload':>7} {'ratio':>6} {'seal':>8} {'open':>8} {'seal+open':>9} │ "
           f"{'gzip':>7} {'gunzip':>7} {'aes-enc':>8} {'aes-dec':>8}")
    print(f"MB/s of payload, one core: {cpu_model()}")
    print(hdr)
    print("─" * len(hdr))
    for r in rows:
        print(f"{r['gzip_level']:>4} {r['payload']:>7} {r['ratio']:>6} {r['seal_MBps']:>8} {r['open_MBps']:>8} "
              f"{r['round_trip_MBps']:>9} │ {r['gzip_only_MBps']:>7} {r['gunzip_only_MBps']:>7} "
              f"{r['aes_gcm_only_MBps']:>8} {r['aes_gcm_decrypt_only_MBps']:>8}")
    print(f"open with a cold key cache (RSA-3072 OAEP unwrap + verify + decrypt of a tiny payload): {unwrap_ms:.2f} ms")

    import cryptography
    result = {
        "benchmark": "bench/bench_seal.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu_model(),
                    "cpus_online": os.cpu_count(), "pinned_to_one_core": hasattr(os, "sched_setaffinity"),
                    "cryptography": cryptography.__version__, "zlib": zlib.ZLIB_RUNTIME_VERSION,
                    # Other work on the machine skews the numbers; say how busy it was.
                    "loadavg_1m_at_start": load_at_start},
        "settings": {"rsa_bits": 3072, "rotate_envelopes": 1000, "min_time_s": min_time, "repeats": repeats,
                     "unit": "MB/s of payload (1e6 bytes), median of repeats"},
        "results": rows,
        "cold_open_ms": round(unwrap_ms, 2),
    }
    write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
