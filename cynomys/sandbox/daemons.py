"""Stopping the daemons a sandbox run started (the demo, benchmarks, tests)."""
from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterable


def stop_daemons(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    """SIGTERM every daemon still running, then wait for each; one that has
    not exited after ``timeout`` seconds is killed (a cleanup must not hang)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
