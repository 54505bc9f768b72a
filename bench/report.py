"""Print the README's benchmark table from bench/results/*.json.

    python bench/report.py
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def load(name: str) -> dict[str, Any] | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def main() -> None:
    lines = ["| experiment | Cynomys (this repo) | paper |", "|---|---|---|"]
    li = load("lineitem")
    for r in (li or {}).get("results", []):
        lines.append(f"| lineitem lag, {r['target']} ({r['rows']:,} rows, 4 writers) | source {r['source_write_s']} s, "
                     f"target done {r['target_done_s']} s, **ratio {r['ratio']}**, tail lag {r['tail_lag_s']} s, "
                     f"rows equal: {r['check']['equal']} | 1M rows: 5.68 s, 6.12 s, ratio 1.08 |")
    mo = load("monetdb_lineitem")
    for r in (mo or {}).get("results", [mo.get("result")] if mo else []):
        if r:
            lines.append(f"| lineitem lag, monetdb ({r['rows']:,} rows) | source {r['source_write_s']} s, target done "
                         f"{r['target_done_s']} s, **ratio {r['ratio']}** | 1M rows: ratio 1.08 |")
    de = load("decode")
    if de:
        best = de["rows_per_s_best"]
        lines.append("| producer decode rate (rows/s, same binlog) | " + "; ".join(f"{k}: {v:,}" for k, v in best.items())
                     + " | — |")
    dc = load("delay_commit")
    if dc:
        for kind, sp in dc["speedup_10000_over_1"].items():
            lines.append(f"| delay commit, {kind}: buffer 10000 vs 1 | speed-up " + ", ".join(
                f"x{v} ({w} cols)" for w, v in sp.items()) + " | Fig. 11: rises with buffer size |")
    se = load("seal")
    if se:
        r = max(se["results"], key=lambda x: x["round_trip_MBps"])
        lines.append(f"| seal+open (gzip {r['gzip_level']}, AES-GCM, RSA-wrapped key, Ed25519), one core | "
                     f"{r['round_trip_MBps']} MB/s of Avro payload ({r['payload']}) | — |")
    sn = load("snapshot")
    if sn:
        lat = sn["write_latency"]
        lines.append(f"| snapshot of {sn['rows']:,} rows while a client writes {sn['write_rate_per_s']:.0f}/s | DBLog "
                     f"{sn['snapshot']['dblog']['rows_per_s']:,.0f} rows/s, read-only {sn['snapshot']['read_only']['rows_per_s']:,.0f}"
                     f" rows/s; write p50/p99 {lat['baseline']['p50_ms']}/{lat['baseline']['p99_ms']} ms without, "
                     f"{lat['dblog']['p50_ms']}/{lat['dblog']['p99_ms']} ms during | — |")
    cu = load("spark_catchup")
    if cu:
        groups: dict[str, list[str]] = {}
        for key, label in (("runs", ""), ("earlier_round_runs", ", the round before (loaded box)"),
                           ("previous_runs", ", before the TABLE_MAP cache and the 30k backlog floor"),
                           ("before_runs", ", main before helper-spark")):
            for r in cu.get(key, []):
                if r.get("catch_up_s") is not None:
                    groups.setdefault(f"{r['target']}{label}, buffer_rows {r['buffer_rows']}", []).append(
                        f"{r['catch_up_s']} s ({r['source_transactions'] // 1000}k txns, load {r['loadavg_1m_before']:.0f})")
        for name, vals in groups.items():
            lines.append(f"| catch-up after a live mixed source (4 writers 60 s, 2+2 SIGKILLs), {name} | target equal "
                         f"after the writers stopped: " + "; ".join(vals) + " | — |")
    gr = load("spark_flush_growth_2m")
    for wl, res in (gr or {}).get("results", {}).items():
        for v, r in res.items():
            lines.append(f"| Spark flush time vs flush number, {gr['base_rows']:,}-row table, {gr['flushes']} {wl} "
                         f"flushes of {gr['rows_per_flush']:,}, {v} | first {r['first_median_s']} s, last "
                         f"{r['last_median_s']} s, **last/first {r['last_over_first']}**; live files at most "
                         f"{r['max_files']} (data + deletes) | — |")
    fv = load("spark_format_versions")
    for wl, res in (fv or {}).get("results", {}).items():
        cells = "; ".join(
            f"{v}: flush median {r['median_s']} s (first {r['first_median_s']}, last {r['last_median_s']}), "
            f"reader's aggregate median {r.get('reader_median_s')} s" for v, r in res.items() if "median_s" in r)
        lines.append(f"| Iceberg format v2 (position deletes) vs v3 (deletion vectors), {fv.get('flushes_done')} "
                     f"{wl} flushes of {fv['rows_per_flush']:,} on {fv['base_rows']:,} rows, maintenance on | "
                     f"{cells} | — |")
    sq = load("spark_query")
    if sq:
        r = sq["ratio_while_replicating"]
        lines.append(f"| TPC-H Q1 on the lineitem replica while replicating vs the same rows written once and "
                     f"compacted (format v{sq['settings']['format_version']}, {sq['settings']['flushes']} flushes of "
                     f"{sq['settings']['flush_rows']:,}) | ratio median **{r['median']}**, max {r['max']} over "
                     f"{r['checkpoints']} checkpoints | — |")
    po = load("producer_oltp")
    if po:
        rates = "; ".join(f"{k}: {v:,}" for k, v in po["txns_per_s_best"].items())
        lines.append(f"| producer on an OLTP binlog (source transactions/s, one core; {po['transactions']:,} small "
                     f"transactions written by 4 writers at {po['source_txns_per_s']:,}/s) | {rates} | — |")
    ad = load("applier_decode")
    if ad:
        rates = "; ".join(f"{k}: {v:,}" for k, v in ad["rows_per_s_best"].items())
        lines.append(f"| applier decode to LOAD DATA bytes (rows/s, one core, {ad['rows']:,} lineitem rows) | {rates}; "
                     f"bytes equal: {ad['bytes_equal']} | — |")
    for name in ("verify", "verify_duckdb"):
        vf = load(name)
        if not vf:
            continue
        lat, app = vf["write_latency"], vf["applier_side"]
        target = vf.get("target", "columnstore")
        side = (f"; applier side (MariaDB) SQL {app['sql']['rows_per_s']:,.0f} rows/s" if "sql" in app else "")
        side += f", read back {app['read_back']['rows_per_s']:,.0f} rows/s" if "read_back" in app else ""
        daemons = app.get("through_daemons", {})
        through = (f"; **`cynomys verify` through the daemons {daemons['rows_per_s']:,.0f} rows/s** (peak RSS "
                   f"{daemons.get('peak_rss_mb')})" if daemons else "")
        lines.append(f"| verify of {vf['rows']:,} rows on {target} while a client writes {vf['write_rate_per_s']:.0f}/s "
                     f"| producer side {vf['producer_side']['rows_per_s']:,.0f} rows/s{side}{through}; write p99 "
                     f"{lat['baseline']['p99_ms']} ms without, {lat['verify']['p99_ms']} ms during "
                     f"(x{vf['writer_p99_ratio_verify_vs_baseline']}) | — |")
    bt = load("bigtxn")
    for kind in ("columnstore", "spark"):
        rs = sorted((r for r in (bt or {}).get("results", []) if r["target"] == kind), key=lambda r: (r["op"], r["rows"]))
        for op in ("update", "delete"):
            cells = [f"{r['rows'] / 1e6:g}M: applier {r['peak_rss_mb']['applier']:.0f} MB, producer "
                     f"{r['peak_rss_mb']['producer']:.0f} MB, equal {r['commit_to_equal_s']} s after commit "
                     f"({r['parts']} parts, load {r['loadavg_1m_at_start']:.0f})" for r in rs if r["op"] == op]
            if cells:
                lines.append(f"| one source transaction: {op.upper()} of lineitem rows, {kind}, "
                             f"max_memory_mb {bt['max_memory_mb']} (peak RSS) | " + "; ".join(cells) + " | — |")
    for name in ("initial_load", "initial_load_spark", "initial_load_keyless"):
        il = load(name)
        for r in (il or {}).get("results", []):
            c, h = r["cynomys"], r["hand_copy"]
            lines.append(f"| initial load of {r['rows']:,} lineitem rows{' (no key)' if r['keyless'] else ''}, "
                         f"{r['target']}, {il['writers']} writers | Cynomys {c['target_equal_s']} s "
                         f"({c['rows_per_s']:,} rows/s) vs hand copy {h['seconds']} s ({h['rows_per_s']:,} rows/s): "
                         f"**x{r['cynomys_vs_hand_copy']}**; peak RSS {c['peak_rss_mb']}; equal: {r['check']['equal']}; "
                         f"load {r['load_avg']['mean']} | — |")
    sr = load("source_reads")
    if sr:
        rates = "; ".join(f"{k}: {v['rows_per_s']:,}" for k, v in sr["results"].items())
        lines.append(f"| snapshot source reads ({sr['rows']:,} lineitem rows, rows/s) | {rates} | — |")
    print("\n".join(lines))
    for name in ("bigtxn", "lineitem", "decode", "delay_commit", "seal", "snapshot", "verify", "monetdb_lineitem", "spark_merge",
                 "spark_catchup", "spark_flush_growth_2m", "applier_decode", "producer_oltp", "verify_duckdb",
                 "initial_load", "initial_load_spark", "initial_load_keyless", "source_reads",
                 "spark_format_versions", "spark_query"):
        d = load(name)
        if d:
            m = d.get("machine", {})
            print(f"\n{name}: {d.get('date')} on {m.get('cpu')} x{m.get('cpus_online')}, "
                  f"load {m.get('loadavg_1m_at_start')}")


if __name__ == "__main__":
    main()
