"""Command line: the only place that wires daemons and configures logging.
One module per command (each registers its parser and runs it); ``main``
dispatches.  ``python -m cynomys.cli`` and the ``cynomys`` script run it (``run``)."""
from __future__ import annotations

from cynomys.cli.main import main, run

__all__ = ["main", "run"]
