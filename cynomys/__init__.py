"""Cynomys: replicate MySQL/MariaDB into column stores from the binlog."""
from __future__ import annotations

__version__ = "0.1.0"
