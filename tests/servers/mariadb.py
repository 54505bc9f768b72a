"""The test suite's MariaDB launcher is the sandbox's (also used by `cynomys demo`)."""
from __future__ import annotations

from cynomys.sandbox.mariadb import REPL_PASSWORD, REPL_USER, ROOT_PASSWORD, MariaDBServer, free_port

__all__ = ["MariaDBServer", "REPL_USER", "REPL_PASSWORD", "ROOT_PASSWORD", "free_port"]
