"""The source statements by server flavour and version (core/flavour.py):
MySQL 8.4 has no SHOW MASTER STATUS / SHOW SLAVE HOSTS any more."""
from __future__ import annotations

import pytest

from cynomys.core.flavour import flavour_of


@pytest.mark.parametrize("info,name,status,replicas", [
    ("5.7.44-log", "mysql", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
    ("8.0.21", "mysql", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
    ("8.0.36-0ubuntu0.22.04.1", "mysql", "SHOW MASTER STATUS", "SHOW REPLICAS"),
    ("8.2.0", "mysql", "SHOW BINARY LOG STATUS", "SHOW REPLICAS"),
    ("8.4.3", "mysql", "SHOW BINARY LOG STATUS", "SHOW REPLICAS"),
    ("9.1.0-commercial", "mysql", "SHOW BINARY LOG STATUS", "SHOW REPLICAS"),
    ("10.11.6-MariaDB-0+deb12u1-log", "mariadb", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
    ("5.5.5-10.11.6-MariaDB", "mariadb", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
    ("11.4.2-MariaDB", "mariadb", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
])
def test_statements_by_flavour_and_version(info: str, name: str, status: str, replicas: str) -> None:
    f = flavour_of(info)
    assert (f.name, f.statements.binlog_status, f.statements.replicas) == (name, status, replicas)
    assert f.statements.binary_logs == "SHOW BINARY LOGS"


def test_mariadb_handshake_prefix_is_not_its_version() -> None:
    assert flavour_of("5.5.5-10.11.6-MariaDB").version == (10, 11, 6)
