"""The applier's Arrow allocator (issue #12: its peak RSS): `cynomys apply`
uses the system allocator unless ARROW_DEFAULT_MEMORY_POOL says otherwise,
with glibc malloc settings that give freed memory back (issue #24)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cynomys.cli.apply import APPLIER_ARROW_POOL, APPLIER_MALLOC, tune_malloc
from cynomys.cli.apply import choose_arrow_pool as _choose_arrow_pool


def test_the_applier_sets_its_arrow_pool_unless_one_is_set() -> None:
    env: dict[str, str] = {}
    assert _choose_arrow_pool(env) == APPLIER_ARROW_POOL == "system"
    assert env == {"ARROW_DEFAULT_MEMORY_POOL": "system"}
    mine = {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}
    assert _choose_arrow_pool(mine) == "jemalloc"
    assert mine == {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}


def test_pyarrow_takes_the_pool_from_the_environment() -> None:
    # What _choose_arrow_pool relies on: pyarrow reads the variable when it
    # is first imported (a pyarrow that stopped doing so would fail here).
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": APPLIER_ARROW_POOL}
    out = subprocess.run([sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == APPLIER_ARROW_POOL


_FREED = """
import gc, sys
tune = sys.argv[1] == "1"
if tune:
    from cynomys.cli.apply import APPLIER_MALLOC, tune_malloc
    assert tune_malloc({}) == APPLIER_MALLOC
import pyarrow as pa, pyarrow.compute as pc
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20
one = pa.array([1] * (1 << 17), type=pa.int64())  # 1 MB
first = pc.add(one, 1); del first  # mmapped and freed: glibc's own threshold rises past 1 MB
base = rss()
bufs = [pc.add(one, i) for i in range(200)]  # 200 MB of Arrow buffers, written
keep = bufs[-1]  # the newest stays in use (the heap's top cannot be trimmed)
del bufs
gc.collect()
print(rss() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_applier_s_malloc_gives_freed_arrow_buffers_back() -> None:
    """Why tune_malloc: with glibc's defaults, 200 MB of freed 1 MB Arrow
    buffers stay in the process (the mmap threshold rose past them after
    the first was freed); with the applier's settings they go back."""
    def kept_mb(tune: str) -> int:
        env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"}
        for name in APPLIER_MALLOC:
            env.pop(name, None)
        out = subprocess.run([sys.executable, "-c", _FREED, tune], capture_output=True, text=True, timeout=120,
                             env=env, cwd=Path(__file__).resolve().parents[2])
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    assert kept_mb("0") > 150  # the defaults keep it (else this test no longer shows anything)
    assert kept_mb("1") < 20


def test_malloc_settings_in_the_environment_are_left_alone() -> None:
    assert tune_malloc({name: "1" for name in APPLIER_MALLOC}) == {}
