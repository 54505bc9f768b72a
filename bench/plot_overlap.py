"""Side-by-side plot of initial loads (such as `[applier] overlap_commits` off and on).

    python bench/plot_overlap.py [--title TEXT] [--mark SUBSTR] OUT.png NAME [NAME ...]

Each NAME is a bench/results JSON of ``bench/initial_load.py`` (one target);
a bar per run: the snapshot read, then the tail to target equal, with the
same run's hand copy as a tick.  Runs whose name holds ``--mark`` (default
``_on``) are blue.
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

    args = sys.argv[1:]
    title = "Initial load, overlap_commits off (grey) / on (blue)"
    mark = "_on"
    while args[:1] in (["--title"], ["--mark"]):
        if args[0] == "--title":
            title = args[1]
        else:
            mark = args[1]
        args = args[2:]
    out, names = Path(args[0]), args[1:]
    runs = []
    for name in names:
        r = json.loads((RESULTS / f"{name}.json").read_text())["results"][0]
        runs.append((name, r["cynomys"]["snapshot_done_s"], r["cynomys"]["target_equal_s"], r["hand_copy"]["seconds"]))
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.45 * len(runs)))
    for i, (name, read, equal, hand) in enumerate(runs):
        color = "#37a" if mark in name else "#999"
        ax.barh(i, read, color=color, alpha=0.55)
        ax.barh(i, equal - read, left=read, color=color)
        ax.plot([hand, hand], [i - 0.4, i + 0.4], color="#c33", lw=2)
        ax.text(equal, i, f" {equal:.1f} s ({equal / hand:.2f}x)", va="center", fontsize=8)
    ax.set_yticks(range(len(runs)), [n.replace("initial_load_", "") for n, *_ in runs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the daemons' start: snapshot read (light), then to target equal (dark);\n"
                  "red: the same run's hand copy")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
