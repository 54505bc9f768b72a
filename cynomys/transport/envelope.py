"""The sealed envelope: gzip -> AES-256-GCM -> RSA-OAEP key wrap -> Ed25519 signature.

Byte layout (big-endian; see FORMAT.md for the why)::

    header (the AES-GCM associated data)
      magic          4   b"CYNE"
      version        1   1
      producer_len   1   1..255
      producer_id    P   UTF-8
      stream_len     2   1..65535
      stream         S   UTF-8
      seq            8   u64, >= 1
      key_id         8   random id of the data key
      sealed_at_ms   8   u64 unix time of sealing (for lag reporting only)
      fence          8   u64 fencing token of the producer's lease (version 2 only)
    body
      wrapped_len    2   u16
      wrapped_key    W   RSA-OAEP(SHA-256) of the 32-byte data key
      nonce         12   4 random bytes fixed per data key + u64 counter
      ct_len         4   u32, includes the 16-byte GCM tag
      ciphertext     C   AES-256-GCM(gzip(payload)) || tag
    signature       64   Ed25519 over every byte before it

The wrapped key travels in *every* envelope so each one can be opened on its
own (after a trimmed stream, a lost pub/sub message, from a dead letter); the
Opener unwraps each (producer, key id) once and caches the AES key, so RSA
costs one private-key operation per data key, not per envelope.

Version 2 differs from version 1 only by the ``fence`` field: an HA producer
(cynomys/producer/ha.py) writes the fencing token of the lease it held when sealing,
so the applier can refuse an envelope from a deposed leader.  Envelopes
without a token (fence 0, a producer without HA) are still written as
version 1, which older appliers read.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Mapping, cast

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, padding
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from isal import isal_zlib

from cynomys.core.errors import ConfigError, EnvelopeRejected
from cynomys.transport.keys import (
    PrivateKey,
    PublicKey,
    require_ed25519_private,
    require_ed25519_public,
    require_rsa_private,
    require_rsa_public,
)

log = logging.getLogger(__name__)

MAGIC = b"CYNE"
VERSION = 1          # no fencing token
VERSION_FENCED = 2   # + the lease's fencing token
_VERSIONS = (VERSION, VERSION_FENCED)
KEY_ID_LEN = 8
NONCE_LEN = 12
NONCE_PREFIX_LEN = 4
TAG_LEN = 16
SIG_LEN = 64
MAX_SEQ = 2**64 - 1
# gzip framing for zlib (wbits 16 + 15): a real gzip stream, as in the paper.
_GZIP_WBITS = 31
# Who deflates at each gzip level.  Levels 1-3 are ISA-L's igzip levels
# (python-isal): on a 20,000-row lineitem chunk's Avro its level 1 deflates
# 3.8x faster than zlib's level 1 (4.3 vs 16.2 ms) into 7% more bytes, and
# inflates 2.2x faster (2.8 vs 6.2 ms) -- gzip was the largest part of sealing on the producer and of
# opening on the applier.  0 (stored) and 4-9 stay zlib's.  Any gzip
# reader opens either.
_DEFLATERS = {level: (isal_zlib if 1 <= level <= 3 else zlib) for level in range(10)}
# What a bad gzip stream raises, from either inflater (isal's stub types
# its error class as an instance of Exception).
_GZIP_ERRORS: tuple[type[BaseException], ...] = (zlib.error, cast("type[BaseException]", isal_zlib.error))
# How many unwrapped data keys an Opener remembers.  One producer holds one
# live key at a time; a few hundred covers many producers and old keys still
# in flight after a rotation.
_KEY_CACHE_SIZE = 256
# Default bound of an opened payload ([transport] max_envelope_bytes): gzip
# turns ~1 MB into ~1 GB of zeros, and a payload is decoded into Python
# objects several times its size, so "whatever the producer signed" is not
# a bound an applier can live with.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_TAIL = struct.Struct(">Q8sQ")  # seq, key_id, sealed_at_ms
_U64 = struct.Struct(">Q")


@dataclass(frozen=True)
class EnvelopeHeader:
    """The authenticated-but-cleartext part of an envelope."""

    version: int
    producer_id: str
    stream: str
    seq: int
    key_id: bytes
    sealed_at_ms: int
    fence: int = 0  # fencing token of the HA producer's lease (0: none)


@dataclass(frozen=True)
class Opened:
    """A verified, decrypted envelope: header fields plus the payload bytes."""

    version: int
    producer_id: str
    stream: str
    seq: int
    key_id: bytes
    sealed_at_ms: int
    payload: bytes
    fence: int = 0

    @property
    def header(self) -> EnvelopeHeader:
        return EnvelopeHeader(self.version, self.producer_id, self.stream, self.seq,
                              self.key_id, self.sealed_at_ms, self.fence)


@dataclass(frozen=True)
class _Parsed:
    header: EnvelopeHeader
    header_bytes: bytes
    wrapped: bytes
    nonce: bytes
    ciphertext: bytes
    signed: bytes  # every byte the signature covers
    signature: bytes


def _oaep(producer: bytes, stream: bytes, key_id: bytes) -> padding.OAEP:
    # The OAEP label binds a wrapped key to its producer, stream and key id,
    # so a wrapped key cannot be lifted into another context and still unwrap.
    label = (b"cynomys-datakey-v1" + _U8.pack(len(producer)) + producer
             + _U16.pack(len(stream)) + stream + key_id)
    return padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=label)


def _encode_header(producer: bytes, stream: bytes, seq: int, key_id: bytes, sealed_at_ms: int,
                   fence: int = 0) -> bytes:
    version = VERSION_FENCED if fence else VERSION
    return b"".join((MAGIC, _U8.pack(version), _U8.pack(len(producer)), producer,
                     _U16.pack(len(stream)), stream, _TAIL.pack(seq, key_id, sealed_at_ms),
                     _U64.pack(fence) if fence else b""))


def _reject(reason: str, message: str, hint: str | None = None) -> EnvelopeRejected:
    return EnvelopeRejected(message, reason=reason, hint=hint)


class _Reader:
    """Bounds-checked cursor: running past the end means a truncated envelope."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise _reject("truncated", f"envelope truncated: {len(self.data)} bytes end inside the {what}")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _reject("malformed", f"envelope {what} is not valid UTF-8") from None


def _parse_header(r: _Reader) -> EnvelopeHeader:
    magic = r.take(len(MAGIC), "magic")
    if magic != MAGIC:
        raise _reject("bad-magic", f"not a Cynomys envelope (starts with {magic!r}, expected {MAGIC!r})")
    (version,) = _U8.unpack(r.take(1, "version"))
    if version not in _VERSIONS:
        raise _reject("bad-version", f"envelope format version {version} is not supported (this build reads "
                                     f"{', '.join(map(str, _VERSIONS))})",
                      hint="upgrade the applier to the producer's Cynomys version")
    (plen,) = _U8.unpack(r.take(1, "producer id length"))
    producer = _text(r.take(plen, "producer id"), "producer id")
    (slen,) = _U16.unpack(r.take(2, "stream length"))
    stream = _text(r.take(slen, "stream name"), "stream name")
    seq, key_id, sealed_at_ms = _TAIL.unpack(r.take(_TAIL.size, "sequence/key id"))
    (fence,) = _U64.unpack(r.take(_U64.size, "fencing token")) if version == VERSION_FENCED else (0,)
    return EnvelopeHeader(version, producer, stream, seq, key_id, sealed_at_ms, fence)


def _parse(data: bytes) -> _Parsed:
    r = _Reader(data)
    header = _parse_header(r)
    header_bytes = data[:r.pos]
    (wlen,) = _U16.unpack(r.take(2, "wrapped key length"))
    wrapped = r.take(wlen, "wrapped key")
    nonce = r.take(NONCE_LEN, "nonce")
    (clen,) = _U32.unpack(r.take(4, "ciphertext length"))
    ciphertext = r.take(clen, "ciphertext")
    signed_end = r.pos
    signature = r.take(SIG_LEN, "signature")
    if r.pos != len(data):
        raise _reject("malformed", f"envelope seq {header.seq} from {header.producer_id} has "
                                   f"{len(data) - r.pos} trailing bytes after the signature")
    return _Parsed(header, header_bytes, wrapped, nonce, ciphertext, data[:signed_end], signature)


def peek_header(data: bytes) -> EnvelopeHeader:
    """The header, WITHOUT verifying anything: for logs and dead letters only.

    Raises EnvelopeRejected when even the header cannot be parsed."""
    return _parse_header(_Reader(data))


class Sealer:
    """Seals payloads for one (producer, stream).  Thread-safe.

    A new Sealer always starts a fresh random data key, so a restarted
    producer never reuses a (key, nonce) pair from its previous life.

    ``compress_level`` defaults to gzip level 1 (ISA-L's igzip, see
    ``_DEFLATERS``): sealing runs on the source database's host, and gzip is
    nearly all of its cost; on Avro row images zlib's level 1 was about 3x
    faster than level 6 for about 13% larger envelopes (bench/bench_seal.py),
    and igzip's level 1 is 3.4x faster again.
    """

    def __init__(
        self,
        producer_id: str,
        stream: str,
        applier_public_key: PublicKey,
        producer_private_key: PrivateKey,
        *,
        rotate_envelopes: int,
        rotate_seconds: float,
        compress_level: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._producer = producer_id.encode("utf-8")
        self._stream = stream.encode("utf-8")
        if not 1 <= len(self._producer) <= 255:
            raise ConfigError(f"producer id {producer_id!r} must be 1..255 UTF-8 bytes", hint="change [producer] id")
        if not 1 <= len(self._stream) <= 65535:
            raise ConfigError(f"stream name {stream!r} must be 1..65535 UTF-8 bytes", hint="change [transport] stream")
        if rotate_envelopes <= 0:
            raise ConfigError(f"key rotation after {rotate_envelopes} envelopes is invalid",
                              hint="set [transport] key_rotate_envelopes to a positive number")
        if rotate_seconds <= 0:
            raise ConfigError(f"key rotation after {rotate_seconds} seconds is invalid",
                              hint="set [transport] key_rotate_seconds to a positive number")
        if not 0 <= compress_level <= 9:
            raise ConfigError(f"gzip level {compress_level} is not in 0..9")
        self.producer_id = producer_id
        self.stream = stream
        self._rsa = require_rsa_public(applier_public_key, "the applier's public key")
        self._signer = require_ed25519_private(producer_private_key, "the producer's private key")
        self._rotate_envelopes = rotate_envelopes
        self._rotate_seconds = rotate_seconds
        self._level = compress_level
        self._clock = clock
        self._lock = threading.Lock()
        self.keys_created = 0
        self._new_key()

    def _new_key(self) -> None:
        key = AESGCM.generate_key(bit_length=256)
        self.key_id = os.urandom(KEY_ID_LEN)
        self._aes = AESGCM(key)
        self._wrapped = self._rsa.encrypt(key, _oaep(self._producer, self._stream, self.key_id))
        # Nonce = fixed random prefix + counter.  The counter alone already
        # never repeats under one key (the key is fresh per Sealer and per
        # rotation, and the counter is bounded by rotate_envelopes); the
        # prefix guards against a bug that would reuse a key across Sealers.
        self._nonce_prefix = os.urandom(NONCE_PREFIX_LEN)
        self._counter = 0
        self._key_born = self._clock()
        self.keys_created += 1
        log.debug("producer %s stream %s: new data key %s", self.producer_id, self.stream, self.key_id.hex())

    def sign_detached(self, context: bytes, data: bytes) -> bytes:
        """An Ed25519 signature of ``context || data`` with the producer's key
        (the HA producer signs its state in Redis with it)."""
        return self._signer.sign(context + data)

    def verify_detached(self, context: bytes, data: bytes, signature: bytes) -> bool:
        try:
            self._signer.public_key().verify(signature, context + data)
        except InvalidSignature:
            return False
        return True

    def seal(self, payload: bytes, seq: int, fence: int = 0) -> bytes:
        """One envelope holding ``payload`` as envelope ``seq`` (1 .. 2**64-1);
        ``fence``: the HA lease's fencing token (0: none, a version 1 envelope)."""
        if not 1 <= seq <= MAX_SEQ:
            # A caller bug, not an operational condition.
            raise ValueError(f"sequence number {seq} is outside 1..2**64-1")
        if not 0 <= fence <= MAX_SEQ:
            raise ValueError(f"fencing token {fence} is outside 0..2**64-1")
        deflater = _DEFLATERS[self._level]
        compressor = deflater.compressobj(self._level, deflater.DEFLATED, _GZIP_WBITS)
        compressed = compressor.compress(payload) + compressor.flush()
        with self._lock:
            if (self._counter >= self._rotate_envelopes
                    or self._clock() - self._key_born >= self._rotate_seconds):
                self._new_key()
            nonce = self._nonce_prefix + self._counter.to_bytes(8, "big")
            self._counter += 1
            key_id, aes, wrapped = self.key_id, self._aes, self._wrapped
        header = _encode_header(self._producer, self._stream, seq, key_id, int(time.time() * 1000), fence)
        ciphertext = aes.encrypt(nonce, compressed, header)
        signed = b"".join((header, _U16.pack(len(wrapped)), wrapped, nonce, _U32.pack(len(ciphertext)), ciphertext))
        return signed + self._signer.sign(signed)


class Opener:
    """Verifies and opens envelopes of one stream.

    Verification order is the security argument: the signature is checked
    before any decryption, so an attacker holding only the applier's public
    key (who can wrap keys and encrypt at will) gets nowhere near the RSA
    private key or the decompressor.  Thread-safe.
    """

    def __init__(
        self,
        applier_private_key: PrivateKey,
        producer_public_keys: Mapping[str, PublicKey],
        stream: str,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if max_payload_bytes <= 0:
            raise ConfigError(f"max_envelope_bytes {max_payload_bytes} is invalid",
                              hint="set [transport] max_envelope_bytes to a positive number")
        self.max_payload_bytes = max_payload_bytes
        self._rsa = require_rsa_private(applier_private_key, "the applier's private key")
        self._verifiers: dict[str, ed25519.Ed25519PublicKey] = {
            pid: require_ed25519_public(k, f"public key of producer {pid!r}") for pid, k in producer_public_keys.items()
        }
        if not self._verifiers:
            raise ConfigError("no producer public keys given to the applier",
                              hint="set [security] producer_public_key")
        self.stream = stream
        self._keys: OrderedDict[tuple[str, bytes], tuple[bytes, AESGCM]] = OrderedDict()
        self._lock = threading.Lock()
        self.rejections: Counter[str] = Counter()
        # RSA private-key operations done so far (the cache should keep this
        # at about one per data key).
        self.unwraps = 0

    def open(self, data: bytes) -> Opened:
        """Verify, decrypt and gunzip; raise EnvelopeRejected(reason=...) on any failure."""
        try:
            return self._open(data)
        except EnvelopeRejected as exc:
            with self._lock:
                self.rejections[exc.reason] += 1
            raise

    def _open(self, data: bytes) -> Opened:
        p = _parse(data)
        h = p.header
        who = f"envelope seq {h.seq} from producer {h.producer_id!r}"
        verifier = self._verifiers.get(h.producer_id)
        if verifier is None:
            raise _reject("unknown-producer", f"{who}: no public key is configured for this producer",
                          hint="add the producer's public key to the applier's [security] producer_public_key")
        if h.stream != self.stream:
            raise _reject("wrong-stream",
                          f"{who} was sealed for stream {h.stream!r}, this applier reads {self.stream!r}")
        try:
            verifier.verify(p.signature, p.signed)
        except InvalidSignature:
            raise _reject("bad-signature", f"{who}: signature does not verify (forged or tampered)",
                          hint="check that [security] producer_public_key matches the producer's private key") from None
        if h.seq < 1:
            raise _reject("malformed", f"{who}: sequence numbers start at 1")
        aes = self._data_key(h, p.wrapped, who)
        try:
            compressed = aes.decrypt(p.nonce, p.ciphertext, p.header_bytes)
        except InvalidTag:
            raise _reject("decrypt-failed", f"{who}: AES-GCM authentication failed") from None
        payload = self._gunzip(compressed, who)
        return Opened(h.version, h.producer_id, h.stream, h.seq, h.key_id, h.sealed_at_ms, payload, h.fence)

    def _gunzip(self, compressed: bytes, who: str) -> bytes:
        """Decompress at most max_payload_bytes; one byte more is a rejection,
        decided before the rest is ever inflated."""
        limit = self.max_payload_bytes
        try:
            d = isal_zlib.decompressobj(_GZIP_WBITS)
            payload = d.decompress(compressed, limit + 1)
            if len(payload) <= limit and not d.unconsumed_tail:
                payload += d.flush()
            if len(payload) > limit or d.unconsumed_tail:
                raise _reject("too-large",
                              f"{who}: payload opens to more than {limit} bytes ([transport] max_envelope_bytes)",
                              hint="if the producer really sends batches this large, raise [transport] "
                                   "max_envelope_bytes on the applier (or lower [producer] batch_max_events)")
            if not d.eof or d.unused_data:
                raise zlib.error("incomplete or trailing gzip data")
        except _GZIP_ERRORS as exc:
            raise _reject("gunzip-failed", f"{who}: payload is not valid gzip ({exc})") from None
        return payload

    def _data_key(self, h: EnvelopeHeader, wrapped: bytes, who: str) -> AESGCM:
        cache_key = (h.producer_id, h.key_id)
        with self._lock:
            hit = self._keys.get(cache_key)
            # Compare the wrapped bytes too: a cache hit must be for the very
            # same wrapped key, not merely the same 8-byte id.
            if hit is not None and hit[0] == wrapped:
                self._keys.move_to_end(cache_key)
                return hit[1]
        oaep = _oaep(h.producer_id.encode("utf-8"), h.stream.encode("utf-8"), h.key_id)
        try:
            key = self._rsa.decrypt(wrapped, oaep)
        except ValueError:
            raise _reject("unwrap-failed", f"{who}: data key {h.key_id.hex()} does not unwrap with this applier's key",
                          hint="the producer must use the public key matching [security] applier_private_key") from None
        finally:
            with self._lock:
                self.unwraps += 1
        if len(key) != 32:
            raise _reject("unwrap-failed", f"{who}: data key {h.key_id.hex()} is {len(key)} bytes, expected 32")
        aes = AESGCM(key)
        with self._lock:
            self._keys[cache_key] = (wrapped, aes)
            self._keys.move_to_end(cache_key)
            while len(self._keys) > _KEY_CACHE_SIZE:
                self._keys.popitem(last=False)
        return aes
