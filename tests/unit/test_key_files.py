"""Key files against accidents and a local attacker (issue #13, item 5):
keygen never writes through a planted file or symlink, makes its directory
0700 whatever the umask, and private keys others can read are refused."""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from cynomys.core.errors import ConfigError
from cynomys.transport.keys import KEY_FILES, generate_keys, load_private_key


def test_keygen_does_not_write_through_a_planted_tmp_symlink(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    # Another local user plants "<key>.tmp" -> a file of the key owner's
    # (the old writer opened "<key>.tmp" with O_CREAT|O_TRUNC: it followed
    # the link, truncated the victim and wrote the private key into it).
    for name in KEY_FILES.values():
        (keys / f"{name}.tmp").symlink_to(victim)
    paths = generate_keys(keys, rsa_bits=2048)
    assert victim.read_text() == "precious\n"
    for key, path in paths.items():
        assert not path.is_symlink() and path.read_bytes().startswith(b"-----BEGIN")
        assert stat.S_IMODE(path.stat().st_mode) == (0o600 if "private" in key else 0o644)
    # The planted links are left alone, and no temporary file is left behind.
    assert sorted(p.name for p in keys.iterdir()) == sorted(
        [*KEY_FILES.values(), *(f"{n}.tmp" for n in KEY_FILES.values())])


def test_keygen_refuses_a_planted_symlink_under_a_key_name(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    (keys / "applier_private.pem").symlink_to(victim)  # dangling: victim does not exist yet
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        generate_keys(keys, rsa_bits=2048)
    assert not victim.exists()


def test_keygen_makes_its_directory_0700_under_umask_000(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        paths = generate_keys(tmp_path / "new" / "keys", rsa_bits=2048)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new" / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE(paths["applier_private_key"].stat().st_mode) == 0o600


def test_keygen_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by group or others") as ei:
        generate_keys(shared, rsa_bits=2048)
    assert ei.value.hint is not None and "chmod 700" in ei.value.hint
    assert list(shared.iterdir()) == []


def test_a_private_key_others_can_read_is_refused(tmp_path: Path) -> None:
    paths = generate_keys(tmp_path / "k", rsa_bits=2048)
    priv = paths["applier_private_key"]
    priv.chmod(0o644)
    with pytest.raises(ConfigError, match="accessible by group or others") as ei:
        load_private_key(priv, config_key="applier_private_key")
    assert ei.value.hint is not None and f"chmod 600 {priv}" in ei.value.hint
    priv.chmod(0o640)
    with pytest.raises(ConfigError, match="mode 0640"):
        load_private_key(priv, config_key="applier_private_key")


def test_allow_readable_private_keys_warns_instead(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = generate_keys(tmp_path / "k", rsa_bits=2048)
    priv = paths["producer_private_key"]
    priv.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="cynomys.transport.keys"):
        key = load_private_key(priv, allow_readable=True)
    assert key is not None
    assert any("accessible by group or others" in r.getMessage() and str(priv) in r.getMessage()
               for r in caplog.records)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory owned by another user needs root")
def test_keygen_refuses_a_directory_of_another_user(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # nobody: could swap our key files for its own
    with pytest.raises(ConfigError, match="belongs to another user"):
        generate_keys(theirs, rsa_bits=2048)
    assert list(theirs.iterdir()) == []
