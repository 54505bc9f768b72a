"""Which hot path runs: the compiled extension or the pure-Python reference.

``cynomys._speedups`` (a C extension built by ``pip install``) decodes ROWS
events and writes Avro batches; ``parser/rows.py`` and ``schemas/codec.py``
keep the pure-Python code as the specification and the fallback, and both
produce the same values and the same bytes.  ``cynomys._reader`` (another
one) reads the binlog itself -- packets, events, SourceEvents in batches --
where ``parser/stream.py`` reads with mysql-replication (parser/creader.py).

- ``CYNOMYS_PURE_PYTHON=1`` forces the pure-Python path (CI runs the suite
  both ways).
- If the extension cannot be imported (no compiler when Cynomys was
  installed, a different Python), Cynomys runs pure Python and says so once
  in the log (WARNING) and in ``cynomys status`` (``status()``).
"""
from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

ENV = "CYNOMYS_PURE_PYTHON"

_loaded: ModuleType | None = None
_import_error = ""
try:
    from cynomys import _speedups as _loaded  # type: ignore[attr-defined, no-redef]
except ImportError as exc:  # not built (no compiler at install time) or built for another Python
    _import_error = str(exc)
_reader_loaded: ModuleType | None = None
_reader_error = ""
try:
    from cynomys import _reader as _reader_loaded  # type: ignore[attr-defined, no-redef]
except ImportError as exc:
    _reader_error = str(exc)

#: The compiled module the hot paths call, or None for pure Python.  Read
#: at each call (one attribute lookup per event/batch), so ``use_compiled``
#: switches paths at run time.
ext: ModuleType | None = None
#: The compiled binlog reader (cynomys._reader), or None: the library's.
#: Selected with ``ext`` (BinlogSource reads it when it starts reading).
reader: ModuleType | None = None
_reason = ""
_announced = False
#: Calls the compiled code handed back to the reference (``Fallback``):
#: correct either way, but a count that grows with traffic means a slow path.
fallbacks: dict[str, int] = {"decode": 0, "encode": 0, "decode_columns": 0, "load_data": 0, "column_values": 0}


def use_compiled(flag: bool) -> bool:
    """Select the path; returns whether the compiled one is now active
    (False when asked for it but it is not importable)."""
    global ext, reader, _reason, _announced
    if not flag:
        ext, _reason = None, f"{ENV} is set" if os.environ.get(ENV, "") not in ("", "0") else "pure Python requested"
    elif _loaded is None:
        ext, _reason = None, f"the compiled extension cynomys._speedups is not importable ({_import_error})"
    else:
        ext, _reason = _loaded, ""
    reader = _reader_loaded if flag else None
    if flag and _reader_loaded is None:
        _reason = (_reason + "; " if _reason else "") + \
            f"the compiled reader cynomys._reader is not importable ({_reader_error})"
    _announced = False
    return ext is not None


def make_plan(spec: Any) -> Any:
    """A table's decode plan compiled by the extension (None when it is not
    built); made whatever path is selected, so that switching works."""
    return _loaded.Plan(spec) if _loaded is not None and spec else None


def available() -> bool:
    """Whether the extension was built and imports (whatever is selected)."""
    return _loaded is not None


def reader_available() -> bool:
    """Whether cynomys._reader was built and imports (whatever is selected)."""
    return _reader_loaded is not None


def announce() -> None:
    """Log once which path runs: a WARNING when it is pure Python."""
    global _announced
    if _announced:
        return
    _announced = True
    if ext is None:
        log.warning("hot path: pure Python (%s); the producer decodes and encodes several times slower", _reason)
    elif reader is None:
        log.warning("hot path: compiled (cynomys._speedups), but the binlog is read by mysql-replication (%s)",
                    _reason)
    else:
        log.info("hot path: compiled (cynomys._speedups, cynomys._reader)")


def status() -> dict[str, str]:
    """For ``cynomys status``: {"hot_path": "compiled" | "pure-python", "reader":
    "compiled" | "mysql-replication", "reason": why pure, "fallbacks": how often the
    compiled code handed a call back to the reference}."""
    return {"hot_path": "compiled" if ext is not None else "pure-python",
            "reader": "compiled" if reader is not None else "mysql-replication", "reason": _reason,
            "fallbacks": ", ".join(f"{k} {v}" for k, v in fallbacks.items())}


use_compiled(os.environ.get(ENV, "") in ("", "0"))
