"""Errors of the verify package."""
from __future__ import annotations

from cynomys.core.errors import TerminalError


class RepairRefused(TerminalError):
    """The target cannot replace one key range of a table exactly (``cynomys
    verify --repair``): the applier leaves the range as it is and reports
    why in the chunk's result; replication goes on."""

    def one_line(self) -> str:
        return self.message + (f" (fix: {self.hint})" if self.hint else "")
