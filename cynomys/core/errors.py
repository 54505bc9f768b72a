"""Error hierarchy.

Every error Cynomys raises is a CynomysError carrying a *retry marker*:
Transient errors (a server is down, a connection dropped) are retried with
backoff by the daemon loops; Terminal errors (bad config, purged binlog,
a DDL we cannot translate, a forged envelope) stop the daemon with a message
naming the thing and the fix.  Retry policy reads the marker only; driver
errors are translated into these at the module edge.
"""
from __future__ import annotations


class CynomysError(Exception):
    """Base class.  ``transient`` says whether retrying may help."""

    transient: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")


class TransientError(CynomysError):
    """Retrying later may succeed (network, server restart, lock timeout)."""

    transient = True


class TerminalError(CynomysError):
    """Retrying will not help; a person must act (the message says how)."""

    transient = False


class ConfigError(TerminalError):
    """A configuration file or value is invalid."""


class SourceConfigError(TerminalError):
    """The source server is not configured for row-based replication."""


class PositionLostError(TerminalError):
    """The saved binlog file/GTID is no longer on the source (purged)."""


class UnsupportedEventError(TerminalError):
    """The binlog holds something Cynomys cannot replicate faithfully."""


class SourceUnavailableError(TransientError):
    """The source server cannot be reached right now."""


class TransportUnavailableError(TransientError):
    """Redis (or the transport file) cannot be reached right now."""


class EnvelopeRejected(TerminalError):
    """An envelope failed verification, decryption or decoding."""

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        self.reason = reason
        super().__init__(message, hint=hint)


class SequenceGapError(TerminalError):
    """Envelopes are missing between two sequence numbers (pub/sub loss)."""


class TargetUnavailableError(TransientError):
    """The target store cannot be reached right now."""


class TargetRejectedError(TerminalError):
    """The target refused a change (type, constraint, DDL it cannot run)."""


class SchemaError(TerminalError):
    """A record or value does not fit the schema."""


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is marked as worth retrying."""
    return isinstance(exc, CynomysError) and exc.transient


class LeaseLost(TerminalError):
    """An HA producer no longer holds the lease (it expired, or another
    producer took it over): it must stop working and stand by.  Raised by a
    fenced publish or state write; the HA loop (cynomys/producer/ha.py) catches it."""
