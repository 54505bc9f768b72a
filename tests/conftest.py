"""Shared fixtures: real servers started as processes on free loopback ports."""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from tests.servers.mariadb import MariaDBServer
from tests.servers.postgres import postgres_server  # noqa: F401
from tests.servers.redis import redis_server, redis_url  # noqa: F401

os.environ.setdefault("TZ", "UTC")


def pytest_configure(config: pytest.Config) -> None:
    """The test process has one JVM: pyspark starts it with the first Spark
    session, from whichever module comes first, with that session's conf,
    and a jar given to a running JVM comes too late for java.sql.DriverManager.
    The Iceberg JDBC catalog's drivers go on its class path from the start,
    so a JDBC-catalog module works after any other.  Daemons the tests start
    inherit it, harmlessly: the product passes the driver as a session jar
    of its own (the readers test's daemons passed without this)."""
    from cynomys.applier.targets.spark.session import JDBC_DRIVERS

    jars = [d.jar for d in dict.fromkeys(JDBC_DRIVERS.values()) if os.path.exists(d.jar)]
    if jars and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-class-path {':'.join(jars)} pyspark-shell"


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """One source MariaDB for the session; tests use their own databases."""
    server = MariaDBServer(server_id=1).start()
    yield server
    server.destroy()


@pytest.fixture
def target() -> Iterator[MariaDBServer]:
    """A second MariaDB of its own for one test: the target of an applier
    (modules that test another target define their own ``target``)."""
    server = MariaDBServer(server_id=2).start()
    yield server
    server.destroy()


@pytest.fixture
def fresh_mariadb() -> Iterator[MariaDBServer]:
    """A MariaDB of the test's own (for tests that kill, reconfigure or purge it)."""
    server = MariaDBServer(server_id=1).start()
    yield server
    server.destroy()
