"""``[source] include_tables``/``exclude_tables`` checked against the
source's tables when the producer starts.

The patterns are matched case-sensitively (parser/stream.py
``TableFilter``): the binlog spells a name as the server stores it, and a
server with ``lower_case_table_names = 1`` (usual where the database came
from Windows or macOS, or on some managed services) stores every name in
lower case.  ``include_tables = ["shop.Orders"]`` then matched nothing: the
table was never replicated, the snapshot skipped it, lag stayed at zero and
nothing said why; ``exclude_tables = ["hr.Salaries"]`` replicated the table
it meant to keep out.  A pattern that matches no table but would in another
case is refused, naming the spelling to write; one that matches no table at
all is only warned about (its table may be created later).
"""
from __future__ import annotations

import fnmatch
import logging
from typing import Iterable, Sequence

from cynomys.core.errors import SourceConfigError

log = logging.getLogger(__name__)

#: The default pattern (no include_tables): matches whatever exists.
_EVERYTHING = "*.*"
#: Names shown in a message, at most.
_SHOWN = 3


def check_patterns(include: Sequence[str], exclude: Sequence[str], tables: Iterable[tuple[str, str]]) -> list[str]:
    """Raise SourceConfigError for a pattern that matches no table of
    ``tables`` (database, table) but does in another case; return warnings
    for include patterns that match no table at all."""
    names = [f"{db}.{t}" for db, t in tables]
    warnings: list[str] = []
    for key, patterns in (("include_tables", include), ("exclude_tables", exclude)):
        for p in patterns:
            if p == _EVERYTHING or any(fnmatch.fnmatchcase(n, p) for n in names):
                continue
            low = p.lower()
            near = [n for n in names if fnmatch.fnmatchcase(n.lower(), low)]
            if near:
                shown = ", ".join(near[:_SHOWN]) + (" ..." if len(near) > _SHOWN else "")
                what = "never be replicated" if key == "include_tables" else "be replicated"
                raise SourceConfigError(
                    f"[source] {key} pattern {p!r} matches no table on the source, but {shown} "
                    f"{'does' if len(near) == 1 else 'do'} in another case: patterns are compared case-sensitively "
                    f"(the binlog spells names as the server stores them), so {'it' if len(near) == 1 else 'they'} "
                    f"would {what}",
                    hint=f"write {near[0]!r} in [source] {key}" if len(near) == 1 and "*" not in p and "?" not in p
                    else f"spell the pattern as the server stores the names ({shown})")
            if key == "include_tables":
                warnings.append(f"[source] include_tables pattern {p!r} matches no table on the source (yet): "
                                "nothing is replicated for it until such a table is created")
    return warnings


def check_source_tables(include: Sequence[str], exclude: Sequence[str], tables: Iterable[tuple[str, str]]) -> None:
    """``check_patterns``, its warnings logged."""
    for w in check_patterns(include, exclude, tables):
        log.warning("%s", w)
