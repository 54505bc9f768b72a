"""The test suite's MariaDB launcher is the sandbox's (also used by `cynomys demo`)."""
from __future__ import annotations

from cynomys.sandbox.mariadb import REPL_PASSWORD, REPL_USER, ROOT_PASSWORD, MariaDBServer, free_port

__all__ = ["MariaDBServer", "REPL_USER", "REPL_PASSWORD", "ROOT_PASSWORD", "REPLICATION_ARGS", "free_port",
           "com_select"]

#: Server options of a GTID primary/replica pair (make_replica_of): each logs
#: what it replicates, and GTIDs out of order are refused.
REPLICATION_ARGS = ("--log-slave-updates", "--gtid-strict-mode=ON")


def com_select(srv: MariaDBServer) -> int:
    """SELECT statements the server has run (which server a read went to)."""
    return int(srv.execute("SHOW GLOBAL STATUS LIKE 'Com_select'")[0][1])
