"""Fixtures of the unit lane."""
from __future__ import annotations

from typing import Iterator

import pytest

from cynomys.core import compiled


@pytest.fixture
def compiled_path() -> Iterator[None]:
    """The compiled hot path selected for the test (whatever the lane
    selected is back afterwards); tests using it skip where it is not built."""
    was = compiled.ext is not None
    compiled.use_compiled(True)
    yield
    compiled.use_compiled(was)
