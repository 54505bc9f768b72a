"""Selecting the hot path, and saying which one runs."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from cynomys.core import compiled


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    was = compiled.ext is not None
    yield
    compiled.use_compiled(was)


def test_pure_python_is_said_once_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    compiled.use_compiled(False)
    with caplog.at_level(logging.INFO, logger="cynomys.core.compiled"):
        compiled.announce()
        compiled.announce()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "pure Python" in warnings[0].getMessage()
    st = compiled.status()
    assert st["hot_path"] == "pure-python" and st["reason"]


@pytest.mark.skipif(not compiled.available(), reason="cynomys._speedups is not built")
def test_compiled_path_is_selected_when_built(caplog: pytest.LogCaptureFixture) -> None:
    assert compiled.use_compiled(True)
    with caplog.at_level(logging.INFO, logger="cynomys.core.compiled"):
        compiled.announce()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert compiled.status()["hot_path"] == "compiled" and compiled.ext is not None


@pytest.mark.parametrize("value, expect", [("1", "pure-python"), ("", "compiled"), ("0", "compiled")])
def test_environment_variable_forces_pure_python(value: str, expect: str) -> None:
    if expect == "compiled" and not compiled.available():
        pytest.skip("cynomys._speedups is not built")
    env = {**os.environ, compiled.ENV: value}
    out = subprocess.run([sys.executable, "-c", "from cynomys.core import compiled; print(compiled.status())"],
                         env=env, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2]).stdout
    assert f"'hot_path': '{expect}'" in out
    if expect == "pure-python":
        assert compiled.ENV in out  # the reason names the variable
