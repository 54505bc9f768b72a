"""Waiting for a producer job (a snapshot or a verification) from the command
line: poll the job's state, show a progress bar, and say so when the producer
has not picked the request up yet (the usual cause: no producer running on
that state_dir)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO, TypeVar

J = TypeVar("J")

NOTICE_AFTER_S = 10.0


@dataclass(frozen=True)
class JobView:
    """What the bar shows of a job, and whether the wait is over."""

    done: int
    total: int
    note: str
    over: bool
    complete: bool  # over and every row done: the bar is filled


def wait_for_job(what: str, state_dir: Path, find: Callable[[], J | None], view: Callable[[J], JobView],
                 out: TextIO, progress: bool, *, timeout_s: float = 0.0, interval_s: float = 0.5) -> J | None:
    """Poll ``find`` until ``view`` says the job is over (or ``timeout_s``,
    when set, has passed: then the job as it stands, None if never seen)."""
    from tqdm import tqdm

    started = time.monotonic()
    noticed = False
    bar: Any = None
    try:
        while True:
            job = find()
            if job is None:
                if not noticed and time.monotonic() - started > NOTICE_AFTER_S:
                    noticed = True
                    print(f"waiting for the producer to pick up {what} (is `cynomys produce` running "
                          f"with state_dir {state_dir}?)", file=out)
            else:
                v = view(job)
                if progress:
                    if bar is None:
                        bar = tqdm(total=v.total, unit="rows", desc=what, file=sys.stderr, dynamic_ncols=True)
                    bar.total = v.total
                    bar.update(v.done - bar.n)
                    bar.set_postfix_str(v.note, refresh=False)
                if v.over:
                    if bar is not None and v.complete:
                        bar.update(bar.total - bar.n)
                    return job
            if timeout_s and time.monotonic() - started > timeout_s:
                return job
            time.sleep(interval_s)
    finally:
        if bar is not None:
            bar.close()
