"""Foreign keys whose actions change rows the binlog never shows.

A foreign key ``ON DELETE CASCADE`` (or ``SET NULL``, or ``ON UPDATE``
either) makes InnoDB change the child table's rows itself, inside the
storage engine: MariaDB writes only the parent's row event to the binlog,
and so does MySQL with InnoDB's native foreign keys (MySQL 9 writes the
child's events only with ``innodb_native_foreign_keys = OFF``).  Checked
here on MariaDB 10.11: ``DELETE FROM p WHERE id = 1`` with a cascading
child logged a Table_map of the child and no row of it.  A replica applies
the same cascade itself; a column store has no foreign keys, so the child's
rows stayed on the target as they were -- orphans after a DELETE, old keys
after an UPDATE -- without a word (Debezium, Maxwell and GoldenGate
document the same hole).

So a replicated table with such a foreign key stops the producer, at start
(information_schema) and when a DDL gives it one, naming the key and the
fixes: drop the action and change the child rows in the application, use
MySQL's SQL-layer foreign keys, or accept the drift with
``[source] cascading_foreign_keys = "allow"`` and repair it with
``cynomys verify --repair``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from cynomys.core.errors import SourceConfigError
from cynomys.core.model import Change
from cynomys.parser.kinds import statement_of
from cynomys.producer.ddl_scope import one_table

#: Referential actions that change the child's rows (RESTRICT and NO ACTION
#: only refuse the parent's change, which is then not in the binlog either).
ACTIONS = ("CASCADE", "SET NULL", "SET DEFAULT")
REFUSE, ALLOW = "refuse", "allow"
_ACTION = re.compile(r"\bON\s+(DELETE|UPDATE)\s+(CASCADE|SET\s+NULL|SET\s+DEFAULT)\b", re.IGNORECASE)
_HINT = ("drop the ON DELETE/ON UPDATE action and change the child rows in the application (or, on MySQL 9, "
         "use SQL-layer foreign keys: innodb_native_foreign_keys = OFF, which logs them); or set [source] "
         "cascading_foreign_keys = \"allow\" and repair the target with `cynomys verify --repair`")
_WHY = ("the source does not write the rows a cascade deletes or updates to its binlog, so they would stay on "
        "the target as they were")


@dataclass(frozen=True)
class CascadingKey:
    """A foreign key of ``child`` whose action changes its rows."""

    child: tuple[str, str]
    name: str
    parent: tuple[str, str]
    on_delete: str
    on_update: str

    @classmethod
    def from_row(cls, row: Sequence[object]) -> CascadingKey:
        db, table, name, parent_db, parent, on_delete, on_update = (str(v) for v in row)
        return cls((db, table), name, (parent_db, parent), on_delete, on_update)

    def describe(self) -> str:
        rules = " ".join(f"ON {what} {rule}" for what, rule in (("DELETE", self.on_delete),
                                                                 ("UPDATE", self.on_update)) if rule in ACTIONS)
        return f"{'.'.join(self.child)} foreign key {self.name} REFERENCES {'.'.join(self.parent)} {rules}"


def check_keys(keys: Sequence[CascadingKey], replicated: Callable[[str, str], bool], policy: str) -> None:
    """Refuse (SourceConfigError) replicated tables with cascading foreign keys."""
    mine = [k for k in keys if replicated(*k.child)]
    if not mine or policy == ALLOW:
        return
    more = f" (and {len(mine) - 1} more)" if len(mine) > 1 else ""
    raise SourceConfigError(f"{mine[0].describe()}{more}: {_WHY}", hint=_HINT)


def check_ddl(change: Change, replicated: Callable[[str, str], bool], policy: str) -> None:
    """Refuse a DDL that gives a replicated table a cascading foreign key."""
    sql = statement_of(change.sql or "")
    if policy == ALLOW or not _ACTION.search(sql):
        return
    table = one_table(sql, change.database)
    if table is not None and replicated(*table):
        raise SourceConfigError(
            f"a DDL gives {table[0]}.{table[1]} a foreign key with an ON DELETE/ON UPDATE action "
            f"({' '.join(sql.split())[:160]}): {_WHY}", hint=_HINT)
