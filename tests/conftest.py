"""Shared fixtures: real servers started as processes on free loopback ports."""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from tests.servers.mariadb import MariaDBServer
from tests.servers.postgres import postgres_server  # noqa: F401
from tests.servers.redis import redis_server, redis_url  # noqa: F401

os.environ.setdefault("TZ", "UTC")


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """One source MariaDB for the session; tests use their own databases."""
    server = MariaDBServer(server_id=1).start()
    yield server
    server.destroy()


@pytest.fixture
def fresh_mariadb() -> Iterator[MariaDBServer]:
    """A MariaDB of the test's own (for tests that kill, reconfigure or purge it)."""
    server = MariaDBServer(server_id=1).start()
    yield server
    server.destroy()
