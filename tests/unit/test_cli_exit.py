"""The process entry (cli.main.run): a QUICK_EXIT command ends its process
without the interpreter's teardown, its output flushed and its exit code
kept; any other command, and ``main`` called in-process, return normally."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

SCRIPT = """
import atexit, logging, os, sys, types
import cynomys.cli

m = sys.modules["cynomys.cli.main"]  # (the package's `main` is the function)

atexit.register(lambda: print("teardown ran"))

def register(sub):
    p = sub.add_parser("fake")
    def func(args):
        print("x" * 200000)                       # more than a pipe's buffer
        logging.getLogger("t").warning("logged")  # through logging's handler
        return 5
    p.set_defaults(func=func)

m.COMMANDS = (types.SimpleNamespace(register=register),)
m.QUICK_EXIT = tuple(os.environ["QUICK"].split())
logging.basicConfig(stream=sys.stderr)
m.run()
"""


def _fake(*quick: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, "fake"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "QUICK": " ".join(quick)})


def test_a_quick_exit_command_skips_the_teardown_and_keeps_its_output_and_code() -> None:
    p = _fake("fake")
    assert p.returncode == 5, p.stderr
    assert p.stdout == "x" * 200000 + "\n"
    assert "logged" in p.stderr
    assert "teardown ran" not in p.stdout


def test_other_commands_end_with_the_teardown() -> None:
    p = _fake()
    assert p.returncode == 5, p.stderr
    assert p.stdout == "x" * 200000 + "\nteardown ran\n"


def test_the_producer_is_a_quick_exit_command_and_its_errors_still_print() -> None:
    from cynomys.cli.main import QUICK_EXIT

    assert QUICK_EXIT == ("produce",)
    p = subprocess.run([sys.executable, "-m", "cynomys.cli", "produce", "-c", str(ROOT / "no-such-config.toml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("cynomys: configuration error:") and "no-such-config.toml" in p.stderr
