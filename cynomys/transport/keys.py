"""Key files: generation and loading.

Two key pairs protect the transport:

* the **applier** pair (RSA): the producer wraps each AES data key for the
  applier's public key; only the applier's private key unwraps it;
* the **producer** pair (Ed25519): the producer signs every envelope; the
  applier verifies with the producer's public key.  Wrapping alone
  authenticates nothing (anyone holding the applier's *public* key can wrap a
  key of their own), so the signature is what makes envelopes unforgeable.

Keys are PEM files.  Private keys are written with mode 0600 and may be
encrypted with a passphrase (``CYNOMYS_SECURITY_PASSPHRASE``).  The key
directory ``keygen`` creates is 0700, every file is created exclusively
(O_EXCL|O_NOFOLLOW, under a random temporary name) so a file or symlink
planted in the directory is never written through, and a private key that
group or others may read is refused when loaded (``[security]
allow_readable_private_keys = true`` turns that into a warning).
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Union

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from cynomys.core.checkpoint import fsync_dir
from cynomys.core.errors import ConfigError

log = logging.getLogger(__name__)

PrivateKey = Union[rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey]
PublicKey = Union[rsa.RSAPublicKey, ed25519.Ed25519PublicKey]

# File names, keyed by the [security] config key that should point at them.
KEY_FILES: dict[str, str] = {
    "applier_private_key": "applier_private.pem",
    "applier_public_key": "applier_public.pem",
    "producer_private_key": "producer_private.pem",
    "producer_public_key": "producer_public.pem",
}
_PRIVATE = ("applier_private_key", "producer_private_key")

# Below 2048 bits RSA-OAEP no longer gives the ~112-bit security the rest of
# the envelope (AES-256, Ed25519) is built for.
MIN_RSA_BITS = 2048


def generate_keys(
    out_dir: Path,
    *,
    rsa_bits: int = 3072,
    passphrase: str | None = None,
    force: bool = False,
) -> dict[str, Path]:
    """Write both key pairs into ``out_dir``; return {config key: path}.

    Refuses to overwrite any existing key file unless ``force``: replacing a
    key pair silently would make every envelope in flight unreadable.
    """
    if rsa_bits < MIN_RSA_BITS:
        raise ConfigError(f"RSA key size {rsa_bits} is too small", hint=f"use at least {MIN_RSA_BITS} bits")
    out_dir = Path(out_dir)
    _make_key_dir(out_dir)
    paths = {key: out_dir / name for key, name in KEY_FILES.items()}
    # lexists: a dangling symlink planted under a key's name counts as "there".
    existing = [str(p) for p in paths.values() if os.path.lexists(p)]
    if existing and not force:
        raise ConfigError(
            "refusing to overwrite existing key files: " + ", ".join(existing),
            hint="move them away, choose another directory, or pass force=True (--force)",
        )
    if passphrase:
        enc: serialization.KeySerializationEncryption = serialization.BestAvailableEncryption(
            passphrase.encode("utf-8")
        )
    else:
        enc = serialization.NoEncryption()

    applier = rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    producer = ed25519.Ed25519PrivateKey.generate()
    blobs = {
        "applier_private_key": applier.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc
        ),
        "applier_public_key": applier.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        "producer_private_key": producer.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc
        ),
        "producer_public_key": producer.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for key, blob in blobs.items():
        _write_key_file(paths[key], blob, 0o600 if key in _PRIVATE else 0o644, replace=force)
    log.info("wrote key pairs to %s (RSA-%d applier pair, Ed25519 producer pair)", out_dir, rsa_bits)
    return paths


def _make_key_dir(out_dir: Path) -> None:
    """Create ``out_dir`` with mode 0700 whatever the umask; refuse an existing
    directory that others may write to (they could swap the key files after
    we wrote them), unless it is sticky like /tmp (then they cannot)."""
    try:
        if not out_dir.is_dir():
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                out_dir.mkdir(mode=0o700)
            except FileExistsError:
                pass  # created meanwhile (or a file by that name: caught below)
            else:
                os.chmod(out_dir, 0o700)  # mkdir's mode is filtered by the umask; be exact
        st = os.stat(out_dir)
    except OSError as exc:
        raise _os_error(exc, f"cannot create the key directory {out_dir}", out_dir) from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{out_dir} is not a directory", hint="pass --out a directory for the key files")
    if st.st_uid not in (os.geteuid(), 0):
        # Its owner can rename our files away and put its own keys in place.
        raise ConfigError(f"key directory {out_dir} belongs to another user (uid {st.st_uid})",
                          hint=f"pass --out a directory of your own (uid {os.geteuid()}), or a new one")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ConfigError(
            f"key directory {out_dir} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
            hint=f"chmod 700 {out_dir}, or pass --out a new directory (created 0700)")


def _os_error(exc: OSError, what: str, path: Path) -> ConfigError:
    """An OSError while writing keys as a one-line ConfigError with a fix."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = f"choose a directory this user ({os.geteuid()}) can write, or fix the permissions of {path}"
    else:
        hint = "choose another directory for --out"
    return ConfigError(f"{what}: {reason}", hint=hint)


def _write_key_file(path: Path, data: bytes, mode: int, *, replace: bool) -> None:
    """Write ``data`` to ``path`` with exactly ``mode``, durably.

    The temporary file gets a random name and is created with O_EXCL and
    O_NOFOLLOW (mkstemp), so a file or symlink someone planted in the
    directory (say ``applier_private.pem.tmp`` -> ``/etc/...``) is never
    opened, let alone written through; it is 0600 from its first moment.
    Without ``replace`` the key is put in place with link(2), which, unlike
    rename, fails if the name exists: no check-then-write race either."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _os_error(exc, f"cannot write key file {path}", path.parent) from None
    try:
        try:
            os.fchmod(fd, mode)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)  # renames over a symlink, never through it
        else:
            os.link(tmp, path, follow_symlinks=False)
            os.unlink(tmp)
        fsync_dir(path)
    except FileExistsError:
        raise ConfigError(f"refusing to overwrite {path}: it appeared while the keys were written",
                          hint="move it away and run keygen again, or pass --force") from None
    except OSError as exc:
        raise _os_error(exc, f"cannot write key file {path}", path.parent) from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _read(path: str | Path, config_key: str) -> tuple[bytes, int]:
    """The file's bytes and its st_mode (of the file read, via fstat)."""
    if not str(path):
        raise ConfigError(f"no key file configured for [security] {config_key}",
                          hint=f"set [security] {config_key} to a PEM file (see `cynomys keygen`)")
    try:
        with open(path, "rb") as fh:
            return fh.read(), os.fstat(fh.fileno()).st_mode
    except FileNotFoundError:
        raise ConfigError(f"key file {path} not found",
                          hint=f"set [security] {config_key} to an existing PEM file, "
                               "or run `cynomys keygen`") from None
    except OSError as exc:
        raise ConfigError(f"key file {path} cannot be read: {exc.strerror}",
                          hint=f"check the permissions of {path} ([security] {config_key})") from None


def _check_private_mode(path: str | Path, mode: int, allow_readable: bool) -> None:
    """Refuse (or with ``allow_readable`` warn about) a private key that
    group or others can read or write: whoever reads the applier's key can
    decrypt every envelope, whoever reads the producer's can forge them."""
    loose = stat.S_IMODE(mode) & 0o077
    if not loose:
        return
    msg = f"private key {path} is accessible by group or others (mode {stat.S_IMODE(mode):04o})"
    if allow_readable:
        log.warning("%s; used anyway because [security] allow_readable_private_keys = true", msg)
        return
    raise ConfigError(msg, hint=f"chmod 600 {path} (or set [security] allow_readable_private_keys = true "
                                "to only warn)")


def load_private_key(
    path: str | Path,
    passphrase: str | None = None,
    *,
    config_key: str = "applier_private_key / producer_private_key",
    allow_readable: bool = False,
) -> PrivateKey:
    """Load an RSA or Ed25519 private key from a PEM file.

    ``config_key`` names the [security] key that points at ``path`` so the
    error message can say what to fix.  An empty passphrase means none.
    A key file that group or others can access is refused (a warning with
    ``allow_readable``); the check runs once the file proved to be a
    private key, on the mode of the very file read.
    """
    data, mode = _read(path, config_key)
    secret = passphrase.encode("utf-8") if passphrase else None
    try:
        key = serialization.load_pem_private_key(data, password=secret)
    except TypeError:
        # cryptography raises TypeError for "encrypted but no password" and
        # "password given but key not encrypted".
        if secret is None:
            raise ConfigError(f"private key {path} is encrypted and no passphrase was given",
                              hint="set CYNOMYS_SECURITY_PASSPHRASE (or [security] passphrase)") from None
        raise ConfigError(f"private key {path} is not encrypted but a passphrase was given",
                          hint="unset CYNOMYS_SECURITY_PASSPHRASE, or encrypt the key") from None
    except ValueError:
        if secret is not None:
            raise ConfigError(
                f"private key {path} cannot be loaded: wrong passphrase or not a PEM private key",
                hint=f"check CYNOMYS_SECURITY_PASSPHRASE and [security] {config_key}") from None
        raise ConfigError(f"{path} is not a PEM private key",
                          hint=f"point [security] {config_key} at a private key file") from None
    if not isinstance(key, (rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey)):
        raise ConfigError(f"private key {path} is a {type(key).__name__}; expected RSA or Ed25519",
                          hint=f"point [security] {config_key} at a key made by `cynomys keygen`")
    _check_private_mode(path, mode, allow_readable)
    return key


def load_public_key(path: str | Path, *, config_key: str = "applier_public_key / producer_public_key") -> PublicKey:
    """Load an RSA or Ed25519 public key from a PEM file."""
    data, _ = _read(path, config_key)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ConfigError(f"{path} is not a PEM public key",
                          hint=f"point [security] {config_key} at a public key file") from None
    if not isinstance(key, (rsa.RSAPublicKey, ed25519.Ed25519PublicKey)):
        raise ConfigError(f"public key {path} is a {type(key).__name__}; expected RSA or Ed25519",
                          hint=f"point [security] {config_key} at a key made by `cynomys keygen`")
    return key


def _wrong_key(key: object, what: str, kind: str, setting: str) -> ConfigError:
    return ConfigError(f"{what} must be an {kind} key, got {type(key).__name__}", hint=f"set [security] {setting}")


def require_rsa_public(key: PublicKey, what: str) -> rsa.RSAPublicKey:
    """``key`` as an RSA public key of a sensible size, or a ConfigError."""
    if not isinstance(key, rsa.RSAPublicKey):
        raise _wrong_key(key, what, "RSA public", "applier_public_key to applier_public.pem")
    if key.key_size < MIN_RSA_BITS:
        raise ConfigError(f"{what} is only {key.key_size} bits", hint=f"generate keys of at least {MIN_RSA_BITS} bits")
    return key


def require_rsa_private(key: PrivateKey, what: str) -> rsa.RSAPrivateKey:
    if not isinstance(key, rsa.RSAPrivateKey):
        raise _wrong_key(key, what, "RSA private", "applier_private_key to applier_private.pem")
    return key


def require_ed25519_private(key: PrivateKey, what: str) -> ed25519.Ed25519PrivateKey:
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise _wrong_key(key, what, "Ed25519 private", "producer_private_key to producer_private.pem")
    return key


def require_ed25519_public(key: PublicKey, what: str) -> ed25519.Ed25519PublicKey:
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise _wrong_key(key, what, "Ed25519 public", "producer_public_key to producer_public.pem")
    return key
