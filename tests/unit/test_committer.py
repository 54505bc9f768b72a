"""The commit stage's rules (applier/committer.py), as pure logic: one commit
in flight, its completion run in the loop, its error raised at every settle
after it, and the loop's target calls waiting for it."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from cynomys.applier.committer import Committer, Guarded
from cynomys.core.errors import TargetUnavailableError


def test_a_commit_runs_on_the_worker_and_completes_in_the_loop() -> None:
    c = Committer()
    ran: list[tuple[str, int]] = []
    release = threading.Event()

    def work() -> int:
        ran.append(("work", threading.get_ident()))
        release.wait(5)
        return 7

    c.submit(work, lambda r: ran.append(("done", r)), cost=100)
    assert c and c.cost == 100
    c.settle(block=False)  # not finished: nothing happens
    assert ("done", 7) not in ran
    release.set()
    c.settle()
    assert ran[0][1] != threading.get_ident() and ran[-1] == ("done", 7)
    assert not c and c.cost == 0
    c.close()


def test_the_next_submit_waits_for_the_commit_in_flight() -> None:
    c = Committer()
    order: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        order.append("first committed")

    c.submit(slow, lambda _: order.append("first done"))
    c.submit(lambda: order.append("second committed"), lambda _: order.append("second done"))
    c.settle()
    assert order == ["first committed", "first done", "second committed", "second done"]
    c.close()


def test_a_failed_commit_is_raised_at_every_settle_after_it_and_never_completes() -> None:
    c = Committer()
    done: list[object] = []

    def fail() -> None:
        raise TargetUnavailableError("the connection broke")

    c.submit(fail, done.append)
    for _ in range(3):  # a caller that swallowed it once does not make it go away
        with pytest.raises(TargetUnavailableError, match="broke"):
            c.settle()
    with pytest.raises(TargetUnavailableError):
        c.submit(lambda: None, done.append)
    assert done == []
    c.close()


def test_close_waits_for_the_commit_and_does_not_raise_its_error() -> None:
    c = Committer()
    finished = threading.Event()

    def fail() -> None:
        time.sleep(0.1)
        finished.set()
        raise TargetUnavailableError("late")

    c.submit(fail, lambda _: None)
    c.close()
    assert finished.is_set()


def test_settle_from_another_thread_than_the_loop_does_nothing() -> None:
    c = Committer()
    release = threading.Event()
    c.submit(lambda: release.wait(5), lambda _: None)
    t = threading.Thread(target=c.settle)
    t.start()
    t.join(1)
    assert not t.is_alive() and c  # it returned without waiting; still in flight
    release.set()
    c.settle()
    c.close()


class Target:
    where = "a target"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def apply(self, what: str) -> str:
        self.calls.append(what)
        return what.upper()


def test_guarded_calls_wait_for_the_commit_in_flight_and_attributes_pass_through() -> None:
    c = Committer()
    inner = Target()
    g: Any = Guarded(inner, c)
    assert g.where == "a target" and g.inner is inner

    def commit() -> None:
        time.sleep(0.2)
        inner.calls.append("committed")

    c.submit(commit, lambda _: inner.calls.append("acknowledged"))
    assert g.apply("ddl") == "DDL"
    assert inner.calls == ["committed", "acknowledged", "ddl"]
    c.close()


class Closable(Target):
    def close(self) -> None:
        self.calls.append("closed")


def test_guarded_close_works_after_a_failed_commit() -> None:
    c = Committer()
    inner = Closable()
    g: Any = Guarded(inner, c)

    def fail() -> None:
        raise TargetUnavailableError("broke")

    c.submit(fail, lambda _: None)
    with pytest.raises(TargetUnavailableError):
        g.apply("next")
    g.close()
    assert inner.calls == ["closed"]
