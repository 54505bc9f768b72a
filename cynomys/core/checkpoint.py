"""Durable local state: checkpoints written atomically (tmp + fsync + rename).

A crash leaves either the old file or the new one, never a torn one.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from cynomys.core.errors import TerminalError


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path``'s folder durable (the folder's
    own metadata; the file's fsync does not cover it)."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict[str, Any], *, durable: bool = True) -> None:
    """``durable=False`` skips the fsyncs: still never torn (rename is
    atomic), but may be lost in a power cut -- for informational files."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except FileNotFoundError:  # the first save: the folder is made once, not a mkdir per save
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path)  # make the rename itself durable
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TerminalError(f"state file {path} is unreadable: {exc}",
                            hint="restore it from a backup, or remove it to start from [source] start") from None
    if not isinstance(data, dict):
        raise TerminalError(f"state file {path} does not hold a JSON object")
    return data
