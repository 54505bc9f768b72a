"""Column masks: what a masked column holds on the target, and its type there.

Masks run in the producer, on the source host, so the plain value never
enters an envelope.  Each is a spec string of ``[shape.tables."<pattern>"]
mask``:

==============  ==================================================  ====================
spec            value on the target                                 target column type
==============  ==================================================  ====================
``hash``        HMAC-SHA256 of the value's text, keyed with          ``char(64)``
                ``[shape] mask_key``, as 64 hex characters
``hash:N``      the first N (8-64) of those characters               ``char(N)``
``hash_int``    the HMAC's first 8 bytes as a number (63 bits)       ``bigint``
``null``        NULL                                                 the column's, nullable
``const:TEXT``  TEXT (NULL stays NULL)                               ``varchar(len(TEXT))``
``truncate:N``  the first N characters (text) or bytes (binary)      the column's (BINARY:
                                                                     ``varbinary(N)``)
==============  ==================================================  ====================

A hash is deterministic: the same value gives the same hash in every
table and column (a hashed customer id still joins), so updates and
deletes by a hashed key find their row.  It hashes the value's text
(``value_bytes``), not the table or column.  NULL stays NULL for every
mask but ``null`` (which makes everything NULL).  Masks that lose the
value's identity (``null``, ``const``, ``truncate``) cannot be put on a
primary-key column: rows would merge.
"""
from __future__ import annotations

import datetime
import decimal
import hashlib
import hmac
import re
from dataclasses import dataclass, replace
from typing import Callable

from cynomys.core.model import ColumnDef, Value
from cynomys.core.sourcetypes import BINARY_TYPES, TEXT_TYPES

Masker = Callable[[Value], Value]

_SPEC = re.compile(r"(?P<kind>hash_int|hash|null|const|truncate)(?::(?P<arg>.*))?", re.DOTALL)
#: Mask kinds a primary-key column may carry (the others merge rows).
KEY_SAFE = frozenset({"hash", "hash_int"})
_INT63 = (1 << 63) - 1


@dataclass(frozen=True)
class Mask:
    kind: str
    n: int = 0          # hash:N, truncate:N
    text: str = ""      # const:TEXT

    @property
    def key_safe(self) -> bool:
        return self.kind in KEY_SAFE

    @property
    def needs_key(self) -> bool:
        return self.kind in KEY_SAFE

    def column(self, col: ColumnDef) -> ColumnDef:
        """The column as the target holds it (name unchanged)."""
        if self.kind == "hash":
            return replace(col, type=f"char({self.n})")
        if self.kind == "hash_int":
            return replace(col, type="bigint")
        if self.kind == "null":
            return replace(col, nullable=True)
        if self.kind == "const":
            return replace(col, type=f"varchar({max(1, len(self.text))})")
        if col.base_type not in TEXT_TYPES + BINARY_TYPES:  # truncate
            raise ValueError(f"truncate:{self.n} takes text or binary columns, not {col.type}")
        # BINARY(n) pads its values to n bytes: a cut value would come back padded.
        return replace(col, type=f"varbinary({self.n})") if col.base_type == "binary" else col

    def masker(self, key: bytes) -> Masker:
        """value -> masked value (``key``: [shape] mask_key, for hashes)."""
        if self.kind == "hash":
            n = self.n
            return lambda v: None if v is None else hmac.new(key, value_bytes(v), hashlib.sha256).hexdigest()[:n]
        if self.kind == "hash_int":
            return lambda v: None if v is None else \
                int.from_bytes(hmac.new(key, value_bytes(v), hashlib.sha256).digest()[:8], "big") & _INT63
        if self.kind == "null":
            return lambda v: None
        if self.kind == "const":
            text = self.text
            return lambda v: None if v is None else text
        n = self.n
        return lambda v: v[:n] if isinstance(v, (str, bytes)) else v  # truncate


def parse_mask(spec: str) -> Mask:
    """A spec string -> Mask; ValueError saying what is accepted."""
    m = _SPEC.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"unknown mask {spec!r}: expected hash, hash:N, hash_int, null, const:TEXT or truncate:N")
    kind, arg = m.group("kind"), m.group("arg")
    if kind == "const":
        if arg is None:
            raise ValueError("const needs its text: const:TEXT")
        return Mask(kind, text=arg)
    if kind in ("hash_int", "null"):
        if arg is not None:
            raise ValueError(f"{kind} takes no argument")
        return Mask(kind)
    if kind == "hash" and arg is None:
        return Mask(kind, n=64)
    if arg is None or not arg.isdigit():
        raise ValueError(f"{kind} needs a length: {kind}:N")
    n = int(arg)
    if kind == "hash" and not 8 <= n <= 64:
        raise ValueError("hash:N keeps 8 to 64 hex characters")
    if kind == "truncate" and n < 1:
        raise ValueError("truncate:N keeps at least 1 character")
    return Mask(kind, n=n)


def value_bytes(v: Value) -> bytes:
    """The bytes a hash mask hashes: the value's text (UTF-8), bytes as they
    are.  One text per value whatever column holds it, so equal values hash
    alike across tables (an id in a bigint and in an int column)."""
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    if isinstance(v, bool):
        return b"1" if v else b"0"
    if isinstance(v, (int, decimal.Decimal)):
        return str(v).encode()
    if isinstance(v, float):
        return repr(v).encode()
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.isoformat(sep=" ").encode()
    if isinstance(v, datetime.date):
        return v.isoformat().encode()
    if isinstance(v, datetime.timedelta):
        return str((v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds).encode()
    return str(v).encode()
