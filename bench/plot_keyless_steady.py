"""Plot of ``bench/initial_load.py --steady`` runs side by side: the
applier's lag (median, p95, max) and the CPU each process spent while the
writers went on after the load.

    python bench/plot_keyless_steady.py OUT.png LABEL=NAME [LABEL=NAME ...]

Each NAME is a bench/results JSON of one target with a ``steady`` part.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, pairs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    runs = []
    for label, name in pairs:
        data = json.loads((RESULTS / f"{name}.json").read_text())
        run = data["results"][0]
        runs.append((label, run["steady"], data))
    fig, (lag_ax, cpu_ax) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runs)
    stats = ("median", "p95", "max")
    for i, (label, steady, _) in enumerate(runs):
        xs = [j + i * width for j in range(len(stats))]
        values = [steady["lag_s"][s] for s in stats]
        lag_ax.bar(xs, values, width, label=label)
        for x, v in zip(xs, values):
            lag_ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    lag_ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(stats))], stats)
    lag_ax.set_ylabel("applier lag, s")
    lag_ax.legend(fontsize=8)
    procs = ("target_server", "applier", "source_server")
    for i, (label, steady, _) in enumerate(runs):
        xs = [j + i * width for j in range(len(procs))]
        values = [steady["cores"].get(p, 0.0) for p in procs]
        cpu_ax.bar(xs, values, width, label=label)
        for x, v in zip(xs, values):
            cpu_ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    cpu_ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(procs))], procs)
    cpu_ax.set_ylabel("cores while the writers go on")
    first = runs[0][2]
    fig.suptitle(f"{first['rows']:,}-row keyless table, index on the source, {runs[0][1]['seconds']:.0f} s of "
                 f"{first['writers']} writers x {first['write_rate_per_writer']:.0f} txn/s after the load")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
