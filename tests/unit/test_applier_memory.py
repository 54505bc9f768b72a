"""The applier's Arrow allocator (issue #12: its peak RSS): `cynomys apply`
uses the system allocator unless ARROW_DEFAULT_MEMORY_POOL says otherwise."""
from __future__ import annotations

import os
import subprocess
import sys

from cynomys.cli.apply import APPLIER_ARROW_POOL
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
