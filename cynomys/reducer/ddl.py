"""Moved to ``cynomys.applier.ddl`` (only the applier uses the DDL vocabulary).

Kept as a re-export until ``applier/targets/spark/target.py`` (owned by the
Spark work in progress) imports ``SKIP_HINT`` from the new place; nothing
else imports this module.
"""
from __future__ import annotations

from cynomys.applier.ddl import *  # noqa: F401,F403
from cynomys.applier.ddl import SKIP_HINT as SKIP_HINT
