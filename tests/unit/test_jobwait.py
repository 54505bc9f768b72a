"""wait_for_job: the polling loop shared by `cynomys snapshot` and `cynomys verify`."""
from __future__ import annotations

import io
from pathlib import Path

from cynomys.snapshot import jobwait
from cynomys.snapshot.jobwait import JobView, wait_for_job


def test_waits_until_the_view_says_over_and_returns_the_job() -> None:
    states = iter([None, 10, 60, 100])
    seen: list[int] = []

    def view(done: int) -> JobView:
        seen.append(done)
        return JobView(done, 100, f"{done} rows", over=done == 100, complete=done == 100)

    out = io.StringIO()
    job = wait_for_job("snapshot s1", Path("/state"), lambda: next(states), view, out, progress=True,
                       interval_s=0.0)
    assert job == 100
    assert seen == [10, 60, 100]
    assert out.getvalue() == ""  # picked up at once: no notice


def test_a_request_nobody_picks_up_is_said_once_and_the_timeout_ends_the_wait(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(jobwait, "NOTICE_AFTER_S", 0.0)
    out = io.StringIO()
    job = wait_for_job("verify v1", Path("/somewhere/state"), lambda: None,
                       lambda j: JobView(0, 1, "", True, True), out, progress=False, timeout_s=0.05, interval_s=0.01)
    assert job is None
    assert out.getvalue().count("waiting for the producer to pick up verify v1") == 1
    assert "/somewhere/state" in out.getvalue()
