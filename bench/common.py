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
    from collections.abc import Iterable

    from cynomys.sandbox.mariadb import MariaDBServer

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


def security_toml(keys: dict[str, Path]) -> str:
    """The [security] section of a config: the key files ``generate_keys`` wrote."""
    return "[security]\n" + "\n".join(f'{k} = "{v}"' for k, v in keys.items())


def write_json(out: Path, data: dict[str, Any]) -> None:
    """A result to the path the user named (benches with an ``--out``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}")


def tear_down(label: str, work: Path, keep: bool, procs: Iterable[subprocess.Popen[bytes]], redis: Any,
              *servers: Any) -> None:
    """The end of one run, however it ended: daemons still running killed,
    Redis stopped, the servers (None: not started) destroyed, and the work
    folder removed unless ``keep`` (a failed run keeps it for its logs)."""
    import shutil

    for p in procs:
        if p.poll() is None:
            p.kill()
    redis.stop()
    for s in servers:
        if s is not None:
            s.destroy()
    if keep:
        print(f"[{label}] work folder kept (logs, state): {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)


def redis_config(work: Path, src: MariaDBServer, redis_url: str, keys: dict[str, Path], *, include: str, start: str,
                 heartbeat_s: float | None = None, producer: str = "", applier: str = "", tail: str = "",
                 producer_id: str = "bench", stream: str = "bench") -> Path:
    """work/cynomys.toml of a bench run through Redis: producer and applier
    state under ``work``; ``producer`` and ``applier`` are extra lines of
    those sections, ``tail`` the sections after them ([target], [snapshot])."""
    text = f"""{src.source_toml(include, start, heartbeat_s)}
[producer]
id = "{producer_id}"
state_dir = "{work / 'producer'}"
{producer}[transport]
url = "{redis_url}"
stream = "{stream}"
{security_toml(keys)}
[applier]
{applier}state_dir = "{work / 'applier'}"
{tail}"""
    path = work / "cynomys.toml"
    path.write_text(text)
    return path
