"""Key files: generation and loading.

Two key pairs protect the transport:

* the **applier** pair (RSA): the producer wraps each AES data key for the
  applier's public key; only the applier's private key unwraps it;
* the **producer** pair (Ed25519): the producer signs every envelope; the
  applier verifies with the producer's public key.  Wrapping alone
  authenticates nothing (anyone holding the applier's *public* key can wrap a
  key of their own), so the signature is what makes envelopes unforgeable.

Keys are PEM files.  Private keys are written with mode 0600 and may be
encrypted with a passphrase (``CYNOMYS_SECURITY_PASSPHRASE``).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Union

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

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
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {key: out_dir / name for key, name in KEY_FILES.items()}
    existing = [str(p) for p in paths.values() if p.exists()]
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
        _write_atomic(paths[key], blob, 0o600 if key in _PRIVATE else 0o644)
    log.info("wrote key pairs to %s (RSA-%d applier pair, Ed25519 producer pair)", out_dir, rsa_bits)
    return paths


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """tmp + fsync + rename, the tmp file created with ``mode`` from the start
    so a private key is never readable by others, not even for a moment."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask; be exact
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read(path: str | Path, config_key: str) -> bytes:
    if not str(path):
        raise ConfigError(f"no key file configured for [security] {config_key}",
                          hint=f"set [security] {config_key} to a PEM file (see `cynomys keygen`)")
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"key file {path} not found",
                          hint=f"set [security] {config_key} to an existing PEM file, "
                               "or run `cynomys keygen`") from None
    except OSError as exc:
        raise ConfigError(f"key file {path} cannot be read: {exc.strerror}",
                          hint=f"check the permissions of {path} ([security] {config_key})") from None


def load_private_key(
    path: str | Path,
    passphrase: str | None = None,
    *,
    config_key: str = "applier_private_key / producer_private_key",
) -> PrivateKey:
    """Load an RSA or Ed25519 private key from a PEM file.

    ``config_key`` names the [security] key that points at ``path`` so the
    error message can say what to fix.  An empty passphrase means none.
    """
    data = _read(path, config_key)
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
    return key


def load_public_key(path: str | Path, *, config_key: str = "applier_public_key / producer_public_key") -> PublicKey:
    """Load an RSA or Ed25519 public key from a PEM file."""
    data = _read(path, config_key)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ConfigError(f"{path} is not a PEM public key",
                          hint=f"point [security] {config_key} at a public key file") from None
    if not isinstance(key, (rsa.RSAPublicKey, ed25519.Ed25519PublicKey)):
        raise ConfigError(f"public key {path} is a {type(key).__name__}; expected RSA or Ed25519",
                          hint=f"point [security] {config_key} at a key made by `cynomys keygen`")
    return key


def require_rsa_public(key: PublicKey, what: str) -> rsa.RSAPublicKey:
    """``key`` as an RSA public key of a sensible size, or a ConfigError."""
    if not isinstance(key, rsa.RSAPublicKey):
        raise ConfigError(f"{what} must be an RSA public key, got {type(key).__name__}",
                          hint="set [security] applier_public_key to applier_public.pem")
    if key.key_size < MIN_RSA_BITS:
        raise ConfigError(f"{what} is only {key.key_size} bits", hint=f"generate keys of at least {MIN_RSA_BITS} bits")
    return key


def require_rsa_private(key: PrivateKey, what: str) -> rsa.RSAPrivateKey:
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigError(f"{what} must be an RSA private key, got {type(key).__name__}",
                          hint="set [security] applier_private_key to applier_private.pem")
    return key


def require_ed25519_private(key: PrivateKey, what: str) -> ed25519.Ed25519PrivateKey:
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ConfigError(f"{what} must be an Ed25519 private key, got {type(key).__name__}",
                          hint="set [security] producer_private_key to producer_private.pem")
    return key


def require_ed25519_public(key: PublicKey, what: str) -> ed25519.Ed25519PublicKey:
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ConfigError(f"{what} must be an Ed25519 public key, got {type(key).__name__}",
                          hint="set [security] producer_public_key to producer_public.pem")
    return key
