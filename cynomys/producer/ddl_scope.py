"""A DDL the parser cannot read, on a table the producer does not replicate.

Every DDL goes to the applier (a table renamed in needs the target to have
followed its shadow: snapshot/coordinator.py ``_snapshot_renamed_in``), and
one the parser cannot read stops the applier naming it.  On a table outside
``include_tables``/``exclude_tables`` that stop is for nothing the user
replicates: a system-versioned table, a VECTOR column, any syntax the parser
lacks, in a database the user never asked for, held every replicated table
back (Debezium users meet the same with its schema history).  Such a
statement is dropped here, with a log line, when its one table can be read
from its head (CREATE/ALTER TABLE, CREATE INDEX ... ON); anything else still
goes, and stops the applier as before.
"""
from __future__ import annotations

import logging
import re
from typing import Callable

from cynomys.core.model import Change
from cynomys.parser.kinds import statement_of

log = logging.getLogger(__name__)

_NAME = r"(`(?:[^`]|``)+`|[\w$]+)"
#: Statements about exactly one table, and where its name stands.
_ONE_TABLE = re.compile(
    r"^\s*(?:/\*.*?\*/\s*)*(?:"
    r"(?:CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"|ALTER\s+(?:(?:ONLINE|IGNORE)\s+)*TABLE\s+(?:IF\s+EXISTS\s+)?)"
    r"|CREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+|VECTOR\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    + _NAME + r"\s+ON\s+)" + _NAME + r"(?:\s*\.\s*" + _NAME + r")?",
    re.IGNORECASE | re.DOTALL)


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def one_table(sql: str, database: str) -> tuple[str, str] | None:
    """The table a single-table CREATE/ALTER TABLE or CREATE INDEX names, or None."""
    m = _ONE_TABLE.match(statement_of(sql))
    if m is None:
        return None
    first, second = m.group(2), m.group(3)
    return (_unquote(first), _unquote(second)) if second else (database, _unquote(first))


def unreadable_elsewhere(change: Change, replicated: Callable[[str, str], bool]) -> bool:
    """Is ``change`` a DDL the parser cannot read, about one table outside
    the replicated ones?  (Drop it: see the module docstring.)"""
    sql = change.sql or ""
    table = one_table(sql, change.database)
    if table is None or replicated(*table):
        return False  # decided without the parser (sqlglot: a fifth of a start-up)
    from cynomys.parser.ddl import UnsupportedDdl, parse_ddl

    try:
        parse_ddl(sql, change.database)
        return False
    except UnsupportedDdl as exc:
        log.warning("dropping a DDL on %s.%s, which is not replicated ([source] include_tables/exclude_tables), "
                    "that Cynomys cannot read (%s): %s", table[0], table[1], exc.reason,
                    " ".join(sql.split())[:200])
        return True
