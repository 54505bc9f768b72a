"""The commit stage, overlapped: flush N commits while the loop folds N+1.

While the applier is behind (a backlog of envelopes waiting), each flush
left the target idle while the loop read, opened and folded the next one,
and the loop idle while the target loaded: measured on a 10M-row initial
load into ColumnStore-on-MariaDB, the target server at 1.25 cores and the
applier's main thread at 0.4 after the snapshot read, 0.4 of a core unused.
So a flush is handed to one worker thread, and the loop goes on taking
envelopes into the next buffer; the next flush starts once this one is done
(or when the buffer is full): group commit, its size set by the target's
pace, as the backlog cap sets it when the applier is behind.

What keeps exactly-once intact:
- at most one commit is in flight: the next flush, and every other use of
  the target (DDL, parts, verification, catalog lookups, health checks,
  idle work, close), waits for it first (``Guarded``: the loop never
  reaches the target except through it), so the target sees the same calls
  in the same order as before, from one thread at a time;
- the envelopes of a commit in flight are acknowledged to the transport,
  and the state file reports them, only once it committed (``settle``);
- the admit stage counts the flush as committed when it is handed over
  (the loop judges the next envelopes against it, as before).  If the
  commit then fails, its error is raised in the loop at the next
  ``settle``, and at every one after it (a caller that only reports
  errors, such as the health check, cannot swallow it): the applier
  restarts from the state the target holds, and every envelope of the
  failed flush is still unacknowledged, so the transport delivers it again;
- the memory of the flush in flight counts against ``max_memory_mb``
  until it commits.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class InFlight(Generic[T]):
    """A commit handed to the worker, and what the loop does once it is done."""
    future: Future[T]
    done: Callable[[T], None]
    cost: int  # its buffer's estimated memory (applier/spill.py)


class Committer:
    """One worker thread; one commit in flight at most."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: InFlight[Any] | None = None
        self._failed: BaseException | None = None  # a commit that failed: nothing goes on after it
        self._owner = 0  # the loop's thread: the one that submits

    @property
    def cost(self) -> int:
        return self._inflight.cost if self._inflight is not None else 0

    def __bool__(self) -> bool:
        return self._inflight is not None

    def submit(self, work: Callable[[], T], done: Callable[[T], None], cost: int = 0) -> None:
        """Run ``work`` on the worker; ``done(its result)`` runs in the loop
        at the ``settle`` that finds it finished."""
        self.settle()
        self._owner = threading.get_ident()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cynomys-commit")
        self._inflight = InFlight(self._pool.submit(work), done, cost)

    def settle(self, block: bool = True) -> None:
        """Finish the commit in flight: wait for it (``block``; else only if
        it is already done), raise its error, or run its ``done``."""
        if threading.get_ident() != self._owner:
            return  # nothing submitted, or the worker's own calls (they reach the target directly)
        if self._failed is not None:
            raise self._failed
        inflight = self._inflight
        if inflight is None or (not block and not inflight.future.done()):
            return
        self._inflight = None  # before ``done``: it may use the target again
        try:
            result = inflight.future.result()
        except BaseException as exc:
            self._failed = exc
            raise
        inflight.done(result)

    def close(self) -> None:
        """Wait for the commit in flight without raising (the applier is
        stopping on another error, which this one must not hide), then stop
        the worker."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            try:
                inflight.future.result()
            except BaseException as exc:  # logged: the error being raised is the one that stopped the loop
                log.warning("a flush in flight failed while the applier was stopping: %s; its envelopes stay "
                            "unacknowledged and are delivered again", exc)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class Guarded:
    """The loop's handle on the target: every method call waits for the
    commit in flight first, so the target is used by one thread at a time
    and in the order the loop issued the calls.  Attributes that are not
    methods (capabilities, names) are read as they are."""

    def __init__(self, target: Any, committer: Committer) -> None:
        self._target = target
        self._committer = committer

    @property
    def inner(self) -> Any:
        """The target itself: only the worker, and the loop once settled, use it."""
        return self._target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        # Closing must work after a failed commit too: it waits for the
        # worker without raising (the error was raised in the loop already).
        wait = self._committer.close if name == "close" else self._committer.settle

        def settled(*args: Any, **kwargs: Any) -> Any:
            wait()
            return value(*args, **kwargs)
        return settled
