"""The ColumnStore (MariaDB) target's own settings: keys of ``[target]``.

Registered in ``cynomys.core.targets.TARGET_CONFIGS`` with ``section = ''``:
``engine`` has always been a key of ``[target]`` itself
(``CYNOMYS_TARGET_ENGINE``), and stays there.  The target reads it with
``cfg.target.of(ColumnStoreConfig)``.  This module imports nothing but
``cynomys.core``: the loader imports it even where pymysql is not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from cynomys.core.config import NON_NEGATIVE, TargetOptions, checked

#: A storage engine name: it goes into ``ENGINE=...`` as it is written.
ENGINE_NAME = re.compile(r"\w+")


@dataclass(frozen=True)
class ColumnStoreConfig(TargetOptions):
    """Keys of ``[target]`` for ``kind = "columnstore"``."""

    section: ClassVar[str] = ""

    # Table engine on a MariaDB target: `ColumnStore`, or `InnoDB`/`Aria` on a plain MariaDB.
    engine: str = field(default="ColumnStore", metadata=checked(
        lambda v: not v or bool(ENGINE_NAME.fullmatch(v)), "a storage engine name, e.g. 'ColumnStore', 'InnoDB' or 'Aria'"))
    # A flush holding at least this many snapshot rows (an initial load, a
    # re-snapshot) loads about half of them on a second connection, beside its
    # own transaction, so the target server loads on two cores (InnoDB only;
    # 0 = never).  Those rows commit just before the flush: a crash between
    # the two replays them, and snapshot rows replace by key.  A keyless
    # table's read (applied in parts) loads beside likewise, in an XA
    # transaction that commits with the parts.
    side_load_rows: int = field(default=10_000, metadata=NON_NEGATIVE)
