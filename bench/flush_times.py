"""Spark flush time against rows loaded, from kept applier logs, side by side.

    python bench/flush_times.py --name NAME LABEL=WORK/applier.log [LABEL=...]

Reads the ``flush seq`` lines of SparkTarget.apply in each log (a run of
``bench/initial_load.py --keep`` or any applier log) and plots each flush's
seconds against the net changes flushed so far: a flush whose cost grows
with the table shows as a rising line.  Writes bench/results/NAME.json
(per log: flushes, total seconds, the mean of each tenth of the run) and
NAME.png.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_spark_catchup import flush_profile  # noqa: E402
from bench.common import RESULTS, write_result  # noqa: E402


def series(log: Path) -> dict[str, Any]:
    each = flush_profile(log).get("each", [])
    rows, total = [], 0
    for f in each:
        total += f["net_changes"]
        rows.append(total)
    secs = [f["seconds"] for f in each]
    tenth = max(1, len(secs) // 10)
    means = [round(sum(secs[i:i + tenth]) / len(secs[i:i + tenth]), 3) for i in range(0, len(secs), tenth)]
    return {"log": str(log), "flushes": len(secs), "seconds_total": round(sum(secs), 1), "rows": total,
            "mean_s_by_tenth": means, "points": list(zip(rows, secs, strict=True))}


def plot(runs: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, r in runs.items():
        xs = [p[0] / 1e6 for p in r["points"]]
        ax.plot(xs, [p[1] for p in r["points"]], marker=".", linewidth=1,
                label=f"{label}: {r['flushes']} flushes, {r['seconds_total']} s")
    ax.set_xlabel("net changes flushed so far (millions)")
    ax.set_ylabel("flush seconds")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("Spark/Iceberg flush time as the table grows")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="result name in bench/results")
    ap.add_argument("logs", nargs="+", metavar="LABEL=PATH")
    args = ap.parse_args()
    runs = {}
    for item in args.logs:
        label, _, path = item.partition("=")
        if not path:
            ap.error(f"{item!r}: expected LABEL=PATH")
        runs[label] = series(Path(path))
        print(f"{label}: {runs[label]['flushes']} flushes, {runs[label]['seconds_total']} s, "
              f"mean by tenth {runs[label]['mean_s_by_tenth']}")
    out = write_result(args.name, {"runs": runs})
    plot(runs, RESULTS / f"{args.name}.png")
    print(f"wrote {out} and {RESULTS / (args.name + '.png')}")


if __name__ == "__main__":
    main()
