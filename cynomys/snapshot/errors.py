"""Errors of the snapshot package (CynomysError subclasses with a fix)."""
from __future__ import annotations

from cynomys.core.errors import TerminalError


class SnapshotError(TerminalError):
    """A snapshot (or one of its tables) cannot run as asked.

    Raised inside the producer it fails the snapshot job, never the
    producer: replication of the binlog goes on."""

    def one_line(self) -> str:
        """The message and its fix on one line, as a job records it."""
        return self.message + (f" (fix: {self.hint})" if self.hint else "")


class SnapshotRequestError(SnapshotError):
    """A `cynomys snapshot` request names something that cannot be snapshotted."""
