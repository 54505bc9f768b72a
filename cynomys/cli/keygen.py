"""`cynomys keygen`: the applier's RSA and the producer's Ed25519 key pairs."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from cynomys.core.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from cynomys.transport.keys import generate_keys

    passphrase = os.environ.get("CYNOMYS_SECURITY_PASSPHRASE") if args.passphrase else None
    if args.passphrase and not passphrase:
        raise ConfigError("--passphrase given but CYNOMYS_SECURITY_PASSPHRASE is empty",
                          hint="export CYNOMYS_SECURITY_PASSPHRASE=... first")
    paths = generate_keys(Path(args.out), rsa_bits=args.bits, passphrase=passphrase, force=args.force)
    print("[security]")
    for key, path in sorted(paths.items()):
        print(f'{key} = "{path}"')
    return 0


def register(sub: Any) -> None:
    kg = sub.add_parser("keygen", help="write the applier's RSA and the producer's Ed25519 key pairs")
    kg.add_argument("--out", required=True)
    kg.add_argument("--bits", type=int, default=3072)
    kg.add_argument("--passphrase", action="store_true", help="encrypt private keys with $CYNOMYS_SECURITY_PASSPHRASE")
    kg.add_argument("--force", action="store_true", help="overwrite existing key files")
    kg.set_defaults(func=run)

