"""Shared bits of the benchmarks: machine description and result files."""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Where a number was measured; these machines are shared and noisy, so
    the load at the start is recorded too."""
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu_model(),
            "cpus_online": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "loadavg_1m_at_start": os.getloadavg()[0]}


def write_result(name: str, data: dict[str, Any]) -> Path:
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": f"bench/{Path(sys.argv[0]).name}",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": machine(), **data}
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return out


def daemon(cfg: Path, cmd: str, log: Path) -> subprocess.Popen[bytes]:
    """`cynomys produce|apply -c cfg` as its own process, logging to ``log``."""
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "cynomys.cli", "--log-level", "INFO", cmd, "-c", str(cfg)],
                            cwd=Path(__file__).resolve().parents[1], stdout=log.open("wb"), stderr=subprocess.STDOUT)
