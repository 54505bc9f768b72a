"""Operator mistakes at the command line (issue #13, item 6): each one is a
single line naming the problem and the fix, a non-zero exit, no traceback,
and no password in the output."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cynomys.transport.keys import generate_keys
from tests.servers.redis import RedisServer, free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def _unprivileged() -> list[str]:
    """Run as root without the capabilities that bypass file permissions,
    so "unreadable" and "unwritable" mean what they say."""
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []


def cli(*args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    prefix = _unprivileged() if unprivileged else []
    return subprocess.run([*prefix, sys.executable, "-m", "cynomys.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def one_line_error(p: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    out = p.stdout + p.stderr
    assert p.returncode == code, out
    assert "Traceback" not in out, out
    errors = [line for line in p.stderr.splitlines() if line.startswith("cynomys:")]
    assert len(errors) == 1, out
    line = errors[0]
    assert "(fix: " in line, line
    for w in words:
        assert w in line, line
    return line


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return generate_keys(tmp_path_factory.mktemp("keys") / "k", rsa_bits=2048)


def config(tmp_path: Path, keys: dict[str, Path], url: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(f'[transport]\nurl = "{url}"\n[security]\n'
                 + "".join(f'{k} = "{v}"\n' for k, v in keys.items()))
    return p


def test_config_that_is_a_directory(tmp_path: Path) -> None:
    one_line_error(cli("config", "check", "-c", str(tmp_path)), 2, "is a directory", str(tmp_path))


def test_config_that_is_unreadable(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[source]\n")
    p.chmod(0)
    one_line_error(cli("config", "check", "-c", str(p), unprivileged=True), 2, "permission denied", str(p))


def test_config_that_is_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_bytes(b'[source]\nuser = "r\xe9plica"\n')
    one_line_error(cli("config", "check", "-c", str(p)), 2, "not UTF-8", str(p))


@pytest.mark.parametrize("url, words", [
    ("redis://:hunter2@127.0.0.1:99999/0", ("not a valid Redis URL", "Port out of range")),
    ("http://:hunter2@127.0.0.1:6379/0", ("not a Redis URL",)),
    ("redis://127.0.0.1:6379/0?pasword=hunter2", ("unknown option 'pasword'",)),
    ("redis://127.0.0.1:6379/0?ssl_ca=/x.pem&password=hunter2", ("ssl_ca_certs needs TLS", "password=***")),
])
def test_tail_with_a_malformed_redis_url(tmp_path: Path, keys: dict[str, Path], url: str,
                                         words: tuple[str, ...]) -> None:
    line = one_line_error(cli("tail", "-c", str(config(tmp_path, keys, url))), 2, *words)
    assert "hunter2" not in line


def test_tail_with_redis_down_redacts_a_query_string_password(tmp_path: Path, keys: dict[str, Path]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?password=hunter2"
    line = one_line_error(cli("tail", "-c", str(config(tmp_path, keys, url))), 3, "unavailable", "start Redis",
                          "password=***")
    assert "hunter2" not in line


def test_tail_with_a_wrong_redis_password(tmp_path: Path, keys: dict[str, Path]) -> None:
    server = RedisServer(tmp_path / "redis", password="right-one")
    try:
        url = f"redis://:wrong-one@127.0.0.1:{server.port}/0"
        line = one_line_error(cli("tail", "-c", str(config(tmp_path, keys, url))), 2, "refused our credentials",
                              "[transport] url")
        assert "wrong-one" not in line
    finally:
        server.close()


def test_keygen_into_an_unwritable_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    one_line_error(cli("keygen", "--out", str(locked / "keys"), "--bits", "2048", unprivileged=True), 2,
                   "cannot create the key directory", "Permission denied")
    locked.chmod(0o700)
    assert not (locked / "keys").exists()


@pytest.mark.parametrize("command", ["tail", "apply"])
def test_a_world_readable_private_key_is_refused(tmp_path: Path, command: str) -> None:
    keys = generate_keys(tmp_path / "k", rsa_bits=2048)
    keys["applier_private_key"].chmod(0o644)
    cfg = config(tmp_path, keys, "redis://127.0.0.1:1/0")
    one_line_error(cli(command, "-c", str(cfg)), 2, "accessible by group or others",
                   f"chmod 600 {keys['applier_private_key']}")
    # The explicit opt-out: the key is used (tail then fails on Redis, later).
    with cfg.open("a") as fh:
        fh.write("allow_readable_private_keys = true\n")
    p = cli("tail", "-c", str(cfg))
    assert "accessible by group or others" in p.stderr and p.returncode == 3, p.stderr
