"""The README's main-job command: `cynomys demo` replicates a shop workload
from a throwaway MariaDB through Redis into the embedded default target
(Iceberg tables in local Spark) and checks every table row by row."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.spark]


def test_demo_replicates_into_the_embedded_default(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "cynomys.cli", "demo", "--workdir", str(tmp_path / "demo"),
                        "--rows", "3000"], cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-5000:]
    for table in ("customers", "orders", "events"):
        assert f"shop.{table}: " in out and "DIFFERS" not in out
    assert "== OK: every target table equals its source table" in out
