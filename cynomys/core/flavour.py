"""Which statements a source server understands, by flavour and version.

MySQL renamed its replication statements: ``SHOW BINARY LOG STATUS``
(8.2.0) replaces ``SHOW MASTER STATUS``, removed in 8.4; ``SHOW REPLICAS``
(8.0.22) replaces ``SHOW SLAVE HOSTS``, removed in 8.4.  MariaDB keeps the
old names (its own new ones, ``SHOW BINLOG STATUS`` and ``SHOW REPLICA
HOSTS``, came in 10.5).  ``SHOW BINARY LOGS`` is the same everywhere.  One
table, read by every caller (source checks, ``cynomys status``, snapshots):
the newest row a server's version reaches wins.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Statements:
    binlog_status: str    # File, Position, Binlog_Do_DB, Binlog_Ignore_DB[, Executed_Gtid_Set]
    binary_logs: str      # Log_name, File_size
    replicas: str         # the servers replicating from this one


_OLD = Statements("SHOW MASTER STATUS", "SHOW BINARY LOGS", "SHOW SLAVE HOSTS")

#: flavour -> ((first version, statements), ...), oldest first.
STATEMENTS: dict[str, tuple[tuple[tuple[int, ...], Statements], ...]] = {
    "mysql": (
        ((0,), _OLD),
        ((8, 0, 22), Statements("SHOW MASTER STATUS", "SHOW BINARY LOGS", "SHOW REPLICAS")),
        ((8, 2, 0), Statements("SHOW BINARY LOG STATUS", "SHOW BINARY LOGS", "SHOW REPLICAS")),
    ),
    "mariadb": (
        ((0,), _OLD),
    ),
}

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class Flavour:
    name: str                     # "mysql" or "mariadb"
    version: tuple[int, ...]
    statements: Statements


def flavour_of(server_info: str) -> Flavour:
    """From the server's version string ('8.4.3', '8.0.36-0ubuntu0.22.04.1',
    '10.11.6-MariaDB-0+deb12u1', or MariaDB's '5.5.5-10.11.6-MariaDB' as
    the handshake sends it)."""
    name = "mariadb" if "mariadb" in server_info.lower() else "mysql"
    text = server_info[6:] if name == "mariadb" and server_info.startswith("5.5.5-") else server_info
    m = _VERSION.search(text)
    version = tuple(int(x) for x in m.groups()) if m else (0,)
    chosen = _OLD
    for since, statements in STATEMENTS[name]:
        if version >= since:
            chosen = statements
    return Flavour(name, version, chosen)
